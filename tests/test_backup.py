"""`orapo backup OUT` and `orapo restore IN`: a data folder in, the same data out in a fresh folder, checked.

The commands run as a user runs them (`app.cli.main`, its exit status and its `code: sentence` lines). A
backup taken while eight writers save corrections holds every save acknowledged before it started; the
refusals leave both sides as they were. With ORAPO_TEST_POSTGRES_URL the round trip also runs through
`pg_dump` and `pg_restore`, between two new databases on that server.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from tests.support.app import USERS, make_env, phantom_png
from tests.support.databases import BACKEND_PARAMS, POSTGRES_URL


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORAPO_DATA_DIR", "ORAPO_DATABASE_URL", "ORAPO_DEID_SECRET"):
        monkeypatch.delenv(name, raising=False)


def _seed(root: Path, url: str | None = None) -> tuple[Path, dict]:
    """A data folder with the three users, three ingested studies, drafts, a signed and amended report, a model
    version with its folder, and the de-identification secret in its file (the default); and what it holds."""
    from app.services.reading.ingest import ingest_paths
    from db import CorrectionRepository, DraftRepository, ModelVersionRepository, UserRepository
    from orapo_core.config import Settings

    settings, db = make_env(root)
    settings = Settings(data_dir=settings.data_dir)  # no configured secret: it is made and kept in the data folder
    settings.secret()
    pngs = root / "pngs"
    pngs.mkdir()
    for seed in range(3):
        phantom_png(pngs / f"study-{seed}.png", seed, size=64)
    studies = [o.study_id for o in ingest_paths([pngs], db=db, settings=settings)]
    assert len(studies) == 3 and all(studies)
    rita = UserRepository(db).get_by_username("rita")
    drafts, corrections = DraftRepository(db), CorrectionRepository(db)
    d1 = drafts.create(studies[0], model_name="starter", prompt="Findings:", text="No acute findings.")
    drafts.create(studies[1], model_name="starter", prompt="Findings:", text="Small left effusion.")
    first = corrections.create(studies[0], author_id=rita.id, text="No acute findings.", draft_id=d1.id, signed=True)
    corrections.amend(first.id, author_id=rita.id, text="No acute findings. Heart size normal.", signed=True)
    corrections.create(studies[1], author_id=rita.id, text="Small left pleural effusion.")
    for folder, body in (("starter", b"base weights"), ("versions/round-1", b"adapter weights")):
        (settings.models_dir / folder).mkdir(parents=True)
        (settings.models_dir / folder / "model.safetensors").write_bytes(body * 1000)
        (settings.models_dir / folder / "config.json").write_text('{"model_type": "orapo"}')
    ModelVersionRepository(db).create(
        "round-1", base_model_path="models/starter", adapter_path="models/versions/round-1"
    )
    expected = _contents(settings.resolved_data_dir, url)
    db.dispose()
    return settings.resolved_data_dir, expected


def _contents(data: Path, url: str | None = None) -> dict:
    """What a data folder holds, to compare: rows of the tables that matter, every image and model file, the secret."""
    import sqlalchemy as sa

    from db.database import sqlite_url

    engine = sa.create_engine(url or sqlite_url(data))
    try:
        with engine.connect() as c:
            rows = {
                "users": c.execute(sa.text("SELECT id, username, role, password_hash FROM users ORDER BY id")).all(),
                "studies": c.execute(
                    sa.text("SELECT id, study_uid_hash, patient_pseudonym, status FROM studies ORDER BY id")
                ).all(),
                "images": c.execute(
                    sa.text("SELECT id, study_id, dicom_path, display_path FROM images ORDER BY id")
                ).all(),
                "drafts": c.execute(sa.text("SELECT id, study_id, text FROM drafts ORDER BY id")).all(),
                "corrections": c.execute(
                    sa.text(
                        "SELECT id, study_id, version, text, signed_at IS NOT NULL, previous_id "
                        "FROM corrections ORDER BY id"
                    )
                ).all(),
                "versions": c.execute(
                    sa.text("SELECT id, name, base_model_path, adapter_path FROM model_versions")
                ).all(),
            }
    finally:
        engine.dispose()
    files = {
        p.relative_to(data).as_posix(): p.read_bytes()
        for folder in ("images", "models")
        for p in sorted((data / folder).rglob("*"))
        if p.is_file()
    }
    secret = (data / ".deid_secret").read_text() if (data / ".deid_secret").exists() else None
    return {"rows": {k: [tuple(r) for r in v] for k, v in rows.items()}, "files": files, "secret": secret}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _restored_check(data: Path, url: str | None = None) -> list[str]:
    from app.services.operations.restore import check_integrity
    from app.settings import WebSettings
    from db import Database

    settings = WebSettings(data_dir=data, database_url=url)
    database = Database.from_settings(settings)
    try:
        return check_integrity(database, settings)
    finally:
        database.dispose()


def test_a_backup_restored_into_a_fresh_folder_holds_the_same_data_and_passes_the_check(tmp_path: Path, capsys) -> None:
    data, before = _seed(tmp_path / "site")
    out = tmp_path / "backups" / "nightly"

    code, printed, warned = _run(capsys, "backup", str(out), "--data-dir", str(data))
    assert code == 0, warned
    assert "users 3, studies 3, images 3, drafts 2, corrections 3, model versions 1" in printed
    assert "warning: the backup holds the de-identification secret" in warned
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["database"] == {
        "kind": "sqlite",
        "file": "orapo.sqlite3",
        "revision": manifest["database"]["revision"],
    }
    assert manifest["database"]["revision"] and manifest["secret"] == {"file": "deid_secret", "source": "file"}
    assert set(manifest["files"]) == {"orapo.sqlite3", "deid_secret"} | set(before["files"])
    for path in [out, *out.rglob("*")]:  # kept like the data folder: folders 0700, files 0600
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    assert not [p for p in out.parent.iterdir() if p != out]  # no partial folder left behind

    fresh = tmp_path / "elsewhere" / "data"
    code, printed, warned = _run(capsys, "restore", str(out), "--data-dir", str(fresh))
    assert code == 0, warned
    assert "The integrity check passed." in printed and "corrections 3," in printed

    after = _contents(fresh)
    assert after == before  # rows, texts, image and model files, the secret: all the same
    assert stat.S_IMODE((fresh / ".deid_secret").stat().st_mode) == 0o600
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert _restored_check(fresh) == []

    from db import AuditRepository, Database, UserRepository

    database = Database(f"sqlite:///{fresh / 'orapo.sqlite3'}")
    try:  # the restored folder is the app's: passwords work, and the restore is in its audit log
        assert (
            UserRepository(database).authenticate("rita", dict((n, p) for n, p, _ in USERS)["rita"]).username == "rita"
        )
        assert [e.action for e in AuditRepository(database).query(action="data.")] == ["data.restore"]
    finally:
        database.dispose()
    source = Database(f"sqlite:///{data / 'orapo.sqlite3'}")
    try:  # and the backup is in the source's
        assert [e.action for e in AuditRepository(source).query(action="data.")] == ["data.backup"]
    finally:
        source.dispose()


@pytest.fixture(scope="module")
def one_backup(tmp_path_factory) -> Path:
    """A backup of a seeded data folder, for the refusals (copied before one is changed)."""
    root = tmp_path_factory.mktemp("refusals")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("ORAPO_DATA_DIR", "ORAPO_DATABASE_URL", "ORAPO_DEID_SECRET"):
            mp.delenv(name, raising=False)
        data, _ = _seed(root / "site")
        assert main(["backup", str(root / "backup"), "--data-dir", str(data)]) == 0
    return root / "backup"


def _copy(backup: Path, to: Path) -> Path:
    import shutil

    return Path(shutil.copytree(backup, to))


def test_backup_refuses_a_folder_that_is_not_empty_and_touches_nothing(
    one_backup: Path, tmp_path: Path, capsys
) -> None:
    data = one_backup.parent / "site" / "data"
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = _run(capsys, "backup", str(out), "--data-dir", str(data))
    assert code == 2 and err.startswith("backup_exists: ") and "Traceback" not in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and [p.name for p in tmp_path.iterdir()] == ["out"]
    code, _, err = _run(capsys, "backup", str(data / "images" / "copy"), "--data-dir", str(data))
    assert code == 2 and err.startswith("backup_exists: ") and not (data / "images" / "copy").exists()


def test_restore_refuses_a_data_folder_that_is_not_empty(one_backup: Path, tmp_path: Path, capsys) -> None:
    target = tmp_path / "data"
    target.mkdir()
    (target / "orapo.sqlite3").write_bytes(b"")  # what `orapo db upgrade` would have made: a database
    code, _, err = _run(capsys, "restore", str(one_backup), "--data-dir", str(target))
    assert code == 2 and err.startswith("restore_not_empty: ")
    assert [p.name for p in target.iterdir()] == ["orapo.sqlite3"] and (target / "orapo.sqlite3").read_bytes() == b""


def test_restore_refuses_a_tampered_backup_before_writing_anything(one_backup: Path, tmp_path: Path, capsys) -> None:
    backup = _copy(one_backup, tmp_path / "backup")
    image = next(p for p in sorted((backup / "images").rglob("*.png")))
    image.write_bytes(image.read_bytes()[:-1] + bytes([image.read_bytes()[-1] ^ 1]))  # one bit, same size
    code, _, err = _run(capsys, "restore", str(backup), "--data-dir", str(tmp_path / "data"))
    assert code == 2 and err.startswith("backup_damaged: ") and image.name in err
    assert not (tmp_path / "data").exists()

    image.unlink()
    code, _, err = _run(capsys, "restore", str(backup), "--data-dir", str(tmp_path / "data"))
    assert code == 2 and err.startswith("backup_damaged: ") and not (tmp_path / "data").exists()


@pytest.mark.parametrize("change", ["missing", "not json", "outside", "newer revision"])
def test_restore_refuses_a_manifest_it_cannot_trust(one_backup: Path, tmp_path: Path, capsys, change: str) -> None:
    backup = _copy(one_backup, tmp_path / "backup")
    manifest_path = backup / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if change == "missing":
        manifest_path.unlink()
    elif change == "not json":
        manifest_path.write_text("{")
    elif change == "outside":  # a crafted manifest must not write outside the data folder
        manifest["files"]["images/../../escaped"] = manifest["files"].pop("deid_secret")
        manifest_path.write_text(json.dumps(manifest))
    else:
        manifest["database"]["revision"] = "9999_from_the_future"
        manifest_path.write_text(json.dumps(manifest))
    code, _, err = _run(capsys, "restore", str(backup), "--data-dir", str(tmp_path / "data"))
    wanted = "backup_newer" if change == "newer revision" else "backup_invalid"
    assert code == 2 and err.startswith(f"{wanted}: "), err
    assert not (tmp_path / "data").exists() and not (tmp_path / "escaped").exists()


def test_restore_refuses_another_configured_secret_or_another_database_kind(
    one_backup: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORAPO_DEID_SECRET", "not-the-backups-secret")
    code, _, err = _run(capsys, "restore", str(one_backup), "--data-dir", str(tmp_path / "data"))
    assert code == 2 and err.startswith("restore_secret_mismatch: ")
    monkeypatch.setenv("ORAPO_DEID_SECRET", (one_backup / "deid_secret").read_text())
    monkeypatch.setenv("ORAPO_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    code, _, err = _run(capsys, "restore", str(one_backup), "--data-dir", str(tmp_path / "data"))
    assert code == 2 and err.startswith("backup_database_mismatch: ")
    assert not (tmp_path / "data").exists()


def test_a_restore_whose_images_went_missing_fails_the_integrity_check(
    one_backup: Path, tmp_path: Path, capsys
) -> None:
    """The check is real: a backup whose manifest (consistently) lacks an image's file restores, then says so."""
    backup = _copy(one_backup, tmp_path / "backup")
    manifest = json.loads((backup / "manifest.json").read_text())
    gone = next(name for name in sorted(manifest["files"]) if name.endswith(".dcm"))
    del manifest["files"][gone]
    (backup / gone).unlink()
    (backup / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = _run(capsys, "restore", str(backup), "--data-dir", str(tmp_path / "data"))
    assert (
        code == 2 and err.startswith("integrity_failed: ") and "1 image files named by the database are missing" in err
    )
    assert (tmp_path / "data" / "orapo.sqlite3").exists()  # what was restored stays, for a person to look at


def test_a_backup_of_a_folder_missing_an_image_file_says_so_and_its_restore_fails_the_check(
    one_backup: Path, tmp_path: Path, capsys
) -> None:
    import shutil

    data = Path(shutil.copytree(one_backup.parent / "site" / "data", tmp_path / "data"))
    lost = next(p for p in sorted((data / "images").rglob("*.png")))
    lost.unlink()
    code, printed, warned = _run(capsys, "backup", str(tmp_path / "backup"), "--data-dir", str(data))
    assert code == 1 and "warning: 1 image files named by the database are missing" in warned
    assert json.loads((tmp_path / "backup" / "manifest.json").read_text())["problems"]
    code, _, err = _run(capsys, "restore", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "restored"))
    assert code == 2 and err.startswith("integrity_failed: ") and "the backup itself was made with these" in err


WRITERS = 8


@pytest.mark.slow
def test_a_backup_taken_while_8_clients_save_holds_every_save_acknowledged_before_it_started(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, site_urls: list[str | None]
) -> None:
    from db import CorrectionRepository, StudyRepository, UserRepository

    _use(monkeypatch, site_urls[0])
    monkeypatch.setenv("ORAPO_DEID_SECRET", "test-secret")  # make_env's secret, configured: the backup carries it
    settings, db = make_env(tmp_path / "site")
    pngs = tmp_path / "pngs"
    pngs.mkdir()
    from app.services.reading.ingest import ingest_paths

    for seed in range(2):
        phantom_png(pngs / f"study-{seed}.png", seed, size=96)
    assert all(o.ok for o in ingest_paths([pngs], db=db, settings=settings))
    # Enough model bytes that the backup takes a while, so that saves go on while it runs.
    (settings.models_dir / "starter").mkdir(parents=True)
    (settings.models_dir / "starter" / "model.safetensors").write_bytes(os.urandom(48 << 20))
    rita = UserRepository(db).get_by_username("rita")
    studies = [StudyRepository(db).create(f"uid-{i}", f"ANON-{i}", uploaded_by=rita.id).id for i in range(WRITERS)]

    started, stop = threading.Event(), threading.Event()
    before: list[list[tuple[int, str]]] = [[] for _ in range(WRITERS)]  # (id, text) acknowledged before the backup
    during: list[int] = [0] * WRITERS
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        corrections, latest, k = CorrectionRepository(db), None, 0
        try:
            while not stop.is_set():
                k += 1
                text = f"writer {n}, save {k}"
                if latest is None:
                    latest = corrections.create(studies[n], author_id=rita.id, text=text).id
                else:
                    latest = corrections.amend(latest, author_id=rita.id, text=text).id
                # Acknowledged: `create`/`amend` returned, so the save committed. Before the backup started when
                # the event, set just before `orapo backup` was called, was not set yet.
                if not started.is_set():
                    before[n].append((latest, text))
                else:
                    during[n] += 1
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(WRITERS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while min(len(b) for b in before) < 3 and time.monotonic() < deadline and not failures:
        time.sleep(0.01)
    out = tmp_path / "backup"
    started.set()
    began = time.monotonic()
    code, printed, warned = _run(capsys, "backup", str(out), "--data-dir", str(settings.resolved_data_dir))
    took = time.monotonic() - began
    stop.set()
    for t in threads:
        t.join(30)
    db.dispose()
    assert not failures, failures
    assert code == 0, warned
    acknowledged = {i: text for b in before for i, text in b}
    assert len(acknowledged) >= 3 * WRITERS and sum(during) > 0, (len(acknowledged), during, took)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["secret"] == {"file": "deid_secret", "source": "setting"}

    _use(monkeypatch, site_urls[1])
    fresh = tmp_path / "restored"
    code, printed, warned = _run(capsys, "restore", str(out), "--data-dir", str(fresh))
    assert code == 0, warned
    assert "The integrity check passed." in printed
    assert _restored_check(fresh, site_urls[1]) == []
    restored = {row[0]: row[3] for row in _contents(fresh, site_urls[1])["rows"]["corrections"]}
    missing = sorted(set(acknowledged) - set(restored))
    assert not missing, f"{len(missing)} saves acknowledged before the backup started are not in it: {missing[:10]}"
    assert all(restored[i] == text for i, text in acknowledged.items())
    assert manifest["counts"]["corrections"] == len(restored) >= len(acknowledged)
    assert (fresh / ".deid_secret").read_text() == "test-secret"


@contextlib.contextmanager
def _new_postgres_databases(n: int):
    """URLs of `n` new, empty databases on ORAPO_TEST_POSTGRES_URL's server, dropped afterwards (its user may
    create databases, as .ci/postgres.sh's does)."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    names = [f"orapo_backup_{uuid.uuid4().hex[:12]}" for _ in range(n)]
    try:
        with admin.connect() as c:
            for name in names:
                c.execute(sa.text(f'CREATE DATABASE "{name}"'))
        yield [make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False) for name in names]
    finally:
        with admin.connect() as c:
            for name in names:
                c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=BACKEND_PARAMS)
def site_urls(request: pytest.FixtureRequest) -> Iterator[list[str | None]]:
    """(the data folder's database, the database to restore into): None for SQLite in the data folder, else two
    new PostgreSQL databases."""
    if request.param == "sqlite":
        yield [None, None]
        return
    with _new_postgres_databases(2) as urls:
        yield urls


def _use(monkeypatch: pytest.MonkeyPatch, url: str | None) -> None:
    if url:
        monkeypatch.setenv("ORAPO_DATABASE_URL", url)
    else:
        monkeypatch.delenv("ORAPO_DATABASE_URL", raising=False)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.skipif(
    not POSTGRES_URL,
    reason="the PostgreSQL round trip needs a server: set ORAPO_TEST_POSTGRES_URL (.ci/postgres.sh starts one)",
)
def test_a_postgresql_backup_restores_into_a_new_database(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _new_postgres_databases(2) as urls:
        monkeypatch.setenv("ORAPO_DATABASE_URL", urls[0])
        data, before = _seed(tmp_path / "site", urls[0])  # make_env's database is ORAPO_DATABASE_URL's
        out = tmp_path / "backup"
        code, printed, warned = _run(capsys, "backup", str(out), "--data-dir", str(data))
        assert code == 0, warned
        assert json.loads((out / "manifest.json").read_text())["database"]["file"] == "orapo.pgdump"
        assert stat.S_IMODE((out / "orapo.pgdump").stat().st_mode) == 0o600

        monkeypatch.setenv("ORAPO_DATABASE_URL", urls[1])
        fresh = tmp_path / "restored"
        code, printed, warned = _run(capsys, "restore", str(out), "--data-dir", str(fresh))
        assert code == 0, warned
        assert _contents(fresh, urls[1]) == before
        assert _restored_check(fresh, urls[1]) == []
        code, _, err = _run(capsys, "restore", str(out), "--data-dir", str(tmp_path / "again"))
        assert code == 2 and err.startswith("restore_not_empty: ")  # the database has tables now
