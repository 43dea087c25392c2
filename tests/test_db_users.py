"""Users: hashing, sign-in refusals, disabling; and the `orapo users` and `orapo db` commands."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from sqlalchemy import select

from app.cli import main
from db.database import Database
from db.models import User
from db.repositories import AuditRepository, UserRepository
from orapo_core.errors import OrapoError


def test_create_and_authenticate(database: Database) -> None:
    users = UserRepository(database)
    created = users.create("Alice", "correct horse", role="admin", actor="cli")
    assert created.username == "alice" and created.role == "admin" and created.active and created.is_admin
    signed_in = users.authenticate("ALICE ", "correct horse")
    assert signed_in.id == created.id and signed_in.last_login_at is not None
    assert [u.username for u in users.list()] == ["alice"]
    assert [e.action for e in AuditRepository(database).query(object_type="user")] == ["user.create"]


def test_password_is_hashed_with_argon2(database: Database) -> None:
    UserRepository(database).create("bob", "s3cret-password")
    with database.session() as session:
        stored = session.scalar(select(User.password_hash).where(User.username == "bob"))
    assert stored.startswith("$argon2id$")
    assert "s3cret-password" not in stored


@pytest.mark.parametrize("name, password", [("carol", "wrong password"), ("carol", ""), ("nobody", "right password")])
def test_wrong_credentials_are_refused_alike(database: Database, name: str, password: str) -> None:
    UserRepository(database).create("carol", "right password")
    with pytest.raises(OrapoError) as refused:
        UserRepository(database).authenticate(name, password)
    assert refused.value.code == "bad_credentials"


def test_disabled_user_is_refused_and_can_be_enabled(database: Database) -> None:
    users = UserRepository(database)
    users.create("dave", "dave-password")
    assert users.disable("dave", actor="admin").active is False
    with pytest.raises(OrapoError) as refused:
        users.authenticate("dave", "dave-password")
    assert refused.value.code == "user_disabled"
    assert [u.username for u in users.list(include_disabled=False)] == []
    users.enable("dave")
    assert users.authenticate("dave", "dave-password").active


def test_duplicate_names_bad_names_weak_passwords_and_roles(database: Database) -> None:
    users = UserRepository(database)
    users.create("erin", "erin-password")
    for kwargs, code in [
        (dict(username="ERIN", password="another-password"), "user_exists"),
        (dict(username="not a name", password="long-enough"), "invalid_username"),
        (dict(username="frank", password="short"), "weak_password"),
        (dict(username="frank", password="long-enough", role="superuser"), "invalid_role"),
    ]:
        with pytest.raises(OrapoError) as refused:
            users.create(**kwargs)
        assert refused.value.code == code


def test_one_time_password_must_be_changed(database: Database) -> None:
    users = UserRepository(database)
    user, password = users.create_with_one_time_password("gina")
    assert user.must_change_password and len(password) >= 12
    assert users.authenticate("gina", password).must_change_password
    with pytest.raises(OrapoError):
        users.change_password("gina", "not-the-password", "new-password-1")
    changed = users.change_password("gina", password, "new-password-1")
    assert not changed.must_change_password
    with pytest.raises(OrapoError):
        users.authenticate("gina", password)
    assert users.authenticate("gina", "new-password-1").username == "gina"


def test_missing_user_is_an_orapo_error(database: Database) -> None:
    with pytest.raises(OrapoError) as refused:
        UserRepository(database).disable("ghost")
    assert refused.value.code == "user_not_found"


# --- the commands (SQLite in the per-test data folder) ---------------------------------------------


def _database(data_dir: Path) -> Database:
    return Database(f"sqlite:///{data_dir.resolve() / 'orapo.sqlite3'}")


def test_db_upgrade_and_current_commands(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "current"]) == 0
    assert "none (empty)" in capsys.readouterr().out
    assert main(["db", "upgrade"]) == 0
    assert "upgraded" in capsys.readouterr().out
    assert main(["db", "current"]) == 0
    assert "up to date" in capsys.readouterr().out
    database = _database(data_dir)
    assert database.is_up_to_date()
    database.dispose()


def test_users_commands(data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["users", "add", "Admin", "--admin"]) == 0
    one_time = capsys.readouterr().out.strip().splitlines()[-1]

    monkeypatch.setattr("sys.stdin", io.StringIO("radiologist-pw\n"))
    assert main(["users", "add", "rad", "--password-stdin"]) == 0
    assert "one-time" not in capsys.readouterr().out.lower()

    assert main(["users", "add", "rad"]) == 2
    assert "user_exists" in capsys.readouterr().err

    assert main(["users", "disable", "rad"]) == 0
    assert main(["users", "list"]) == 0
    listing = capsys.readouterr().out
    assert "admin\tadmin, active, must change password" in listing and "rad\tradiologist, disabled" in listing

    monkeypatch.setattr("sys.stdin", io.StringIO("admin-new-pw\n"))
    assert main(["users", "passwd", "admin", "--password-stdin"]) == 0
    assert main(["users", "passwd", "rad"]) == 0
    rad_one_time = capsys.readouterr().out.strip().splitlines()[-1]

    database = _database(data_dir)
    users = UserRepository(database)
    with pytest.raises(OrapoError):
        users.authenticate("admin", one_time)
    assert users.authenticate("admin", "admin-new-pw").is_admin
    with pytest.raises(OrapoError) as refused:
        users.authenticate("rad", rad_one_time)
    assert refused.value.code == "user_disabled"
    actions = [e.action for e in AuditRepository(database).query()]
    assert actions.count("user.create") == 2 and "user.disable" in actions and actions.count("user.password") == 2
    database.dispose()
