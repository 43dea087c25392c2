"""Refusals are messages, never "Error" badges over the panels; tabs load when they open; sign-out stays in its tab.

Drives Debian's Chromium through Playwright against the launched app. Gradio puts
a red "Error" badge (`BADGE`) over every output of a handler that raises: the
last good values disappear under it and typing is blocked until it is dismissed.
Each refusal here (a duplicate user, a bad cron string, promoting a rejected
version, a wrong current password, a file the server refuses) must instead say
why in the page, and leave the tables, the open study and the typed text visible
and editable.
"""

from __future__ import annotations

import pytest

from tests.support.browser import ARTIFACTS, require_chromium, signed_in

require_chromium()

WAIT = 30_000  # every wait is explicit: the app runs on 2 busy cores
SELECTED = """() => { const f = document.querySelector('#orapo-worklist-study :is(input, textarea)');
  return !!f && f.value.trim() !== ''; }"""
BADGE = "div.wrap span.error"  # Gradio's status tracker marks a failed output with this badge
REPORT = "Small left pleural effusion. No pneumothorax."


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """Users, one study of rita's with a report she signed, and a version the gate rejected."""
    from sqlalchemy import update

    from app.services.reading import reports
    from app.services.reading.ingest import ingest_bytes
    from db import ModelVersionRepository, UserRepository
    from db.models import Study
    from tests.support.app import launched_app, make_env, phantom_png

    root = tmp_path_factory.mktemp("messages")
    settings, db = make_env(root)
    rita = UserRepository(db).get_by_username("rita")
    png = phantom_png(root / "chest.png", seed=11)
    outcome = ingest_bytes(png.read_bytes(), "chest.png", db=db, settings=settings, user=rita, actor="rita")
    reports.save_report(db, rita, outcome.study_id, None, REPORT, sign=True)
    with db.session() as session:  # held out, whatever its hash says: both tabs must say so in a reader's words
        session.execute(update(Study).where(Study.id == outcome.study_id).values(split="holdout"))
    versions = ModelVersionRepository(db)
    rejected = versions.create("round-bad", base_model_path="models/tiny")
    versions.reject(rejected.id, reason="worse on the held-out set")
    ARTIFACTS.mkdir(exist_ok=True)
    with launched_app(settings, db) as (url, _):
        yield url, db, outcome.study_id, rejected


def no_badge(page) -> None:
    from playwright.sync_api import expect

    expect(page.locator(BADGE)).to_have_count(0, timeout=WAIT)


def test_refusals_are_messages_and_leave_every_panel_as_it_was(browser, app):
    from playwright.sync_api import expect

    url, db, study_id, rejected = app
    context, page = signed_in(browser, url, "boss", "admin-pass-1")
    shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"messages-{name}.png"), full_page=True)  # noqa: E731

    # the Admin tab lists users and the audit log as it opens, without Refresh
    page.get_by_role("tab", name="Admin").click()
    users = page.locator("#orapo-users")
    expect(users).to_contain_text("omar", timeout=WAIT)
    expect(page.locator("#orapo-audit")).to_contain_text("auth.sign_in", timeout=WAIT)
    name = page.get_by_label("Username")
    name.fill("rita")
    page.get_by_role("button", name="Create user").click()
    expect(page.locator("#orapo-users-result")).to_contain_text("already exists", timeout=WAIT)
    expect(page.locator("[data-testid=toast-body]").first).to_contain_text("already exists", timeout=WAIT)
    no_badge(page)
    expect(users).to_contain_text("omar", timeout=WAIT)  # the table is still there
    expect(name).to_be_editable(timeout=WAIT)
    expect(name).to_have_value("rita", timeout=WAIT)
    shot("1-duplicate-user")

    # the Rounds tab: a bad cron string, then promoting a rejected version
    page.get_by_role("tab", name="Rounds").click()
    versions = page.locator("#orapo-versions-table")
    expect(versions).to_contain_text("round-bad", timeout=WAIT)
    expect(page.locator("#orapo-round-id input")).to_have_value("", timeout=WAIT)  # empty, never 0
    expect(page.locator("#orapo-version-id input")).to_have_value("", timeout=WAIT)
    cron = page.get_by_label("Cron (minute hour day month weekday)")
    cron.fill("every night")
    page.locator("#orapo-save-schedule").click()
    result = page.locator("#orapo-rounds-result")
    expect(result).to_contain_text("is not a valid cron schedule", timeout=WAIT)
    no_badge(page)
    expect(cron).to_have_value("every night", timeout=WAIT)
    expect(cron).to_be_editable(timeout=WAIT)
    expect(versions).to_contain_text("round-bad", timeout=WAIT)
    expect(page.locator("#orapo-schedule-status")).to_contain_text("Scheduled rounds are off", timeout=WAIT)
    shot("2-bad-cron")

    page.locator("#orapo-version-id input").fill(str(rejected.id))
    page.locator("#orapo-promote").click()
    expect(result).to_contain_text("was rejected and cannot be promoted", timeout=WAIT)
    no_badge(page)
    expect(versions).to_contain_text("round-bad", timeout=WAIT)
    expect(page.locator("#orapo-version-id input")).to_have_value(str(rejected.id), timeout=WAIT)
    shot("3-rejected-version")

    # the Account tab: a wrong current password keeps what was typed
    page.get_by_role("tab", name="Account").click()
    old = page.locator("#orapo-old-password input, #orapo-old-password textarea")
    old.fill("not-my-password")
    page.locator("#orapo-new-password input, #orapo-new-password textarea").fill("boss-new-pass-1")
    page.locator("#orapo-repeat-password input, #orapo-repeat-password textarea").fill("boss-new-pass-1")
    page.locator("#orapo-change-password").click()
    expect(page.locator("#orapo-password-result")).not_to_be_empty(timeout=WAIT)
    no_badge(page)
    expect(old).to_have_value("not-my-password", timeout=WAIT)
    expect(old).to_be_editable(timeout=WAIT)
    shot("4-wrong-password")

    # an administrator may list everyone's studies: the choice is offered to her
    page.get_by_role("tab", name="Worklist").click()
    expect(page.locator("#orapo-worklist-scope")).to_be_visible(timeout=WAIT)
    context.close()


def test_a_radiologist_sees_her_worklist_as_it_opens_with_names_and_no_choice_she_cannot_make(browser, app):
    from playwright.sync_api import expect

    url, db, study_id, _ = app
    context, page = signed_in(browser, url, "rita", "rita-pass-1")
    page.get_by_role("tab", name="Worklist").click()
    table = page.locator("#orapo-worklist")
    expect(table).to_contain_text("signed", timeout=WAIT)  # listed as the tab opens, without Refresh
    expect(table).not_to_contain_text("holdout", timeout=WAIT)  # the split in a reader's words
    expect(page.locator("#orapo-worklist-scope")).to_be_hidden(timeout=WAIT)  # "everyone" would be refused
    expect(page.locator("#orapo-worklist-study input")).to_have_value("", timeout=WAIT)  # empty, never 0
    page.locator("#orapo-worklist [data-testid=cell-0-0]").click()
    history = page.locator("#orapo-worklist-history")
    expect(history).to_contain_text("report v1", timeout=WAIT)
    expect(history).to_contain_text("rita", timeout=WAIT)
    expect(history).not_to_contain_text("author", timeout=WAIT)
    expect(table).to_contain_text("kept aside to check the model", timeout=WAIT)
    open_selected(page)  # the Read tab says what a held-out study is for, not "split holdout"
    study = page.locator("#orapo-study")
    expect(study).to_contain_text("kept aside to check the model; not used to train it", timeout=WAIT)
    expect(study).not_to_contain_text("holdout", timeout=WAIT)
    expect(study).not_to_contain_text("split", timeout=WAIT)
    page.get_by_role("tab", name="Dashboard").click()
    expect(page.locator("#orapo-dashboard-tiles")).to_be_visible(timeout=WAIT)
    expect(page.locator("#orapo-dashboard-scope")).to_be_hidden(timeout=WAIT)
    page.screenshot(path=str(ARTIFACTS / "messages-5-worklist.png"), full_page=True)
    context.close()


def open_selected(page) -> None:
    """Open the study selected in the worklist, once the selection reached the server."""
    from playwright.sync_api import expect

    page.wait_for_function(SELECTED, timeout=WAIT)
    page.locator("#orapo-worklist-open").click()
    expect(page.locator("#orapo-report textarea")).to_have_value(REPORT, timeout=WAIT)


def test_a_refused_upload_is_a_message_and_the_open_study_stays(browser, app, tmp_path):
    from playwright.sync_api import expect

    url, db, study_id, _ = app
    context, page = signed_in(browser, url, "rita", "rita-pass-1")
    page.get_by_role("tab", name="Worklist").click()
    expect(page.locator("#orapo-worklist")).to_contain_text("signed", timeout=WAIT)
    page.locator("#orapo-worklist [data-testid=cell-0-0]").click()
    open_selected(page)
    page.get_by_text("De-identified header").click()
    header = page.locator("#orapo-header")
    expect(header).to_contain_text("PatientID", timeout=WAIT)
    report = page.locator("#orapo-report textarea")
    report.fill(REPORT + " Typed, not saved yet.")

    # a file the page lets through (its name ends in .dcm) that the server refuses: not a DICOM at all
    broken = tmp_path / "messages-broken.dcm"
    broken.write_bytes(b"this is not a DICOM file" * 40)
    page.locator("#orapo-files input[type=file]").set_input_files(str(broken))
    summary = page.locator("#orapo-upload-status")
    expect(summary).to_contain_text("Refused messages-broken.dcm", timeout=WAIT)
    no_badge(page)
    expect(page.locator("#orapo-study")).to_contain_text(f"Study {study_id}", timeout=WAIT)  # still the study open
    expect(report).to_have_value(REPORT + " Typed, not saved yet.", timeout=WAIT)  # the typed text is kept
    expect(report).to_be_editable(timeout=WAIT)
    expect(header).to_contain_text("PatientID", timeout=WAIT)  # the header table is still there
    expect(page.locator(".orapo-viewer")).to_be_visible(timeout=WAIT)
    page.screenshot(path=str(ARTIFACTS / "messages-6-refused-upload.png"), full_page=True)
    report.fill(REPORT)  # nothing unsaved left behind
    context.close()


def test_sign_out_happens_in_the_same_tab_and_ends_the_session(browser, app):
    from playwright.sync_api import expect

    url, *_ = app
    context, page = signed_in(browser, url, "omar", "omar-pass-1")
    page.locator("#orapo-sign-out").click()
    expect(page.get_by_label("username")).to_be_visible(timeout=WAIT)  # this tab shows the sign-in page
    assert len(context.pages) == 1  # and no other tab opened
    expect(page.locator("#orapo-whoami")).to_have_count(0, timeout=WAIT)
    page.goto(url, timeout=WAIT)
    expect(page.get_by_label("username")).to_be_visible(timeout=WAIT)  # the session is over
    context.close()
