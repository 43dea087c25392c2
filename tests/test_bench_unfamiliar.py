"""`benchmarks/bench_unfamiliar.py`: the unfamiliar-film score's AUCs, on a few PhantomCXR films and the samples."""

from __future__ import annotations

import json
import sys

import pytest

from orapo_core.models.starter.build import SHIPPED_DIR

pytestmark = pytest.mark.slow  # the shipped starter on 40 images


def test_the_benchmark_prints_three_aucs_and_writes_them(tmp_path, monkeypatch, capsys) -> None:
    from benchmarks.bench_unfamiliar import auc, main

    if not (SHIPPED_DIR / "config.json").is_file():
        pytest.skip(f"no starter shipped under {SHIPPED_DIR}")
    assert auc([1.0, 2.0], [3.0, 2.0]) == 0.875 and auc([], [1.0]) is None
    out = tmp_path / "unfamiliar.json"
    monkeypatch.setattr(
        sys, "argv", ["bench_unfamiliar", "--model", str(SHIPPED_DIR), "--n-phantom", "6", "--json", str(out)]
    )
    assert main() == 0
    printed = capsys.readouterr().out
    assert "AUC phantom_vs_real_chest" in printed and "AUC real_chest_vs_non_chest" in printed
    result = json.loads(out.read_text())
    assert result["groups"]["phantom"]["n"] == 6 and not result["calibrated_now"]
    present = {group for group, numbers in result["groups"].items() if numbers["n"]}
    for name, value in result["auc"].items():  # a pair with a group whose package is missing has no AUC
        first, second = name.split("_vs_")
        assert (value is None) == (not {first, second} <= present)
    if result["groups"]["non_chest"]["n"]:
        assert result["auc"]["phantom_vs_non_chest"] > 0.9
        assert result["groups"]["non_chest"]["not_drafted_by_header_or_pixels"] == result["groups"]["non_chest"]["n"]
