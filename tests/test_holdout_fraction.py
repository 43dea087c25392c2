"""ORAPO_HOLDOUT_FRACTION: the share of new uploads kept out of training for the gate is a setting, not a constant.

Issue 40: the gate held 4 of 5 pleural-other rounds on 21-22 held-out reports, the 10 % a module constant gave;
a clinic that wants its gate to decide on more reports had no way to say so.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.support.dicom import dicom_bytes, image_dataset


@pytest.fixture()
def env(tmp_path):
    from tests.support.app import make_env

    return make_env(tmp_path)


def _upload(env, count: int, holdout_fraction: float | None) -> list[tuple[str, str]]:
    """Upload `count` new studies with the given setting; each one's hashed UID and the split it was stored with."""
    from app.services.reading.ingest import ingest_bytes
    from app.settings import web_settings
    from db import StudyRepository, UserRepository

    settings, db = env
    if holdout_fraction is not None:
        settings = web_settings(settings).model_copy(update={"holdout_fraction": holdout_fraction})
    rita = UserRepository(db).get_by_username("rita")
    splits = []
    for i in range(count):
        ds = image_dataset()
        ds.StudyInstanceUID = f"1.2.826.0.1.3680043.8.498.40.{i + 1}"  # fixed UIDs: the same split at every run
        got = ingest_bytes(dicom_bytes(ds), f"chest-{i}.dcm", db=db, settings=settings, user=rita)
        assert got.ok, got.message
        with db.session() as session:
            study = StudyRepository(session).get(got.study_id)
            splits.append((study.study_uid_hash, study.split))
    return splits


def test_the_default_share_is_the_stores_and_none_is_held_out_at_zero(env):
    from app.settings import DEFAULT_HOLDOUT_FRACTION, WebSettings
    from db.repositories import HOLDOUT_FRACTION

    assert WebSettings().holdout_fraction == DEFAULT_HOLDOUT_FRACTION == HOLDOUT_FRACTION
    assert {split for _hash, split in _upload(env, 12, 0.0)} == {"train"}


def test_a_larger_share_holds_out_more_of_the_studies_uploaded_after_it(env):
    from db.repositories import split_for

    stored = _upload(env, 60, 0.5)
    held = sum(split == "holdout" for _hash, split in stored)
    assert 18 <= held <= 42, held  # these 60 UIDs at one half: far from the default's ~6
    assert all(split == split_for(uid_hash, 0.5) for uid_hash, split in stored)
    assert sum(split_for(uid_hash) == "holdout" for uid_hash, _split in stored) < held  # the default: fewer


def test_the_environment_sets_it_and_a_share_above_a_half_is_refused(monkeypatch):
    from app.settings import WebSettings

    monkeypatch.setenv("ORAPO_HOLDOUT_FRACTION", "0.25")
    assert WebSettings().holdout_fraction == 0.25
    monkeypatch.setenv("ORAPO_HOLDOUT_FRACTION", "0.9")
    with pytest.raises(ValidationError):
        WebSettings()


def test_the_command_line_refuses_a_bad_share_with_a_code_and_a_sentence(monkeypatch, tmp_path, capsys):
    """A settings class refusing an ORAPO_* variable was an `internal_error` quoting pydantic's whole message (the
    value included); it is `invalid_setting`, naming the variable and never its value."""
    from app.cli import main

    monkeypatch.setenv("ORAPO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ORAPO_HOLDOUT_FRACTION", "0.9")
    assert main(["ingest", str(tmp_path / "chest.dcm")]) == 2
    said = capsys.readouterr().err.strip()
    assert said == "invalid_setting: ORAPO_HOLDOUT_FRACTION: Input should be less than or equal to 0.5", said
