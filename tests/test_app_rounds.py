"""The Rounds tab and the exports, below the browser: charts from literal numbers, and the launched app's handlers.

The handlers are called the way a script would call them, by API name with
gradio_client, against a real server: a radiologist is refused by every one of
them (server-side, whatever the page shows), an administrator gets the work
done. No round trains here (tests/test_rounds_service.py and the browser test
do); the round scheduler's life is tied to the server's.
"""

from __future__ import annotations

import threading
import zipfile
from types import SimpleNamespace

import pytest

from orapo_core.facts.metrics import EvalMetrics

ROUND_ENDPOINTS = {  # api_name -> arguments
    "/rounds_overview": (None,),
    "/start_round": ("", ""),
    "/set_schedule": ("0 2 * * *", True, 5, True),
    "/round_status": (1,),
    "/cancel_round": (1,),
    "/promote_version": (1, ""),
    "/rollback_version": (None, ""),
    "/export_pairs": (["trl-dpo"],),
    "/export_fhir": (),
}

HISTORY = [
    {
        "step": 1,
        "loss": 0.5,
        "orapo/reward_mean": 0.2,
        "orapo/reward_std": 0.1,
        "orapo/zero_reward_frac": 0.5,
        "orapo/dpo_weight": 0.8,
        "orapo/grpo_loss": 0.4,
        "orapo/dpo_loss": 0.69,
    },
    {
        "step": 2,
        "loss": 0.4,
        "orapo/reward_mean": 0.3,
        "orapo/reward_std": 0.05,
        "orapo/zero_reward_frac": 0.25,
        "orapo/dpo_weight": 0.6,
        "orapo/grpo_loss": 0.3,
        "orapo/dpo_loss": 0.6,
    },
    {"step": 2, "train_runtime": 3.1, "train_loss": 0.45},  # the run's summary line: no curves in it
]


def version(vid, name, heldout, status="retired"):
    return SimpleNamespace(id=vid, name=name, status=status, metrics={"heldout": heldout} if heldout else {})


def heldout(f1, length):
    """A version's stored held-out metrics, as a round stores them."""
    return EvalMetrics(
        macro_f1_14=f1,
        macro_precision_14=f1 + 0.1,
        macro_recall_14=f1 - 0.1,
        facts_reward_mean=0.4,
        mean_report_length=length,
        f1_per_class={"Cardiomegaly": f1, "Pleural Effusion": f1 / 2},
    ).to_dict()


# --- pure functions ----------------------------------------------------------------------------------------


def test_live_charts_plot_each_logged_curve_by_step():
    from app.services.insight import round_charts

    reward, zero, weight, losses = round_charts.live_figures(HISTORY)
    band, mean = reward.data
    assert list(mean.x) == [1, 2] and list(mean.y) == [0.2, 0.3]
    assert list(band.y) == pytest.approx([0.3, 0.35, 0.25, 0.1])  # mean + std out, mean - std back
    assert list(zero.data[0].y) == [0.5, 0.25] and list(weight.data[0].y) == [0.8, 0.6]
    assert {t.name: list(t.y) for t in losses.data} == {"GRPO loss": [0.4, 0.3], "DPO loss": [0.69, 0.6]}
    for fig in round_charts.live_figures([{"step": 0, "loss": 1.0}]):  # nothing logged yet: said, not drawn
        assert not fig.data and "yet" in fig.layout.annotations[0].text


def test_version_charts_compare_evaluated_versions_oldest_first():
    from app.services.insight import round_charts

    versions = [
        version(3, "round-2", heldout(0.5, 30), "promoted"),
        version(1, "tiny-base", None),
        version(2, "round-1", heldout(0.4, 20), "rejected"),
    ]
    f1, quality, length = round_charts.version_figures(versions)
    assert [t.name for t in f1.data] == ["v2 round-1", "v3 round-2"]  # the base without metrics is left out
    assert list(f1.data[1].x) == ["Cardiomegaly", "Pleural Effusion"] and list(f1.data[1].y) == [0.5, 0.25]
    assert {t.name: list(t.y) for t in quality.data}["macro-F1"] == [0.4, 0.5]
    assert list(length.data[0].x) == ["v2 round-1", "v3 round-2"] and list(length.data[0].y) == [20, 30]
    assert not round_charts.per_class_f1_figure([version(1, "tiny-base", None)]).data


def test_overrides_are_key_value_lines():
    from app.tabs.rounds import parse_overrides
    from orapo_core.errors import OrapoError

    assert parse_overrides("max_steps=2\n\n# a comment\nlora_target_modules=[q_proj, v_proj]\nuse_peft=true") == {
        "max_steps": 2,
        "lora_target_modules": ["q_proj", "v_proj"],
        "use_peft": True,
    }
    assert parse_overrides("") == {}
    with pytest.raises(OrapoError):
        parse_overrides("max_steps 2")


@pytest.mark.slow
def test_building_the_app_starts_no_scheduler(tmp_path):
    from app.server import build_app
    from tests.support.app import make_env

    settings, db = make_env(tmp_path)
    before = {t.ident for t in threading.enumerate()}
    demo = build_app(settings=settings, database=db)
    assert demo.round_scheduler is not None and not demo.round_scheduler.running
    assert {t.ident for t in threading.enumerate()} == before


# --- the launched app ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Users, one signed correction with its pair, two versions (served and a candidate) and a queued round."""
    from db import ModelVersionRepository, RoundRepository, UserRepository
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from tests.support.app import launched_app, make_env
    from tests.support.rounds import seed_study

    root = tmp_path_factory.mktemp("rounds-app")
    settings, db = make_env(root)
    write_dataset(root / "phantom", 1, seed=3, size=64)
    rita = UserRepository(db).get_by_username("rita")
    seed_study(db, settings, load_dataset(root / "phantom")[0], author=rita)
    versions = ModelVersionRepository(db)
    base = versions.create("tiny-base", base_model_path="models/tiny")
    versions.promote(base.id)
    candidate = versions.create(
        "round-x", base_model_path="models/tiny", parent_id=base.id, metrics={"heldout": heldout(0.5, 25)}
    )
    queued = RoundRepository(db).create(trigger="manual", config={})
    with launched_app(settings, db) as (url, demo):
        yield SimpleNamespace(
            url=url, settings=settings, db=db, demo=demo, base=base, candidate=candidate, queued=queued
        )
    assert not demo.round_scheduler.running  # closing the server stopped it
    assert not [t for t in threading.enumerate() if "APScheduler" in t.name or t.name.startswith("orapo-round")]


@pytest.mark.slow
def test_the_scheduler_runs_with_the_server_and_fails_rounds_left_behind(server):
    scheduler = server.demo.round_scheduler
    assert scheduler.running and scheduler.service.get_round(server.queued.id).status == "failed"  # a queued round
    # left by a process that is gone is failed at start (recover)


@pytest.mark.slow
def test_a_radiologist_is_refused_by_every_rounds_and_export_handler(server):
    from gradio_client.exceptions import AppError

    from app.services.operations.export_downloads import downloads_dir, work_dir
    from db import AuditRepository, ModelVersionRepository, ScheduleRepository
    from tests.support.app import client

    rita = client(server.url, "rita", "rita-pass-1")
    for api_name, args in ROUND_ENDPOINTS.items():
        with pytest.raises(AppError, match="Only an administrator can do this"):
            rita.predict(*args, api_name=api_name)
    assert ScheduleRepository(server.db).get().cron is None
    assert ModelVersionRepository(server.db).promoted().id == server.base.id
    assert not downloads_dir(server.settings).exists() and not work_dir(server.settings).exists()
    assert not [
        e for e in AuditRepository(server.db).query() if e.actor_name == "rita" and not e.action.startswith("auth.")
    ]  # her sign-in is audited, nothing else


@pytest.mark.slow
def test_an_administrator_schedules_cancels_promotes_rolls_back_and_exports(server):
    from gradio_client.exceptions import AppError

    from app.services.operations.export_downloads import work_dir
    from db import AuditRepository, ModelVersionRepository, RoundRepository, ScheduleRepository
    from tests.support.app import client

    boss = client(server.url, "boss", "admin-pass-1")
    result = boss.predict("0 2 * * *", True, 5, True, api_name="/set_schedule")
    assert result[0] == "Schedule saved." and "Next scheduled round" in result[-1] and "(now 1)" in result[-1]
    saved = ScheduleRepository(server.db).get()
    assert (saved.cron, saved.schedule_enabled, saved.corrections_threshold, saved.threshold_enabled) == (
        "0 2 * * *",
        True,
        5,
        True,
    )
    assert set(server.demo.round_scheduler.jobs()) == {
        "orapo-round-cron",
        "orapo-round-threshold",
    }  # the scheduler followed
    with pytest.raises(AppError, match="not a valid cron"):
        boss.predict("every night", True, 5, True, api_name="/set_schedule")

    queued = RoundRepository(server.db).create(trigger="manual", config={})
    status = boss.predict(queued.id, api_name="/round_status")
    assert f"Round {queued.id}" in status[0] and "queued" in status[0]
    assert any(row[0] == queued.id for row in status[6]["data"])
    cancelled = boss.predict(queued.id, api_name="/cancel_round")
    assert "cancelled" in cancelled[0] and RoundRepository(server.db).get(queued.id).status == "cancelled"
    with pytest.raises(AppError, match="nothing to cancel"):
        boss.predict(queued.id, api_name="/cancel_round")
    with pytest.raises(AppError, match="untrained corrections"):  # reached the service: one correction, policy wants 1
        boss.predict("", "min_new_corrections=5", api_name="/start_round")

    promoted = boss.predict(server.candidate.id, "better on held-out", api_name="/promote_version")
    assert ModelVersionRepository(server.db).promoted().id == server.candidate.id and "now drafts" in promoted[0]
    rows = {row[0]: row for row in promoted[1]["data"]}
    assert rows[server.candidate.id][2] == "promoted" and rows[server.candidate.id][5] == "0.5000"
    rolled = boss.predict(None, "", api_name="/rollback_version")  # default: the served version's parent
    assert ModelVersionRepository(server.db).promoted().id == server.base.id and "Rolled back" in rolled[0]
    assert AuditRepository(server.db).query(action="version.rollback")[0].actor_name == "boss"
    overview = boss.predict(None, api_name="/rounds_overview")
    assert list(overview[-5:-1]) == ["0 2 * * *", True, 5, True]

    pairs_md, pairs_zip = boss.predict(["trl-dpo", "trl-grpo"], api_name="/export_pairs")
    assert "**trl-dpo**: 1 rows" in pairs_md and "**trl-grpo**: 1 rows" in pairs_md
    fhir_md, fhir_zip = boss.predict(api_name="/export_fhir")
    assert "1 FHIR R4 Bundles" in fhir_md
    with zipfile.ZipFile(pairs_zip["path"]) as archive:
        assert {"trl-dpo/dataset_info.json", "trl-grpo/dataset_info.json"} <= set(archive.namelist())
    with zipfile.ZipFile(fhir_zip["path"]) as archive:
        assert any(n.startswith("fhir/study-") for n in archive.namelist())
    assert not [p for p in work_dir(server.settings).rglob("*") if p.is_file()]  # built, zipped, gone
    audit = {e.action: e for e in AuditRepository(server.db).query(action="export.")}
    assert set(audit) == {"export.pairs", "export.fhir"} and audit["export.pairs"].actor_name == "boss"
    assert audit["export.pairs"].details == {"trl-dpo": 1, "trl-grpo": 1} and audit["export.fhir"].details == {
        "bundles": 1,
        "skipped": {},
    }
