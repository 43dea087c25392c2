"""The Read tab's image viewer: Cornerstone3D in the page, fed the study's full-bit-depth pixels.

One `gr.HTML` component holds the viewer's markup (a toolbar, the viewport, a status line). Its value is the
address of the pixels of the image shown (`app.study_image_routes`), or "" with no study; the template never changes,
so Gradio never re-renders the markup under the viewer, and the script (`viewer/src/orapo-viewer.js`, built
into `app/static/viewer/` by `make viewer`) loads the new image when the value changes. Window/level, zoom,
pan, invert and the presets all run in the browser. If the script cannot be loaded or started, the page
falls back to the server's rendering: a PNG per preset from the same route module.
"""

from __future__ import annotations

import gradio as gr  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.study_image_routes import image_pixels_url
from app.viewer_routes import script_url

PRESET_BUTTONS = (
    ("lung", "Lung"),
    ("mediastinum", "Mediastinum"),
    ("bone", "Bone"),
    ("default", "Default"),
    ("full", "Full"),
)
HELP = (
    "Left drag: the chosen tool · middle drag: pan · right drag: window/level · wheel: zoom at the cursor. "
    "Keys: 1-5 presets, i invert, f fit, 0 one image pixel per screen pixel, + / - zoom, "
    "w / p / z tool, r reset."
)


def _template() -> str:
    presets = "".join(
        f'<button type="button" data-preset="{key}" title="{label} window ({i})">{label}</button>'
        for i, (key, label) in enumerate(PRESET_BUTTONS, start=1)
    )
    return f"""<div class="orapo-viewer" tabindex="0" data-state="empty" aria-label="Image viewer" title="{HELP}">
  <div class="orapo-viewer-bar" role="toolbar" aria-label="Viewer tools">
    <span class="orapo-viewer-group" aria-label="Left-button tool">
      <button type="button" data-tool="wl" title="Window/level with the left button (w)">W/L</button>
      <button type="button" data-tool="pan" title="Pan with the left button (p)">Pan</button>
      <button type="button" data-tool="zoom" title="Zoom with the left button (z)">Zoom</button>
    </span>
    <span class="orapo-viewer-group" aria-label="Window presets">{presets}</span>
    <span class="orapo-viewer-group">
      <button type="button" data-action="invert" title="Invert (i)">Invert</button>
      <button type="button" data-action="fit" title="Fit to window (f)">Fit</button>
      <button type="button" data-action="actual" title="One image pixel per screen pixel (0)">1:1</button>
      <button type="button" data-action="reset" title="Reset window, zoom and pan (r)">Reset</button>
    </span>
    <span class="orapo-viewer-group">
      <label>L <input data-input="center" type="number" step="1" aria-label="Window centre (level)"></label>
      <label>W <input data-input="width" type="number" step="1" min="1" aria-label="Window width"></label>
    </span>
  </div>
  <div class="orapo-stage">
    <div class="orapo-viewport" data-viewport></div>
    <div class="orapo-viewer-status" data-status aria-live="polite">No study open.</div>
  </div>
</div>"""


CSS = """
.orapo-viewer { display: flex; flex-direction: column; gap: 4px; outline: none; }
.orapo-viewer:focus-visible { outline: 2px solid var(--color-accent); }
.orapo-viewer-bar { display: flex; flex-wrap: wrap; gap: 4px 8px; align-items: center; }
.orapo-viewer-group { display: inline-flex; gap: 2px; align-items: center; font-size: 12px; }
.orapo-viewer-bar button { font: inherit; font-size: 12px; line-height: 1.4; padding: 1px 6px; margin: 0;
  border: 1px solid var(--border-color-primary); border-radius: 4px; background: var(--button-secondary-background-fill);
  color: var(--body-text-color); cursor: pointer; }
.orapo-viewer-bar button[aria-pressed=true] { background: var(--button-primary-background-fill);
  color: var(--button-primary-text-color); }
.orapo-viewer-bar button:disabled { opacity: 0.5; cursor: default; }
.orapo-viewer-bar label { display: inline-flex; gap: 2px; align-items: center; margin: 0; }
.orapo-viewer-bar input { width: 5em; font: inherit; font-size: 12px; padding: 0 3px; margin: 0; }
.orapo-stage { position: relative; }
.orapo-viewport { width: 100%; height: clamp(300px, calc(100vh - 370px - var(--orapo-above-viewer, 0px)), 760px);
  background: #000;
  touch-action: none; user-select: none; }
.orapo-viewport > img { width: 100%; height: 100%; object-fit: contain; }
.orapo-viewer-status { position: absolute; left: 4px; bottom: 4px; padding: 0 4px; border-radius: 3px; font-size: 12px;
  color: #fff; background: rgba(0, 0, 0, 0.6); pointer-events: none; }
"""
# Loads the bundle once per page (then mounts), or falls back to the server's PNG rendering when the bundle
# cannot load or start: the presets then re-render on the server, nothing else works.
JS_ON_LOAD = """
const root = element.querySelector('.orapo-viewer');
const fallback = (why) => {
  console.error('orapo viewer: server rendering instead:', why);
  const box = root.querySelector('[data-viewport]');
  const status = root.querySelector('[data-status]');
  root.dataset.state = 'fallback';
  root.querySelectorAll('[data-tool],[data-action],input').forEach((b) => { b.disabled = true; });
  let preset = 'default';
  const show = () => {
    const src = props.value || '';
    box.innerHTML = src ? `<img alt="Image, ${preset} window" src="${src.replace(/\\/pixels(\\?.*)?$/, '/render.png')}?preset=${preset}">` : '';
    status.textContent = src ? `Server rendering (the viewer could not start): ${preset} window.` : 'No study open.';
  };
  root.querySelectorAll('[data-preset]').forEach((b) => b.addEventListener('click', () => { preset = b.dataset.preset; show(); }));
  show();
  watch('value', show);
};
window.__orapoViewerScript = window.__orapoViewerScript || new Promise((resolve, reject) => {
  const script = document.createElement('script');
  script.src = '__SCRIPT__';
  script.onload = resolve;
  script.onerror = () => reject(new Error('the viewer script did not load'));
  document.head.appendChild(script);
});
window.__orapoViewerScript
  .then(() => window.OrapoViewer.mount(root, props, watch))
  .catch(fallback);
"""


def build() -> gr.HTML:
    """The viewer; an output of every handler that opens a study (its value: `value_for`)."""
    return gr.HTML(
        "",
        html_template=_template(),
        css_template=CSS,
        js_on_load=JS_ON_LOAD.replace("__SCRIPT__", script_url()),
        apply_default_css=False,
        elem_id="orapo-viewer",
        container=False,
        padding=False,
    )


def value_for(study_id: int, image) -> str:
    """What the viewer shows: the address of the pixels of one image of a study (any of its images: the first
    when a study opens, the one whose thumbnail the reader clicks then)."""
    return image_pixels_url(study_id, image.id)
