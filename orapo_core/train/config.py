"""`OraPOConfig`: TRL's `GRPOConfig` plus the oracle terms, and the recipe parser.

A recipe (YAML), the command line and a Python dict from the admin form all go
through `parse_recipe`, which uses TRL's `TrlParser`, so the three build the
same three objects: `OraPOScriptArguments` (data), `OraPOConfig` (training)
and TRL's `ModelConfig` (model path, LoRA).
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

import yaml
from trl import GRPOConfig, ModelConfig, TrlParser  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.facts.ontology import CHEXPERT_14
from orapo_core.models.verifier import ADD_MAX_FPR

# OraPO's oracle term. The ablation's other two (SFT on the oracle, none) are `orapo_core.experimental`'s.
ORACLE_MODES = ("dpo",)
# The loss aggregations TRL 1.16's GRPOTrainer computes (`_compute_loss`); any other name fails at the first step.
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


@dataclass
class OraPOConfig(GRPOConfig):
    """GRPO with an oracle term weighted by each study's smoothed zero-reward rate (see `OraPOTrainer`)."""

    loss_type: str = field(
        default="grpo",
        metadata={
            "help": "TRL loss aggregation. OraPO defaults to 'grpo' (per-sequence mean, then mean over rows), which "
            "makes the objective exactly (1/B)·Σ_i[(1−w_i)·L_GRPO,i + w_i·L_DPO,i]; TRL's other types also work."
        },
    )
    dpo_weight_min: float = field(
        default=0.05, metadata={"help": "w_min: the DPO weight of a study whose rollouts never fail."}
    )
    dpo_weight_max: float = field(
        default=0.15, metadata={"help": "w_max: the DPO weight of a study whose rollouts always fail."}
    )
    dpo_weight_gamma: float = field(
        default=2.0,
        metadata={
            "help": "γ in w = clip(w_min + (w_max − w_min)·z̃^γ): >1 keeps the weight low until failures dominate."
        },
    )
    zero_reward_ema_alpha: float = field(
        default=0.5,
        metadata={
            "help": "α in z̃ ← α·z̃ + (1−α)·z, the per-study smoothing of the zero-reward rate across visits, in [0, 1)."
        },
    )
    zero_reward_threshold: float = field(
        default=0.0,
        metadata={
            "help": "A rollout 'fails' (counts in z and may be rejected) when its reward is <= this; 0.0 means r == 0."
        },
    )
    dpo_beta: float = field(default=0.1, metadata={"help": "τ, the DPO inverse temperature in −log σ(τ·(Δ⁺ − Δ⁻))."})
    dpo_length_normalize: bool = field(
        default=False,
        metadata={
            "help": "LN-DPO: use per-token mean log-probs instead of sums, against the bias towards short rejections."
        },
    )
    oracle_nll_weight: float = field(
        default=0.0,
        metadata={
            "help": "α of an added negative log-likelihood of the oracle report (mean per token), on every row that "
            "carries a pair, beside its DPO loss: L = L_DPO + α·NLL(chosen), as in RPO (Pang et al. 2024, TRL's "
            "rpo_alpha). DPO alone can widen the margin by lowering the rejected draft; the NLL makes the oracle's "
            "own sentences the model's choice. 0 is the paper's objective."
        },
    )
    oracle_nll_focus: str = field(
        default="all",
        metadata={
            "help": "Which tokens of the oracle report the oracle_nll_weight term averages over: 'all' (RPO, the "
            "report's mean) or 'differing', only the oracle's tokens the pair's rejected answer did not write "
            "(difflib over token ids), such as the sentence of a finding the draft left out."
        },
    )
    oracle_nll_min_auc: float = field(
        default=0.0,
        metadata={
            "help": "With oracle_nll_focus 'differing': before training, the served model's state where the report "
            "begins is read by a cross-fitted ridge probe for each finding the round's corrections added (on the "
            "round's own training films, labels from the oracle reports); the focused NLL leaves out the sentences "
            "of a finding read below this AUC (or with under 10 positives), so the round does not teach the model "
            "to write a finding it cannot see. 0: off (every differing token counts)."
        },
    )
    oracle_nll_skip_findings: list[str] = field(
        default_factory=list,
        metadata={
            "help": "CheXpert observations whose sentences the focused NLL leaves out; filled from oracle_nll_min_auc "
            "when that is above 0 (the resolved recipe records it), or set by hand."
        },
    )
    oracle_unread_scope: str = field(
        default="nll",
        metadata={
            "help": "Where the findings oracle_nll_skip_findings names are left out: 'nll', only the focused NLL's "
            "tokens; 'report', the round's oracle reports themselves, on each corrected study whose draft did not "
            "state the finding (its sentence out of the oracle, the clinician's chosen answer and the FactS labels), "
            "so neither the reward, DPO's pairs nor the NLL teaches a finding the model cannot see, while every "
            "other correction, and every removal, still applies."
        },
    )
    max_rejected_per_group: int | None = field(
        default=None,
        metadata={
            "help": "At most this many failed rollouts per prompt become rejected answers (lowest reward first); None: all."
        },
    )
    use_clinician_pairs: bool = field(
        default=False,
        metadata={
            "help": "Add the clinician's pair (columns clinician_chosen over clinician_rejected) to the study's DPO term."
        },
    )
    oracle_mode: str = field(
        default="dpo",
        metadata={
            "help": "How the oracle report enters the loss: 'dpo', OraPO's term, the one the product trains with. The "
            "ablation's 'sft' (NLL on the oracle instead) and 'none' (plain GRPO) are "
            "orapo_core.experimental.AblationConfig's (benchmarks.bench_learning).",
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions, as in TRL's GRPO script: 'facts' (FactS), 'facts_plain', 'facts_recall', 'rouge_l' "
            "or 'token_f1' (text overlap with the reference report), or dotted imports 'package.module:function'. "
            "Weighted by reward_weights (all 1.0 by default). Default: [reward_name], i.e. ['facts']."
        },
    )
    reward_name: str | None = field(
        default=None,
        metadata={
            "help": "One reward by name: an alias of reward_funcs: [reward_name] (older recipes use it); '' is unset."
        },
    )
    facts_beta: float = field(
        default=1.0, metadata={"help": "β of the FactS F-score (1.0 weighs precision and recall alike)."}
    )
    precision_aware: bool = field(
        default=True, metadata={"help": "Use FactS's precision-aware scoring (penalises invented findings)."}
    )
    facts_attribute_check: bool = field(
        default=True,
        metadata={
            "help": "FactS also checks each finding's side, severity and device type against the reference_report column "
            "(a 'small left effusion' against a 'large right effusion' is contradicted); the labels still decide which "
            "findings are right. It acts through the precision-aware penalty only, so it changes nothing with "
            "precision_aware false, nor on rows without a reference report. See the docs' FactS page for the "
            "measurement behind the default."
        },
    )
    facts_form_guard: bool = field(
        default=False,
        metadata={
            "help": "Multiply FactS by the completion's form factor (orapo_core.facts.form): sentences repeated in a "
            "section and fragments are charged by their share, a finding both stated and denied and a section the "
            "reference report has but the completion lacks halve it. Without it GRPO on FactS alone learned degenerate "
            "text (docs, Research, --quick, which turns it on); rounds leave it off: on the clinic story it raised "
            "the false positives of OraPO's rounds. A well-formed report is unchanged."
        },
    )
    finding_probe_weight: float = field(
        default=0.0,
        metadata={
            "help": "Weight of the finding probes' loss (orapo_core.train.finding_probes): two linear probes on the "
            "merged visual tokens and the last prompt state, trained with the round against the oracle report's "
            "FactS labels, as the starter was built; 0 turns them off."
        },
    )
    finding_probe_lr: float = field(
        default=1e-3, metadata={"help": "Learning rate of the finding probes' own two layers."}
    )
    finding_verifier: bool = field(
        default=False,
        metadata={
            "help": "After training, fit the finding verifier (orapo_core.models.verifier) on the round's own rows "
            "and save it beside the model: drafts then leave out a taught finding the model's state does not support."
        },
    )
    finding_verifier_keep: float = field(
        default=0.9, metadata={"help": "Share of the training positives (cross-fitted) each verifier check keeps."}
    )
    finding_verifier_add_max_fpr: float = field(
        default=ADD_MAX_FPR,
        metadata={
            "help": "The verifier's checks that read their finding at cross-fitted AUC >= 0.9 also state it where "
            "a draft is silent, above the cut with the best cross-fitted F1 that calls at most this share of the "
            "round's rows without the finding, at most 10 % of them within each group carrying one other finding "
            "(groups of 20 rows or more), and is right on at least 40 % of the rows it calls; no such cut, no "
            "adding. The default 0.05 is issue 40's goal (0.2, chosen on a development set, gave 15.5 % false "
            "positives); 0 turns adding off (orapo_core.models.verifier)."
        },
    )
    metrics_jsonl: str | None = field(
        default=None,
        metadata={"help": "Where every logged step is appended as one JSON line; default: <output_dir>/metrics.jsonl."},
    )

    #: The oracle modes this config trains with (`orapo_core.experimental.AblationConfig` adds the ablation's).
    oracle_modes: ClassVar[tuple[str, ...]] = ORACLE_MODES

    def __post_init__(self) -> None:
        problems = []
        if self.oracle_mode not in self.oracle_modes:
            problems.append(
                f"oracle_mode must be one of {', '.join(self.oracle_modes)}, got {self.oracle_mode!r}"
                + (
                    ""
                    if self.oracle_modes != ORACLE_MODES
                    else " (the ablation's 'sft' and 'none' are orapo_core.experimental.AblationConfig's)"
                )
            )
        if not 0.0 <= self.dpo_weight_min <= self.dpo_weight_max <= 1.0:
            problems.append(
                f"need 0 <= dpo_weight_min <= dpo_weight_max <= 1, got {self.dpo_weight_min} and {self.dpo_weight_max}: "
                "set dpo_weight_min to the floor (paper: 0.05) and dpo_weight_max to the ceiling (paper: 0.15)"
            )
        if self.dpo_weight_gamma <= 0:
            problems.append(f"dpo_weight_gamma must be > 0 (paper: 2), got {self.dpo_weight_gamma}")
        if not 0.0 <= self.zero_reward_ema_alpha < 1.0:
            problems.append(
                f"zero_reward_ema_alpha must be in [0, 1) (paper: 0.5; 0 disables smoothing), got {self.zero_reward_ema_alpha}"
            )
        if not 0.0 <= self.zero_reward_threshold < 1.0:
            problems.append(
                f"zero_reward_threshold must be in [0, 1) for rewards in [0, 1], got {self.zero_reward_threshold}: "
                "use 0.0 for 'reward exactly 0' or e.g. 0.2 for 'low reward'"
            )
        if self.oracle_nll_weight < 0:
            problems.append(f"oracle_nll_weight must be >= 0 (0: DPO alone), got {self.oracle_nll_weight}")
        if self.oracle_nll_focus not in ("all", "differing"):
            problems.append(f"oracle_nll_focus must be 'all' or 'differing', got {self.oracle_nll_focus!r}")
        if not 0.0 <= self.oracle_nll_min_auc < 1.0:
            problems.append(f"oracle_nll_min_auc must lie in [0, 1) (0: off), got {self.oracle_nll_min_auc}")
        if self.oracle_unread_scope not in ("nll", "report"):
            problems.append(f"oracle_unread_scope must be 'nll' or 'report', got {self.oracle_unread_scope!r}")
        unknown = sorted(set(self.oracle_nll_skip_findings) - set(CHEXPERT_14))
        if unknown:
            problems.append(f"oracle_nll_skip_findings must name CheXpert observations, not {unknown}")
        if self.dpo_beta <= 0:
            problems.append(f"dpo_beta (τ) must be > 0, got {self.dpo_beta}: DPO's usual range is 0.05-0.5")
        if self.finding_probe_weight < 0 or self.finding_probe_lr <= 0:
            problems.append(
                f"finding_probe_weight must be >= 0 (0: off) and finding_probe_lr > 0, got "
                f"{self.finding_probe_weight} and {self.finding_probe_lr}"
            )
        if not 0.0 <= self.finding_verifier_add_max_fpr < 1.0:
            problems.append(f"finding_verifier_add_max_fpr must lie in [0, 1), got {self.finding_verifier_add_max_fpr}")
        if not 0.0 < self.finding_verifier_keep < 1.0:
            problems.append(
                f"finding_verifier_keep must lie strictly between 0 and 1, got {self.finding_verifier_keep}"
            )
        if self.max_rejected_per_group is not None and self.max_rejected_per_group < 1:
            problems.append(
                f"max_rejected_per_group must be >= 1 or None (all failed rollouts), got {self.max_rejected_per_group}"
            )
        # A recipe or the admin form passes booleans through the command line as text ("False"), which TRL's own
        # __post_init__ maps to group / none only as bools, and refuses only at the first step: read the text as a
        # bool here, and refuse a bad value before a round starts.
        if isinstance(self.scale_rewards, str) and self.scale_rewards.strip().lower() in ("true", "false"):
            self.scale_rewards = cast(Any, self.scale_rewards.strip().lower() == "true")  # TRL's field is typed str
        if self.scale_rewards not in (True, False, "group", "batch", "none"):
            problems.append(
                f"scale_rewards must be group, batch or none (true: group, false: none), got {self.scale_rewards!r}"
            )
        # TRL refuses these only inside training (after a round has drafted its first rollouts), or not at all.
        if self.loss_type not in TRL_LOSS_TYPES:
            problems.append(f"loss_type must be one of {', '.join(TRL_LOSS_TYPES)}, got {self.loss_type!r}")
        if self.importance_sampling_level not in ("token", "sequence"):
            problems.append(
                f"importance_sampling_level must be token or sequence, got {self.importance_sampling_level!r}"
            )
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0 (1.0 samples the model as it is), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must lie in (0, 1] (1.0: no nucleus cut), got {self.top_p}")
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0):
            problems.append(
                f"epsilon and epsilon_high (the clipping range) must be >= 0, got {self.epsilon} and {self.epsilon_high}"
            )
        if self.max_completion_length is not None and self.max_completion_length < 1:
            problems.append(f"max_completion_length must be at least 1 token, got {self.max_completion_length}")
        if self.reward_name and self.reward_funcs is not None and list(self.reward_funcs) != [self.reward_name]:
            problems.append(
                f"reward_name ({self.reward_name!r}) is an alias of reward_funcs: [NAME], and reward_funcs is "
                f"{list(self.reward_funcs)!r}: set one of them (--reward_name '' clears a recipe's)"
            )
        if self.reward_funcs is None:
            self.reward_funcs = [self.reward_name or "facts"]
        if not self.reward_funcs or not all(isinstance(n, str) and n for n in self.reward_funcs):
            problems.append(
                "reward_funcs must name rewards: 'facts' or dotted imports such as 'mypkg.rewards:my_reward'"
            )
        elif self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            problems.append(
                f"reward_weights has {len(self.reward_weights)} weights for {len(self.reward_funcs)} reward "
                "functions: give one weight per name in reward_funcs, or none (all 1.0)"
            )
        if problems:
            raise ValueError("OraPOConfig: " + "; ".join(problems) + ".")
        super().__post_init__()
        if self.metrics_jsonl is None:
            self.metrics_jsonl = os.path.join(cast(str, self.output_dir), "metrics.jsonl")  # set by TrainingArguments

    @property
    def studies_per_step(self) -> int:
        """How many studies one optimizer step trains on (in one process): the rows of a step (per-device batch x
        gradient accumulation) over each study's K rollouts, at least 1. The one statement of this rule: training
        refuses a dataset smaller than it, a round needs that many studies, the ablation counts studies seen by it."""
        return self.studies_per_step_of(
            self.per_device_train_batch_size, self.gradient_accumulation_steps, cast(int, self.num_generations)
        )  # GRPOConfig refuses None

    @staticmethod
    def studies_per_step_of(
        per_device_train_batch_size: int, gradient_accumulation_steps: int, num_generations: int
    ) -> int:
        """`studies_per_step` of these settings, for a reader of a recorded recipe (a results file) with no config."""
        rows = int(per_device_train_batch_size) * int(gradient_accumulation_steps)
        return max(1, rows // max(1, int(num_generations)))

    def optimizer_steps(self, n_studies: int) -> int:
        """The optimizer steps training on `n_studies` takes: `max_steps` if set, else its epochs of steps of
        `studies_per_step` studies (a partial last step counts), at least 1."""
        if self.max_steps > 0:
            return self.max_steps
        return max(1, math.ceil(self.num_train_epochs * math.ceil(n_studies / self.studies_per_step)))


@dataclass
class OraPOScriptArguments:
    """Where the round's studies come from."""

    train_csv: str | None = field(
        default=None,
        metadata={
            "help": "The round's studies: a CheXpert Plus style CSV (path_to_image, section_findings, section_impression, "
            "14 label columns, optional oracle_report/clinician_chosen/clinician_rejected) or a dataset folder that "
            "`orapo_core.data.load_dataset` reads (CheXpert Plus, MIMIC-CXR, IU X-ray, PhantomCXR)."
        },
    )
    dataset_kind: str = field(
        default="auto", metadata={"help": "Layout of train_csv: auto, chexpert_plus, mimic_cxr, iu_xray or phantom."}
    )
    split: str | None = field(
        default=None, metadata={"help": "Train only on studies of this split (train, valid, test); default: all."}
    )
    image_root: str | None = field(
        default=None, metadata={"help": "Folder that path_to_image is relative to; default: the CSV's folder."}
    )
    max_studies: int | None = field(default=None, metadata={"help": "Use at most this many studies (paper: 1000)."})
    class_balanced: bool = field(
        default=False, metadata={"help": "Pick the studies class-balanced over the 14 observations (paper: yes)."}
    )
    selection_seed: int = field(
        default=0, metadata={"help": "Seed of the study selection (which studies, in which order)."}
    )
    prompt_text: str | None = field(
        default=None, metadata={"help": "Instruction shown with the image; default: the drafting prompt."}
    )
    phantom_studies: int | None = field(
        default=None,
        metadata={
            "help": "Only when train_csv is null: generate this many PhantomCXR studies (seeded by `seed`) into "
            "<output_dir>/phantomcxr and train on them, so a recipe runs on a fresh clone with no data (the smoke "
            "recipe does). Synthetic data: never set it for a clinical round."
        },
    )


def _to_argv(overrides: Mapping | Sequence[str] | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        argv = []
        for key, value in overrides.items():
            if value is None:
                continue
            if isinstance(value, (list, tuple)):
                argv += [f"--{key}", *map(str, value)]
            else:
                argv += [f"--{key}", str(value)]
        return argv
    return list(overrides)


# HfArgumentParser rewrites the dataclasses' shared `Field.type` while it builds a parser, so two threads parsing
# at once (two admins starting a round together) can see a half-rewritten field ("Only `Union[X, NoneType]` ... is
# allowed ... field 'debug'"); one parse at a time.
_PARSE_LOCK = threading.RLock()  # reentrant: check_overrides holds it around its stderr redirect too


def parse_recipe(
    config_path: str | Path | None = None,
    overrides: Mapping | Sequence[str] | None = None,
    *,
    config_class: type[OraPOConfig] = OraPOConfig,
) -> tuple[OraPOScriptArguments, OraPOConfig, ModelConfig]:
    """Recipe YAML, then overrides (CLI strings like ``["--learning_rate", "1e-5"]`` or a dict) -> the three configs.

    Unknown keys are refused (``ValueError``) rather than ignored, so a typo in a
    recipe or the admin form cannot silently train with a default. `config_class` is a subclass of
    `OraPOConfig` to parse into (the ablation's, `orapo_core.experimental.AblationConfig`).
    """
    with _PARSE_LOCK:
        return _parse_recipe(config_path, overrides, config_class)


def _parse_recipe(
    config_path: str | Path | None, overrides: Mapping | Sequence[str] | None, config_class: type[OraPOConfig]
) -> tuple[OraPOScriptArguments, OraPOConfig, ModelConfig]:
    parser = TrlParser(cast(Any, (OraPOScriptArguments, config_class, ModelConfig)))  # its DataClassType is a NewType
    argv: list[str] = []
    tmp = None
    if config_path is not None:
        argv += ["--config", str(config_path)]
    if isinstance(overrides, Mapping) and config_path is None:
        # A dict alone behaves like a recipe: write it as one, so dict, YAML and CLI share one parsing path.
        tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        yaml.safe_dump(dict(overrides), tmp)
        tmp.close()
        argv = ["--config", tmp.name]
    else:
        argv += _to_argv(overrides)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    return script_args, training_args, model_args
