"""Training rounds end to end: seeded corrections, a real `orapo train` child, the held-out gate, versions.

Each round test runs on a real SQLite file and, with ORAPO_TEST_POSTGRES_URL,
on PostgreSQL (the `database` fixture, tests/conftest.py). The served model is a tiny random
Qwen2-VL registered as the promoted base version; training is the smoke recipe
with a LoRA adapter and two steps, so a whole round takes seconds.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")

from orapo_core.errors import OrapoError
from orapo_core.facts.metrics import EvalMetrics
from tests.support.rounds import FAST_TRAINING, SMOKE, seed_study


@pytest.fixture
def env(database, tmp_path, tiny_model, phantom):
    """A data folder, the promoted tiny base version, three signed training studies and two held-out ones."""
    from db import ModelVersionRepository, UserRepository
    from orapo_core.config import Settings

    settings = Settings(data_dir=tmp_path / "data", deid_secret="test")
    settings.ensure_dirs()
    admin = UserRepository(database).create("boss", "admin-pass-1", role="admin")
    rad = UserRepository(database).create("rita", "rita-pass-1")
    base = ModelVersionRepository(database).create("tiny-base", base_model_path=str(tiny_model))
    ModelVersionRepository(database).promote(base.id, actor=admin)
    train = [seed_study(database, settings, r, author=rad)[0] for r in phantom[:3]]
    held = [seed_study(database, settings, r, author=rad, split="holdout")[0] for r in phantom[3:5]]
    return type(
        "Env",
        (),
        dict(db=database, settings=settings, admin=admin, rad=rad, base=base, train=train, held=held, phantom=phantom),
    )


def service(env, **policy):
    from app.services.rounds import RoundPolicy, RoundService

    defaults = dict(recipe=SMOKE, min_heldout=1, eval_max_new_tokens=8, poll_s=0.2, cancel_grace_s=3.0)
    return RoundService(env.db, env.settings, policy=RoundPolicy(**{**defaults, **policy}))


@pytest.mark.slow
def test_round_from_corrections_to_promoted_version_with_real_evaluation(env):
    from db import AuditRepository, CorrectionRepository, ModelVersionRepository, PairRepository

    rounds = service(env, f1_tolerance=1.0, reward_margin=-1.0)  # a gate any candidate passes
    record = rounds.start_round(actor=env.admin, settings=FAST_TRAINING, wait=True)
    assert record.status == "promoted", (record.error, record.log)
    assert record.progress == 1.0 and record.pid is None
    details = rounds.round_details(record.id)
    assert any("rewards/facts_reward/mean" in step for step in details.metrics_history)
    assert record.metrics["train"]["step"] == 2 and "loss" in record.metrics["train"]
    assert "trained:" in details.log_tail
    assert record.metrics["heldout"]["source"] == "holdout_studies" and record.metrics["heldout"]["n"] == 2
    # the gate drafted both models as the app drafts (ORAPO_DRAFT_MIN_AGREEMENT), and the plan says so
    import json

    folder = env.settings.rounds_dir / str(record.id)
    assert json.loads((folder / "plan.json").read_text())["draft_min_agreement"] == env.settings.draft_min_agreement
    assert json.loads((folder / "eval_spec.json").read_text())["min_agreement"] == env.settings.draft_min_agreement

    version = ModelVersionRepository(env.db).promoted()
    assert version is not None and version == details.version and version.round_id == record.id
    assert version.parent_id == env.base.id and version.created_by == env.admin.id
    assert version.config["started_by"] == "boss" and version.config["trigger"] == "manual"
    assert version.study_ids_seen == sorted(s.id for s in env.train)  # never a held-out study
    assert version.base_model_path == env.base.base_model_path
    adapter = env.settings.resolved_data_dir / version.adapter_path
    assert adapter == env.settings.models_dir / "versions" / f"round-{record.id}"
    assert (adapter / "adapter_model.safetensors").is_file()
    heldout = EvalMetrics.from_dict(version.metrics["heldout"])
    assert heldout.macro_f1_14 is not None and heldout.facts_reward_mean is not None
    assert heldout.to_dict() == version.metrics["heldout"]  # stored under the metrics' own names
    assert version.config["overrides"]["max_steps"] == 2 and version.config["resolved"]["training"]["max_steps"] == 2
    assert ModelVersionRepository(env.db).get(env.base.id).status == "retired"

    assert CorrectionRepository(env.db).count_untrained() == 0
    assert {p.round_id for p in PairRepository(env.db).list()} == {record.id}
    # The adapter the service saved loads and drafts.
    from orapo_core.models.draft import Drafter

    drafter = Drafter.from_dir(version.base_model_path, adapter)
    from PIL import Image

    assert isinstance(drafter.draft(Image.new("L", (64, 64)), samples=0, max_new_tokens=4).text, str)

    with pytest.raises(OrapoError) as exc:  # nothing new to train on
        rounds.request_round(actor=env.admin)
    assert exc.value.code == "nothing_to_train"

    rolled = rounds.rollback(actor=env.admin)  # default target: the parent
    assert rolled.id == env.base.id and ModelVersionRepository(env.db).promoted().id == env.base.id
    assert AuditRepository(env.db).query(action="version.rollback")[0].object_id == str(env.base.id)
    assert rounds.rollback(version.id, actor=env.admin).id == version.id  # and forward again, one action


@pytest.mark.slow
def test_worse_candidate_is_kept_as_rejected_with_its_numbers(env):
    from db import CorrectionRepository, ModelVersionRepository

    # FactS reward must rise by more than 1.0: impossible for a reward in [0, 1]; real evaluation, in-process.
    rounds = service(env, reward_margin=1.0, evaluate_in_subprocess=False)
    record = rounds.start_round(actor=env.admin, settings=FAST_TRAINING, wait=True)
    assert record.status == "rejected", (record.error, record.log)
    version = rounds.round_details(record.id).version
    assert version.status == "rejected" and "FactS reward" in version.reason
    assert EvalMetrics.from_dict(version.metrics["gate"]["candidate"]).facts_reward_mean is not None
    assert ModelVersionRepository(env.db).promoted().id == env.base.id  # the served model is unchanged
    assert CorrectionRepository(env.db).count_untrained() == 0  # used by the round, replayable later
    with pytest.raises(OrapoError) as exc:
        rounds.promote_version(version.id, actor=env.admin)
    assert exc.value.code == "version_rejected"


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_killed_worker_fails_the_round_and_changes_nothing(env):
    from db import CorrectionRepository, ModelVersionRepository, PairRepository

    rounds = service(env)
    record = rounds.start_round(actor=env.admin, settings=FAST_TRAINING, wait=False)
    with pytest.raises(OrapoError) as exc:  # one round at a time
        rounds.start_round(actor=env.admin, settings=FAST_TRAINING)
    assert exc.value.code == "round_active" and f"Round {record.id}" in exc.value.message
    pid = _wait_for(lambda: rounds.get_round(record.id).pid)
    os.killpg(pid, signal.SIGKILL)  # what the kernel's OOM killer does
    record = rounds.wait(record.id, timeout=60)
    assert record.status == "failed" and "SIGKILL" in record.error, record.error
    assert ModelVersionRepository(env.db).promoted().id == env.base.id
    assert len(ModelVersionRepository(env.db).list()) == 1
    assert CorrectionRepository(env.db).count_untrained() == 3
    assert all(p.round_id is None for p in PairRepository(env.db).list())
    # The service still answers, and the next round can start (and be cancelled).
    again = rounds.start_round(actor=env.admin, settings=FAST_TRAINING, wait=False)
    _wait_for(lambda: rounds.get_round(again.id).pid)
    cancelled = rounds.cancel_round(again.id, actor=env.admin)
    assert cancelled.status == "cancelled" and "boss" in cancelled.error
    assert not rounds.is_running_here(again.id)
    assert CorrectionRepository(env.db).count_untrained() == 3


def test_two_racing_requests_start_one_round(env):
    rounds_a, rounds_b = service(env), service(env)  # e.g. the app and the CLI
    barrier = threading.Barrier(2)
    outcomes = []

    def request(svc):
        barrier.wait()
        try:
            outcomes.append(svc.request_round(actor="cli"))
        except OrapoError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=request, args=(s,)) for s in (rounds_a, rounds_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    started = [o for o in outcomes if not isinstance(o, OrapoError)]
    refused = [o for o in outcomes if isinstance(o, OrapoError)]
    assert len(started) == 1 and len(refused) == 1 and refused[0].code == "round_active"
    assert [r.id for r in rounds_a.list_rounds(status=["queued", "running"])] == [started[0].id]


def test_stale_running_round_is_failed_at_start(env):
    from db import RoundRepository

    rounds = RoundRepository(env.db)
    stale = rounds.create(trigger="manual", config={})
    rounds.transition(stale.id, "running")
    rounds.set_process(stale.id, pid=2**22 + 12345)  # no such process
    recovered = service(env).recover()
    assert [r.id for r in recovered] == [stale.id]
    assert rounds.get(stale.id).status == "failed" and "worker_gone" in rounds.get(stale.id).error

    with pytest.raises(OrapoError) as exc:
        service(env).request_round(resume_from=stale.id)
    assert exc.value.code == "no_checkpoint"
    checkpoint = env.settings.rounds_dir / str(stale.id) / "output" / "checkpoint-10"
    (checkpoint.parent / "checkpoint-2").mkdir(parents=True)
    checkpoint.mkdir()
    resumed = service(env).request_round(resume_from=stale.id)
    assert resumed.config["overrides"]["resume_from_checkpoint"] == str(checkpoint)


def test_managed_and_unknown_settings_are_refused(env):
    rounds = service(env)
    with pytest.raises(OrapoError) as exc:
        rounds.request_round(settings={"output_dir": "/tmp/x"})
    assert exc.value.code == "managed_setting"
    with pytest.raises(OrapoError) as exc:
        rounds.request_round(recipe="no-such-recipe.yaml")
    assert exc.value.code == "recipe_missing"


@pytest.mark.slow
def test_round_csv_carries_labels_oracle_and_clinician_pairs_to_the_trainer(env):
    from app.services.rounds.data import select_round_studies, write_training_csv
    from orapo_core.train import dataset as training_data

    selection = select_round_studies(env.db, env.settings)
    assert sorted(s.study_id for s in selection.new) == sorted(s.id for s in env.train)
    path = write_training_csv(selection, env.settings.rounds_dir / "t" / "train.csv")
    if hasattr(training_data, "load_training_records"):
        records = training_data.build_training_dataset(training_data.load_training_records(path))
    else:  # the CSV reader before the loaders were shared
        records = training_data.build_training_dataset(training_data.read_chexpert_csv(path))
    row = records[0]
    assert row["oracle_report"].startswith("Findings:") and row["clinician_rejected"].startswith(
        "Findings: The lungs are clear"
    )
    assert row["clinician_chosen"] == row["oracle_report"] and row["image"].size == (64, 64)
    assert any(v is not None for v in json.loads(row["labels"]).values())


def test_a_round_writes_the_pair_ids_and_stored_labels_the_loader_reads_in_one_pass(env):
    """What a round trains on is written once, from ids and the labels stored at save time, and read once."""
    import csv

    from app.services.rounds.data import select_round_studies, write_training_csv
    from db import CorrectionRepository, PairRepository
    from orapo_core.data.loaders import ROUND_COLUMNS
    from orapo_core.facts import label_report
    from orapo_core.train.dataset import load_training_records

    record = env.phantom[5]
    study, first = seed_study(env.db, env.settings, record, author=env.rad, tag="-amended")
    # Amended to the same text with other labels stored (ones FactS would not give it, so labels computed again
    # would show) and its own pair: the round takes this version's pair, found by its id, and these labels.
    stored = {**label_report(first.text), "Fracture": 1}
    assert label_report(first.text).get("Fracture") != 1
    latest = CorrectionRepository(env.db).amend(
        first.id, author_id=env.rad.id, text=first.text, labels=stored, signed=True
    )
    pair = PairRepository(env.db).add(
        study.id,
        prompt="p",
        chosen=first.text,
        rejected="Findings: An older draft.",
        source="clinician_edit",
        correction_id=latest.id,
    )
    selection = select_round_studies(env.db, env.settings)
    (amended,) = [s for s in selection.new if s.study_id == study.id]
    assert amended.correction_id == latest.id and amended.pair_ids == (pair.id,)  # not the first version's pair
    assert amended.draft_text == "Findings: An older draft." and amended.labels == stored

    path = write_training_csv(selection, env.settings.rounds_dir / "ids" / "train.csv")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = {row["id"]: row for row in reader}
        assert tuple(reader.fieldnames) == ROUND_COLUMNS  # exactly what the loader reads
    assert rows[f"study-{study.id}"]["pair_id"] == str(pair.id) and rows[f"study-{study.id}"]["Fracture"] == "1.0"
    loaded = {r.study_id: r for r in load_training_records(path)}
    assert loaded[f"study-{study.id}"].labels["Fracture"] == 1
    assert loaded[f"study-{study.id}"].extra["pair_id"] == str(pair.id)
    assert loaded[f"study-{study.id}"].extra["clinician_rejected"] == "Findings: An older draft."
    for other in env.train:  # seeded with a pair each, found by its correction's id too
        (trained,) = [s for s in selection.new if s.study_id == other.id]
        assert loaded[f"study-{other.id}"].extra["pair_id"] == str(trained.pair_id) != "None"


def test_a_bad_setting_is_refused_before_any_round_exists(env):
    from db import RoundRepository

    rounds = service(env)
    # the first is refused by argparse; the others parse and used to crash a round at its first step (TRL checks them
    # only in training)
    for settings, named in (
        ({"max_steps": "lots"}, "max_steps"),
        ({"loss_type": "grpo2"}, "loss_type"),
        ({"scale_rewards": "sometimes"}, "scale_rewards"),
        ({"temperature": 0}, "temperature"),
    ):
        with pytest.raises(OrapoError) as exc:
            rounds.request_round(settings=settings)
        assert exc.value.code == "invalid_setting" and named in exc.value.message
    assert RoundRepository(env.db).list() == []


def test_too_few_corrections_for_one_optimizer_step_are_refused_before_training(env):
    from db import RoundRepository

    rounds = service(env)
    # 3 signed training studies and nothing to replay; a step of 8 completions with 2 rollouts takes 4 studies.
    with pytest.raises(OrapoError) as exc:
        rounds.request_round(settings={**FAST_TRAINING, "per_device_train_batch_size": 8, "replay_fraction": 0})
    assert exc.value.code == "too_few_corrections" and "4 studies" in exc.value.message
    assert RoundRepository(env.db).list() == []
    # Replay could fill the step, so the round is created; selecting its data finds nothing to replay, and the
    # round fails before any training with every correction still unused.
    from db import CorrectionRepository

    record = rounds.request_round(settings={**FAST_TRAINING, "per_device_train_batch_size": 8})
    with pytest.raises(OrapoError) as exc:
        rounds.run_round(record.id, wait=True)
    assert exc.value.code == "too_few_corrections"
    assert RoundRepository(env.db).get(record.id).status == "failed"
    assert CorrectionRepository(env.db).count_untrained() == 3
    with pytest.raises(OrapoError) as exc:
        rounds.request_round(settings={**FAST_TRAINING, "min_new_corrections": 5})
    assert exc.value.code == "too_few_corrections" and "min_new_corrections is 5" in exc.value.message


def test_replay_keeps_a_round_from_training_on_one_finding_alone(env):
    """Older signed studies are replayed first; PhantomCXR makes up the rest only while the starter is served."""
    import csv

    from app.services.rounds.data import select_round_studies, write_training_csv

    plain = select_round_studies(env.db, env.settings, replay_fraction=3.0, seed=1)
    assert len(plain.new) == 3 and plain.phantom_replay == []  # a hospital model: nothing invented
    starter = select_round_studies(env.db, env.settings, replay_fraction=3.0, seed=1, phantom_size=64)
    assert len(starter.phantom_replay) == 9 and starter.n_training_rows == 12
    assert starter.summary().phantom_replay == 9 and starter.study_ids == plain.study_ids
    path = write_training_csv(starter, env.settings.rounds_dir / "r" / "train.csv")
    rows = list(csv.DictReader(path.open()))
    replayed = [r for r in rows if r["id"].startswith("phantom-replay-")]
    assert len(rows) == 12 and len(replayed) == 9
    assert all(r["oracle_report"].startswith("FINDINGS:") and not r["clinician_rejected"] for r in replayed)
    assert all(Path(r["path_to_image"]).is_file() for r in rows)
    again = select_round_studies(env.db, env.settings, replay_fraction=3.0, seed=1, phantom_size=64)
    assert [p.study_id for p in again.phantom_replay] == [p.study_id for p in starter.phantom_replay]


def test_the_default_round_recipe_trains_the_merger_the_tower_and_the_text_model(tiny_model, tmp_path):
    """Issue 11: rounds that train the text model alone cannot move what the merger lost."""
    from peft import get_peft_model
    from trl import get_peft_config

    from app.services.rounds import DEFAULT_RECIPE
    from orapo_core.models.loading import load_for_training
    from orapo_core.train.config import parse_recipe

    _, training, model_args = parse_recipe(
        DEFAULT_RECIPE, ["--output_dir", str(tmp_path), "--model_name_or_path", str(tiny_model)]
    )
    assert training.learning_rate >= 1e-4 and model_args.use_peft
    model = get_peft_model(load_for_training(model_args.model_name_or_path).model, get_peft_config(model_args))
    adapted = {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A" in name}
    assert any(".merger." in n for n in adapted), "the vision merger gets no adapter"
    assert any(".visual.blocks." in n for n in adapted), "the vision tower gets no adapter"
    assert any("language_model" in n and n.endswith("down_proj") for n in adapted)
