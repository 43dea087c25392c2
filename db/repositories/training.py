"""Preference pairs, training rounds and model versions.

A round moves only along the allowed transitions below, so a UI double-click or
a late progress report from a dead process cannot resurrect a finished round.
Exactly one model version is promoted at a time: `promote` retires the previous
one in the same transaction, and a partial unique index backs it up.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import func, select, text, update  # noqa: TID253 -- this module is heavy; light ones import it lazily
from sqlalchemy.exc import IntegrityError  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.models import ModelVersion, PreferencePair, Study, TrainingRound, utcnow
from db.records import PAIR_SOURCES, ROUND_STATUSES, ROUND_TRIGGERS, ModelVersionRecord, PairRecord, RoundRecord
from db.repositories.base import Actor, Repository, as_utc, audit, must_utc
from orapo_core.errors import OrapoError

ROUND_TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled", "failed"}),
    "running": frozenset({"succeeded", "failed", "cancelled"}),
    "succeeded": frozenset({"promoted", "rejected"}),
    "failed": frozenset(),
    "cancelled": frozenset(),
    "rejected": frozenset(),
    "promoted": frozenset(),
}
ACTIVE_ROUND_STATUSES = ("queued", "running")
#: The PostgreSQL advisory lock key `RoundRepository.create` holds to its commit (any constant no other code uses).
ROUND_CREATE_LOCK = 0x0_4A90_0001
_FINISHED = frozenset({"succeeded", "failed", "cancelled"})


def pair_record(pair: PreferencePair) -> PairRecord:
    return PairRecord(
        id=pair.id,
        study_id=pair.study_id,
        image_id=pair.image_id,
        prompt=pair.prompt,
        chosen=pair.chosen,
        rejected=pair.rejected,
        source=pair.source,
        correction_id=pair.correction_id,
        round_id=pair.round_id,
        created_at=must_utc(pair.created_at),
    )


def round_record(r: TrainingRound) -> RoundRecord:
    return RoundRecord(
        id=r.id,
        status=r.status,
        trigger=r.trigger,
        config=dict(r.config or {}),
        progress=float(r.progress or 0.0),
        metrics=dict(r.metrics or {}),
        log=r.log or "",
        pid=r.pid,
        output_dir=r.output_dir,
        started_by=r.started_by,
        created_at=must_utc(r.created_at),
        started_at=as_utc(r.started_at),
        finished_at=as_utc(r.finished_at),
        error=r.error,
    )


def version_record(v: ModelVersion) -> ModelVersionRecord:
    return ModelVersionRecord(
        id=v.id,
        name=v.name,
        base_model_path=v.base_model_path,
        adapter_path=v.adapter_path,
        metrics=dict(v.metrics or {}),
        parent_id=v.parent_id,
        round_id=v.round_id,
        study_ids_seen=list(v.study_ids_seen or []),
        config=dict(v.config or {}),
        status=v.status,
        reason=v.reason,
        created_by=v.created_by,
        created_at=must_utc(v.created_at),
    )


class PairRepository(Repository):
    def add(
        self,
        study_id: int,
        *,
        prompt: str,
        chosen: str,
        rejected: str,
        source: str,
        image_id: int | None = None,
        correction_id: int | None = None,
        round_id: int | None = None,
    ) -> PairRecord:
        return self.add_many(
            [
                dict(
                    study_id=study_id,
                    prompt=prompt,
                    chosen=chosen,
                    rejected=rejected,
                    source=source,
                    image_id=image_id,
                    correction_id=correction_id,
                    round_id=round_id,
                )
            ]
        )[0]

    def add_many(self, pairs: Iterable[dict[str, Any]]) -> list[PairRecord]:
        """Several pairs in one transaction; each dict has `add`'s keyword names. Held-out studies are refused."""
        rows = []
        for p in pairs:
            if p.get("source") not in PAIR_SOURCES:
                raise OrapoError(
                    "invalid_pair_source",
                    f"A pair's source is one of {', '.join(PAIR_SOURCES)}, not {p.get('source')!r}.",
                )
            if p.get("chosen") == p.get("rejected"):
                raise OrapoError(
                    "invalid_pair", "A preference pair needs a chosen text different from the rejected one."
                )
            rows.append(PreferencePair(**p))
        with self._session() as session:
            study_ids = {r.study_id for r in rows}
            studies = {s.id: s for s in session.scalars(select(Study).where(Study.id.in_(study_ids)))}
            missing = sorted(study_ids - set(studies))
            if missing:
                raise OrapoError("study_not_found", f"There are no studies with ids {missing}.")
            held_out = sorted(i for i, s in studies.items() if s.split == "holdout")
            if held_out:
                raise OrapoError(
                    "holdout_study", f"Studies {held_out} are held out for evaluation; no pairs are made from them."
                )
            session.add_all(rows)
            session.flush()
            return [pair_record(r) for r in rows]

    def list(
        self,
        *,
        round_id: int | None = None,
        unassigned: bool = False,
        source: str | None = None,
        study_id: int | None = None,
        correction_id: int | None = None,
        limit: int | None = None,
    ) -> list[PairRecord]:
        with self._session() as session:
            query = select(PreferencePair).order_by(PreferencePair.id)
            if round_id is not None:
                query = query.where(PreferencePair.round_id == round_id)
            if unassigned:
                query = query.where(PreferencePair.round_id.is_(None))
            if source is not None:
                query = query.where(PreferencePair.source == source)
            if study_id is not None:
                query = query.where(PreferencePair.study_id == study_id)
            if correction_id is not None:
                query = query.where(PreferencePair.correction_id == correction_id)
            if limit is not None:
                query = query.limit(limit)
            return [pair_record(p) for p in session.scalars(query)]

    def assign_to_round(self, pair_ids: Iterable[int], round_id: int) -> int:
        ids = sorted(set(pair_ids))
        with self._session() as session:
            if session.get(TrainingRound, round_id) is None:
                raise OrapoError("round_not_found", f"There is no training round with id {round_id}.")
            result = session.execute(update(PreferencePair).where(PreferencePair.id.in_(ids)).values(round_id=round_id))
            return int(result.rowcount or 0)

    def count(self, *, source: str | None = None) -> int:
        with self._session() as session:
            query = select(func.count(PreferencePair.id))
            if source is not None:
                query = query.where(PreferencePair.source == source)
            return int(session.scalar(query) or 0)


class RoundRepository(Repository):
    def create(
        self,
        *,
        trigger: str = "manual",
        config: dict[str, Any] | None = None,
        started_by: int | None = None,
        actor: Actor = None,
    ) -> RoundRecord:
        if trigger not in ROUND_TRIGGERS:
            raise OrapoError(
                "invalid_trigger", f"A round's trigger is one of {', '.join(ROUND_TRIGGERS)}, not {trigger!r}."
            )
        with self._session() as session:
            if session.get_bind().dialect.name == "postgresql":
                # PostgreSQL hands out ids before commit: without this, two requests could each commit and look
                # for the other before the older one committed, and both rounds would run. Held to the commit,
                # the lock makes id order commit order, so the newer request always sees the older one.
                session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ROUND_CREATE_LOCK})
            r = TrainingRound(
                status="queued",
                trigger=trigger,
                config=dict(config or {}),
                progress=0.0,
                metrics={},
                log="",
                started_by=started_by,
            )
            session.add(r)
            session.flush()
            audit(session, actor, "round.create", "training_round", r.id, {"trigger": trigger})
            return round_record(r)

    def get(self, round_id: int) -> RoundRecord:
        with self._session() as session:
            return round_record(self._load(session, round_id))

    def list(self, *, status: str | Sequence[str] | None = None, limit: int = 100) -> list[RoundRecord]:
        """Newest first, optionally only those in the given status(es)."""
        statuses = [status] if isinstance(status, str) else list(status or [])
        for s in statuses:
            if s not in ROUND_STATUSES:
                raise OrapoError("invalid_status", f"A round status is one of {', '.join(ROUND_STATUSES)}, not {s!r}.")
        with self._session() as session:
            query = select(TrainingRound).order_by(TrainingRound.id.desc()).limit(limit)
            if statuses:
                query = query.where(TrainingRound.status.in_(statuses))
            return [round_record(r) for r in session.scalars(query)]

    def active(self) -> builtins.list[RoundRecord]:  # `list` is the method above in this class
        return self.list(status=ACTIVE_ROUND_STATUSES)

    def count_by_status(self) -> dict[str, int]:
        """How many rounds are in each status, every status named (0 for none); the metrics' `orapo_rounds`."""
        with self._session() as session:
            query = select(TrainingRound.status, func.count()).group_by(TrainingRound.status)
            counted = dict(session.execute(query).all())
        return {status: int(counted.get(status, 0)) for status in ROUND_STATUSES}

    def transition(
        self,
        round_id: int,
        status: str,
        *,
        error: str | None = None,
        metrics: dict[str, Any] | None = None,
        actor: Actor = None,
    ) -> RoundRecord:
        """Move a round along an allowed edge of `ROUND_TRANSITIONS`, stamping start and finish times."""
        if status not in ROUND_STATUSES:
            raise OrapoError("invalid_status", f"A round status is one of {', '.join(ROUND_STATUSES)}, not {status!r}.")
        with self._session() as session:
            r = self._load(session, round_id, for_update=True)
            if status not in ROUND_TRANSITIONS[r.status]:
                raise OrapoError("invalid_transition", f"Round {round_id} is {r.status}; it cannot become {status}.")
            previous, r.status = r.status, status
            now = utcnow()
            if status == "running":
                r.started_at = now
            if status in _FINISHED:
                r.finished_at = now
                if status == "succeeded":
                    r.progress = 1.0
            if error is not None:
                r.error = error
            if metrics:
                r.metrics = {**(r.metrics or {}), **metrics}
            audit(
                session,
                actor,
                f"round.{status}",
                "training_round",
                r.id,
                {"from": previous, **({"error": error} if error else {})},
            )
            return round_record(r)

    def update_progress(
        self, round_id: int, progress: float, *, log_append: str | None = None, metrics: dict[str, Any] | None = None
    ) -> RoundRecord:
        """A running round reports in; reports for a round no longer running are refused."""
        with self._session() as session:
            r = self._load(session, round_id)
            if r.status != "running":
                raise OrapoError("round_not_running", f"Round {round_id} is {r.status}, not running.")
            r.progress = min(1.0, max(0.0, float(progress)))
            if log_append:
                r.log = (r.log or "") + log_append
            if metrics:
                r.metrics = {**(r.metrics or {}), **metrics}
            return round_record(r)

    def set_process(self, round_id: int, *, pid: int | None, output_dir: str | None = None) -> RoundRecord:
        with self._session() as session:
            r = self._load(session, round_id)
            r.pid = pid
            if output_dir is not None:
                r.output_dir = output_dir
            return round_record(r)

    @staticmethod
    def _load(session, round_id: int, *, for_update: bool = False) -> TrainingRound:
        query = select(TrainingRound).where(TrainingRound.id == round_id)
        if for_update:
            query = query.with_for_update()
        r = session.scalar(query)
        if r is None:
            raise OrapoError("round_not_found", f"There is no training round with id {round_id}.")
        return r


class ModelVersionRepository(Repository):
    def create(
        self,
        name: str,
        *,
        base_model_path: str,
        adapter_path: str | None = None,
        metrics: dict[str, Any] | None = None,
        parent_id: int | None = None,
        round_id: int | None = None,
        study_ids_seen: Iterable[int] = (),
        config: dict[str, Any] | None = None,
        created_by: int | None = None,
    ) -> ModelVersionRecord:
        with self._session() as session:
            v = ModelVersion(
                name=name,
                base_model_path=base_model_path,
                adapter_path=adapter_path,
                metrics=dict(metrics or {}),
                parent_id=parent_id,
                round_id=round_id,
                study_ids_seen=sorted(set(study_ids_seen)),
                config=dict(config or {}),
                status="candidate",
                created_by=created_by,
            )
            session.add(v)
            session.flush()
            return version_record(v)

    def get(self, version_id: int) -> ModelVersionRecord:
        with self._session() as session:
            return version_record(self._load(session, version_id))

    def list(self, *, status: str | None = None) -> list[ModelVersionRecord]:
        with self._session() as session:
            query = select(ModelVersion).order_by(ModelVersion.id.desc())
            if status is not None:
                query = query.where(ModelVersion.status == status)
            return [version_record(v) for v in session.scalars(query)]

    def promoted(self) -> ModelVersionRecord | None:
        """The version that drafts reports now, or None while the starter model serves."""
        with self._session() as session:
            v = session.scalar(select(ModelVersion).where(ModelVersion.status == "promoted"))
            return None if v is None else version_record(v)

    def promote(self, version_id: int, *, reason: str | None = None, actor: Actor = None) -> ModelVersionRecord:
        """Make this version the one in service and retire the previous one, in one transaction.

        Promoting a retired version is the rollback. A rejected version stays rejected.
        """
        with self._session() as session:
            v = self._load(session, version_id, for_update=True)
            if v.status == "promoted":
                return version_record(v)
            if v.status == "rejected":
                raise OrapoError("version_rejected", f"Model version {version_id} was rejected and cannot be promoted.")
            previous = list(
                session.scalars(select(ModelVersion).where(ModelVersion.status == "promoted").with_for_update())
            )
            for p in previous:
                p.status = "retired"
            session.flush()  # the retirement reaches the database before the unique promoted slot is taken
            v.status = "promoted"
            try:
                session.flush()
            except IntegrityError as exc:  # another promotion won the race (SQLite has no SELECT ... FOR UPDATE)
                raise OrapoError(
                    "promote_conflict", "Another version was promoted at the same moment; reload and try again."
                ) from exc
            v.reason = _with_reason(v.reason, reason)
            if v.round_id is not None:
                r = session.get(TrainingRound, v.round_id)
                if r is not None and r.status == "succeeded":
                    r.status = "promoted"
            audit(
                session,
                actor,
                "version.promote",
                "model_version",
                v.id,
                {"retired": [p.id for p in previous], **({"reason": reason} if reason else {})},
            )
            return version_record(v)

    def reject(self, version_id: int, *, reason: str | None = None, actor: Actor = None) -> ModelVersionRecord:
        with self._session() as session:
            v = self._load(session, version_id, for_update=True)
            if v.status != "candidate":
                raise OrapoError(
                    "invalid_transition", f"Model version {version_id} is {v.status}; only a candidate can be rejected."
                )
            v.status = "rejected"
            v.reason = _with_reason(v.reason, reason)
            if v.round_id is not None:
                r = session.get(TrainingRound, v.round_id)
                if r is not None and r.status == "succeeded":
                    r.status = "rejected"
            audit(session, actor, "version.reject", "model_version", v.id, {"reason": reason} if reason else {})
            return version_record(v)

    @staticmethod
    def _load(session, version_id: int, *, for_update: bool = False) -> ModelVersion:
        query = select(ModelVersion).where(ModelVersion.id == version_id)
        if for_update:
            query = query.with_for_update()
        v = session.scalar(query)
        if v is None:
            raise OrapoError("version_not_found", f"There is no model version with id {version_id}.")
        return v


def _with_reason(before: str | None, reason: str | None) -> str | None:
    """A version's reasons, oldest first: a promotion or rollback by hand adds its reason after the gate's, never
    over it (the versions table used to lose the gate's text when an admin gave a reason)."""
    if not reason or reason == before:
        return before or reason
    return f"{before} — then: {reason}" if before else reason
