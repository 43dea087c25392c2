"""The Worklist's "From the archive" view in a real browser, against the test Orthanc (.ci/orthanc.sh): a reader
searches the archive, sees which studies are already here, ticks one, imports it, and reads what became of it in the
page. Its screenshot is the PACS page's (docs/pages/screenshots/archive-view.png is copied from tests/artifacts/)."""

from __future__ import annotations

import io

import pydicom
import pytest

from tests.support.browser import ARTIFACTS, require_chromium
from tests.support.orthanc import phantom_dicoms

require_chromium()

pytestmark = pytest.mark.slow  # a live server and an archive


def test_a_reader_imports_a_study_from_the_archive(browser, orthanc, tmp_path, monkeypatch):
    from playwright.sync_api import expect

    from db import StudyRepository
    from tests.support.app import launched_app, make_env

    monkeypatch.setenv("ORAPO_DICOMWEB_URL", orthanc.dicomweb_url)
    monkeypatch.setenv("ORAPO_DICOMWEB_USER", orthanc.user)
    monkeypatch.setenv("ORAPO_DICOMWEB_PASSWORD", orthanc.password)
    settings, db = make_env(tmp_path)
    archived = []
    for data, who in phantom_dicoms(tmp_path / "phantoms", 2, seed=7707):
        orthanc.upload(data)
        ds = pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True)
        archived.append((str(ds.StudyInstanceUID), who["AccessionNumber"], str(ds.StudyDate)))
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        with launched_app(settings, db) as (url, _):
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.set_default_timeout(30_000)
            page.goto(url)
            page.get_by_label("username").fill("rita")
            page.get_by_label("password").fill("rita-pass-1")
            page.get_by_role("button", name="Login").click()
            expect(page.locator("#orapo-whoami")).to_contain_text("Signed in as rita")
            page.get_by_role("tab", name="Worklist").click()
            page.locator("#orapo-archive").get_by_text("From the archive").click()
            expect(page.locator("#orapo-archive-note")).to_contain_text("Studies in the archive")

            (uid, accession, date), (other_uid, other_accession, _) = archived
            page.locator("#orapo-archive-search").click()
            table = page.locator("#orapo-archive-table")
            expect(table).to_contain_text(accession)
            expect(table).to_contain_text(other_accession)
            expect(page.locator("#orapo-archive-result")).to_contain_text("0 already imported")

            page.locator("#orapo-archive-chosen").get_by_text(accession).click()
            page.locator("#orapo-archive-import").click()
            result = page.locator("#orapo-archive-result")
            expect(result).to_contain_text("Imported 1 of 1 study(ies)", timeout=90_000)
            (overview,) = StudyRepository(db).list(limit=10)
            expect(result).to_contain_text(f"imported as study {overview.study.id}")
            expect(table).to_contain_text(f"already imported as study {overview.study.id}")
            expect(page.locator("#orapo-archive-chosen")).not_to_contain_text(accession)  # no second offer
            expect(page.locator("#orapo-archive-chosen")).to_contain_text(other_accession)
            expect(page.locator(".toast-wrap").get_by_text("Error")).to_have_count(0)
            page.locator("#orapo-worklist-refresh").click()
            expect(page.locator("#orapo-worklist")).to_contain_text(overview.study.patient_pseudonym)
            page.locator("#orapo-archive").screenshot(path=str(ARTIFACTS / "archive-view.png"))
    finally:
        for uid, _, _ in archived:
            orthanc.delete_study(uid)
