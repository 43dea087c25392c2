"""Drafting: greedy plus K samples, the recorded prompt, image normalisation, and `orapo draft`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orapo_core.errors import OrapoError
from tests.support.tiny_vlms import build_tiny_vlm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "qwen2_5_vl", family="qwen2_5_vl")


@pytest.fixture(scope="module")
def drafter(model_dir):
    from orapo_core.models import Drafter

    return Drafter.from_dir(model_dir, model_version="v3")


def xray() -> np.ndarray:
    y, x = np.mgrid[0:90, 0:70]
    return ((np.sin(y / 9.0) * np.cos(x / 7.0) + 1) * 2000).astype(np.uint16)


def test_a_draft_has_k_samples_confidences_and_the_prompt_it_was_asked(drafter):
    from orapo_core.models import PROMPT_VERSION, REPORT_PROMPT

    draft = drafter.draft(xray(), samples=3, max_new_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    assert draft.text and len(draft.samples) == 3
    assert draft.sentences and all(0.0 <= s["confidence"] <= 1.0 for s in draft.sentences)
    assert isinstance(draft.flagged, list)
    assert (draft.prompt, draft.prompt_version) == (REPORT_PROMPT, PROMPT_VERSION)
    assert (draft.model_name, draft.model_version) == ("qwen2_5_vl", "v3")
    assert draft.sampling == {
        "samples": 3,
        "max_new_tokens": 12,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 0,
        "seed": 7,
    }
    assert draft.latency_ms > 0
    assert json.loads(json.dumps(draft.to_dict()))["prompt_version"] == PROMPT_VERSION


def test_samples_are_passed_to_self_consistency_and_its_answer_made_plain(drafter, monkeypatch):
    from dataclasses import dataclass

    import orapo_core.facts

    @dataclass
    class Flag:
        finding: str
        agreement: float

    seen = {}

    def fake_self_consistency(greedy_text, sample_texts):
        seen.update(greedy=greedy_text, samples=list(sample_texts))
        return [(greedy_text, 0.25)], [Flag("effusion", 0.5)]

    monkeypatch.setattr(orapo_core.facts, "self_consistency", fake_self_consistency)
    draft = drafter.draft(xray(), samples=4, max_new_tokens=8)
    assert seen == {"greedy": draft.text, "samples": draft.samples} and len(draft.samples) == 4
    assert draft.sentences == [{"text": draft.text, "confidence": 0.25}]
    assert draft.flagged == [{"finding": "effusion", "agreement": 0.5}]


def test_a_drafter_with_a_sample_agreement_leaves_out_what_too_few_samples_say(drafter):
    from orapo_core.models import Drafter

    greedy = "FINDINGS: Cardiomegaly. No pleural effusion.\n\nIMPRESSION: Moderate right pneumothorax."
    samples = [
        "FINDINGS: Cardiomegaly.",
        "FINDINGS: Enlarged heart. Right pneumothorax.",
        "FINDINGS: Cardiomegaly.",
        "FINDINGS: Normal.",
    ]  # cardiomegaly: 3 of 4; pneumothorax: 1 of 4
    settings = Drafter.sampling_settings(samples=4)
    strict = Drafter(drafter.loaded, min_agreement=0.5)
    draft = strict.compose(greedy, samples, settings)
    # the impression that lost its one sentence is kept, pointing to the findings (issue 41)
    assert draft.text == "FINDINGS: Cardiomegaly. No pleural effusion.\n\nIMPRESSION: See findings."
    assert draft.withheld == ["Moderate right pneumothorax."] and draft.sampling["min_agreement"] == 0.5
    assert [s["text"] for s in draft.sentences] == ["Cardiomegaly.", "No pleural effusion.", "See findings."]
    # the default drafter, and any drafter without samples, shows the greedy text as it is
    plain = drafter.compose(greedy, samples, settings)
    assert (plain.text, plain.withheld, "min_agreement" in plain.sampling) == (greedy, [], False)
    assert strict.compose(greedy, [], Drafter.sampling_settings(samples=0)).text == greedy
    with pytest.raises(OrapoError) as refused:
        Drafter(drafter.loaded, min_agreement=1.5)
    assert refused.value.code == "draft_invalid"


def test_sampling_is_reproducible_by_seed_and_leaves_the_global_rng_alone(drafter, monkeypatch):
    import torch

    import orapo_core.facts

    monkeypatch.setattr(orapo_core.facts, "self_consistency", lambda g, s: ([], []))
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = drafter.draft(xray(), samples=3, max_new_tokens=10, seed=1)
    assert torch.equal(torch.rand(1), expected_next)
    again = drafter.draft(xray(), samples=3, max_new_tokens=10, seed=1)
    other = drafter.draft(xray(), samples=3, max_new_tokens=10, seed=2)
    assert first.samples == again.samples and first.text == again.text == other.text
    assert other.samples != first.samples


def test_no_samples_means_no_confidences(drafter):
    draft = drafter.draft(xray(), samples=0, max_new_tokens=6)
    assert draft.samples == [] and draft.sentences == [] and draft.flagged == []


@pytest.mark.parametrize(
    "kwargs", [{"samples": -1}, {"samples": 33}, {"temperature": 0.0}, {"top_p": 0.0}, {"max_new_tokens": 0}]
)
def test_bad_sampling_settings_are_refused(drafter, kwargs):
    with pytest.raises(OrapoError) as refused:
        drafter.draft(xray(), **kwargs)
    assert refused.value.code == "draft_invalid"


def test_images_become_8_bit_rgb_within_the_size_limit():
    from PIL import Image

    from orapo_core.models import to_rgb_image

    full_depth = to_rgb_image(np.array([[0, 512], [1024, 4080]], dtype=np.uint16))
    assert full_depth.mode == "RGB"
    assert np.asarray(full_depth)[..., 0].tolist() == [[0, 32], [64, 255]]

    display = np.array([[0, 17], [200, 255]], dtype=np.uint8)
    assert np.asarray(to_rgb_image(display))[..., 1].tolist() == display.tolist()

    sixteen_bit = Image.fromarray(np.array([[0, 65535]], dtype=np.uint16))
    assert np.asarray(to_rgb_image(sixteen_bit))[0, :, 2].tolist() == [0, 255]
    assert to_rgb_image(np.zeros((3, 3), dtype=np.float64)).getextrema() == ((0, 0),) * 3

    big = to_rgb_image(np.zeros((3000, 2400), dtype=np.uint8), max_side=1024)
    assert big.size == (819, 1024)
    with pytest.raises(OrapoError) as refused:
        to_rgb_image(np.zeros((2, 3, 5, 7)))
    assert refused.value.code == "image_invalid"


def test_prompt_lives_in_one_place_and_is_rendered_with_the_model_template(drafter):
    from orapo_core.models import REPORT_PROMPT, build_messages, render_prompt

    assert build_messages() == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": REPORT_PROMPT}]}
    ]
    text = render_prompt(drafter.loaded.processor, "Findings only.")
    assert text.endswith("Findings only.<|im_end|>\n<|im_start|>assistant\n")


def _png(path: Path) -> Path:
    from PIL import Image

    Image.fromarray((xray() // 16).astype(np.uint8)).save(path)
    return path


def test_orapo_draft_prints_the_draft_as_json(model_dir, tmp_path, data_dir, capsys):
    from app.cli import main

    png = _png(tmp_path / "chest.png")
    code = main(["draft", str(png), "--model", str(model_dir), "--samples", "2", "--max-new-tokens", "8", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    draft = json.loads(out)
    assert draft["text"] and len(draft["samples"]) == 2
    assert draft["model_name"] == "qwen2_5_vl" and draft["prompt_version"]


def test_orapo_draft_without_samples_prints_the_text(model_dir, tmp_path, data_dir, capsys):
    from app.cli import main

    png = _png(tmp_path / "chest.png")
    code = main(["draft", str(png), "--model", str(model_dir), "--samples", "0", "--max-new-tokens", "6"])
    out = capsys.readouterr().out
    assert code == 0 and "qwen2_5_vl, prompt report-v1" in out


def test_orapo_draft_marks_the_sentences_the_finding_check_added(model_dir, tmp_path, data_dir, monkeypatch, capsys):
    """Where the sentences are listed with their confidences, one the check added says so instead of a confidence
    (the samples' agreement with words the model never wrote); so does the JSON, beside the draft's `added`."""
    from app.cli import main
    from orapo_core.models.draft import Draft, Drafter

    added = "Small left pneumothorax."
    draft = Draft(
        text=f"Heart size is normal. {added}",
        samples=["Heart size is normal."] * 2,
        sentences=[{"text": "Heart size is normal.", "confidence": 1.0}, {"text": added, "confidence": 0.0}],
        flagged=[],
        model_name="qwen2_5_vl",
        model_version=None,
        prompt="p",
        prompt_version="report-v1",
        sampling={},
        latency_ms=1.0,
        added=[added],
    )

    class Checked:
        def draft(self, *args, **kwargs):
            return draft

    monkeypatch.setattr(Drafter, "from_dir", classmethod(lambda cls, *args, **kwargs: Checked()))
    png = _png(tmp_path / "chest.png")
    assert main(["draft", str(png), "--model", str(model_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  1.00  Heart size is normal." in lines and f"  added  {added}" in lines
    assert f"  0.00  {added}" not in lines
    assert f"  added by the finding check (read on the image, not written by the model): {added}" in lines
    assert main(["draft", str(png), "--model", str(model_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["added"] == [added]
    assert [s.get("added_by_finding_check", False) for s in data["sentences"]] == [False, True]


def test_orapo_draft_without_a_model_says_what_to_do(tmp_path, data_dir, monkeypatch, capsys):
    from app.cli import main
    from orapo_core.models.starter import build

    monkeypatch.delenv("ORAPO_MODEL_DIR", raising=False)
    png = _png(tmp_path / "chest.png")
    assert main(["draft", str(png), "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("model_not_found: ") and "Traceback" not in err

    # no model configured, none in the data folder and none shipped (tests/test_newcomer.py: the shipped one is used)
    monkeypatch.setattr(build, "SHIPPED_DIR", tmp_path / "nothing-shipped")
    assert main(["draft", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("model_not_found: ") and "orapo starter build" in err


def test_orapo_draft_refuses_a_missing_image(model_dir, tmp_path, data_dir, capsys):
    from app.cli import main

    assert main(["draft", str(tmp_path / "none.png"), "--model", str(model_dir)]) == 2
    assert capsys.readouterr().err.startswith("image_not_found: ")


def test_self_consistency_of_a_draft_is_plain_json_with_confidences_in_range():
    from orapo_core.models.draft import score_self_consistency

    greedy = "There is a small left pleural effusion. No pneumothorax."
    samples = [
        "Small left pleural effusion. No pneumothorax.",
        "No pleural effusion. No pneumothorax.",
        "Left pleural effusion is present.",
    ]
    sentences, flagged = score_self_consistency(greedy, samples)
    assert [s["text"] for s in sentences] == ["There is a small left pleural effusion.", "No pneumothorax."]
    assert [round(s["confidence"], 2) for s in sentences] == [0.67, 1.0]
    assert flagged and "effusion" in json.dumps(flagged).lower()
    json.dumps({"sentences": sentences, "flagged": flagged})


def test_draft_many_greedy_texts_match_single_drafts_for_qwen2_5_vl_too(drafter):
    images = [xray(), (xray()[:40, :60] // 3).astype(np.uint16), np.tile(xray(), (2, 3))]  # three token counts
    alone = [drafter.draft(x, samples=0, max_new_tokens=16).text for x in images]
    together = drafter.draft_many(images, samples=2, max_new_tokens=16)
    assert [d.text for d in together] == alone
    assert [len(d.samples) for d in together] == [2, 2, 2]
    assert all(d.sampling["batch_size"] == 3 for d in together)


def test_a_single_draft_is_a_batch_of_one(drafter):
    one = drafter.draft(xray(), samples=2, max_new_tokens=8, seed=3)
    (many,) = drafter.draft_many([xray()], samples=2, max_new_tokens=8, seed=3)
    assert (one.text, one.samples, one.sampling) == (many.text, many.samples, many.sampling)
    assert "batch_size" not in one.sampling


def test_greedy_rows_keep_only_their_arg_max_and_leave_the_sampled_rows_alone():
    import torch

    from orapo_core.models.draft import _GreedyRows

    scores = torch.randn(6, 10)  # two images x (greedy row + 2 sampled rows)
    out = _GreedyRows(3)(torch.zeros(6, 1, dtype=torch.long), scores)
    for row in (0, 3):
        assert torch.isfinite(out[row]).sum() == 1 and out[row].argmax() == scores[row].argmax()
        assert out[row, scores[row].argmax()] == scores[row].max()
    for row in (1, 2, 4, 5):
        assert torch.equal(out[row], scores[row])
