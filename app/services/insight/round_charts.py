"""Plotly figures of training rounds: a running round's curves and the versions side by side.

Plain functions of plain data (the trainer's `metrics.jsonl` records, the
versions' stored metrics), so the Rounds tab only places them and tests check
them without a server. A figure with nothing to show says so in its middle
rather than drawing empty axes.

The version charts read what the round service stores on a version:
`metrics["heldout"]`, the clinical-efficacy metrics of the held-out evaluation
(an `EvalMetrics`, stored with its `to_dict`); versions without it (a base
registered by hand) are left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from app.services.rounds.versions import heldout_metrics
from db.records import ModelVersionRecord
from orapo_core.facts.metrics import EvalMetrics

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

REWARD, REWARD_STD = "orapo/reward_mean", "orapo/reward_std"
ZERO_REWARD = "orapo/zero_reward_frac"
DPO_WEIGHT = "orapo/dpo_weight"
LOSSES = {"orapo/grpo_loss": "GRPO loss", "orapo/dpo_loss": "DPO loss", "orapo/sft_loss": "SFT loss"}
PALETTE = ["#1f6feb", "#d1495b", "#2a9d8f", "#e9a23b", "#7b5ea7", "#4d908e", "#f3722c", "#577590"]
HEIGHT = 280


def _go() -> ModuleType:
    import plotly.graph_objects as go

    return go


def _layout(
    fig: Figure,
    title: str,
    *,
    y_title: str | None = None,
    x_title: str | None = "step",
    legend: bool = False,
    height: int = HEIGHT,
) -> Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "font": {"size": 15}},
        height=height,
        template="plotly_white",
        margin={"l": 50, "r": 15, "t": 45, "b": 40},
        showlegend=legend,
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
    )
    fig.update_xaxes(title=x_title)
    fig.update_yaxes(title=y_title)
    return fig


def nothing_to_show(fig: Figure, message: str) -> Figure:
    """`fig` saying `message` in its middle, without empty axes (the dashboard's charts use it too)."""
    fig.add_annotation(
        text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14, "color": "#6e7781"}
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def series(history: Iterable[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one logged key; records without it (the run's summary line, other phases) are skipped."""
    steps: list[int] = []
    values: list[float] = []
    for record in history:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and record.get("step") is not None:
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def _line(go: ModuleType, steps: list[int], values: list[float], name: str, color: str) -> Any:  # a go.Scatter
    return go.Scatter(
        x=steps,
        y=values,
        name=name,
        mode="lines+markers",
        line={"color": color, "width": 2},
        marker={"size": 6},
        hovertemplate=f"{name}<br>step %{{x}}: %{{y:.4f}}<extra></extra>",
    )


def reward_figure(history: list[dict[str, Any]]) -> Figure:
    """Mean FactS reward of the sampled reports per step, with a ±1 standard deviation band."""
    go = _go()
    fig = go.Figure()
    steps, means = series(history, REWARD)
    if not steps:
        return _layout(nothing_to_show(fig, "No reward logged yet"), "Reward (mean ± std)")
    std_steps, stds = series(history, REWARD_STD)
    std_by_step = dict(zip(std_steps, stds))
    if std_by_step:
        upper = [m + std_by_step.get(s, 0.0) for s, m in zip(steps, means)]
        lower = [m - std_by_step.get(s, 0.0) for s, m in zip(steps, means)]
        fig.add_trace(
            go.Scatter(
                x=steps + steps[::-1],
                y=upper + lower[::-1],
                fill="toself",
                name="± std",
                fillcolor="rgba(31,111,235,0.15)",
                line={"width": 0},
                hoverinfo="skip",
            )
        )
    fig.add_trace(_line(go, steps, means, "reward mean", PALETTE[0]))
    return _layout(fig, "Reward (mean ± std)", y_title="FactS reward")


def zero_reward_figure(history: list[dict[str, Any]]) -> Figure:
    """The fraction of sampled reports that scored zero: what the oracle's DPO term is there to rescue."""
    go = _go()
    fig = go.Figure()
    steps, values = series(history, ZERO_REWARD)
    if not steps:
        return _layout(nothing_to_show(fig, "No zero-reward fraction logged yet"), "Zero-reward fraction")
    fig.add_trace(_line(go, steps, values, "zero-reward fraction", PALETTE[1]))
    fig.update_yaxes(range=[0, 1.02])
    return _layout(fig, "Zero-reward fraction", y_title="fraction")


def dpo_weight_figure(history: list[dict[str, Any]]) -> Figure:
    go = _go()
    fig = go.Figure()
    steps, values = series(history, DPO_WEIGHT)
    if not steps:
        return _layout(nothing_to_show(fig, "No DPO weight logged yet"), "DPO weight")
    fig.add_trace(_line(go, steps, values, "DPO weight", PALETTE[2]))
    return _layout(fig, "DPO weight", y_title="weight")


def losses_figure(history: list[dict[str, Any]]) -> Figure:
    """GRPO, DPO (and SFT, when the oracle mode logs it) losses on one chart."""
    go = _go()
    fig = go.Figure()
    for (key, name), color in zip(LOSSES.items(), (PALETTE[0], PALETTE[3], PALETTE[4])):
        steps, values = series(history, key)
        if steps:
            fig.add_trace(_line(go, steps, values, name, color))
    if not fig.data:
        return _layout(nothing_to_show(fig, "No losses logged yet"), "Losses")
    return _layout(fig, "Losses", y_title="loss", legend=True)


def live_figures(history: list[dict[str, Any]]) -> tuple[Figure, Figure, Figure, Figure]:
    """The four charts of a round's live view, in the tab's order."""
    return reward_figure(history), zero_reward_figure(history), dpo_weight_figure(history), losses_figure(history)


# --- versions -------------------------------------------------------------------------------------------


def _evaluated(versions: Iterable[ModelVersionRecord]) -> list[tuple[str, EvalMetrics]]:
    """(label, held-out metrics) of each version that has them, oldest first."""
    out = []
    for v in sorted(versions, key=lambda v: v.id):
        metrics = heldout_metrics(v)
        if metrics.macro_f1_14 is not None:
            out.append((f"v{v.id} {v.name}", metrics))
    return out


def per_class_f1_figure(versions: Sequence[ModelVersionRecord]) -> Figure:
    """F1 per CheXpert observation, one bar per version in each group."""
    go = _go()
    fig = go.Figure()
    evaluated = _evaluated(versions)
    if not evaluated:
        return _layout(
            nothing_to_show(fig, "No evaluated versions yet: a finished round adds one"),
            "F1 per class",
            x_title=None,
            height=340,
        )
    classes = list(evaluated[-1][1].f1_per_class)
    for (label, metrics), color in zip(evaluated, PALETTE * (len(evaluated) // len(PALETTE) + 1)):
        per_class = metrics.f1_per_class
        fig.add_trace(
            go.Bar(
                x=classes,
                y=[per_class.get(c) for c in classes],
                name=label,
                marker_color=color,
                hovertemplate=f"{label}<br>%{{x}}: F1 %{{y:.3f}}<extra></extra>",
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(range=[0, 1.02])
    return _layout(fig, "F1 per class (held-out)", y_title="F1", x_title=None, legend=True, height=340)


def quality_figure(versions: Sequence[ModelVersionRecord]) -> Figure:
    """Macro precision, recall and F1 (14 observations) of each version, in the order the rounds made them."""
    go = _go()
    fig = go.Figure()
    evaluated = _evaluated(versions)
    if not evaluated:
        return _layout(nothing_to_show(fig, "No evaluated versions yet"), "Precision, recall, macro-F1", x_title=None)
    labels = [label for label, _ in evaluated]
    lines = (
        ("precision", [m.macro_precision_14 for _, m in evaluated]),
        ("recall", [m.macro_recall_14 for _, m in evaluated]),
        ("macro-F1", [m.macro_f1_14 for _, m in evaluated]),
    )
    for (name, values), color in zip(lines, PALETTE):
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=values,
                name=name,
                mode="lines+markers",
                line={"color": color, "width": 2},
                marker={"size": 8},
                hovertemplate=f"{name}<br>%{{x}}: %{{y:.3f}}<extra></extra>",
            )
        )
    fig.update_yaxes(range=[0, 1.02])
    fig.update_xaxes(type="category")
    return _layout(fig, "Precision, recall, macro-F1 (held-out)", y_title="score", x_title=None, legend=True)


def report_length_figure(versions: Sequence[ModelVersionRecord]) -> Figure:
    """Mean words per drafted report: a reward hacked by length shows here first."""
    go = _go()
    fig = go.Figure()
    evaluated = _evaluated(versions)
    if not evaluated:
        return _layout(nothing_to_show(fig, "No evaluated versions yet"), "Mean report length", x_title=None)
    labels = [label for label, _ in evaluated]
    lengths = [m.mean_report_length for _, m in evaluated]
    fig.add_trace(
        go.Bar(
            x=labels,
            y=lengths,
            marker_color=PALETTE[2],
            text=[f"{v:.0f}" if v is not None else "" for v in lengths],
            textposition="auto",
            hovertemplate="%{x}: %{y:.1f} words<extra></extra>",
        )
    )
    fig.update_xaxes(type="category")
    return _layout(fig, "Mean report length (held-out)", y_title="words", x_title=None)


def version_figures(versions: Sequence[ModelVersionRecord]) -> tuple[Figure, Figure, Figure]:
    return per_class_f1_figure(versions), quality_figure(versions), report_length_figure(versions)
