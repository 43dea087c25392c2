"""Issue 41 in the Read tab, in a real browser at 1280 x 720: the banner, a study's images and its priors, the
model card (§5, §6), and the report column's small things (§8).

Drives Debian's Chromium through Playwright against the launched app. The served model is the shipped starter
(learned from synthetic films only, so the banner shows) with a fake drafter that writes the same long report every
time, as greedy drafting does; what is checked is the page. rita has an earlier study of patient TEST-1 with a
signed report; she uploads the current one, a lateral and then a frontal.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.support.browser import ARTIFACTS, require_chromium, signed_in

require_chromium()

WAIT = 30_000  # every wait is explicit: the app runs on 2 busy cores
SIZE = (1280, 720)
SENTENCES = [
    "Findings: There is a large left pleural effusion.",
    "No pneumothorax.",
    "Consolidation in the right lower lobe.",
    "Cardiomegaly.",
    "Mild pulmonary edema.",
    "Endotracheal tube 4 cm above the carina.",
    "Right IJ central line tip in the SVC.",
    "No acute osseous abnormality.",
    "Degenerative changes of the thoracic spine.",
    "Impression: Large left pleural effusion, consolidation, cardiomegaly, mild edema.",
    "Lines and tubes as above.",
    "Follow-up radiograph recommended.",
]
CONFIDENCES = [0.9, 1.0, 0.25, 0.75, 0.5, 1.0, 0.6, 1.0, 0.8, 0.4, 1.0, 0.2]
PRIOR_REPORT = "Findings: Small left pleural effusion.\nNo pneumothorax."
# every token of the highlights inside the box that shows them: none scrolled out of sight
ALL_SHOWN = """() => { const box = document.querySelector('#orapo-highlights .textfield').getBoundingClientRect();
  const tokens = [...document.querySelectorAll('#orapo-highlights .textfield .token')];
  return tokens.length > 0 && tokens.every((t) => { const r = t.getBoundingClientRect();
    return r.top >= box.top - 1 && r.bottom <= box.bottom + 1; }); }"""
NOT_CLIPPED = "(e) => e.scrollHeight <= e.clientHeight + 1 && e.scrollWidth <= e.clientWidth + 1"


class SameDraft:
    """Writes the same report every time, with a confidence per sentence (what a greedy drafter does)."""

    def draft(self, image, **settings):
        from orapo_core.models.draft import Draft

        sentences = [{"text": s, "confidence": c} for s, c in zip(SENTENCES, CONFIDENCES)]
        return Draft(
            text=" ".join(SENTENCES),
            samples=[],
            sentences=sentences,
            flagged=[],
            model_name="fake",
            model_version="fake",
            prompt="Describe.",
            prompt_version="test",
            sampling={},
            latency_ms=1.0,
        )


def _film(uid: str, view: str):
    from tests.support.dicom import dicom_bytes, image_dataset

    ds = image_dataset()  # patient TEST-1
    ds.StudyInstanceUID, ds.ViewPosition, ds.StudyDate, ds.BodyPartExamined = uid, view, "20260105", "CHEST"
    return dicom_bytes(ds)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from pydicom.uid import generate_uid

    from app.services.reading import reports
    from app.services.reading.ingest import ingest_bytes
    from app.services.reading.registry import ModelRegistry
    from db import UserRepository
    from tests.support.app import launched_app, make_env

    root = tmp_path_factory.mktemp("study-images")
    settings, db = make_env(root)  # the shipped starter is served: synthetic films only
    rita = UserRepository(db).get_by_username("rita")
    prior = ingest_bytes(_film(generate_uid(), "PA"), "prior_pa.dcm", db=db, settings=settings, user=rita)
    reports.save_report(db, rita, prior.study_id, None, PRIOR_REPORT, sign=True)
    now = generate_uid()
    files = [root / "now_ll.dcm", root / "now_pa.dcm"]
    files[0].write_bytes(_film(now, "LL"))
    files[1].write_bytes(_film(now, "PA"))
    registry = ModelRegistry(settings, db, loader=lambda served: SameDraft())
    ARTIFACTS.mkdir(exist_ok=True)
    with launched_app(settings, db, registry) as (url, _):
        yield url, db, prior.study_id, files


def _upload(page, files) -> None:
    from playwright.sync_api import expect

    page.locator("#orapo-files input[type=file]").set_input_files([str(f) for f in files])
    expect(page.locator("#orapo-study")).to_contain_text("DX", timeout=60_000)


def _in_view(page, selector: str) -> None:
    page.evaluate("() => window.scrollTo(0, 0)")
    box = page.locator(selector).bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= SIZE[1], (selector, box)


def test_a_study_shows_its_images_and_its_priors_beside_it_and_the_model_card(browser, app):
    from playwright.sync_api import expect

    from app.services.reading import drafting
    from db import CorrectionRepository, UserRepository

    url, db, prior_id, files = app
    context, page = signed_in(browser, url, "rita", "rita-pass-1", viewport=SIZE)
    shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"study-images-{name}.png"))  # noqa: E731
    banner = page.locator("#orapo-synthetic-banner")
    expect(banner).to_contain_text("its drafts of real radiographs are not clinical reads", timeout=WAIT)
    _in_view(page, "#orapo-synthetic-banner")

    # one batch, two images of one study: the second says it was added, and how many the study holds now
    _upload(page, files)
    rita = UserRepository(db).get_by_username("rita")
    summary = page.locator("#orapo-upload-status")
    expect(summary).to_contain_text(re.compile(r"Stored now_ll\.dcm: study (\d+), new"), timeout=WAIT)
    study = int(re.search(r"now_ll\.dcm: study (\d+)", summary.inner_text()).group(1))
    expect(summary).to_contain_text(f"Stored now_pa.dcm: added to study {study} (now 2 images)", timeout=WAIT)
    lateral, frontal = drafting.open_study(db, rita, study).images

    # thumbnails, the drafted image (the lateral, stored first) shown; a click shows the frontal in the viewer
    thumbs = page.locator("#orapo-thumbs [data-image]")
    expect(thumbs).to_have_count(2, timeout=WAIT)
    expect(thumbs.nth(0)).to_contain_text("Lateral", timeout=WAIT)
    expect(thumbs.nth(0)).to_have_attribute("aria-pressed", "true", timeout=WAIT)
    viewer = page.locator(".orapo-viewer")
    expect(viewer).to_have_attribute("data-image", re.compile(rf"/images/{lateral.id}/pixels$"), timeout=WAIT)
    thumbs.nth(1).click()
    expect(viewer).to_have_attribute("data-image", re.compile(rf"/images/{frontal.id}/pixels$"), timeout=WAIT)
    expect(viewer).to_have_attribute("data-state", "ready", timeout=WAIT)
    expect(page.locator("#orapo-thumbs [aria-pressed=true]")).to_contain_text("PA", timeout=WAIT)
    shot("1-thumbnails")

    # the prior opens beside the viewer, its image and its whole signed report, read-only
    page.get_by_text("Priors of this patient (1)").click()
    priors = page.locator("#orapo-priors")
    expect(priors).to_contain_text("Findings: Small left pleural effusion.", timeout=WAIT)
    page.locator("#orapo-priors [data-testid=cell-0-1]").click()
    panel = page.locator("#orapo-prior")
    expect(panel).to_be_visible(timeout=WAIT)
    expect(page.locator("#orapo-prior-title")).to_contain_text(f"Prior: study {prior_id}", timeout=WAIT)
    expect(page.locator("#orapo-prior-title")).to_contain_text("signed by rita", timeout=WAIT)
    expect(page.locator("#orapo-prior-report textarea")).to_have_value(PRIOR_REPORT, timeout=WAIT)
    expect(page.locator("#orapo-prior-report textarea")).not_to_be_editable(timeout=WAIT)
    page.wait_for_function(
        "() => { const i = document.querySelector('#orapo-prior-image img');"
        " return !!i && i.complete && i.naturalWidth > 0; }",
        timeout=WAIT,
    )
    image_box, prior_box = page.locator(".orapo-viewport").bounding_box(), panel.bounding_box()
    assert prior_box["x"] >= image_box["x"] + image_box["width"] - 1  # beside the current image, not below it
    assert prior_box["y"] < image_box["y"] + image_box["height"]
    shot("2-prior-beside")

    # the model card of the model drafting now
    page.get_by_text("Model card: starter").click()
    card = page.locator("#orapo-model-card")
    expect(card).to_contain_text("Intended use", timeout=WAIT)
    expect(card).to_contain_text("synthetic PhantomCXR studies", timeout=WAIT)

    # a save with the prior open goes to the current study, never to the prior
    page.locator("#orapo-report textarea").fill("Small right pleural effusion. No pneumothorax.")
    page.locator("#orapo-save").click()
    expect(page.locator("#orapo-status")).to_contain_text("Report version 1 corrected and saved", timeout=WAIT)
    expect(page.locator("#orapo-study")).to_contain_text(f"Study {study}", timeout=WAIT)
    assert [c.text for c in CorrectionRepository(db).history(study)] == [
        "Small right pleural effusion. No pneumothorax."
    ]
    assert [c.text for c in CorrectionRepository(db).history(prior_id)] == [PRIOR_REPORT]
    shot("3-saved-with-prior-open")
    context.close()


def test_the_report_column_shows_every_sentence_its_legend_and_the_verdicts(browser, app):
    from playwright.sync_api import expect

    url, db, prior_id, files = app
    context, page = signed_in(browser, url, "boss", "admin-pass-1", viewport=SIZE)
    shot = lambda name: page.screenshot(path=str(ARTIFACTS / f"study-images-{name}.png"))  # noqa: E731
    _upload(page, files[:1])  # already stored: opens rita's study (boss may read it)
    status = page.locator("#orapo-status")
    page.locator("#orapo-draft").click()
    expect(status).to_contain_text(re.compile(r"Draft (\d+) by starter in"), timeout=60_000)
    first = int(re.search(r"Draft (\d+) by", status.inner_text()).group(1))
    expect(page.locator("#orapo-highlights .token .label")).to_have_count(len(SENTENCES), timeout=WAIT)
    assert page.evaluate(ALL_SHOWN)  # every sentence in sight, the least confident (the last) included
    legend = page.locator("#orapo-legend")
    expect(legend).to_contain_text("confidence under 0.50", timeout=WAIT)
    assert legend.evaluate(NOT_CLIPPED)
    _in_view(page, "#orapo-legend")
    shot("4-every-sentence")

    # drafting again gives the same text, and says so
    page.locator("#orapo-draft").click()
    expect(status).to_contain_text(f"same text as draft {first}: the model drafts greedily", timeout=60_000)
    expect(status).not_to_contain_text(f"Draft {first} by", timeout=WAIT)

    # after an edit: the verdicts' legend names removed sentences, whole, and the facts keep their Verdict column
    page.locator("#orapo-report textarea").fill(" ".join(SENTENCES[:3]) + " No cardiomegaly.")
    expect(legend).to_contain_text("− removed", timeout=WAIT)
    expect(legend).to_contain_text("✗ contradicted", timeout=WAIT)
    assert legend.evaluate(NOT_CLIPPED)
    _in_view(page, "#orapo-legend")
    assert page.evaluate(ALL_SHOWN)
    page.locator("#orapo-highlights .token", has_text="Consolidation in the right lower lobe.").click()
    facts = page.locator("#orapo-facts")
    expect(facts).to_contain_text("entailed", timeout=WAIT)
    verdict, table = facts.locator("th", has_text="Verdict").first.bounding_box(), facts.bounding_box()
    assert verdict["x"] + verdict["width"] <= table["x"] + table["width"] + 1, (verdict, table)
    shot("5-verdicts")
    page.locator("#orapo-report textarea").fill(" ".join(SENTENCES))  # nothing unsaved left behind
    context.close()


def test_the_card_before_any_study_and_a_success_clears_the_refusal_toast_before_it(browser, app):
    from playwright.sync_api import expect

    url, db, prior_id, files = app
    context, page = signed_in(browser, url, "rita", "rita-pass-1", viewport=SIZE)
    page.get_by_text("Model card", exact=True).click()  # before any study: the card of the model drafting now
    expect(page.locator("#orapo-model-card")).to_contain_text("Model card: starter", timeout=WAIT)
    expect(page.locator("#orapo-model-card")).to_be_visible(timeout=WAIT)  # and the accordion stays open
    page.locator("#orapo-save").click()  # nothing open yet: refused, in a toast and in the status line
    toast = page.locator("[data-testid=toast-body].warning")
    expect(toast).to_contain_text("Upload or open a study first.", timeout=WAIT)
    refused_at = time.monotonic()
    expect(page.locator("#orapo-status")).to_contain_text("Upload or open a study first.", timeout=WAIT)
    _upload(page, files[:1])  # a success: the study opens, its status line replaces the refusal
    expect(page.locator("#orapo-status")).not_to_contain_text("Upload or open a study first.", timeout=WAIT)
    expect(toast).to_have_count(0, timeout=5_000)
    # gone because of the success, not because its ten seconds ran out
    assert time.monotonic() - refused_at < 9.5, "the machine was too slow to tell; run again"
    context.close()
