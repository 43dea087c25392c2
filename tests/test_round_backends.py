"""Round backends as pure logic: the command lines and job scripts they build, the states they read, the stored handle.

No cluster here: SLURM's client commands are a fake `run` answering with the
text the real ones print (scontrol, sacct, sbatch), Ray's client is a fake
with the real `JobSubmissionClient`'s method names. The real engines are in
tests/test_round_backends_engines.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.services.rounds.backends import (
    Backends,
    JobHandle,
    JobSpec,
    JobState,
    RoundBackendSettings,
    cluster_command,
    job_environment,
    stored_job,
)
from orapo_core.errors import OrapoError

TRAIN = [sys.executable, "-m", "app.cli", "train", "--config", "r.yaml", "--max_steps", "2"]


def settings(**values) -> RoundBackendSettings:
    return RoundBackendSettings(**values)


# --- settings and the shared pieces ----------------------------------------------------------------------


def test_the_backend_is_local_by_default_and_read_from_the_environment(monkeypatch):
    for name in ("ORAPO_ROUND_BACKEND", "ORAPO_SLURM_PARTITION", "ORAPO_RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    assert RoundBackendSettings().round_backend == "local"
    assert Backends().current.name == "local"
    monkeypatch.setenv("ORAPO_ROUND_BACKEND", "slurm")
    monkeypatch.setenv("ORAPO_SLURM_PARTITION", "gpu")
    monkeypatch.setenv("ORAPO_SLURM_GPUS", "2")
    read = RoundBackendSettings()
    assert (read.round_backend, read.slurm_partition, read.slurm_gpus) == ("slurm", "gpu", 2)
    assert Backends(read).current.name == "slurm"
    monkeypatch.setenv("ORAPO_ROUND_BACKEND", "kubernetes")
    with pytest.raises(ValueError):
        RoundBackendSettings()


def test_every_backend_setting_has_help_and_is_documented():
    root = Path(__file__).resolve().parents[1]
    pages = root / "docs" / "pages"
    text = "".join(
        (pages / name).read_text() for name in ("reference/configuration.md", "deploy/scaling-out-backends.md")
    )
    for name, field in RoundBackendSettings.model_fields.items():
        assert field.description, name
        assert f"ORAPO_{name.upper()}" in text, f"ORAPO_{name.upper()} is not documented"


def test_a_cluster_runs_the_same_command_with_its_python_and_the_launcher_before_training_only():
    assert cluster_command(TRAIN, "training", settings()) == TRAIN
    launcher = "accelerate launch --config_file orapo_core/train/recipes/accelerate_zero2.yaml --num_processes 2"
    s = settings(round_launcher=launcher, round_python="/shared/orapo/.venv/bin/python")
    assert cluster_command(TRAIN, "training", s) == [
        *launcher.split(),
        "-m",
        "app.cli",
        "train",
        "--config",
        "r.yaml",
        "--max_steps",
        "2",
    ]
    evaluate = [sys.executable, "-m", "app.cli", "rounds", "worker", "evaluate", "spec.json", "out.json"]
    assert cluster_command(evaluate, "evaluating", s) == ["/shared/orapo/.venv/bin/python", *evaluate[1:]]


def test_a_cluster_job_gets_no_database_url_and_no_secret():
    env = job_environment(
        {"EXTRA": "1"},
        environ={
            "ORAPO_DATABASE_URL": "postgresql://u:pw@db/x",
            "ORAPO_DEID_SECRET": "s",
            "ORAPO_DICOMWEB_PASSWORD": "p",
            "ORAPO_DATA_DIR": "/shared/data",
            "PATH": "/usr/bin",
        },
    )
    assert "ORAPO_DATABASE_URL" not in env and "ORAPO_DEID_SECRET" not in env and "ORAPO_DICOMWEB_PASSWORD" not in env
    assert env["ORAPO_DATA_DIR"] == "/shared/data" and env["EXTRA"] == "1" and env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(Path(__file__).resolve().parents[1])


def test_the_stored_job_is_the_cluster_handle_or_a_live_local_pid():
    cluster = SimpleNamespace(metrics={"job": JobHandle("slurm", "42", "training", "/r/train.log").to_dict()}, pid=None)
    assert stored_job(cluster) == JobHandle("slurm", "42", "training", "/r/train.log")
    local = SimpleNamespace(metrics={"job": JobHandle("local", "999", "training").to_dict()}, pid=None)
    assert stored_job(local) is None  # the child ended (pid cleared): a reused pid is never signalled
    assert stored_job(SimpleNamespace(metrics={}, pid=77)) == JobHandle("local", "77")  # rows from before backends
    assert JobHandle.from_dict(None) is None and JobHandle("local", "5").pid == 5 and JobHandle("ray", "x").pid is None


def test_the_local_backend_runs_a_child_and_reports_its_exit_code(tmp_path):
    backend = Backends(settings()).of("local")
    job = backend.submit(
        JobSpec([sys.executable, "-c", "print('hello'); raise SystemExit(3)"], tmp_path / "x.log", "training", 1)
    )
    assert job.backend == "local" and job.pid
    for _ in range(200):
        state = backend.poll(job)
        if not state.active:
            break
        import time

        time.sleep(0.05)
    assert state == JobState("finished", 3) and not state.ok and state.describe() == "the worker exited with status 3"
    assert "hello" in backend.log_tail(job, None)
    assert backend.poll(JobHandle("local", str(2**22 + 12345))).status == "gone"


# --- SLURM --------------------------------------------------------------------------------------------


class FakeSlurm:
    """`subprocess.run` for sbatch/scontrol/sacct/scancel, answering as SLURM 22.05 does."""

    def __init__(self, *, scontrol: str = "", scontrol_err: str = "", sacct: str | None = None, sbatch: str = "4711\n"):
        self.calls: list[list[str]] = []
        self.envs: list[dict | None] = []
        self.scontrol, self.scontrol_err, self.sacct, self.sbatch = scontrol, scontrol_err, sacct, sbatch

    def __call__(self, argv, **kwargs):
        self.calls.append(list(argv))
        self.envs.append(kwargs.get("env"))
        tool = argv[0]
        if tool == "sbatch":
            return subprocess.CompletedProcess(
                argv,
                0 if self.sbatch.strip()[:1].isdigit() else 1,
                self.sbatch if self.sbatch.strip()[:1].isdigit() else "",
                self.sbatch,
            )
        if tool == "scontrol":
            return subprocess.CompletedProcess(argv, 0 if self.scontrol else 1, self.scontrol, self.scontrol_err)
        if tool == "sacct":
            if self.sacct is None:
                return subprocess.CompletedProcess(argv, 1, "", "Slurm accounting storage is disabled\n")
            return subprocess.CompletedProcess(argv, 0, self.sacct, "")
        return subprocess.CompletedProcess(argv, 0, "", "")


def scontrol_line(state: str, exit_code: str = "0:0", reason: str = "None") -> str:
    return (
        f"JobId=4711 JobName=orapo-round-3-training UserId=orapo(1000) JobState={state} Reason={reason} "
        f"Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 ExitCode={exit_code} RunTime=00:01:02 "
        f"Partition=gpu NodeList=gpu-01 StdOut=/shared/data/rounds/3/train.log\n"
    )


def slurm(fake: FakeSlurm, **values):
    from app.services.rounds.backends.slurm import SlurmBackend

    clock = SimpleNamespace(t=0.0)
    backend = SlurmBackend(settings(**values), run=fake, clock=lambda: clock.t)
    return backend, clock


def test_sbatch_gets_a_job_script_with_the_resources_and_the_same_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ORAPO_DATABASE_URL", "postgresql://u:pw@db/x")
    fake = FakeSlurm(sbatch="4711;cluster-a\n")
    backend, _ = slurm(
        fake,
        slurm_partition="gpu",
        slurm_gpus=1,
        slurm_time="04:00:00",
        slurm_mem="64G",
        slurm_cpus=8,
        slurm_args="--account=radiology --qos=normal",
        round_launcher="accelerate launch --num_processes 1",
    )
    job = backend.submit(JobSpec(TRAIN, tmp_path / "train.log", "training", 3))
    assert job == JobHandle("slurm", "4711", "training", str(tmp_path / "train.log"))
    argv = fake.calls[0]
    assert argv[:4] == ["sbatch", "--parsable", "--account=radiology", "--qos=normal"]
    script = Path(argv[-1]).read_text()
    assert Path(argv[-1]) == tmp_path / "jobs" / "training.sbatch"
    for line in (
        "#SBATCH --job-name=orapo-round-3-training",
        f"#SBATCH --output={tmp_path / 'train.log'}",
        "#SBATCH --open-mode=append",
        "#SBATCH --partition=gpu",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --time=04:00:00",
        "#SBATCH --mem=64G",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --no-requeue",
        "exec accelerate launch --num_processes 1 -m app.cli train --config r.yaml --max_steps 2",
    ):
        assert line in script.splitlines(), line
    assert "ORAPO_DATABASE_URL" not in fake.envs[0]  # sbatch exports its environment to the job: no secrets in it


def test_a_refused_submission_is_an_error_with_slurms_sentence(tmp_path):
    backend, _ = slurm(FakeSlurm(sbatch="sbatch: error: invalid partition specified: gpu\n"))
    with pytest.raises(OrapoError) as exc:
        backend.submit(JobSpec(TRAIN, tmp_path / "train.log", "training", 3))
    assert exc.value.code == "slurm_submit_failed" and "invalid partition specified: gpu" in exc.value.message


@pytest.mark.parametrize(
    ("state", "exit_code", "status", "code", "said"),
    [
        ("PENDING", "0:0", "running", None, ""),
        ("RUNNING", "0:0", "running", None, ""),
        ("COMPLETING", "0:0", "running", None, ""),
        ("COMPLETED", "0:0", "finished", 0, ""),
        ("FAILED", "3:0", "finished", 3, "SLURM job 4711 failed: the worker exited with status 3"),
        ("FAILED", "0:9", "finished", -9, "SLURM job 4711 failed: the worker was killed by SIGKILL"),
        ("OUT_OF_MEMORY", "0:125", "finished", -125, "ran out of memory (OUT_OF_MEMORY)"),
        ("TIMEOUT", "0:0", "finished", 1, "reached its time limit (TIMEOUT)"),
        ("PREEMPTED", "0:0", "finished", 1, "was pre-empted"),
        ("NODE_FAIL", "0:0", "finished", 1, "lost its node"),
        ("CANCELLED", "0:15", "finished", -15, "was cancelled outside the app"),
    ],
)
def test_slurm_states_map_to_the_rounds_outcomes(state, exit_code, status, code, said):
    from app.services.rounds.backends.slurm import job_state

    found = job_state("4711", state, exit_code)
    assert found.status == status and found.exit_code == code
    assert said in found.describe() if said else True
    assert found.ok == (state == "COMPLETED")


def test_a_job_killed_for_its_memory_by_the_sampler_reads_as_out_of_memory():
    from app.services.rounds.backends.slurm import job_state

    log = "slurmstepd-gpu-01: error: StepId=12.batch exceeded memory limit (424300544 > 52428800), being killed\n"
    assert job_state("12", "FAILED", "0:9", log_tail=log).reason == "OUT_OF_MEMORY"
    assert job_state("12", "FAILED", "0:9", log_tail="Killed\n").reason == "FAILED"


def test_scontrol_then_sacct_then_gone_and_slurmctld_is_asked_at_most_every_poll_interval(tmp_path):
    fake = FakeSlurm(scontrol=scontrol_line("RUNNING"))
    backend, clock = slurm(fake, slurm_poll_s=10)
    job = JobHandle("slurm", "4711", "training", str(tmp_path / "train.log"))
    assert backend.poll(job).status == "running"
    clock.t = 5.0
    assert backend.poll(job).status == "running" and len(fake.calls) == 1  # answered from the last question
    fake.scontrol = scontrol_line("TIMEOUT", "0:0", "TimeLimit")
    clock.t = 10.5
    ended = backend.poll(job)
    assert ended.reason == "TIMEOUT" and ended.status == "finished" and len(fake.calls) == 2
    clock.t = 100.0
    assert backend.poll(job) == ended and len(fake.calls) == 2  # an ended job is never asked about again

    purged = JobHandle("slurm", "4712", "training")
    fake.scontrol, fake.scontrol_err = "", "slurm_load_jobs error: Invalid job id specified\n"
    fake.sacct = "OUT_OF_MEMORY|0:125|None\n"
    assert backend.poll(purged).reason == "OUT_OF_MEMORY"
    fake.sacct = None  # no accounting, and slurmctld forgot it
    assert backend.poll(JobHandle("slurm", "4713", "training")).status == "gone"
    fake.scontrol_err = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"
    assert backend.poll(JobHandle("slurm", "4714", "training")).status == "unknown"  # not gone: slurmctld may be back


def test_cancel_is_scancel_and_waits_for_the_job_to_end(tmp_path):
    fake = FakeSlurm(scontrol=scontrol_line("CANCELLED", "0:15"))
    backend, _ = slurm(fake)
    backend.cancel(JobHandle("slurm", "4711", "training"), grace_s=5)
    assert fake.calls[0] == ["scancel", "4711"] and fake.calls[1][:3] == ["scontrol", "show", "job"]


def test_missing_slurm_commands_are_an_error_not_a_traceback(tmp_path):
    from app.services.rounds.backends.slurm import SlurmBackend

    def missing(argv, **kwargs):
        raise FileNotFoundError(argv[0])

    with pytest.raises(OrapoError) as exc:
        SlurmBackend(settings(), run=missing).submit(JobSpec(TRAIN, tmp_path / "train.log", "training", 3))
    assert exc.value.code == "slurm_unavailable"


# --- Ray ----------------------------------------------------------------------------------------------


class FakeRayClient:
    """The methods of ray.job_submission.JobSubmissionClient a round uses."""

    def __init__(self):
        self.submitted: list[dict] = []
        self.stopped: list[str] = []
        self.info = SimpleNamespace(status="RUNNING", driver_exit_code=None, message="")
        self.logs = ""

    def submit_job(self, **kwargs):
        self.submitted.append(kwargs)
        return kwargs["submission_id"]

    def get_job_info(self, job_id):
        if self.info is None:
            raise RuntimeError(f"Request failed with status code 404: Job {job_id} does not exist.")
        return self.info

    def get_job_logs(self, job_id):
        return self.logs

    def stop_job(self, job_id):
        self.stopped.append(job_id)
        self.info = SimpleNamespace(status="STOPPED", driver_exit_code=-15, message="Job was intentionally stopped.")
        return True


def test_a_ray_job_runs_the_same_command_from_the_checkout_with_the_apps_settings_less_secrets(tmp_path, monkeypatch):
    from app.services.rounds.backends.ray import RayBackend

    monkeypatch.setenv("ORAPO_DATA_DIR", "/shared/data")
    monkeypatch.setenv("ORAPO_DATABASE_URL", "postgresql://u:pw@db/x")
    client = FakeRayClient()
    backend = RayBackend(
        settings(ray_address="http://head:8265", ray_gpus=1, round_launcher="accelerate launch"), client=client
    )
    job = backend.submit(JobSpec(TRAIN, tmp_path / "train.log", "training", 3))
    sent = client.submitted[0]
    root = Path(__file__).resolve().parents[1]
    assert sent["entrypoint"] == f"cd {root} && exec accelerate launch -m app.cli train --config r.yaml --max_steps 2"
    assert sent["entrypoint_num_gpus"] == 1 and job.id == sent["submission_id"].strip()
    assert job.id.startswith("orapo-round-3-training-") and sent["metadata"]["orapo_round"] == "3"
    env = sent["runtime_env"]["env_vars"]
    assert env["ORAPO_DATA_DIR"] == "/shared/data" and "ORAPO_DATABASE_URL" not in env and "PATH" not in env


def test_ray_states_logs_and_stop(tmp_path):
    from app.services.rounds.backends.ray import RayBackend, job_state

    client = FakeRayClient()
    backend = RayBackend(settings(ray_address="http://head:8265", ray_poll_s=0.001), client=client)
    log = tmp_path / "train.log"
    job = JobHandle("ray", "orapo-round-3-training-ab", "training", str(log))
    client.logs = "step 1\n"
    assert backend.poll(job).status == "running"
    client.logs = "step 1\nstep 2\n"
    import time

    time.sleep(0.01)
    backend.poll(job)
    assert log.read_text() == "step 1\nstep 2\n"  # what is new of Ray's log, appended once
    backend.cancel(job, grace_s=1)
    assert client.stopped == [job.id] and backend.poll(job).status == "finished"
    assert "stopped outside the app" in backend.poll(job).describe()
    assert job_state("j", "SUCCEEDED", 0).ok
    failed = job_state("j", "FAILED", -9, "Job entrypoint command failed with exit code -9")
    assert failed.exit_code == -9 and "killed by SIGKILL" in failed.describe()
    assert (
        job_state("j", "FAILED", None, "Job supervisor actor died").describe()
        == "Ray job j failed: Job supervisor actor died"
    )
    client.info = None
    assert RayBackend(settings(ray_address="http://head:8265"), client=client).poll(job).status == "gone"


def test_ray_without_an_address_is_an_error_that_names_the_setting():
    from app.services.rounds.backends.ray import RayBackend

    with pytest.raises(OrapoError) as exc:
        _ = RayBackend(settings()).client
    assert exc.value.code == "ray_unavailable" and "ORAPO_RAY_ADDRESS" in exc.value.message


# --- the round's watch, on a fake backend ---------------------------------------------------------------


class ScriptedBackend:
    """A backend whose jobs end as the test says (how the round reacts, without processes)."""

    name = "slurm"
    poll_s = 0.0

    def __init__(self, states):
        self.states = list(states)
        self.cancelled: list[JobHandle] = []

    def submit(self, spec):
        return JobHandle("slurm", "7", spec.phase, str(spec.log_path))

    def poll(self, job):
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def cancel(self, job, *, grace_s=10.0):
        self.cancelled.append(job)

    def log_tail(self, job, log_path, lines=15):
        return "Traceback...\nRuntimeError: CUDA out of memory"


def test_a_cluster_failure_fails_the_round_with_the_jobs_ending_and_log_tail(database, tmp_path):
    from app.services.rounds.backends.slurm import job_state
    from app.services.rounds.plan import RunningRound
    from app.services.rounds.watch import RoundWatch
    from db import RoundRepository

    rounds = RoundRepository(database)
    record = rounds.create(trigger="manual", config={})
    rounds.transition(record.id, "running")
    backend = ScriptedBackend([JobState("running"), job_state("7", "OUT_OF_MEMORY", "0:125")])
    watch = RoundWatch(database, Backends(settings(), current=backend))
    plan = SimpleNamespace(
        round_id=record.id,
        round_dir=tmp_path,
        policy=SimpleNamespace(poll_s=0, cancel_grace_s=1),
        to_dict=lambda: {"round_id": record.id},
    )
    run = RunningRound(plan)
    ended = watch.child(run, ["orapo", "train"], tmp_path / "train.log", phase="training")
    assert not ended.ok and ended.reason == "OUT_OF_MEMORY"
    stored = rounds.get(record.id)
    assert stored.metrics["job"] == {
        "backend": "slurm",
        "id": "7",
        "phase": "training",
        "log_path": str(tmp_path / "train.log"),
    }
    assert stored.pid is None and (tmp_path / "plan.json").is_file()
    watch.fail(run, "worker_failed", watch.failure(run.job, ended, tmp_path / "train.log"))
    error = rounds.get(record.id).error
    assert error.startswith("worker_failed: SLURM job 7 ran out of memory") and "CUDA out of memory" in error

    # a cancel while the job runs: the backend is asked to stop it, and the step returns None
    again = rounds.create(trigger="manual", config={})
    rounds.transition(again.id, "running")
    backend.states = [JobState("running")]
    run = RunningRound(SimpleNamespace(**{**vars(plan), "round_id": again.id}))
    run.cancel.set()
    assert watch.child(run, ["orapo", "train"], tmp_path / "train.log", phase="training") is None
    assert backend.cancelled and backend.cancelled[-1].id == "7"
