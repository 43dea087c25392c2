"""Issue 41 in the Read tab, below the browser: which model wrote the draft and its card (§5), a study's images
and its priors (§6), the upload summary, the legend and drafting again (§8).

The tab's helpers and handlers' answers on a real database; the routes of a study's images over HTTP. What a
reader sees in the page (layout, the toast, the prior beside the viewer) is tests/test_browser_study_images.py.
"""

from __future__ import annotations

import contextlib
import json

import gradio as gr
import numpy as np
import pytest
from pydicom.uid import generate_uid

from tests.support.dicom import dicom_bytes, image_dataset


@pytest.fixture()
def clinic(tmp_path):
    """rita's current study of patient TEST-1 (a lateral then a frontal), and an earlier one with a signed report."""
    from app.services.reading import reports
    from app.services.reading.ingest import ingest_bytes
    from db import UserRepository
    from tests.support.app import make_env

    settings, db = make_env(tmp_path)
    rita = UserRepository(db).get_by_username("rita")
    earlier, now = generate_uid(), generate_uid()

    def film(uid: str, view: str, name: str):
        ds = image_dataset()
        ds.StudyInstanceUID, ds.ViewPosition, ds.StudyDate, ds.BodyPartExamined = uid, view, "20260105", "CHEST"
        return ingest_bytes(dicom_bytes(ds), name, db=db, settings=settings, user=rita)

    prior = film(earlier, "PA", "prior_pa.dcm")
    reports.save_report(
        db, rita, prior.study_id, None, "Findings: Small left pleural effusion.\nNo pneumothorax.", sign=True
    )
    lateral, frontal = film(now, "LL", "now_ll.dcm"), film(now, "PA", "now_pa.dcm")
    assert lateral.study_id == frontal.study_id != prior.study_id and frontal.added
    return settings, db, rita, prior, lateral, frontal


class Ctx:
    """What the tab's helpers read of the app's context."""

    def __init__(self, settings, db):
        self.settings, self.database = settings, db


def _column():
    from app.tabs import read_report

    with gr.Blocks():
        return read_report.build_column(None)


def _draft(db, study_id, text="No pneumothorax.", **fields):
    from db import DraftRepository

    return DraftRepository(db).create(study_id, model_name="starter", prompt="Describe.", text=text, **fields)


def test_the_status_names_the_version_that_wrote_the_draft_not_its_base_folder(clinic):
    from app.services.reading import drafting
    from app.tabs import read_report
    from db import ModelVersionRepository

    settings, db, rita, _, lateral, _ = clinic
    version = ModelVersionRepository(db).create("round-1", base_model_path="models/starter")
    # a promoted round-1 drafts on the starter's folder: the model name stored is the folder's
    _draft(db, lateral.study_id, sampling={"model_version": "round-1"}, model_version_id=version.id)
    overview = drafting.open_study(db, rita, lateral.study_id)
    column = _column()
    status = read_report.opened(column, rita, overview, drafting.first_image(overview))[column.status]
    assert f"by **round-1 (version {version.id})**" in status and "starter" not in status


def test_drafting_again_says_when_the_text_is_the_same_as_the_previous_draft(clinic):
    from app.tabs.read_model import draft_status

    settings, db, rita, _, lateral, _ = clinic
    first = _draft(db, lateral.study_id)
    again = _draft(db, lateral.study_id)
    other = _draft(db, lateral.study_id, text="Small right pneumothorax.")
    assert draft_status(again, first, 1.0) == (
        f"Draft {again.id} by **starter** in 1.0 s · **same text as draft {first.id}**: the model drafts greedily "
        "(its most likely words), so the same model gives the same report for the same image"
    )
    assert "same text" not in draft_status(other, again, 1.0)  # another text
    assert "same text" not in draft_status(first, None)  # the first draft of the study
    by_round = _draft(db, lateral.study_id, sampling={"model_version": "round-1"})
    assert "same text" not in draft_status(by_round, again)  # another model: its sameness would be news


def test_the_model_card_is_the_drafting_models_and_says_when_the_draft_predates_it(clinic):
    from app.tabs.read_model import card_of
    from db import ModelVersionRepository

    settings, db, rita, _, lateral, _ = clinic
    ctx = Ctx(settings, db)
    label, text = card_of(ctx, None)  # nothing open: the model drafting now, the shipped starter
    assert label == "Model card: starter" and "Intended use" in text and "synthetic PhantomCXR" in text
    starter_draft = _draft(db, lateral.study_id)
    versions = ModelVersionRepository(db)
    one = versions.create("round-1", base_model_path=str(settings.models_dir / "starter"))
    versions.promote(one.id)
    label, text = card_of(ctx, _draft(db, lateral.study_id, model_version_id=one.id))
    assert label == f"Model card: round-1 (version {one.id})" and f"### Model card: round-1 (version {one.id})" in text
    label, text = card_of(ctx, starter_draft)  # written before round-1 was promoted: no card of its own now
    assert text.startswith(f"Draft {starter_draft.id} was written by **starter**, served before any version")


def test_the_upload_summary_names_files_as_uploaded_and_says_where_each_went(clinic):
    from app.tabs.read_upload import dropped_lines

    settings, db, rita, prior, lateral, frontal = clinic
    batch = json.dumps({"kept": 0, "dropped": [{"name": "too_big.dcm", "reason": "size"}]})
    assert dropped_lines(batch, 1)[0].startswith("- Refused **too\\_big.dcm**: larger than")  # was "too?big.dcm"
    assert frontal.summary() == f"Stored **now\\_pa.dcm**: added to study {lateral.study_id} (now 2 images)"


def test_thumbnails_hang_the_study_in_reading_order_and_show_which_image_is_in_the_viewer(clinic):
    from app.services.reading import drafting
    from app.tabs import read_images

    settings, db, rita, prior, lateral, frontal = clinic
    overview = drafting.open_study(db, rita, lateral.study_id)
    thumbs = read_images.thumbnails(overview, frontal.image_id)
    assert [(t["id"], t["label"], t["shown"]) for t in thumbs] == [
        (lateral.image_id, "Lateral", "false"),  # the drafted image (the first stored) first
        (frontal.image_id, "PA", "true"),
    ]
    study = lateral.study_id
    assert thumbs[1]["url"].endswith(f"/studies/{study}/images/{frontal.image_id}/render.png?preset=default&size=thumb")
    with gr.Blocks():
        ui = read_images.build()
    assert read_images.shown(ui, overview, overview.images[0])[ui.strip].visible is True
    single = drafting.open_study(db, rita, prior.study_id)
    assert read_images.shown(ui, single, single.images[0])[ui.strip].visible is False  # one image: no strip


def test_priors_list_the_patients_earlier_studies_and_open_one_read_only(clinic):
    from app.services.reading import drafting
    from app.tabs import read_priors
    from orapo_core.errors import OrapoError

    settings, db, rita, prior, lateral, _ = clinic
    ctx = Ctx(settings, db)
    with gr.Blocks():
        ui = read_priors.build_list(read_priors.build_panel())
    listed = read_priors.listed(ui, ctx, rita, drafting.open_study(db, rita, lateral.study_id))
    (row,) = listed[ui.table]
    assert row[1:] == [prior.study_id, "signed", "Findings: Small left pleural effusion."]
    assert listed[ui.accordion].label == "Priors of this patient (1)"
    panel = read_priors.prior_panel(ui, ctx, rita, lateral.study_id, prior.study_id)
    assert set(panel) == {ui.panel, ui.title, ui.image, ui.report}  # never the page's session
    assert panel[ui.report] == "Findings: Small left pleural effusion.\nNo pneumothorax."  # the whole report
    assert f"**Prior: study {prior.study_id}**" in panel[ui.title] and "signed by rita" in panel[ui.title]
    assert panel[ui.image].endswith(f"/studies/{prior.study_id}/images/{prior.image_id}/render.png?preset=default")
    with pytest.raises(OrapoError) as refused:  # the study open is no prior of itself
        read_priors.prior_panel(ui, ctx, rita, lateral.study_id, lateral.study_id)
    assert refused.value.code == "study_not_found"


def test_the_legend_stands_apart_and_names_removed_and_added_sentences(clinic):
    from app.services.reading import highlights
    from app.tabs.read_report import _legend_md, _missed_md

    settings, db, rita, _, lateral, _ = clinic
    draft = _draft(
        db,
        lateral.study_id,
        text="No pneumothorax. Small right pleural effusion.",
        sentence_scores=[
            {"text": "No pneumothorax.", "confidence": 1.0},
            {"text": "Small right pleural effusion.", "confidence": 0.5},
        ],
        facts={"flagged": [], "withheld": [], "added": ["Small right pleural effusion."]},
    )
    before = highlights.highlights_for(draft, None)
    assert highlights.ADDED_LABEL in _legend_md(before) and "confidence under 0.50" in _legend_md(before)
    after = highlights.highlights_for(draft, "Small right pleural effusion.")  # "No pneumothorax." deleted
    assert "− removed" in _legend_md(after) and "✓ entailed" in _legend_md(after)
    assert "orapo-chip" not in _missed_md(after) and "Missed by the draft" in _missed_md(after)
    plain = highlights.highlights_for(_draft(db, lateral.study_id), None)  # drafted without samples: no colour
    assert _legend_md(plain) == "" and _legend_md(None) == ""


@contextlib.contextmanager
def _http_as(url: str, username: str, password: str):
    import httpx

    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/login", data={"username": username, "password": password}).status_code == 200
        yield http


@pytest.mark.slow  # a live server
def test_every_image_of_a_study_is_served_to_its_reader_only(clinic):
    from app.study_image_routes import image_pixels_url, image_png_url
    from app.viewer_routes import pixels_url
    from tests.support.app import launched_app

    settings, db, rita, prior, lateral, frontal = clinic
    study = lateral.study_id
    with launched_app(settings, db) as (url, _):
        with _http_as(url, "rita", "rita-pass-1") as http:
            # the first image's route serves the first image only: the frontal needs the image's own
            assert http.get(pixels_url(study, frontal.image_id)).status_code == 404
            response = http.get(image_pixels_url(study, frontal.image_id))
            assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
            meta = json.loads(response.headers["x-orapo-image"])
            assert (meta["study"], meta["image"]) == (study, frontal.image_id)
            pixels = np.frombuffer(response.content, dtype=meta["dtype"]).reshape(meta["rows"], meta["columns"])
            assert pixels.shape == (64, 48) and pixels.max() == 4095  # the stored ramp, at full bit depth
            thumb = http.get(image_png_url(study, frontal.image_id, thumbnail=True))
            assert thumb.status_code == 200 and thumb.content[:8] == b"\x89PNG\r\n\x1a\n"
            assert http.get(image_png_url(study, prior.image_id)).status_code == 404  # another study's image
            assert http.get(image_png_url(study, frontal.image_id, preset="nope")).status_code == 404
        with _http_as(url, "omar", "omar-pass-1") as omar:
            for address in (image_pixels_url(study, frontal.image_id), image_png_url(study, frontal.image_id)):
                assert omar.get(address).status_code == 403
