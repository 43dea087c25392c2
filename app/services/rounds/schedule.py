"""Rounds that start by themselves: on a cron schedule, or once enough new corrections have accumulated.

The settings live in the database (`ScheduleRepository`), so they survive a
restart; `RoundScheduler` is created by the app at start, reads them, and keeps
two APScheduler jobs in step with them. Both jobs only *request* a round from
the `RoundService`, so the one-round-at-a-time rule and its refusals are the
same as for a click: a scheduled request that finds a round running is refused,
and the refusal is written to the audit log rather than queued behind it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orapo_core.errors import OrapoError

log = logging.getLogger(__name__)

CRON_JOB = "orapo-round-cron"
THRESHOLD_JOB = "orapo-round-threshold"
SYNC_JOB = "orapo-schedule-sync"


def cron_trigger(cron: str, timezone=None):
    """An APScheduler trigger for a 5-field crontab line, or `invalid_cron` with a sentence."""
    from apscheduler.triggers.cron import CronTrigger

    try:
        return CronTrigger.from_crontab(cron, timezone=timezone)
    except (ValueError, TypeError) as exc:
        raise OrapoError("invalid_cron", f"{cron!r} is not a valid cron schedule ({exc}); e.g. '0 2 * * *' for 02:00 nightly.") from None


def next_run(cron: str, now: datetime | None = None, timezone=None) -> datetime | None:
    from datetime import UTC

    trigger = cron_trigger(cron, timezone)
    now = now or datetime.now(UTC)
    return trigger.get_next_fire_time(None, now)


def get_schedule(db):
    from db import ScheduleRepository

    return ScheduleRepository(db).get()


def set_schedule(db, *, actor=None, scheduler: RoundScheduler | None = None, **changes):
    """Save schedule settings (cron, schedule_enabled, corrections_threshold, threshold_enabled); a running scheduler follows."""
    from db import ScheduleRepository

    if changes.get("cron"):
        cron_trigger(changes["cron"])  # the full grammar check, before anything is stored
    saved = ScheduleRepository(db).update(actor=actor, **changes)
    if scheduler is not None:
        scheduler.reload()
    return saved


@dataclass(frozen=True)
class ScheduleStatus:
    """What the Rounds tab shows about the schedule: the stored settings and what they mean now."""

    settings: Any  # db.records.ScheduleRecord
    next_run: datetime | None  # when the cron next requests a round; None while scheduled rounds are off
    untrained: int  # signed corrections of training studies that no round has used yet
    scheduler_running: bool  # False: this process starts rounds only by hand


def schedule_status(db, scheduler: RoundScheduler | None = None) -> ScheduleStatus:
    """The stored schedule, when its cron fires next (as the running scheduler has it, else computed) and the backlog."""
    from db import CorrectionRepository

    settings = get_schedule(db)
    running = scheduler is not None and scheduler.running
    when = None
    if settings.schedule_enabled and settings.cron:
        when = (scheduler.jobs().get(CRON_JOB) if running else None) or next_run(settings.cron)
    return ScheduleStatus(settings, when, CorrectionRepository(db).count_untrained(), running)


class RoundScheduler:
    """APScheduler's BackgroundScheduler running the cron and threshold jobs of one app instance."""

    def __init__(self, database, settings=None, *, service=None, threshold_check_s: float = 60.0, timezone=None):
        from app.services.rounds.service import RoundService

        self.db = database
        self.service = service or RoundService(database, settings)
        self.threshold_check_s = threshold_check_s
        self.timezone = timezone
        self._scheduler = None
        self._loaded_at = None  # updated_at of the settings the jobs were built from

    @property
    def running(self) -> bool:
        return self._scheduler is not None and self._scheduler.running

    def start(self) -> RoundScheduler:
        from apscheduler.schedulers.background import BackgroundScheduler

        if self.running:
            return self
        self.service.recover()
        self._scheduler = BackgroundScheduler(timezone=self.timezone, job_defaults={"coalesce": True, "max_instances": 1,
                                                                                     "misfire_grace_time": 3600})
        self._scheduler.start()
        self.reload()
        # Settings saved by another process (`orapo rounds schedule`) are picked up within a check interval.
        from apscheduler.triggers.interval import IntervalTrigger

        self._scheduler.add_job(self._sync, IntervalTrigger(seconds=self.threshold_check_s), id=SYNC_JOB)
        return self

    def shutdown(self, *, cancel_rounds: bool = True) -> None:
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        self._scheduler = None
        self.service.shutdown(cancel=cancel_rounds)

    def reload(self) -> None:
        """Make the jobs match the stored settings (after an admin changed them)."""
        from apscheduler.triggers.interval import IntervalTrigger

        if not self.running:
            return
        settings = get_schedule(self.db)
        self._loaded_at = settings.updated_at
        for job_id in (CRON_JOB, THRESHOLD_JOB):
            if self._scheduler.get_job(job_id) is not None:
                self._scheduler.remove_job(job_id)
        if settings.schedule_enabled and settings.cron:
            self._scheduler.add_job(self.fire_scheduled, cron_trigger(settings.cron, self.timezone), id=CRON_JOB,
                                    replace_existing=True)
        if settings.threshold_enabled and settings.corrections_threshold:
            self._scheduler.add_job(self.check_threshold, IntervalTrigger(seconds=self.threshold_check_s), id=THRESHOLD_JOB,
                                    replace_existing=True)

    def _sync(self) -> None:
        if get_schedule(self.db).updated_at != self._loaded_at:
            self.reload()

    def jobs(self) -> dict[str, datetime | None]:
        """The round-starting jobs and when each next runs (for the admin tab)."""
        if not self.running:
            return {}
        return {job.id: job.next_run_time for job in self._scheduler.get_jobs() if job.id in (CRON_JOB, THRESHOLD_JOB)}

    def add_one_off(self, when: datetime, trigger: str = "schedule") -> None:
        """Run one scheduled request at `when` (an admin's "tonight at 2", and how tests fire the cron path quickly)."""
        from apscheduler.triggers.date import DateTrigger

        if not self.running:
            raise OrapoError("scheduler_stopped", "The round scheduler is not running.")
        self._scheduler.add_job(self._request, DateTrigger(run_date=when), args=[trigger])

    # --- the job functions (called by APScheduler, or directly) ---------------------------------------------

    def fire_scheduled(self):
        """The cron job: request a round if the schedule is still enabled."""
        settings = get_schedule(self.db)
        if not (settings.schedule_enabled and settings.cron):
            return None
        return self._request("schedule")

    def check_threshold(self):
        """The threshold job: request a round once `corrections_threshold` untrained corrections have accumulated."""
        from db import CorrectionRepository

        settings = get_schedule(self.db)
        if not (settings.threshold_enabled and settings.corrections_threshold):
            return None
        if CorrectionRepository(self.db).count_untrained() < settings.corrections_threshold:
            return None
        return self._request("threshold")

    def _request(self, trigger: str):
        from db import AuditRepository

        try:
            return self.service.start_round(trigger=trigger, actor="scheduler", wait=False)
        except OrapoError as exc:
            AuditRepository(self.db).append("round.refused", actor="scheduler", object_type="training_round",
                                            details={"trigger": trigger, "code": exc.code, "message": exc.message})
            log.info("scheduled round not started: %s: %s", exc.code, exc.message)
            return None
        except Exception:  # a job must never kill the scheduler thread
            log.exception("scheduled round request failed")
            return None
