"""The promotion gate: the candidate and the served model drafted on the same held-out studies, then compared.

Evaluation runs in a child process by default (`python -m app.services.rounds_gate
evaluate SPEC OUT`), like training, so loading two more models cannot push the
app out of memory and a cancel can kill it. `decide` is a pure function of the
two metric dicts, so the rule is tested on literal numbers and shown to the
admin with its reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GATE_METRIC_F1 = "macro_f1_14"
GATE_METRIC_REWARD = "facts_reward_mean"


@dataclass(frozen=True)
class GatePolicy:
    """Promote when macro-F1 is at most `f1_tolerance` below the served model's and FactS reward rises by more than `reward_margin`."""

    f1_tolerance: float = 0.02
    reward_margin: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GatePolicy:
        return cls(**{k: float(v) for k, v in (data or {}).items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reason: str
    candidate: dict[str, Any]
    served: dict[str, Any]
    hold: bool = False  # neither promoted nor rejected: kept as a candidate for an administrator to judge

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gate_numbers(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: metrics.get(k) for k in (GATE_METRIC_F1, GATE_METRIC_REWARD, "n_reports")}


def decide(candidate: dict[str, Any], served: dict[str, Any], policy: GatePolicy = GatePolicy(), *,
           untrusted: str | None = None) -> GateDecision:
    """The gate: macro-F1 not worse beyond the tolerance AND FactS reward better, both on the held-out set.

    `untrusted` is why the held-out set cannot speak for the served model's patients (e.g. too few signed
    held-out studies, and a model other than the PhantomCXR starter): then nothing is promoted or rejected
    automatically, the numbers are still shown, and the candidate waits for an administrator.
    """
    c_f1, s_f1 = candidate.get(GATE_METRIC_F1), served.get(GATE_METRIC_F1)
    c_r, s_r = candidate.get(GATE_METRIC_REWARD), served.get(GATE_METRIC_REWARD)
    numbers = dict(candidate=_gate_numbers(candidate), served=_gate_numbers(served))
    if untrusted:
        return GateDecision(False, f"kept for an administrator to promote by hand: {untrusted}", hold=True, **numbers)
    if None in (c_f1, s_f1, c_r, s_r):
        return GateDecision(False, "the held-out evaluation produced no macro-F1 or FactS reward to compare", **numbers)
    reasons = []
    if c_f1 < s_f1 - policy.f1_tolerance:
        reasons.append(f"macro-F1 {c_f1:.4f} is worse than the served model's {s_f1:.4f} by more than {policy.f1_tolerance:g}")
    if not c_r > s_r + policy.reward_margin:
        margin = f" + {policy.reward_margin:g}" if policy.reward_margin else ""
        reasons.append(f"FactS reward {c_r:.4f} is not better than the served model's {s_r:.4f}{margin}")
    if reasons:
        return GateDecision(False, "; ".join(reasons), **numbers)
    return GateDecision(True, f"macro-F1 {c_f1:.4f} vs {s_f1:.4f} (tolerance {policy.f1_tolerance:g}); "
                              f"FactS reward {c_r:.4f} > {s_r:.4f}", **numbers)


# --- evaluation -----------------------------------------------------------------------------------------


def evaluate_models(spec: dict[str, Any], progress=None) -> dict[str, Any]:
    """{"heldout": PATH, "models": {name: {"base": DIR, "adapter": DIR|None}}, "max_new_tokens": N} -> metrics per name."""
    import gc

    from app.services.rounds_data import HeldoutSet
    from orapo_core.models.draft import Drafter
    from orapo_core.models.evaluate import evaluate_drafter

    records = HeldoutSet.read(Path(spec["heldout"])).records()
    results: dict[str, Any] = {}
    for name, model in spec["models"].items():
        drafter = Drafter.from_dir(model["base"], model.get("adapter"), model_version=name)
        result = evaluate_drafter(drafter, records, max_new_tokens=int(spec.get("max_new_tokens", 160)),
                                  batch_size=int(spec.get("batch_size", 8)),
                                  progress=(lambda done, total, n=name: progress(n, done, total)) if progress else None)
        results[name] = {"metrics": result.metrics,
                         "predictions": [{k: p[k] for k in ("study_id", "draft", "facts_score")} for p in result.predictions]}
        del drafter
        gc.collect()
    return results


def merge_adapter(base: str, adapter: str, out: str) -> Path:
    """Fold a served LoRA adapter into its base, so the next round starts from the served weights."""
    from orapo_core.models.loading import load_model

    loaded = load_model(base, adapter, device="cpu")
    merged = loaded.model.merge_and_unload()
    target = Path(out)
    tmp = target.with_name(target.name + ".part")
    merged.save_pretrained(tmp)
    loaded.processor.save_pretrained(tmp)
    tmp.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    from orapo_core.offline import enforce_offline

    enforce_offline()
    parser = argparse.ArgumentParser(prog="python -m app.services.rounds_gate")
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("evaluate")
    e.add_argument("spec")
    e.add_argument("out")
    m = sub.add_parser("merge")
    m.add_argument("base")
    m.add_argument("adapter")
    m.add_argument("out")
    args = parser.parse_args(argv)
    if args.command == "merge":
        print(f"merged: {merge_adapter(args.base, args.adapter, args.out)}", flush=True)
        return 0
    spec = json.loads(Path(args.spec).read_text())

    def progress(name: str, done: int, total: int) -> None:
        print(f"eval {name} {done}/{total}", flush=True)

    results = evaluate_models(spec, progress)
    out = Path(args.out)
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.rename(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
