"""Only chest radiographs are drafted; a film unlike the model's training films is flagged (issue 41 §3).

A CT or MR DICOM, a radiograph of another body part and a colour picture are stored but never drafted: the
reason is kept with the study, drafting refuses it with `not_a_chest_radiograph` (the Read tab's service and
`orapo draft` alike), and the "most useful first" ordering leaves it out of its ranking. A CR or DX chest DICOM is
drafted. The unfamiliar-film score of the shipped starter (its shipped calibration) flags real radiographs and
non-chest images and not PhantomCXR films; a grey PNG far from every film it knows is refused at its first draft.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pydicom
import pytest

from orapo_core.errors import OrapoError
from orapo_core.models.starter.build import SHIPPED_DIR


def sample(name: str) -> Path:
    """A DICOM of pydicom's own samples or of the pydicom-data package; the test is skipped without it."""
    from pydicom.data import get_testdata_file

    try:
        found = get_testdata_file(name, download=False)
    except (ValueError, OSError, ImportError):
        found = None
    if not found:
        pytest.skip(f"{name} is not installed (pydicom-data)")
    return Path(found)


def starter_dir() -> Path:
    if not (SHIPPED_DIR / "config.json").is_file():
        pytest.skip(f"no starter shipped under {SHIPPED_DIR}")
    return SHIPPED_DIR


@pytest.fixture
def env(tmp_path):
    """(settings, db, rita) of a new data folder; the model is never loaded (a loader that fails)."""
    from db import UserRepository
    from tests.support.app import make_env

    settings, db = make_env(tmp_path, model_dir=tmp_path / "no-model")
    return settings, db, UserRepository(db).get_by_username("rita")


def _store(settings, db, user, path: Path, name: str | None = None):
    from app.services.reading.ingest import ingest_bytes

    outcome = ingest_bytes(path.read_bytes(), name or path.name, db=db, settings=settings, user=user, actor="rita")
    assert outcome.ok, outcome.message
    return outcome


def _never_loaded(served):
    raise AssertionError("a study that is not a chest radiograph must not reach the model")


def _rewritten(tmp_path: Path, name: str, **values) -> Path:
    ds = pydicom.dcmread(sample(name))
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    out = tmp_path / f"{'-'.join(str(v) for v in values.values())}.dcm"
    ds.save_as(out, enforce_file_format=True)
    return out


def _colour_photo(path: Path) -> Path:
    """A colour picture: hue across, brightness down; every pixel strongly coloured somewhere."""
    from PIL import Image

    y, x = np.mgrid[0:96, 0:128]
    rgb = np.stack([(x * 2) % 256, (y * 2 + 60) % 256, ((x + y) * 3) % 256], axis=2).astype(np.uint8)
    Image.fromarray(rgb, mode="RGB").save(path)
    return path


# --- the rules -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "values", "expected"),
    [
        ("CT_small.dcm", {}, "a CT (Modality CT), not a chest radiograph"),
        ("MR_small.dcm", {}, "an MR image (Modality MR), not a chest radiograph"),
        (
            "RG1_UNCI.dcm",
            {"BodyPartExamined": "KNEE"},
            "a CR radiograph of the KNEE (Body Part Examined KNEE), not of the chest",
        ),
        ("RG1_UNCI.dcm", {}, None),  # CR, CHEST
        ("RG1_UNCI.dcm", {"Modality": "DX", "BodyPartExamined": "thorax"}, None),
        ("RG1_UNCI.dcm", {"Modality": "DX", "BodyPartExamined": ""}, None),  # absent is allowed
        ("RG1_UNCI.dcm", {"Modality": "PX"}, "a panoramic dental X-ray (Modality PX), not a chest radiograph"),
    ],
)
def test_the_header_rules(tmp_path, name, values, expected) -> None:
    from orapo_core.imaging import ingest_path

    path = _rewritten(tmp_path, name, **values) if values else sample(name)
    assert ingest_path(path, secret="s").meta["not_drafted"] == expected


def test_a_colour_picture_is_not_a_radiograph_and_a_grey_one_is_judged_by_the_model(tmp_path) -> None:
    from PIL import Image

    from orapo_core.imaging import ingest_path
    from orapo_core.imaging.scope import colour_share, out_of_scope

    reason = ingest_path(_colour_photo(tmp_path / "photo.png"), secret="s").meta["not_drafted"]
    assert reason.startswith("a colour picture (") and reason.endswith("not a grey radiograph")
    grey = tmp_path / "grey.png"
    Image.fromarray(np.tile(np.arange(128, dtype=np.uint8), (96, 1))).save(grey)
    assert ingest_path(grey, secret="s").meta["not_drafted"] is None
    # a grey film with a small coloured ruler is still a radiograph
    rgb = np.repeat(np.tile(np.arange(100, dtype=np.uint8), (100, 1))[..., None], 3, axis=2)
    rgb[:3, :50] = (255, 0, 0)
    assert colour_share(rgb) == pytest.approx(0.015) and out_of_scope({"colour_share": 0.015}, "png") is None


# --- stored, never drafted, never ranked -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "words"), [("CT_small.dcm", "a CT (Modality CT)"), ("MR_small.dcm", "an MR image (Modality MR)")]
)
def test_ct_and_mr_are_stored_but_never_drafted(env, name, words) -> None:
    from app.services.reading import drafting
    from db import DraftRepository, StudyRepository

    settings, db, rita = env
    outcome = _store(settings, db, rita, sample(name))
    sentence = f"Study {outcome.study_id} is {words}, not a chest radiograph: stored, not drafted."
    assert outcome.not_drafted == sentence
    assert json.loads(outcome.to_json())["not_drafted"] == sentence
    study = StudyRepository(db).get(outcome.study_id)
    assert study.not_drafted == f"{words}, not a chest radiograph" and study.modality == name[:2]
    (image,) = StudyRepository(db).images(outcome.study_id)
    assert (settings.storage_dir / image.dicom_path).is_file()  # stored

    registry = drafting.ModelRegistry(settings, db, loader=_never_loaded)
    with pytest.raises(OrapoError) as refused:
        drafting.draft_study(db, settings, registry, rita, outcome.study_id)
    assert refused.value.code == "not_a_chest_radiograph" and refused.value.message == sentence
    assert DraftRepository(db).latest_for_study(outcome.study_id) is None
    assert StudyRepository(db).get(outcome.study_id).status == "new"


def test_the_reading_order_leaves_them_out_of_the_models_ranking(env) -> None:
    from app.services.reading.reading_order import ordered
    from db import DraftRepository, StudyRepository

    settings, db, rita = env
    ct = _store(settings, db, rita, sample("CT_small.dcm")).study_id  # the oldest unread study
    chest = []
    for uid in ("chest-1", "chest-2"):  # drafts the model is sure of: usefulness 0, so ties keep the oldest first
        study = StudyRepository(db).create(uid, "ANON-" + uid, uploaded_by=rita.id)
        DraftRepository(db).create(
            study.id,
            model_name="m",
            prompt="p",
            text="No pneumothorax.",
            sentence_scores=[{"text": "No pneumothorax.", "confidence": 1.0}],
        )
        chest.append(study.id)
    unread = StudyRepository(db).list(status=["new", "drafted"], limit=10)
    assert [o.study.id for o in ordered(db, unread, "useful")] == [*chest, ct]  # ranked ones, then the CT
    assert [o.study.id for o in ordered(db, unread, "oldest")] == [ct, *chest]


def test_the_worklist_and_the_read_tab_say_why(env) -> None:
    from app.services.reading import scope
    from app.tabs.read_report import study_markdown
    from app.tabs.worklist import rows
    from db import StudyRepository

    settings, db, rita = env
    study_id = _store(settings, db, rita, sample("CT_small.dcm")).study_id
    overview = StudyRepository(db).overview(study_id)
    assert "not drafted: a CT (Modality CT), not a chest radiograph" in rows([overview])[0][3]
    assert f"Study {study_id} is a CT (Modality CT), not a chest radiograph: stored, not drafted." in study_markdown(
        overview, overview.images[0]
    )
    assert scope.study_note(overview.study).startswith("**Not drafted.**")


@pytest.mark.parametrize("values", [{}, {"Modality": "DX"}])
def test_a_chest_radiograph_is_drafted(env, tmp_path, values) -> None:
    from app.services.reading import drafting
    from db import StudyRepository
    from orapo_core.models.draft import Draft

    settings, db, rita = env

    class Writes:
        def draft(self, image, **settings):
            return Draft(
                text="No pneumothorax.",
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

    path = _rewritten(tmp_path, "RG1_UNCI.dcm", **values) if values else sample("RG1_UNCI.dcm")
    outcome = _store(settings, db, rita, path)
    assert outcome.not_drafted is None and StudyRepository(db).get(outcome.study_id).not_drafted is None
    registry = drafting.ModelRegistry(settings, db, loader=lambda served: Writes())
    draft = drafting.draft_study(db, settings, registry, rita, outcome.study_id)
    assert draft.text == "No pneumothorax." and StudyRepository(db).get(outcome.study_id).status == "drafted"


def test_a_colour_png_photo_is_stored_and_refused(env, tmp_path) -> None:
    from app.services.reading import drafting

    settings, db, rita = env
    outcome = _store(settings, db, rita, _colour_photo(tmp_path / "holiday.png"))
    assert outcome.not_drafted.startswith(f"Study {outcome.study_id} is a colour picture (")
    registry = drafting.ModelRegistry(settings, db, loader=_never_loaded)
    with pytest.raises(OrapoError) as refused:
        drafting.draft_study(db, settings, registry, rita, outcome.study_id)
    assert refused.value.code == "not_a_chest_radiograph"


def test_orapo_draft_refuses_what_is_not_a_chest_radiograph(tmp_path, data_dir, capsys) -> None:
    from app.cli import main

    for path in (sample("CT_small.dcm"), _colour_photo(tmp_path / "photo.png")):  # refused before the model loads
        assert main(["draft", str(path), "--model", str(starter_dir())]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"not_a_chest_radiograph: {path.name} is a ") and err.rstrip().endswith("not drafted.")


# --- the unfamiliar-film score -------------------------------------------------------------------------------


def test_the_calibration_is_a_shrunk_mahalanobis_distance_with_a_held_out_threshold(tmp_path) -> None:
    """A tiny synthetic case: 40 films in 60 features (more features than films: the shrinkage keeps it finite)."""
    from orapo_core.models.unfamiliar import FilmCalibration

    rng = np.random.default_rng(0)
    scale = np.linspace(0.2, 2.0, 60)
    reference, heldout = rng.normal(0, 1, (40, 60)) * scale, rng.normal(0, 1, (200, 60)) * scale
    calibration = FilmCalibration.fit(reference, heldout, fingerprint="f")
    assert 0 < calibration.shrinkage <= 1
    assert np.mean(calibration.distances(heldout) > calibration.threshold) == pytest.approx(0.01, abs=0.006)
    familiar = calibration.score(rng.normal(0, 1, 60) * scale)
    odd = calibration.score(np.full(60, 6.0) * scale)  # every feature 6 sd off
    assert not familiar.unfamiliar and odd.unfamiliar and odd.far and odd.ratio > 3
    assert calibration.score(np.zeros(59)) is None and calibration.score(None) is None  # another model's features
    back = FilmCalibration.load(calibration.save(tmp_path / "c.npz"))
    assert back.fingerprint == "f" and back.score(np.full(60, 6.0) * scale).distance == pytest.approx(
        odd.distance, rel=1e-5
    )


@pytest.fixture(scope="module")
def starter():
    from orapo_core.models.draft import Drafter

    return Drafter.from_dir(starter_dir())


@pytest.mark.slow  # loads the shipped starter and drafts with it
def test_the_starter_flags_other_films_and_not_phantomcxr_films(starter, tmp_path) -> None:
    from orapo_core.imaging import ingest_path
    from orapo_core.models import unfamiliar

    assert starter.films.calibration() is not None  # shipped beside the weights
    phantoms = starter.films.score_pictures(unfamiliar.phantom_pictures(20, 3))  # a stream nothing fitted on
    assert sum(s.unfamiliar for s in phantoms) <= 1 and not any(s.far for s in phantoms)
    real, ct = (
        starter.films.score_pictures([starter.prepare(ingest_path(sample(n), secret="s").pixels)])[0]
        for n in ("RG1_UNCI.dcm", "CT_small.dcm")
    )
    assert real.unfamiliar and not real.far  # a real chest radiograph: warned, still drafted
    assert ct.unfamiliar and ct.far  # a CT slice: far from every film the starter knows

    draft = starter.draft(ingest_path(sample("RG1_UNCI.dcm"), secret="s").pixels, samples=0, max_new_tokens=8)
    assert draft.unfamiliar["unfamiliar"] and draft.unfamiliar_warning == unfamiliar.WARNING
    phantom = starter.draft(unfamiliar.phantom_pictures(1, 3)[0], samples=0, max_new_tokens=8)
    assert (
        phantom.unfamiliar is not None and not phantom.unfamiliar["unfamiliar"] and phantom.unfamiliar_warning is None
    )


@pytest.mark.slow
def test_a_grey_png_far_from_every_film_is_refused_at_its_first_draft(tmp_path) -> None:
    """The app with the shipped starter: a CT slice saved as a grey PNG passes ingest (no header, not colour), is
    refused at its first draft and leaves the ranking; a real chest radiograph is drafted with the warning."""
    from PIL import Image

    from app.services.reading import drafting, scope
    from app.services.reading.reading_order import ordered
    from db import AuditRepository, StudyRepository, UserRepository
    from orapo_core.imaging import ingest_path
    from tests.support.app import make_env

    settings, db = make_env(tmp_path, model_dir=starter_dir())
    rita = UserRepository(db).get_by_username("rita")
    png = tmp_path / "slice.png"
    Image.fromarray(ingest_path(sample("CT_small.dcm"), secret="s").display).save(png)
    ct = _store(settings, db, rita, png)
    assert ct.not_drafted is None  # nothing in a grey PNG says what it is
    chest = _store(settings, db, rita, sample("RG1_UNCI.dcm"))

    registry = drafting.ModelRegistry(settings, db)
    with pytest.raises(OrapoError) as refused:
        drafting.draft_study(db, settings, registry, rita, ct.study_id, samples=0)
    assert refused.value.code == "not_a_chest_radiograph"
    assert refused.value.message.startswith(f"Study {ct.study_id} is an image far unlike the films the drafting model")
    assert StudyRepository(db).get(ct.study_id).not_drafted  # kept: refused again at once, and out of the ranking
    assert AuditRepository(db).query(action="study.not_drafted", object_type="study", object_id=ct.study_id)

    draft = drafting.draft_study(db, settings, registry, rita, chest.study_id, samples=0)
    assert draft.facts["unfamiliar"]["unfamiliar"]
    assert scope.draft_note(draft) == " · **⚠ This film is unlike the model's training films; read every sentence.**"
    unread = StudyRepository(db).list(status=["new", "drafted"], limit=10)
    assert [o.study.id for o in ordered(db, unread, "useful")] == [chest.study_id, ct.study_id]
    registry.close()


def test_orapo_draft_warns_on_an_unfamiliar_film(tmp_path, data_dir, capsys) -> None:
    from app.cli import main

    assert (
        main(
            [
                "draft",
                str(sample("RG1_UNCI.dcm")),
                "--model",
                str(starter_dir()),
                "--samples",
                "0",
                "--max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("WARNING: This film is unlike the model's training films; read every sentence.\n")
    assert (
        main(
            [
                "draft",
                str(sample("RG1_UNCI.dcm")),
                "--model",
                str(starter_dir()),
                "--samples",
                "0",
                "--max-new-tokens",
                "8",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["unfamiliar"]["unfamiliar"] and data["unfamiliar_warning"].startswith("This film is unlike")


def test_unread_studies_stored_before_the_rule_are_judged_by_the_migration(blank_database) -> None:
    import sqlalchemy as sa

    from db import StudyRepository

    blank_database.upgrade("0008")
    insert = sa.text(
        "INSERT INTO studies (study_uid_hash, patient_pseudonym, modality, body_part, status, split, "
        "created_at) VALUES (:uid, 'ANON', :modality, :body_part, :status, 'train', :at)"
    )
    with blank_database.engine.begin() as connection:
        for uid, modality, body_part, status in (
            ("ct", "CT", None, "drafted"),
            ("chest", "CR", "CHEST", "new"),
            ("wrist", "DX", "HAND", "new"),
            ("png", None, None, "new"),
            ("signed-ct", "CT", None, "signed"),
        ):
            connection.execute(
                insert,
                {
                    "uid": uid,
                    "modality": modality,
                    "body_part": body_part,
                    "status": status,
                    "at": datetime(2026, 12, 1, tzinfo=UTC),
                },
            )
    blank_database.upgrade()
    kept = {o.study.study_uid_hash: o.study.not_drafted for o in StudyRepository(blank_database).list(limit=10)}
    assert kept == {
        "ct": "a CT (Modality CT), not a chest radiograph",
        "chest": None,
        "wrist": "a DX radiograph of the HAND (Body Part Examined HAND), not of the chest",
        "png": None,
        "signed-ct": None,
    }
