"""Plotly figures and number tiles of the dashboard: plain functions of `DashboardData`.

The Dashboard tab only places what these return (`panels`), so the figures are
built in the service layer beside the round charts (`app.services.insight.round_charts`,
whose `nothing_to_show` both use) and tested without a server. Each chart has
one measure, the one it is ranked and labelled by: a "most missed" bar is as
long as the number of reports it was missed in, the number written on it; the
share of the reports stating the finding is in the hover.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

from app.services.insight.dashboard import DashboardData
from app.services.insight.round_charts import nothing_to_show

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

STATUS_COLORS = {
    "new": "#90a4ae",
    "drafted": "#42a5f5",
    "corrected": "#ffa726",
    "signed": "#66bb6a",
    "trained": "#ab47bc",
}
TOP_FINDINGS = 10


def _whole_ticks(largest: int) -> dict:
    """Axis ticks for counts: whole numbers only, about six of them."""
    return {"tick0": 0, "dtick": max(1, math.ceil(largest / 6)), "rangemode": "tozero"}


def _layout(fig: Figure, title: str, height: int = 320) -> Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01},
        height=height,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        template="plotly_white",
        showlegend=False,
    )
    return fig


def status_figure(data: DashboardData) -> Figure:
    import plotly.graph_objects as go

    statuses = list(data.studies_by_status)
    counts = [data.studies_by_status[s] for s in statuses]
    fig = go.Figure(
        go.Bar(
            x=statuses,
            y=counts,
            text=counts,
            textposition="auto",
            marker_color=[STATUS_COLORS.get(s, "#78909c") for s in statuses],
            hovertemplate="%{x}: %{y} studies<extra></extra>",
        )
    )
    if not data.studies:
        nothing_to_show(fig, "No studies yet")
    else:
        fig.update_yaxes(**_whole_ticks(max(counts)))
    return _layout(fig, f"Studies by status ({data.studies})")


def acceptance_figure(data: DashboardData) -> Figure:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    points = data.acceptance_over_time
    if not points:
        return _layout(nothing_to_show(fig, "No reports yet"), "Drafts accepted unchanged")
    periods = [p.period for p in points]
    # the rate goes on the secondary axis because plotly draws that one on top of the report-count bars
    fig.add_trace(
        go.Bar(
            x=periods,
            y=[p.reports for p in points],
            name="reports",
            marker_color="#cfd8dc",
            opacity=0.8,
            hovertemplate="%{x}: %{y} reports<extra></extra>",
        ),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(
            x=periods,
            y=[100 * p.rate for p in points],
            name="accepted unchanged",
            mode="lines+markers",
            line={"color": "#2e7d32", "width": 3},
            marker={"size": 10},
            customdata=[[p.accepted_unchanged, p.reports] for p in points],
            hovertemplate="%{x}: %{y:.0f}% (%{customdata[0]} of %{customdata[1]})<extra></extra>",
        ),
        secondary_y=True,
    )
    fig.update_yaxes(
        title_text="reports", showgrid=False, secondary_y=False, **_whole_ticks(max(p.reports for p in points))
    )
    fig.update_yaxes(title_text="accepted unchanged (%)", range=[0, 105], secondary_y=True)
    fig.update_xaxes(type="category")
    overall = f"{100 * data.acceptance_rate:.0f}%" if data.acceptance_rate is not None else "n/a"
    return _layout(fig, f"Drafts accepted unchanged, per {data.bucket} (overall {overall})")


def findings_figure(data: DashboardData, top: int = TOP_FINDINGS) -> Figure:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.25,
        subplot_titles=("Most missed by the draft", "Most over-called by the draft"),
    )
    title = f"Findings the drafts get wrong ({data.compared_reports} signed reports compared with their draft)"
    if not (data.misses or data.overcalls):
        return _layout(
            nothing_to_show(fig, "No misses or over-calls yet" if data.compared_reports else "No signed reports yet"),
            title,
            height=360,
        )
    for col, rates, color, what in (
        (1, data.misses, "#c62828", "missed in"),
        (2, data.overcalls, "#f9a825", "over-called in"),
    ):
        if not rates:
            left, right = fig.layout["xaxis" if col == 1 else f"xaxis{col}"].domain
            fig.add_annotation(text="none", showarrow=False, x=(left + right) / 2, y=0.5, xref="paper", yref="paper")
            fig.update_xaxes(visible=False, row=1, col=col)
            fig.update_yaxes(visible=False, row=1, col=col)
            continue
        rates = list(reversed(rates[:top]))  # plotly draws the first bar at the bottom
        # one measure per chart, the one it is ranked by: each bar is as long as the count it is labelled with;
        # the share of the reports stating the finding is in the hover
        fig.add_trace(
            go.Bar(
                y=[r.finding for r in rates],
                x=[r.errors for r in rates],
                orientation="h",
                marker_color=color,
                text=[str(r.errors) for r in rates],
                textposition="auto",
                customdata=[[r.out_of, f"{100 * r.rate:.0f}%"] for r in rates],
                hovertemplate=f"%{{y}}: {what} %{{x}} of the %{{customdata[0]}} reports stating it "
                "(%{customdata[1]})<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="reports", row=1, col=col)
    fig.update_xaxes(**_whole_ticks(max(r.errors for r in data.misses + data.overcalls)))
    return _layout(fig, title, height=max(360, 60 + 28 * min(top, max(len(data.misses), len(data.overcalls)))))


def models_figure(data: DashboardData) -> Figure:
    import plotly.graph_objects as go

    names = list(data.drafts_by_model)
    fig = go.Figure(
        go.Bar(
            x=[data.drafts_by_model[n] for n in names],
            y=names,
            orientation="h",
            marker_color="#5c6bc0",
            hovertemplate="%{y}: %{x} drafts<extra></extra>",
        )
    )
    if not names:
        nothing_to_show(fig, "No drafts yet")
    else:
        fig.update_xaxes(**_whole_ticks(max(data.drafts_by_model.values())))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, f"Drafts per model version ({data.drafts})", height=max(240, 80 + 32 * len(names)))


def tiles_html(data: DashboardData) -> str:
    rate = f"{100 * data.acceptance_rate:.0f}%" if data.acceptance_rate is not None else "–"
    sources = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in data.pairs_by_source.items() if n) or "none yet"
    tiles = [
        ("Studies", data.studies, f"{data.holdout_studies} kept aside to check the model"),
        ("Drafts", data.drafts, f"{len(data.drafts_by_model)} model version(s)"),
        ("Reports", data.reports, f"{data.corrections} saved versions, {data.signed} signed"),
        ("Accepted unchanged", rate, f"{data.accepted_unchanged} of {data.reports} reports"),
        ("Preference pairs", data.pairs, sources),
    ]
    cells = "".join(
        '<div style="flex:1 1 150px;border:1px solid #ddd;border-radius:8px;padding:10px 14px">'
        f'<div style="font-size:0.85em;opacity:0.75">{html.escape(label)}</div>'
        f'<div style="font-size:2em;font-weight:600;line-height:1.2">{html.escape(str(value))}</div>'
        f'<div style="font-size:0.8em;opacity:0.7">{html.escape(note)}</div></div>'
        for label, value, note in tiles
    )
    whose = "everyone's studies" if data.scope == "everyone" else "your studies"
    return (
        f'<div style="font-size:0.9em;opacity:0.8;margin-bottom:6px">Showing {whose}.</div>'
        f'<div id="orapo-dashboard-tiles" style="display:flex;flex-wrap:wrap;gap:10px">{cells}</div>'
    )


def panels(data: DashboardData) -> tuple:
    """What the tab shows, in its order: the tiles, then the status, acceptance, findings and models charts."""
    return tiles_html(data), status_figure(data), acceptance_figure(data), findings_figure(data), models_figure(data)
