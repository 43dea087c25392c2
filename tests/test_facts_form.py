"""The form guard beside FactS: degenerate text loses the reward it gamed, well-formed reports keep theirs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orapo_core.data.phantom import resolve_prevalence, sample_findings
from orapo_core.data.phantom_reports import write_report
from orapo_core.facts import extract_facts, label_report, make_facts_reward
from orapo_core.facts.form import has_stutter, is_fragment, report_form
from orapo_core.report_layout import report_text
from orapo_core.train.config import OraPOConfig
from orapo_core.train.rewards import RewardSettings, get_reward

ROUND_RECIPE = Path(__file__).resolve().parents[1] / "orapo_core" / "train" / "recipes" / "round-cpu.yaml"
REFERENCE = (
    "FINDINGS: Small right pneumothorax. Left lower lobe atelectasis.\n\n"
    "IMPRESSION: Small right pneumothorax. Left lower lobe atelectasis."
)
# What GRPO on FactS alone wrote after 150 steps (`bench_learning --quick`, seed 1), shortened.
DEGENERATE = (
    "FINDINGS: Small bilateral. pneumothorax. Small bilateral. pneumothorax. No pneumothorax.\n\n"
    "IMPRESSION: pneumothorax."
)


def _reward(reward, completions, reference=REFERENCE):
    n = len(completions)
    return reward(
        prompts=[None] * n,
        completions=completions,
        completion_ids=[[1]] * n,
        labels=[label_report(reference)] * n,
        reference_report=[reference] * n,
        trainer_state=None,
        log_metric=None,
    )


def _phantom_reports(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prevalence = resolve_prevalence({k: 0.3 for k in resolve_prevalence()})
    for _ in range(n):
        findings, impression, _labels = write_report(sample_findings(rng, prevalence), rng, "PA")
        yield report_text(findings, impression)


@pytest.mark.slow  # a sweep of 2,000 PhantomCXR reports
def test_every_phantom_reference_report_is_well_formed():
    # Issue 11's guard must not charge the reports the model is trained to write. (PhantomCXR wrote "Patchy opacity
    # in the right lung base." twice in 4 of 5,000 reports with consolidation and pneumonia; it says it once now.)
    checked = 0
    for text in _phantom_reports(2000):
        facts = extract_facts(text)
        own_sections = tuple(dict.fromkeys(s.section for s in facts.sentences))
        form = report_form(facts, required_sections=own_sections)
        assert form.factor == 1.0, (form.defects, text)
        checked += 1
    assert checked == 2000


def test_degenerate_text_loses_what_it_gamed_and_a_good_report_keeps_its_score():
    guarded, plain = make_facts_reward(form_guard=True), make_facts_reward(form_guard=False)
    good = REFERENCE
    missing_one = (
        "FINDINGS: Left lower lobe atelectasis. The heart is normal in size.\n\n"
        "IMPRESSION: Left lower lobe atelectasis."
    )
    before = _reward(plain, [DEGENERATE, good, missing_one])
    after = _reward(guarded, [DEGENERATE, good, missing_one])
    # unguarded, the degenerate text scores near a well-formed report that misses one of the two findings
    assert before[0] > 0.5 and before[0] > 0.8 * before[2]
    assert after[1] == pytest.approx(before[1]) == pytest.approx(1.0)
    assert after[2] == pytest.approx(before[2])
    assert after[0] < 0.3 * before[0] and after[0] < after[2]
    form = report_form(extract_facts(DEGENERATE))
    assert form.repeated and form.fragments and form.contradictions == ["Pneumothorax"]


def test_what_is_not_a_defect():
    # An impression restating the findings, a denial of the other side, and a plain normal report.
    for text in (
        REFERENCE,
        "FINDINGS: No left pneumothorax. Small right pneumothorax.\n\nIMPRESSION: Small right pneumothorax.",
        "FINDINGS: The heart is normal in size. The lungs are clear.\n\nIMPRESSION: No acute cardiopulmonary process.",
        "COMPARISON: None. None.\n\nFINDINGS: Stable. No pneumothorax.\n\nIMPRESSION: No change.",
    ):
        form = report_form(extract_facts(text))
        assert form.factor == 1.0, (form.defects, text)


def test_each_defect_and_its_charge():
    contradicted = report_form(extract_facts("FINDINGS: No pneumothorax.\n\nIMPRESSION: Moderate right pneumothorax."))
    assert contradicted.contradictions == ["Pneumothorax"] and contradicted.factor == pytest.approx(0.5)
    # a denial of the same side is a contradiction too
    same_side = report_form(extract_facts("FINDINGS: No right pneumothorax.\n\nIMPRESSION: Small right pneumothorax."))
    assert same_side.contradictions == ["Pneumothorax"]
    repeated = report_form(
        extract_facts(
            "FINDINGS: Cardiomegaly. Cardiomegaly. Small left effusion. No edema.\n\nIMPRESSION: Cardiomegaly."
        )
    )
    assert repeated.repeated == [1] and repeated.factor == pytest.approx(1 - 1 / 5)
    no_impression = extract_facts("FINDINGS: Cardiomegaly.")
    assert report_form(no_impression).missing_sections == ["impression"]
    assert report_form(no_impression).factor == pytest.approx(0.5)
    assert report_form(no_impression, required_sections=("findings",)).factor == 1.0
    assert is_fragment("Small bilateral.") and is_fragment("Right upper lobe.") and is_fragment("Moderate, left-sided.")
    assert not is_fragment("Stable.") and not is_fragment("No change.") and not is_fragment("Small right pneumothorax.")
    # what GRPO's drafts on the general pool degenerated into (bench_learning, 2026-12-05)
    stuttered = report_form(
        extract_facts(
            "FINDINGS: Patchy Patchy The heart is normal in size. No pulmonary edema. "
            "Left left ventricle.\n\nIMPRESSION: No acute process."
        )
    )
    assert stuttered.stutters == [0, 2] and stuttered.factor == pytest.approx(1 - 2 / 4)
    assert "2 stuttering sentence(s)" in stuttered.defects
    assert not has_stutter("No pneumothorax or pleural effusion.") and has_stutter("The heart is is normal.")


def test_sections_are_charged_only_when_the_reference_has_them():
    reward = make_facts_reward(form_guard=True)
    findings_only = "FINDINGS: Cardiomegaly."
    assert _reward(reward, [findings_only], reference=findings_only) == [pytest.approx(1.0)]
    both = "FINDINGS: Cardiomegaly.\n\nIMPRESSION: Cardiomegaly."
    assert _reward(reward, [findings_only], reference=both) == [pytest.approx(0.5)]
    # a row scored against labels only charges no section
    got = reward(completions=[findings_only], labels=[{"Cardiomegaly": 1}], reference_report=[""])
    assert got == [pytest.approx(1.0)]


def test_the_recipe_switch_and_the_logged_form():
    from benchmarks.ablation import AblationPlan, quick_plan
    from orapo_core.train.config import parse_recipe

    field = next(f for f in OraPOConfig.__dataclass_fields__.values() if f.name == "facts_form_guard")
    assert field.default is False  # off unless asked for: rounds measured worse with it (docs, Research)
    _script, round_config, _model = parse_recipe(ROUND_RECIPE)
    assert round_config.facts_form_guard is False
    assert quick_plan(AblationPlan(out_dir="x", model_dir="m")).overrides["facts_form_guard"] is True
    on, off = get_reward("facts", RewardSettings(form_guard=True)), get_reward("facts", RewardSettings())
    assert _reward(on, [DEGENERATE])[0] < _reward(off, [DEGENERATE])[0]
    logged = {}
    off(
        completions=[REFERENCE],
        labels=[label_report(REFERENCE)],
        reference_report=[REFERENCE],
        log_metric=lambda key, value: logged.__setitem__(key, value),
    )
    assert "facts_reward/form" not in logged
    on(
        completions=[DEGENERATE, REFERENCE],
        labels=[label_report(REFERENCE)] * 2,
        reference_report=[REFERENCE] * 2,
        log_metric=lambda key, value: logged.__setitem__(key, value),
    )
    assert 0 < logged["facts_reward/form"] < 1
