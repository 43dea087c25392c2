"""Which model drafts now: the promoted version (base + adapter), else the configured or starter model.

One definition for the two places that ask: the drafting registry (which
`Drafter` to draft with) and a round (which model to train from and compare
the candidate with). A version's paths are stored relative to the data folder
when they lie inside it, so a data folder moved to another machine keeps its
versions; `resolve_path` and `stored_path` are the two directions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from db import ModelVersionRepository
from orapo_core.models.loading import resolve_model_dir

if TYPE_CHECKING:
    from db.database import Database
    from db.records import DraftRecord
    from orapo_core.config import Settings


@dataclass(frozen=True)
class ServedModel:
    """The model drafting now: a promoted version, or (version_id None) the configured or starter model folder."""

    version_id: int | None
    name: str  # shown to the clinician and stored with each draft
    model_dir: Path  # the base weights
    adapter_dir: Path | None = None  # a LoRA adapter on top, for versions trained with one

    @property
    def key(self) -> str:
        """What a registry caches a Drafter under: the version, else the folder."""
        return f"version-{self.version_id}" if self.version_id is not None else f"dir-{self.model_dir}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "version_id": self.version_id,
            "name": self.name,
            "model_dir": str(self.model_dir),
            "adapter_dir": str(self.adapter_dir) if self.adapter_dir else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServedModel:
        adapter = data.get("adapter_dir")
        return cls(
            data.get("version_id"), data.get("name") or "", Path(data["model_dir"]), Path(adapter) if adapter else None
        )


def served_model(db: Database, settings: Settings) -> ServedModel:
    """The promoted version as a ServedModel, else the configured model (ORAPO_MODEL_DIR) or the starter."""
    version = ModelVersionRepository(db).promoted()
    if version is not None:
        adapter = resolve_path(settings, version.adapter_path)
        return ServedModel(version.id, version.name, _absolute(settings, version.base_model_path), adapter)
    model_dir = resolve_model_dir(settings=settings)
    return ServedModel(None, model_dir.name, model_dir)


def resolve_path(settings: Settings, path: str | None) -> Path | None:
    """A stored version path as an absolute one (relative paths are inside the data folder)."""
    if not path:
        return None
    return _absolute(settings, path)


def _absolute(settings: Settings, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else settings.resolved_data_dir / p


def stored_path(settings: Settings, path: Path) -> str:
    """The path to store for a version: relative to the data folder when inside it."""
    try:
        return Path(path).resolve().relative_to(settings.resolved_data_dir).as_posix()
    except ValueError:
        return str(Path(path).resolve())


def drafted_by(draft: DraftRecord) -> str:
    """Who wrote a draft, as the status line and the dashboard name it: the version served when it was drafted
    ("round-1 (version 3)"), else the model folder ("starter"); never the base folder of a version (the status
    used to say "Draft 11 by starter" after round-1 was promoted)."""
    name = (draft.sampling or {}).get("model_version") or draft.model_name
    return f"{name} (version {draft.model_version_id})" if draft.model_version_id else name
