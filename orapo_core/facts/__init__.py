"""FactS: clinical facts, their entailment against reference labels, the reward and the metrics.

Standard library only, so `orapo label` starts in milliseconds and never pulls
torch. `extract_facts` is the rule-based extractor; `LLMFactExtractor` (in
`orapo_core.facts.llm`) is the optional one behind the same `extract` interface.
"""

from orapo_core.facts.consistency import SelfConsistency, keep_agreed, self_consistency
from orapo_core.facts.edits import REMOVED, score_edit
from orapo_core.facts.extract import Fact, ReportFacts, extract_facts, label_report, labels_from_facts
from orapo_core.facts.labels import normalize_labels
from orapo_core.facts.reward import facts_reward, make_facts_reward
from orapo_core.facts.score import FactJudgement, ReportScore, SentenceScore, score_facts, score_report
from orapo_core.facts.text import Sentence

__all__ = [
    "REMOVED",
    "Fact",
    "FactJudgement",
    "ReportFacts",
    "ReportScore",
    "SelfConsistency",
    "Sentence",
    "SentenceScore",
    "extract_facts",
    "facts_reward",
    "keep_agreed",
    "label_report",
    "labels_from_facts",
    "make_facts_reward",
    "normalize_labels",
    "score_edit",
    "score_facts",
    "score_report",
    "self_consistency",
]
