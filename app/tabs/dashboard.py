"""The Dashboard tab: big numbers and charts of studies, reports, acceptance and the drafts' misses.

The numbers come from `app.services.insight.dashboard`, which decides whose they are
(an administrator: everyone's by default; a radiologist: their own), and the
figures from `app.services.insight.dashboard_charts`; this module only places them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.messages import in_page
from app.services.insight import dashboard, dashboard_charts
from app.tabs.outputs import Outputs


@dataclass
class DashboardUI:
    opened: Callable  # the handler of opening the tab: (scope, bucket, request) -> the scope choice and the panels
    inputs: list
    outputs: list


def build(ctx: AppContext) -> DashboardUI:
    with gr.Row():
        # shown to administrators only, when the tab opens: a radiologist sees her own numbers
        scope = gr.Radio(
            ["everyone", "mine"],
            value=None,
            label="Whose numbers",
            scale=2,
            visible=False,
            elem_id="orapo-dashboard-scope",
        )
        bucket = gr.Radio(["auto", "day", "week"], value="auto", label="Acceptance per", scale=1)
        refresh = gr.Button("Refresh", scale=0, elem_id="orapo-dashboard-refresh")
    tiles = gr.HTML(elem_id="orapo-dashboard-tiles-box")
    with gr.Row():
        status_plot = gr.Plot(label="Studies by status", show_label=False)
        acceptance_plot = gr.Plot(label="Accepted unchanged", show_label=False)
    findings_plot = gr.Plot(label="Misses and over-calls", show_label=False)
    models_plot = gr.Plot(label="Drafts per model version", show_label=False)

    def panels(data: dashboard.DashboardData) -> Outputs:
        return {
            tiles: dashboard_charts.tiles_html(data),
            status_plot: dashboard_charts.status_figure(data),
            acceptance_plot: dashboard_charts.acceptance_figure(data),
            findings_plot: dashboard_charts.findings_figure(data),
            models_plot: dashboard_charts.models_figure(data),
        }

    @in_page()
    def show(scope_value, bucket_value, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        data = dashboard.dashboard_data(ctx.database, user, scope=scope_value, bucket=bucket_value or "auto")
        return {scope: data.scope, **panels(data)}

    @in_page()
    def opened(scope_value, bucket_value, request: gr.Request) -> Outputs:
        user = ctx.user(request)
        data = dashboard.dashboard_data(
            ctx.database, user, scope=scope_value if user.is_admin else None, bucket=bucket_value or "auto"
        )
        return {scope: gr.Radio(value=data.scope, visible=user.is_admin), **panels(data)}

    outputs = [scope, tiles, status_plot, acceptance_plot, findings_plot, models_plot]
    refresh.click(show, inputs=[scope, bucket], outputs=outputs, api_name="dashboard")
    scope.input(show, inputs=[scope, bucket], outputs=outputs, api_visibility="private")
    bucket.input(show, inputs=[scope, bucket], outputs=outputs, api_visibility="private")
    return DashboardUI(opened=opened, inputs=[scope, bucket], outputs=outputs)


def wire_select(ui: DashboardUI, tab: gr.Tab) -> None:
    """Opening the tab loads the numbers, so nobody looks at an empty page."""
    tab.select(ui.opened, inputs=ui.inputs, outputs=ui.outputs, api_visibility="private")
