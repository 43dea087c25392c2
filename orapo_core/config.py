"""Configuration from `ORAPO_*` environment variables (pydantic-settings).

`Settings()` is cheap and built where it is needed (the CLI, the app factory,
tests), never held in a module global, so tests and several app instances can
point at different data folders in one process.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORAPO_", extra="ignore")

    data_dir: Path = Field(default=Path("./data"), description="SQLite file, de-identified images, models and round outputs.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite file in the data folder.")
    model_dir: Path | None = Field(default=None, description="A local image-text-to-text checkpoint to serve; default the starter model.")
    deid_secret: str | None = Field(default=None, description="Secret salt for hashed UIDs and date shifts; default a random one kept in the data folder.")
    max_pixels: int = Field(default=50_000_000, description="Images over this many pixels are refused (decompression bombs).")
    host: str = Field(default="127.0.0.1", description="Address `orapo serve` binds to.")
    port: int = Field(default=7860, description="Port `orapo serve` listens on.")

    @property
    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def storage_dir(self) -> Path:
        return self.resolved_data_dir / "images"

    @property
    def models_dir(self) -> Path:
        return self.resolved_data_dir / "models"

    @property
    def rounds_dir(self) -> Path:
        return self.resolved_data_dir / "rounds"

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.resolved_data_dir / 'orapo.sqlite3'}"

    def ensure_dirs(self) -> None:
        for d in (self.resolved_data_dir, self.storage_dir, self.models_dir, self.rounds_dir):
            d.mkdir(parents=True, exist_ok=True)
    
    def secret(self) -> str:
        """The de-identification secret: configured, or generated once and kept (0600) in the data folder."""
        if self.deid_secret:
            return self.deid_secret
        import secrets

        self.resolved_data_dir.mkdir(parents=True, exist_ok=True)
        path = self.resolved_data_dir / ".deid_secret"
        if not path.exists():
            path.write_text(secrets.token_hex(32))
            path.chmod(0o600)
        return path.read_text().strip()
