"""The one prompt every model is asked, and its version.

Drafting, training rounds and evaluation all build their inputs here, so a
model is always trained on the prompt it is later served with. Every draft
records `PROMPT_VERSION`: bump it whenever `REPORT_PROMPT` or the message shape
changes, so drafts and preference pairs from different prompts are never mixed
unknowingly.
"""

from __future__ import annotations

from typing import Any

from orapo_core.errors import OrapoError

PROMPT_VERSION = "report-v1"

REPORT_PROMPT = (
    "You are a radiologist. Write the findings and impression of this chest X-ray as a report with two "
    "sections, 'Findings:' and 'Impression:'. Describe only what is visible in the image."
)


def build_messages(prompt: str = REPORT_PROMPT) -> list[dict]:
    """One user turn: the image, then the instruction (the order every VLM chat template expects)."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]


def render_prompt(processor: Any, prompt: str = REPORT_PROMPT) -> str:
    """The chat-templated text of the prompt, ending where the model's answer begins."""
    if not getattr(processor, "chat_template", None) and not getattr(processor.tokenizer, "chat_template", None):
        raise OrapoError(
            "model_invalid",
            "This model has no chat template (chat_template.json or chat_template.jinja): "
            "it cannot be prompted as a chat model.",
        )
    return processor.apply_chat_template(build_messages(prompt), add_generation_prompt=True, tokenize=False)
