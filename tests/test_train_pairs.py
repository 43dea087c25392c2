"""Pair mining, the DPO weight schedule and the per-study EMA, on literal numbers."""

from __future__ import annotations

import math

import pytest

from orapo_core.train.pairs import (
    MinedPair,
    OraclePairMiner,
    RolloutGroup,
    ZeroRewardEMA,
    dpo_weight,
    zero_reward_rate,
)


def test_weight_schedule_on_literal_numbers():
    assert dpo_weight(0.0) == pytest.approx(0.05)
    assert dpo_weight(1.0) == pytest.approx(0.15)
    assert dpo_weight(0.5) == pytest.approx(0.05 + 0.10 * 0.25)  # gamma 2: 0.075
    assert dpo_weight(0.5, gamma=1.0) == pytest.approx(0.10)
    assert dpo_weight(2.0) == pytest.approx(0.15)  # clipped at w_max
    assert dpo_weight(0.3, w_min=0.1, w_max=0.3, gamma=3.0) == pytest.approx(0.1 + 0.2 * 0.027)


def test_zero_reward_rate_threshold_and_unscorable():
    assert zero_reward_rate([0.0, 0.5, 0.0, 1.0]) == 0.5
    assert zero_reward_rate([0.1, 0.5, 0.0, 1.0], threshold=0.2) == 0.5
    # None / NaN are neither failed nor passed: out of the denominator
    assert zero_reward_rate([0.0, None, float("nan"), 1.0]) == 0.5
    assert zero_reward_rate([None, None]) == 0.0


def test_ema_first_visit_then_smoothing_and_state_roundtrip():
    ema = ZeroRewardEMA(alpha=0.5)
    assert ema.update("s1", 1.0) == 1.0  # first visit: z~ = z
    assert ema.update("s1", 0.0) == 0.5
    assert ema.update("s1", 0.5) == 0.5
    assert ema.update("s1", 1.0) == 0.75
    assert ema.update("s2", 0.25) == 0.25  # studies are independent
    assert ema.peek("s1", 0.0) == 0.375 and ema.get("s1") == 0.75  # peek does not record
    restored = ZeroRewardEMA(alpha=0.9)
    restored.load_state_dict(ema.state_dict())
    assert restored.alpha == 0.5 and restored.update("s1", 0.0) == 0.375
    with pytest.raises(ValueError):
        ZeroRewardEMA(alpha=1.0)


def test_all_zero_group_rejects_every_rollout_with_max_weight():
    miner = OraclePairMiner()
    (g,) = miner.mine([RolloutGroup("s1", [0.0, 0.0, 0.0, 0.0], oracle="FINDINGS: effusion.")])
    assert g.zero_reward_rate == 1.0 and g.smoothed_rate == 1.0
    assert g.weight == pytest.approx(0.15) and g.effective_weight == pytest.approx(0.15)
    assert [p.rollout_index for p in g.pairs] == [0, 1, 2, 3]
    assert all(p.chosen == "FINDINGS: effusion." and p.rejected_text is None for p in g.pairs)


def test_mixed_group_rejects_failed_lowest_first_capped():
    miner = OraclePairMiner(threshold=0.2, max_rejected_per_group=2)
    (g,) = miner.mine([RolloutGroup("s1", [0.9, 0.1, 0.0, 0.15, 0.6, None], oracle="oracle")])
    assert g.zero_reward_rate == pytest.approx(3 / 5)
    assert [p.rollout_index for p in g.pairs] == [2, 1]  # 0.0 then 0.1; 0.15 capped away; None never rejected
    assert g.weight == pytest.approx(0.05 + 0.10 * 0.36)


def test_no_failure_or_no_oracle_means_no_pairs_and_zero_effective_weight():
    miner = OraclePairMiner()
    passed, orphan = miner.mine(
        [RolloutGroup("s1", [0.5, 1.0], oracle="oracle"), RolloutGroup("s2", [0.0, 0.0], oracle="  ")]
    )
    assert passed.pairs == () and passed.weight == pytest.approx(0.05) and passed.effective_weight == 0.0
    assert orphan.pairs == () and orphan.weight == pytest.approx(0.15) and orphan.effective_weight == 0.0


def test_ema_smooths_the_weight_across_visits_and_eval_does_not_move_it():
    miner = OraclePairMiner()
    miner.mine([RolloutGroup("s1", [0.0, 0.0, 0.0, 0.0], oracle="o")])
    (peeked,) = miner.mine([RolloutGroup("s1", [1.0, 1.0, 1.0, 1.0], oracle="o")], update_state=False)
    assert peeked.smoothed_rate == 0.5 and miner.ema.get("s1") == 1.0
    (second,) = miner.mine([RolloutGroup("s1", [1.0, 1.0, 1.0, 1.0], oracle="o")])
    assert second.smoothed_rate == 0.5 and second.weight == pytest.approx(0.075)


def test_clinician_pair_joins_and_makes_room(tmp_path):
    miner = OraclePairMiner(use_clinician_pairs=True)
    (g,) = miner.mine(
        [RolloutGroup("s1", [0.0, 0.0], oracle="fixed", clinician_chosen="fixed", clinician_rejected="draft")]
    )
    assert g.pairs == (MinedPair("fixed", rollout_index=0), MinedPair("fixed", rejected_text="draft"))
    (only,) = miner.mine(
        [RolloutGroup("s2", [1.0, 1.0], oracle="fixed", clinician_chosen="fixed", clinician_rejected="draft")]
    )
    assert only.pairs == (MinedPair("fixed", rejected_text="draft"),) and only.effective_weight == pytest.approx(0.05)
    off = OraclePairMiner(use_clinician_pairs=False)
    assert (
        off.mine([RolloutGroup("s2", [1.0], oracle="x", clinician_chosen="fixed", clinician_rejected="draft")])[0].pairs
        == ()
    )
    path = tmp_path / "miner.json"
    miner.save(path)
    fresh = OraclePairMiner()
    fresh.load(path)
    assert fresh.ema.get("s1") == 1.0 and math.isclose(fresh.ema.get("s2"), 0.0)
