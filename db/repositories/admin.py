"""Schedule and archive settings, the append-only audit log, and the dashboard's counts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select  # noqa: TID253 -- this module is heavy; light ones import it lazily

from db.models import ArchiveSetting, AuditLog, Correction, PreferencePair, ScheduleSetting, Study, utcnow
from db.records import (
    SR_SEND_MODES,
    STUDY_STATUSES,
    ArchiveSettings,
    AuditEntry,
    DashboardCounts,
    ScheduleSettings,
    UserRecord,
)
from db.repositories.base import Actor, Repository, as_utc, audit, must_utc
from orapo_core.errors import OrapoError

_UNSET: Any = object()


def _check_cron(cron: str) -> None:
    # The scheduler owns the full grammar; here we only refuse what is plainly not a 5-field expression.
    fields = cron.split()
    allowed = set("0123456789*/,-?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    if len(fields) != 5 or any(not f or not set(f) <= allowed for f in fields):
        raise OrapoError("invalid_cron", f"{cron!r} is not a cron expression of 5 fields, such as '0 2 * * *'.")


def _schedule(row: ScheduleSetting | None) -> ScheduleSettings:
    if row is None:
        return ScheduleSettings()
    return ScheduleSettings(
        cron=row.cron,
        schedule_enabled=row.schedule_enabled,
        corrections_threshold=row.corrections_threshold,
        threshold_enabled=row.threshold_enabled,
        updated_at=as_utc(row.updated_at),
        updated_by=row.updated_by,
    )


class ScheduleRepository(Repository):
    def get(self) -> ScheduleSettings:
        with self._session() as session:
            return _schedule(session.get(ScheduleSetting, 1))

    def update(
        self,
        *,
        cron: str | None = _UNSET,
        schedule_enabled: bool = _UNSET,
        corrections_threshold: int | None = _UNSET,
        threshold_enabled: bool = _UNSET,
        actor: Actor = None,
    ) -> ScheduleSettings:
        """Change only the settings given; the result must make sense as a whole."""
        with self._session() as session:
            row = session.get(ScheduleSetting, 1)
            if row is None:
                row = ScheduleSetting(
                    id=1, cron=None, schedule_enabled=False, corrections_threshold=None, threshold_enabled=False
                )
                session.add(row)
            changes = {
                k: v
                for k, v in dict(
                    cron=cron,
                    schedule_enabled=schedule_enabled,
                    corrections_threshold=corrections_threshold,
                    threshold_enabled=threshold_enabled,
                ).items()
                if v is not _UNSET
            }
            for key, value in changes.items():
                setattr(row, key, value)
            if row.cron is not None:
                row.cron = row.cron.strip() or None
            if row.cron is not None:
                _check_cron(row.cron)
            if row.schedule_enabled and row.cron is None:
                raise OrapoError("invalid_schedule", "A scheduled round needs a cron expression.")
            if row.corrections_threshold is not None and row.corrections_threshold < 1:
                raise OrapoError("invalid_schedule", "The new-corrections threshold is a whole number of at least 1.")
            if row.threshold_enabled and row.corrections_threshold is None:
                raise OrapoError("invalid_schedule", "A threshold-triggered round needs a threshold.")
            row.updated_at = utcnow()
            row.updated_by = actor.id if isinstance(actor, UserRecord) else None
            audit(session, actor, "schedule.update", "schedule_settings", 1, changes)
            session.flush()
            return _schedule(row)


class ArchiveSettingsRepository(Repository):
    def get(self) -> ArchiveSettings:
        with self._session() as session:
            row = session.get(ArchiveSetting, 1)
            if row is None:
                return ArchiveSettings()
            return ArchiveSettings(sr_send=row.sr_send, updated_at=as_utc(row.updated_at), updated_by=row.updated_by)

    def update(self, *, sr_send: str, actor: Actor = None) -> ArchiveSettings:
        if sr_send not in SR_SEND_MODES:
            raise OrapoError(
                "invalid_sr_send",
                f"Sending reports to the archive is one of {', '.join(SR_SEND_MODES)}, not {sr_send!r}.",
            )
        with self._session() as session:
            row = session.get(ArchiveSetting, 1)
            if row is None:
                row = ArchiveSetting(id=1)
                session.add(row)
            row.sr_send = sr_send
            row.updated_at = utcnow()
            row.updated_by = actor.id if isinstance(actor, UserRecord) else None
            audit(session, actor, "archive.update", "archive_settings", 1, {"sr_send": sr_send})
            session.flush()
            return ArchiveSettings(sr_send=row.sr_send, updated_at=as_utc(row.updated_at), updated_by=row.updated_by)


def _entry(row: AuditLog) -> AuditEntry:
    return AuditEntry(
        id=row.id,
        actor_id=row.actor_id,
        actor_name=row.actor_name,
        action=row.action,
        object_type=row.object_type,
        object_id=row.object_id,
        details=dict(row.details or {}),
        created_at=must_utc(row.created_at),
    )


class AuditRepository(Repository):
    """Append and query only: there is deliberately no update or delete (and the database refuses both)."""

    def append(
        self,
        action: str,
        *,
        actor: Actor = None,
        object_type: str | None = None,
        object_id: Any = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        with self._session() as session:
            audit(session, actor, action, object_type, object_id, details)

    def query(
        self,
        *,
        actor_name: str | None = None,
        action: str | None = None,
        object_type: str | None = None,
        object_id: Any = None,
        since: datetime | None = None,
        limit: int = 200,
    ) -> list[AuditEntry]:
        """Newest first. `action` ending in '.' matches a prefix, e.g. 'user.'."""
        with self._session() as session:
            query = select(AuditLog).order_by(AuditLog.id.desc()).limit(limit)
            if actor_name is not None:
                query = query.where(AuditLog.actor_name == actor_name)
            if action is not None:
                query = query.where(
                    AuditLog.action.startswith(action) if action.endswith(".") else AuditLog.action == action
                )
            if object_type is not None:
                query = query.where(AuditLog.object_type == object_type)
            if object_id is not None:
                query = query.where(AuditLog.object_id == str(object_id))
            if since is not None:
                query = query.where(AuditLog.created_at >= since)
            return [_entry(r) for r in session.scalars(query)]


class DashboardRepository(Repository):
    def counts(self) -> DashboardCounts:
        with self._session() as session:
            by_status = dict.fromkeys(STUDY_STATUSES, 0)
            for status, n in session.execute(select(Study.status, func.count(Study.id)).group_by(Study.status)):
                by_status[status] = int(n)
            holdout = int(session.scalar(select(func.count(Study.id)).where(Study.split == "holdout")) or 0)
            corrections = int(session.scalar(select(func.count(Correction.id))) or 0)
            latest = (
                select(Correction.study_id, func.max(Correction.version).label("version"))
                .group_by(Correction.study_id)
                .subquery()
            )
            latest_rows = session.execute(
                select(Correction.accepted_unchanged, Correction.signed_at, Correction.trained_in_round, Study.split)
                .join(latest, (Correction.study_id == latest.c.study_id) & (Correction.version == latest.c.version))
                .join(Study, Study.id == Correction.study_id)
            ).all()
            pairs_by_source: dict[str, int] = {}
            for source, n in session.execute(
                select(PreferencePair.source, func.count(PreferencePair.id)).group_by(PreferencePair.source)
            ):
                pairs_by_source[source] = int(n)
        accepted = sum(1 for r in latest_rows if r.accepted_unchanged)
        return DashboardCounts(
            studies=sum(by_status.values()),
            studies_by_status=by_status,
            holdout_studies=holdout,
            corrections=corrections,
            signed_corrections=sum(1 for r in latest_rows if r.signed_at is not None),
            untrained_corrections=sum(
                1 for r in latest_rows if r.signed_at is not None and r.trained_in_round is None and r.split == "train"
            ),
            pairs=sum(pairs_by_source.values()),
            pairs_by_source=pairs_by_source,
            accepted_unchanged_rate=(accepted / len(latest_rows)) if latest_rows else None,
        )
