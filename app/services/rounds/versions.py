"""Model versions: listing them, promoting and rolling back by hand, and installing a round's candidate.

Which version drafts is `app.services.reading.served` (shared with drafting). A round
installs its candidate under `<data>/models/versions/round-<id>/` before the
version is recorded, so a version never points into a round folder; its paths
are stored relative to the data folder when they lie inside it (`stored_path`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from app.services.reading.served import stored_path
from app.services.rounds.plan import Candidate, Installed
from db import AuditRepository, ModelVersionRepository
from orapo_core.errors import OrapoError
from orapo_core.facts.metrics import EvalMetrics

if TYPE_CHECKING:
    from db import Database
    from db.records import ModelVersionRecord
    from db.repositories.base import Actor
    from orapo_core.config import Settings


def heldout_metrics(version: ModelVersionRecord) -> EvalMetrics:
    """A version's held-out metrics as its round stored them (`metrics["heldout"]`); none for a base registered by
    hand (every value None)."""
    heldout = (version.metrics or {}).get("heldout")
    return EvalMetrics.from_dict(heldout if isinstance(heldout, dict) else None)


def list_versions(db: Database, *, status: str | None = None) -> list[ModelVersionRecord]:
    return ModelVersionRepository(db).list(status=status)


def served_version(db: Database) -> ModelVersionRecord | None:
    return ModelVersionRepository(db).promoted()


def get_version(db: Database, version_id: int) -> ModelVersionRecord:
    """One version (`version_not_found` when there is none with this id)."""
    return ModelVersionRepository(db).get(version_id)


def rollback_target(
    db: Database, version_id: int | None = None
) -> tuple[ModelVersionRecord, ModelVersionRecord | None]:
    """What `rollback` would serve, and the version it would replace, refused as `rollback` refuses: for the
    page's confirmation, which names both before anything changes."""
    versions = ModelVersionRepository(db)
    current = versions.promoted()
    return _rollback_target(versions, current, version_id), current


def _rollback_target(
    versions: ModelVersionRepository, current: ModelVersionRecord | None, version_id: int | None
) -> ModelVersionRecord:
    if version_id is None:
        if current is None or current.parent_id is None:
            raise OrapoError("no_rollback_target", "The served model has no earlier version; name one to roll back to.")
        version_id = current.parent_id
    target = versions.get(version_id)
    if target.status == "rejected":
        raise OrapoError(
            "version_rejected", f"Model version {version_id} was rejected by the gate; it cannot be served."
        )
    if current is not None and current.id == version_id:
        raise OrapoError("already_served", f"Model version {version_id} is already the served model.")
    return target


def promote_version(
    db: Database, version_id: int, *, actor: Actor = None, reason: str | None = None
) -> ModelVersionRecord:
    return ModelVersionRepository(db).promote(version_id, reason=reason or "promoted by hand", actor=actor)


def rollback(
    db: Database, version_id: int | None = None, *, actor: Actor = None, reason: str | None = None
) -> ModelVersionRecord:
    """Serve an earlier version again (default: the served version's parent); one action, audited as `version.rollback`."""
    with db.session() as session:
        versions = ModelVersionRepository(session)
        current = versions.promoted()
        version_id = _rollback_target(versions, current, version_id).id
        promoted = versions.promote(version_id, reason=reason or "rollback", actor=actor)
        AuditRepository(session).append(
            "version.rollback",
            actor=actor,
            object_type="model_version",
            object_id=version_id,
            details={
                "from": current.id if current else None,
                "to": version_id,
                **({"reason": reason} if reason else {}),
            },
        )
        return promoted


def install_candidate(settings: Settings, round_id: int, candidate: Candidate) -> Installed:
    """Copy the candidate (adapter, or whole model) out of the round folder into `<data>/models/versions/round-<id>/`."""
    source = Path(candidate.adapter or candidate.base)
    target = settings.models_dir / "versions" / f"round-{round_id}"
    if target.exists():
        shutil.rmtree(target)
    tmp = target.with_name(target.name + ".part")
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("checkpoint-*", "metrics.jsonl", "*.part"))
    tmp.rename(target)
    if candidate.adapter:
        return Installed(base=stored_path(settings, candidate.base), adapter=stored_path(settings, target))
    return Installed(base=stored_path(settings, target), adapter=None)
