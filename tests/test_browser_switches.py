"""A report never lands on another study, and no switch of study loses an edit, in a real browser.

The race: a reader uploads study A and presses Draft report; while the draft runs, she uploads study B. A's draft
must stay with A (it shows when A is opened again) and change nothing of what the page shows for B; what she then
signs is stored on B, and the confirmation names B. The switches: another upload, a study opened from the Worklist
and "Continue where you left off" each keep an unsaved edit (`app.services.reading.autosave`), which comes back when the
study is opened again.

The served model is a fake drafter that holds each draft until the test lets it go, so the upload of B happens
while A's draft runs, every time.
"""

from __future__ import annotations

import re
import threading

import pytest

from tests.support.browser import ARTIFACTS, require_chromium, signed_in

require_chromium()

WAIT = 30_000


class HeldDrafter:
    """Writes "Draft N. No pneumothorax." for the N-th draft, each once `release` is set (if `hold` is set)."""

    def __init__(self):
        self.count = 0
        self.hold = threading.Event()
        self.started = threading.Event()
        self.release = threading.Event()

    def draft(self, image, **settings):
        from orapo_core.models.draft import Draft

        self.count += 1
        number = self.count
        if self.hold.is_set():
            self.started.set()
            assert self.release.wait(120), "the test never released the draft"
        return Draft(
            text=f"Draft {number}. No pneumothorax.",
            samples=[],
            sentences=[],
            flagged=[],
            model_name="fake",
            model_version="fake",
            prompt="Describe.",
            prompt_version="test",
            sampling={},
            latency_ms=1.0,
        )


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from app.server import build_app, launch_options
    from app.services.reading.registry import ModelRegistry
    from tests.support.app import free_port, make_env

    root = tmp_path_factory.mktemp("switches")
    settings, db = make_env(root, model_dir=root / "fake-model")  # never read: the loader below is a fake
    drafter = HeldDrafter()
    registry = ModelRegistry(settings, db, loader=lambda served: drafter)
    demo = build_app(settings=settings, database=db, registry=registry)
    port = free_port()
    demo.queue(default_concurrency_limit=4).launch(
        server_name="127.0.0.1", server_port=port, quiet=True, prevent_thread_lock=True, **launch_options(settings, db)
    )
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        yield f"http://127.0.0.1:{port}", db, root, drafter
    finally:
        drafter.release.set()
        demo.close()


def upload(page, path, db):
    """Upload one file through the drop zone; the id of the study it opened."""
    from playwright.sync_api import expect

    from db import StudyRepository

    page.locator("#orapo-files input[type=file]").set_input_files(str(path))
    expect(page.locator("#orapo-upload-status")).to_contain_text(f"Stored {path.name}: study", timeout=60_000)
    study = max(o.study.id for o in StudyRepository(db).list())
    expect(page.locator("#orapo-study")).to_contain_text(f"Study {study}", timeout=WAIT)
    return study


def open_from_worklist(page, study: int) -> None:
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Worklist").click()
    page.locator("#orapo-worklist-study input").fill(str(study))
    page.locator("#orapo-worklist-open").click()
    expect(page.locator("#orapo-study")).to_contain_text(f"Study {study}", timeout=WAIT)


def test_a_draft_finishing_after_another_upload_never_moves_the_page_or_the_report(browser, app):
    from playwright.sync_api import expect

    from db import CorrectionRepository, DraftRepository
    from tests.support.app import phantom_png

    url, db, root, drafter = app
    context, page = signed_in(browser, url, "rita", "rita-pass-1", viewport=(1280, 720))
    study_a = upload(page, phantom_png(root / "study-a.png", seed=31), db)
    report = page.locator("#orapo-report textarea")
    study_line = page.locator("#orapo-study")

    drafter.started.clear()
    drafter.release.clear()
    drafter.hold.set()
    page.locator("#orapo-draft").click()
    assert drafter.started.wait(60), "the draft of study A never started"
    study_b = upload(page, phantom_png(root / "study-b.png", seed=32), db)  # while A's draft runs
    assert study_b != study_a
    drafter.hold.clear()
    drafter.release.set()

    # A's draft is stored on A ...
    for _ in range(60):
        if DraftRepository(db).latest_for_study(study_a) is not None:
            break
        page.wait_for_timeout(500)
    draft_a = DraftRepository(db).latest_for_study(study_a)
    assert draft_a is not None and re.fullmatch(r"Draft \d+\. No pneumothorax\.", draft_a.text)
    toasts = page.locator("[data-testid=toast-body]")
    expect(toasts.filter(has_text=f"The draft of study {study_a} is ready and stored with it")).to_have_count(
        1, timeout=WAIT
    )
    # ... and nothing on the page went back to A
    page.wait_for_timeout(1500)
    expect(study_line).to_contain_text(f"Study {study_b}", timeout=WAIT)
    expect(study_line).not_to_contain_text(f"Study {study_a} ", timeout=WAIT)
    expect(report).to_have_value("", timeout=WAIT)
    page.screenshot(path=str(ARTIFACTS / "switches-1-draft-of-a-kept-off-b.png"), full_page=True)

    # what she signs now is stored on B, and the confirmation names B, with its picture, beside its buttons
    text = "Small right pleural effusion. No pneumothorax."
    report.fill(text)
    page.locator("#orapo-sign").click()
    question = page.locator("#orapo-confirm-question")
    expect(question).to_contain_text(f"Study {study_b}", timeout=WAIT)
    expect(question).to_contain_text("patient", timeout=WAIT)
    expect(question).to_contain_text("uploaded", timeout=WAIT)
    thumb = question.locator("img")
    expect(thumb).to_have_attribute("src", re.compile(rf"/studies/{study_b}/render\.png"), timeout=WAIT)
    sign = page.locator("#orapo-confirm-sign")
    sign.scroll_into_view_if_needed()
    expect(sign).to_be_in_viewport(timeout=WAIT)
    expect(question).to_be_in_viewport(timeout=WAIT)
    expect(thumb).to_be_in_viewport(timeout=WAIT)
    page.wait_for_function(
        "() => { const i = document.querySelector('#orapo-confirm-question img');"
        " return i && i.complete && i.naturalWidth > 0; }",
        timeout=WAIT,
    )
    page.screenshot(path=str(ARTIFACTS / "switches-2-confirm-names-the-study.png"))
    sign.click()
    expect(page.locator("#orapo-status")).to_contain_text("Report version 1", timeout=WAIT)
    assert [c.text for c in CorrectionRepository(db).history(study_b)] == [text]
    assert CorrectionRepository(db).history(study_a) == []

    # reopening A shows A's draft, the one made while B was open
    open_from_worklist(page, study_a)
    expect(report).to_have_value(draft_a.text, timeout=WAIT)
    context.close()


def test_no_switch_of_study_loses_an_edit(browser, app):
    from playwright.sync_api import expect

    from tests.support.app import phantom_png

    url, db, root, drafter = app
    drafter.hold.clear()
    context, page = signed_in(browser, url, "omar", "omar-pass-1")
    report = page.locator("#orapo-report textarea")
    status = page.locator("#orapo-status")
    study_a = upload(page, phantom_png(root / "edit-a.png", seed=41), db)
    page.locator("#orapo-draft").click()
    expect(report).to_have_value(re.compile(r"^Draft \d+\."), timeout=WAIT)

    # 1. another upload
    edit_a = "Moderate left pleural effusion. Heart size is normal."
    report.fill(edit_a)
    study_b = upload(page, phantom_png(root / "edit-b.png", seed=42), db)
    expect(
        page.locator("[data-testid=toast-body]").filter(has_text=f"Your unsaved edit of study {study_a} is kept")
    ).to_have_count(1, timeout=WAIT)
    expect(report).to_have_value("", timeout=WAIT)

    # 2. a study opened from the Worklist brings it back, and keeps the edit of the study it leaves
    edit_b = "Mild cardiomegaly."
    report.fill(edit_b)
    open_from_worklist(page, study_a)
    expect(report).to_have_value(edit_a, timeout=WAIT)
    expect(status).to_contain_text("your unsaved edit", timeout=WAIT)
    assert page.evaluate("() => window.orapoUnsaved()") is True  # still unsaved: leaving the page asks
    page.screenshot(path=str(ARTIFACTS / "switches-3-edit-back.png"), full_page=True)
    open_from_worklist(page, study_b)
    expect(report).to_have_value(edit_b, timeout=WAIT)

    # 3. typed, then the page reloaded (leaving anyway), then "Continue where you left off"
    edit_b2 = "Mild cardiomegaly. Small right pleural effusion."
    report.fill(edit_b2)
    page.wait_for_timeout(1500)  # the autosave as she types
    page.on("dialog", lambda dialog: dialog.accept())  # "leave the page" to the unsaved-changes prompt
    page.reload(timeout=WAIT)
    expect(page.locator("#orapo-whoami")).to_contain_text("Signed in as omar", timeout=WAIT)
    resume = page.locator("#orapo-resume")
    expect(resume).to_contain_text(f"study {study_b}", timeout=WAIT)
    resume.click()
    expect(report).to_have_value(edit_b2, timeout=WAIT)

    # saving ends the autosave: opened again, the study shows what was saved, with nothing "unsaved" to offer
    page.locator("#orapo-save").click()
    expect(status).to_contain_text("Report version 1 corrected and saved", timeout=WAIT)
    open_from_worklist(page, study_a)
    expect(report).to_have_value(edit_a, timeout=WAIT)
    open_from_worklist(page, study_b)
    expect(report).to_have_value(edit_b2, timeout=WAIT)
    expect(status).not_to_contain_text("unsaved edit", timeout=WAIT)
    context.close()
