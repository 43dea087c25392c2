"""Issue 41 §5 and §8 in a real browser: the starter serving at first start has a row and a model card, and promote
and disable ask first, naming what they act on; going back changes nothing, the question's button acts; the audit log
shows the change at once.

Drives Debian's Chromium through Playwright against the launched app (no round is trained: the versions are made in
the database). Screenshots of the question panels go to tests/artifacts/.
"""

from __future__ import annotations

import pytest

from tests.support.browser import ARTIFACTS, require_chromium, signed_in

require_chromium()
pytestmark = pytest.mark.slow  # a live server and a browser


def test_first_start_card_and_confirmations(browser, tmp_path):
    from playwright.sync_api import expect

    from db import ModelVersionRepository, UserRepository
    from orapo_core.models.loading import resolve_model_dir
    from tests.support.app import launched_app, make_env

    settings, db = make_env(tmp_path)
    resolve_model_dir(settings=settings)  # the shipped starter copied in, as `orapo serve` does at its start
    ARTIFACTS.mkdir(exist_ok=True)
    with launched_app(settings, db) as (url, demo):
        context, page = signed_in(browser, url, "boss", "admin-pass-1")
        page.get_by_role("tab", name="Rounds").click()
        table = page.locator("#orapo-versions-table")
        expect(table).to_contain_text("serving")  # no version yet: the starter folder drafts, and says so
        expect(table).to_contain_text("base-starter")
        table.get_by_test_id("cell-0-2").click()  # the serving row's Status cell
        card = page.locator("#orapo-model-card")
        expect(card).to_contain_text("Model card: starter")
        expect(card).to_contain_text("synthetic PhantomCXR")

        versions = ModelVersionRepository(db)
        base = versions.create("base-starter", base_model_path="models/starter")
        versions.promote(base.id)
        candidate = versions.create("round-1", base_model_path="models/starter", parent_id=base.id)
        page.get_by_role("button", name="Refresh all").click()
        expect(table).to_contain_text("round-1")
        page.locator("#orapo-version-id input").fill(str(candidate.id))
        page.locator("#orapo-model-card-show").click()
        expect(card).to_contain_text(f"Model card: round-1 (version {candidate.id})")

        page.locator("#orapo-promote").click()
        question = page.locator("#orapo-version-question")
        expect(question).to_contain_text(f"Promote version {candidate.id} (round-1)?")
        expect(question).to_contain_text(f"in place of version {base.id} (base-starter)")
        page.screenshot(path=str(ARTIFACTS / "confirm-promote.png"), full_page=True)
        page.locator("#orapo-version-back").click()
        expect(page.locator("#orapo-version-confirm")).to_be_hidden()
        assert versions.promoted().id == base.id  # asked, went back: nothing changed
        page.locator("#orapo-promote").click()
        page.locator("#orapo-confirm-promote").click()
        expect(page.locator("#orapo-rounds-result")).to_contain_text(f"Version {candidate.id} (round-1) now drafts")
        expect(page.locator("#orapo-version-confirm")).to_be_hidden()
        assert versions.promoted().id == candidate.id

        page.get_by_role("tab", name="Admin").click()
        page.get_by_label("Username").first.fill("rita")
        page.locator("#orapo-user-disable").click()
        expect(page.locator("#orapo-user-question")).to_contain_text("Disable rita (radiologist)?")
        page.screenshot(path=str(ARTIFACTS / "confirm-disable.png"), full_page=True)
        assert UserRepository(db).get_by_username("rita").active
        page.locator("#orapo-confirm-disable").click()
        expect(page.locator("#orapo-users-result")).to_contain_text("rita is now disabled")
        assert not UserRepository(db).get_by_username("rita").active
        # the audit log below lists the change at once: no Show, no reopening the tab
        expect(page.locator("#orapo-audit")).to_contain_text("user.disable")
        context.close()
