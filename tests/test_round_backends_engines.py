"""Rounds on real engines: a one-node SLURM (.ci/slurm.sh) and a local Ray head (.ci/ray.sh), each on 127.0.0.1.

The same tiny round as tests/test_rounds_service.py (a tiny random Qwen2-VL,
the smoke recipe with LoRA and two steps, two held-out studies), submitted as
batch jobs or Ray Jobs: to promotion, cancelled mid-training, its training
process killed as an out-of-memory killer would, and watched again by a new
service after the one that submitted it went away. Skipped with a reason
without the clusters (tests.support.clusters), run in CI.
"""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("trl")

from tests.support.clusters import processes_with, require_ray, require_slurm, wait_for
from tests.support.rounds import FAST_TRAINING, SMOKE, seed_study

pytestmark = pytest.mark.slow

LONG_TRAINING = {**FAST_TRAINING, "max_steps": 200}  # long enough to be caught mid-training


@pytest.fixture(params=["slurm", "ray"])
def cluster(request, monkeypatch):
    """The backend settings for one test cluster (skipped without it)."""
    from app.services.rounds.backends import RoundBackendSettings

    if request.param == "slurm":
        monkeypatch.setenv("SLURM_CONF", require_slurm())
        return RoundBackendSettings(
            round_backend="slurm", slurm_partition="debug", slurm_mem="3G", slurm_time="00:10:00", slurm_poll_s=1.0
        )
    return RoundBackendSettings(round_backend="ray", ray_address=require_ray(), ray_poll_s=0.5)


@pytest.fixture
def env(cluster, database, tmp_path, tiny_model, phantom):
    """A data folder, the promoted tiny base version, three signed training studies and two held-out ones."""
    from db import ModelVersionRepository, UserRepository
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", deid_secret="test")
    settings.ensure_dirs()
    admin = UserRepository(database).create("boss", "admin-pass-1", role="admin")
    rad = UserRepository(database).create("rita", "rita-pass-1")
    base = ModelVersionRepository(database).create("tiny-base", base_model_path=str(tiny_model))
    ModelVersionRepository(database).promote(base.id, actor=admin)
    for r in phantom[:3]:
        seed_study(database, settings, r, author=rad)
    for r in phantom[3:5]:
        seed_study(database, settings, r, author=rad, split="holdout")
    return type("Env", (), dict(db=database, settings=settings, admin=admin, base=base, cluster=cluster))


def service(env, **policy):
    from app.services.rounds import RoundPolicy, RoundService
    from app.services.rounds.backends import Backends

    defaults = dict(recipe=SMOKE, min_heldout=1, eval_max_new_tokens=8, poll_s=0.2, cancel_grace_s=10.0)
    return RoundService(
        env.db, env.settings, policy=RoundPolicy(**{**defaults, **policy}), backends=Backends(env.cluster)
    )


def training_job(rounds, round_id, *, running: bool = True):
    """The round's training job as the round stores it, once submitted (and with `running`, once its process runs)."""

    def submitted():
        job = rounds.get_round(round_id).metrics.get("job") or {}
        if job.get("phase") != "training":
            return None
        return job if not running or processes_with("app.cli", "train", str(rounds.round_dir(round_id))) else None

    return wait_for(submitted, 90, "the training job")


def test_a_round_runs_to_promotion_on_the_cluster(env):
    from db import ModelVersionRepository

    rounds = service(env, f1_tolerance=1.0, reward_margin=-1.0)  # a gate any candidate passes
    record = rounds.start_round(actor=env.admin, settings=FAST_TRAINING, wait=True)
    assert record.status == "promoted", (record.error, record.log)
    word = {"slurm": "SLURM job", "ray": "Ray job"}[env.cluster.round_backend]
    assert f"training: {word}" in record.log and f"evaluating: {word}" in record.log
    assert record.metrics["job"]["backend"] == env.cluster.round_backend and record.pid is None
    assert record.metrics["train"]["step"] == 2  # live metrics from metrics.jsonl in the shared folder
    assert "trained:" in rounds.round_details(record.id).log_tail  # the job's output is the round's log
    assert ModelVersionRepository(env.db).promoted().round_id == record.id


def test_cancelling_a_round_stops_its_job_on_the_cluster(env):
    from app.services.rounds.backends import Backends, JobHandle
    from db import CorrectionRepository, ModelVersionRepository

    rounds = service(env)
    record = rounds.start_round(actor=env.admin, settings=LONG_TRAINING, wait=False)
    job = JobHandle.from_dict(training_job(rounds, record.id))
    cancelled = rounds.cancel_round(record.id, actor=env.admin)
    assert cancelled.status == "cancelled" and "boss" in cancelled.error
    backend = Backends(env.cluster).for_job(job)

    def ended_state():
        state = backend.poll(job)
        return None if state.active else state

    ended = wait_for(ended_state, 30, "the job to end")
    assert ended.reason in ("CANCELLED", "STOPPED"), ended
    wait_for(lambda: not processes_with("app.cli", "train", str(rounds.round_dir(record.id))), 30, "its process to go")
    assert ModelVersionRepository(env.db).promoted().id == env.base.id
    assert CorrectionRepository(env.db).count_untrained() == 3


def test_a_killed_job_fails_the_round_with_its_log_and_changes_nothing(env):
    from db import ModelVersionRepository

    rounds = service(env)
    record = rounds.start_round(actor=env.admin, settings=LONG_TRAINING, wait=False)
    training_job(rounds, record.id)
    pids = wait_for(
        lambda: processes_with("app.cli", "train", str(rounds.round_dir(record.id))), 60, "the training process"
    )
    for pid in pids:
        os.kill(pid, signal.SIGKILL)  # what the kernel's out-of-memory killer does
    record = wait_for(
        lambda: rounds.get_round(record.id).status != "running", 60, "the round to end"
    ) and rounds.get_round(record.id)
    assert record.status == "failed" and record.error.startswith("worker_failed: "), record.error
    assert "SIGKILL" in record.error and "Last lines of train.log:" in record.error, record.error
    assert ModelVersionRepository(env.db).promoted().id == env.base.id
    assert len(ModelVersionRepository(env.db).list()) == 1


def test_a_new_app_watches_a_running_job_again_and_the_round_goes_on(env):
    """The app that submitted the job goes away (shutdown); the next one's recover() follows the job to promotion."""
    first = service(env, f1_tolerance=1.0, reward_margin=-1.0)
    record = first.start_round(actor=env.admin, settings=FAST_TRAINING, wait=False)
    job = training_job(first, record.id, running=False)
    first.shutdown()  # a cluster job is left running, not cancelled
    assert first.get_round(record.id).status == "running" and not first.is_running_here(record.id)

    second = service(env, f1_tolerance=1.0, reward_margin=-1.0)
    assert second.recover() == []  # nothing failed: the round is watched again
    assert second.is_running_here(record.id)
    record = second.wait(record.id, timeout=120)
    assert record.status == "promoted", (record.error, record.log)
    assert f"watching {'SLURM' if job['backend'] == 'slurm' else 'Ray'} job {job['id']} (training) again" in record.log
