"""Rounds that start by themselves: on a cron schedule, or once enough new corrections have accumulated.

The settings live in the database (`ScheduleRepository`), so they survive a
restart; `RoundScheduler` is created by the app at start, reads them, and keeps
two APScheduler jobs in step with them. Both jobs only *request* a round from
the `RoundService`, so the one-round-at-a-time rule and its refusals are the
same as for a click: a scheduled request that finds a round running is refused,
and the refusal is written to the audit log rather than queued behind it.

Several servers may share one database: each has a `RoundScheduler`, but only
the leader (`app.services.operations.leader.Leadership`, a lease in the database) runs the
jobs. On election it recovers what a gone process left (`RoundService.recover`)
and starts them; a deposed leader stops them, and every job asks `acting()`
before it acts. Besides the round jobs the leader recovers again every check
interval (a server that died while the leader lived left its rounds too) and
runs whatever other once-only duties the app hands it (`leader_jobs`: the
shared cache's sweep).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app.services.operations.leader import QUEUED_GRACE_S, Leadership, other_servers_alive
from app.services.rounds.service import RoundService
from app.settings import web_settings
from db import AuditRepository, CorrectionRepository, ScheduleRepository
from orapo_core.errors import OrapoError, log_line

if TYPE_CHECKING:
    from db import Database
    from db.records import RoundRecord, ScheduleSettings
    from db.repositories.base import Actor
    from orapo_core.config import Settings

log = logging.getLogger(__name__)

CRON_JOB = "orapo-round-cron"
THRESHOLD_JOB = "orapo-round-threshold"
SYNC_JOB = "orapo-schedule-sync"
RECOVER_JOB = "orapo-round-recover"


def cron_trigger(cron: str, timezone: Any = None) -> Any:
    """An APScheduler trigger for a 5-field crontab line, or `invalid_cron` with a sentence."""
    from apscheduler.triggers.cron import CronTrigger

    try:
        return CronTrigger.from_crontab(cron, timezone=timezone)
    except (ValueError, TypeError) as exc:
        raise OrapoError(
            "invalid_cron", f"{cron!r} is not a valid cron schedule ({exc}); e.g. '0 2 * * *' for 02:00 nightly."
        ) from None


def next_run(cron: str, now: datetime | None = None, timezone: Any = None) -> datetime | None:
    trigger = cron_trigger(cron, timezone)
    now = now or datetime.now(UTC)
    return trigger.get_next_fire_time(None, now)


def get_schedule(db: Database) -> ScheduleSettings:
    return ScheduleRepository(db).get()


def set_schedule(
    db: Database, *, actor: Actor = None, scheduler: RoundScheduler | None = None, **changes: Any
) -> ScheduleSettings:
    """Save schedule settings (cron, schedule_enabled, corrections_threshold, threshold_enabled); a running scheduler follows."""
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
    led_by: str | None = None  # the other server that runs the schedule now ("host pid N"), when one does


def schedule_status(db: Database, scheduler: RoundScheduler | None = None) -> ScheduleStatus:
    """The stored schedule, when its cron fires next (as the running scheduler has it, else computed) and the backlog."""
    settings = get_schedule(db)
    running = scheduler is not None and scheduler.running
    when = None
    if settings.schedule_enabled and settings.cron:
        when = (scheduler.jobs().get(CRON_JOB) if scheduler is not None and running else None) or next_run(
            settings.cron
        )
    led_by = None
    leadership = getattr(scheduler, "leadership", None)
    if leadership is not None and not running:
        lease = leadership.leader()
        if lease is not None and lease.live:
            host, pid, _ = lease.holder.split("#")[0].rsplit(":", 2)
            led_by = f"{host} pid {pid}"
    return ScheduleStatus(settings, when, CorrectionRepository(db).count_untrained(), running, led_by)


class RoundScheduler:
    """APScheduler's BackgroundScheduler running the cron and threshold jobs, on the leading app server only.

    `threshold_check_s` (default ORAPO_ROUND_CHECK_S) is how often the threshold is checked, settings saved
    elsewhere are picked up and rounds of gone servers recovered; `lease_s` (default ORAPO_LEADER_LEASE_S) is
    the leader lease; `leader_jobs` are (id, function, every_s) run by the leader beside the round jobs."""

    def __init__(
        self,
        database: Database,
        settings: Settings | None = None,
        *,
        service: RoundService | None = None,
        threshold_check_s: float | None = None,
        timezone: Any = None,
        lease_s: float | None = None,
        leader_jobs: Iterable[tuple[str, Callable[[], Any], float]] = (),
    ) -> None:
        web = web_settings(settings)
        self.db = database
        self.service = service or RoundService(database, settings)
        self.threshold_check_s = web.round_check_s if threshold_check_s is None else threshold_check_s
        self.timezone = timezone
        self.leader_jobs = tuple(leader_jobs)
        self.leadership = Leadership(
            database,
            lease_s=web.leader_lease_s if lease_s is None else lease_s,
            on_elected=self._lead,
            on_deposed=self._follow,
        )
        self._scheduler: Any = None  # APScheduler's BackgroundScheduler while leading
        self._loaded_at: datetime | None = None  # updated_at of the settings the jobs were built from

    @property
    def running(self) -> bool:
        """Whether this process runs the round jobs now (it leads)."""
        scheduler = self._scheduler
        return scheduler is not None and scheduler.running

    def start(self) -> RoundScheduler:
        """Join the election (a lone server leads at once: recovers, then runs the jobs) and keep ticking."""
        self.leadership.start()
        return self

    def shutdown(self, *, cancel_rounds: bool = True) -> None:
        """Leave the election (a leader hands over at once) and stop this process's rounds."""
        self.leadership.stop()
        self._follow()
        self.service.shutdown(cancel=cancel_rounds)

    def _lead(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler
        from apscheduler.triggers.interval import IntervalTrigger

        if self.running:
            return
        # Alone, a queued round is what a stopped server left (as before); with others alive it may be theirs.
        alone = not other_servers_alive(self.db, self.leadership.identity)
        self.service.recover(**({} if alone else {"queued_grace_s": QUEUED_GRACE_S}))
        scheduler = BackgroundScheduler(
            timezone=self.timezone, job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600}
        )
        scheduler.start()
        self._install_round_jobs(scheduler)
        # Settings saved by another process (`orapo rounds schedule`, another server) are picked up within a check.
        every = IntervalTrigger(seconds=self.threshold_check_s)
        scheduler.add_job(self._as_leader(self._sync), every, id=SYNC_JOB)
        scheduler.add_job(self._as_leader(self._recover), every, id=RECOVER_JOB)
        for job_id, function, every_s in self.leader_jobs:
            scheduler.add_job(self._as_leader(function), IntervalTrigger(seconds=every_s), id=job_id)
        # Published last: `running` turns true only once the jobs are there (another thread reads it to show them).
        self._scheduler = scheduler

    def _follow(self) -> None:
        scheduler, self._scheduler = self._scheduler, None
        if scheduler is not None and scheduler.running:
            scheduler.shutdown(wait=False)

    def _as_leader(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function` as a leader job: skipped when this process can no longer be sure it leads."""

        def job(*args: Any) -> Any:
            if not self.leadership.acting():
                log.info("%s skipped: this server no longer leads", getattr(function, "__name__", "job"))
                return None
            return function(*args)

        job.__name__ = getattr(function, "__name__", "job")
        return job

    def _recover(self) -> None:
        self.service.recover(queued_grace_s=QUEUED_GRACE_S)

    def reload(self) -> None:
        """Make the jobs match the stored settings (after an admin changed them)."""
        scheduler = self._scheduler
        if scheduler is None or not scheduler.running:
            return  # not leading: the leader picks the change up within a check interval
        self._install_round_jobs(scheduler)

    def _install_round_jobs(self, scheduler: Any) -> None:
        from apscheduler.triggers.interval import IntervalTrigger

        settings = get_schedule(self.db)
        self._loaded_at = settings.updated_at
        for job_id in (CRON_JOB, THRESHOLD_JOB):
            if scheduler.get_job(job_id) is not None:
                scheduler.remove_job(job_id)
        if settings.schedule_enabled and settings.cron:
            scheduler.add_job(
                self._as_leader(self.fire_scheduled),
                cron_trigger(settings.cron, self.timezone),
                id=CRON_JOB,
                replace_existing=True,
            )
        if settings.threshold_enabled and settings.corrections_threshold:
            scheduler.add_job(
                self._as_leader(self.check_threshold),
                IntervalTrigger(seconds=self.threshold_check_s),
                id=THRESHOLD_JOB,
                replace_existing=True,
            )

    def _sync(self) -> None:
        if get_schedule(self.db).updated_at != self._loaded_at:
            self.reload()

    def jobs(self) -> dict[str, datetime | None]:
        """The round-starting jobs and when each next runs (for the admin tab)."""
        scheduler = self._scheduler
        if scheduler is None or not scheduler.running:
            return {}
        return {job.id: job.next_run_time for job in scheduler.get_jobs() if job.id in (CRON_JOB, THRESHOLD_JOB)}

    def add_one_off(self, when: datetime, trigger: str = "schedule") -> None:
        """Run one scheduled request at `when` (an admin's "tonight at 2", and how tests fire the cron path quickly)."""
        from apscheduler.triggers.date import DateTrigger

        scheduler = self._scheduler
        if scheduler is None or not scheduler.running:
            raise OrapoError(
                "scheduler_stopped",
                "The round scheduler is not running on this server (another one leads, or none was started).",
            )
        scheduler.add_job(self._as_leader(self._request), DateTrigger(run_date=when), args=[trigger])

    # --- the job functions (called by APScheduler, or directly) ---------------------------------------------

    def fire_scheduled(self) -> RoundRecord | None:
        """The cron job: request a round if the schedule is still enabled."""
        settings = get_schedule(self.db)
        if not (settings.schedule_enabled and settings.cron):
            return None
        return self._request("schedule")

    def check_threshold(self) -> RoundRecord | None:
        """The threshold job: request a round once `corrections_threshold` untrained corrections have accumulated."""
        settings = get_schedule(self.db)
        if not (settings.threshold_enabled and settings.corrections_threshold):
            return None
        if CorrectionRepository(self.db).count_untrained() < settings.corrections_threshold:
            return None
        return self._request("threshold")

    def _request(self, trigger: str) -> RoundRecord | None:
        try:
            return self.service.start_round(trigger=trigger, actor="scheduler", wait=False)
        except OrapoError as exc:
            AuditRepository(self.db).append(
                "round.refused",
                actor="scheduler",
                object_type="training_round",
                details={"trigger": trigger, "code": exc.code, "message": exc.message},
            )
            log.info("scheduled round not started: %s: %s", exc.code, exc.message)
            return None
        except Exception as exc:  # a job must never kill the scheduler thread
            log.error("scheduled round request failed: %s", log_line(exc))
            return None
