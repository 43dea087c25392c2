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
