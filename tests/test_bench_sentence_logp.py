"""`benchmarks/bench_sentence_logp.py`: the finding's own sentence, its tokens, and what the model makes of them."""

from __future__ import annotations

import json

import pytest

REPORT = (
    "FINDINGS: The heart is normal in size. Pleural thickening along the left lateral chest wall. "
    "No pneumothorax.\n\nIMPRESSION: No acute process."
)


def test_the_sentence_of_a_finding_is_the_first_one_that_states_it():
    from benchmarks.bench_sentence_logp import finding_sentence

    sentence = finding_sentence(REPORT, "Pleural Other")
    assert sentence.text == "Pleural thickening along the left lateral chest wall."
    assert REPORT[sentence.start : sentence.end] == sentence.text
    assert finding_sentence(REPORT, "Pneumothorax") is None  # a negation does not state it
    assert finding_sentence(REPORT, "Fracture") is None


def test_a_sentence_owns_exactly_the_tokens_inside_its_span():
    from benchmarks.bench_sentence_logp import sentence_tokens

    read = {"spans": [(0, 3), (3, 8), (8, 9), (9, 14), (14, 15)]}
    assert sentence_tokens(read, 3, 9) == [1, 2]
    assert sentence_tokens(read, 9, 15) == [3, 4]
    assert sentence_tokens(read, 20, 30) == []


@pytest.mark.slow
def test_it_reads_each_rare_finding_on_a_tiny_model_and_writes_the_table(tmp_path, capsys):
    from benchmarks.bench_sentence_logp import RARE, main
    from tests.support.tiny_vlms import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "model", family="qwen2_vl")
    out = tmp_path / "out.json"
    assert (
        main(
            [
                "--model",
                str(model),
                "--n",
                "8",
                "--size",
                "64",
                "--prevalence",
                "pleural_other=1.0",
                "--data",
                str(tmp_path / "data"),
                "--max-new-tokens",
                "8",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    saved = json.loads(out.read_text())
    assert set(saved["findings"]) == set(RARE)
    pleural = saved["findings"]["Pleural Other"]
    assert pleural["studies_with"] == 8 and pleural["sentences_read"] == 8
    assert pleural["sentence_logp"] < 0 and pleural["first_token_logp"] <= 0
    assert pleural["worst_token_logp"] <= pleural["first_token_logp"]
    assert 0 <= pleural["first_token_is_greedy"] <= 1 and 0 <= pleural["whole_sentence_is_greedy"] <= 1
    assert pleural["draft_false_positive_rate"] is None  # every study has it
    assert "| Pleural Other | 8 |" in capsys.readouterr().out
