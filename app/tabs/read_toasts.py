"""A success clears the refusal toast before it (issue 41 §8).

A refused action is a toast and the same sentence in the status line (`app.messages.in_page`); the toast stayed its
ten seconds even when the next action succeeded at once, so the page said "refused" beside "stored". The toast is
the status line's echo, so it goes when the line it echoes does: whenever a status line of the Read tab changes to
a text that no longer holds a refusal's sentence, the page closes that refusal's toast (warnings and errors only;
an information toast, such as "Edit kept", stays). A refusal that writes its own line keeps its toast, and a toast
of a handler with no status line lasts as before.

One hidden `gr.HTML` in the tab runs the script once per page (a window flag) and watches the page's status lines.
"""

from __future__ import annotations

import json

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

STATUS_LINES = ("#orapo-status", "#orapo-upload-status")  # the Read tab's status lines (`in_page(status=...)`)
SCRIPT = """
if (!window.orapoToastsFollowStatus) {
  window.orapoToastsFollowStatus = true;
  const LINES = __LINES__.join(', ');
  const words = (text) => (text || '').replace(/\\s+/g, ' ').trim();
  const refusals = () => document.querySelectorAll(
    '[data-testid=toast-body].warning, [data-testid=toast-body].error');
  const follow = (line) => {
    const said = words(line.textContent);
    for (const toast of refusals()) {
      const texts = [...toast.querySelectorAll('.toast-message-text')].map((m) => words(m.textContent));
      if (texts.some((text) => text && said.includes(text))) continue;  // the line says this refusal now
      const close = toast.querySelector('[data-testid=toast-close]');
      if (close) close.click();
    }
  };
  new MutationObserver((changes) => {
    const lines = new Set();
    for (const change of changes) {
      const node = change.target.nodeType === 1 ? change.target : change.target.parentElement;
      const line = node && node.closest(LINES);
      if (line) lines.add(line);
    }
    lines.forEach(follow);
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}
"""


def build() -> gr.HTML:
    """The hidden element whose script makes a success close the refusal toast before it."""
    return gr.HTML(
        "",
        js_on_load=SCRIPT.replace("__LINES__", json.dumps(list(STATUS_LINES))),
        css_template="display: none;",
        container=False,
        padding=False,
        elem_id="orapo-toasts-follow-status",
    )
