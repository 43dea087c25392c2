"""The engine's configuration from `ORAPO_*` environment variables (pydantic-settings).

`Settings()` is cheap and built where it is needed (the CLI, the app factory,
tests), never held in a module global, so tests and several app instances can
point at different data folders in one process. The engine serves nothing and
stores no rows: where the server listens, the database and the web limits are
the app's (`app.settings.WebSettings`, a subclass read from the same
environment). A keyword this class does not know is refused rather than
ignored, so a caller still passing a web setting here fails loudly.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from pydantic import Field  # noqa: TID253 -- this module is heavy; light ones import it lazily
from pydantic_settings import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    BaseSettings,
    SettingsConfigDict,
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORAPO_", extra="forbid")

    data_dir: Path = Field(
        default=Path("./data"),
        description="De-identified images, models and round outputs (the app keeps its own files there too).",
    )
    model_dir: Path | None = Field(
        default=None, description="A local image-text-to-text checkpoint to serve; default the starter model."
    )
    deid_secret: str | None = Field(
        default=None,
        description="The secret behind hashed UIDs and date shifts; keep it to keep pseudonyms stable. Default: a random one, generated once and kept in the data folder (mode 0600).",
    )
    max_pixels: int = Field(
        default=50_000_000, description="Images over this many pixels are refused (decompression bombs)."
    )
    draft_min_agreement: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="The drafts' operating point: a sentence stating a finding stays in the draft only when at least "
        "this share of the draft's 4 samples state it too (0.5: 2 of 4; 0: off, the greedy draft as it "
        "is); the left-out sentences are kept with the draft for audit. The rounds' gate drafts both "
        "models the same way.",
    )

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

    def ensure_dirs(self) -> None:
        """The data folder (0700 when new: it holds the database, the secret and the images) and its subfolders."""
        self.resolved_data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for d in (self.storage_dir, self.models_dir, self.rounds_dir):
            d.mkdir(parents=True, exist_ok=True)

    def secret(self) -> str:
        """The de-identification secret: configured, or generated once and kept (0600) in the data folder."""
        if self.deid_secret:
            return self.deid_secret

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
