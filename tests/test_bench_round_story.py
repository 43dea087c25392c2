"""The clinic-story tools: the false positives' breakdown by the negatives' other findings
(benchmarks/round_story_common.py), the drafts' d' (benchmarks/bench_round_rescore.py), and each tool's own flags."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks.round_story_common import false_positives_by_finding


def test_false_positives_are_counted_by_each_other_finding_and_on_normal_films() -> None:
    rows = [
        {"reference": {"No Finding": 1, "Edema": 0}},  # normal film
        {"reference": {"No Finding": 0, "Edema": 1, "Lung Opacity": 1}},
        {"reference": {"Edema": 1, "Cardiomegaly": 0}},
        {"reference": {"No Finding": 1}},
        {},  # no reference labels: counted as normal
    ]
    said = [False, True, False, True, False]
    out = false_positives_by_finding(rows, said)
    assert out["false_positives_on_normal"] == [1, 3]
    assert out["false_positives_by_finding"] == {"Edema": [1, 2], "Lung Opacity": [1, 1]}


def test_d_prime_is_z_of_recall_plus_z_of_specificity_with_the_extremes_clipped() -> None:
    from benchmarks.bench_round_rescore import d_prime

    assert d_prime(0.5, 0.5) == 0.0
    assert abs(d_prime(0.841345, 0.05) - (1.0 + 1.644854)) < 1e-3
    assert d_prime(0.0, 0.0) == 0.0  # nothing said: clipped to 1/400 each side, no separability
    assert d_prime(0.9, 0.1) > d_prime(0.8, 0.1) > d_prime(0.8, 0.2)


def test_each_clinic_story_tool_takes_only_its_own_flags() -> None:
    from benchmarks import bench_round_drafts_alone, bench_round_grpo_twin, bench_round_rescore, bench_round_story

    def flags(module) -> set[str]:
        return {s for action in module.make_parser()._actions for s in action.option_strings} - {"-h", "--help"}

    test_set = {"--finding", "--n-positive", "--n-negative", "--size", "--seed"}
    story_folder = {"--data-dir", "--round"}
    assert flags(bench_round_story) == test_set | {"--n", "--data-dir", "--set", "--agreement", "--json"}
    assert flags(bench_round_rescore) == test_set | story_folder | {
        "--fit-verifier",
        "--gate",
        "--set",
        "--state-probes",
        "--agreement",
        "--json",
    }
    assert flags(bench_round_drafts_alone) == test_set | story_folder | {"--json"}
    assert flags(bench_round_grpo_twin) == test_set | story_folder | {"--json"}
    args = bench_round_rescore.make_parser().parse_args(["--data-dir", "d", "--seed", "12", "--fit-verifier"])
    assert (args.round, args.seed, args.fit_verifier, args.state_probes) == (1, 12, True, False)


def _scores(recall, fpr, normal, by_finding, f1=0.5, n_pos=125, n_neg=200):
    per = {"Pleural Effusion": [0, 0], "Cardiomegaly": [0, 0]}
    return {
        "recall": recall,
        "false_positive_rate": fpr,
        "n_positive": n_pos,
        "n_negative": n_neg,
        "false_positives_on_normal": normal,
        "false_positives_by_finding": dict(per, **by_finding),
        "macro_f1_14": f1,
    }


def test_the_round_matrix_judges_the_drafts_alone_and_the_worst_group_of_ten_or_more() -> None:
    from benchmarks.bench_round_matrix import summarise, table

    story = {
        "draft_min_agreement": 0,
        "round": {"seconds": 1500, "version_status": "promoted", "gate": "ok"},
        "candidate": _scores(0.9, 0.02, [1, 80], {"Pleural Effusion": [3, 40]}, f1=0.6),
    }
    alone = {
        "before": _scores(0.0, 0.0, [0, 80], {}, f1=0.45),
        # 3 % overall, but 4 of 30 effusion films (13 %): the group limit is missed; 2 of 3 lesion films is too
        # small a group to judge
        "candidate": _scores(0.7, 0.03, [0, 80], {"Pleural Effusion": [4, 30], "Lung Lesion": [2, 3]}, f1=0.5),
    }
    cell = summarise("pleural_other", 501, story, alone)
    assert cell["alone"]["worst_group"] == ["Pleural Effusion", 4, 30]
    goals = cell["goals"]
    assert goals["alone: recall >= 0.6"] and goals["alone: macro-F1 not lower"] and goals["promoted"]
    assert not goals["alone: false positives within limits"]
    assert goals["checks add >= 0.1 recall within limits"]  # +0.2, 2 % overall, effusion 3/40
    text = table([cell])
    assert "**0.700 (88/125) / 3.0 % (6/200; worst group Pleural Effusion 4/30) / 0.500**" in text
    assert "alone: false positives within limits" in text.splitlines()[2]


def test_the_round_matrix_reads_the_checks_column_from_the_checks_fitted_again_when_given() -> None:
    from benchmarks.bench_round_matrix import summarise

    story = {
        "round": {"seconds": 600, "version_status": "held"},
        "candidate": _scores(0.9, 0.15, [10, 80], {"Pleural Effusion": [20, 40]}),
    }
    alone = {"before": _scores(0.0, 0.0, [0, 80], {}), "candidate": _scores(0.5, 0.0, [0, 80], {})}
    checks = {"command": "python -m benchmarks.bench_round_rescore", "candidate": _scores(0.65, 0.01, [0, 80], {})}
    cell = summarise("pneumothorax", 521, story, alone, checks)
    assert cell["with_round_checks"]["fpr"] == 0.15 and cell["with_checks"]["fpr"] == 0.01
    assert cell["goals"]["checks add >= 0.1 recall within limits"]
    assert not cell["goals"]["promoted"] and not cell["goals"]["alone: recall >= 0.6"]


def test_the_round_matrix_reads_promoted_from_the_gate_judged_again() -> None:
    from benchmarks.bench_round_matrix import summarise, table

    story = {"round": {"seconds": 600, "version_status": "promoted"}, "candidate": _scores(0.9, 0.0, [0, 80], {})}
    alone = {"before": _scores(0.0, 0.0, [0, 80], {}), "candidate": _scores(0.7, 0.0, [0, 80], {})}
    gate = {
        "own_verdict": "hold",
        "test_verdict": "promote",
        "agree": False,
        "own": {"reason": "held"},
        "test_set": {"reason": "ok"},
    }
    cell = summarise("pneumothorax", 531, story, alone, {"candidate": _scores(0.9, 0.0, [0, 80], {}), "gate": gate})
    assert not cell["goals"]["promoted"]  # the round's own (older) gate promoted it; this checkout's holds it
    assert "agrees with its verdict on the 325 test studies in 0 of 1 rounds" in table([cell])


def test_the_round_matrix_serves_the_starter_it_is_given_in_each_new_data_folder(tmp_path) -> None:
    """`--starter DIR` is copied in as the cell's served starter before its story runs (here every step's JSON is
    already there, `--reuse`), and the report names it with its card's plan; without it, the shipped one."""
    import json

    from benchmarks.bench_round_matrix import run_cell, starter_card

    starter = tmp_path / "strong"
    starter.mkdir()
    (starter / "config.json").write_text("{}")
    (starter / "starter_card.json").write_text(json.dumps({"plan": {"rare_fraction": 0.5}}))
    cells = tmp_path / "cells"
    cells.mkdir()
    scores = _scores(0.7, 0.0, [0, 80], {})
    (cells / "pleural_other-501.story.json").write_text(json.dumps({"round": {}, "candidate": scores}))
    (cells / "pleural_other-501.alone.json").write_text(json.dumps({"before": scores, "candidate": scores}))
    (cells / "pleural_other-501.checks.json").write_text(json.dumps({"candidate": scores}))
    cell = run_cell("pleural_other", 501, cells, tmp_path / "work", [], True, starter)
    assert cell["alone"]["recall"] == 0.7
    assert (tmp_path / "work" / "pleural_other-501" / "models" / "starter" / "config.json").is_file()
    assert starter_card(starter) == {"folder": str(starter), "plan": {"rare_fraction": 0.5}}
    assert starter_card(None)["folder"].startswith("assets/starter")


def test_the_round_matrix_gives_every_step_of_a_cell_the_held_out_share_it_is_asked_for(tmp_path, monkeypatch) -> None:
    """`--holdout-fraction F` reaches each child process as ORAPO_HOLDOUT_FRACTION (the clinic's uploads are split
    by it); without it the children read the app's default."""
    import json

    from benchmarks import bench_round_matrix

    seen: list[str | None] = []
    scores = _scores(0.7, 0.0, [0, 80], {})

    def fake_run(cmd, stdout, stderr, env, check):
        seen.append(env.get("ORAPO_HOLDOUT_FRACTION"))
        out = Path(cmd[cmd.index("--json") + 1])
        body = {"round": {}, "candidate": scores, "before": scores}
        out.write_text(json.dumps(body))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.delenv("ORAPO_HOLDOUT_FRACTION", raising=False)
    monkeypatch.setattr(bench_round_matrix.subprocess, "run", fake_run)
    for share, folder in ((0.25, "a"), (None, "b")):
        cells = tmp_path / folder
        cells.mkdir()
        cell = bench_round_matrix.run_cell("pleural_other", 501, cells, tmp_path / "work", [], False, None, share)
        assert cell["alone"]["recall"] == 0.7
    assert seen == ["0.25"] * 3 + [None] * 3
