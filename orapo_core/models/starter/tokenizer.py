"""The starter's tokenizer: a byte-level BPE trained here on report text.

A general-purpose vocabulary would be tens of thousands of rows of embeddings
for a model whose every answer is a chest X-ray report; ~2k merges learned from
PhantomCXR reports, the project's radiology lexicon and the prompt make a
report about 60 tokens, which is what keeps drafting on a CPU fast. Byte-level,
so any text a clinician types still round-trips, only in more pieces.

The special tokens and chat template are Qwen2-VL's, so the family's processor
expands `<|image_pad|>` and `render_prompt` works unchanged. Unlike Qwen's
template this one adds no default system turn: eight tokens of "You are a
helpful assistant." on every draft and every training step buy nothing here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from orapo_core.data.phantom import resolve_prevalence, sample_findings
from orapo_core.data.phantom_reports import write_report
from orapo_core.models.prompt import REPORT_PROMPT
from orapo_core.models.starter.lexicon import RADIOLOGY_TERMS
from orapo_core.report_layout import report_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def report_corpus(n_reports: int, seed: int) -> list[str]:
    """Report texts of `n_reports` PhantomCXR studies at default prevalences, without rendering images.

    Default (not training) prevalences: the tokenizer should spell rare findings
    compactly even though the warm start sees few of them.
    """
    prevalence = resolve_prevalence()
    texts = []
    for i in range(n_reports):
        rng = np.random.default_rng([seed, 7919, i])
        findings = sample_findings(rng, prevalence)
        view = "AP" if rng.random() < 0.4 else "PA"
        text_findings, text_impression, _ = write_report(findings, rng, view)
        texts.append(report_text(text_findings, text_impression))
    return texts


def train_report_tokenizer(*, vocab_size: int = 2048, n_reports: int = 4000, seed: int = 0) -> PreTrainedTokenizerFast:
    """A `PreTrainedTokenizerFast` with Qwen's special tokens and `CHAT_TEMPLATE`."""
    from transformers import PreTrainedTokenizerFast

    corpus = report_corpus(n_reports, seed) + list(RADIOLOGY_TERMS) + [REPORT_PROMPT]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
