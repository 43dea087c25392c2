"""`OraPOTrainer`: TRL's GRPOTrainer with an oracle term for the prompts whose rollouts fail.

Where it hooks into TRL 1.16, and why there:

- `_calculate_rewards` (wrapped, not changed): keeps the per-function rewards
  of the whole generation batch (already gathered across processes), because
  `_generate_and_score_completions` does not return them.
- `_generate_and_score_completions` (extended after `super()`): TRL has scored
  and normalised the rewards into ``advantages`` but not yet shuffled and split
  the batch into micro-batches. Here the groups are still contiguous (K rows per
  prompt), so pairs are mined per group (`mine_pairs`, `dpo_weights`), each
  row's advantage is scaled by ``(1 - w_i)`` and every row gets its share of the
  oracle term as per-row tensors (``orapo_*``): they then travel through TRL's
  shuffle and split like any other column. The reference log-probs of the
  chosen/rejected answers are computed here too, once per generation, as TRL
  does for its KL term (``ref_model``, or the PEFT model with adapters disabled):
  each study's prompt and image run once and all its answers continue from that
  prompt's cache (`shared_prompt`), for the families where that is checked.
- `_compute_loss` (extended): TRL's GRPO loss plus `oracle_loss` on the same
  micro-batch, through the same forward helper TRL uses
  (`_get_per_token_logps_and_entropies`, images included for VLMs).

So the objective per optimizer step is ``(1/B) Σ_i [(1 − w_i)·L_GRPO,i + w_i·L_DPO,i]``
with ``loss_type='grpo'``. One deviation, on purpose: TRL adds ``beta·KL`` inside
its per-token loss and this trainer leaves it at full weight rather than
``(1 − w_i)·beta·KL`` (at most 15% apart with the paper's w_max); keeping it whole
needs no copy of TRL's loss and keeps the trust region the recipe asked for.
A group without any pair (no failed rollout, or no oracle) trains on GRPO alone.
The oracle and the clinician's draft are tokenised like a completion (the text,
then the end-of-turn token) and cut at ``max_completion_length``; log-probs use
TRL's sampling temperature, for policy and reference alike.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import zlib
from collections.abc import Iterator
from typing import Any, cast

import torch  # noqa: TID253 -- this module is heavy; light ones import it lazily
from accelerate.utils import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    gather_object,
    is_peft_model,
)
from transformers.trainer_utils import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    PREFIX_CHECKPOINT_DIR,
)
from trl import GRPOTrainer  # noqa: TID253 -- this module is heavy; light ones import it lazily
from trl.models import prepare_deepspeed  # noqa: TID253 -- this module is heavy; light ones import it lazily
from trl.models.utils import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    disable_gradient_checkpointing,
)
from trl.trainer.utils import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    add_fused_lm_head,
    pad,
    split_pixel_values_by_grid,
    unsplit_pixel_values_by_grid,
    use_adapter,
)

from orapo_core.train.config import OraPOConfig
from orapo_core.train.dataset import oracle_for, without_sentences_stating
from orapo_core.train.finding_probes import FindingProbes, finding_targets
from orapo_core.train.losses import (
    differing_tokens,
    dpo_loss,
    focused_nll,
    kept_tokens,
    oracle_term,
    sequence_logps,
)
from orapo_core.train.metrics_log import MetricsJsonlCallback
from orapo_core.train.pairs import MinedGroup, OraclePairMiner, RolloutGroup
from orapo_core.train.rewards import rewards_for
from orapo_core.train.shared_prompt import answer_logps_after_prompts, supports_shared_prompt

MINER_STATE_FILE = "orapo_miner_state.json"

# Keys of a TRL batch that the model forward needs besides ids and masks (VLM image tensors and their bookkeeping).
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "image_position_ids",
)
# The per-row columns `_attach_oracle_rows` adds, which travel with their rows.
_ORACLE_KEYS = (
    "orapo_coef",
    "orapo_chosen_key",
    "orapo_rejected_is_rollout",
    "orapo_chosen_ids",
    "orapo_chosen_mask",
    "orapo_chosen_focus",
    "orapo_rejected_ids",
    "orapo_rejected_mask",
    "orapo_ref_chosen_logps",
    "orapo_ref_rejected_logps",
)


class OraPOTrainer(GRPOTrainer):
    """GRPO + an oracle DPO term weighted by each study's smoothed zero-reward rate.

    Dataset columns read besides TRL's ``prompt``/``image``: ``study_id`` (the EMA
    key), ``oracle_report`` (the chosen answer), and with ``use_clinician_pairs``
    ``clinician_chosen``/``clinician_rejected``. ``reward_funcs`` defaults to the
    rewards ``args.reward_funcs`` names (FactS), weighted by TRL's ``args.reward_weights``.

    The oracle term is a few narrow hooks, which the ablation's variants (`orapo_core.experimental`: SFT on the
    oracle, no term) override: `oracle_answers` (which answers a pair's rows carry), `dpo_weights` (the w_i),
    `pair_losses` (each paired row's loss) with `oracle_loss_metric` (where its mean is logged), and
    `oracle_loss` (the term of a micro-batch, None for none).
    """

    _tag_names = ["trl", "grpo", "orapo"]
    _name = "OraPO"
    #: The answers of a pair that `_attach_oracle_rows` tokenises and the loss scores: DPO's chosen and rejected
    #: (with "rejected", the term is a DPO one: a frozen reference scores both). A variant may name fewer.
    oracle_answers: tuple[str, ...] = ("chosen", "rejected")
    #: Where `oracle_loss` logs the term's mean loss over the paired rows.
    oracle_loss_metric = "orapo/dpo_loss"
    # What TRL's base classes declare wider and this trainer's __init__ guarantees: an OraPOConfig, a model, and
    # the K of GRPOConfig (which refuses a None there).
    args: OraPOConfig
    model: Any
    num_generations: int
    num_generations_eval: int

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: OraPOConfig | None = None,
        *,
        miner: OraclePairMiner | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(args, OraPOConfig):
            raise TypeError("OraPOTrainer needs an OraPOConfig as `args` (TRL's GRPOConfig lacks the oracle settings).")
        if reward_funcs is None:
            reward_funcs = rewards_for(args)
        # State one TRL hook hands to the next within a step, since TRL's methods do not return it (declared before
        # TRL's __init__, which may call hooks). tests/test_train_trl_contract.py pins the hooks and their signatures.
        # `_calculate_rewards` -> `_generate_and_score_completions`: the generation batch's rewards per function
        # (gathered across processes), which TRL folds into advantages without returning them.
        self._last_rewards_per_func: torch.Tensor | None = None
        # `_compute_loss` sets `_capture_rollout_logps` for the one forward TRL makes for its own loss, and
        # `_get_per_token_logps_and_entropies` keeps that forward's per-token log-probs of the rollouts in
        # `_rollout_logps`, so `oracle_loss` reuses them for rejected rollouts instead of a second forward.
        self._capture_rollout_logps = False
        self._rollout_logps: torch.Tensor | None = None
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)
        self.miner = miner or OraclePairMiner.from_config(args)
        # Discarded after training; their loss trains the adapter through TRL's own forward (`_compute_loss`).
        self.finding_probes: FindingProbes | None = None
        if args.finding_probe_weight > 0:
            self.finding_probes = FindingProbes(self._unwrapped()).to(self.accelerator.device)
        if "rejected" in self.oracle_answers and self.ref_model is None and not is_peft_model(self._unwrapped()):
            # TRL builds no reference when beta == 0; DPO needs one: the policy as it starts the round.
            self.ref_model = self._frozen_copy(self.model)
        self.add_callback(MetricsJsonlCallback(cast(str, args.metrics_jsonl)))  # set by OraPOConfig.__post_init__

    # ----------------------------------------------------------------- hooks

    def mine_pairs(self, groups: list[RolloutGroup], *, update_state: bool) -> list[MinedGroup]:
        """Pairs and weights per group; the EMA only moves on training batches."""
        return self.miner.mine(groups, update_state=update_state)

    def dpo_weights(self, mined: list[MinedGroup]) -> list[float]:
        """The w_i the loss uses per group (0 where the group has no pair)."""
        return [g.effective_weight for g in mined]

    def oracle_text(self, example: dict[str, Any]) -> str | None:
        """The chosen answer of a study (`dataset.oracle_for`: ``oracle_report``, else ``reference_report``)."""
        return oracle_for(example) or None

    # ------------------------------------------------------- TRL overrides

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> torch.Tensor:
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        k = self.num_generations if mode == "train" else self.num_generations_eval
        rewards = self._scalar_rewards(cast(torch.Tensor, self._last_rewards_per_func))  # set by `super()`'s call
        groups = self._rollout_groups(inputs, rewards, k)
        mined = self.mine_pairs(groups, update_state=mode == "train")
        weights = self.dpo_weights(mined)
        self._attach_oracle_rows(output, mined, weights, k, local_rows=len(inputs))
        if self.finding_probes is not None:
            output["orapo_finding_targets"] = torch.tensor(
                [finding_targets(self.oracle_text(x) or "") for x in inputs],
                dtype=torch.float32,
                device=output["advantages"].device,
            )
        self._log_generation_metrics(mode, mined, weights, rewards)
        return output

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        # transformers' Trainer builds the optimizer from the model's trainable parameters: the finding probes are
        # not the model's, so they join as their own group (their learning rate, no decay) before the scheduler.
        optimizer = super().create_optimizer(model)
        probes = list(self.finding_probes.parameters()) if self.finding_probes is not None else []
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if probes and id(probes[0]) not in present:  # Trainer may ask twice for the same optimizer
            optimizer.add_param_group({"params": probes, "lr": self.args.finding_probe_lr, "weight_decay": 0.0})
        return optimizer

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        # TRL's forward already scores every rollout under the policy: keep its log-probs for the rejected answers.
        self._rollout_logps = None
        self._capture_rollout_logps = "rejected" in self.oracle_answers and inputs.get("orapo_coef") is not None
        probes = self.finding_probes if self.model.training and "orapo_finding_targets" in inputs else None
        try:
            with probes.observe() if probes is not None else contextlib.nullcontext() as seen:
                loss = super()._compute_loss(model, inputs)
        finally:
            self._capture_rollout_logps = False
        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        self._metrics[mode]["orapo/grpo_loss"].append(
            self.accelerator.gather(loss.detach() * accumulation).mean().item()
        )
        if probes is not None:
            assert seen is not None  # `probes.observe()` yields the dict
            probe_loss, parts = probes.loss(seen, inputs, inputs["orapo_finding_targets"])
            if probe_loss is not None:
                loss = loss + self.args.finding_probe_weight * probe_loss / accumulation
                for name, value in parts.items():
                    self._metrics[mode][f"orapo/finding_probe_{name}_loss"].append(value)
        try:
            term = self.oracle_loss(model, inputs)
        finally:
            self._rollout_logps = None
        return loss if term is None else loss + term

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._capture_rollout_logps:
            self._rollout_logps, self._capture_rollout_logps = result[0], False
        return result

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            self.miner.save(os.path.join(folder, MINER_STATE_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and os.path.exists(os.path.join(checkpoint, MINER_STATE_FILE)):
            self.miner.load(os.path.join(checkpoint, MINER_STATE_FILE))

    # ---------------------------------------------------------- the oracle term

    def oracle_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor | None:
        """This micro-batch's share of ``(1/B) Σ_i w_i·L_DPO,i``, None when it has no pair."""
        coefs = inputs.get("orapo_coef")
        if coefs is None:
            return None
        # Only rows that carry a pair are scored: the others have coefficient 0 and would only cost two forwards.
        rows = self._paired_rows(coefs)
        if rows is None:
            return None
        batch = self._select_rows(inputs, rows)
        mode = "train" if self.model.training else "eval"
        row_losses, oracle_logp = self.pair_losses(model, inputs, rows, batch)
        k = self.num_generations if mode == "train" else self.num_generations_eval
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        row_coefs = batch["orapo_coef"]
        term = oracle_term(
            row_losses, row_coefs, num_generations=k, gradient_accumulation_steps=accumulation, batch_rows=coefs.size(0)
        )
        paired = (row_coefs > 0).to(row_losses.dtype)
        stats = self.accelerator.gather(
            torch.stack(
                [(row_losses.detach() * paired).sum(), paired.sum(), (oracle_logp.to(paired.dtype) * paired).sum()]
            ).view(1, 3)
        ).sum(0)
        if stats[1] > 0:
            self._metrics[mode][self.oracle_loss_metric].append((stats[0] / stats[1]).item())
            self._metrics[mode]["orapo/oracle_logp"].append((stats[2] / stats[1]).item())
        return term

    def pair_losses(
        self, model: Any, inputs: dict[str, Any], rows: torch.Tensor, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The oracle term's loss of each paired row (`rows` of `inputs`, selected as `batch`): DPO's, and the
        oracle's mean per-token log-prob under the policy (the paper's "oracle likelihood", for the logs)."""
        focused = self.args.oracle_nll_weight and self.args.oracle_nll_focus == "differing"
        focus = batch.get("orapo_chosen_focus") if focused else None
        chosen, chosen_tokens = self._chosen_logps(
            model, batch, length_normalize=self.args.dpo_length_normalize, tokens=True
        )
        rejected = self._rejected_logps(model, inputs, rows, batch)
        row_losses = dpo_loss(
            chosen,
            rejected,
            batch["orapo_ref_chosen_logps"],
            batch["orapo_ref_rejected_logps"],
            beta=self.args.dpo_beta,
        )
        per_token = (
            chosen
            if self.args.dpo_length_normalize
            else chosen / batch["orapo_chosen_mask"].sum(-1).clamp(min=1).to(chosen.dtype)
        )
        if focus is not None:  # `oracle_nll_focus="differing"`: the oracle's tokens the rejected answer did not write
            row_losses = row_losses + self.args.oracle_nll_weight * focused_nll(
                chosen_tokens, batch["orapo_chosen_mask"], focus
            )
        elif self.args.oracle_nll_weight:
            row_losses = row_losses - self.args.oracle_nll_weight * per_token
        return row_losses, per_token.detach()

    def _paired_rows(self, coefs: torch.Tensor) -> torch.Tensor | None:
        """Indices of the rows with a pair; None when there is none and no other process needs this one's forwards."""
        rows = torch.nonzero(coefs > 0).flatten()
        if rows.numel() == 0:
            # With several processes every rank runs the same forwards, or sharded (ZeRO-3) all-gathers would hang:
            # score one row at coefficient 0 instead of none.
            return rows.new_zeros(1) if self.accelerator.num_processes > 1 else None
        return rows

    def _chosen_logps(
        self,
        model: Any,
        batch: dict[str, Any],
        *,
        length_normalize: bool | None = None,
        reference: bool = False,
        tokens: bool = False,
    ) -> Any:
        """Log-probs of each row's chosen answer, one forward per distinct (study, chosen) of the batch.

        All failed rollouts of a study share its oracle as the chosen answer, so its log-prob is computed once and
        shared (gradients add up exactly as if each row had its own forward). With `tokens` (the policy's only),
        also each row's per-token log-probs: ``(logps, per_token)``.
        """
        first, inverse = self._first_of_each(batch["orapo_chosen_key"])
        distinct = self._select_rows(batch, first)
        if reference:
            logps = self._reference_sequence_logps(
                distinct, distinct["orapo_chosen_ids"], distinct["orapo_chosen_mask"]
            )
        else:
            logps, per_token = self._sequence_logps(
                model,
                distinct,
                distinct["orapo_chosen_ids"],
                distinct["orapo_chosen_mask"],
                length_normalize=length_normalize,
                tokens=True,
            )
            if tokens:
                return logps[inverse], per_token[inverse]
        return logps[inverse]

    def _rejected_logps(
        self, model: Any, inputs: dict[str, Any], rows: torch.Tensor, batch: dict[str, Any]
    ) -> torch.Tensor:
        """Policy log-probs of the rejected answers of ``rows``: a rejected rollout's come from TRL's own forward."""
        from_rollout = batch["orapo_rejected_is_rollout"].bool()
        if self._rollout_logps is None:  # called outside `_compute_loss`: score every row
            from_rollout = torch.zeros_like(from_rollout)
        logps = torch.zeros(rows.numel(), device=rows.device)
        if from_rollout.any():
            assert self._rollout_logps is not None  # `from_rollout` was cleared above otherwise
            per_token = self._rollout_logps[rows.to(self._rollout_logps.device)].float()
            mask = inputs["completion_mask"][rows.to(inputs["completion_mask"].device)]
            logps = sequence_logps(per_token, mask, length_normalize=self.args.dpo_length_normalize)
        text_rows = torch.nonzero(~from_rollout).flatten()
        if text_rows.numel() == 0 and self.accelerator.num_processes > 1:
            text_rows = text_rows.new_zeros(1)  # every rank runs the same forwards (ZeRO-3); this one is discarded
            discard = self._sequence_logps(
                model,
                self._select_rows(batch, text_rows),
                batch["orapo_rejected_ids"][text_rows],
                batch["orapo_rejected_mask"][text_rows],
            )
            return logps + 0.0 * discard.sum()
        if text_rows.numel():
            texts = self._select_rows(batch, text_rows)
            scored = self._sequence_logps(model, texts, texts["orapo_rejected_ids"], texts["orapo_rejected_mask"])
            logps = logps.index_put((text_rows,), scored.to(logps.dtype))
        return logps

    @staticmethod
    def _select_rows(batch: dict[str, Any], rows: torch.Tensor) -> dict[str, Any]:
        """The rows ``rows`` of a batch, images included (per-sample image tensors through TRL's own split/unsplit)."""
        if rows.numel() == len(batch["prompt_ids"]):
            return batch
        index = rows.tolist()
        keys = ("prompt_ids", "prompt_mask", "token_type_ids", "mm_token_type_ids", *_FORWARD_KEYS, *_ORACLE_KEYS)
        picked = split_pixel_values_by_grid({key: batch[key] for key in keys if batch.get(key) is not None})
        for key, value in picked.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                picked[key] = value[rows.to(value.device)]
            elif isinstance(value, (list, tuple)):
                picked[key] = [value[i] for i in index]
        return unsplit_pixel_values_by_grid(picked)

    def _sequence_logps(
        self,
        model: Any,
        inputs: dict[str, Any],
        ids: torch.Tensor,
        mask: torch.Tensor,
        *,
        length_normalize: bool | None = None,
        tokens: bool = False,
    ) -> Any:
        """Log-prob of answers ``ids`` after each row's prompt (and image), through TRL's own forward helper; with
        `tokens`, ``(logps, per_token)``."""
        if length_normalize is None:
            length_normalize = self.args.dpo_length_normalize
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        extra = {key: inputs.get(key) for key in _FORWARD_KEYS if inputs.get(key) is not None}
        for key in ("token_type_ids", "mm_token_type_ids"):  # prompt part kept, answer part zeros, as TRL does
            if inputs.get(key) is not None:
                head = inputs[key][:, : prompt_ids.size(1)]
                extra[key] = torch.cat([head, head.new_zeros(ids.shape)], dim=1)
        per_token, _, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, ids], dim=1),
            torch.cat([prompt_mask, mask], dim=1),
            ids.size(1),
            batch_size=self.args.per_device_train_batch_size,
            **extra,
        )
        logps = sequence_logps(per_token.float(), mask, length_normalize=length_normalize)
        return (logps, per_token.float()) if tokens else logps

    @torch.no_grad()
    def _reference_pair_logps(
        self, batch: dict[str, Any], score_rejected: torch.Tensor, prompt_keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Reference log-probs of each row's chosen answer, and of the rejected answers where ``score_rejected``.

        Where the model's family allows (`shared_prompt`), each distinct prompt runs once and all its answers,
        chosen and rejected, continue from it in one forward; else chosen and rejected are scored row by row.
        Returns ``(chosen, rejected)``, ``rejected`` None when no row is scored.
        """
        if self._reference_shares_prompt() and batch["prompt_ids"].size(1) > 1:
            return self._reference_pair_logps_shared(batch, score_rejected, prompt_keys)
        chosen = self._chosen_logps(None, batch, reference=True)
        text_rows = torch.nonzero(score_rejected).flatten()
        discard = text_rows.numel() == 0 and self.accelerator.num_processes > 1
        if discard:  # every rank runs the same forwards (ZeRO-3): one row, its result unused
            text_rows = text_rows.new_zeros(1)
        if text_rows.numel() == 0:
            return chosen, None
        texts = self._select_rows(batch, text_rows)
        rejected = self._reference_sequence_logps(texts, texts["orapo_rejected_ids"], texts["orapo_rejected_mask"])
        return chosen, (None if discard else rejected)

    def _reference_shares_prompt(self) -> bool:
        """Whether the reference scores a study's answers after one run of its prompt (see `shared_prompt`)."""
        reference = self._unwrapped() if self.ref_model is None else self.accelerator.unwrap_model(self.ref_model)
        return supports_shared_prompt(reference)

    def _reference_pair_logps_shared(
        self, batch: dict[str, Any], score_rejected: torch.Tensor, prompt_keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        chosen_first, chosen_inverse = self._first_of_each(batch["orapo_chosen_key"])
        prompt_first, prompt_index = self._first_of_each(prompt_keys)
        rejected_rows = torch.nonzero(score_rejected).flatten()
        answers = [(batch["orapo_chosen_ids"][chosen_first], batch["orapo_chosen_mask"][chosen_first])]
        if rejected_rows.numel():
            answers.append((batch["orapo_rejected_ids"][rejected_rows], batch["orapo_rejected_mask"][rejected_rows]))
        width = max(ids.size(1) for ids, _ in answers)
        pad_id = self._tokenizer.pad_token_id
        ids = torch.cat([torch.nn.functional.pad(ids, (0, width - ids.size(1)), value=pad_id) for ids, _ in answers])
        mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.size(1)), value=0) for _, m in answers])
        owners = torch.cat([prompt_index[chosen_first], prompt_index[rejected_rows]])
        prompts = self._select_rows(batch, prompt_first)
        kwargs = {key: prompts[key] for key in _FORWARD_KEYS if prompts.get(key) is not None}
        for key in ("token_type_ids", "mm_token_type_ids"):
            if prompts.get(key) is not None:
                kwargs[key] = prompts[key][:, : prompts["prompt_ids"].size(1)]
        with self._reference_model() as model, self.accelerator.autocast():
            unwrapped = self.accelerator.unwrap_model(model)
            # A cache needs the layers run plainly: a checkpointed layer in training mode (the PEFT policy) drops it.
            # TrainingArguments.__post_init__ has parsed a JSON string of these kwargs into a dict by now.
            with disable_gradient_checkpointing(
                unwrapped, cast("dict[str, Any] | None", self.args.gradient_checkpointing_kwargs)
            ):
                per_token = answer_logps_after_prompts(model, prompts, kwargs, owners, ids, mask, unwrapped=unwrapped)
        logps = sequence_logps(per_token.float(), mask, length_normalize=self.args.dpo_length_normalize)
        chosen = logps[: chosen_first.numel()][chosen_inverse]
        return chosen, (logps[chosen_first.numel() :] if rejected_rows.numel() else None)

    @contextlib.contextmanager
    def _reference_model(self) -> Iterator[Any]:
        """The frozen reference: ``ref_model``, or the PEFT policy with its adapters disabled (or its "ref" adapter)."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        model = self._unwrapped()
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            yield self.model

    @torch.no_grad()
    def _reference_sequence_logps(self, inputs: dict[str, Any], ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        with self._reference_model() as model:
            return self._sequence_logps(model, inputs, ids, mask)

    @staticmethod
    def _first_of_each(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For each distinct key, the index of its first row; and for each row, its key's position in that list."""
        _, inverse = torch.unique(keys, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), keys.numel(), dtype=torch.long, device=keys.device)
        first = first.scatter_reduce(0, inverse, torch.arange(keys.numel(), device=keys.device), reduce="amin")
        return first, inverse

    # ---------------------------------------------------------------- helpers

    def _unwrapped(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    def _frozen_copy(self, model: Any) -> Any:
        ref = copy.deepcopy(self.accelerator.unwrap_model(model)).eval()
        # TRL's `add_fused_lm_head` sets `forward` on the instance, a closure over the *policy's* original forward,
        # and the deep copy keeps that closure: remove the instance attribute (the class's forward shows through)
        # and patch the copy afresh, as TRL does for the reference it builds itself (pinned by the contract test).
        vars(ref).pop("forward", None)
        add_fused_lm_head(ref, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        ref.requires_grad_(False)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

    def _scalar_rewards(self, rewards_per_func: torch.Tensor) -> list[float | None]:
        weights = self.reward_weights.to(rewards_per_func.device).unsqueeze(0)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        return [None if bad else float(r) for r, bad in zip(rewards.tolist(), unscorable.tolist(), strict=True)]

    def _rollout_groups(self, inputs: list[dict[str, Any]], rewards: list[float | None], k: int) -> list[RolloutGroup]:
        local = [
            (
                # Without a study_id column, the prompt and oracle stand for the study (crc32: stable across processes).
                str(x["study_id"])
                if x.get("study_id") is not None
                else f"crc{zlib.crc32(repr((x.get('prompt'), self.oracle_text(x))).encode())}",
                self.oracle_text(x),
                x.get("clinician_chosen"),
                x.get("clinician_rejected"),
            )
            for x in inputs
        ]
        rows = gather_object(local)
        groups = []
        for start in range(0, len(rows), k):
            study_id, oracle, chosen, rejected = rows[start]
            if any(row[0] != study_id for row in rows[start : start + k]):
                # TRL's RepeatSampler lays each prompt's K rollouts out contiguously; every group and the shared
                # prompt key of `_attach_oracle_rows` rely on it, so a TRL that stops doing so must fail here.
                raise RuntimeError(
                    f"rows {start}..{start + k - 1} of the generation batch are not one study's "
                    f"{k} rollouts: TRL no longer keeps a prompt's rollouts contiguous."
                )
            groups.append(RolloutGroup(study_id, rewards[start : start + k], oracle, chosen, rejected))
        return groups

    def _encode_answer(self, text: str | None) -> list[int]:
        if not text:
            return []
        ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.eos_token_ids:
            ids = ids + [self.eos_token_ids[-1]]
        return ids[: self.max_completion_length]

    def _attach_oracle_rows(
        self, output: dict[str, Any], mined: list[MinedGroup], weights: list[float], k: int, *, local_rows: int
    ) -> None:
        """Lay each group's pairs onto its rows (one pair per row) and keep this process's slice."""
        total = len(mined) * k
        coef = [0.0] * total
        row_weight = [0.0] * total
        chosen: list[str | None] = [None] * total
        rejected_text: list[str | None] = [None] * total
        is_pair = [False] * total
        chosen_key = list(range(total))  # rows of one study with the same chosen answer share the first one's key
        for g, (group, weight) in enumerate(zip(mined, weights, strict=True)):
            base = g * k
            row_weight[base : base + k] = [weight] * k
            free = [j for j in range(k) if j not in {p.rollout_index for p in group.pairs}]
            first_row: dict[str, int] = {}
            for pair in group.pairs:
                j = pair.rollout_index if pair.rollout_index is not None else free.pop(0)
                row = base + j
                coef[row] = weight / len(group.pairs)
                chosen[row], rejected_text[row], is_pair[row] = pair.chosen, pair.rejected_text, True
                chosen_key[row] = first_row.setdefault(pair.chosen, row)
        start = self.accelerator.process_index * local_rows
        local = slice(start, start + local_rows)
        device = output["advantages"].device
        scale = 1.0 - torch.tensor(row_weight[local], dtype=output["advantages"].dtype, device=device)
        output["advantages"] = output["advantages"] * (scale if output["advantages"].dim() == 1 else scale.unsqueeze(1))
        output["orapo_coef"] = torch.tensor(coef[local], dtype=torch.float32, device=device)
        if "chosen" not in self.oracle_answers:
            return
        pad_id = self._tokenizer.pad_token_id
        chosen_ids = [
            torch.tensor(self._encode_answer(t) if p else [], dtype=torch.long)
            for t, p in zip(chosen[local], is_pair[local], strict=True)
        ]
        output["orapo_chosen_ids"], output["orapo_chosen_mask"] = self._pad_answers(chosen_ids, pad_id, device)
        output["orapo_chosen_key"] = torch.tensor(chosen_key[local], dtype=torch.long, device=device)
        from_rollout = [p and text is None for text, p in zip(rejected_text[local], is_pair[local], strict=True)]
        output["orapo_rejected_is_rollout"] = torch.tensor(from_rollout, dtype=torch.bool, device=device)
        if "rejected" not in self.oracle_answers:
            return
        rejected_ids = []
        for r, (text, p) in enumerate(zip(rejected_text[local], is_pair[local], strict=True)):
            if not p:
                rejected_ids.append(torch.tensor([], dtype=torch.long))
            elif text is not None:
                rejected_ids.append(torch.tensor(self._encode_answer(text), dtype=torch.long))
            else:  # the rollout itself is the rejected answer
                rejected_ids.append(output["completion_ids"][r][output["completion_mask"][r].bool()].cpu())
        output["orapo_rejected_ids"], output["orapo_rejected_mask"] = self._pad_answers(rejected_ids, pad_id, device)
        if self.args.oracle_nll_weight and self.args.oracle_nll_focus == "differing":
            focus = torch.zeros(output["orapo_chosen_ids"].shape, dtype=torch.float32)
            # Findings the model cannot see (`oracle_nll_min_auc`): their sentences are not pulled up.
            skip = self.args.oracle_nll_skip_findings
            for r, (ids, rejected, text) in enumerate(zip(chosen_ids, rejected_ids, chosen[local], strict=True)):
                if ids.numel() and rejected.numel():
                    marked = differing_tokens(ids.tolist(), rejected.tolist())
                    if skip and text:
                        kept = kept_tokens(ids.tolist(), self._encode_answer(without_sentences_stating(text, skip)))
                        marked = [m * k for m, k in zip(marked, kept, strict=True)]
                    focus[r, : ids.numel()] = torch.tensor(marked)
            output["orapo_chosen_focus"] = focus.to(device)
        ref_chosen = torch.zeros(local_rows, device=device)
        ref_rejected = torch.zeros(local_rows, device=device)
        rows = self._paired_rows(torch.tensor([float(p) for p in is_pair[local]], device=device))
        if rows is not None:  # the reference scores only the rows that carry a pair, like the policy in `oracle_loss`
            batch = self._select_rows(output, rows)
            score_rejected = torch.ones_like(rows, dtype=torch.bool)
            ref_tokens = output.get("ref_per_token_logps")  # TRL's own, when beta > 0: the rollouts under the reference
            if ref_tokens is not None:
                rollout = batch["orapo_rejected_is_rollout"].bool()
                mask = output["completion_mask"][rows]
                scored = sequence_logps(ref_tokens[rows].float(), mask, length_normalize=self.args.dpo_length_normalize)
                ref_rejected[rows[rollout]] = scored[rollout]
                score_rejected = ~rollout
            # All rows of a group share the prompt and image: TRL lays each prompt's K rollouts out contiguously.
            prompt_keys = torch.div(rows + start, k, rounding_mode="floor")
            chosen_logps, rejected_logps = self._reference_pair_logps(batch, score_rejected, prompt_keys)
            ref_chosen[rows] = chosen_logps
            if rejected_logps is not None:
                ref_rejected[rows[score_rejected]] = rejected_logps
        output["orapo_ref_chosen_logps"], output["orapo_ref_rejected_logps"] = ref_chosen, ref_rejected

    @staticmethod
    def _pad_answers(seqs: list[torch.Tensor], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # An empty answer is one masked pad token, so every row has a shape; its coefficient is 0.
        masks = [torch.ones_like(s) if s.numel() else torch.zeros(1, dtype=torch.long) for s in seqs]
        seqs = [s if s.numel() else torch.tensor([pad_id], dtype=torch.long) for s in seqs]
        ids = pad(seqs, padding_value=pad_id, padding_side="right").to(device)
        mask = pad(masks, padding_value=0, padding_side="right").to(device)
        return ids, mask

    def _log_generation_metrics(
        self, mode: str, mined: list[MinedGroup], weights: list[float], rewards: list[float | None]
    ) -> None:
        if not mined:
            return
        metrics = self._metrics[mode]
        scored = [r for r in rewards if r is not None]
        n = len(mined)
        metrics["orapo/zero_reward_frac"].append(sum(g.zero_reward_rate for g in mined) / n)
        # Groups whose every scorable rollout failed: GRPO's advantages are all 0 there (the paper's Figure 2).
        metrics["orapo/all_zero_group_frac"].append(sum(1 for g in mined if g.zero_reward_rate == 1.0) / n)
        metrics["orapo/zero_reward_ema"].append(sum(g.smoothed_rate for g in mined) / n)
        metrics["orapo/dpo_weight"].append(sum(g.weight for g in mined) / n)
        metrics["orapo/dpo_weight_effective"].append(sum(weights) / n)
        metrics["orapo/pairs"].append(float(sum(len(g.pairs) for g in mined)) if self.oracle_answers else 0.0)
        if scored:
            mean = sum(scored) / len(scored)
            std = math.sqrt(sum((r - mean) ** 2 for r in scored) / max(len(scored) - 1, 1))
            metrics["orapo/reward_mean"].append(mean)
            metrics["orapo/reward_std"].append(std)
