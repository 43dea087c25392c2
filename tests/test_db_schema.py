"""The schema: migrations from empty, migrations match the models, SQLite pragmas, append-only audit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.exc import DBAPIError

from db.database import Database
from db.models import Base
from db.repositories import AuditRepository

EXPECTED_TABLES = {
    "users",
    "studies",
    "images",
    "drafts",
    "corrections",
    "preference_pairs",
    "training_rounds",
    "model_versions",
    "schedule_settings",
    "audit_log",
}


def _diff(database: Database, metadata: sa.MetaData) -> list:
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, metadata)


def test_migrations_build_the_schema_from_empty(blank_database: Database) -> None:
    assert blank_database.current_revision() is None
    assert not set(sa.inspect(blank_database.engine).get_table_names()) & EXPECTED_TABLES
    blank_database.upgrade()
    assert blank_database.current_revision() == blank_database.head_revision() is not None
    assert blank_database.is_up_to_date()
    assert EXPECTED_TABLES <= set(sa.inspect(blank_database.engine).get_table_names())
    blank_database.upgrade()  # idempotent
    assert blank_database.is_up_to_date()


def test_downgrade_to_base_and_back(database: Database) -> None:
    database.downgrade("base")
    assert not set(sa.inspect(database.engine).get_table_names()) & EXPECTED_TABLES
    database.upgrade()
    assert EXPECTED_TABLES <= set(sa.inspect(database.engine).get_table_names())


def test_migrations_at_head_match_the_models(database: Database) -> None:
    """Autogenerate finds nothing to do: whoever changes a model also writes its migration."""
    assert _diff(database, Base.metadata) == []


def test_the_no_diff_check_notices_a_missing_migration(database: Database) -> None:
    metadata = sa.MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(metadata)
    metadata.tables["studies"].append_column(sa.Column("forgotten", sa.String(20), nullable=True))
    sa.Table("unmigrated", metadata, sa.Column("id", sa.Integer, primary_key=True))
    diff = _diff(database, metadata)
    kinds = {d[0] if isinstance(d, tuple) else d[0][0] for d in diff}
    assert {"add_column", "add_table"} <= kinds, diff


def test_sqlite_file_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'nested' / 'orapo.sqlite3'}")
    try:
        database.upgrade()
        with database.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
        assert (tmp_path / "nested" / "orapo.sqlite3-wal").exists()
        with pytest.raises(sa.exc.IntegrityError):  # foreign keys are enforced, not just declared
            with database.engine.begin() as connection:
                connection.execute(
                    sa.text(
                        "INSERT INTO images (study_id, display_path, width, height, source_format, warnings, header, created_at) "
                        "VALUES (999, 'a.png', 1, 1, 'png', '[]', '{}', '2026-01-01')"
                    )
                )
    finally:
        database.dispose()


def test_in_memory_sqlite_shares_one_database_across_sessions() -> None:
    database = Database("sqlite://")
    database.upgrade()
    AuditRepository(database).append("test.ping", actor="tester")
    assert [e.action for e in AuditRepository(database).query()] == ["test.ping"]
    database.dispose()


def test_no_engine_or_file_until_first_use(tmp_path: Path) -> None:
    path = tmp_path / "lazy.sqlite3"
    database = Database(f"sqlite:///{path}")
    assert database._engine is None and not path.exists()
    database.current_revision()
    assert path.exists()
    database.dispose()
    # Importing the package opens nothing either.
    code = (
        "import db, sqlalchemy; import gc; from sqlalchemy import Engine; "
        "assert not [o for o in gc.get_objects() if isinstance(o, Engine)]; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_from_settings_uses_the_data_folder(data_dir: Path) -> None:
    from app.settings import WebSettings

    database = Database.from_settings(WebSettings())
    assert database.url == f"sqlite:///{data_dir.resolve() / 'orapo.sqlite3'}"
    database.upgrade()
    assert (data_dir / "orapo.sqlite3").exists()
    database.dispose()


def test_session_rolls_back_on_error(database: Database) -> None:
    from db.models import AuditLog

    with pytest.raises(RuntimeError):
        with database.session() as session:
            session.add(AuditLog(actor_name="x", action="never.kept", details={}))
            session.flush()
            raise RuntimeError("boom")
    assert AuditRepository(database).query() == []


def test_audit_log_is_append_only(database: Database) -> None:
    audit = AuditRepository(database)
    audit.append("study.view", actor="alice", object_type="study", object_id=7, details={"tab": "worklist"})
    audit.append("user.create", actor="cli", object_type="user", object_id=1)
    entries = audit.query()
    assert [e.action for e in entries] == ["user.create", "study.view"]  # newest first
    assert entries[1].details == {"tab": "worklist"} and entries[1].object_id == "7"
    assert [e.action for e in audit.query(action="study.")] == ["study.view"]
    assert [e.action for e in audit.query(actor_name="cli")] == ["user.create"]
    assert not any(hasattr(audit, name) for name in ("update", "delete", "remove", "clear"))
    for statement in ("UPDATE audit_log SET action = 'forged'", "DELETE FROM audit_log"):
        with pytest.raises(DBAPIError, match="append-only"):
            with database.engine.begin() as connection:
                connection.execute(sa.text(statement))
    assert [e.action for e in audit.query()] == ["user.create", "study.view"]


def test_concurrent_writers_wait_instead_of_failing(database: Database) -> None:
    """Gradio runs callbacks on threads: writers queue on the busy timeout (SQLite) or row locks (PostgreSQL)."""
    from concurrent.futures import ThreadPoolExecutor

    def write(i: int) -> None:
        for j in range(5):
            AuditRepository(database).append("load.write", actor=f"worker-{i}", object_id=j)

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(write, range(6)))
    assert len(AuditRepository(database).query(action="load.write", limit=100)) == 30
