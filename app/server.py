"""The Gradio app: a thin layer that translates clicks into service calls.

`build_app` takes its settings and database explicitly, so tests can build an
app over a temporary data folder, and nothing is held in module globals
(Gradio shares module state across every user).
"""

from __future__ import annotations

import gradio as gr

from orapo_core.config import Settings


def engine_status(settings: Settings, database) -> str:
    from db import DashboardRepository

    counts = DashboardRepository(database).counts()
    return (
        "### The engine is ready\n\n"
        f"- Data folder: `{settings.resolved_data_dir}`\n"
        f"- Database schema: {'up to date' if database.is_up_to_date() else 'needs `orapo db upgrade`'}\n"
        f"- Studies: {counts.studies}, corrections: {counts.corrections}, preference pairs: {counts.pairs}\n"
    )


def build_app(*, settings: Settings, database) -> gr.Blocks:
    with gr.Blocks(title="OraPO") as demo:
        gr.Markdown("# OraPO: chest X-ray report drafting")
        status = gr.Markdown()
        demo.load(lambda: engine_status(settings, database), outputs=status)
    return demo
