"""The Rounds tab: start, schedule, watch, cancel training rounds; compare, promote and roll back versions.

Administrators only, and checked in every handler (a radiologist calling
`/start_round` by name is refused like one clicking a hidden button). The
round service belongs to the app (`ctx.rounds`, a `RoundScheduler` started
with the server), so a round keeps running when the admin closes the page;
which round this page watches lives in the page (a number field), and a
`gr.Timer` polls it every two seconds only while that round is active. The
model versions, under the rounds, are `app.tabs.rounds_versions`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.accounts import auth
from app.services.insight import round_charts
from app.services.reading.reading_order import ORDER_LABELS
from app.services.rounds import decision_lines, parse_settings, recipe_names, schedule_status, set_schedule
from app.tabs import rounds_versions
from app.tabs.fields import entered_id, id_field
from app.tabs.outputs import Outputs
from app.tabs.rounds_versions import when
from orapo_core.errors import OrapoError

ROUND_COLUMNS = ["Round", "Status", "Trigger", "Progress", "Started by", "Requested", "Started", "Finished", "Error"]
ACTIVE = ("queued", "running")
STATUS_COLORS = {
    "queued": "#8c959f",
    "running": "#1f6feb",
    "succeeded": "#2a9d8f",
    "promoted": "#1a7f37",
    "rejected": "#bc4c00",
    "failed": "#cf222e",
    "cancelled": "#6e7781",
}
POLL_S = 2.0
STATUS_CSS = """
.bar {background: #eaeef2; border-radius: 6px; height: 14px; overflow: hidden; margin: 8px 0 4px;}
.bar > div {height: 100%; border-radius: 6px; transition: width .6s;}
.pill {display: inline-block; padding: 1px 10px; border-radius: 10px; color: white; font-weight: 600;}
.muted {color: #57606a;}
"""


@dataclass
class RoundsUI:
    round_id: gr.Textbox
    version_id: gr.Textbox
    timer: gr.Timer


def _recipes() -> list[tuple[str, str]]:
    return [("policy default", "")] + [(name, name) for name in recipe_names()]


def parse_overrides(text: str | None) -> dict:
    """The form's `key=value` lines (blank lines and `#` comments ignored) as a round's settings."""
    lines = [line.strip() for line in (text or "").splitlines()]
    return parse_settings([line for line in lines if line and not line.startswith("#")])


def round_rows(records, names: dict[int, str]) -> list[list]:
    """Newest first; a scheduled round was started by its trigger, a manual one by its admin."""
    return [
        [
            r.id,
            r.status,
            r.trigger,
            f"{r.progress * 100:.0f}%",
            names.get(r.started_by, "") if r.started_by else r.trigger,
            when(r.created_at),
            when(r.started_at),
            when(r.finished_at),
            r.error.splitlines()[0][:160] if r.error else "",
        ]
        for r in records
    ]


def round_html(details) -> str:
    """The live view's header: status, phase, step, a progress bar and the gate's or the error's sentence."""
    if details is None:
        return "<div class='muted'>Select a round in the table, or start one, to watch it here.</div>"
    r, metrics = details.round, details.metrics
    color = STATUS_COLORS.get(r.status, "#57606a")
    pct = max(0.0, min(1.0, r.progress)) * 100
    bits = [f"<b>Round {r.id}</b>", f"<span class='pill' style='background:{color}'>{html.escape(r.status)}</span>"]
    if r.status in ACTIVE and metrics.phase:
        bits.append(html.escape(str(metrics.phase)))
    step = metrics.train.get("step")
    if step is not None and metrics.max_steps:
        bits.append(f"step {int(step)}/{int(metrics.max_steps)}")
    bits.append(f"<span class='muted'>{html.escape(r.trigger)} · requested {when(r.created_at)}</span>")
    out = [
        " · ".join(bits),
        f"<div class='bar'><div style='width:{pct:.1f}%;background:{color}'></div></div>",
        f"<div class='muted'>{pct:.0f}% complete</div>",
    ]
    if metrics.selection is not None and metrics.selection.pairs_by_order:
        out.append(f"<div>New pairs by reading order: {html.escape(pairs_by_order_text(metrics.selection))}</div>")
    gate = metrics.gate
    if gate is not None and gate.reason:
        verdict = "promote" if gate.promote else "held for an administrator" if gate.hold else "reject"
        out.append(f"<div>Gate: <b>{verdict}</b> · {html.escape(gate.reason)}</div>")
        out.extend(f"<div class='muted'>{html.escape(line)}</div>" for line in decision_lines(gate))
    if r.error:
        out.append(f"<div style='color:#cf222e'>{html.escape(r.error.splitlines()[0])}</div>")
    if details.version is not None:
        v = details.version
        out.append(
            f"<div>Produced version <b>{v.id}</b> ({html.escape(v.name)}), now <b>{html.escape(v.status)}</b>.</div>"
        )
    return "\n".join(out)


def pairs_by_order_text(selection) -> str:
    """How many of a round's new clinician pairs each worklist ordering brought, in words."""
    words = dict(ORDER_LABELS, unordered="not opened from an ordering")
    return " · ".join(f"{n} {words.get(order, order)}" for order, n in sorted(selection.pairs_by_order.items()))


def log_text(details) -> str:
    """The round's own events, then the worker's last lines (a progress bar's redraws shown once, as the terminal would)."""
    events = "\n".join((details.round.log or "").splitlines()[-30:])
    worker = "\n".join(line.split("\r")[-1] for line in (details.log_tail or "").splitlines())
    return f"{events}\n\n--- worker output (last lines) ---\n{worker}" if worker.strip() else events


def schedule_markdown(status) -> str:
    """The schedule's state in words (a `ScheduleStatus`)."""
    schedule, lines = status.settings, []
    if status.next_run is not None:
        lines.append(f"Next scheduled round: **{status.next_run:%Y-%m-%d %H:%M %Z}** (`{schedule.cron}`).")
    else:
        lines.append("Scheduled rounds are **off**.")
    if schedule.threshold_enabled and schedule.corrections_threshold:
        lines.append(
            f"A round starts once **{schedule.corrections_threshold}** new signed corrections wait "
            f"(now {status.untrained})."
        )
    else:
        lines.append(
            f"The new-corrections trigger is **off** ({status.untrained} signed corrections wait for a round)."
        )
    if not status.scheduler_running and status.led_by:
        lines.append(f"_Scheduled rounds are started by another server ({status.led_by}), which leads._")
    elif not status.scheduler_running:
        lines.append("_The scheduler is not running in this process: rounds start only by hand._")
    return "  \n".join(lines)


def build(ctx: AppContext, tab: gr.Tab | None = None) -> RoundsUI:
    with gr.Column(elem_id="orapo-rounds"):
        with gr.Row(equal_height=True):
            with gr.Column(scale=1, variant="panel"):
                gr.Markdown("### Start a round now")
                recipe = gr.Dropdown(_recipes(), value="", label="Recipe", elem_id="orapo-round-recipe")
                overrides = gr.Textbox(
                    label="Overrides (key=value, one per line)",
                    lines=4,
                    max_lines=12,
                    placeholder="max_steps=50\nlearning_rate=1e-5\nmin_heldout=20",
                    elem_id="orapo-round-overrides",
                )
                start_btn = gr.Button("Start round now", variant="primary", elem_id="orapo-start-round")
            with gr.Column(scale=1, variant="panel"):
                gr.Markdown("### Schedule")
                with gr.Row():
                    cron = gr.Textbox(label="Cron (minute hour day month weekday)", placeholder="0 2 * * *", scale=3)
                    cron_on = gr.Checkbox(label="Scheduled rounds on", scale=1)
                with gr.Row():
                    threshold = gr.Number(
                        label="New-corrections threshold", precision=0, scale=3, placeholder="e.g. 50"
                    )
                    threshold_on = gr.Checkbox(label="Threshold trigger on", scale=1)
                save_btn = gr.Button("Save schedule", elem_id="orapo-save-schedule")
                schedule_md = gr.Markdown(elem_id="orapo-schedule-status")
        result = gr.Markdown(elem_id="orapo-rounds-result")

        gr.Markdown("### Rounds")
        rounds_table = gr.Dataframe(
            headers=ROUND_COLUMNS,
            interactive=False,
            wrap=True,
            max_height=260,
            column_widths=["7%", "9%", "8%", "8%", "9%", "13%", "13%", "13%", "20%"],
            elem_id="orapo-rounds-table",
        )
        with gr.Row(equal_height=True):
            round_id = id_field("Round", elem_id="orapo-round-id", placeholder="click a round in the table")
            watch_btn = gr.Button("Show round", scale=1)
            cancel_btn = gr.Button("Cancel round", variant="stop", scale=1, elem_id="orapo-cancel-round")
            refresh_btn = gr.Button("Refresh all", scale=1)
        status = gr.HTML(
            round_html(None), css_template=STATUS_CSS, js_on_load=None, padding=True, elem_id="orapo-round-status"
        )
        with gr.Row():
            reward_plot = gr.Plot(label="Reward", elem_id="orapo-plot-reward")
            zero_plot = gr.Plot(label="Zero-reward fraction", elem_id="orapo-plot-zero")
        with gr.Row():
            weight_plot = gr.Plot(label="DPO weight", elem_id="orapo-plot-weight")
            loss_plot = gr.Plot(label="Losses", elem_id="orapo-plot-losses")
        with gr.Accordion("Round log", open=False):
            log = gr.Code(
                language=None,
                label="Round events and worker output",
                lines=14,
                max_lines=14,
                interactive=False,
                elem_id="orapo-round-log",
            )
        timer = gr.Timer(POLL_S, active=False)

        versions = rounds_versions.build()

    live_outputs = [status, log, reward_plot, zero_plot, weight_plot, loss_plot, rounds_table, timer, cancel_btn]
    schedule_outputs = [cron, cron_on, threshold, threshold_on, schedule_md]

    def admin(request):
        return ctx.user(request, role="admin")

    def chosen(value) -> int | None:
        """The round id typed or picked in the round field; None when it is empty."""
        return entered_id(value, "round")

    def names(actor) -> dict[int, str]:
        return {u.id: u.username for u in auth.list_users(ctx.database, actor)}

    def live_view(actor, rid) -> Outputs:
        details = None if chosen(rid) is None else ctx.rounds.service.round_details(chosen(rid), log_lines=40)
        history = details.metrics_history if details is not None else []
        active = (
            details is not None and details.round.status in ACTIVE
        )  # only a queued or running round can be cancelled
        return {
            status: round_html(details),
            log: log_text(details) if details is not None else "",
            reward_plot: round_charts.reward_figure(history),
            zero_plot: round_charts.zero_reward_figure(history),
            weight_plot: round_charts.dpo_weight_figure(history),
            loss_plot: round_charts.losses_figure(history),
            rounds_table: round_rows(ctx.rounds.service.list_rounds(limit=50), names(actor)),
            timer: gr.Timer(active=active),
            cancel_btn: gr.Button(interactive=active),
        }

    def waiting_line() -> Outputs:
        """The schedule's lines, with how many signed corrections wait: a round that ends changes the number."""
        return {schedule_md: schedule_markdown(schedule_status(ctx.database, ctx.rounds))}

    def schedule_view() -> Outputs:
        now = schedule_status(ctx.database, ctx.rounds)
        s = now.settings
        return {
            cron: s.cron or "",
            cron_on: s.schedule_enabled,
            threshold: s.corrections_threshold,
            threshold_on: s.threshold_enabled,
            schedule_md: schedule_markdown(now),
        }

    @in_page()
    def overview(rid, request: gr.Request) -> Outputs:
        """Everything on the tab, fresh (on opening the tab and on Refresh)."""
        actor = admin(request)
        return {**live_view(actor, rid), **versions.view(ctx), **schedule_view()}

    @in_page()
    def round_status(rid, request: gr.Request) -> Outputs:
        """The live view of one round; the versions and the corrections-waiting line too once it has finished."""
        live = live_view(admin(request), rid)
        finished = chosen(rid) is not None and ctx.rounds.service.get_round(chosen(rid)).status not in ACTIVE
        return {**live, **({**versions.view(ctx), **waiting_line()} if finished else {})}

    @in_page(status=result)
    def start_round(recipe_name, overrides_text, request: gr.Request) -> Outputs:
        actor = admin(request)
        record = ctx.rounds.service.start_round(
            trigger="manual",
            actor=actor,
            recipe=recipe_name or None,
            settings=parse_overrides(overrides_text),
            wait=False,
        )
        return {
            round_id: record.id,
            result: f"Round **{record.id}** started: watch it below.",
            **live_view(actor, record.id),
        }

    @in_page(status=result)
    def cancel_round(rid, request: gr.Request) -> Outputs:
        actor = admin(request)
        if chosen(rid) is None:
            raise OrapoError("no_round", "Choose the round to cancel (click it in the table).")
        record = ctx.rounds.service.cancel_round(chosen(rid), actor=actor)
        return {result: f"Round **{record.id}** cancelled.", **live_view(actor, record.id)}

    @in_page(status=result)
    def save_schedule(cron_value, cron_enabled, threshold_value, threshold_enabled, request: gr.Request) -> Outputs:
        actor = admin(request)
        if threshold_value is not None and threshold_value < 1:  # checked here: Gradio's own bound check is a badge
            raise OrapoError(
                "invalid_threshold", "The new-corrections threshold is a number of corrections, 1 or more."
            )
        set_schedule(
            ctx.database,
            actor=actor,
            scheduler=ctx.rounds,
            cron=(cron_value or "").strip() or None,
            schedule_enabled=bool(cron_enabled),
            corrections_threshold=int(threshold_value) if threshold_value else None,
            threshold_enabled=bool(threshold_enabled),
        )
        return {result: "Schedule saved.", **schedule_view()}

    @in_page()
    def pick_round(evt: gr.SelectData, request: gr.Request):
        admin(request)
        return int(evt.row_value[0])

    everything = [*live_outputs, *versions.outputs, *schedule_outputs]
    if tab is not None:
        tab.select(overview, inputs=round_id, outputs=everything, api_visibility="private")
    refresh_btn.click(overview, inputs=round_id, outputs=everything, api_name="rounds_overview")
    start_btn.click(
        start_round, inputs=[recipe, overrides], outputs=[round_id, result, *live_outputs], api_name="start_round"
    )
    save_btn.click(
        save_schedule,
        inputs=[cron, cron_on, threshold, threshold_on],
        outputs=[result, *schedule_outputs],
        api_name="set_schedule",
    )
    watched = [*live_outputs, *versions.outputs, schedule_md]
    watch_btn.click(round_status, inputs=round_id, outputs=watched, api_name="round_status")
    timer.tick(round_status, inputs=round_id, outputs=watched, api_visibility="private", show_progress="hidden")
    cancel_btn.click(cancel_round, inputs=round_id, outputs=[result, *live_outputs], api_name="cancel_round")
    rounds_table.select(pick_round, outputs=round_id, api_visibility="private").then(
        round_status, inputs=round_id, outputs=watched, api_visibility="private"
    )
    rounds_versions.wire(ctx, versions, result, also=waiting_line, also_outputs=[schedule_md])
    return RoundsUI(round_id=round_id, version_id=versions.version_id, timer=timer)
