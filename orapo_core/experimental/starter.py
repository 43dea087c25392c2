"""The starter build's architecture experiments, apart from `orapo starter build`.

`orapo starter build` builds what a user needs: the shipped starter's shape and
warm start (seed, data size, steps, time cap). The settings the research tried
on top (docs/pages/research/issue-11.md, learning.md) are here: another input
side or patch size (four visual tokens instead of one), a larger or longer
vision warm-up, perception batches through the prompt, another share of the
rare findings. `starter_variant` turns them into the `WarmStartPlan` and
`StarterArchitecture` that `orapo_core.models.starter.build_starter` takes,
refusing what cannot be built with a sentence that names the option;
`benchmarks.bench_starter --rebuild DIR [options]` passes them on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orapo_core.errors import OrapoError
from orapo_core.models.starter.architecture import IMAGE_SIDE, StarterArchitecture
from orapo_core.models.starter.sft import WarmStartPlan

#: The plan fields a variant may set, by the benchmark option that sets them (`--n-train` sets `n_train`).
PLAN_OPTIONS = ("n_train", "steps", "max_minutes", "vision_n_train", "vision_steps", "perception_batch")


def starter_variant(
    *,
    seed: int = 0,
    rare_fraction: float | None = None,
    image_side: int | None = None,
    patch_size: int | None = None,
    **plan: float | int | None,
) -> tuple[WarmStartPlan, StarterArchitecture | None]:
    """The plan and architecture of a starter variant; None values keep the shipped build's, and the architecture
    is None when neither `image_side` nor `patch_size` is given (the shipped one). `plan` takes `PLAN_OPTIONS`."""
    unknown = sorted(set(plan) - set(PLAN_OPTIONS))
    if unknown:
        raise TypeError(f"not starter plan options: {unknown}")
    warm = WarmStartPlan(seed=seed)
    for name, value in plan.items():
        if value is None:
            continue
        option = "minutes" if name == "max_minutes" else name.replace("_", "-")
        if name == "perception_batch" and value < 0:  # 0 turns them off: the starter shipped until 2026-12-07
            raise OrapoError("bad_option", f"--{option} must be 0 (off) or above, not {value}.")
        if name != "perception_batch" and value <= 0:
            raise OrapoError("bad_option", f"--{option} must be above 0, not {value}.")
        change: dict[str, Any] = {name: value}  # a field named by PLAN_OPTIONS
        warm = replace(warm, **change)
    if rare_fraction is not None:
        if not 0 < rare_fraction <= 1:
            raise OrapoError("bad_option", f"--rare-fraction must lie in (0, 1], not {rare_fraction}.")
        warm = replace(warm, rare_fraction=rare_fraction)
    if image_side is None and patch_size is None:
        return warm, None
    side = image_side or IMAGE_SIDE
    patch = patch_size or side // 2
    if side < 32 or patch < 4 or side % (2 * patch):
        raise OrapoError(
            "bad_option",
            f"--image-side {side} must be at least 32 and a multiple of twice "
            f"--patch-size {patch} (at least 4): patches are merged 2x2 into tokens.",
        )
    return warm, StarterArchitecture(image_side=side, patch_size=patch)
