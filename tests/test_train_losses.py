"""The oracle terms against hand computations on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from orapo_core.train.losses import dpo_loss, oracle_term, sequence_logps


def _logsig(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_sequence_logps_sum_and_length_normalised():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert sequence_logps(logps, mask).tolist() == [-6.0, -1.0]
    assert sequence_logps(logps, mask, length_normalize=True).tolist() == [-2.0, -0.5]


def test_dpo_loss_by_hand():
    pc, pr = torch.tensor([-4.0, -10.0]), torch.tensor([-6.0, -3.0])
    rc, rr = torch.tensor([-5.0, -9.0]), torch.tensor([-5.0, -4.0])
    got = dpo_loss(pc, pr, rc, rr, beta=0.5)
    # row 0: (−4+5) − (−6+5) = 2 → −log σ(1); row 1: (−10+9) − (−3+4) = −2 → −log σ(−1)
    assert got.tolist() == pytest.approx([-_logsig(1.0), -_logsig(-1.0)])


def test_combined_objective_by_hand():
    """Two groups of K=2: (1/B)·Σ_i [(1−w_i)·L_GRPO,i + w_i·L_DPO,i], split over two micro-batches."""
    k = 2
    w = [0.15, 0.0]  # group 0 has pairs on both rows, group 1 none
    l_dpo = torch.tensor([0.4, 0.8, 0.3, 0.9])  # per row; only group 0's rows count
    coefs = torch.tensor([w[0] / 2, w[0] / 2, 0.0, 0.0])
    whole = oracle_term(l_dpo, coefs, num_generations=k)
    assert whole.item() == pytest.approx((w[0] * (0.4 + 0.8) / 2) / 2)  # mean over B=2 groups
    # the same rows in two accumulation steps of one group's worth each add up to the same value
    first = oracle_term(l_dpo[:2], coefs[:2], num_generations=k, gradient_accumulation_steps=2)
    second = oracle_term(l_dpo[2:], coefs[2:], num_generations=k, gradient_accumulation_steps=2)
    assert (first + second).item() == pytest.approx(whole.item())
    # the GRPO part: TRL's mean over rows of advantage-scaled surrogates equals the per-group weighting
    l_grpo_rows = torch.tensor([1.0, -0.5, 0.2, 0.6])
    scale = torch.tensor([1 - w[0]] * 2 + [1 - w[1]] * 2)
    trl_mean = (scale * l_grpo_rows).mean()
    by_group = ((1 - w[0]) * (1.0 - 0.5) / 2 + (1 - w[1]) * (0.2 + 0.6) / 2) / 2
    assert trl_mean.item() == pytest.approx(by_group)
