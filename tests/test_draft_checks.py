"""Issue 41 §4: a draft that must not be signed as it is says so.

The draft checks find every kind of problem the radiologists reported (and no problem in reports a radiologist
would sign, PhantomCXR's reference reports among them); leaving sentences out at the operating point always gives
a well-formed report; the rounds' gate counts flagged drafts; and the server refuses to accept one unchanged.
Drafts quoted as "the starter's" are the shipped starter's own greedy drafts and samples on PhantomCXR films
(seed 30,000,001, 256 px).
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from orapo_core.data.phantom import resolve_prevalence, sample_findings
from orapo_core.data.phantom_reports import write_report
from orapo_core.facts.consistency import add_findings, split_agreed, split_unsupported
from orapo_core.facts.draft_checks import CODES, DraftProblem, check_draft
from orapo_core.report_layout import numbered_items, renumbered, report_text, sections, split_report

LAYOUT = {"empty_section", "empty_item", "item_numbering"}


def codes(text: str) -> list[str]:
    return [p.code for p in check_draft(text)]


# --- every problem is found ----------------------------------------------------------------------------------------


def test_the_issues_drafts_are_flagged_with_a_reason_naming_the_finding_and_the_sentences():
    draft = (
        "FINDINGS: Small left pleural effusion. Heart normal in size.\n\n"
        "IMPRESSION: Moderate left pleural effusion. Mild cardiomegaly."
    )
    denied, severity = check_draft(draft)
    assert denied == DraftProblem(
        "stated_and_denied",
        'Cardiomegaly is stated in "Mild cardiomegaly" and denied in "Heart normal in size".',
        ("Mild cardiomegaly.", "Heart normal in size."),
    )
    assert severity.code == "severity_conflict"
    assert severity.reason == (
        'Pleural effusion is called small in "Small left pleural effusion" and moderate in '
        '"Moderate left pleural effusion".'
    )
    sides = check_draft(
        "FINDINGS: Consolidation in the left lung base. The heart is normal in size.\n\n"
        "IMPRESSION: Consolidation in the right lung base."
    )  # the starter's
    assert [p.reason for p in sides] == [
        'The findings put consolidation on the left ("Consolidation in the left lung base") and the impression puts '
        'it on the right ("Consolidation in the right lung base").'
    ]
    twice = check_draft(
        "FINDINGS: There is a small right pleural effusion. There is widening of the superior "
        "mediastinum. There is a small right pleural effusion.\n\nIMPRESSION: Small right pleural "
        "effusion."
    )  # the starter's
    assert [(p.code, p.reason) for p in twice] == [
        (
            "repeated_sentence",
            'The sentence "There is a small right pleural effusion" is written twice in the findings.',
        )
    ]


@pytest.mark.parametrize(
    ("draft", "code", "reason"),
    [
        (
            "FINDINGS: Cardiomegaly.\n\nIMPRESSION: 1. Small left pleural effusion. 2. 3. Cardiomegaly.",
            "empty_item",
            "Item 2 of the impression is empty.",
        ),
        (
            "FINDINGS: Cardiomegaly.\n\nIMPRESSION: 1. Cardiomegaly. 3. Small left pleural effusion.",
            "item_numbering",
            "The impression's items are numbered 1, 3, not 1 to 2.",
        ),
        ("FINDINGS: Heart size is normal.\n\nIMPRESSION:", "empty_section", "The impression section is empty."),
        (
            "FINDINGS:\n\nIMPRESSION: No acute cardiopulmonary process.",
            "empty_section",
            "The findings section is empty.",
        ),
        (
            "FINDINGS: No pneumothorax. Patchy left lung base opacity. Patchy left lung base opacity.",
            "repeated_sentence",
            'The sentence "Patchy left lung base opacity" is written twice in the findings.',
        ),
        (
            "FINDINGS: No pneumothorax or pleural effusion.\n\nIMPRESSION: Small right pneumothorax.",
            "stated_and_denied",
            'Pneumothorax is stated in "Small right pneumothorax" and denied in "No pneumothorax or pleural effusion".',
        ),
        (
            "FINDINGS: No pleural effusion.\n\nIMPRESSION: Possible small left pleural effusion.",
            "stated_and_denied",
            'Pleural effusion is stated in "Possible small left pleural effusion" and denied in "No pleural effusion".',
        ),
        (
            "FINDINGS: Patchy opacity in the left lung base.\n\nIMPRESSION: Pneumonia in the right lung base.",
            "side_conflict",
            'The findings put lung opacity on the left ("Patchy opacity in the left lung base") and the '
            'impression puts pneumonia on the right ("Pneumonia in the right lung base").',
        ),
        (
            "FINDINGS: Mild interstitial pulmonary edema.\n\nIMPRESSION: Moderate pulmonary edema.",
            "severity_conflict",
            'Edema is called mild in "Mild interstitial pulmonary edema" and moderate in "Moderate pulmonary edema".',
        ),
        (
            "FINDINGS: Small left pleural effusion.\n\nIMPRESSION: Moderate pleural effusion.",
            "severity_conflict",
            'Pleural effusion is called small in "Small left pleural effusion" and moderate in "Moderate pleural effusion".',
        ),
    ],
)
def test_each_kind_of_problem_is_found(draft, code, reason):
    assert [(p.code, p.reason) for p in check_draft(draft)] == [(code, reason)]


def test_every_code_is_listed_in_order_and_a_problem_travels_as_a_dict():
    draft = (
        "FINDINGS: No pneumothorax. No pneumothorax. Small right pneumothorax. Patchy opacity in the left lung base.\n\n"
        "IMPRESSION: 2. 3. Patchy right lung base opacity. 1. Mild cardiomegaly. 5. Moderate cardiomegaly."
    )
    problems = check_draft(draft)
    assert [p.code for p in problems] == list(CODES[1:])  # all but an empty section, in the order of CODES
    assert problems[1].reason == "The impression's items are numbered 2, 3, 1, 5, not 1 to 4."
    assert all(DraftProblem.from_dict(p.to_dict()) == p for p in problems)


# --- and no problem where a radiologist sees none ------------------------------------------------------------------


@pytest.mark.parametrize(
    "draft",
    [
        "FINDINGS: No pneumothorax.\n\nIMPRESSION: No pneumothorax.",  # a denial repeated in the impression
        "FINDINGS: Mild cardiomegaly.\n\nIMPRESSION: Mild cardiomegaly.",  # a finding restated
        "FINDINGS: Pleural effusion.\n\nIMPRESSION: Small left pleural effusion.",  # a side given in one section only
        "FINDINGS: Small bilateral pleural effusions.\n\nIMPRESSION: Small left pleural effusion.",  # bilateral, see docs
        "FINDINGS: Small left effusion. Trace right effusion.\n\nIMPRESSION: Small bilateral pleural effusions.",
        "FINDINGS: Nodule in the left upper lung. Nodule in the right lower lung.\n\nIMPRESSION: Right lower lung nodule.",
        "No definite pneumothorax. Possible tiny left apical pneumothorax.",  # a narrowed denial
        "No large pleural effusion. Small left effusion.",
        "No right pleural effusion. Small left pleural effusion.",  # a denial of the other side
        "No acute rib fracture. Old healed left 6th rib fracture.",
        "The heart is not significantly enlarged. Mild cardiomegaly.",
        "Interval removal of the endotracheal tube. Nasogastric tube in the stomach.",  # another device
        "FINDINGS: Small left pleural effusion.\n\nIMPRESSION: Small to moderate left pleural effusion.",  # grades overlap
        "FINDINGS: Mild cardiomegaly.\n\nIMPRESSION: 1. Cardiomegaly. 2. No pneumothorax.",
        "FINDINGS: Heart size is normal.\n\nIMPRESSION: See findings.",
        "",
    ],
)
def test_reports_a_radiologist_would_sign_raise_nothing(draft):
    assert check_draft(draft) == []


def phantom_reports(n: int, seed: int, prevalence: dict[str, float]) -> list[str]:
    reports = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        findings, impression, _ = write_report(sample_findings(rng, prevalence), rng, "AP" if i % 2 else "PA")
        reports.append(report_text(findings, impression))
    return reports


def test_200_phantomcxr_reference_reports_raise_nothing():
    usual = phantom_reports(100, 41, resolve_prevalence())
    crowded = phantom_reports(100, 42, dict.fromkeys(resolve_prevalence(), 0.35))  # several findings each
    numbered = [r for r in usual + crowded if numbered_items(split_report(r)[1])]
    assert len(numbered) > 10 and sum("bilateral" in r for r in crowded) > 5  # the checks had something to read
    flagged = {r: p for r in usual + crowded if (p := check_draft(r))}
    assert flagged == {}


# --- leaving sentences out at the operating point ------------------------------------------------------------------

# The starter's draft and its four samples (issue 41: "1. ... 2. 3. ..." once its left-out sentences were removed)
NUMBERED = (
    "FINDINGS: Portable AP upright view of the chest. Consolidation in the left lung base. Mild pulmonary "
    "vascular congestion and interstitial edema. The heart is normal in size. No pneumothorax or pleural "
    "effusion.\n\nIMPRESSION: 1. Consolidation in the left lung base. 2. Mild pulmonary edema."
)
NUMBERED_SAMPLES = [
    "FINDINGS: There is a patchy airspace opacity in the left upper lung. Mild interstitial pulmonary edema. No "
    "pneumothorax or pleural effusion.\n\nIMPRESSION: Patchy right lung base opacity. Severe pulmonary edema.",
    "FINDINGS: Patchy opacity in the right upper lung. Severe pulmonary edema. Blunting of the left costophrenic "
    "angle, possibly a small pleural effusion. The heart is normal in size. No focal consolidation. No pneumothorax."
    "\n\nIMPRESSION: 1. Patchy left lung base opacity. 2. Mild pulmonary edema.",
    "FINDINGS: There is a patchy airspace opacity in the right lung base. Severe pulmonary edema. No pleural effusion "
    "or pneumothorax. No displaced rib fracture.\n\nIMPRESSION: 1. Patchy left midlung opacity. 2. Moderate pulmonary "
    "edema.",
    "FINDINGS: Consolidation in the left upper lung. Mild pulmonary vascular congestion and interstitial edema. "
    "Blunting of the left costophrenic angle, possibly a small pleural effusion. The heart is normal in size. No "
    "pneumothorax. No displaced rib fracture.\n\nIMPRESSION: 1. Consolidation in the right lung base. 2. Mild "
    "pulmonary edema.",
]
# The starter's, which lost its whole impression
ONE_IMPRESSION = (
    "FINDINGS: Patchy opacity in the left lung base. The heart is normal in size. No pulmonary edema. "
    "No pneumothorax or pleural effusion.\n\nIMPRESSION: Patchy left lung base opacity."
)
ONE_IMPRESSION_SAMPLES = [
    "FINDINGS: There is focal consolidation in the left lung base. No pneumothorax or pleural effusion.\n\n"
    "IMPRESSION: Consolidation in the right lower lobe.",
    "FINDINGS: Consolidation in the right lung base. No pleural effusion or pneumothorax.\n\nIMPRESSION: "
    "Consolidation in the right lower lobe.",
    "FINDINGS: There is a small right pleural effusion. The heart is normal in size.\n\nIMPRESSION: Small left pleural "
    "effusion.",
    "FINDINGS: There is a large left pneumothorax. No pulmonary edema.\n\nIMPRESSION: Patchy left lung base opacity.",
]


def test_an_impression_item_left_out_is_renumbered_not_left_empty():
    text, left_out = split_agreed(NUMBERED, NUMBERED_SAMPLES, 0.5)
    assert left_out == ["Consolidation in the left lung base."] * 2
    assert text == (
        "FINDINGS: Portable AP upright view of the chest. Mild pulmonary vascular congestion and "
        "interstitial edema. The heart is normal in size. No pneumothorax or pleural effusion.\n\n"
        "IMPRESSION: 1. Mild pulmonary edema."
    )  # was "IMPRESSION: 1. 2. Mild pulmonary edema."
    assert check_draft(text) == []


def test_a_section_whose_every_sentence_is_left_out_is_kept_and_points_to_the_other():
    text, left_out = split_agreed(ONE_IMPRESSION, ONE_IMPRESSION_SAMPLES, 0.5)
    assert left_out == ["Patchy opacity in the left lung base.", "Patchy left lung base opacity."]
    assert text == (
        "FINDINGS: The heart is normal in size. No pulmonary edema. No pneumothorax or pleural effusion."
        "\n\nIMPRESSION: See findings."
    )  # was the findings alone
    assert split_unsupported(
        "FINDINGS: Small left pneumothorax.\n\nIMPRESSION: Small left pneumothorax. No acute fracture.",
        {"Pneumothorax"},
    )[0] == ("FINDINGS: See impression.\n\nIMPRESSION: No acute fracture.")
    assert split_unsupported(
        "FINDINGS: Small left pneumothorax.\n\nIMPRESSION: 1. Small left pneumothorax.", {"Pneumothorax"}
    ) == ("", ["Small left pneumothorax.", "Small left pneumothorax."])


def test_a_finding_check_addition_replaces_the_pointer_it_would_otherwise_follow():
    emptied = split_agreed(ONE_IMPRESSION, ONE_IMPRESSION_SAMPLES, 0.5)[0]
    text, added, _ = add_findings(emptied, {"Pneumothorax": "Small left pneumothorax."})
    assert added == ["Small left pneumothorax."]
    assert split_report(text)[1] == "Small left pneumothorax."  # not "See findings. Small left pneumothorax."


def test_leaving_out_any_findings_sentences_always_gives_a_well_formed_report():
    """Every PhantomCXR reference report with a numbered impression, with each of its stated findings vetoed in
    turn and then all of them: numbered 1 to n, no empty item, no section lost or emptied."""
    from orapo_core.facts.consistency import stated_findings

    reports = [
        r
        for r in phantom_reports(200, 43, dict.fromkeys(resolve_prevalence(), 0.35))
        if numbered_items(split_report(r)[1])
    ]
    cut = 0
    for report in reports:
        found = sorted(stated_findings(report))
        for vetoed in [{name} for name in found] + [set(found)]:
            text, left_out = split_unsupported(report, vetoed)
            cut += bool(left_out)
            assert not LAYOUT & set(codes(text)), (report, vetoed, text)
            if text:
                assert [name for name, _ in sections(text)] == [name for name, _ in sections(report)]
    assert len(reports) > 10 and cut > 50


def test_renumbering_keeps_text_that_is_no_list():
    assert renumbered("1. A. 2. 3. C.") == "1. A. 2. C."
    assert renumbered("2. B. 3. C.") == "1. B. 2. C."
    assert renumbered("Fracture of rib 4. 2 cm nodule.") == "Fracture of rib 4. 2 cm nodule."
    assert numbered_items("1. Fracture of rib 4. 2. Nodule 1.5 cm.") == [
        (1, "Fracture of rib 4."),
        (2, "Nodule 1.5 cm."),
    ]


# --- the services: what the Read tab asks, and the server's refusal -----------------------------------------------


def draft_record(text: str):
    from db.records import DraftRecord

    return DraftRecord(
        id=1,
        study_id=1,
        model_version_id=None,
        model_name="starter",
        prompt="p",
        sampling={},
        text=text,
        facts={},
        sentence_scores=[],
        latency_ms=1,
        created_by=1,
        created_at=datetime.now(UTC),
    )


def test_the_read_tab_gets_the_problems_and_whether_accepting_unchanged_is_offered():
    from app.services.reading import can_accept_unchanged, draft_problems

    flawed = "FINDINGS: Small left pleural effusion.\n\nIMPRESSION: Moderate left pleural effusion."
    fixed = "FINDINGS: Small left pleural effusion.\n\nIMPRESSION: Small left pleural effusion."
    assert [p.code for p in draft_problems(flawed)] == ["severity_conflict"] and draft_problems(fixed) == []
    assert draft_record(flawed).problems == draft_problems(flawed)  # the draft the tab receives carries them
    assert not can_accept_unchanged(flawed, flawed)
    assert can_accept_unchanged(fixed, fixed + "  ") and not can_accept_unchanged(fixed, flawed)
    assert not can_accept_unchanged("", "")


def test_the_server_refuses_to_accept_a_flagged_draft_unchanged():
    from app.services.reading import refuse_unsignable_draft
    from orapo_core.error_codes import CATALOGUE
    from orapo_core.errors import OrapoError

    refuse_unsignable_draft(draft_record("FINDINGS: Heart size is normal.\n\nIMPRESSION: No acute process."))
    with pytest.raises(OrapoError) as refused:
        refuse_unsignable_draft(draft_record(NUMBERED.replace("1. Consolidation in the left lung base.", "1.")))
    assert refused.value.code == "draft_has_problems"
    assert refused.value.message == (
        "Nothing was signed: the draft cannot be accepted unchanged while the checks above the report flag it (Item 1 "
        "of the impression is empty); correct it and sign it as written with Save and sign."
    )
    with pytest.raises(OrapoError, match="and 1 more"):
        refuse_unsignable_draft(
            draft_record(
                "FINDINGS: Small left pleural effusion. Heart normal in size.\n\n"
                "IMPRESSION: Moderate left pleural effusion. Mild cardiomegaly."
            )
        )
    assert any("draft_has_problems" in codes for codes in CATALOGUE.values())


# --- the rounds' gate ----------------------------------------------------------------------------------------------

CLEAN = "FINDINGS: Small left pleural effusion.\n\nIMPRESSION: Small left pleural effusion."
FLAWED = (
    "FINDINGS: Small left pleural effusion. Patchy opacity in the left lung base.\n\n"
    "IMPRESSION: Moderate left pleural effusion. Patchy right lung base opacity."
)
FINDINGS = ("Cardiomegaly", "Edema", "Atelectasis", "Pleural Effusion", "Support Devices")


def gate_rows(n: int, missed_every: int, *, flawed: int, reward_shift: float = 0.0, source: str = "holdout_studies"):
    """One model's prediction rows on n held-out studies (as `tests/test_rounds_gate.py` builds them): study i shows
    FINDINGS[i % 5], which the model misses on every `missed_every`-th study; its first `flawed` drafts are flagged
    (a side and a severity conflict), the others clean."""
    rows = []
    for i in range(n):
        reference = {FINDINGS[i % 5]: 1}
        rows.append(
            {
                "study_id": f"{source}-{i}",
                "draft": FLAWED if i < flawed else CLEAN,
                "labels": {} if i % missed_every == 0 else dict(reference),
                "reference": reference,
                "facts_score": 0.5 + 0.2 * np.sin(i) + reward_shift,
                "source": source,
            }
        )
    return rows


def test_the_gate_counts_flagged_drafts_and_rejects_a_candidate_that_clearly_writes_more():
    from app.services.rounds import Decision, decide, decision_lines

    served = gate_rows(2000, 3, flawed=20)
    candidate = gate_rows(2000, 4, flawed=100, reward_shift=0.05)
    assert decide(gate_rows(2000, 4, flawed=20, reward_shift=0.05), served).promote  # the same count
    decision = decide(candidate, served)
    assert not decision.promote and not decision.hold
    problems = decision.problem_drafts
    assert (problems.candidate.hits, problems.candidate.of, problems.served.hits) == (100, 2000, 20)
    assert problems.candidate_codes == {"side_conflict": 100, "severity_conflict": 100} and problems.low > 0
    assert (
        "drafts that must not be signed as they are 100/2000 = 5.0% (served 20/2000 = 1.0%): the 95% interval of "
        "the difference [+"
    ) in decision.reason
    line = next(line for line in decision_lines(decision) if line.startswith("drafts that must not be signed"))
    assert line.startswith(
        "drafts that must not be signed as they are (the draft checks): 100/2000 = 5.0% (served "
        "20/2000 = 1.0%), +4.0 points, 95% interval ["
    )
    assert line.endswith(
        "; candidate: 100 side conflict, 100 severity conflict; served: 20 side conflict, 20 severity conflict"
    )
    assert Decision.from_dict(decision.to_dict()) == decision
    stored = {k: v for k, v in decision.to_dict().items() if k != "problem_drafts"}  # a decision from before
    assert Decision.from_dict(stored).problem_drafts is None


def test_a_candidate_with_a_few_more_flagged_drafts_is_not_promoted_and_fewer_do_not_hold_it():
    from app.services.rounds import decide

    served = gate_rows(2000, 3, flawed=20)
    few_more = decide(gate_rows(2000, 4, flawed=22, reward_shift=0.05), served)
    assert few_more.hold and not few_more.promote and few_more.problem_drafts.low <= 0
    assert (
        "the candidate wrote more drafts that must not be signed as they are, 22/2000 = 1.1% (served 20/2000 = "
        "1.0%), than the served model"
    ) in few_more.reason
    fewer = decide(gate_rows(2000, 4, flawed=5, reward_shift=0.05), served)
    assert (
        fewer.promote
        and "no more drafts that must not be signed as they are than the served model, 5/2000" in fewer.reason
    )


def test_the_gate_counts_the_held_out_studies_only_and_the_candidates_own_drafts_beside():
    from app.services.rounds import decide, decision_lines
    from app.services.rounds.evidence import TOPUP_SOURCE

    # the candidate's drafts of the top-up negatives are all flagged: they count for false positives only
    served = gate_rows(2000, 3, flawed=0) + gate_rows(100, 1000, flawed=0, source=TOPUP_SOURCE)
    candidate = gate_rows(2000, 4, flawed=0, reward_shift=0.05) + gate_rows(100, 1000, flawed=100, source=TOPUP_SOURCE)
    own = gate_rows(2000, 4, flawed=40) + gate_rows(100, 1000, flawed=100, source=TOPUP_SOURCE)
    decision = decide(candidate, served, alone=own)
    assert decision.promote and (decision.problem_drafts.candidate.of, decision.problem_drafts.served.hits) == (2000, 0)
    assert decision.problem_drafts.alone.hits == 40  # shown, never what the gate decides on
    assert (
        "own drafts: drafts that must not be signed as they are 40/2000 = 2.0% (served 0/2000 = 0.0%)"
        in decision_lines(decision)
    )
