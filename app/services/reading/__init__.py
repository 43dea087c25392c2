"""Reading: what a radiologist does with a study, from the upload to the signed report.

The upload's ingest (one file in, a de-identified study out; the archive and
`orapo ingest` go through it too), the one access rule (`studies`), drafting
with the served model (`served`, `drafting`, and `draft_batcher`, which decodes
readers' drafts together), the viewer's pixels, the report's highlights
(`highlights`), saving, signing and amending (`reports`), the worklist and a
study's history (`worklist`), whether a draft may be signed as it is
(`draft_review`: the draft checks, re-exported here for the Read tab), the
server-side autosave of an unsaved edit, and the order the worklist offers
unread studies in (`reading_order`).
"""

from app.services.reading.draft_review import (
    DraftProblem,
    can_accept_unchanged,
    draft_problems,
    refuse_unsignable_draft,
)

__all__ = ["DraftProblem", "can_accept_unchanged", "draft_problems", "refuse_unsignable_draft"]
