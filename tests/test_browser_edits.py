"""No edit is ever lost, in a real browser: a new draft asks first, leaving asks first, a reload offers the study
again, and a page that opened an older version is refused with an offer to reload; a batch upload names every
file it dropped; the page says so while the served model loads at start-up.

Drives Debian's Chromium through Playwright against the launched app. The served
model is a fake drafter (each draft numbered), so these tests are about the page,
not the model; it loads only when the test opens a gate, so the start-up message
can be seen for certain.
"""

from __future__ import annotations

import os
import re
import threading

import pytest

from tests.support.browser import ARTIFACTS, require_chromium, signed_in

require_chromium()

WAIT = 30_000  # every wait is explicit: the app runs on 2 busy cores
DRAFT = re.compile(r"^Draft \d+\. No pneumothorax\.$")
BADGE = "div.wrap span.error"  # Gradio's status tracker marks a failed output with this badge


class NumberedDrafter:
    """Writes "Draft N. No pneumothorax." for the N-th draft."""

    def __init__(self):
        self.count = 0

    def draft(self, image, **settings):
        from orapo_core.models.draft import Draft

        self.count += 1
        return Draft(
            text=f"Draft {self.count}. No pneumothorax.",
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
    """The app as `orapo serve` starts it (the model warmed in the background), uploads limited to 1 MB."""
    from app.server import build_app, launch_options
    from app.services.reading.registry import ModelRegistry
    from tests.support.app import free_port, make_env

    root = tmp_path_factory.mktemp("edits")
    settings, db = make_env(root, model_dir=root / "fake-model")  # never read: the loader below is a fake
    settings = settings.model_copy(update={"max_upload_mb": 1})
    gate = threading.Event()
    registry = ModelRegistry(settings, db, loader=lambda served: gate.wait(120) and NumberedDrafter())
    demo = build_app(settings=settings, database=db, registry=registry, warm_model=True)
    port = free_port()
    demo.queue(default_concurrency_limit=4).launch(
        server_name="127.0.0.1", server_port=port, quiet=True, prevent_thread_lock=True, **launch_options(settings, db)
    )
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        yield f"http://127.0.0.1:{port}", db, root, gate
    finally:
        gate.set()
        demo.close()


def test_the_page_says_the_model_is_loading_until_it_is_ready(browser, app):
    from playwright.sync_api import expect

    url, db, root, gate = app
    context, page = signed_in(browser, url, "omar", "omar-pass-1")
    note = page.locator("#orapo-model-status")
    expect(note).to_contain_text("Loading the model", timeout=WAIT)  # the server started loading it by itself
    page.screenshot(path=str(ARTIFACTS / "edits-0-model-loading.png"), full_page=True)
    gate.set()
    expect(note).not_to_contain_text("Loading", timeout=WAIT)  # polled until the warm-up ended
    context.close()


def test_a_batch_upload_names_every_file_it_dropped_and_stays_ready(browser, app):
    from playwright.sync_api import expect

    from tests.support.app import phantom_png

    url, db, root, gate = app
    gate.set()
    good = phantom_png(root / "chest.png", seed=21)
    notes = root / "notes.txt"
    notes.write_text("not an image")
    big = root / "big.png"
    big.write_bytes(os.urandom(1_300_000))  # over the 1 MB limit
    context, page = signed_in(browser, url, "omar", "omar-pass-1")
    page.locator("#orapo-files input[type=file]").set_input_files([str(notes), str(big), str(good)])
    summary = page.locator("#orapo-upload-status")
    expect(summary).to_contain_text("Stored chest.png: study", timeout=60_000)
    expect(summary).to_contain_text("Refused notes.txt: not a DICOM, PNG or JPEG file", timeout=WAIT)
    expect(summary).to_contain_text("Refused big.png: larger than the upload limit of 1 MB", timeout=WAIT)
    expect(page.locator("#orapo-study")).to_contain_text("view unknown", timeout=WAIT)
    expect(page.locator(BADGE)).to_have_count(0, timeout=WAIT)
    page.screenshot(path=str(ARTIFACTS / "edits-1-batch-upload.png"), full_page=True)

    # the drop zone takes the next batch: this one only holds a file the page drops, and the summary says so
    page.locator("#orapo-files input[type=file]").set_input_files([str(big)])
    expect(summary).to_contain_text("Refused big.png: larger than the upload limit", timeout=WAIT)
    expect(summary).not_to_contain_text("chest.png", timeout=WAIT)
    expect(page.locator(BADGE)).to_have_count(0, timeout=WAIT)
    context.close()


def test_an_edit_is_never_lost_to_a_draft_a_reload_or_someone_else_saving(browser, app):
    from playwright.sync_api import expect

    from db import CorrectionRepository, StudyRepository
    from tests.support.app import phantom_png

    url, db, root, gate = app
    gate.set()
    image = phantom_png(root / "rita.png", seed=22)
    context, page = signed_in(browser, url, "rita", "rita-pass-1")
    shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"edits-{name}.png"), full_page=True)  # noqa: E731
    page.locator("#orapo-files input[type=file]").set_input_files(str(image))
    expect(page.locator("#orapo-upload-status")).to_contain_text("Stored rita.png: study", timeout=60_000)
    study_id = max(o.study.id for o in StudyRepository(db).list())
    report = page.locator("#orapo-report textarea")
    page.locator("#orapo-draft").click()
    expect(report).to_have_value(DRAFT, timeout=WAIT)
    expect(page.locator("#orapo-status")).to_contain_text(" s", timeout=WAIT)

    # a new draft asks before it replaces an edit; keeping the edit keeps it
    mine = "Small left pleural effusion. No pneumothorax."
    report.fill(mine)
    page.locator("#orapo-draft").click()
    panel = page.locator("#orapo-draft-confirm")
    expect(panel).to_be_visible(timeout=WAIT)
    expect(report).to_have_value(mine, timeout=WAIT)
    shot("2-draft-asks")
    page.locator("#orapo-draft-keep").click()
    expect(panel).to_be_hidden(timeout=WAIT)
    expect(report).to_have_value(mine, timeout=WAIT)
    page.locator("#orapo-draft").click()
    expect(panel).to_be_visible(timeout=WAIT)
    page.locator("#orapo-draft-replace").click()
    expect(report).to_have_value(DRAFT, timeout=WAIT)
    expect(panel).to_be_hidden(timeout=WAIT)

    # leaving with an unsaved edit asks first; once saved it does not
    report.fill(mine)
    expect(page.locator("#orapo-report-saved textarea, #orapo-report-saved input")).to_have_count(1, timeout=WAIT)
    assert page.evaluate("() => window.orapoUnsaved()") is True
    prompts = []

    def answer(dialog):
        prompts.append(dialog.type)
        dialog.dismiss()  # stay on the page

    page.once("dialog", answer)
    page.evaluate("() => { window.__stayed = true; }")
    page.locator("#orapo-sign-out").click()  # a navigation away, like closing or reloading the tab
    page.wait_for_timeout(1500)
    assert prompts == ["beforeunload"] and page.evaluate("() => window.__stayed") is True
    expect(report).to_have_value(mine, timeout=WAIT)
    page.locator("#orapo-save").click()
    expect(page.locator("#orapo-status")).to_contain_text(
        "Report version 1 corrected and saved, not signed", timeout=WAIT
    )
    page.wait_for_function("() => !window.orapoUnsaved()", timeout=WAIT)

    # after a reload, the study she was on is offered again, with her last saved text
    page.reload(timeout=WAIT)
    expect(page.locator("#orapo-whoami")).to_contain_text("Signed in as rita", timeout=WAIT)
    resume = page.locator("#orapo-resume")
    expect(resume).to_contain_text(f"study {study_id}", timeout=WAIT)
    shot("3-continue")
    resume.click()
    expect(report).to_have_value(mine, timeout=WAIT)

    # boss opens the same study (version 1); rita saves version 2; boss's save is refused, with an offer to reload
    boss_context, boss = signed_in(browser, url, "boss", "admin-pass-1")
    boss.get_by_role("tab", name="Worklist").click()
    boss.locator("#orapo-worklist-study input").fill(str(study_id))
    boss.locator("#orapo-worklist-open").click()
    boss_report = boss.locator("#orapo-report textarea")
    expect(boss_report).to_have_value(mine, timeout=WAIT)
    ritas = mine + " Heart size is normal."
    report.fill(ritas)
    page.locator("#orapo-save").click()
    expect(page.locator("#orapo-status")).to_contain_text("Report version 2", timeout=WAIT)
    bosses = mine + " Mild cardiomegaly."
    boss_report.fill(bosses)
    boss.locator("#orapo-save").click()
    status = boss.locator("#orapo-status")
    expect(status).to_contain_text("rita saved version 2 of this report after your page opened version 1", timeout=WAIT)
    expect(boss.locator(BADGE)).to_have_count(0, timeout=WAIT)
    expect(boss_report).to_have_value(bosses, timeout=WAIT)  # his text stays on screen
    expect(boss_report).to_be_editable(timeout=WAIT)
    boss.screenshot(path=str(ARTIFACTS / "edits-4-refused-as-stale.png"), full_page=True)
    assert [c.text for c in CorrectionRepository(db).history(study_id)] == [mine, ritas]
    boss.locator("#orapo-reload-study").click()
    expect(boss_report).to_have_value(ritas, timeout=WAIT)
    expect(status).to_contain_text("Your text, not saved", timeout=WAIT)
    expect(status).to_contain_text("Mild cardiomegaly.", timeout=WAIT)
    expect(boss.locator("#orapo-reload-study")).to_be_hidden(timeout=WAIT)
    boss.screenshot(path=str(ARTIFACTS / "edits-5-reloaded.png"), full_page=True)
    boss_context.close()
    context.close()
