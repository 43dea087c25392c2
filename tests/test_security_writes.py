"""Writes that cannot land in the wrong place or twice.

Ownership is checked before ingest writes anything; simultaneous uploads of one file store one image; a change
and its audit entry (and a correction's pair) stand or fall together; the audit log cannot be rewritten by an
insert over an existing entry; the SQLite file and the data folder are private; one study that cannot be exported
does not sink a FHIR export. Database tests run on SQLite and, with ORAPO_TEST_POSTGRES_URL, on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pydicom
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from db import (
    AuditRepository,
    CorrectionRepository,
    Database,
    DraftRepository,
    PairRepository,
    StudyRepository,
    UserRepository,
)
from db.models import Image, Study
from db.repositories.studies import split_for
from orapo_core.config import Settings
from orapo_core.errors import OrapoError
from tests.support.dicom import pydicom_data_file

SECRET = "test-secret"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", deid_secret=SECRET)


@pytest.fixture
def people(database: Database):
    users = UserRepository(database)
    return SimpleNamespace(
        rita=users.create("rita", "rita-pass-1"),
        omar=users.create("omar", "omar-pass-1"),
        boss=users.create("boss", "boss-pass-1", role="admin"),
    )


def _stored_files(settings: Settings) -> list[str]:
    root = settings.storage_dir
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _count(database: Database, model) -> int:
    with database.session() as session:
        return session.scalar(sa.select(sa.func.count()).select_from(model))


def _same_study_other_instance(tmp_path: Path) -> bytes:
    """RG1_UNCI.dcm with a new SOPInstanceUID: another image of the very same StudyInstanceUID."""
    ds = pydicom.dcmread(pydicom_data_file("RG1_UNCI.dcm"))
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = pydicom.uid.generate_uid()
    out = tmp_path / "lateral.dcm"
    ds.save_as(out, enforce_file_format=True)
    return out.read_bytes()


# --- 1. ownership before any write ----------------------------------------------------------------------


def test_reused_study_uid_of_another_radiologist_is_refused_before_anything_is_written(
    database, people, settings, tmp_path
):
    from app.services.reading.ingest import ingest_bytes

    first = ingest_bytes(
        pydicom_data_file("RG1_UNCI.dcm").read_bytes(), "pa.dcm", db=database, settings=settings, user=people.rita
    )
    assert first.ok and not first.duplicate
    files, audit = _stored_files(settings), AuditRepository(database).query()
    intruder = _same_study_other_instance(tmp_path)
    for data in (intruder, pydicom_data_file("RG1_UNCI.dcm").read_bytes()):  # a new instance, and a copy of hers
        refused = ingest_bytes(data, "mine.dcm", db=database, settings=settings, user=people.omar)
        assert not refused.ok and refused.error == "forbidden" and refused.study_id is None, refused
        assert "another radiologist" in refused.message
    assert [i.id for i in StudyRepository(database).images(first.study_id)] == [first.image_id]
    assert _stored_files(settings) == files  # no file, not even a half-written one
    assert AuditRepository(database).query() == audit
    # Her own second view, and an administrator, still add to the study.
    assert (
        ingest_bytes(intruder, "lateral.dcm", db=database, settings=settings, user=people.rita).study_id
        == first.study_id
    )
    assert len(StudyRepository(database).images(first.study_id)) == 2


# --- 2. one image however many upload it at once ------------------------------------------------------


@pytest.mark.slow
def test_eight_simultaneous_uploads_of_one_file_store_one_image(database, people, settings, monkeypatch):
    import orapo_core.imaging
    from app.services.reading.ingest import ingest_bytes

    decode = orapo_core.imaging.ingest_bytes
    together = threading.Barrier(8)

    def decode_then_wait(*args, **kwargs):  # all eight arrive at the store together, each with its decoded file
        image = decode(*args, **kwargs)
        together.wait(timeout=120)
        return image

    monkeypatch.setattr(orapo_core.imaging, "ingest_bytes", decode_then_wait)
    data = pydicom_data_file("RG1_UNCI.dcm").read_bytes()
    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(
            pool.map(lambda i: ingest_bytes(data, "pa.dcm", db=database, settings=settings, user=people.rita), range(8))
        )
    assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok]
    assert sorted(o.duplicate for o in outcomes) == [False] + [True] * 7
    assert len({(o.study_id, o.image_id) for o in outcomes}) == 1
    assert (_count(database, Study), _count(database, Image)) == (1, 1)
    assert len(AuditRepository(database).query(action="study.ingest")) == 1
    stored = _stored_files(settings)
    assert [Path(p).suffix for p in stored] == [".dcm", ".png"]  # the winner's files, nothing half-written
    image = StudyRepository(database).get_image(outcomes[0].image_id)
    assert {image.dicom_path, image.display_path} == set(stored)


def test_the_database_refuses_a_second_row_for_one_instance(database, people):
    studies = StudyRepository(database)
    study = studies.create("study-uid", "ANON-1", uploaded_by=people.rita.id)
    studies.add_image(
        study.id, display_path="a.png", width=1, height=1, source_format="png", sop_instance_uid_hash="i1"
    )
    with pytest.raises(OrapoError) as again:
        studies.add_image(
            study.id, display_path="b.png", width=1, height=1, source_format="png", sop_instance_uid_hash="i1"
        )
    assert again.value.code == "image_exists"
    studies.add_image(
        study.id, display_path="c.png", width=1, height=1, source_format="png", sop_instance_uid_hash="i2"
    )
    assert len(studies.images(study.id)) == 2


def test_migration_keeps_old_duplicates_and_fills_the_instance(blank_database):
    """Rows from before 0002: the oldest of each (study, instance) gets the UID, a duplicate keeps NULL (a pair names
    it, so it is not deleted), and the way back to 0001 works with them in place."""
    db = blank_database
    db.upgrade("0001")
    now = {"now": "2026-01-01 00:00:00"}
    with db.engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO studies (study_uid_hash, patient_pseudonym, status, split, created_at) "
                "VALUES ('study-uid', 'ANON-1', 'new', 'train', :now)"
            ),
            now,
        )
        study_id = c.execute(sa.text("SELECT id FROM studies")).scalar()
        for name, header in (("first", {"SOPInstanceUID": "i1"}), ("copy", {"SOPInstanceUID": "i1"}), ("bare", {})):
            c.execute(
                sa.text(
                    "INSERT INTO images (study_id, display_path, width, height, source_format, warnings, "
                    "header, created_at) VALUES (:s, :p, 1, 1, 'png', '[]', :h, :now)"
                ),
                {"s": study_id, "p": name, "h": json.dumps(header), **now},
            )
        copy_id = c.execute(sa.text("SELECT id FROM images WHERE display_path = 'copy'")).scalar()
        c.execute(
            sa.text(
                "INSERT INTO preference_pairs (study_id, image_id, prompt, chosen, rejected, source, "
                "created_at) VALUES (:s, :i, 'p', 'a', 'b', 'clinician_edit', :now)"
            ),
            {"s": study_id, "i": copy_id, **now},
        )
    db.upgrade()
    with db.engine.connect() as c:
        rows = c.execute(sa.text("SELECT display_path, sop_instance_uid_hash FROM images ORDER BY id")).all()
    assert [tuple(r) for r in rows] == [("first", "i1"), ("copy", None), ("bare", "study-uid")]
    with pytest.raises(OrapoError) as again:
        StudyRepository(db).add_image(
            study_id, display_path="again", width=1, height=1, source_format="png", sop_instance_uid_hash="i1"
        )
    assert again.value.code == "image_exists"
    db.downgrade("0001")
    with db.engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM images")).scalar() == 3
    db.upgrade()
    assert db.is_up_to_date()


# --- 3. a change and its audit entry stand or fall together --------------------------------------------


def _fail(*args, **kwargs):
    raise RuntimeError("injected fault")


def _train_study_with_draft(database: Database, user):
    uid = next(f"uid-{i}" for i in range(100) if split_for(f"uid-{i}") == "train")
    study = StudyRepository(database).create(uid, "ANON-1", uploaded_by=user.id)
    draft = DraftRepository(database).create(
        study.id,
        model_name="tiny",
        prompt="Describe.",
        text="There is a small right pleural effusion. No pneumothorax.",
    )
    return study, draft


@pytest.mark.parametrize("fault", ["pair", "audit"])
def test_a_correction_its_pair_and_its_audit_entry_are_one_transaction(database, people, monkeypatch, fault):
    from app.services.reading import reports

    study, draft = _train_study_with_draft(database, people.rita)
    before = AuditRepository(database).query()
    target = (PairRepository, "add") if fault == "pair" else (AuditRepository, "append")
    with monkeypatch.context() as patch:
        patch.setattr(*target, _fail)
        with pytest.raises(RuntimeError, match="injected fault"):
            reports.save_report(database, people.rita, study.id, draft.id, "Large right pleural effusion.", sign=True)
    assert CorrectionRepository(database).history(study.id) == []
    assert PairRepository(database).count() == 0
    assert AuditRepository(database).query() == before
    assert StudyRepository(database).get(study.id).status == "drafted"
    # Without the fault, all three are stored.
    record = reports.save_report(database, people.rita, study.id, draft.id, "Large right pleural effusion.", sign=True)
    assert record.signed_at is not None and PairRepository(database).count() == 1
    assert {e.action for e in AuditRepository(database).query(action="correction.")} == {
        "correction.create",
        "correction.sign",
    }


def test_signing_a_saved_report_and_its_audit_entry_are_one_transaction(database, people, monkeypatch):
    from app.services.reading import reports

    study, draft = _train_study_with_draft(database, people.rita)
    saved = reports.save_report(database, people.rita, study.id, draft.id, "Small effusion.", sign=False)
    with monkeypatch.context() as patch:
        patch.setattr(AuditRepository, "append", _fail)
        with pytest.raises(RuntimeError, match="injected fault"):
            reports.save_report(database, people.rita, study.id, draft.id, "Small effusion.", sign=True)
    assert CorrectionRepository(database).get(saved.id).signed_at is None
    assert StudyRepository(database).get(study.id).status == "corrected"


def test_a_draft_and_its_audit_entry_are_one_transaction(database, people, settings, monkeypatch):
    from app.services.reading import drafting
    from app.services.reading.ingest import ingest_bytes

    outcome = ingest_bytes(
        pydicom_data_file("RG1_UNCI.dcm").read_bytes(), "pa.dcm", db=database, settings=settings, user=people.rita
    )
    made = SimpleNamespace(
        model_name="stub",
        prompt="Describe.",
        text="No acute findings.",
        sampling={},
        prompt_version="v1",
        flagged=[],
        sentences=[],
        latency_ms=5,
    )
    served = SimpleNamespace(name="stub-v1", version_id=None)
    registry = SimpleNamespace(
        served=lambda: served, batcher=lambda s: SimpleNamespace(draft=lambda pixels, samples: made)
    )
    with monkeypatch.context() as patch:
        patch.setattr(AuditRepository, "append", _fail)
        with pytest.raises(RuntimeError, match="injected fault"):
            drafting.draft_study(database, settings, registry, people.rita, outcome.study_id, samples=0)
    assert DraftRepository(database).for_study(outcome.study_id) == []
    assert StudyRepository(database).get(outcome.study_id).status == "new"
    assert AuditRepository(database).query(action="draft.create") == []
    record = drafting.draft_study(database, settings, registry, people.rita, outcome.study_id, samples=0)
    assert [e.details["draft_id"] for e in AuditRepository(database).query(action="draft.create")] == [record.id]


def test_a_study_its_image_its_files_and_its_audit_entry_are_one_transaction(database, people, settings, monkeypatch):
    from app.services.reading.ingest import ingest_bytes

    data = pydicom_data_file("RG1_UNCI.dcm").read_bytes()
    audit = AuditRepository(database).query()
    with monkeypatch.context() as patch:
        patch.setattr(AuditRepository, "append", _fail)
        with pytest.raises(RuntimeError, match="injected fault"):
            ingest_bytes(data, "pa.dcm", db=database, settings=settings, user=people.rita)
    assert (_count(database, Study), _count(database, Image)) == (0, 0)
    assert AuditRepository(database).query() == audit
    assert _stored_files(settings) == []
    outcome = ingest_bytes(data, "pa.dcm", db=database, settings=settings, user=people.rita)
    assert outcome.ok and not outcome.duplicate and len(_stored_files(settings)) == 2


# --- 4. the audit log cannot be rewritten ---------------------------------------------------------------


def test_audit_log_refuses_an_insert_over_an_existing_entry(database):
    audit = AuditRepository(database)
    audit.append("user.create", actor="cli", object_type="user", object_id=1)
    original = audit.query()
    entry_id = original[0].id
    values = "(:id, 'mallory', 'forged', '{}', '2026-01-01 00:00:00')"
    columns = "audit_log (id, actor_name, action, details, created_at)"
    upsert = f"INSERT INTO {columns} VALUES {values} ON CONFLICT (id) DO UPDATE SET action = excluded.action"
    if database.is_sqlite:
        attempts = [
            f"INSERT OR REPLACE INTO {columns} VALUES {values}",
            f"REPLACE INTO {columns} VALUES {values}",
            upsert,
        ]
    else:
        attempts = [upsert, "TRUNCATE audit_log"]
    for statement in attempts:
        with pytest.raises(DBAPIError, match="append-only"):
            with database.engine.begin() as connection:
                connection.execute(sa.text(statement), {"id": entry_id})
    assert audit.query() == original
    audit.append("user.disable", actor="cli")  # appending still works
    assert [e.action for e in audit.query()] == ["user.disable", "user.create"]


# --- 5. the data folder and the database file are private ------------------------------------------------


def test_data_folder_database_and_secret_are_private(tmp_path, monkeypatch):
    from app.runtime import open_database

    for name in ("ORAPO_DATABASE_URL", "ORAPO_DEID_SECRET"):
        monkeypatch.delenv(name, raising=False)
    old = os.umask(0o022)  # the usual umask, which made them world-readable
    try:
        settings = Settings(data_dir=tmp_path / "fresh" / "data")
        db = open_database(settings)
        AuditRepository(db).append("test.ping", actor="cli")
        secret = settings.secret()
    finally:
        os.umask(old)
    data = settings.resolved_data_dir

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(data) == 0o700
    assert mode(data / "orapo.sqlite3") == 0o600
    assert (data / "orapo.sqlite3-wal").exists() and mode(data / "orapo.sqlite3-wal") == 0o600
    assert mode(data / ".deid_secret") == 0o600 and len(secret) == 64
    assert Settings(data_dir=data).secret() == secret  # kept, not regenerated
    assert not [p for p in data.iterdir() if p.name.startswith(".deid_secret-")]
    db.dispose()


# --- 6. one study that cannot be exported does not sink the export -------------------------------------


def _reported_studies(db: Database, user):
    """A signed study (with its draft), and one with only an unsigned report: no draft, nothing final."""
    studies, drafts, corrections = StudyRepository(db), DraftRepository(db), CorrectionRepository(db)
    good = studies.create("good-uid", "ANON-G", uploaded_by=user.id)
    draft = drafts.create(good.id, model_name="starter", prompt="p", text="Findings: Clear.\nImpression: Normal.")
    corrections.create(
        good.id, author_id=user.id, text="Findings: Clear.\nImpression: Normal.", draft_id=draft.id, signed=True
    )
    bad = studies.create("bad-uid", "ANON-B", uploaded_by=user.id)
    corrections.create(bad.id, author_id=user.id, text="Findings: Pending.", signed=False)
    return good, bad


def test_fhir_export_skips_a_study_it_cannot_export_and_says_why(data_dir, tmp_path, capsys):
    from app.cli import main
    from app.runtime import open_database
    from app.services.operations.export_downloads import download_fhir
    from app.services.operations.export_fhir import export_fhir

    settings = Settings()
    db = open_database(settings)
    rita = UserRepository(db).create("rita", "rita-pass-1")
    boss = UserRepository(db).create("boss", "boss-pass-1", role="admin")
    good, bad = _reported_studies(db, rita)

    result = export_fhir(db, tmp_path / "service")
    assert [p.name for p in result.written] == [f"study-{good.id}.json"]
    assert [(s.study_id, s.error) for s in result.skipped] == [(bad.id, "no_reports")]
    assert json.loads((tmp_path / "service" / "skipped.json").read_text())[0]["study_id"] == bad.id
    assert f"study {bad.id}: no_reports" in str(result)

    assert main(["export", "fhir", "--all", str(tmp_path / "cli")]) == 0
    out = capsys.readouterr().out
    assert "1 FHIR bundle(s) written" in out and f"study {bad.id}: no_reports" in out

    download = download_fhir(db, settings, boss)
    assert download.bundles == 1 and [s.study_id for s in download.skipped] == [bad.id]
    with zipfile.ZipFile(download.archive) as archive:
        names = set(archive.namelist())
        assert f"fhir/study-{good.id}.json" in names
        assert json.loads(archive.read("fhir/skipped.json"))[0]["error"] == "no_reports"
    assert AuditRepository(db).query(action="export.fhir")[0].details["skipped"] == {str(bad.id): "no_reports"}

    # Asked for that one study alone, its own reason is the error; asked for none exportable, nothing is written.
    with pytest.raises(OrapoError) as alone:
        export_fhir(db, tmp_path / "alone", study_ids=[bad.id])
    assert alone.value.code == "no_reports" and not (tmp_path / "alone").exists()
    with pytest.raises(OrapoError) as none:
        export_fhir(db, tmp_path / "none", study_ids=[bad.id, 999_999])
    assert none.value.code == "nothing_to_export" and not (tmp_path / "none").exists()
