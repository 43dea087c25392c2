"""Which tier runs a parametrized test: `make test-fast` runs it once, `make test` on every parameter.

A behaviour that holds for each model family is tested on each, but the fast tier
needs it once: the first family (qwen2_vl, the starter's own) there, the others
marked `slow`. The tiers are described in docs/pages/developer.md.
"""

from __future__ import annotations

import pytest

from tests.support.tiny_vlms import FAMILIES


def first_fast(values: tuple[str, ...] = FAMILIES) -> list:
    """`values` as pytest parameters: the first in every tier, the rest marked `slow`."""
    return [values[0], *(pytest.param(v, marks=pytest.mark.slow) for v in values[1:])]
