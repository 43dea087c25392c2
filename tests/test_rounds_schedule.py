"""The round scheduler: stored cron and threshold settings, APScheduler jobs that fire, refusals audited."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from orapo_core.errors import OrapoError  # noqa: E402


class FakeRounds:
    """Stands in for RoundService: records requests; refuses while `busy`."""

    def __init__(self):
        self.requests = []
        self.busy = False
        self.recovered = self.shut = False

    def start_round(self, *, trigger, actor, wait):
        if self.busy:
            raise OrapoError("round_active", "Round 1 is running; one round runs at a time.")
        self.requests.append((trigger, actor, wait))
        return trigger

    def recover(self):
        self.recovered = True
        return []

    def shutdown(self, cancel=True):
        self.shut = True


def _seed_untrained(db, n):
    from db import CorrectionRepository, StudyRepository, UserRepository
    from db.repositories import split_for

    author = UserRepository(db).create(f"r{n}", "radiologist-pass-1")
    made, k = 0, 0
    while made < n:
        uid = f"uid-{n}-{k}"
        k += 1
        if split_for(uid) != "train":
            continue
        study = StudyRepository(db).create(uid, f"ANON-{k}")
        CorrectionRepository(db).create(study.id, author_id=author.id, text="Findings: Clear lungs.", signed=True)
        made += 1


def test_stored_cron_builds_a_trigger_and_survives_a_restart(database):
    from app.services.rounds.schedule import CRON_JOB, RoundScheduler, cron_trigger, next_run, set_schedule

    with pytest.raises(OrapoError) as exc:
        set_schedule(database, cron="61 2 * * *", schedule_enabled=True)  # five fields, but minute 61
    assert exc.value.code == "invalid_cron"
    set_schedule(database, cron="0 2 * * *", schedule_enabled=True, actor="cli")
    assert next_run("0 2 * * *", datetime(2026, 1, 1, 12, tzinfo=UTC), timezone=UTC) == datetime(
        2026, 1, 2, 2, tzinfo=UTC
    )
    assert cron_trigger("*/15 * * * 1-5")  # the grammar APScheduler accepts

    fake = FakeRounds()
    scheduler = RoundScheduler(database, service=fake, timezone=UTC).start()  # a "restart": reads the stored settings
    try:
        assert fake.recovered
        jobs = scheduler.jobs()
        assert set(jobs) == {CRON_JOB} and jobs[CRON_JOB].hour == 2 and jobs[CRON_JOB].minute == 0
        set_schedule(database, schedule_enabled=False, scheduler=scheduler)
        assert scheduler.jobs() == {}
        set_schedule(database, schedule_enabled=True)  # saved by another process (the CLI): picked up by the sync job
        scheduler._sync()
        assert set(scheduler.jobs()) == {CRON_JOB}
        set_schedule(database, schedule_enabled=False, scheduler=scheduler)
        assert scheduler.fire_scheduled() is None and fake.requests == []  # disabled: the job does nothing
    finally:
        scheduler.shutdown()
    assert fake.shut


def test_a_scheduled_request_fires(database):
    from app.services.rounds.schedule import RoundScheduler, set_schedule

    set_schedule(database, cron="0 2 * * *", schedule_enabled=True)
    fake = FakeRounds()
    scheduler = RoundScheduler(database, service=fake, timezone=UTC).start()
    try:
        assert scheduler.fire_scheduled() == "schedule"  # the cron job's function, called directly
        standing = {job.id for job in scheduler._scheduler.get_jobs()}
        scheduler.add_one_off(datetime.now(UTC) + timedelta(milliseconds=300))  # and through APScheduler
        assert len(scheduler._scheduler.get_jobs()) == len(standing) + 1
        deadline = time.monotonic() + 10
        # done when it has run and APScheduler has removed the spent one-off job (shutting down before that races it):
        # the standing jobs (cron, sync, recovery) stay, so the one-off is whatever job is not one of them
        while time.monotonic() < deadline and (
            len(fake.requests) < 2 or {job.id for job in scheduler._scheduler.get_jobs()} != standing
        ):
            time.sleep(0.05)
        assert fake.requests == [("schedule", "scheduler", False)] * 2
        assert {job.id for job in scheduler._scheduler.get_jobs()} == standing  # the spent one-off is gone
    finally:
        scheduler.shutdown()


def test_threshold_fires_at_the_count_and_a_busy_refusal_is_audited(database):
    from app.services.rounds.schedule import THRESHOLD_JOB, RoundScheduler, set_schedule
    from db import AuditRepository

    set_schedule(database, corrections_threshold=3, threshold_enabled=True)
    fake = FakeRounds()
    scheduler = RoundScheduler(database, service=fake, threshold_check_s=3600).start()
    try:
        assert THRESHOLD_JOB in scheduler.jobs()
        _seed_untrained(database, 2)
        assert scheduler.check_threshold() is None and fake.requests == []
        _seed_untrained(database, 1)
        assert scheduler.check_threshold() == "threshold"
        fake.busy = True
        assert scheduler.check_threshold() is None
        refusal = AuditRepository(database).query(action="round.refused")[0]
        assert refusal.actor_name == "scheduler" and refusal.details["code"] == "round_active"
    finally:
        scheduler.shutdown()


def test_schedule_status_says_when_the_next_round_comes_and_what_waits(database):
    """The Rounds tab's schedule panel, as data: stored settings, the next cron run, the untrained backlog."""
    from app.services.rounds.schedule import CRON_JOB, RoundScheduler, next_run, schedule_status, set_schedule

    _seed_untrained(database, 2)
    off = schedule_status(database)
    assert (off.next_run, off.untrained, off.scheduler_running) == (None, 2, False)

    set_schedule(database, cron="0 2 * * *", schedule_enabled=True, corrections_threshold=5, threshold_enabled=True)
    stopped = schedule_status(database, RoundScheduler(database, service=FakeRounds(), timezone=UTC))
    assert stopped.settings.corrections_threshold == 5 and not stopped.scheduler_running
    assert stopped.next_run == next_run("0 2 * * *")  # no running scheduler: computed from the cron line

    scheduler = RoundScheduler(database, service=FakeRounds(), timezone=UTC, threshold_check_s=3600).start()
    try:
        running = schedule_status(database, scheduler)
        assert running.scheduler_running and running.next_run == scheduler.jobs()[CRON_JOB]
        set_schedule(database, schedule_enabled=False, scheduler=scheduler)
        assert schedule_status(database, scheduler).next_run is None
    finally:
        scheduler.shutdown()
