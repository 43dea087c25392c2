"""Reading: what a radiologist does with a study, from the upload to the signed report.

The upload's ingest (one file in, a de-identified study out; the archive and
`orapo ingest` go through it too), the one access rule (`studies`), drafting
with the served model (`served`, `drafting`, and `draft_batcher`, which decodes
readers' drafts together), the viewer's pixels, the report's highlights, saving,
signing and amending (`reports`), the server-side autosave of an unsaved edit,
and the order the worklist offers unread studies in (`reading_order`).
"""
