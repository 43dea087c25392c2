"""A reader's unsaved report text, kept on the server so that no switch of study loses it.

Reporting systems autosave: the Read tab keeps the report box's text here
whenever it holds an edit that was never stored (as the reader types, and
before the page opens another study: an upload, a worklist study, "Continue
where you left off"), for that reader and that study, and offers it back when
the reader opens the study again. Storing a report, or replacing the edit with
a new draft, deletes it. Each reader sees only their own unsaved text.
"""

from __future__ import annotations

from db import AutosaveRepository
from db.database import Database
from db.records import AutosaveRecord, UserRecord
from orapo_core.report_layout import same_text


def keep(db: Database, user: UserRecord, study_id: int, text: str, *, base_version: int) -> AutosaveRecord | None:
    """Keep `text` as `user`'s unsaved report of the study (None, nothing kept, when it is empty)."""
    if not (text or "").strip():
        return None
    return AutosaveRepository(db).put(user.id, int(study_id), text, base_version=int(base_version or 0))


def unsaved(db: Database, user: UserRecord, study_id: int, *, stored: str | None) -> AutosaveRecord | None:
    """`user`'s unsaved text of the study, unless it is the stored report itself (then it is deleted)."""
    repository = AutosaveRepository(db)
    record = repository.get(user.id, int(study_id))
    if record is not None and stored and same_text(record.text, stored):
        repository.discard(user.id, int(study_id))
        return None
    return record


def discard(db: Database, user: UserRecord, study_id: int, *, base_version: int | None = None) -> bool:
    """The reader stored the report or replaced the edit: their unsaved text of the study is gone. With
    `base_version`, only text edited from that version goes: one made before a newer version was stored, and quoted
    to the reader to copy from, stays until the reader stores the report."""
    return AutosaveRepository(db).discard(user.id, int(study_id), base_version=base_version)
