"""The report layout has one home (`orapo_core.report_layout`): written, read back and compared there only."""

from __future__ import annotations

import re
from pathlib import Path

from orapo_core.report_layout import report_text, same_text, split_report

ROOT = Path(__file__).resolve().parents[1]


def test_report_text_writes_the_reference_layout_and_leaves_out_an_empty_section():
    assert (
        report_text("Small left effusion. ", " Effusion.") == "FINDINGS: Small left effusion.\n\nIMPRESSION: Effusion."
    )
    assert report_text("", "Normal.") == "IMPRESSION: Normal."
    assert report_text(None, None) == ""


def test_split_report_reads_back_what_report_text_wrote_and_any_header_case():
    findings, impression = "Heart size is normal. No effusion.", "No acute process."
    assert split_report(report_text(findings, impression)) == (findings, impression)
    assert split_report("Findings: a\n  b\nimpression:  c") == ("a b", "c")
    assert split_report("Portable view. FINDINGS: clear") == (
        "Portable view. FINDINGS: clear",
        "",
    )  # a header starts a line
    assert split_report("Portable view.\nFindings: clear") == ("Portable view. clear", "")
    assert split_report("just  text\n") == ("just text", "")


def test_same_text_ignores_whitespace_only():
    assert same_text(" No  effusion.\n", "No effusion.")
    assert same_text(None, "")
    assert not same_text("No effusion.", "No effusion")


def test_records_and_the_starter_write_through_it():
    from orapo_core.data.records import StudyRecord

    record = StudyRecord("s", [], None, "Clear.", "Normal.", {}, "phantom", "train")
    assert record.report == report_text("Clear.", "Normal.")


def test_nothing_else_spells_the_section_headers():
    spelled = re.compile(r"""f?["'](FINDINGS|IMPRESSION): """)
    offenders = [
        f"{p.relative_to(ROOT)}"
        for folder in ("app", "orapo_core", "db")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "report_layout.py" and spelled.search(p.read_text())
    ]
    assert not offenders, offenders
