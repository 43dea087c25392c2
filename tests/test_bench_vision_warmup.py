"""`benchmarks/bench_vision_warmup.py`: the starter build's vision warm-up alone, scored on held-out films."""

from __future__ import annotations

import json
import math

import pytest


@pytest.mark.slow
def test_a_tiny_warm_up_scores_every_finding_two_ways_on_films_it_never_saw(tmp_path, capsys):
    from benchmarks.bench_vision_warmup import main
    from orapo_core.data.phantom import FINDING_KINDS

    out = tmp_path / "warmup.json"
    assert (
        main(
            [
                "--vision-n-train",
                "16",
                "--vision-steps",
                "2",
                "--vision-batch",
                "4",
                "--n-eval",
                "60",
                "--patch-size",
                "24",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["findings"] == list(FINDING_KINDS)
    assert result["vision_steps_done"] == 2 and result["architecture"]["patch_size"] == 24
    assert "16 films, 2 steps x 4" in result["label"] and "4 token(s)" in result["label"]
    for way in ("head", "ridge"):
        scores = result["auc"][way]
        assert len(scores) == len(FINDING_KINDS)
        assert all(math.isnan(a) or 0.0 <= a <= 1.0 for a in scores)
        assert sum(not math.isnan(a) for a in scores) >= len(scores) - 2  # both classes among the held-out films
    printed = capsys.readouterr().out
    assert "pneumothorax" in printed and "command: " in printed
