"""What a round may be told: its policy (data, held-out set, gate, timings) and the recipe overrides.

`orapo rounds run --set key=value` and the admin form send one flat dict; keys
that name a `RoundPolicy` field set the policy, every other key overrides the
training recipe and is passed to `orapo train` as `--key value`.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
)

from app.services.rounds.evidence import TOPUP_MAX_STUDIES
from app.services.rounds.gate import GatePolicy
from app.services.rounds.processes import override_argv
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from orapo_core.train.config import OraPOConfig

RECIPES_DIR = Path(__file__).resolve().parents[3] / "orapo_core" / "train" / "recipes"
DEFAULT_RECIPE = RECIPES_DIR / "round-cpu.yaml"
#: Overrides the round sets itself; a user's --set of these is refused rather than silently replaced.
MANAGED_KEYS = frozenset({"model_name_or_path", "train_csv", "output_dir", "metrics_jsonl"})


def recipe_names() -> list[str]:
    """The shipped training recipes a round may be started with (the accelerate launcher configs are not recipes)."""
    return [p.name for p in sorted(RECIPES_DIR.glob("*.yaml")) if not p.name.startswith("accelerate")]


class RoundPolicy(BaseModel):
    """How rounds choose data and judge candidates; every field can be set per round with `--set key=value`.

    Values typed in a form or on the command line arrive as text; pydantic converts them by the field's type
    ("3" -> 3, "true" -> True) and refuses what does not convert (`updated` says which setting, as
    `invalid_setting`). Frozen: a round's policy is fixed when it is requested.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    recipe: str = str(DEFAULT_RECIPE)
    # Replay this many times the new studies' count of already-trained studies (PhantomCXR studies while the
    # PhantomCXR starter is served): corrections of one finding alone teach "always say it" (issue 11: 31 % false
    # positives with 1x replay, 15 % with 3x at the same step count).
    replay_fraction: float = 3.0
    replay_max: int | None = None
    min_new_corrections: int = 1
    min_heldout: int = 20  # fewer signed held-out studies than this: PhantomCXR's validation split stands in
    max_heldout: int | None = 200
    phantom_studies: int = 200
    phantom_size: int = 256
    eval_max_new_tokens: int = 160
    # The gate (app.services.rounds.gate): 95 % paired bootstrap intervals (gate_resamples resamples) of candidate
    # minus served macro-F1 (promote above -f1_tolerance) and FactS reward (promote above reward_margin), and the
    # false-positive rate of every finding at least min_finding_corrections corrections added or removed: at most
    # max_finding_fpr (or no more than the served model's, where that is higher already), and at most
    # max_finding_fpr_rise over the served model's. While fewer than
    # min_finding_negatives held-out studies lack such a finding, the held-out set is topped up from one PhantomCXR
    # pool drawn at the usual prevalence of every finding (so its negatives include films with other findings), at
    # most max_topup_studies of it; a finding still short of negatives cannot be measured, and the candidate is held
    # for an administrator. With fewer than min_finding_positives held-out studies with it, its recall is shown as
    # not measurable (the pool's studies never count for recall), which holds nothing.
    f1_tolerance: float = 0.02
    reward_margin: float = 0.0
    max_finding_fpr: float = 0.05
    max_finding_fpr_rise: float = 0.02
    min_finding_corrections: int = 3
    min_finding_positives: int = 10
    min_finding_negatives: int = 100
    max_topup_studies: int = Field(default=TOPUP_MAX_STUDIES, ge=0)
    gate_resamples: int = Field(default=1000, ge=1)
    evaluate_in_subprocess: bool = True
    cancel_grace_s: float = 10.0
    poll_s: float = 0.5

    def updated(self, values: dict[str, Any]) -> RoundPolicy:
        """This policy with `values` (text or typed) in place; `invalid_setting` names a value that does not fit."""
        try:
            return type(self).model_validate({**self.model_dump(), **values})
        except ValidationError as exc:
            error = exc.errors()[0]
            key = ".".join(map(str, error["loc"])) or "a setting"
            if error["type"] == "extra_forbidden":
                raise OrapoError("invalid_setting", f"{key} is not a round setting.") from None
            field = type(self).model_fields.get(key)
            kind = field.annotation if field is not None else None
            what = "true or false" if kind is bool else "a number" if kind is not str else "text"
            raise OrapoError("invalid_setting", f"{key} takes {what}, not {error.get('input')!r}.") from None

    @property
    def gate(self) -> GatePolicy:
        return GatePolicy(**{name: getattr(self, name) for name in GatePolicy.__dataclass_fields__})


POLICY_KEYS = frozenset(RoundPolicy.model_fields)


def parse_settings(pairs: list[str] | None) -> dict[str, Any]:
    """`key=value` strings (values as YAML: numbers, booleans, [a, b]) into a dict."""
    out: dict[str, Any] = {}
    for item in pairs or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OrapoError("invalid_setting", f"{item!r} is not key=value (e.g. --set learning_rate=1e-5).")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def check_overrides(recipe: str | Path, overrides: dict[str, Any]) -> OraPOConfig:
    """Parse the recipe with the round's overrides as `orapo train` will, before any round exists.

    Returns the training config (`OraPOConfig`: its `studies_per_step` and `optimizer_steps` are what a round
    needs of it); a bad value is an `invalid_setting` error that names it (argparse's own sentence), never a
    round that crashes later with a raw ValueError."""
    from orapo_core.train.config import _PARSE_LOCK, parse_recipe  # noqa: PLC0415 -- loads trl, peft

    placeholders = {"model_name_or_path": "served-model", "train_csv": "round.csv", "output_dir": "round-output"}
    said = io.StringIO()
    try:
        with _PARSE_LOCK, contextlib.redirect_stderr(said):  # sys.stderr is process-wide: one redirect at a time
            _script, training, _model = parse_recipe(recipe, override_argv({**overrides, **placeholders}))
    except SystemExit:
        lines = [ln for ln in said.getvalue().splitlines() if ln.strip()]
        detail = lines[-1].split("error:", 1)[-1].strip() if lines else "a setting has a wrong value"
        raise OrapoError("invalid_setting", f"This round's settings do not parse: {detail}.") from None
    except (ValueError, TypeError) as exc:
        raise OrapoError("invalid_setting", f"This round's settings are refused: {exc}") from None
    return training
