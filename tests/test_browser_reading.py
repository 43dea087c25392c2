"""The clinician's flow in a real browser: sign in, upload, draft, see highlights, edit, sign, find it in the worklist.

Drives Debian's Chromium through Playwright against the launched app. The
served model is a tiny random VLM from tests/support/tiny_vlms.py, loaded through the
real path; its `generate` is scripted to write a readable report (random
weights write noise with no findings in it, which would leave nothing for the
highlights to show). Screenshots of each step go to tests/artifacts/.
"""

from __future__ import annotations

import re
import shutil

from tests.support.browser import ARTIFACTS, require_chromium
from tests.support.dicom import pydicom_data_file

require_chromium()

GREEDY = "There is a small right pleural effusion. No pneumothorax. Heart size is normal."
SAMPLES = [
    GREEDY,
    "No pleural effusion. No pneumothorax. Heart size is normal.",
    "No effusion. No pneumothorax. Heart size is normal.",
    "No pneumothorax. Heart size is normal.",
]


def scripted_registry(settings, db):
    """A ModelRegistry whose drafters load the configured tiny model but write a fixed, readable report."""
    from app.services.reading.registry import ModelRegistry
    from orapo_core.models.draft import Drafter
    from orapo_core.models.loading import load_model

    class ScriptedDrafter(Drafter):
        def new_decoder(self):
            return None  # no running batch: every draft goes through _generate_many, scripted below

        def _generate_many(self, pictures, samples, max_new_tokens, temperature, top_p, seed):
            assert all(p.mode == "RGB" and min(p.size) > 16 for p in pictures)  # the real image reached the model
            return [(GREEDY, SAMPLES[:samples]) for _ in pictures]

    return ModelRegistry(
        settings, db, loader=lambda served: ScriptedDrafter(load_model(served.model_dir), model_version=served.name)
    )


def test_clinician_reads_drafts_corrects_signs_and_finds_the_study(browser, tmp_path, tiny_model):
    from playwright.sync_api import expect

    from db import CorrectionRepository, PairRepository, StudyRepository
    from tests.support.app import launched_app, make_env

    settings, db = make_env(tmp_path, tiny_model)
    ARTIFACTS.mkdir(exist_ok=True)
    upload = tmp_path / "RG1_J2KR.dcm"
    shutil.copy(pydicom_data_file("RG1_J2KR.dcm"), upload)

    with launched_app(settings, db, scripted_registry(settings, db)) as (url, _):
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(30_000)
        shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"reading-{name}.png"), full_page=True)  # noqa: E731

        page.goto(url)
        page.get_by_label("username").fill("rita")
        page.get_by_label("password").fill("rita-pass-1")
        shot("1-sign-in")
        page.get_by_role("button", name="Login").click()
        expect(page.locator("#orapo-whoami")).to_contain_text("Signed in as rita (radiologist)")
        expect(page.get_by_role("tab", name="Admin")).to_have_count(0)  # hidden for a radiologist
        shot("2-signed-in")

        page.locator("input[type=file]").first.set_input_files(str(upload))
        expect(page.locator("#orapo-upload-status")).to_contain_text("Stored RG1_J2KR.dcm: study", timeout=60_000)
        expect(page.locator("#orapo-study")).to_contain_text(re.compile(r"1[0-6]-bit DICOM"))
        viewer = page.locator(".orapo-viewer")  # Cornerstone3D over the decoded JPEG 2000, at full bit depth
        expect(viewer).to_have_attribute("data-state", "ready")
        shot("3-uploaded")
        page.locator("button[data-preset=lung]").click()  # re-windowed in the page (tests/test_browser_viewer.py)
        expect(viewer).to_have_attribute("data-window", "lung")
        page.get_by_text("De-identified header").click()
        expect(page.locator("#orapo-header")).to_contain_text("DeidentificationMethod")
        shot("3b-lung-window-and-header")

        page.locator("#orapo-draft").click()

        def status_of(sentence: str):
            return page.locator("#orapo-highlights .token", has_text=sentence).locator(".label")

        # before editing: the share of samples that agree, as a number on a blue badge, under a title saying so
        expect(status_of("There is a small right pleural effusion.")).to_have_text(
            re.compile(r"^confidence 0\.[0-4]\d$"), timeout=60_000
        )
        expect(status_of("Heart size is normal.")).to_have_text("confidence 1.00")  # every sample agrees
        panel = page.locator("#orapo-highlights")
        expect(panel).to_contain_text("the model's confidence per sentence")
        expect(page.locator("#orapo-legend")).to_contain_text("share of the model's samples that agree")
        low_badge = status_of("There is a small right pleural effusion.")
        # a badge never wraps inside, whatever the width of the panel
        assert low_badge.evaluate("e => getComputedStyle(e).whiteSpace") == "nowrap"
        confidence_colour = low_badge.evaluate("e => getComputedStyle(e).backgroundColor")
        expect(page.locator("#orapo-report textarea")).to_have_value(GREEDY)
        expect(page.locator("#orapo-accept")).to_be_enabled(timeout=30_000)  # the report is the draft
        shot("4-drafted")

        edited = (
            GREEDY.replace("There is a small right pleural effusion.", "No pleural effusion.")
            + " Consolidation in the left lower lobe."
        )
        page.locator("#orapo-report textarea").fill(edited)
        expect(status_of("There is a small right pleural effusion.")).to_have_text("✗ contradicted")
        expect(status_of("No pneumothorax.")).to_have_text("✓ entailed")
        expect(page.locator("#orapo-missed")).to_contain_text("Missed by the draft: Consolidation")
        # after editing: verdicts with a symbol, their own colours, legend and title
        expect(panel).to_contain_text("the FactS verdict per sentence")
        expect(page.locator("#orapo-legend")).to_contain_text("your report says otherwise")
        expect(page.locator("#orapo-missed")).to_contain_text(
            "There is a small right pleural effusion. pleural effusion: stated in the draft, denied in the report"
        )
        verdict_colour = status_of("There is a small right pleural effusion.").evaluate(
            "e => getComputedStyle(e).backgroundColor"
        )
        assert verdict_colour == "rgb(198, 40, 40)" and confidence_colour != verdict_colour
        page.locator("#orapo-highlights .token", has_text="There is a small right pleural effusion.").click()
        expect(page.locator("#orapo-facts")).to_contain_text("Pleural Effusion")
        expect(page.locator("#orapo-facts")).to_contain_text("contradicted")
        expect(page.locator("#orapo-accept")).to_be_disabled(timeout=30_000)  # edited: no longer the draft
        shot("5-edited")

        page.locator("#orapo-sign").click()
        expect(page.locator("#orapo-confirm-text textarea")).to_have_value(edited, timeout=30_000)
        page.locator("#orapo-confirm-sign").click()
        expect(page.locator("#orapo-status")).to_contain_text(
            "Report version 1 corrected and signed by rita", timeout=30_000
        )
        shot("6-signed")

        page.get_by_role("tab", name="Worklist").click()
        page.locator("#orapo-worklist-refresh").click()
        expect(page.locator("#orapo-worklist")).to_contain_text("signed")
        page.locator("#orapo-worklist [data-testid=cell-0-0]").click()  # the study id of the first row
        expect(page.locator("#orapo-worklist-history")).to_contain_text("report v1")
        shot("7-worklist")

        page.locator("#orapo-worklist-open").click()  # reopen to amend: a new version, never an overwrite
        expect(page.locator("#orapo-report textarea")).to_have_value(edited)
        expect(page.locator("#orapo-status")).to_contain_text("saving now makes an amendment")
        page.locator("#orapo-report textarea").fill(edited + " Heart size is normal.")
        page.locator("#orapo-sign").click()
        expect(page.locator("#orapo-confirm-question")).to_contain_text(
            "This creates an amendment of the signed report", timeout=30_000
        )
        page.locator("#orapo-confirm-sign").click()
        expect(page.locator("#orapo-status")).to_contain_text(
            "Report version 2 (an amendment of signed version 1) corrected and signed by rita", timeout=30_000
        )
        shot("8-amended")

    study = StudyRepository(db).list()[0]
    first, amended = CorrectionRepository(db).history(study.study.id)
    assert (first.text, first.signed_at is not None, first.accepted_unchanged) == (edited, True, False)
    assert (amended.version, amended.previous_id, amended.text) == (2, first.id, edited + " Heart size is normal.")
    if study.study.split == "train":
        assert edited in [p.chosen for p in PairRepository(db).list()]


def test_what_is_signed_is_exactly_the_report_on_screen(browser, tmp_path, tiny_model):
    """Edit the draft: accepting it is no longer offered; signing shows the exact text first, and stores it;
    amending the signed report from the Read tab says so before anything is saved."""
    from playwright.sync_api import expect

    from db import CorrectionRepository, StudyRepository
    from tests.support.app import launched_app, make_env, phantom_png

    wait = 30_000  # every wait is explicit: the app drafts on 2 busy cores
    settings, db = make_env(tmp_path, tiny_model)
    ARTIFACTS.mkdir(exist_ok=True)
    upload = phantom_png(tmp_path / "chest.png", seed=7)
    with launched_app(settings, db, scripted_registry(settings, db)) as (url, _):
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(wait)
        shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"signing-{name}.png"), full_page=True)  # noqa: E731
        page.goto(url, timeout=wait)
        page.get_by_label("username").fill("rita")
        page.get_by_label("password").fill("rita-pass-1")
        page.get_by_role("button", name="Login").click()
        expect(page.locator("#orapo-whoami")).to_contain_text("Signed in as rita", timeout=wait)
        page.locator("input[type=file]").first.set_input_files(str(upload))
        expect(page.locator("#orapo-upload-status")).to_contain_text("Stored chest.png: study", timeout=60_000)

        report, accept = page.locator("#orapo-report textarea"), page.locator("#orapo-accept")
        confirm_panel, confirm_text = page.locator("#orapo-confirm"), page.locator("#orapo-confirm-text textarea")
        expect(accept).to_be_disabled(timeout=wait)  # nothing to accept before a draft
        page.locator("#orapo-draft").click()
        expect(report).to_have_value(GREEDY, timeout=60_000)
        expect(accept).to_be_enabled(timeout=wait)

        edited = GREEDY.replace("There is a small right pleural effusion.", "No pleural effusion.")
        report.fill(edited)
        expect(accept).to_be_disabled(timeout=wait)
        report.fill(GREEDY.replace(". ", ".\n"))  # the draft again, only re-spaced: accepting is offered again
        expect(accept).to_be_enabled(timeout=wait)
        report.fill(edited)
        expect(accept).to_be_disabled(timeout=wait)
        shot("1-edited")

        page.locator("#orapo-sign").click()
        expect(confirm_panel).to_be_visible(timeout=wait)
        expect(confirm_text).to_have_value(edited, timeout=wait)
        expect(page.locator("#orapo-confirm-question")).to_contain_text("Sign this report?", timeout=wait)
        expect(page.locator("#orapo-confirm-question")).not_to_contain_text("amendment", timeout=wait)
        expect(report).to_be_disabled(timeout=wait)  # locked while the confirmation is open
        shot("2-confirm")
        page.locator("#orapo-confirm-back").click()  # go back: nothing stored, the report editable again
        expect(confirm_panel).to_be_hidden(timeout=wait)
        expect(report).to_be_editable(timeout=wait)
        assert CorrectionRepository(db).latest_for_study(StudyRepository(db).list()[0].study.id) is None

        final = edited + " Mild bibasal atelectasis."
        report.fill(final)
        page.locator("#orapo-sign").click()
        expect(confirm_text).to_have_value(final, timeout=wait)
        shown = confirm_text.input_value()
        page.locator("#orapo-confirm-sign").click()
        expect(page.locator("#orapo-status")).to_contain_text(
            "Report version 1 corrected and signed by rita", timeout=wait
        )
        expect(confirm_panel).to_be_hidden(timeout=wait)
        on_screen = report.input_value()
        study_id = StudyRepository(db).list()[0].study.id
        signed = CorrectionRepository(db).latest_for_study(study_id)
        assert signed.signed_at is not None and not signed.accepted_unchanged
        assert signed.text == on_screen == shown == final  # the stored signed text is the text on screen
        shot("3-signed")

        # amend the signed report from the Read tab itself: it says so before anything is saved
        report.fill(final + " No pneumothorax.")
        page.locator("#orapo-save").click()
        expect(page.locator("#orapo-confirm-question")).to_contain_text(
            "This creates an amendment of the signed report", timeout=wait
        )
        expect(page.locator("#orapo-confirm-sign")).to_have_text("Save amendment", timeout=wait)
        assert len(CorrectionRepository(db).history(study_id)) == 1  # asked, not yet saved
        shot("4-amendment-warning")
        page.locator("#orapo-confirm-sign").click()
        expect(page.locator("#orapo-status")).to_contain_text(
            "Report version 2 (an amendment of signed version 1) corrected and saved, not signed", timeout=wait
        )

    first, amendment = CorrectionRepository(db).history(study_id)
    assert (first.text, first.signed_at is not None) == (final, True)
    assert (amendment.text, amendment.version, amendment.previous_id, amendment.signed_at) == (
        final + " No pneumothorax.",
        2,
        first.id,
        None,
    )


def test_admin_creates_a_user_who_must_change_the_password_first(browser, tmp_path):
    from playwright.sync_api import expect

    from tests.support.app import launched_app, make_env

    settings, db = make_env(tmp_path)
    ARTIFACTS.mkdir(exist_ok=True)
    with launched_app(settings, db) as (url, _):
        admin = browser.new_context(viewport={"width": 1600, "height": 1000})
        page = admin.new_page()
        page.set_default_timeout(30_000)
        page.goto(url)
        page.get_by_label("username").fill("boss")
        page.get_by_label("password").fill("admin-pass-1")
        page.get_by_role("button", name="Login").click()
        page.get_by_role("tab", name="Admin").click()
        page.get_by_label("Username").fill("nina")
        page.get_by_role("button", name="Create user").click()
        result = page.locator("#orapo-users-result")
        expect(result).to_contain_text("One-time password, shown once")
        password = result.locator("code").inner_text()
        page.get_by_role("button", name="Show").click()
        expect(page.locator("#orapo-audit")).to_contain_text("user.create")
        page.screenshot(path=str(ARTIFACTS / "admin-1-users-and-audit.png"), full_page=True)
        admin.close()

        newcomer = browser.new_context(viewport={"width": 1600, "height": 1000})
        page = newcomer.new_page()
        page.set_default_timeout(30_000)
        page.goto(url)
        page.get_by_label("username").fill("nina")
        page.get_by_label("password").fill(password)
        page.get_by_role("button", name="Login").click()
        expect(page.locator("#orapo-whoami")).to_contain_text("change your one-time password")
        expect(page.get_by_role("tab", name="Read")).to_have_count(0)
        page.screenshot(path=str(ARTIFACTS / "admin-2-one-time-password.png"), full_page=True)
        page.locator("#orapo-old-password textarea, #orapo-old-password input").fill(password)
        page.locator("#orapo-new-password textarea, #orapo-new-password input").fill("nina-new-pass")
        page.locator("#orapo-repeat-password textarea, #orapo-repeat-password input").fill("nina-new-pass")
        page.locator("#orapo-change-password").click()
        expect(page.get_by_role("tab", name="Read")).to_be_visible()
        expect(page.get_by_role("tab", name="Admin")).to_have_count(0)
        newcomer.close()
