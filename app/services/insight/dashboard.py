"""The dashboard's numbers: studies, reports, pairs, acceptance over time, and what the drafts get wrong.

Everything is computed from the same per-study rows, for one scope: an
administrator's "everyone", or a radiologist's own studies (those they
uploaded). The scope is checked here, not in the tab, so a radiologist calling
the endpoint by name gets their own numbers or a refusal, never someone else's.

Misses and over-calls compare each signed report with the draft it was made
from, finding by finding, with the same FactS labeller on both texts (the
labels stored with a correction may come from an older labeller). A finding is
*stated* when it is labelled positive or uncertain: "possible consolidation"
is something a reader wants flagged. A miss is a finding the signed report
states and its draft does not; an over-call, one the draft states and the
signed report does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePath
from typing import TYPE_CHECKING

from app.services.accounts.auth import require_role
from app.services.reading.served import drafted_by
from db import DraftRepository, ModelVersionRepository, PairRepository, StudyRepository
from db.records import (
    PAIR_SOURCES,
    STUDY_STATUSES,
    CorrectionRecord,
    DraftRecord,
    ModelVersionRecord,
    StudyOverview,
    UserRecord,
)
from orapo_core.errors import OrapoError
from orapo_core.facts import label_report

if TYPE_CHECKING:
    from db.database import Database

SCOPES = ("everyone", "mine")
BUCKETS = ("auto", "day", "week")
#: Past this many days of reports, "auto" buckets acceptance by ISO week instead of by day.
DAILY_SPAN_DAYS = 45
NOT_A_FINDING = frozenset({"No Finding"})
STATED = (1, -1)  # positive or uncertain


@dataclass(frozen=True)
class FindingRate:
    """How often one finding is got wrong: `errors` of the `out_of` reports that should have it right."""

    finding: str
    errors: int
    out_of: int

    @property
    def rate(self) -> float:
        return self.errors / self.out_of if self.out_of else 0.0


@dataclass(frozen=True)
class AcceptancePoint:
    """One day or ISO week: reports written in it, and how many took the draft unchanged."""

    period: str  # "2026-11-30", or "2026-W48"
    reports: int
    accepted_unchanged: int

    @property
    def rate(self) -> float:
        return self.accepted_unchanged / self.reports if self.reports else 0.0


@dataclass(frozen=True)
class DashboardData:
    scope: str  # "everyone" or "mine"
    studies: int
    studies_by_status: dict[str, int]
    holdout_studies: int
    drafts: int
    drafts_by_model: dict[str, int]
    corrections: int  # every saved version, amendments included
    reports: int  # studies with a report (their latest version counts)
    signed: int
    accepted_unchanged: int
    acceptance_rate: float | None  # accepted_unchanged / reports; None before the first report
    pairs: int
    pairs_by_source: dict[str, int]
    bucket: str  # "day" or "week"
    acceptance_over_time: list[AcceptancePoint] = field(default_factory=list)
    compared_reports: int = 0  # signed reports with a draft to compare against
    misses: list[FindingRate] = field(default_factory=list)  # most missed first; misses are out of reports stating it
    overcalls: list[FindingRate] = field(default_factory=list)  # most over-called first; out of drafts stating it


def resolve_scope(user: UserRecord, scope: str | None) -> str:
    """An administrator sees everyone by default; anyone may ask for their own; only an administrator for everyone."""
    if scope in (None, "", "default"):
        return "everyone" if user.is_admin else "mine"
    if scope not in SCOPES:
        raise OrapoError("invalid_scope", f"The dashboard shows {' or '.join(SCOPES)}, not {scope!r}.")
    if scope == "everyone":
        require_role(user, "admin")
    return scope


def dashboard_data(
    db: Database, user: UserRecord, *, scope: str | None = None, bucket: str = "auto", top: int | None = None
) -> DashboardData:
    """The dashboard for `user`: everyone's numbers for an administrator, a radiologist's own otherwise."""
    scope = resolve_scope(user, scope)
    if bucket not in BUCKETS:
        raise OrapoError("invalid_bucket", f"Acceptance is grouped by {', '.join(BUCKETS)}, not {bucket!r}.")
    overviews = StudyRepository(db).list(uploaded_by=None if scope == "everyone" else user.id, limit=2**31 - 1)
    study_ids = {o.study.id for o in overviews}
    drafts_repo = DraftRepository(db)
    model_of = model_names(ModelVersionRepository(db).list())

    by_status = dict.fromkeys(STUDY_STATUSES, 0)
    drafts_by_model: Counter[str] = Counter()
    corrections = 0
    latest: list[StudyOverview] = []  # the studies with a report; their latest version is the one counted
    for o in overviews:
        by_status[o.study.status] = by_status.get(o.study.status, 0) + 1
        for d in drafts_repo.for_study(o.study.id) if o.latest_draft else []:
            drafts_by_model[model_of(d)] += 1
        if o.latest_correction is not None:
            corrections += o.latest_correction.version  # versions are 1..n with no gaps
            latest.append(o)
    reports = [o.latest_correction for o in latest if o.latest_correction is not None]  # (each of them)

    accepted = sum(1 for c in reports if c.accepted_unchanged)
    pairs_by_source = dict.fromkeys(PAIR_SOURCES, 0)
    for p in PairRepository(db).list():
        if p.study_id in study_ids:
            pairs_by_source[p.source] = pairs_by_source.get(p.source, 0) + 1

    bucket = _bucket_for([c.created_at for c in reports], bucket)
    compared, misses, overcalls = _finding_errors(latest, drafts_repo)
    if top is not None:
        misses, overcalls = misses[:top], overcalls[:top]
    return DashboardData(
        scope=scope,
        studies=len(overviews),
        studies_by_status=by_status,
        holdout_studies=sum(1 for o in overviews if o.study.split == "holdout"),
        drafts=sum(drafts_by_model.values()),
        drafts_by_model=dict(drafts_by_model.most_common()),
        corrections=corrections,
        reports=len(latest),
        signed=sum(1 for c in reports if c.signed_at is not None),
        accepted_unchanged=accepted,
        acceptance_rate=accepted / len(latest) if latest else None,
        pairs=sum(pairs_by_source.values()),
        pairs_by_source=pairs_by_source,
        bucket=bucket,
        acceptance_over_time=_acceptance_series(reports, bucket),
        compared_reports=compared,
        misses=misses,
        overcalls=overcalls,
    )


def model_names(versions: list[ModelVersionRecord]) -> Callable[[DraftRecord], str]:
    """One name per model for the drafts-per-model chart and the count of models that drafted.

    A version's drafts go under its name in the versions table, "round-1 (version 3)", whatever name each draft
    stored (drafts from before the drafter stored the version's name carry the base folder's, "starter"). The
    folder that drafted before any round (the starter) is the same model as the version a round's first run
    recorded it as (`base-starter`, no adapter): its earlier drafts go under that version, not under a second
    name beside it.
    """
    named = {v.id: f"{v.name} (version {v.id})" for v in versions}
    recorded = {
        PurePath(v.base_model_path).name: named[v.id]
        for v in sorted(versions, key=lambda v: v.id, reverse=True)  # the oldest wins a folder recorded twice
        if v.adapter_path is None and (v.config or {}).get("registered_by_round") is not None
    }

    def name(draft: DraftRecord) -> str:
        if draft.model_version_id is not None and draft.model_version_id in named:
            return named[draft.model_version_id]
        label = drafted_by(draft)
        return label if draft.model_version_id is not None else recorded.get(label, label)

    return name


def _bucket_for(times: list[datetime], bucket: str) -> str:
    if bucket != "auto":
        return bucket
    if not times:
        return "day"
    return "day" if (max(times) - min(times)).days <= DAILY_SPAN_DAYS else "week"


def _period(when: datetime, bucket: str) -> str:
    if bucket == "day":
        return when.date().isoformat()
    year, week, _ = when.isocalendar()
    return f"{year}-W{week:02d}"


def _acceptance_series(corrections: Iterable[CorrectionRecord], bucket: str) -> list[AcceptancePoint]:
    reports: Counter[str] = Counter()
    accepted: Counter[str] = Counter()
    for c in corrections:
        period = _period(c.created_at, bucket)
        reports[period] += 1
        accepted[period] += int(c.accepted_unchanged)
    return [AcceptancePoint(p, reports[p], accepted[p]) for p in sorted(reports)]


def stated_findings(text: str) -> set[str]:
    """The findings a report states as present or possible, by FactS's CheXpert labels."""
    return {k for k, v in label_report(text or "").items() if v in STATED and k not in NOT_A_FINDING}


def _finding_errors(
    latest: list[StudyOverview], drafts_repo: DraftRepository
) -> tuple[int, list[FindingRate], list[FindingRate]]:
    in_report: Counter[str] = Counter()
    in_draft: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    overcalled: Counter[str] = Counter()
    compared = 0
    for o in latest:
        c = o.latest_correction
        if c is None or c.signed_at is None or c.draft_id is None:
            continue
        draft = o.latest_draft if o.latest_draft and o.latest_draft.id == c.draft_id else drafts_repo.get(c.draft_id)
        truth, claimed = stated_findings(c.text), stated_findings(draft.text)
        compared += 1
        in_report.update(truth)
        in_draft.update(claimed)
        missed.update(truth - claimed)
        overcalled.update(claimed - truth)

    def ranked(errors: Counter[str], totals: Counter[str]) -> list[FindingRate]:
        rates = [FindingRate(f, errors[f], totals[f]) for f in totals if errors[f]]
        return sorted(rates, key=lambda r: (-r.errors, -r.rate, r.finding))

    return compared, ranked(missed, in_report), ranked(overcalled, in_draft)
