"""The clinic story's breakdown of false positives by the negatives' other findings (benchmarks/bench_round_story.py)."""

from __future__ import annotations

from benchmarks.bench_round_story import false_positives_by_finding


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
    from benchmarks.bench_round_story import d_prime

    assert d_prime(0.5, 0.5) == 0.0
    assert abs(d_prime(0.841345, 0.05) - (1.0 + 1.644854)) < 1e-3
    assert d_prime(0.0, 0.0) == 0.0  # nothing said: clipped to 1/400 each side, no separability
    assert d_prime(0.9, 0.1) > d_prime(0.8, 0.1) > d_prime(0.8, 0.2)
