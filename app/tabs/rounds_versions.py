"""The Rounds tab's model versions: the table, each version's model card, the charts, promote and roll back.

Built at the foot of the Rounds tab (`app.tabs.rounds`), which refreshes it with everything else on the tab and
once a watched round has finished (`VersionsPanel.view`). Administrators only, checked in every handler.

At first start no version exists yet and the starter folder drafts: the table shows it as a row of its own
("serving", no version number), so the table never says that nothing drafts. A round's first run records it as
`base-<folder>`. Promote and Roll back change what drafts every report, so each asks first: the question names the
version and the one it replaces, and only its own button (`promote_version`, `rollback_version`) acts. A script
calls those two by name, as before, with the version and the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.insight import round_charts
from app.services.rounds import heldout_metrics
from app.services.rounds.model_card import model_card
from app.services.rounds.versions import get_version, rollback_target, served_version
from app.tabs.fields import entered_id, id_field
from app.tabs.outputs import Outputs
from orapo_core.errors import OrapoError

VERSION_COLUMNS = ["Version", "Name", "Status", "Parent", "Round", "Macro-F1", "FactS reward", "Reason", "Created"]
NOT_A_VERSION = "—"  # the Version cell of the folder serving before any round recorded it


def when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def version_rows(versions, serving: list | None = None) -> list[list]:
    """Newest first, after `serving` (the row of the model drafting while no version is promoted). The reason is
    whole: a promotion or rollback adds its own after the gate's (" — then: ..."), and the table wraps it."""
    rows = [serving] if serving else []
    for v in sorted(versions, key=lambda v: v.id, reverse=True):
        heldout = heldout_metrics(v)
        f1, reward = heldout.macro_f1_14, heldout.facts_reward_mean
        rows.append(
            [
                v.id,
                v.name,
                v.status,
                v.parent_id or "",
                v.round_id or "",
                f"{f1:.4f}" if f1 is not None else "",
                f"{reward:.4f}" if reward is not None else "",
                v.reason or "",
                when(v.created_at),
            ]
        )
    return rows


def serving_row(ctx: AppContext, versions) -> list | None:
    """The folder drafting while no version is promoted (the starter at first start), as a row; None otherwise."""
    if any(v.status == "promoted" for v in versions):
        return None
    try:
        card = model_card(ctx.database, ctx.settings)
    except OrapoError as exc:  # no model at all: the table says why nothing drafts
        return [NOT_A_VERSION, "", "no model", "", "", "", "", exc.message, ""]
    if card.version_id is not None:
        return None
    what = "the starter" if card.synthetic_base else "the configured model folder (ORAPO_MODEL_DIR)"
    reason = f"{what}: not yet a version; a round's first run records it as base-{card.name}"
    return [NOT_A_VERSION, card.name, "serving", "", "", "", "", reason, ""]


def version_words(version) -> str:
    """A version as a question names it; None: the folder drafting before any version."""
    if version is None:
        return "the model folder drafting now (not yet a version)"
    return f"version {version.id} ({version.name})"


@dataclass
class VersionsPanel:
    table: gr.Dataframe
    version_id: gr.Textbox
    reason: gr.Textbox
    actions: gr.Row  # the version and reason fields and the buttons, hidden while a question waits
    promote_btn: gr.Button
    rollback_btn: gr.Button
    card_btn: gr.Button
    confirm_panel: gr.Column
    question: gr.Markdown
    confirm_version: gr.Textbox  # hidden: what the question named, so a field edited meanwhile changes nothing
    confirm_reason: gr.Textbox
    confirm_promote_btn: gr.Button
    confirm_rollback_btn: gr.Button
    back_btn: gr.Button
    card: gr.Markdown
    f1_plot: gr.Plot
    quality_plot: gr.Plot
    length_plot: gr.Plot

    @property
    def outputs(self) -> list:
        """What `view` fills."""
        return [self.table, self.f1_plot, self.quality_plot, self.length_plot]

    def view(self, ctx: AppContext) -> Outputs:
        """Every version (and the folder serving before any), in the table and the charts."""
        versions = ctx.rounds.service.list_versions()
        return {
            self.table: version_rows(versions, serving_row(ctx, versions)),
            self.f1_plot: round_charts.per_class_f1_figure(versions),
            self.quality_plot: round_charts.quality_figure(versions),
            self.length_plot: round_charts.report_length_figure(versions),
        }

    def asking(self, question: str, *, promote: bool, version_id: int, reason: str) -> Outputs:
        """The question shown with the one button that answers it, in place of the fields and buttons."""
        return {
            self.question: question,
            self.confirm_version: str(version_id),
            self.confirm_reason: reason,
            self.confirm_promote_btn: gr.Button(visible=promote, value=f"Promote version {version_id}"),
            self.confirm_rollback_btn: gr.Button(visible=not promote, value=f"Roll back to version {version_id}"),
            self.confirm_panel: gr.Column(visible=True),
            self.actions: gr.Row(visible=False),
        }

    def closed(self) -> Outputs:
        """No question waiting: the fields and buttons again."""
        return {self.confirm_panel: gr.Column(visible=False), self.actions: gr.Row(visible=True)}


def build() -> VersionsPanel:
    """The panel's components, in the caller's layout."""
    gr.Markdown("### Model versions")
    table = gr.Dataframe(
        headers=VERSION_COLUMNS,
        interactive=False,
        wrap=True,
        max_height=420,
        column_widths=["8%", "12%", "9%", "7%", "7%", "9%", "10%", "24%", "14%"],
        elem_id="orapo-versions-table",
    )
    with gr.Row(equal_height=True) as actions:
        version_id = id_field(
            "Version (roll back: empty = the served version's parent)",
            scale=2,
            elem_id="orapo-version-id",
            placeholder="click a version in the table",
        )
        reason = gr.Textbox(label="Reason (kept in the audit log)", scale=3, elem_id="orapo-version-reason")
        promote_btn = gr.Button("Promote", variant="primary", scale=1, elem_id="orapo-promote")
        rollback_btn = gr.Button("Roll back", scale=1, elem_id="orapo-rollback")
        card_btn = gr.Button("Model card", scale=1, elem_id="orapo-model-card-show")
    with gr.Column(visible=False, variant="panel", elem_id="orapo-version-confirm") as confirm_panel:
        question = gr.Markdown(elem_id="orapo-version-question")
        confirm_version = gr.Textbox(label="Version", visible=False)
        confirm_reason = gr.Textbox(label="Reason", visible=False)
        with gr.Row():
            confirm_promote_btn = gr.Button(
                "Promote", variant="primary", visible=False, elem_id="orapo-confirm-promote"
            )
            confirm_rollback_btn = gr.Button(
                "Roll back", variant="primary", visible=False, elem_id="orapo-confirm-rollback"
            )
            back_btn = gr.Button("Go back", elem_id="orapo-version-back")
    card = gr.Markdown(elem_id="orapo-model-card")
    f1_plot = gr.Plot(label="F1 per class", elem_id="orapo-plot-f1")
    with gr.Row():
        quality_plot = gr.Plot(label="Precision, recall, macro-F1", elem_id="orapo-plot-quality")
        length_plot = gr.Plot(label="Report length", elem_id="orapo-plot-length")
    return VersionsPanel(
        table,
        version_id,
        reason,
        actions,
        promote_btn,
        rollback_btn,
        card_btn,
        confirm_panel,
        question,
        confirm_version,
        confirm_reason,
        confirm_promote_btn,
        confirm_rollback_btn,
        back_btn,
        card,
        f1_plot,
        quality_plot,
        length_plot,
    )


def wire(
    ctx: AppContext,
    panel: VersionsPanel,
    result: gr.Markdown,
    also: Callable[[], Outputs] | None = None,
    also_outputs: list | None = None,
) -> None:
    """Promote and roll back after a question, saying what happened in the tab's status line `result`; pick a
    version in the table to see its card. `also` (filling `also_outputs`): the rest of the tab that a promotion or
    a rollback refreshes as well (the corrections-waiting line)."""

    def admin(request):
        return ctx.user(request, role="admin")

    def changed() -> Outputs:
        return {**panel.view(ctx), **panel.closed(), **(also() if also else {})}

    def reason_words(why) -> str:
        why = (why or "").strip()
        return f"\n\nReason, kept in the audit log: _{why}_" if why else ""

    @in_page(status=result)
    def ask_promote(vid, why, request: gr.Request) -> Outputs:
        admin(request)
        chosen = entered_id(vid, "version")
        if chosen is None:
            raise OrapoError("no_version", "Choose the version to promote (click it in the table).")
        version = get_version(ctx.database, chosen)
        if version.status == "rejected":  # the repository's own sentence, said at the question instead of after it
            raise OrapoError("version_rejected", f"Model version {chosen} was rejected and cannot be promoted.")
        if version.status == "promoted":
            raise OrapoError("already_served", f"Model version {chosen} is already the served model.")
        question = (
            f"**Promote {version_words(version)}?** It drafts every new report from now on, in place of "
            f"{version_words(served_version(ctx.database))}." + reason_words(why)
        )
        return {result: "", **panel.asking(question, promote=True, version_id=version.id, reason=why or "")}

    @in_page(status=result)
    def ask_rollback(vid, why, request: gr.Request) -> Outputs:
        admin(request)
        target, current = rollback_target(ctx.database, entered_id(vid, "version"))
        question = (
            f"**Roll back to {version_words(target)}?** It drafts every new report again, in place of "
            f"{version_words(current)}." + reason_words(why)
        )
        return {result: "", **panel.asking(question, promote=False, version_id=target.id, reason=why or "")}

    @in_page(status=result)
    def promote(vid, why, request: gr.Request) -> Outputs:
        actor = admin(request)
        if entered_id(vid, "version") is None:
            raise OrapoError("no_version", "Choose the version to promote (click it in the table).")
        version = ctx.rounds.service.promote_version(
            entered_id(vid, "version"), actor=actor, reason=(why or "").strip() or None
        )
        return {result: f"Version **{version.id}** ({version.name}) now drafts the reports.", **changed()}

    @in_page(status=result)
    def rollback(vid, why, request: gr.Request) -> Outputs:
        actor = admin(request)
        version = ctx.rounds.service.rollback(
            entered_id(vid, "version"), actor=actor, reason=(why or "").strip() or None
        )
        return {
            result: f"Rolled back: version **{version.id}** ({version.name}) drafts the reports again.",
            **changed(),
        }

    @in_page()
    def go_back(request: gr.Request) -> Outputs:
        admin(request)
        return panel.closed()

    @in_page()
    def show_card(vid, request: gr.Request) -> str:
        """The card of the version in the field; empty: of the model drafting now."""
        admin(request)
        return model_card(ctx.database, ctx.settings, entered_id(vid, "version")).markdown()

    @in_page()
    def pick_version(evt: gr.SelectData, request: gr.Request) -> Outputs:
        """A row picked: its version in the field and its card below (the serving folder's row: an empty field)."""
        admin(request)
        picked = str(evt.row_value[0]).strip()
        vid = int(picked) if picked.isdigit() else None
        return {
            panel.version_id: "" if vid is None else str(vid),
            panel.card: model_card(ctx.database, ctx.settings, vid).markdown(),
        }

    fields = [panel.version_id, panel.reason]
    asking = [
        result,
        panel.question,
        panel.confirm_version,
        panel.confirm_reason,
        panel.confirm_promote_btn,
        panel.confirm_rollback_btn,
        panel.confirm_panel,
        panel.actions,
    ]
    panel.promote_btn.click(ask_promote, inputs=fields, outputs=asking, api_visibility="private")
    panel.rollback_btn.click(ask_rollback, inputs=fields, outputs=asking, api_visibility="private")
    # the API order of the answer stays the status line, then the table and the charts
    outputs = [result, *panel.outputs, panel.confirm_panel, panel.actions, *(also_outputs or [])]
    confirmed = [panel.confirm_version, panel.confirm_reason]
    panel.confirm_promote_btn.click(promote, inputs=confirmed, outputs=outputs, api_name="promote_version")
    panel.confirm_rollback_btn.click(rollback, inputs=confirmed, outputs=outputs, api_name="rollback_version")
    panel.back_btn.click(go_back, outputs=[panel.confirm_panel, panel.actions], api_visibility="private")
    panel.card_btn.click(show_card, inputs=panel.version_id, outputs=panel.card, api_name="model_card")
    panel.table.select(pick_version, outputs=[panel.version_id, panel.card], api_visibility="private")
