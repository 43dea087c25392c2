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
    (g,) = miner.mine([RolloutGroup("s1", [0.0, 0.0], oracle="fixed", clinician_chosen="fixed", clinician_rejected="draft")])
    assert g.pairs == (MinedPair("fixed", rollout_index=0), MinedPair("fixed", rejected_text="draft"))
    (only,) = miner.mine([RolloutGroup("s2", [1.0, 1.0], oracle="fixed", clinician_chosen="fixed", clinician_rejected="draft")])
    assert only.pairs == (MinedPair("fixed", rejected_text="draft"),) and only.effective_weight == pytest.approx(0.05)
    off = OraclePairMiner(use_clinician_pairs=False)
    assert off.mine([RolloutGroup("s2", [1.0], oracle="x", clinician_chosen="fixed", clinician_rejected="draft")])[0].pairs == ()
    path = tmp_path / "miner.json"
    miner.save(path)
    fresh = OraclePairMiner()
    fresh.load(path)
    assert fresh.ema.get("s1") == 1.0 and math.isclose(fresh.ema.get("s2"), 0.0)


ORACLE = ("FINDINGS: Pleural thickening along the left lateral chest wall. The heart is normal in size. "
          "No pneumothorax.\n\nIMPRESSION: No acute process.")
MISSED = "FINDINGS: The heart is normal in size. No pneumothorax.\n\nIMPRESSION: No acute process."


def test_a_finding_no_rollout_states_becomes_the_oracle_over_the_oracle_without_it():
    from orapo_core.train.pairs import omission_pairs

    assert omission_pairs(ORACLE, [MISSED, MISSED]) == [("Pleural Other", MISSED)]
    # one rollout that says it is enough: the group did not miss it
    said = "FINDINGS: Calcified pleural plaques along the right chest wall. The heart is normal in size."
    assert omission_pairs(ORACLE, [MISSED, said]) == []
    assert omission_pairs(ORACLE, []) == []  # no rollouts to judge by
    # a denial is not a statement: nothing to take out of an oracle that only denies
    assert omission_pairs("FINDINGS: No pneumothorax. No rib fracture.", [MISSED]) == []


def test_a_finding_every_rollout_states_and_the_oracle_does_not_is_put_in_where_the_rollout_put_it():
    from orapo_core.train.pairs import commission_pairs

    oracle = "FINDINGS: The heart is normal in size. No pneumothorax.\n\nIMPRESSION: No acute process."
    said = "FINDINGS: The heart is normal in size. Pleural thickening along the left chest wall."
    assert commission_pairs(oracle, [said, said]) == [("Pleural Other", (
        "FINDINGS: The heart is normal in size. Pleural thickening along the left chest wall. No pneumothorax."
        "\n\nIMPRESSION: No acute process."))]
    assert commission_pairs(oracle, [said, oracle]) == []  # one rollout without it: not the group's error
    assert commission_pairs(ORACLE, [said]) == []  # the oracle states it too


def test_the_decision_point_is_the_first_word_two_reports_differ_in():
    from orapo_core.train.pairs import decision_point

    assert decision_point(ORACLE, MISSED) == ("FINDINGS: Pleural", "FINDINGS: The")
    assert decision_point("FINDINGS: Heart normal. Small effusion.", "FINDINGS: Heart normal. Small pneumothorax.") == (
        "FINDINGS: Heart normal. Small effusion.", "FINDINGS: Heart normal. Small pneumothorax.")
    assert decision_point("FINDINGS: Mild edema.", "FINDINGS: Mild edema.") is None
    assert decision_point("FINDINGS: Mild edema.", "FINDINGS: Mild edema. More.") is None  # a prefix: no choice


def test_finding_pairs_take_the_rows_of_the_least_failed_rollouts_and_never_the_clinicians():
    miner = OraclePairMiner(finding_pairs=True, threshold=0.99)
    (g,) = miner.mine([RolloutGroup("s1", [0.2, 0.5], oracle=ORACLE, completions=(MISSED, MISSED))])
    assert g.pairs == (MinedPair(ORACLE, rollout_index=0),
                       MinedPair("FINDINGS: Pleural", rejected_text="FINDINGS: The", finding="Pleural Other", eos=False))
    miner = OraclePairMiner(finding_pairs=True, threshold=0.99, finding_pair_span="report")
    (g,) = miner.mine([RolloutGroup("s1", [0.2, 0.5], oracle=ORACLE, completions=(MISSED, MISSED))])
    assert g.pairs == (MinedPair(ORACLE, rollout_index=0), MinedPair(ORACLE, rejected_text=MISSED, finding="Pleural Other"))
    both = OraclePairMiner(finding_pairs=True, use_clinician_pairs=True, threshold=0.99, finding_pair_span="report")
    (g,) = both.mine([RolloutGroup("s1", [0.2, 0.5], oracle=ORACLE, clinician_chosen=ORACLE, clinician_rejected="draft",
                                   completions=(MISSED, MISSED))])
    assert g.pairs == (MinedPair(ORACLE, rejected_text="draft"), MinedPair(ORACLE, rejected_text=MISSED, finding="Pleural Other"))
    (g,) = both.mine([RolloutGroup("s2", [0.2], oracle=ORACLE, clinician_chosen=ORACLE, clinician_rejected="draft",
                                   completions=(MISSED,))])
    assert g.pairs == (MinedPair(ORACLE, rejected_text="draft"),)  # one row, the clinician's
    off = OraclePairMiner(threshold=0.99)
    assert all(p.finding is None for p in off.mine([RolloutGroup("s3", [0.2, 0.5], oracle=ORACLE,
                                                                 completions=(MISSED, MISSED))])[0].pairs)
    with pytest.raises(ValueError, match="finding_pair_span"):
        OraclePairMiner(finding_pair_span="sentence")
