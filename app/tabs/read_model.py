"""The model behind the Read tab's draft: which version wrote it, its model card, and what drafting again gives.

- The status line names the version that wrote the draft (`app.services.reading.served.drafted_by`: "round-1
  (version 3)"), not the base folder it was trained from (it said "starter" after round-1 was promoted).
- The "Model card" accordion shows the card (`app.services.rounds.model_card`) of the model that wrote the open
  draft, else of the model drafting now: what it learned from, what it reads and states with the numbers measured,
  its intended use (issue 41 §5).
- Drafting is greedy (the model's most likely words, `orapo_core.models.draft`), so drafting the same image again
  with the same model gives the same text; the status says so rather than leaving the reader to wonder whether
  anything happened (§8).
"""

from __future__ import annotations

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import log_failure
from app.services.reading import reports
from app.services.reading.served import drafted_by
from app.services.rounds.model_card import model_card
from app.tabs.outputs import Outputs
from orapo_core.errors import OrapoError

TITLE = "Model card"


def build() -> tuple[gr.Accordion, gr.Markdown]:
    with gr.Accordion(TITLE, open=False, elem_id="orapo-model-card-panel") as accordion:
        card = gr.Markdown(elem_id="orapo-model-card")
    return accordion, card


def card_of(ctx: AppContext, draft) -> tuple[str, str]:
    """(accordion label, card markdown) of the model that wrote `draft`, or of the model drafting now (None)."""
    version = draft.model_version_id if draft is not None else None
    try:
        card = model_card(ctx.database, ctx.settings, version)
    except OrapoError as exc:  # no model to serve yet, or a version deleted since: say why, keep the page
        return TITLE, f"No model card: {exc.message}"
    except Exception as exc:  # never in the way of opening a study or of a draft
        log_failure("model card", exc)
        return TITLE, "No model card: it could not be read just now; open the study again to retry."
    name = card.name + (f" (version {card.version_id})" if card.version_id is not None else "")
    note = ""
    if draft is not None and version is None and card.version_id is not None:
        # a draft of the folder served before any promotion: it has no version, hence no card of its own now
        note = (
            f"Draft {draft.id} was written by **{drafted_by(draft)}**, served before any version was promoted; "
            f"this is the card of the model drafting now, {name}.\n\n"
        )
    return f"{TITLE}: {name}", note + card.markdown()


def card_outputs(accordion: gr.Accordion, card: gr.Markdown, ctx: AppContext, draft) -> Outputs:
    label, text = card_of(ctx, draft)
    return {accordion: gr.Accordion(label=label), card: text}


def draft_status(record, previous, seconds: float | None = None) -> str:
    """The status line of a draft: who wrote it (and how long it took, just drafted), and whether it repeats the
    study's previous draft (`previous`, the latest before it) word for word."""
    line = f"Draft {record.id} by **{drafted_by(record)}**"
    if seconds is not None:
        line += f" in {seconds:.1f} s"
    if (
        previous is not None
        and previous.id != record.id
        and drafted_by(previous) == drafted_by(record)
        and reports.same_text(previous.text, record.text)
    ):
        line += (
            f" · **same text as draft {previous.id}**: the model drafts greedily (its most likely words), so the "
            "same model gives the same report for the same image"
        )
    return line
