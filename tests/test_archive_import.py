"""The Worklist's "From the archive" service: without an archive it says so; with the test Orthanc, a reader's
search lists what is there and what is already imported, and an import reports each study's outcome (imported,
already there, refused and why) without raising for a refusal."""

from __future__ import annotations

import io

import pydicom
import pytest

from orapo_core.errors import OrapoError
from tests.support.orthanc import phantom_dicoms


def test_without_an_archive_the_view_says_how_to_get_one() -> None:
    from app.services.archive.archive_import import NO_ARCHIVE, archive_note

    assert archive_note({}) == NO_ARCHIVE and "ORAPO_DICOMWEB_URL" in NO_ARCHIVE
    assert archive_note({"ORAPO_DICOMWEB_URL": "http://pacs/dicom-web"}) is None
    assert "wrong" in archive_note({"ORAPO_DICOMWEB_URL": "dicom://pacs:104"})


def test_an_import_outcome_reads_as_a_sentence() -> None:
    from app.services.archive.archive_import import StudyImport

    assert StudyImport("1.2", (4,), stored=1).line == "imported as study 4 (1 image(s))"
    assert StudyImport("1.2", (4,), duplicates=1).line == "already imported as study 4"
    refused = StudyImport("1.3", refusals=(("archive_study_not_found", "No such study."),)).line
    assert refused == "nothing imported; refused: archive_study_not_found: No such study."


@pytest.fixture
def archived(orthanc, data_dir, monkeypatch, tmp_path):
    """Two phantom studies in the test archive, the app's database with a radiologist."""
    from app.runtime import open_database
    from db import UserRepository
    from orapo_core.config import Settings

    monkeypatch.setenv("ORAPO_DICOMWEB_URL", orthanc.dicomweb_url)
    monkeypatch.setenv("ORAPO_DICOMWEB_USER", orthanc.user)
    monkeypatch.setenv("ORAPO_DICOMWEB_PASSWORD", orthanc.password)
    settings = Settings()
    db = open_database(settings)
    rita = UserRepository(db).create("rita", "rita-pass-1")
    studies = []
    for data, who in phantom_dicoms(tmp_path / "phantoms", 2, seed=6161):
        orthanc.upload(data)
        studies.append((str(pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).StudyInstanceUID), who))
    yield type("Archived", (), dict(db=db, settings=settings, rita=rita, studies=studies))
    for uid, _ in studies:
        orthanc.delete_study(uid)


@pytest.mark.slow
def test_a_reader_searches_imports_and_sees_what_was_refused(archived) -> None:
    from app.services.archive import archive_import
    from db import StudyRepository

    (first, first_who), (second, _) = archived.studies
    found = {s.study_uid: s for s in archive_import.search(archived.db, archived.settings, archived.rita)}
    assert {first, second} <= set(found) and found[first].imported_study_id is None
    only = archive_import.search(
        archived.db, archived.settings, archived.rita, accession=first_who["AccessionNumber"], modalities=["CR"]
    )
    assert [s.study_uid for s in only] == [first]

    missing = "1.2.826.0.1.3680043.8.498.1"
    done, refused = archive_import.import_studies(archived.db, archived.settings, archived.rita, [first, missing])
    (study_id,) = done.study_ids
    assert done.stored == 1 and not done.refusals and done.line.startswith(f"imported as study {study_id}")
    assert refused.refusals[0][0] == "archive_study_not_found" and not refused.study_ids
    assert StudyRepository(archived.db).overview(study_id).study.uploaded_by == archived.rita.id
    again = {s.study_uid: s for s in archive_import.search(archived.db, archived.settings, archived.rita)}
    assert again[first].imported_study_id == study_id and again[second].imported_study_id is None
    (repeat,) = archive_import.import_studies(archived.db, archived.settings, archived.rita, [first])
    assert repeat.line == f"already imported as study {study_id}"
    with pytest.raises(OrapoError) as exc:
        archive_import.import_studies(archived.db, archived.settings, archived.rita, [])
    assert exc.value.code == "no_study"
