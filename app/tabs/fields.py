"""Fields where a reader types or picks a record's id (a study, a round, a version).

Gradio's Number shows 0 when it has no value (its page code sets a missing value to 0), and ids start at 1:
an empty id field would read "study 0". So an id is a one-line text field, empty until something is picked,
and `entered_id` turns what it holds into an id, or says plainly what is wrong with it.
"""

from __future__ import annotations

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.errors import OrapoError


def id_field(label: str, *, elem_id: str, placeholder: str, scale: int = 1) -> gr.Textbox:
    return gr.Textbox(
        label=label, value="", placeholder=placeholder, lines=1, max_lines=1, scale=scale, elem_id=elem_id
    )


def entered_id(value, what: str) -> int | None:
    """The id in a field (None when it is empty); `what` names it in the refusal ("study", "round")."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    if text.endswith(".0"):  # a number sent by a script as a float
        text = text[:-2]
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise OrapoError(f"invalid_{what}", f"{text!r} is not a {what} number; pick a {what} in the table.")
    return int(text)
