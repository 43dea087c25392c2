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
    max_upload_mb: int = Field(default=100, ge=1, description="Uploaded files larger than this many MiB are refused.")
    secure_cookies: bool = Field(default=False, description="Mark the session cookie Secure and send HSTS; set it when a TLS proxy serves the app over HTTPS (a request that arrives as https gets both anyway).")

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
        """The data folder (0700 when new: it holds the database, the secret and the images) and its subfolders."""
        self.resolved_data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for d in (self.storage_dir, self.models_dir, self.rounds_dir):
            d.mkdir(parents=True, exist_ok=True)

    def secret(self) -> str:
        """The de-identification secret: configured, or generated once and kept (0600) in the data folder."""
        if self.deid_secret:
            return self.deid_secret
        import os
        import secrets
        import tempfile

        self.resolved_data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.resolved_data_dir / ".deid_secret"
        if not path.exists():
            # Written 0600 from the start (mkstemp), and put in place only complete: a second process starting at
            # the same moment keeps the first one's secret instead of overwriting it.
            fd, tmp = tempfile.mkstemp(dir=self.resolved_data_dir, prefix=".deid_secret-")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32))
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        return path.read_text().strip()
