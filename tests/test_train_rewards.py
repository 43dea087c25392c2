"""The one reward registry: rewards by name or dotted path, called exactly as TRL calls them (completions plus every
dataset column by name)."""

from __future__ import annotations

import pytest

from orapo_core.errors import OrapoError
from orapo_core.facts import facts_reward
from orapo_core.train.rewards import REWARDS, RewardSettings, get_reward


def _call(reward, completions, references):
    # TRL passes prompts, completion_ids, every column and trainer_state; unknown keywords must be ignored.
    return reward(
        prompts=[None] * len(completions),
        completions=completions,
        completion_ids=[[1]] * len(completions),
        reference_report=references,
        labels=["{}"] * len(completions),
        trainer_state=None,
        log_metric=None,
    )


def test_rouge_l_by_hand():
    reward = get_reward("rouge_l")
    assert reward.__name__ == "rouge_l_reward"
    ref = "FINDINGS: Small right pleural effusion."  # words: findings small right pleural effusion (5)
    got = _call(reward, ["Findings: small LEFT pleural effusion", "right small", "", "anything"], [ref, ref, ref, ""])
    # LCS of (findings small left pleural effusion) and the reference = findings small pleural effusion = 4 of 5 and 5
    assert got[0] == pytest.approx(0.8)
    assert got[1] == pytest.approx(2 * 0.5 * 0.2 / 0.7)  # LCS 1 ('right' or 'small'): P = 1/2, R = 1/5
    assert got[2] == 0.0 and got[3] is None  # an empty draft fails; an empty reference cannot be scored


def test_token_f1_ignores_order_and_reads_conversational_completions():
    reward = get_reward("token_f1")
    completion = [{"role": "assistant", "content": "effusion pleural right small findings"}]
    assert _call(reward, [completion], ["FINDINGS: Small right pleural effusion."]) == [pytest.approx(1.0)]
    assert get_reward("facts").__name__ == "facts_reward"


def test_rewards_by_name_by_dotted_path_and_refused_by_code():
    assert {"facts", "facts_plain", "facts_recall", "rouge_l", "token_f1"} <= set(REWARDS)
    assert get_reward("orapo_core.facts.reward.facts_reward") is facts_reward
    assert get_reward("orapo_core.facts.reward:facts_reward") is facts_reward
    assert get_reward("facts", RewardSettings(facts_beta=2.0, precision_aware=False)).__name__ == "facts_f2"
    assert get_reward("facts_plain").__name__ == "facts_plain"
    for bad in ("nonexistent_reward", "orapo_core.facts.reward:nothing_here"):
        with pytest.raises(OrapoError) as exc:
            get_reward(bad)
        assert exc.value.code == "unknown_reward"


def test_facts_is_the_only_registry():
    import orapo_core.facts as facts

    assert not hasattr(facts, "get_reward") and not hasattr(facts.reward, "REWARDS")
