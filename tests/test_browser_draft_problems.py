"""Issue 41 §4 in a real browser: a draft the checks flag shows why above the report, and *Accept draft unchanged*
stays off while any problem stands; the reader's correction clears the reasons, and the edit is signed as written.

The served model is the tiny random VLM, its `generate` scripted to write a flawed report (a finding both stated
and denied, an empty numbered impression item), as the shipped starter's drafts were seen to.
"""

from __future__ import annotations

import shutil

from tests.support.browser import require_chromium
from tests.support.dicom import pydicom_data_file

require_chromium()

FLAWED = "FINDINGS: Mild cardiomegaly. Heart size is normal.\nIMPRESSION:\n1.\n2. Cardiomegaly."
FIXED = "FINDINGS: Mild cardiomegaly.\nIMPRESSION:\n1. Cardiomegaly."


def flawed_registry(settings, db):
    from app.services.reading.registry import ModelRegistry
    from orapo_core.models.draft import Drafter
    from orapo_core.models.loading import load_model

    class FlawedDrafter(Drafter):
        def new_decoder(self):
            return None

        def _generate_many(self, pictures, samples, max_new_tokens, temperature, top_p, seed):
            return [(FLAWED, [FLAWED] * samples) for _ in pictures]

    return ModelRegistry(
        settings, db, loader=lambda served: FlawedDrafter(load_model(served.model_dir), model_version=served.name)
    )


def test_a_flawed_draft_says_why_and_cannot_be_accepted_unchanged(browser, tmp_path, tiny_model):
    from playwright.sync_api import expect

    from db import CorrectionRepository
    from tests.support.app import launched_app, make_env
    from tests.support.browser import signed_in

    settings, db = make_env(tmp_path, tiny_model)
    upload = tmp_path / "RG1_UNCI.dcm"
    shutil.copy(pydicom_data_file("RG1_UNCI.dcm"), upload)
    with launched_app(settings, db, flawed_registry(settings, db)) as (url, _):
        context, page = signed_in(browser, url, "rita", "rita-pass-1", viewport=(1280, 720))
        page.set_default_timeout(30_000)
        page.locator("input[type=file]").first.set_input_files(str(upload))
        expect(page.locator("#orapo-upload-status")).to_contain_text("Stored", timeout=60_000)
        page.locator("#orapo-draft").click()
        problems = page.locator("#orapo-draft-problems")
        expect(problems).to_contain_text("Correct before signing", timeout=60_000)
        expect(problems).to_contain_text("Heart")  # the finding stated and denied, named
        expect(problems).to_contain_text("empty")  # the empty numbered item
        accept = page.locator("#orapo-accept")
        expect(accept).to_be_disabled()

        page.locator("#orapo-report textarea").fill(FIXED)
        expect(problems).not_to_contain_text("Correct before signing")
        expect(accept).to_be_disabled()  # an edited report is signed as written, never as the draft
        page.locator("#orapo-sign").click()
        page.locator("#orapo-confirm-sign").click()
        expect(page.locator("#orapo-status")).to_contain_text("corrected and signed by rita", timeout=30_000)
        context.close()
    signed = CorrectionRepository(db).latest_for_study(1)  # the one study of this data folder
    assert signed.text == FIXED and signed.signed_at is not None and not signed.accepted_unchanged
