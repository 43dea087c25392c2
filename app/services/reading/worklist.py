"""The reader's lists: the worklist of studies, and one study's history of drafts and report versions."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.services.accounts.auth import require_role
from db import CorrectionRepository, Database, DraftRepository, StudyRepository, UserRepository
from db.records import CorrectionRecord, DraftRecord, StudyOverview, UserRecord
from orapo_core.errors import OrapoError

# What a study's split means, in a reader's words (the worklist's column, the Read tab's header).
STUDY_USE_SHORT = {"train": "may train the model", "holdout": "kept aside to check the model"}
HELD_OUT = "kept aside to check the model; not used to train it"


def worklist(
    db: Database, user: UserRecord, *, status: str | None = None, everyone: bool = False, limit: int = 200
) -> list[StudyOverview]:
    """The user's own studies; everyone's for an administrator who asks."""
    if everyone:
        require_role(user, "admin")
    statuses = None if status in (None, "", "all") else status
    return StudyRepository(db).list(uploaded_by=None if everyone else user.id, status=statuses, limit=limit)


def owners(db: Database, user: UserRecord, overviews: list[StudyOverview]) -> dict[int, str]:
    """Study id -> the username of whoever uploaded it, for an administrator's "everyone" view ("" where nobody
    is recorded, or the account is gone)."""
    require_role(user, "admin")
    names = {u.id: u.username for u in UserRepository(db).list()}
    return {o.study.id: names.get(o.study.uploaded_by, "") if o.study.uploaded_by else "" for o in overviews}


@dataclass(frozen=True)
class StudyHistory:
    overview: StudyOverview
    drafts: list[DraftRecord]
    corrections: list[CorrectionRecord]
    authors: dict[int, str] = field(default_factory=dict)  # user id -> username, for every id in `corrections`

    def author(self, correction: CorrectionRecord) -> str:
        return self.authors.get(correction.author_id, "a deleted user")


def history(db: Database, user: UserRecord, study_id: int) -> StudyHistory:
    from app.services.reading.drafting import open_study  # noqa: PLC0415 -- loads numpy

    overview = open_study(db, user, study_id)
    corrections = CorrectionRepository(db).history(overview.study.id)
    users = UserRepository(db)
    authors = {}
    for author_id in {c.author_id for c in corrections}:
        try:
            authors[author_id] = users.get(author_id).username
        except OrapoError:
            pass
    return StudyHistory(overview, DraftRepository(db).for_study(overview.study.id), corrections, authors)
