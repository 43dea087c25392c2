"""Training rounds, model versions (one promoted at a time, rollback), schedule settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from db.database import Database
from db.models import ModelVersion
from db.repositories import (
    ROUND_TRANSITIONS,
    AuditRepository,
    ModelVersionRepository,
    RoundRepository,
    ScheduleRepository,
    UserRepository,
)
from orapo_core.errors import OrapoError


def test_round_lifecycle(database: Database) -> None:
    admin = UserRepository(database).create("root", "root-password", role="admin")
    rounds = RoundRepository(database)
    r = rounds.create(trigger="threshold", config={"lr": 1e-5}, started_by=admin.id, actor=admin)
    assert (r.status, r.trigger, r.progress, r.started_at, r.finished_at) == ("queued", "threshold", 0.0, None, None)
    assert [x.id for x in rounds.active()] == [r.id]
    with pytest.raises(OrapoError) as refused:
        rounds.update_progress(r.id, 0.5)
    assert refused.value.code == "round_not_running"

    running = rounds.transition(r.id, "running")
    assert running.started_at is not None and running.finished_at is None
    rounds.set_process(r.id, pid=4242, output_dir="rounds/1")
    rounds.update_progress(r.id, 0.4, log_append="step 10\n", metrics={"loss": 0.7})
    progressed = rounds.update_progress(r.id, 1.7, log_append="step 20\n", metrics={"facts_reward": 0.3})
    assert progressed.progress == 1.0 and progressed.log == "step 10\nstep 20\n"
    assert progressed.metrics == {"loss": 0.7, "facts_reward": 0.3} and progressed.pid == 4242

    done = rounds.transition(r.id, "succeeded", metrics={"eval_f1": 0.5})
    assert done.finished_at is not None and done.metrics["eval_f1"] == 0.5 and done.config == {"lr": 1e-5}
    assert rounds.active() == []
    assert [x.id for x in rounds.list(status="succeeded")] == [r.id]
    with pytest.raises(OrapoError) as refused:
        rounds.transition(r.id, "running")
    assert refused.value.code == "invalid_transition"

    failed = rounds.create()
    rounds.transition(failed.id, "running")
    assert rounds.transition(failed.id, "failed", error="CUDA out of memory").error == "CUDA out of memory"
    cancelled = rounds.create(trigger="schedule")
    rounds.transition(cancelled.id, "cancelled")
    assert [x.id for x in rounds.list()] == [cancelled.id, failed.id, r.id]
    assert {x.id for x in rounds.list(status=["failed", "cancelled"])} == {failed.id, cancelled.id}
    assert [e.action for e in AuditRepository(database).query(object_type="training_round", object_id=r.id)] == [
        "round.succeeded",
        "round.running",
        "round.create",
    ]
    for bad in (dict(trigger="whim"),):
        with pytest.raises(OrapoError):
            rounds.create(**bad)


def test_every_terminal_status_is_final() -> None:
    assert {s for s, nxt in ROUND_TRANSITIONS.items() if not nxt} == {"failed", "cancelled", "rejected", "promoted"}


def test_one_promoted_version_at_a_time_and_rollback(database: Database) -> None:
    versions, rounds = ModelVersionRepository(database), RoundRepository(database)
    assert versions.promoted() is None
    starter = versions.create("starter", base_model_path="models/starter")
    r = rounds.create()
    rounds.transition(r.id, "running")
    rounds.transition(r.id, "succeeded")
    tuned = versions.create(
        "round-1",
        base_model_path="models/starter",
        adapter_path="rounds/1/adapter",
        parent_id=starter.id,
        round_id=r.id,
        study_ids_seen=[3, 1, 3],
        metrics={"f1": 0.4},
    )
    assert tuned.status == "candidate" and tuned.study_ids_seen == [1, 3]

    versions.promote(starter.id)
    promoted = versions.promote(tuned.id, reason="better F1", actor="admin")
    assert versions.promoted() == promoted and promoted.reason == "better F1"
    assert versions.get(starter.id).status == "retired"
    assert rounds.get(r.id).status == "promoted"

    rolled_back = versions.promote(starter.id, reason="rollback")  # promote an older one
    assert versions.promoted() == rolled_back
    assert versions.get(tuned.id).status == "retired"
    assert [v.id for v in versions.list(status="promoted")] == [starter.id]
    assert versions.promote(starter.id) == versions.get(starter.id)  # promoting the promoted one is a no-op
    assert len(versions.list(status="promoted")) == 1
    promote_log = AuditRepository(database).query(action="version.promote")
    assert [e.details.get("retired") for e in promote_log][:2] == [[tuned.id], [starter.id]]


def test_rejected_versions_stay_rejected(database: Database) -> None:
    versions, rounds = ModelVersionRepository(database), RoundRepository(database)
    r = rounds.create()
    rounds.transition(r.id, "running")
    rounds.transition(r.id, "succeeded")
    v = versions.create("round-1", base_model_path="m", round_id=r.id)
    assert versions.reject(v.id, reason="worse on holdout").status == "rejected"
    assert rounds.get(r.id).status == "rejected"
    for action in (versions.promote, versions.reject):
        with pytest.raises(OrapoError):
            action(v.id)
    assert versions.promoted() is None
    with pytest.raises(OrapoError) as refused:
        versions.promote(424242)
    assert refused.value.code == "version_not_found"


def test_database_refuses_a_second_promoted_version(database: Database) -> None:
    """The partial unique index stands behind `promote` even for code that bypasses it."""
    versions = ModelVersionRepository(database)
    versions.promote(versions.create("a", base_model_path="m").id)
    b = versions.create("b", base_model_path="m")
    with pytest.raises(sa.exc.IntegrityError):
        with database.session() as session:
            session.get(ModelVersion, b.id).status = "promoted"
    assert [v.name for v in versions.list(status="promoted")] == ["a"]


def test_schedule_settings_survive_a_restart(database: Database, tmp_path: Path) -> None:
    assert ScheduleRepository(database).get().schedule_enabled is False
    admin = UserRepository(database).create("root", "root-password", role="admin")
    saved = ScheduleRepository(database).update(
        cron="0 2 * * *", schedule_enabled=True, corrections_threshold=50, actor=admin
    )
    assert (saved.cron, saved.schedule_enabled, saved.corrections_threshold, saved.threshold_enabled) == (
        "0 2 * * *",
        True,
        50,
        False,
    )
    assert saved.updated_by == admin.id

    restarted = Database(database.url)  # a new process would build a new engine from the same URL
    try:
        assert ScheduleRepository(restarted).get() == saved
        changed = ScheduleRepository(restarted).update(threshold_enabled=True)
        assert (changed.cron, changed.threshold_enabled, changed.corrections_threshold) == ("0 2 * * *", True, 50)
    finally:
        restarted.dispose()
    for kwargs in (
        dict(cron="every night"),
        dict(corrections_threshold=0),
        dict(cron=None),
        dict(corrections_threshold=None),
    ):
        with pytest.raises(OrapoError):
            ScheduleRepository(database).update(**kwargs)
    assert ScheduleRepository(database).get().threshold_enabled is True
    assert len(AuditRepository(database).query(action="schedule.update")) == 2


def test_repositories_share_a_callers_transaction(database: Database) -> None:
    """Built on a session, several repositories commit or roll back together."""
    with pytest.raises(OrapoError):
        with database.session() as session:
            UserRepository(session).create("temp", "temp-password")
            RoundRepository(session).create(trigger="nonsense")
    assert UserRepository(database).list() == []
    with database.session() as session:
        user = UserRepository(session).create("kept", "kept-password")
        RoundRepository(session).create(started_by=user.id)
    assert [u.username for u in UserRepository(database).list()] == ["kept"]
    assert len(RoundRepository(database).list()) == 1


def test_a_reason_given_by_hand_is_added_after_the_gates_never_over_it(database: Database) -> None:
    """Issue 41 §8: a promote/rollback reason used to overwrite the gate's text in the versions table."""
    versions = ModelVersionRepository(database)
    base = versions.create("base", base_model_path="m")
    tuned = versions.create("round-1", base_model_path="m", parent_id=base.id)
    versions.promote(tuned.id, reason="promoted by the gate: macro-F1 0.47 against 0.44")
    versions.promote(base.id, reason="rolled back: over-calls pneumothorax")
    again = versions.promote(tuned.id, reason="fixed upstream")
    assert again.reason == ("promoted by the gate: macro-F1 0.47 against 0.44 — then: fixed upstream")
    assert versions.get(base.id).reason == "rolled back: over-calls pneumothorax"
    assert versions.promote(tuned.id, reason="fixed upstream").reason == again.reason  # no repeat
