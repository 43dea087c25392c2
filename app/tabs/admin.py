"""The Admin tab: user management, sign-in lockouts, the audit log, exports of the training data and reports, and
when signed reports go back to the archive as DICOM SR (with the last send's outcome).

Every handler asks for the admin role itself (through the services), so the tab
being hidden from radiologists is a convenience, not the protection.
Training rounds, the schedule and the version charts are the Rounds tab
(`app.tabs.rounds`). An export is offered as one zip that lives only long
enough to be downloaded (`app.services.operations.export_downloads`); each is audited.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.accounts import auth
from app.services.archive import sr_send
from app.services.operations import export_downloads
from app.services.operations.export import PAIR_FORMATS
from app.tabs.fields import entered_id
from app.tabs.outputs import Outputs
from orapo_core.errors import OrapoError

USER_COLUMNS = ["Username", "Role", "Active", "Must change password", "Created", "Last sign-in"]
AUDIT_COLUMNS = ["When", "Who", "Action", "Object", "Details"]
LOCKOUT_COLUMNS = ["Account or address", "Kind", "Locked until (UTC)"]


@dataclass
class AdminUI:
    users: gr.Dataframe
    audit: gr.Dataframe


def _user_rows(users) -> list[list]:
    return [
        [
            u.username,
            u.role,
            u.active,
            u.must_change_password,
            u.created_at.strftime("%Y-%m-%d %H:%M"),
            u.last_login_at.strftime("%Y-%m-%d %H:%M") if u.last_login_at else "",
        ]
        for u in users
    ]


def _audit_rows(entries) -> list[list]:
    return [
        [
            e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            e.actor_name,
            e.action,
            f"{e.object_type or ''} {e.object_id or ''}".strip(),
            str(e.details),
        ]
        for e in entries
    ]


def _named_user(users, name):
    """The account a name typed in the Username field stands for (`user_not_found` when none)."""
    wanted = (name or "").strip().lower()
    found = next((u for u in users if u.username.lower() == wanted), None)
    if found is None:
        raise OrapoError("user_not_found", f"There is no user named {wanted!r}; type a username from the table.")
    return found


def _lockout_rows(lockouts) -> list[list]:
    return [[lock.key, lock.kind, lock.until.strftime("%Y-%m-%d %H:%M:%S")] for lock in lockouts]


def _kept_for() -> str:
    return f"{export_downloads.DOWNLOAD_RETENTION_S // 60} minutes"


def build(ctx: AppContext, tab: gr.Tab | None = None) -> AdminUI:
    """The tab's components and handlers; opening `tab` loads the users, the lockouts and the audit log."""
    with gr.Accordion("Users", open=True):
        users = gr.Dataframe(headers=USER_COLUMNS, interactive=False, elem_id="orapo-users")
        with gr.Row():
            username = gr.Textbox(label="Username", scale=2)
            role = gr.Dropdown(["radiologist", "admin"], value="radiologist", label="Role", scale=1)
        with gr.Row() as user_actions:  # hidden while a question waits
            create_btn = gr.Button("Create user", variant="primary", elem_id="orapo-user-create")
            disable_btn = gr.Button("Disable", elem_id="orapo-user-disable")
            enable_btn = gr.Button("Enable", elem_id="orapo-user-enable")
            reset_btn = gr.Button("Reset password", elem_id="orapo-user-reset")
            users_refresh = gr.Button("Refresh")
        with gr.Column(visible=False, variant="panel", elem_id="orapo-user-confirm") as user_confirm:
            user_question = gr.Markdown(elem_id="orapo-user-question")
            confirm_user = gr.Textbox(label="Username", visible=False)  # the account the question named
            with gr.Row():
                confirm_disable_btn = gr.Button(
                    "Disable", variant="stop", visible=False, elem_id="orapo-confirm-disable"
                )
                confirm_reset_btn = gr.Button(
                    "Reset password", variant="stop", visible=False, elem_id="orapo-confirm-reset"
                )
                user_back_btn = gr.Button("Go back", elem_id="orapo-user-back")
        users_result = gr.Markdown(elem_id="orapo-users-result")
    with gr.Accordion("Sign-in lockouts", open=False):
        gr.Markdown(
            "Too many failed sign-ins lock an account or a network address for a while; lifting a lockout "
            "forgets its failures (and is audited)."
        )
        lockouts = gr.Dataframe(headers=LOCKOUT_COLUMNS, interactive=False, elem_id="orapo-lockouts")
        with gr.Row():
            locked_key = gr.Textbox(label="Account or address", scale=2, elem_id="orapo-lockout-key")
            lift_btn = gr.Button("Lift lockout", scale=0)
            lockouts_refresh = gr.Button("Refresh", scale=0)
        lockout_result = gr.Markdown(elem_id="orapo-lockout-result")
    with gr.Accordion("Audit log", open=True):
        with gr.Row():
            action = gr.Textbox(label="Action (e.g. 'user.' for a prefix)", scale=2)
            who = gr.Textbox(label="Who", scale=1)
            audit_btn = gr.Button("Show", scale=0)
        audit = gr.Dataframe(headers=AUDIT_COLUMNS, interactive=False, wrap=True, elem_id="orapo-audit")

    with gr.Accordion("Export", open=True):
        gr.Markdown(
            "Preference pairs and OraPO prompts as Hugging Face `datasets` folders that TRL reads as they stand "
            "(held-out studies never leave), and every reported study as a FHIR R4 Bundle."
        )
        with gr.Row(equal_height=True):
            formats = gr.CheckboxGroup(
                list(PAIR_FORMATS), value=list(PAIR_FORMATS), label="Training data formats", scale=2
            )
            pairs_btn = gr.Button("Export training data", variant="primary", scale=1, elem_id="orapo-export-pairs")
            fhir_btn = gr.Button("Export FHIR bundles", scale=1, elem_id="orapo-export-fhir")
        export_result = gr.Markdown(elem_id="orapo-export-result")
        export_file = gr.File(label="Download", interactive=False, elem_id="orapo-export-file")

    with gr.Accordion("Archive (PACS)", open=True):
        gr.Markdown(
            "When a signed report goes back to the archive as a DICOM Structured Report: **on sign** sends it "
            "in the background as the reader signs (signing never waits for the archive), **manual** only "
            "when sent from here or with `orapo export sr ... --send`, **off** never."
        )
        with gr.Row(equal_height=True):
            sr_mode = gr.Radio(
                list(sr_send.SR_SEND_LABELS.values()),
                value="off",
                label="Send signed reports as SR",
                scale=2,
                elem_id="orapo-sr-send",
            )
            sr_save = gr.Button("Save", scale=0, elem_id="orapo-sr-send-save")
        with gr.Row(equal_height=True):
            sr_study = gr.Textbox(label="Study", placeholder="a study id", scale=1, elem_id="orapo-sr-study")
            sr_now = gr.Button("Send its SR now", scale=0, elem_id="orapo-sr-send-now")
            sr_refresh = gr.Button("Refresh", scale=0)
        sr_status = gr.Markdown(elem_id="orapo-sr-status")

    # -- rounds and dashboard: rounds, the schedule and version charts are the Rounds tab (app.tabs.rounds) --

    @in_page()
    def list_users(request: gr.Request):
        return _user_rows(auth.list_users(ctx.database, ctx.user(request, role="admin")))

    def users_changed(actor, sentence: str) -> Outputs:
        """The users table, fresh, and what changed in it."""
        return {users: _user_rows(auth.list_users(ctx.database, actor)), users_result: sentence}

    def user_asked(confirmed: bool) -> Outputs:
        """The question panel shown (in place of the buttons) or, once answered, hidden again."""
        return {user_confirm: gr.Column(visible=not confirmed), user_actions: gr.Row(visible=confirmed)}

    def ask(disable: bool):
        """Disabling an account and resetting its password act at once on someone else: the page asks first,
        naming the account and its role, and only the question's own button acts."""

        @in_page(status=users_result)
        def handler(name, request: gr.Request) -> Outputs:
            actor = ctx.user(request, role="admin")
            user = _named_user(auth.list_users(ctx.database, actor), name)
            if disable and user.username == actor.username:
                raise OrapoError("cannot_disable_self", "You cannot disable your own account.")
            if disable:
                question = (
                    f"**Disable {user.username}** ({user.role})? Their open sessions end now, and they cannot sign "
                    "in until an administrator enables the account again."
                )
            else:
                question = (
                    f"**Reset the password of {user.username}** ({user.role})? Their password stops working now; "
                    "the one-time password shown next is theirs until they change it."
                )
            return {
                users_result: "",
                user_question: question,
                confirm_user: user.username,
                confirm_disable_btn: gr.Button(visible=disable, value=f"Disable {user.username}"),
                confirm_reset_btn: gr.Button(visible=not disable, value=f"Reset the password of {user.username}"),
                **user_asked(False),
            }

        return handler

    @in_page()
    def user_back(request: gr.Request) -> Outputs:
        ctx.user(request, role="admin")
        return user_asked(True)

    @in_page(status=users_result)
    def create_user(name, role_value, request: gr.Request) -> Outputs:
        actor = ctx.user(request, role="admin")
        user, password = auth.create_user(ctx.database, actor, name, role_value)
        return users_changed(
            actor, f"Created **{user.username}** ({user.role}). One-time password, shown once: `{password}`"
        )

    def set_active(active: bool):
        @in_page(status=users_result)
        def handler(name, request: gr.Request) -> Outputs:
            actor = ctx.user(request, role="admin")
            user = auth.set_user_active(ctx.database, actor, name, active)
            if not active and ctx.sessions is not None:
                ctx.sessions.end_user(user.username)  # the middleware refuses them anyway; forget them now
            sentence = f"**{user.username}** is now {'active' if user.active else 'disabled'}."
            return {**users_changed(actor, sentence), **({} if active else user_asked(True))}

        return handler

    @in_page(status=users_result)
    def reset(name, request: gr.Request) -> Outputs:
        actor = ctx.user(request, role="admin")
        user, password = auth.reset_password(ctx.database, actor, name)
        sentence = f"New one-time password for **{user.username}**, shown once: `{password}`"
        return {**users_changed(actor, sentence), **user_asked(True)}

    @in_page()
    def list_lockouts(request: gr.Request):
        return _lockout_rows(ctx.signin.lockouts(ctx.user(request, role="admin")))

    @in_page(status=lockout_result)
    def lift_lockout(key, request: gr.Request) -> Outputs:
        actor = ctx.user(request, role="admin")
        lifted = ctx.signin.lift(actor, key)
        return {
            lockouts: _lockout_rows(ctx.signin.lockouts(actor)),
            lockout_result: f"Lifted the lockout of **{key.strip()}** ({', '.join(lifted)}).",
        }

    @in_page()
    def show_audit(action_value, who_value, request: gr.Request):
        actor = ctx.user(request, role="admin")
        return _audit_rows(auth.audit_log(ctx.database, actor, action=action_value, actor_name=who_value))

    @in_page(status=export_result)
    def export_pairs(chosen, request: gr.Request) -> Outputs:
        download = export_downloads.download_training_data(
            ctx.database, ctx.settings, ctx.user(request, role="admin"), chosen
        )
        lines = [
            f"- **{s.format}**: {s.rows} rows" + (f" ({s.skipped} skipped: no image)" if s.skipped else "")
            for s in download.summaries
        ]
        return {
            export_result: f"Ready to download for the next {_kept_for()}:\n" + "\n".join(lines),
            export_file: str(download.archive),
        }

    @in_page(status=export_result)
    def export_fhir(request: gr.Request) -> Outputs:
        download = export_downloads.download_fhir(ctx.database, ctx.settings, ctx.user(request, role="admin"))
        return {
            export_result: f"{download.bundles} FHIR R4 Bundles (DiagnosticReport + Provenance per study), "
            f"ready to download for the next {_kept_for()}.",
            export_file: str(download.archive),
        }

    def archive_view() -> Outputs:
        return {
            sr_mode: gr.Radio(value=sr_send.SR_SEND_LABELS[sr_send.sr_send_mode(ctx.database)]),
            sr_status: sr_send.status_markdown(ctx.database),
        }

    @in_page()
    def show_archive(request: gr.Request) -> Outputs:
        ctx.user(request, role="admin")
        return archive_view()

    @in_page()
    def save_sr_mode(mode, request: gr.Request) -> Outputs:
        sr_send.set_sr_send_mode(ctx.database, ctx.user(request, role="admin"), mode)
        return archive_view()

    @in_page()
    def send_sr_now(study, request: gr.Request) -> Outputs:
        actor = ctx.user(request, role="admin")
        sr_send.send_now(ctx.database, ctx.settings, actor, entered_id(study, "study"))
        return archive_view()

    def audited(event) -> None:
        """A change to a user or a lockout is audited: the audit log below shows it at once, with no Show."""
        event.success(show_audit, inputs=[action, who], outputs=audit, api_visibility="private", show_progress="hidden")

    users_refresh.click(list_users, outputs=users, api_name="list_users")
    audited(
        create_btn.click(create_user, inputs=[username, role], outputs=[users, users_result], api_name="create_user")
    )
    audited(enable_btn.click(set_active(True), inputs=username, outputs=[users, users_result], api_name="enable_user"))
    asking = [
        users_result,
        user_question,
        confirm_user,
        confirm_disable_btn,
        confirm_reset_btn,
        user_confirm,
        user_actions,
    ]
    disable_btn.click(ask(True), inputs=username, outputs=asking, api_visibility="private")
    reset_btn.click(ask(False), inputs=username, outputs=asking, api_visibility="private")
    answered = [users, users_result, user_confirm, user_actions]  # a script calls these two by name, as before
    audited(
        confirm_disable_btn.click(set_active(False), inputs=confirm_user, outputs=answered, api_name="disable_user")
    )
    audited(confirm_reset_btn.click(reset, inputs=confirm_user, outputs=answered, api_name="reset_password"))
    user_back_btn.click(user_back, outputs=[user_confirm, user_actions], api_visibility="private")
    lockouts_refresh.click(list_lockouts, outputs=lockouts, api_name="list_lockouts")
    audited(
        lift_btn.click(lift_lockout, inputs=locked_key, outputs=[lockouts, lockout_result], api_name="lift_lockout")
    )
    audit_btn.click(show_audit, inputs=[action, who], outputs=audit, api_name="audit_log")
    pairs_btn.click(export_pairs, inputs=formats, outputs=[export_result, export_file], api_name="export_pairs")
    fhir_btn.click(export_fhir, outputs=[export_result, export_file], api_name="export_fhir")
    sr_save.click(save_sr_mode, inputs=sr_mode, outputs=[sr_mode, sr_status], api_name="set_sr_send")
    sr_now.click(send_sr_now, inputs=sr_study, outputs=[sr_mode, sr_status], api_name="send_sr")
    sr_refresh.click(show_archive, outputs=[sr_mode, sr_status], api_name="archive_status")

    @in_page()
    def opened(action_value, who_value, request: gr.Request) -> Outputs:
        """Everything the tab lists, fresh, when it opens: nobody looks at an empty table until Refresh."""
        actor = ctx.user(request, role="admin")
        return {
            users: _user_rows(auth.list_users(ctx.database, actor)),
            lockouts: _lockout_rows(ctx.signin.lockouts(actor)),
            audit: _audit_rows(auth.audit_log(ctx.database, actor, action=action_value, actor_name=who_value)),
            **archive_view(),
        }

    if tab is not None:
        tab.select(
            opened, inputs=[action, who], outputs=[users, lockouts, audit, sr_mode, sr_status], api_visibility="private"
        )
    return AdminUI(users=users, audit=audit)
