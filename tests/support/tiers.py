"""Which tier runs a parametrized test: `make test-fast` runs it once, `make test` on every parameter.

A behaviour that holds for each model family is tested on each, but the fast tier
needs it once: the first family (qwen2_vl, the starter's own) there, the others
marked `slow`. The tiers are described in docs/pages/developer.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_vlms import FAMILIES


def first_fast(values: tuple[str, ...] = FAMILIES) -> list:
    """`values` as pytest parameters: the first in every tier, the rest marked `slow`."""
    return [values[0], *(pytest.param(v, marks=pytest.mark.slow) for v in values[1:])]


SLOW_BY_MEASURE = Path(__file__).resolve().parents[1] / "slow_by_measure.txt"


def slow_by_measure() -> set[str]:
    """The modules (`tests/x.py`) and tests (`tests/x.py::name`) kept out of the fast tier by their measured cost
    (tests/slow_by_measure.txt, which says how it was measured); tests/conftest.py marks them `slow`."""
    lines = (line.split("#", 1)[0].strip() for line in SLOW_BY_MEASURE.read_text().splitlines())
    return {line for line in lines if line}
