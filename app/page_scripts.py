"""Scripts the page runs itself, installed once in its head (`gr.Blocks(head=...)`).

- The unsaved-changes prompt: leaving or reloading the page while the report box
  differs (whitespace aside) from the last text stored for the study, which the
  Read tab keeps in the hidden `#orapo-report-saved`, makes the browser ask first.
  Gradio closes its connection to the server on every `beforeunload`, even one
  the reader then cancels, which would leave a page whose buttons no longer
  answer; so when the prompt is asked for, Gradio's listener is not run (ours
  is a capture listener, which runs first on the window). A page that does
  unload closes its connection anyway.
- The drop zone's filter (`app.tabs.read_upload`): before Gradio's own checks see
  a batch (chosen or dropped), the files of a wrong type or over the upload limit
  are taken out of it and named, with their reason, in the hidden
  `#orapo-dropped`; the rest goes up as one batch. Gradio would drop the first
  kind with a fading toast and refuse the whole batch for the second.
"""

from __future__ import annotations

import json

UNSAVED_GUARD = """
<script>
(() => {
  if (window.orapoUnsavedGuard) return;
  window.orapoUnsavedGuard = true;
  const words = (text) => (text || "").split(/\\s+/).filter(Boolean).join(" ");
  const field = (id) => document.querySelector(`#${id} textarea, #${id} input`);
  window.orapoUnsaved = () => {
    const report = field("orapo-report"), saved = field("orapo-report-saved");
    return Boolean(report && saved && words(report.value) !== words(saved.value));
  };
  window.addEventListener("beforeunload", (event) => {
    if (!window.orapoUnsaved()) return;
    event.preventDefault();
    event.returnValue = "";  // older browsers show their prompt only when this is set
    event.stopImmediatePropagation();  // Gradio's own listener would close the page's connection (see above)
  }, {capture: true});
})();
</script>
"""


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
    """Everything the page's head gets; the drop zone's filter knows the upload limit and the accepted types."""
    upload = (UPLOAD_FILTER.replace("__TYPES__", json.dumps([t.lower() for t in file_types]))
              .replace("__MAX_BYTES__", str(int(max_upload_mb) * 1024 * 1024)))
    return UNSAVED_GUARD + upload
