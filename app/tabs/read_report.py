"""The Read tab's report column: draft, edit, save and sign, and never lose an edit.

What is signed is exactly what is on screen: accepting the draft is possible only
while the report still is the draft, and signing (or amending a signed report)
first shows the exact text to be stored, with the report locked, and stores that
text only if the report on screen is still the same.

No edit is lost without being asked:
- the page's session (`app.tabs.session.PageSession`) keeps the report version
  it opened (`report_version`) and saving sends it, so a version someone else saved since is refused, with an
  offer to reload that keeps the refused text on screen;
- it keeps the last text stored for the study (`saved_text`, mirrored in the
  hidden `#orapo-report-saved` for the page's unsaved-changes prompt,
  `app.page_scripts`), and Draft report asks before replacing an edit;
- the study the reader has open is remembered in the browser (`last_study`), so
  after a reload the column offers to continue with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.context import AppContext
from app.services.reading import draft_review, drafting, highlights, reports, scope
from app.services.reading import worklist as worklist_service
from app.tabs import read_model
from app.tabs.outputs import Outputs
from app.tabs.session import PageSession
from app.viewer_routes import render_url

LAST_STUDY_KEY = "orapo-last-study"  # localStorage key of the study the reader last had open (an id, and whose)
MODEL_POLL_S = 2.0
FACTS_TITLE = "Facts of a sentence (click a sentence above)"
DRAFT_QUESTION = (
    "**Your edit of this report is not saved.** A new draft would replace it in the report box. "
    "Replace it with a new draft, or keep your edit (and save it if you want to keep it)."
)
# The column fits 1440x900 beside the image with a draft on screen: every sentence of the highlights shows (compact,
# never scrolled out of sight), their legend shows whole under them, what was missed and contradicted scrolls inside
# a fixed height, the facts of a sentence fold away until a sentence is clicked, the gaps are tighter. The badge
# after each sentence never breaks inside (Gradio's highlights break words anywhere); the text between words only.
# Injected once into the page's head.
COLUMN_CSS = """<style>
#orapo-report-column { gap: 6px; }
#orapo-highlight-style { display: none; }
#orapo-highlights { padding-top: 4px; padding-bottom: 4px; }
#orapo-highlights .textfield { word-break: normal; overflow-wrap: break-word; font-size: 90%; line-height: 1.35; }
#orapo-highlights .textfield .token.highlighted { margin: 1px 4px 1px 0; padding: 0 3px; }
#orapo-highlights .label { white-space: nowrap; word-break: keep-all; }
#orapo-legend { font-size: 82%; line-height: 1.45; }
#orapo-legend p { margin: 0; }
#orapo-legend .orapo-chip, #orapo-missed .orapo-chip { color: #fff !important; font-weight: 600; font-size: 90%;
  padding: 0 5px; border-radius: 4px; white-space: nowrap; }
#orapo-missed { max-height: 5.8em; overflow-y: auto; font-size: 90%; line-height: 1.45; }
#orapo-missed p { margin: 0 0 2px 0; }
#orapo-missed ul { margin: 0 0 2px 0; }
</style>"""
# every column of a sentence's facts fits the column's width, the verdict (the last one) included
FACTS_WIDTHS = ["19%", "18%", "16%", "22%", "25%"]


@dataclass
class ReportColumn:
    state: gr.State
    opened_outputs: list[Any]  # what `opened` fills: the outputs of every event that opens a study
    components: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str):
        try:
            return self.__dict__["components"][name]
        except KeyError:
            raise AttributeError(name) from None


def _accept_allowed(text: str | None, session: PageSession) -> gr.Button:
    """Accept unchanged is offered while the report on screen is the draft and the draft checks find nothing."""
    return gr.Button(interactive=draft_review.can_accept_unchanged(session.draft_text, text))


def problems_md(text: str | None) -> str:
    """Above the report: what the draft checks find in the text on screen (issue 41 §4), or nothing."""
    found = draft_review.draft_problems(text)
    if not found:
        return ""
    lines = "\n".join(f"- {p.reason}" for p in found)
    return f"**Correct before signing** (Accept draft unchanged is off while any stands):\n{lines}"


def _editing(c: ReportColumn) -> Outputs:
    """No confirmation pending: the panel hidden, the actions shown."""
    return {c.pending: None, c.confirm_panel: gr.Column(visible=False), c.actions: gr.Row(visible=True)}


def study_markdown(overview, image) -> str:
    s = overview.study
    bits = f"{image.bits_stored}-bit " if image.bits_stored else ""
    kind = " ".join(p for p in (s.modality, s.view_position or "view unknown") if p)
    parts = [
        f"**Study {s.id}** · {s.patient_pseudonym}",
        kind,
        f"{bits}{image.source_format.upper()} {image.width}×{image.height}",
        f"status **{s.status}**",
    ]
    if s.split == "holdout":
        parts.append(worklist_service.HELD_OUT)
    md = " · ".join(parts)
    if s.not_drafted:  # not a chest radiograph: stored, never drafted (app.services.reading.scope)
        md += "\n\n" + scope.study_note(s)
    if image.warnings:
        md += "\n\n" + "\n".join(f"- Warning: {w}" for w in image.warnings)
    return md


def _highlighted(hl: highlights.Highlights | None) -> gr.HighlightedText:
    """The highlights panel for one mode: its spans, its colours and a title that says which mode it is."""
    if hl is None:
        return gr.HighlightedText(value=[], label=highlights.TITLES["empty"], color_map=highlights.COLOR_MAP)
    return gr.HighlightedText(value=hl.spans, label=hl.title, color_map={**highlights.COLOR_MAP, **hl.color_map})


def _legend_md(hl: highlights.Highlights | None) -> str:
    """The legend of the mode shown: every colour it uses and what it means, shown whole under the highlights."""
    if hl is None or not any(label for _, label in hl.spans):
        return ""  # no colour shown (a draft made without samples): nothing to explain
    chips = " ".join(
        f'<span class="orapo-chip" style="background:{color}">{label}</span> {meaning}'
        for label, color, meaning in hl.legend()
    )
    if hl.mode != "facts":
        return f"**Before your edit** (the share of the model's samples that agree): {chips}."
    return f"**Checked against your report:** {chips}."


def _missed_md(hl: highlights.Highlights) -> str:
    """What the reader must act on: what the draft left out or the check added, and (after editing) what the draft
    missed and why sentences are contradicted."""
    # what the model said greedily but did not confirm (too few samples repeated it, or the version's finding
    # verifier did not find it on this film), or what a finding the check added contradicts: not in the draft,
    # shown so it is not lost
    left_out = (
        (
            "**Left out of the draft** (the model wrote it but did not confirm it on this image, or it "
            "contradicts a finding the check added): " + " ".join(f"*{s}*" for s in hl.withheld) + "\n\n"
        )
        if hl.withheld
        else ""
    )
    # what the version's finding check stated from its reading of the image where the model's words were silent
    left_out += (
        (
            "**Added by the finding check** (read on the image, not written by the model): "
            + " ".join(f"*{s}*" for s in hl.added)
            + "\n\n"
        )
        if hl.added
        else ""
    )
    if hl.mode != "facts":
        return left_out.strip()
    # what the reader must act on first (the panel scrolls): what was missed, why sentences are contradicted
    missed = ", ".join(hl.missed) if hl.missed else "none"
    why = "".join(f"\n- *{sentence}* {reason}" for sentence, reason in hl.reasons)
    return (
        f"**Missed by the draft:** {missed}\n\n" + (f"**Contradicted:**{why}\n\n" if why else "") + left_out
    ).strip()


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line.strip() else ">" for line in (text or "").strip().splitlines())


def opened(c: ReportColumn, user, overview, image, unsaved=None) -> Outputs:
    """The column's outputs (`ReportColumn.opened_outputs`) for a study just opened: its latest draft and report,
    and the reader's unsaved edit of it (`unsaved`, an `AutosaveRecord`) in the report box when it was made from
    the version now stored (else quoted in the status line, to copy from)."""
    draft, corr = overview.latest_draft, overview.latest_correction
    report_text = corr.text if corr else (draft.text if draft else "")
    box_text, restored = report_text, ""
    if unsaved is not None and not reports.same_text(unsaved.text, report_text):
        when = unsaved.saved_at.strftime("%Y-%m-%d %H:%M UTC")
        if unsaved.base_version == (corr.version if corr else 0):
            box_text = unsaved.text
            restored = (
                f" · **your unsaved edit of {when} is back in the report box** (not saved yet: save or sign "
                "it, or Draft report to replace it)"
            )
        else:
            restored = (
                f"\n\n**Your text, not saved** (edited at {when}, before version {corr.version if corr else 0} "
                f"was stored; copy what you need from it):\n\n{_quoted(unsaved.text)}"
            )
    session = PageSession(
        owner=user.username,
        study_id=overview.study.id,
        image_id=image.id,
        draft_id=draft.id if draft else None,
        draft_text=draft.text if draft else None,
        report_version=corr.version if corr else 0,
        saved_text=report_text,
    )
    hl = highlights.highlights_for(draft, report_text) if draft else None
    if draft:
        choices = highlights.sentence_choices(draft.text)
        status = read_model.draft_status(draft, None) + scope.draft_note(draft)  # the unfamiliar-film warning
    elif overview.study.not_drafted:
        choices, status = [], scope.study_note(overview.study)
    else:
        choices, status = [], "No draft yet: press **Draft report**."
    if corr:
        status += f" · report version {corr.version}" + (" · **signed**" if corr.signed_at else " · not signed")
        status += " · saving now makes an amendment (a new version)"
    status += restored
    if draft and box_text != report_text:
        hl = highlights.highlights_for(draft, box_text)
    return {
        **_editing(c),
        c.accept_btn: _accept_allowed(box_text, session),
        c.problems: problems_md(box_text) if draft else "",
        c.state: session,
        c.study_info: study_markdown(overview, image),
        c.highlights: _highlighted(hl),
        c.legend: _legend_md(hl),
        c.missed: _missed_md(hl) if hl else "",
        c.sentence: gr.Dropdown(choices=choices, value=None),
        c.facts: [],
        c.report: gr.Textbox(value=box_text, interactive=True),
        c.status: status,
        c.saved: report_text,
        c.last_study: {"user": user.username, "study": overview.study.id},
        c.reload_btn: gr.Button(visible=False),
        c.resume_btn: gr.Button(visible=False),
        c.draft_panel: gr.Column(visible=False),
    }


def study_date(overview, image) -> str:
    """The study's date as the reader knows it: the (de-identified, shifted) StudyDate, else the upload day."""
    raw = str((image.header or {}).get("StudyDate") or "")
    if len(raw) == 8 and raw.isdigit():
        return f"{raw[:4]}-{raw[4:6]}-{raw[6:]}"
    return f"uploaded {overview.study.created_at:%Y-%m-%d}"


def confirm_heading(ctx: AppContext, user, ahead: reports.PendingReport) -> str:
    """The confirmation's question, naming the study it stores onto: number, pseudonymous patient, date and a
    thumbnail of its image, beside the question so that it stays next to the buttons."""
    overview = drafting.open_study(ctx.database, user, ahead.study_id)
    image = drafting.first_image(overview)
    s = overview.study
    thumb = render_url(s.id)
    return (
        f'<img src="{thumb}" alt="Study {s.id}" height="72" class="orapo-confirm-thumb" '
        f'style="float:left;height:72px;margin:0 10px 0 0;border:1px solid #888"/>'
        f"\n\n**Study {s.id}** · patient {s.patient_pseudonym} · {study_date(overview, image)}"
        f" · {' '.join(p for p in (s.modality, s.view_position) if p) or 'view unknown'}"
        f"\n\n**{ahead.question()}**"
    )


def _study_info(ctx: AppContext, user, session: PageSession) -> str:
    overview = drafting.open_study(ctx.database, user, session.study_id)
    return study_markdown(overview, drafting.first_image(overview))


def model_note(c: ReportColumn, registry) -> Outputs:
    """What the column says about the served model while it loads at start-up, and whether to ask again."""
    readiness = getattr(registry, "readiness", None)
    state = readiness() if readiness is not None else None
    if state is None or state.state in ("idle", "ready"):
        return {c.model_note: "", c.model_timer: gr.Timer(active=False)}
    if state.state == "loading":
        return {
            c.model_note: f"Loading the model **{state.name}** in the background; a draft asked for now waits for it.",
            c.model_timer: gr.Timer(active=True),
        }
    return {
        c.model_note: f"The model **{state.name}** could not be loaded at start-up ({state.message}); "
        "Draft report will try again.",
        c.model_timer: gr.Timer(active=False),
    }


def build_column(ctx: AppContext) -> ReportColumn:
    """The report column's components, in page order (call inside the column)."""
    c: dict[str, Any] = {}
    c["state"] = state = gr.State(PageSession())
    c["study_info"] = gr.Markdown("Upload a study or open one from the worklist.", elem_id="orapo-study")
    c["resume_btn"] = gr.Button("Continue where you left off", visible=False, elem_id="orapo-resume")
    c["model_note"] = gr.Markdown(elem_id="orapo-model-status")
    c["draft_btn"] = gr.Button("Draft report", variant="primary", size="md", elem_id="orapo-draft")
    with gr.Column(visible=False, elem_id="orapo-draft-confirm") as c["draft_panel"]:
        gr.Markdown(DRAFT_QUESTION, elem_id="orapo-draft-question")
        with gr.Row():
            c["replace_btn"] = gr.Button("Replace my edit with a new draft", elem_id="orapo-draft-replace")
            c["keep_btn"] = gr.Button("Keep my edit", variant="primary", elem_id="orapo-draft-keep")
    c["highlights"] = gr.HighlightedText(
        label=highlights.TITLES["empty"],
        color_map=highlights.COLOR_MAP,
        show_legend=False,
        show_inline_category=True,
        combine_adjacent=False,
        elem_id="orapo-highlights",
    )
    gr.HTML("", head=COLUMN_CSS, container=False, padding=False, elem_id="orapo-highlight-style")
    c["legend"] = gr.Markdown(elem_id="orapo-legend")
    c["missed"] = gr.Markdown(elem_id="orapo-missed")
    # folded until wanted: clicking a sentence in the highlights opens it on that sentence's facts
    with gr.Accordion(FACTS_TITLE, open=False, elem_id="orapo-facts-panel") as c["facts_panel"]:
        c["sentence"] = gr.Dropdown(label="Sentence", choices=[], elem_id="orapo-sentence")
        c["facts"] = gr.Dataframe(
            headers=["Mention", "Finding", "Polarity", "Attributes", "Verdict"],
            interactive=False,
            wrap=True,
            column_widths=FACTS_WIDTHS,
            elem_id="orapo-facts",
        )
    c["problems"] = gr.Markdown(elem_id="orapo-draft-problems")
    c["report"] = gr.Textbox("", label="Report (edit in place)", lines=7, max_lines=10, elem_id="orapo-report")
    # the last text stored for the study: what the page's unsaved-changes prompt compares the report with
    c["saved"] = gr.Textbox("", visible="hidden", interactive=False, elem_id="orapo-report-saved")
    with gr.Row() as c["actions"]:
        c["accept_btn"] = gr.Button(
            "Accept draft unchanged and sign", interactive=False, size="md", scale=3, elem_id="orapo-accept"
        )
        c["save_btn"] = gr.Button("Save correction", size="md", scale=2, elem_id="orapo-save")
        c["sign_btn"] = gr.Button("Save and sign", variant="primary", size="md", scale=2, elem_id="orapo-sign")
    with gr.Column(visible=False, elem_id="orapo-confirm") as c["confirm_panel"]:
        c["question"] = gr.Markdown(elem_id="orapo-confirm-question")
        c["confirm_text"] = gr.Textbox(
            label="Exactly this text will be stored",
            interactive=False,
            lines=6,
            max_lines=20,
            elem_id="orapo-confirm-text",
        )
        with gr.Row():
            c["confirm_btn"] = gr.Button("Sign", variant="primary", elem_id="orapo-confirm-sign")
            c["back_btn"] = gr.Button("Go back", elem_id="orapo-confirm-back")
    c["status"] = gr.Markdown(elem_id="orapo-status")
    c["reload_btn"] = gr.Button("Reload the study (its latest version)", visible=False, elem_id="orapo-reload-study")
    c["card_panel"], c["card"] = read_model.build()  # the card of the model that wrote the draft (app.tabs.read_model)
    c["pending"] = gr.State(None)  # the PendingReport the confirmation shows, until stored or abandoned
    c["last_study"] = gr.BrowserState({}, storage_key=LAST_STUDY_KEY, secret=LAST_STUDY_KEY)  # not a secret: an id
    c["model_timer"] = gr.Timer(MODEL_POLL_S, active=False)
    opened_outputs = [
        c[k]
        for k in (
            "pending",
            "confirm_panel",
            "actions",
            "accept_btn",
            "problems",
            "state",
            "study_info",
            "highlights",
            "legend",
            "missed",
            "sentence",
            "facts",
            "report",
            "status",
            "saved",
            "last_study",
            "reload_btn",
            "resume_btn",
            "draft_panel",
        )
    ]
    return ReportColumn(state=state, opened_outputs=opened_outputs, components=c)
