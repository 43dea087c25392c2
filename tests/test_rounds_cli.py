"""`orapo rounds`: a round run and watched from the command line, then listed, shown, rolled back; the schedule set."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("trl")

from app.cli import main  # noqa: E402
from tests.support.rounds import FAST_TRAINING, SMOKE, seed_study

pytestmark = pytest.mark.slow  # rounds that train and evaluate in child processes


@pytest.fixture
def cli_env(data_dir, phantom, tiny_model, monkeypatch):
    """The CLI's database, no promoted version (ORAPO_MODEL_DIR serves), two training studies and one held out."""
    from app.runtime import open_database
    from db import UserRepository
    from orapo_core.config import Settings

    monkeypatch.setenv("ORAPO_MODEL_DIR", str(tiny_model))
    settings = Settings()
    db = open_database(settings)
    rad = UserRepository(db).create("rita", "rita-pass-1")
    train = [seed_study(db, settings, r, author=rad)[0] for r in phantom[:2]]
    seed_study(db, settings, phantom[4], author=rad, split="holdout")
    return type("CliEnv", (), dict(db=db, settings=settings, train=train, phantom=phantom))


def _sets(values: dict) -> list[str]:
    out = []
    for key, value in values.items():
        out += ["--set", f"{key}={json.dumps(value) if isinstance(value, list) else value}"]
    return out


def test_rounds_run_wait_then_list_show_versions_and_rollback(cli_env, capsys):
    from db import AuditRepository, ModelVersionRepository

    policy = {
        "min_heldout": 1,
        "eval_max_new_tokens": 8,
        "evaluate_in_subprocess": "false",
        "f1_tolerance": 1.0,
        "reward_margin": -1.0,
    }
    code = main(["rounds", "run", "--wait", "--recipe", SMOKE, *_sets({**FAST_TRAINING, **policy})])
    out, err = capsys.readouterr()
    assert code == 0, err + out
    assert "promoted" in out and "round 1: training" in err

    versions = ModelVersionRepository(cli_env.db).list()
    served, base = versions  # newest first: the candidate, and the starter registered so it can be rolled back to
    assert served.status == "promoted" and base.status == "retired" and served.parent_id == base.id
    assert base.base_model_path == str(cli_env.settings.model_dir)

    assert main(["rounds", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["status"] == "promoted"
    assert main(["rounds", "show", "1"]) == 0
    shown = capsys.readouterr().out
    assert "gate:" in shown and "train.log (tail):" in shown and f"version {served.id}" in shown
    assert main(["rounds", "versions"]) == 0
    assert f"*{served.id}\tround-1\tpromoted" in capsys.readouterr().out

    assert main(["rounds", "rollback"]) == 0
    assert ModelVersionRepository(cli_env.db).promoted().id == base.id
    assert AuditRepository(cli_env.db).query(action="version.rollback")[0].actor_name.startswith("cli")
    assert main(["rounds", "promote", str(served.id), "--reason", "forward again"]) == 0
    assert ModelVersionRepository(cli_env.db).promoted().id == served.id

    assert main(["rounds", "run"]) == 2  # every correction is used now
    assert "nothing_to_train" in capsys.readouterr().err
    assert main(["rounds", "cancel", "1"]) == 2
    assert "round_not_active" in capsys.readouterr().err

    # A second round, detached (no --wait): it starts from the served adapter folded into its base, and the
    # impossible gate rejects it while a detached supervisor process does the watching.
    from db import UserRepository

    seed_study(
        cli_env.db, cli_env.settings, cli_env.phantom[2], author=UserRepository(cli_env.db).get_by_username("rita")
    )
    impossible = {**policy, "reward_margin": 1.0}
    assert main(["rounds", "run", "--recipe", SMOKE, *_sets({**FAST_TRAINING, **impossible})]) == 0
    assert "Round 2 started (supervisor pid" in capsys.readouterr().out
    deadline = time.monotonic() + 180
    while main(["rounds", "list", "--json"]) == 0 and time.monotonic() < deadline:
        latest = json.loads(capsys.readouterr().out)[0]
        if latest["status"] not in ("queued", "running"):
            break
        time.sleep(0.5)
    assert latest["status"] == "rejected", (latest["error"], latest["log"])
    rejected = ModelVersionRepository(cli_env.db).list()[0]
    merged = cli_env.settings.models_dir / "merged" / str(served.id)
    assert rejected.status == "rejected" and rejected.parent_id == served.id
    assert rejected.base_model_path == f"models/merged/{served.id}" and (merged / "config.json").is_file()
    assert ModelVersionRepository(cli_env.db).promoted().id == served.id


def test_rounds_schedule_sets_and_shows(cli_env, capsys):
    assert main(["rounds", "schedule", "--cron", "30 1 * * *", "--enable", "--threshold", "25", "--threshold-on"]) == 0
    out = capsys.readouterr().out
    assert "30 1 * * * (enabled), next" in out and "threshold: 25 new corrections (enabled)" in out
    assert main(["rounds", "schedule", "--cron", "99 1 * * *"]) == 2
    assert "invalid_cron" in capsys.readouterr().err
    assert main(["rounds", "schedule"]) == 0
    assert "30 1 * * *" in capsys.readouterr().out
    assert main(["rounds", "run", "--set", "output_dir=/tmp/x"]) == 2
    assert "managed_setting" in capsys.readouterr().err
