"""The oracle terms of the OraPO objective, on tensors the trainer already has.

``Loss = (1/B) * sum_i [(1 - w_i) * L_GRPO,i + w_i * L_DPO,i]``. The GRPO part is
TRL's own loss with each rollout's advantage scaled by ``(1 - w_i)`` (exact for
the clipped surrogate, which is linear in a positive scale of the advantage); the
oracle part is computed here per rollout row, so that it survives TRL's
shuffling and splitting of a generation batch into micro-batches.
"""

from __future__ import annotations

import difflib

import torch  # noqa: TID253 -- this module is heavy; light ones import it lazily
import torch.nn.functional as F  # noqa: TID253 -- this module is heavy; light ones import it lazily


def differing_tokens(chosen: list[int], rejected: list[int]) -> list[float]:
    """1.0 for each token of `chosen` outside the longest matching blocks it shares with `rejected` (difflib's
    SequenceMatcher over token ids), 0.0 for the rest: the oracle's tokens the failed answer did not write, such as
    a finding's whole sentence it left out. Where the two are equal every token is 0."""
    focus = [1.0] * len(chosen)
    for block in difflib.SequenceMatcher(None, rejected, chosen, autojunk=False).get_matching_blocks():
        focus[block.b : block.b + block.size] = [0.0] * block.size
    return focus


def kept_tokens(chosen: list[int], without: list[int]) -> list[float]:
    """1.0 for each token of `chosen` that `without` (the same answer with some sentences taken out, tokenized)
    still has, 0.0 for the tokens of the sentences taken out."""
    return [1.0 - taken for taken in differing_tokens(chosen, without)]


def focused_nll(per_token_logps: torch.Tensor, mask: torch.Tensor, focus: torch.Tensor) -> torch.Tensor:
    """Each row's mean negative log-prob over the tokens `focus` marks (within `mask`): shape (B,); 0 for a row with
    no such token."""
    weights = mask.to(per_token_logps.dtype) * focus.to(per_token_logps.dtype)
    return -(per_token_logps * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)


def sequence_logps(
    per_token_logps: torch.Tensor, mask: torch.Tensor, *, length_normalize: bool = False
) -> torch.Tensor:
    """Sum (or, for LN-DPO, mean) of the masked per-token log-probs of each row: shape (B,)."""
    mask = mask.to(per_token_logps.dtype)
    total = (per_token_logps * mask).sum(-1)
    if length_normalize:
        total = total / mask.sum(-1).clamp(min=1.0)
    return total


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    *,
    beta: float,
) -> torch.Tensor:
    """``-log sigmoid(beta * (Delta+ - Delta-))`` per row, with ``Delta = log pi(y|x) - log pi_ref(y|x)``."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin)


def oracle_term(
    row_losses: torch.Tensor,
    row_coefs: torch.Tensor,
    *,
    num_generations: int,
    gradient_accumulation_steps: int = 1,
    batch_rows: int | None = None,
) -> torch.Tensor:
    """The micro-batch's share of ``(1/B) * sum_i w_i * L_DPO,i``.

    ``row_coefs`` holds ``w_i / n_pairs_i`` on rows that carry a pair of group i
    and 0 elsewhere, so summing ``coef * loss`` over a group's rows gives
    ``w_i * mean(pair losses)``. A micro-batch of R rows holds ``R / K`` groups'
    worth of rows; dividing by that and by the accumulation steps makes the sum
    over one optimizer step the mean over its groups, as TRL does for GRPO.
    ``batch_rows`` is R when ``row_losses`` holds only the micro-batch's paired
    rows (the others contribute 0 anyway); default: ``row_losses.size(0)``.
    """
    rows = row_losses.size(0) if batch_rows is None else batch_rows
    groups = rows / num_generations
    weighted = (row_coefs.to(row_losses.dtype) * row_losses).sum()
    return weighted / (groups * gradient_accumulation_steps)
