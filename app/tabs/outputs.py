"""What a handler of an event with several outputs returns: its outputs keyed by component.

Gradio matches a returned tuple to the event's `outputs` list by position, so a 14-value tuple had to follow a list
built elsewhere, value for value. A dict keyed by the components instead names each output: the components it
leaves out keep what they show (Gradio fills them with `gr.skip()`), and a key that is not one of the event's
outputs is an error Gradio raises at once. Every handler of such an event, and every helper that builds part of
its answer, is annotated `-> Outputs` (`tests/test_tab_outputs.py` holds the tabs to it). To change nothing at
all, a handler returns `gr.skip()`, never `{}` (which Gradio would read as one value, not as no value).
"""

from __future__ import annotations

from typing import Any

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

# a component, or a layout block whose visibility a handler changes (a panel, a row of buttons, a tab)
Outputs = dict[gr.components.Component | gr.Column | gr.Row | gr.Accordion | gr.Tab | gr.Tabs, Any]
