"""What a round is judged on: the held-out set, written as the file the evaluator reads.

The held-out set is the studies split off as 'holdout' when they were saved
(never trained on); while there are fewer than `min_heldout` of them with a
signed report, PhantomCXR's validation split stands in, generated once into the
data folder. While it has fewer than `min_finding_negatives` studies without a
finding the round's corrections changed, studies of one PhantomCXR pool drawn
at the usual prevalence of every finding are added (`top_up`): a finding's
negatives are then films with other findings too (an effusion film is where a
model taught pleural other says it wrongly), and they count for its
false-positive rate only (`evidence.TOPUP_SOURCE`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from app.services.rounds.data import first_image_path
from app.services.rounds.evidence import TOPUP_MAX_STUDIES, TOPUP_SOURCE, corrected_findings
from app.services.rounds.metrics import HeldoutSummary
from db import StudyRepository
from orapo_core.data import load_dataset
from orapo_core.data.phantom import generate_study, write_dataset
from orapo_core.data.phantom_io import DatasetWriter
from orapo_core.data.records import StudyRecord
from orapo_core.errors import OrapoError
from orapo_core.facts import label_report
from orapo_core.facts.metrics import is_positive
from orapo_core.report_layout import split_report

if TYPE_CHECKING:
    from app.services.rounds.policy import RoundPolicy
    from db import Database
    from orapo_core.config import Settings


@dataclass(frozen=True)
class HeldoutStudy:
    study_id: str
    image_path: str
    findings: str
    impression: str
    labels: dict[str, int | None]
    source: str = ""  # "" for the set's own source; TOPUP_SOURCE for a PhantomCXR study added without a finding


@dataclass
class HeldoutSet:
    source: str  # "holdout_studies" or "phantomcxr_valid"
    studies: list[HeldoutStudy]
    signed: int = 0  # signed held-out studies of the clinic (all of `studies` when source is holdout_studies)
    topped_up_for: list[str] = field(default_factory=list)  # the findings PhantomCXR negatives were added for

    def source_of(self, study: HeldoutStudy) -> str:
        return study.source or self.source

    def summary(self) -> HeldoutSummary:
        sources: dict[str, int] = {}
        for study in self.studies:
            sources[self.source_of(study)] = sources.get(self.source_of(study), 0) + 1
        return HeldoutSummary(
            source=self.source,
            n=len(self.studies),
            signed_heldout=self.signed,
            study_ids=[s.study_id for s in self.studies],
            sources=sources,
            topped_up_for=list(self.topped_up_for),
        )

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "source": self.source,
                    "signed": self.signed,
                    "topped_up_for": self.topped_up_for,
                    "studies": [asdict(s) for s in self.studies],
                },
                indent=1,
            )
        )
        return path

    @classmethod
    def read(cls, path: Path) -> HeldoutSet:
        data = json.loads(Path(path).read_text())
        return cls(
            source=data["source"],
            studies=[HeldoutStudy(**s) for s in data["studies"]],
            signed=int(data.get("signed", 0)),
            topped_up_for=list(data.get("topped_up_for") or []),
        )

    def records(self) -> list[StudyRecord]:
        """As `orapo_core.data.StudyRecord`s, which `evaluate_drafter` reads (each with its own source)."""
        return [
            StudyRecord(
                study_id=s.study_id,
                image_paths=[Path(s.image_path)],
                view=None,
                findings=s.findings,
                impression=s.impression,
                labels=dict(s.labels),
                source=self.source_of(s),
                split="holdout",
            )
            for s in self.studies
        ]


def heldout_from_database(db: Database, settings: Settings, *, limit: int | None = None) -> list[HeldoutStudy]:
    out = []
    for overview in reversed(StudyRepository(db).list(split="holdout", limit=100_000)):
        correction = overview.latest_correction
        if correction is None or correction.signed_at is None:
            continue
        image_path = first_image_path(settings, overview.images)
        if image_path is None:
            continue
        findings, impression = split_report(correction.text)
        out.append(
            HeldoutStudy(
                study_id=f"db-{overview.study.id}",
                image_path=image_path,
                findings=findings,
                impression=impression,
                labels=dict(correction.labels or label_report(correction.text)),
            )
        )
    return out[:limit] if limit else out


def phantom_validation(
    settings: Settings, *, studies: int = 200, size: int = 256, seed: int = 20240
) -> list[HeldoutStudy]:
    """PhantomCXR's validation split, generated once under `<data>/heldout/phantomcxr-<seed>-<n>-<size>/`."""
    folder = settings.resolved_data_dir / "heldout" / f"phantomcxr-{seed}-{studies}-{size}"
    done = folder / ".complete"
    if not done.exists():
        write_dataset(folder, studies, seed=seed, size=size)
        done.write_text("ok")
    return [
        HeldoutStudy(
            study_id=f"phantom-{r.study_id}",
            image_path=str(r.image_paths[0]),
            findings=r.findings,
            impression=r.impression,
            labels=dict(r.labels),
        )
        for r in load_dataset(folder)
        if r.split == "valid" and r.image_paths
    ]


def select_heldout(
    db: Database,
    settings: Settings,
    *,
    min_heldout: int = 20,
    max_heldout: int | None = 200,
    phantom_studies: int = 200,
    phantom_size: int = 256,
    negatives_for: list[str] | None = None,
    min_negatives: int = 100,
    max_topup: int = TOPUP_MAX_STUDIES,
) -> HeldoutSet:
    """The held-out studies with a signed report, or PhantomCXR's validation split while there are too few; then,
    while fewer than `min_negatives` of them lack a finding of `negatives_for` (the round's corrected findings),
    studies of the PhantomCXR top-up pool added, at most `max_topup` of them (`top_up`).

    `HeldoutSet.signed` says how many signed held-out studies there were, so the gate can tell whether the
    PhantomCXR stand-in may decide (only for the PhantomCXR starter: see `steps.untrusted_heldout`)."""
    own = heldout_from_database(db, settings, limit=max_heldout)
    if len(own) >= max(1, min_heldout):
        heldout = HeldoutSet("holdout_studies", own, signed=len(own))
    else:
        phantom = phantom_validation(settings, studies=phantom_studies, size=phantom_size)
        if not phantom:
            raise OrapoError(
                "no_heldout",
                "There is no held-out set: no signed held-out studies and no PhantomCXR validation studies.",
            )
        heldout = HeldoutSet("phantomcxr_valid", phantom[:max_heldout] if max_heldout else phantom, signed=len(own))
    return top_up(
        heldout,
        list(negatives_for or []),
        min_negatives,
        lambda start, n: phantom_pool(settings, start, n, size=phantom_size),
        limit=max_topup,
    )


def round_heldout(
    db: Database, settings: Settings, policy: RoundPolicy, finding_changes: dict[str, dict[str, int]]
) -> HeldoutSet:
    """A round's held-out set by its policy (`RoundPolicy`), topped up for the findings its corrections changed often."""
    return select_heldout(
        db,
        settings,
        min_heldout=policy.min_heldout,
        max_heldout=policy.max_heldout,
        phantom_studies=policy.phantom_studies,
        phantom_size=policy.phantom_size,
        negatives_for=corrected_findings(finding_changes, policy.min_finding_corrections),
        min_negatives=policy.min_finding_negatives,
        max_topup=policy.max_topup_studies,
    )


# --- topping the held-out set up with PhantomCXR studies at the usual prevalence -----------------------------------

#: PhantomCXR's seed for the top-up pool: far from the validation split's (20240), the replay's and the starter's.
TOPUP_SEED = 30_000_000
#: The top-up pool is generated (and cached) this many studies at a time, only as far as the findings need.
TOPUP_CHUNK = 100


def negatives_short(studies: list[HeldoutStudy], findings: list[str], minimum: int) -> dict[str, int]:
    """How many negatives each of `findings` lacks among `studies` to have `minimum` (only those that lack some)."""
    short = {f: minimum - sum(not is_positive(s.labels, f) for s in studies) for f in findings}
    return {f: n for f, n in short.items() if n > 0}


def top_up(
    heldout: HeldoutSet,
    findings: list[str],
    minimum: int,
    pool: Callable[[int, int], list[HeldoutStudy]],
    *,
    limit: int = TOPUP_MAX_STUDIES,
    chunk: int = TOPUP_CHUNK,
) -> HeldoutSet:
    """`heldout` with studies of `pool` added until each of `findings` has `minimum` negatives, or `limit` pool
    studies were looked at.

    `pool(start, n)` gives studies start .. start + n - 1 of one pool drawn at PhantomCXR's usual prevalence of every
    finding (`phantom_pool`), asked for `chunk` at a time. A pool study is added, in the pool's order, when it does
    not state a finding that still lacks negatives; it is a negative of every corrected finding it does not state,
    so a finding's negatives include films with the others (an effusion film among pleural other's). Added
    studies are marked `TOPUP_SOURCE`: the gate counts them for false-positive rates only (`evidence.finding_rows`).
    A finding still short after `limit` studies is left so, and the gate says it cannot measure it."""
    short = negatives_short(heldout.studies, findings, minimum)
    if not short:
        return heldout
    wanted = [f for f in findings if f in short]  # in the findings' order
    added: list[HeldoutStudy] = []
    start = 0
    while short and start < limit:
        studies = pool(start, min(chunk, limit - start))
        if not studies:
            break
        for study in studies:
            lacks = [f for f in short if not is_positive(study.labels, f)]
            if not lacks:
                continue
            added.append(replace(study, source=TOPUP_SOURCE))
            for f in lacks:
                short[f] -= 1
                if short[f] <= 0:
                    del short[f]
            if not short:
                break
        start += len(studies)
    return HeldoutSet(heldout.source, heldout.studies + added, signed=heldout.signed, topped_up_for=wanted)


def phantom_pool(
    settings: Settings, start: int, n: int, *, size: int = 256, seed: int = TOPUP_SEED
) -> list[HeldoutStudy]:
    """Studies start .. start + n - 1 of the PhantomCXR top-up pool: every finding at its usual prevalence, study i
    drawn from (seed, i) alone as `write_dataset` draws it, so the pool is one stream however it is cut. Each slice
    is generated once under `<data>/heldout/phantomcxr-pool-<seed>-<size>/<start>-<n>/`."""
    import numpy as np

    folder = settings.resolved_data_dir / "heldout" / f"phantomcxr-pool-{seed}-{size}" / f"{start}-{n}"
    if not (folder / ".complete").exists():
        with DatasetWriter(folder, seed=seed) as writer:
            for i in range(start, start + n):
                writer.add(i, generate_study(np.random.default_rng([seed, i]), size=size))
        (folder / ".complete").write_text("ok")
    return [
        HeldoutStudy(
            study_id=f"phantom-topup-{r.study_id}",
            image_path=str(r.image_paths[0]),
            findings=r.findings,
            impression=r.impression,
            labels=dict(r.labels),
        )
        for r in load_dataset(folder)
        if r.image_paths
    ]
