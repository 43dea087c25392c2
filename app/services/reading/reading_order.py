"""The order a reader takes unread studies in: oldest first, or most useful to the model first (active learning).

OraPO learns most where every sampled draft fails: there a clinician's
correction becomes an oracle pair the model could not have found alone. The
drafting step already stores what says where that is likely, so the
useful-first score only reads it (no model runs here):

    usefulness = 0.4 * (1 - mean sentence confidence)         # self-consistency of the K samples
               + 0.3 * (facts the samples disagree on / facts) # sample disagreement on findings
               + 0.3 * max miss rate of a finding the draft does not state
               + 0.6 * atypicality of the image for what the draft states

The first two are the draft's own `sentence_scores` (each sentence's share of
samples agreeing with all its facts, and each fact's agreement). The third is
what the served model has been missing most: of the signed reports made from
its drafts that state a finding, the share whose draft did not
(`app.services.insight.dashboard`'s miss, smoothed as misses / (reports + 2) so one
report is not a 100% rate); a draft silent on an often-missed finding is where
a correction most likely adds it. A study without a draft scores 0 and ties
keep the oldest first.

The words a model would write barely tell which silent drafts carry the
finding (`benchmarks/bench_finding_evidence.py`: AUC 0.53-0.57), but what it
was shown of the image does (AUC 0.79 with 5 films, 0.85 with 20). So once
readers have signed `MIN_EXEMPLARS` reports that added a finding to drafts of
one model, that model's unread drafts get, for that finding, a probability
that the film holds it (`FindingOdds`: the draft's stored image features,
`drafts.image_features`, projected on the direction from the mean of the
model's signed films without the finding to the mean of those it was added
to, and calibrated by a logistic fit on all its signed films; other findings
get their share of the signed reports), and the missed term becomes the
chance that a correction adds a finding the model misses:

    missed = 1 - prod over findings the draft is silent on of (1 - miss rate x P(finding | image))

A draft without features, or of a model without such films yet, keeps the
largest miss rate, as before.

The fourth term needs no correction at all, so it orders the reading from the
first study on: among one model's drafts (unread and signed, at least
`MIN_ATYPICAL`), the image features are regressed on the findings each draft
states, and the rest, the part of the image the draft's words do not account
for, is scored by its Mahalanobis distance under a shrunk covariance
(`image_atypicality`). An unread draft's term is the percentile of that distance
among its model's unread drafts: a film that looks unlike films described the
same way likely holds something the draft is silent on (AUC 0.765 for the
four rare findings together on 1,000 films; docs/pages/research/reading-order.md has the measurements).

A study stored but never drafted (not a chest radiograph: `studies.not_drafted`,
`app.services.reading.scope`) is not ranked: "most useful first" lists it after
the ranked unread studies, oldest first, since nothing the model learns comes
from it.

Which ordering a study was opened from is recorded (an audit entry on opening,
then `corrections.reading_order`), so a round can say how many of its pairs
each ordering brought.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

from app.services.insight.dashboard import stated_findings
from db import AuditRepository, DraftRepository, ModelVersionRepository, StudyRepository
from db.records import READING_ORDERS, DraftRecord, StudyOverview, UserRecord
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    from db.database import Database

#: A signed study made from a draft: (draft, signed report text, findings the report states, findings the draft states).
SignedDraft = tuple[DraftRecord, str, set[str], set[str]]
#: Drafts whose image features compare: (model version id, model name when unversioned).
FeatureSpace = tuple[int | None, str | None]

#: The reader's words for each ordering (the Worklist's choices).
ORDER_LABELS = {"oldest": "oldest first", "useful": "most useful to the model first"}
UNREAD = ("new", "drafted")
WEIGHTS = (
    0.4,
    0.3,
    0.3,
    0.6,
)  # self-consistency, disagreement, missed findings, atypical image (a sum: only its order matters)
OPENED = "worklist.open"
#: Signed studies a correction added a finding to, of one model's drafts, before the image is compared with them.
MIN_EXEMPLARS = 2
#: Drafts of one model with image features (signed and unread) before its images' atypicality is scored.
MIN_ATYPICAL = 20
#: How far the residuals' covariance is shrunk towards its mean variance (Ledoit-Wolf-style, fixed).
SHRINKAGE = 0.5


@dataclass(frozen=True)
class Usefulness:
    """A study's expected learning value and its four parts, each in [0, 1]."""

    study_id: int
    inconsistency: float = 0.0
    disagreement: float = 0.0
    missed: float = 0.0
    atypical: float = 0.0

    @property
    def score(self) -> float:
        a, b, c, d = WEIGHTS
        return a * self.inconsistency + b * self.disagreement + c * self.missed + d * self.atypical


def order_key(label_or_key: str | None) -> str:
    """'oldest' or 'useful' from either the key or the reader's words (refused otherwise)."""
    value = (label_or_key or "oldest").strip()
    value = {label: key for key, label in ORDER_LABELS.items()}.get(value, value)
    if value not in READING_ORDERS:
        raise OrapoError(
            "invalid_reading_order", f"Order unread studies {' or '.join(ORDER_LABELS.values())}, not {label_or_key!r}."
        )
    return value


def signed_drafts(db: Database) -> list[SignedDraft]:
    """(draft, signed report text, findings the report states, findings the draft states) of every signed study
    whose report was made from a draft."""
    drafts = DraftRepository(db)
    signed: list[SignedDraft] = []
    for o in StudyRepository(db).list(status=["signed", "trained"], limit=100_000):
        c = o.latest_correction
        if c is None or c.signed_at is None or c.draft_id is None:
            continue
        draft = o.latest_draft if o.latest_draft and o.latest_draft.id == c.draft_id else drafts.get(c.draft_id)
        signed.append((draft, c.text, stated_findings(c.text), stated_findings(draft.text)))
    return signed


def served_miss_rates(db: Database, signed: list[SignedDraft] | None = None) -> dict[str, float]:
    """Per finding, how often the served model's drafts missed it in the signed reports made from them (smoothed);
    the drafts of every model while no version is served or the served one has no signed report yet."""
    served = ModelVersionRepository(db).promoted()
    signed = signed_drafts(db) if signed is None else signed
    mine = [row for row in signed if served is not None and row[0].model_version_id == served.id]
    stated: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    for _draft, _text, truth, drafted in mine or signed:
        stated.update(truth)
        missed.update(truth - drafted)
    return {finding: missed[finding] / (stated[finding] + 2) for finding in stated}


def feature_space(draft: DraftRecord) -> FeatureSpace:
    """Drafts whose image features can be compared: made by the same model version (or model, unversioned)."""
    return (draft.model_version_id, draft.model_name if draft.model_version_id is None else None)


def _sigmoid(z: Any) -> Any:  # a float or an array, as given
    return 1 / (1 + np.exp(-np.clip(z, -50.0, 50.0)))  # clipped: a separable fit gives a steep slope


def _logistic(t: np.ndarray, y: np.ndarray, ridge: float = 1e-2, steps: int = 25) -> tuple[float, float]:
    """(a, b) of P(y | t) = sigmoid(a t + b), fitted by Newton's method with a small ridge on a (Platt scaling)."""
    a, b = 0.0, float(np.log((y.mean() + 1e-3) / (1 - y.mean() + 1e-3)))
    for _ in range(steps):
        p = _sigmoid(a * t + b)
        w = p * (1 - p)
        grad = np.array([((p - y) * t).sum() + ridge * a, (p - y).sum()])
        hess = np.array([[(w * t * t).sum() + ridge, (w * t).sum()], [(w * t).sum(), w.sum() + 1e-9]])
        try:
            da, db = np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            break
        a, b = a - da, b - db
        if abs(da) + abs(db) < 1e-8:
            break
    return float(a), float(b)


@dataclass(frozen=True)
class FindingOdds:
    """P(a finding is on the film | the image), from one model's signed studies: the image's features projected on
    the direction from the mean of the films without the finding to the mean of those a correction added it to
    (0 at the first, 1 at the second), turned into a probability by a logistic fit on every signed film."""

    centre: np.ndarray
    direction: np.ndarray
    a: float
    b: float
    added: int  # how many films the finding was added to

    def projection(self, features: Sequence[float]) -> float | None:
        x = np.asarray(features, dtype=np.float64)
        norm = float(self.direction @ self.direction)
        if x.shape != self.centre.shape or norm <= 0:
            return None
        return float((x - self.centre) @ self.direction / norm)

    def __call__(self, features: Sequence[float]) -> float | None:
        t = self.projection(features)
        return None if t is None else float(_sigmoid(self.a * t + self.b))


@dataclass(frozen=True)
class ImageOdds:
    """One model's `FindingOdds` per finding, and every finding's share of its signed reports (for the rest)."""

    findings: dict[str, FindingOdds]
    base: dict[str, float]

    def probability(self, finding: str, features: Sequence[float]) -> float:
        odds = self.findings.get(finding)
        p = odds(features) if odds is not None else None
        return self.base.get(finding, 0.0) if p is None else p


def finding_resemblance(signed: list[SignedDraft]) -> dict[FeatureSpace, ImageOdds]:
    """Per feature space with a finding a correction added at least `MIN_EXEMPLARS` times: its `ImageOdds`."""
    by_space: dict[FeatureSpace, list[tuple[np.ndarray, set[str], set[str]]]] = defaultdict(list)
    for draft, _text, truth, drafted in signed:
        if getattr(draft, "image_features", None):
            by_space[feature_space(draft)].append((np.asarray(draft.image_features, dtype=np.float64), truth, drafted))
    out: dict[FeatureSpace, ImageOdds] = {}
    for space, rows in by_space.items():
        shape = Counter(x.shape for x, _, _ in rows).most_common(1)[0][0]
        rows = [r for r in rows if r[0].shape == shape]
        everything = np.stack([x for x, _, _ in rows])
        stated: Counter[str] = Counter(f for _, truth, _ in rows for f in truth)
        base = {f: (n + 1) / (len(rows) + 2) for f, n in stated.items()}
        models = {}
        for finding in set().union(*(truth - drafted for _, truth, drafted in rows)):
            added = [x for x, truth, drafted in rows if finding in truth and finding not in drafted]
            without = [x for x, truth, _ in rows if finding not in truth]
            if len(added) < MIN_EXEMPLARS or len(without) < MIN_EXEMPLARS:
                continue
            centre = np.mean(without, axis=0)
            direction = np.mean(added, axis=0) - centre
            norm = float(direction @ direction)
            if norm <= 0:
                continue
            t = (everything - centre) @ direction / norm
            y = np.array([finding in truth for _, truth, _ in rows], dtype=np.float64)
            a, b = _logistic(t, y)
            models[finding] = FindingOdds(centre, direction, a, b, len(added))
        if models:
            out[space] = ImageOdds(models, base)
    return out


def image_atypicality(
    unread: list[StudyOverview], signed: list[SignedDraft], stated: dict[int, set[str]] | None = None
) -> dict[int, float]:
    """Per unread study whose draft has image features: how unusual its image is for the findings its draft
    states, as its percentile (0 to 1) among the unread drafts of the same model.

    Per feature space with at least `MIN_ATYPICAL` drafts (the unread ones and `signed`'s, `signed_drafts` rows):
    the features are fitted by least squares on indicators of the findings each draft states; each unread
    draft's residual is scored by its squared Mahalanobis distance under the residuals' covariance shrunk by
    `SHRINKAGE` towards a multiple of the identity (the features outnumber the films of a small clinic). Only
    the drafts are read, never the signed report: an unread study has none. `stated`: the findings each unread
    draft states, by study id, when the caller has them already."""
    stated = stated or {}

    # (features, stated findings, unread study id or None)
    spaces: dict[FeatureSpace, list[tuple[np.ndarray, set[str], int | None]]] = defaultdict(list)
    for o in unread:
        draft = o.latest_draft
        if draft is not None and getattr(draft, "image_features", None):
            says = stated[o.study.id] if o.study.id in stated else stated_findings(draft.text)
            spaces[feature_space(draft)].append((np.asarray(draft.image_features, dtype=np.float64), says, o.study.id))
    for draft, _text, _truth, drafted in signed:
        if getattr(draft, "image_features", None) and feature_space(draft) in spaces:
            spaces[feature_space(draft)].append((np.asarray(draft.image_features, dtype=np.float64), drafted, None))
    out: dict[int, float] = {}
    for rows in spaces.values():
        shape = Counter(x.shape for x, _, sid in rows if sid is not None).most_common(1)[0][0]
        rows = [r for r in rows if r[0].shape == shape]
        scored = [i for i, r in enumerate(rows) if r[2] is not None]
        if len(rows) < MIN_ATYPICAL or len(scored) < 2:
            continue
        x = np.stack([r[0] for r in rows])
        names = sorted(set().union(*(r[1] for r in rows)))
        design = np.array([[name in r[1] for name in names] + [True] for r in rows], dtype=np.float64)
        coefficients, *_ = np.linalg.lstsq(design, x, rcond=None)
        residual = x - design @ coefficients
        covariance = np.atleast_2d(np.cov(residual, rowvar=False))
        scale = float(np.trace(covariance)) / covariance.shape[0]
        if scale <= 0:
            continue
        covariance = (1 - SHRINKAGE) * covariance + SHRINKAGE * scale * np.eye(covariance.shape[0])
        r = residual[scored]
        distance = np.einsum("ij,ij->i", r, np.linalg.solve(covariance, r.T).T)
        ranks = np.argsort(np.argsort(distance, kind="stable"), kind="stable") / (len(scored) - 1)
        out.update({sid: float(rank) for i, rank in zip(scored, ranks) if (sid := rows[i][2]) is not None})
    return out


def usefulness(
    overview: StudyOverview,
    miss_rates: dict[str, float],
    resemblance: dict[FeatureSpace, ImageOdds] | None = None,
    atypical: float = 0.0,
    stated: set[str] | None = None,
) -> Usefulness:
    """The study's score from its latest draft (0 without one). With `resemblance` (`finding_resemblance`) for
    the draft's model, the missed term is the chance that the film holds a finding the draft is silent on and
    the model misses: 1 - prod(1 - miss rate x P(finding | image)); without it, the largest miss rate.
    `atypical` is the study's `image_atypicality`; `stated`, the findings its draft states, if known."""
    draft = overview.latest_draft
    if draft is None:
        return Usefulness(overview.study.id)
    sentences = [s for s in (draft.sentence_scores or []) if isinstance(s, dict)]
    with_facts = [s for s in sentences if s.get("agreements")] or sentences
    inconsistency = (
        1.0 - sum(float(s.get("confidence", 1.0)) for s in with_facts) / len(with_facts) if with_facts else 0.0
    )
    facts = [a for s in sentences for a in (s.get("agreements") or []) if isinstance(a, dict)]
    disagreement = sum(1 for a in facts if float(a.get("agreement", 1.0)) < 1.0) / len(facts) if facts else 0.0
    unstated = set(miss_rates) - (stated_findings(draft.text) if stated is None else stated)
    features = getattr(draft, "image_features", None)
    odds = (resemblance or {}).get(feature_space(draft)) if features else None
    if odds is None or not features:  # (no odds without features)
        missed = max((miss_rates[f] for f in unstated), default=0.0)
    else:
        silent = 1.0
        for f in unstated:
            silent *= 1.0 - miss_rates[f] * odds.probability(f, features)
        missed = 1.0 - silent
    return Usefulness(overview.study.id, max(0.0, inconsistency), disagreement, missed, atypical)


def ordered(db: Database, overviews: list[StudyOverview], order: str) -> list[StudyOverview]:
    """Unread studies first, in `order` ('oldest' or 'useful', ties oldest first; 'useful' ranks only the studies
    that are drafted, those that are not follow them, oldest first), then the others as given."""
    order = order_key(order)
    unread = sorted((o for o in overviews if o.study.status in UNREAD), key=lambda o: (o.study.created_at, o.study.id))
    rest = [o for o in overviews if o.study.status not in UNREAD]
    if order == "useful" and unread:
        # a study that is not a chest radiograph is never drafted: out of the model's ranking, after it
        kept_out = [o for o in unread if getattr(o.study, "not_drafted", None)]
        unread = [o for o in unread if not getattr(o.study, "not_drafted", None)]
        signed = signed_drafts(db)
        rates, like = served_miss_rates(db, signed), finding_resemblance(signed)
        stated = {o.study.id: stated_findings(o.latest_draft.text) for o in unread if o.latest_draft is not None}
        unusual = image_atypicality(unread, signed, stated)  # each draft's findings labelled once for both terms
        scores = {
            o.study.id: usefulness(o, rates, like, unusual.get(o.study.id, 0.0), stated.get(o.study.id)).score
            for o in unread
        }
        unread.sort(key=lambda o: -scores[o.study.id])  # stable: ties stay oldest first
        unread += kept_out
    return unread + rest


def note_opened(db: Database, user: UserRecord, study_id: int, order: str | None) -> bool:
    """The reader opened an unread `study_id` from the worklist in `order`: what the correction they save will
    record. A study already reported (opened to amend it) was not read in any ordering: nothing is noted."""
    order = order_key(order)
    if StudyRepository(db).overview(study_id).study.status not in UNREAD:
        return False
    AuditRepository(db).append(
        OPENED, actor=user, object_type="study", object_id=study_id, details={"reading_order": order}
    )
    return True


def opened_from(db: Database, user: UserRecord, study_id: int) -> str | None:
    """The ordering this reader last opened the study from in the worklist (None: not opened from it)."""
    entries = AuditRepository(db).query(
        action=OPENED, actor_name=user.username, object_type="study", object_id=study_id, limit=1
    )
    order = entries[0].details.get("reading_order") if entries else None
    return order if order in READING_ORDERS else None


class _PairedStudy(Protocol):
    @property
    def draft_text(self) -> str | None: ...


def pairs_by_order(studies: Iterable[_PairedStudy]) -> dict[str, int]:
    """How many clinician pairs of a round's new studies came from each ordering ('unordered': none)."""
    counts = Counter(getattr(s, "reading_order", None) or "unordered" for s in studies if s.draft_text)
    return dict(sorted(counts.items()))
