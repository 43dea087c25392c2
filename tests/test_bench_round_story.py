"""The clinic-story tools: the false positives' breakdown by the negatives' other findings
(benchmarks/round_story_common.py), the drafts' d' (benchmarks/bench_round_rescore.py), and each tool's own flags."""

from __future__ import annotations

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
    assert flags(bench_round_rescore) == test_set | story_folder | {"--fit-verifier", "--set", "--state-probes",
                                                                    "--agreement", "--json"}
    assert flags(bench_round_drafts_alone) == test_set | story_folder | {"--json"}
    assert flags(bench_round_grpo_twin) == test_set | story_folder | {"--json"}
    args = bench_round_rescore.make_parser().parse_args(["--data-dir", "d", "--seed", "12", "--fit-verifier"])
    assert (args.round, args.seed, args.fit_verifier, args.state_probes) == (1, 12, True, False)
