"""The settings split: the engine's `Settings`, the app's `WebSettings` on top, one set of ORAPO_* variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

CONFIGURATION = Path(__file__).resolve().parents[1] / "docs" / "pages" / "reference" / "configuration.md"


def test_the_engine_settings_refuse_a_web_setting_instead_of_dropping_it(tmp_path):
    from orapo_core.config import Settings

    for name, value in (
        ("host", "0.0.0.0"),
        ("port", 80),
        ("database_url", "sqlite://"),
        ("max_upload_mb", 1),
        ("secure_cookies", True),
    ):
        with pytest.raises(ValidationError):
            Settings(data_dir=tmp_path, **{name: value})


def test_web_settings_read_the_same_variables_and_lift_the_engines(monkeypatch, tmp_path):
    from app.settings import WebSettings, web_settings
    from orapo_core.config import Settings

    monkeypatch.setenv("ORAPO_HOST", "0.0.0.0")
    monkeypatch.setenv("ORAPO_PORT", "8080")
    monkeypatch.setenv("ORAPO_DATABASE_URL", "postgresql+psycopg://orapo@db/orapo")
    monkeypatch.setenv("ORAPO_SECURE_COOKIES", "1")
    engine = Settings(data_dir=tmp_path / "data", deid_secret="kept")  # the environment's web values are not its
    lifted = web_settings(engine)
    assert isinstance(lifted, WebSettings) and lifted.data_dir == tmp_path / "data" and lifted.deid_secret == "kept"
    assert (lifted.host, lifted.port, lifted.secure_cookies) == ("0.0.0.0", 8080, True)
    assert lifted.sqlalchemy_url == "postgresql+psycopg://orapo@db/orapo"
    assert web_settings(lifted) is lifted
    assert web_settings(engine.model_copy(update={"max_upload_mb": 1})).max_upload_mb == 1  # carried, not dropped

    monkeypatch.delenv("ORAPO_DATABASE_URL")
    assert WebSettings(data_dir=tmp_path).sqlalchemy_url == f"sqlite:///{tmp_path.resolve() / 'orapo.sqlite3'}"


def test_the_configuration_reference_names_every_setting():
    """The generated page (tests/test_docs.py keeps it current) has a row, with a description, for every field."""
    from app.settings import WebSettings

    documented = set(re.findall(r"^\| `ORAPO_([A-Z_]+)` \|", CONFIGURATION.read_text(), re.MULTILINE))
    assert {name.upper() for name in WebSettings.model_fields} <= documented
    assert all(field.description for field in WebSettings.model_fields.values())
