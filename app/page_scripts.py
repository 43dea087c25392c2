"""Scripts the page runs itself.

- The unsaved-changes prompt (`EARLY_HEAD`): leaving or reloading the page while
  the report box differs (whitespace aside) from the last text stored for the
  study, which the Read tab keeps in the hidden `#orapo-report-saved`, makes the
  browser ask first. Gradio closes its connection to the server in a
  `beforeunload` listener, even when the reader then chooses to stay, which would
  leave a page whose buttons no longer answer (the next save lost). Gradio adds
  that listener, and the `gr.Blocks(head=...)` scripts, from its own modules, and
  Chromium runs a window's listeners in the order they were added (a capture
  listener on the window itself does not go first), so a head script cannot stop
  it. This one is put at the very start of the page's `<head>` by the session
  middleware (`app.web_requests.with_early_script`), before any of Gradio's
  scripts: it adds the prompt's listener first, and every `beforeunload`
  listener added to the window after it is held back while the prompt is asked
  for, then run on `pagehide`, which comes only when the page really goes.
- The drop zone's filter (`app.tabs.read_upload`), in `gr.Blocks(head=...)`:
  before Gradio's own checks see a batch (chosen or dropped), the files of a
  wrong type or over the upload limit are taken out of it and named, with their
  reason, in the hidden `#orapo-dropped`; the rest goes up as one batch. Gradio
  would drop the first kind with a fading toast and refuse the whole batch for
  the second.
"""

from __future__ import annotations

import json

UNSAVED_GUARD = """
(() => {
  if (window.orapoUnsavedGuard) return;
  window.orapoUnsavedGuard = true;
  const words = (text) => (text || "").split(/\\s+/).filter(Boolean).join(" ");
  const field = (id) => document.querySelector(`#${id} textarea, #${id} input`);
  window.orapoUnsaved = () => {
    const report = field("orapo-report"), saved = field("orapo-report-saved");
    return Boolean(report && saved && words(report.value) !== words(saved.value));
  };
  const add = window.addEventListener, remove = window.removeEventListener;
  add.call(window, "beforeunload", (event) => {  // added before any other script's: runs first
    if (!window.orapoUnsaved()) return;
    event.preventDefault();
    event.returnValue = "";  // older browsers show their prompt only when this is set
  });
  // Every later beforeunload listener (Gradio's closes the page's connection) waits while the prompt is asked
  // for: the reader may stay. Held ones run on pagehide, which fires only when the page does go.
  const held = new Set(), wrappers = new WeakMap();
  const wrapperOf = (listener) => {
    let wrapper = wrappers.get(listener);
    if (!wrapper) {
      const run = (event) => typeof listener === "function" ? listener.call(window, event)
        : listener.handleEvent(event);
      wrapper = (event) => {
        if (event.type === "beforeunload" && window.orapoUnsaved()) { held.add(run); return; }
        held.delete(run);
        return run(event);
      };
      wrappers.set(listener, wrapper);
    }
    return wrapper;
  };
  const own = (type, listener) => type === "beforeunload" && listener
    && (typeof listener === "function" || typeof listener.handleEvent === "function");
  window.addEventListener = function (type, listener, options) {
    return add.call(this, type, this === window && own(type, listener) ? wrapperOf(listener) : listener, options);
  };
  window.removeEventListener = function (type, listener, options) {
    const wrapper = this === window && own(type, listener) ? wrappers.get(listener) : undefined;
    return remove.call(this, type, wrapper || listener, options);
  };
  add.call(window, "pagehide", (event) => {
    const due = [...held];
    held.clear();
    for (const run of due) {
      try { run(event); } catch (error) { console.error(error); }
    }
  });
})();
"""

#: The script tag the session middleware puts first in the page's `<head>` (see above).
EARLY_HEAD = f"<script>{UNSAVED_GUARD.strip()}</script>"


UPLOAD_FILTER = """
<script>
(() => {
  if (window.orapoUploadFilter) return;
  window.orapoUploadFilter = true;
  const TYPES = __TYPES__, MAX_BYTES = __MAX_BYTES__;
  const reason = (file) => !TYPES.some((t) => file.name.toLowerCase().endsWith(t)) ? "type"
    : file.size > MAX_BYTES ? "size" : null;
  const sort = (files) => {
    const kept = [], dropped = [];
    for (const file of files) {
      const why = reason(file);
      if (why) dropped.push({name: file.name, reason: why}); else kept.push(file);
    }
    return {kept, dropped};
  };
  const report = (kept, dropped) => {  // always: a batch with nothing dropped clears the last batch's list
    const box = document.querySelector("#orapo-dropped textarea, #orapo-dropped input");
    if (!box) return;
    box.value = JSON.stringify({kept: kept.length, dropped});
    box.dispatchEvent(new Event("input", {bubbles: true}));
  };
  const listOf = (files) => { const list = new DataTransfer(); files.forEach((f) => list.items.add(f)); return list.files; };
  document.addEventListener("change", (event) => {  // the file picker (capture: before Gradio reads the files)
    const input = event.target;
    if (!(input instanceof HTMLInputElement) || input.type !== "file" || !input.closest("#orapo-files")) return;
    if (input.dataset.orapoSorted) { delete input.dataset.orapoSorted; return; }
    const {kept, dropped} = sort([...(input.files || [])]);
    report(kept, dropped);
    if (!dropped.length) return;
    if (!kept.length) { event.stopImmediatePropagation(); input.value = ""; return; }
    input.files = listOf(kept);
  }, true);
  document.addEventListener("drop", (event) => {  // drag and drop: the kept files go through the picker's path
    const zone = event.target instanceof Element && event.target.closest("#orapo-files");
    if (!zone || !event.dataTransfer || !event.dataTransfer.files.length) return;
    const {kept, dropped} = sort([...event.dataTransfer.files]);
    report(kept, dropped);
    if (!dropped.length) return;
    event.preventDefault();
    event.stopImmediatePropagation();
    const input = zone.querySelector("input[type=file]");
    if (!kept.length || !input) return;
    input.files = listOf(kept);
    input.dataset.orapoSorted = "1";
    input.dispatchEvent(new Event("change", {bubbles: true}));
  }, true);
})();
</script>
"""


def head(*, max_upload_mb: int, file_types: tuple[str, ...]) -> str:
    """What `gr.Blocks(head=...)` gets (the unsaved-changes guard is `EARLY_HEAD`, put in by the middleware); the
    drop zone's filter knows the upload limit and the accepted types."""
    upload = UPLOAD_FILTER.replace("__TYPES__", json.dumps([t.lower() for t in file_types])).replace(
        "__MAX_BYTES__", str(int(max_upload_mb) * 1024 * 1024)
    )
    return upload
