"""The starter's tokenizer: trained here, deterministic, compact on reports, lossless on anything."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer():
    from orapo_core.models.starter.tokenizer import train_report_tokenizer

    return train_report_tokenizer(n_reports=1000)


def test_report_text_round_trips_and_is_short(tokenizer):
    from orapo_core.models.starter.tokenizer import report_corpus

    for text in report_corpus(50, seed=5):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
        assert len(ids) < len(text.split()) * 1.6  # whole words, not bytes: a report costs ~1 token a word


def test_text_outside_phantom_reports_round_trips(tokenizer):
    text = "Retrocardiac opacity; hilar lymphadenopathy. Ünïcode 42 mm\tand  spaces\n"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    lexicon_word = tokenizer.tokenize(" lymphadenopathy")
    assert len(lexicon_word) <= 2, lexicon_word  # the radiology lexicon earned merges


def test_qwen_special_tokens_are_single_ids_and_the_template_has_no_system_turn(tokenizer):
    from orapo_core.models.prompt import build_messages
    from orapo_core.models.starter.tokenizer import QWEN_SPECIAL_TOKENS

    for token in QWEN_SPECIAL_TOKENS:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    text = tokenizer.apply_chat_template(build_messages("Describe."), add_generation_prompt=True, tokenize=False)
    assert (
        text == "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.slow
def test_same_seed_same_vocabulary(tokenizer):
    from orapo_core.models.starter.tokenizer import train_report_tokenizer

    assert train_report_tokenizer(n_reports=1000).get_vocab() == tokenizer.get_vocab()
    assert train_report_tokenizer(n_reports=1000, seed=1).get_vocab() != tokenizer.get_vocab()
