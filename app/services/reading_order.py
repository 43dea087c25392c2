"""The order a reader takes unread studies in: oldest first, or most useful to the model first (active learning).

OraPO learns most where every sampled draft fails: there a clinician's
correction becomes an oracle pair the model could not have found alone. The
drafting step already stores what says where that is likely, so the
useful-first score only reads it (no model runs here):

    usefulness = 0.4 * (1 - mean sentence confidence)         # self-consistency of the K samples
               + 0.3 * (facts the samples disagree on / facts) # sample disagreement on findings
               + 0.3 * max miss rate of a finding the draft does not state

The first two are the draft's own `sentence_scores` (each sentence's share of
samples agreeing with all its facts, and each fact's agreement). The third is
what the served model has been missing most: of the signed reports made from
its drafts that state a finding, the share whose draft did not
(`app.services.dashboard`'s miss, smoothed as misses / (reports + 2) so one
report is not a 100% rate); a draft silent on an often-missed finding is where
a correction most likely adds it. A study without a draft scores 0 and ties
keep the oldest first. Which ordering a study was opened from is recorded (an
audit entry on opening, then `corrections.reading_order`), so a round can say
how many of its pairs each ordering brought.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from db.records import READING_ORDERS, StudyOverview, UserRecord
from orapo_core.errors import OrapoError

#: The reader's words for each ordering (the Worklist's choices).
ORDER_LABELS = {"oldest": "oldest first", "useful": "most useful to the model first"}
UNREAD = ("new", "drafted")
WEIGHTS = (0.4, 0.3, 0.3)  # self-consistency, disagreement, missed findings
OPENED = "worklist.open"


@dataclass(frozen=True)
class Usefulness:
    """A study's expected learning value and its three parts, each in [0, 1]."""

    study_id: int
    inconsistency: float = 0.0
    disagreement: float = 0.0
    missed: float = 0.0

    @property
    def score(self) -> float:
        a, b, c = WEIGHTS
        return a * self.inconsistency + b * self.disagreement + c * self.missed


def order_key(label_or_key: str | None) -> str:
    """'oldest' or 'useful' from either the key or the reader's words (refused otherwise)."""
    value = (label_or_key or "oldest").strip()
    value = {label: key for key, label in ORDER_LABELS.items()}.get(value, value)
    if value not in READING_ORDERS:
        raise OrapoError("invalid_reading_order", f"Order unread studies {' or '.join(ORDER_LABELS.values())}, "
                                                  f"not {label_or_key!r}.")
    return value


def served_miss_rates(db) -> dict[str, float]:
    """Per finding, how often the served model's drafts missed it in the signed reports made from them (smoothed);
    the drafts of every model while no version is served or the served one has no signed report yet."""
    from app.services.dashboard import stated_findings
    from db import DraftRepository, ModelVersionRepository, StudyRepository

    served = ModelVersionRepository(db).promoted()
    drafts = DraftRepository(db)
    signed = []
    for o in StudyRepository(db).list(status=["signed", "trained"], limit=100_000):
        c = o.latest_correction
        if c is None or c.signed_at is None or c.draft_id is None:
            continue
        draft = o.latest_draft if o.latest_draft and o.latest_draft.id == c.draft_id else drafts.get(c.draft_id)
        signed.append((draft, c.text))
    mine = [(d, t) for d, t in signed if served is not None and d.model_version_id == served.id]
    stated: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    for draft, text in mine or signed:
        truth = stated_findings(text)
        stated.update(truth)
        missed.update(truth - stated_findings(draft.text))
    return {finding: missed[finding] / (stated[finding] + 2) for finding in stated}


def usefulness(overview: StudyOverview, miss_rates: dict[str, float]) -> Usefulness:
    """The study's score from its latest draft (0 without one)."""
    from app.services.dashboard import stated_findings

    draft = overview.latest_draft
    if draft is None:
        return Usefulness(overview.study.id)
    sentences = [s for s in (draft.sentence_scores or []) if isinstance(s, dict)]
    with_facts = [s for s in sentences if s.get("agreements")] or sentences
    inconsistency = 1.0 - sum(float(s.get("confidence", 1.0)) for s in with_facts) / len(with_facts) if with_facts else 0.0
    facts = [a for s in sentences for a in (s.get("agreements") or []) if isinstance(a, dict)]
    disagreement = sum(1 for a in facts if float(a.get("agreement", 1.0)) < 1.0) / len(facts) if facts else 0.0
    unstated = set(miss_rates) - stated_findings(draft.text)
    missed = max((miss_rates[f] for f in unstated), default=0.0)
    return Usefulness(overview.study.id, max(0.0, inconsistency), disagreement, missed)


def ordered(db, overviews: list[StudyOverview], order: str) -> list[StudyOverview]:
    """Unread studies first, in `order` ('oldest' or 'useful', ties oldest first), then the others as given."""
    order = order_key(order)
    unread = sorted((o for o in overviews if o.study.status in UNREAD), key=lambda o: (o.study.created_at, o.study.id))
    rest = [o for o in overviews if o.study.status not in UNREAD]
    if order == "useful" and unread:
        rates = served_miss_rates(db)
        scores = {o.study.id: usefulness(o, rates).score for o in unread}
        unread.sort(key=lambda o: -scores[o.study.id])  # stable: ties stay oldest first
    return unread + rest


def note_opened(db, user: UserRecord, study_id: int, order: str | None) -> bool:
    """The reader opened an unread `study_id` from the worklist in `order`: what the correction they save will
    record. A study already reported (opened to amend it) was not read in any ordering: nothing is noted."""
    from db import AuditRepository, StudyRepository

    order = order_key(order)
    if StudyRepository(db).overview(study_id).study.status not in UNREAD:
        return False
    AuditRepository(db).append(OPENED, actor=user, object_type="study", object_id=study_id,
                               details={"reading_order": order})
    return True


def opened_from(db, user: UserRecord, study_id: int) -> str | None:
    """The ordering this reader last opened the study from in the worklist (None: not opened from it)."""
    from db import AuditRepository

    entries = AuditRepository(db).query(action=OPENED, actor_name=user.username, object_type="study",
                                        object_id=study_id, limit=1)
    order = entries[0].details.get("reading_order") if entries else None
    return order if order in READING_ORDERS else None


def pairs_by_order(studies) -> dict[str, int]:
    """How many clinician pairs of a round's new studies came from each ordering ('unordered': none)."""
    counts = Counter(getattr(s, "reading_order", None) or "unordered" for s in studies if s.draft_text)
    return dict(sorted(counts.items()))
