"""The draft judged against the reader's edited report: a sentence the reader deleted is removed, never entailed."""

from __future__ import annotations

from orapo_core.facts import score_report
from orapo_core.facts.edits import REMOVED, removed_sentences, score_edit
from orapo_core.facts.extract import extract_facts

DRAFT = "FINDINGS: Heart size is normal. No pneumothorax. Small left pleural effusion.\nIMPRESSION: Small left pleural effusion."


def statuses(draft: str, edited: str) -> list[str]:
    return [s.status for s in score_edit(draft, edited).sentences]


def test_a_deleted_denial_is_removed_where_it_used_to_be_entailed():
    edited = "FINDINGS: Heart size is normal. Small left pleural effusion.\nIMPRESSION: Small left pleural effusion."
    assert [s.status for s in score_report(DRAFT, reference_text=edited).sentences][1] == "entailed"  # the old verdict
    assert statuses(DRAFT, edited) == ["entailed", REMOVED, "entailed", "entailed"]
    removed = score_edit(DRAFT, edited).sentences[1]
    assert removed.score == 0.0 and [j.verdict for j in removed.facts] == [REMOVED]


def test_a_sentence_replaced_by_another_finding_is_removed():
    edited = "FINDINGS: Heart size is normal. Mild bibasilar atelectasis. Small left pleural effusion.\nIMPRESSION: Small left pleural effusion."
    assert statuses(DRAFT, edited)[1] == REMOVED


def test_a_finding_written_twice_and_deleted_once_is_removed_once():
    edited = "FINDINGS: Heart size is normal. No pneumothorax. Small left pleural effusion."
    assert statuses(DRAFT, edited) == ["entailed", "entailed", "entailed", REMOVED]


def test_kept_rephrased_edited_and_merged_sentences_are_judged_as_before():
    assert statuses(DRAFT, DRAFT) == ["entailed"] * 4
    rephrased = "FINDINGS: The heart is normal in size. There is no pneumothorax. A small left effusion.\nIMPRESSION: Small left pleural effusion."
    assert statuses(DRAFT, rephrased) == ["entailed"] * 4
    # a finding rewritten is judged (here contradicted), not removed
    assert statuses("Small left pleural effusion.", "Large left pleural effusion.") == ["contradicted"]
    assert statuses("Small left pleural effusion.", "Small right pleural effusion.") == ["contradicted"]
    merged = "FINDINGS: Heart size is normal. No pneumothorax; small left pleural effusion.\nIMPRESSION: Small left pleural effusion."
    assert statuses(DRAFT, merged) == ["entailed"] * 4
    assert statuses("No pneumothorax.", "Small right pneumothorax.") == [
        "contradicted"
    ]  # the denial edited into a finding


def test_a_finding_cut_out_of_a_kept_sentence_is_removed_and_the_rest_judged():
    sentence = score_edit("No pneumothorax or pleural effusion.", "No pleural effusion.").sentences[0]
    assert sentence.status == "entailed"
    assert [(j.fact.observation, j.verdict) for j in sentence.facts] == [
        ("Pneumothorax", REMOVED),
        ("Pleural Effusion", "entailed"),
    ]


def test_everything_deleted_is_removed():
    assert statuses("No pneumothorax. Mild cardiomegaly.", "") == [REMOVED, REMOVED]
    assert removed_sentences(extract_facts("No pneumothorax."), extract_facts("No pneumothorax.")) == set()
