"""The Account tab: who is signed in, and the password change (the only thing a one-time password allows).

Changing the password signs out every other session of the account; this one goes on."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.accounts import auth
from app.tabs.outputs import Outputs


@dataclass
class AccountUI:
    password_changed: object  # an event that follows each successful change only, so the app can reveal the other tabs


def build(ctx: AppContext) -> AccountUI:
    gr.Markdown(
        "### Change your password\nA one-time password from an administrator must be changed before anything else."
    )
    with gr.Column(scale=1, min_width=320):
        old = gr.Textbox(label="Current password", type="password", elem_id="orapo-old-password")
        new = gr.Textbox(label="New password (8 characters or more)", type="password", elem_id="orapo-new-password")
        repeat = gr.Textbox(label="New password again", type="password", elem_id="orapo-repeat-password")
        button = gr.Button("Change password", variant="primary", elem_id="orapo-change-password")
        result = gr.Markdown(elem_id="orapo-password-result")
    changes = gr.State(0)  # how many times this page changed the password: a refusal leaves it as it was

    @in_page(status=result)  # a refusal keeps what was typed, to correct it
    def change_password(old_value, new_value, repeat_value, count, request: gr.Request) -> Outputs:
        user = ctx.user(request, allow_password_change=True)
        ended = auth.change_own_password_in_session(
            ctx.database, ctx.sessions, user, request, old_value, new_value, repeat_value
        )
        return {
            old: "",
            new: "",
            repeat: "",
            changes: (count or 0) + 1,
            result: "Password changed." + (f" Signed out your {ended} other session(s)." if ended else ""),
        }

    button.click(
        change_password,
        inputs=[old, new, repeat, changes],
        outputs=[old, new, repeat, result, changes],
        api_name="change_password",
    )
    return AccountUI(password_changed=changes.change(lambda: None, api_visibility="private"))
