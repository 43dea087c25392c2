"""Issue 41 §6: a study is all its images, and its history.

Uploading RG1_UNCR.dcm after RG1_UNCI.dcm said "Stored RG1_UNCR.dcm: study 1", not that it was added to a study
that now holds more images; and nothing listed the patient's earlier studies.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.dicom import pydicom_data_file


@pytest.fixture()
def env(tmp_path):
    from tests.support.app import make_env

    return make_env(tmp_path)


def _ingest(env, name, user, data=None):
    from app.services.reading.ingest import ingest_bytes

    settings, db = env
    data = data if data is not None else pydicom_data_file(name).read_bytes()
    return ingest_bytes(data, name, db=db, settings=settings, user=user)


def test_a_second_image_of_a_study_says_it_was_added_and_how_many_the_study_holds(env):
    from db import UserRepository

    settings, db = env
    rita = UserRepository(db).get_by_username("rita")
    first = _ingest(env, "RG1_UNCI.dcm", rita)
    second = _ingest(env, "RG1_UNCR.dcm", rita)  # the same study (StudyInstanceUID), another instance
    again = _ingest(env, "RG1_UNCR.dcm", rita)
    assert first.ok and not first.added and first.images == 1
    assert "added to study" not in first.summary()
    assert second.study_id == first.study_id and second.added and second.images == 2
    assert second.summary() == f"Stored **RG1\\_UNCR.dcm**: added to study {first.study_id} (now 2 images)"
    assert again.duplicate and again.summary() == (
        f"Stored **RG1\\_UNCR.dcm**: already stored in study {first.study_id} (now 2 images)"
    )
    refused = replace(first, ok=False, message="Not a DICOM or image file.")
    odd = replace(first, file="too_big<b>*x*</b>\x07.dcm")  # shown as uploaded, never as markup (was "too?big")
    assert odd.summary().startswith("Stored **too\\_big&lt;b&gt;\\*x\\*&lt;/b&gt;.dcm**")
    assert refused.summary() == "Refused **RG1\\_UNCI.dcm**: Not a DICOM or image file."


def test_views_hang_frontal_first_then_lateral_and_the_drafted_image_stays_first():
    from datetime import datetime

    from app.services.reading.studies import reading_views
    from db.records import ImageRecord, StudyOverview

    def image(i, view):
        return ImageRecord(
            i, 1, None, f"{i}.png", 8, 8, None, "dicom", [], {"ViewPosition": view}, datetime(2026, 1, 1)
        )

    overview = StudyOverview(
        study=None,
        images=(image(1, "LL"), image(2, ""), image(3, "PA")),  # type: ignore[arg-type]
        latest_draft=None,
        latest_correction=None,
    )
    assert [(v.image.id, v.label) for v in reading_views(overview)] == [(1, "Lateral"), (3, "PA"), (2, "Image 2")]
    overview = replace(overview, images=(image(3, "PA"), image(1, "LL"), image(2, "")))
    assert [v.label for v in reading_views(overview)] == ["PA", "Lateral", "Image 3"]


def test_priors_are_the_same_patients_other_studies_the_reader_may_open(env):
    from app.services.reading.studies import priors
    from db import StudyRepository, UserRepository

    settings, db = env
    users = UserRepository(db)
    rita, omar, boss = (users.get_by_username(n) for n in ("rita", "omar", "boss"))
    studies = StudyRepository(db)
    now = studies.create("uid-now", "PAT-7", uploaded_by=rita.id)
    earlier = studies.create("uid-earlier", "PAT-7", uploaded_by=rita.id)
    omars = studies.create("uid-omar", "PAT-7", uploaded_by=omar.id)  # the same patient, in omar's worklist
    studies.create("uid-other", "PAT-8", uploaded_by=rita.id)
    assert [o.study.id for o in priors(db, rita, now.id)] == [earlier.id]
    assert {o.study.id for o in priors(db, boss, now.id)} == {earlier.id, omars.id}
    assert priors(db, omar, omars.id) == []
