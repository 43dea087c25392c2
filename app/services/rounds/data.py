"""What a round trains on and what it is judged on, written as files the worker and the evaluator read.

The training set is every training-split study whose latest signed report no
round has used yet, plus (by `replay_fraction`) a seeded sample of studies that
earlier rounds used. It is written as a CheXpert Plus style CSV because that is
what `orapo train` reads: the same file a user could hand to the command, with
exactly the columns the dataset loader reads, in one pass
(`orapo_core.data.loaders.ROUND_COLUMNS`): the FactS labels the report was
stored with, the corrected report as the oracle, and the clinician's own draft
-> corrected pair with its id. A study's pair is found by its correction's id,
never again by its text. The held-out set is the studies
split off as 'holdout' when they were saved (never trained on); while there are
fewer than `min_heldout` of them with a signed report, PhantomCXR's validation
split stands in, generated once into the data folder. While it has fewer than
`min_finding_negatives` studies without a finding the round's corrections
changed, studies of one PhantomCXR pool drawn at the usual prevalence of every
finding are added (`top_up`): a finding's negatives are then films with other
findings too (an effusion film is where a model taught pleural other says it
wrongly), and they count for its false-positive rate only
(`evidence.TOPUP_SOURCE`).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from app.services.reading.reading_order import pairs_by_order
from app.services.rounds.evidence import TOPUP_MAX_STUDIES, TOPUP_SOURCE, corrected_findings, finding_changes
from app.services.rounds.metrics import HeldoutSummary, Selection
from orapo_core.data.loaders import ROUND_COLUMNS
from orapo_core.data.records import CHEXPERT_14, StudyRecord, format_label
from orapo_core.errors import OrapoError
from orapo_core.report_layout import report_text, same_text, split_report

if TYPE_CHECKING:
    from app.services.rounds.policy import RoundPolicy
    from db import Database
    from db.records import CorrectionRecord, ImageRecord
    from orapo_core.config import Settings


@dataclass(frozen=True)
class RoundStudy:
    """One study as a round sees it: its image, the clinician's report and, if edited, the draft it replaced."""

    study_id: int
    correction_id: int
    image_path: str
    corrected_report: str
    draft_text: str | None
    pair_ids: tuple[int, ...] = ()  # the correction's clinician pairs; the last one's draft is `draft_text`
    replay: bool = False
    reading_order: str | None = None  # the worklist ordering the study was read from (app.services.reading.reading_order)
    labels: dict = field(default_factory=dict)  # the report's FactS labels, as stored with it when it was saved

    @property
    def pair_id(self) -> int | None:
        """The pair whose draft `draft_text` is, or None (no edit, or a draft without a stored pair)."""
        return self.pair_ids[-1] if self.pair_ids else None


@dataclass(frozen=True)
class PhantomReplayStudy:
    """A PhantomCXR study replayed for the PhantomCXR starter: its reference report is the oracle, no pair."""

    study_id: str
    image_path: str
    report: str
    labels: dict = field(default_factory=dict)  # FactS labels of `report`, as a clinician's report is stored with


@dataclass
class RoundSelection:
    new: list[RoundStudy] = field(default_factory=list)
    replay: list[RoundStudy] = field(default_factory=list)
    phantom_replay: list[PhantomReplayStudy] = field(default_factory=list)

    @property
    def studies(self) -> list[RoundStudy]:
        return self.new + self.replay

    @property
    def n_training_rows(self) -> int:
        return len(self.studies) + len(self.phantom_replay)

    @property
    def study_ids(self) -> list[int]:
        return sorted({s.study_id for s in self.studies})

    def finding_changes(self) -> dict[str, dict[str, int]]:
        """What the new corrections did to each finding: the signed report's labels against the replaced draft's."""
        from orapo_core.facts import label_report

        return finding_changes((s.labels, label_report(s.draft_text)) for s in self.new if s.draft_text)

    def summary(self) -> Selection:
        return Selection(new_studies=[s.study_id for s in self.new], replayed_studies=[s.study_id for s in self.replay],
                         phantom_replay=len(self.phantom_replay), correction_ids=[s.correction_id for s in self.new],
                         pair_ids=sorted({p for s in self.studies for p in s.pair_ids}),
                         clinician_pairs=sum(1 for s in self.studies if s.draft_text),
                         pairs_by_order=pairs_by_order(self.new), finding_changes=self.finding_changes())


def _first_image_path(settings: Settings, images: Iterable[ImageRecord]) -> str | None:
    for image in images:
        path = settings.storage_dir / image.display_path
        if path.exists():
            return str(path)
    return None


def _round_study(db: Database, settings: Settings, correction: CorrectionRecord, images: Iterable[ImageRecord], *,
                 replay: bool) -> RoundStudy | None:
    from db import DraftRepository, PairRepository
    from orapo_core.facts import label_report

    image_path = _first_image_path(settings, images)
    if image_path is None:
        return None
    pairs = PairRepository(db).list(correction_id=correction.id, source="clinician_edit")
    draft_text = pairs[-1].rejected if pairs else None
    if draft_text is None and correction.draft_id is not None and not correction.accepted_unchanged:
        text = DraftRepository(db).get(correction.draft_id).text
        draft_text = None if same_text(text, correction.text) else text
    # the labels the report was saved with; a report stored without them (an import) is labelled here, once
    labels = dict(correction.labels or label_report(correction.text))
    return RoundStudy(study_id=correction.study_id, correction_id=correction.id, image_path=image_path,
                      corrected_report=correction.text, draft_text=draft_text,
                      pair_ids=tuple(p.id for p in pairs), replay=replay, reading_order=correction.reading_order,
                      labels=labels)


def select_round_studies(db: Database, settings: Settings, *, replay_fraction: float = 0.0, replay_max: int | None = None,
                         seed: int = 0, phantom_size: int | None = None) -> RoundSelection:
    """The round's studies: every untrained signed report of the training split, plus replayed older ones.

    Replay is what keeps a round from learning "always say the corrected finding": the corrections of one
    week may all carry it, the replayed studies mostly do not. Older signed studies are replayed first;
    with `phantom_size` (given only while the PhantomCXR starter is served) PhantomCXR studies drawn at
    their usual prevalence make up what is missing, since the starter's own training distribution is the
    one thing a fresh install has to rehearse."""
    from db import CorrectionRepository, StudyRepository

    studies = StudyRepository(db)
    selection = RoundSelection()
    for correction in CorrectionRepository(db).untrained(signed_only=True):
        study = _round_study(db, settings, correction, studies.images(correction.study_id), replay=False)
        if study is not None:
            selection.new.append(study)
    if replay_fraction > 0 and selection.new:
        wanted = math.ceil(replay_fraction * len(selection.new))
        if replay_max is not None:
            wanted = min(wanted, replay_max)
        older = [o for o in studies.list(status="trained", split="train", limit=100_000)
                 if o.latest_correction is not None and o.latest_correction.signed_at is not None]
        random.Random(seed).shuffle(older)
        for overview in older[:wanted]:
            assert overview.latest_correction is not None  # `older` holds signed ones only
            study = _round_study(db, settings, overview.latest_correction, overview.images, replay=True)
            if study is not None:
                selection.replay.append(study)
        missing = wanted - len(selection.replay)
        if phantom_size and missing > 0:
            selection.phantom_replay = phantom_replay(settings, missing, size=phantom_size, seed=seed)
    return selection


def phantom_replay(settings: Settings, n: int, *, size: int = 256, seed: int = 0) -> list[PhantomReplayStudy]:
    """`n` PhantomCXR studies for replay, written once under `<data>/replay/phantomcxr-<seed>-<n>-<size>/`."""
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset
    from orapo_core.facts import label_report

    # Seeds far from the validation split's (20240) and from every starter build stream.
    folder = settings.resolved_data_dir / "replay" / f"phantomcxr-{9_000_000 + seed}-{n}-{size}"
    if not (folder / ".complete").exists():
        write_dataset(folder, n, seed=9_000_000 + seed, size=size)
        (folder / ".complete").write_text("ok")
    studies = [(r, report_text(r.findings, r.impression)) for r in load_dataset(folder) if r.image_paths][:n]
    return [PhantomReplayStudy(study_id=f"phantom-replay-{r.study_id}", image_path=str(r.image_paths[0]),
                               report=report, labels=label_report(report)) for r, report in studies]


def write_training_csv(selection: RoundSelection, path: Path) -> Path:
    """The round's studies as the CheXpert Plus style CSV `orapo train --train_csv` reads: `ROUND_COLUMNS`, each
    study's labels as stored with its report, its clinician pair with the pair's id."""
    if not selection.studies:
        raise OrapoError("nothing_to_train", "There are no signed, untrained corrections of training studies yet.")
    rows = [(f"study-{s.study_id}", s.image_path, s.corrected_report, s.labels, s.draft_text, s.pair_id)
            for s in selection.studies]
    rows += [(p.study_id, p.image_path, p.report, p.labels, None, None) for p in selection.phantom_replay]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=ROUND_COLUMNS)
        writer.writeheader()
        for key, image_path, report, labels, draft_text, pair_id in rows:
            findings, impression = split_report(report)
            writer.writerow({"id": key, "split": "train", "path_to_image": image_path, "section_findings": findings,
                             "section_impression": impression,
                             **{name: format_label(labels.get(name)) for name in CHEXPERT_14},
                             "oracle_report": report,
                             "clinician_chosen": report if draft_text else "",
                             "clinician_rejected": draft_text or "",
                             "pair_id": "" if pair_id is None or not draft_text else str(pair_id)})
    return path


# --- the held-out set --------------------------------------------------------------------------------


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
        return HeldoutSummary(source=self.source, n=len(self.studies), signed_heldout=self.signed,
                              study_ids=[s.study_id for s in self.studies], sources=sources,
                              topped_up_for=list(self.topped_up_for))

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"source": self.source, "signed": self.signed, "topped_up_for": self.topped_up_for,
                                    "studies": [asdict(s) for s in self.studies]}, indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> HeldoutSet:
        data = json.loads(Path(path).read_text())
        return cls(source=data["source"], studies=[HeldoutStudy(**s) for s in data["studies"]],
                   signed=int(data.get("signed", 0)), topped_up_for=list(data.get("topped_up_for") or []))

    def records(self) -> list[StudyRecord]:
        """As `orapo_core.data.StudyRecord`s, which `evaluate_drafter` reads (each with its own source)."""
        return [StudyRecord(study_id=s.study_id, image_paths=[Path(s.image_path)], view=None, findings=s.findings,
                            impression=s.impression, labels=dict(s.labels), source=self.source_of(s), split="holdout")
                for s in self.studies]


def heldout_from_database(db: Database, settings: Settings, *, limit: int | None = None) -> list[HeldoutStudy]:
    from db import StudyRepository
    from orapo_core.facts import label_report

    out = []
    for overview in reversed(StudyRepository(db).list(split="holdout", limit=100_000)):
        correction = overview.latest_correction
        if correction is None or correction.signed_at is None:
            continue
        image_path = _first_image_path(settings, overview.images)
        if image_path is None:
            continue
        findings, impression = split_report(correction.text)
        out.append(HeldoutStudy(study_id=f"db-{overview.study.id}", image_path=image_path, findings=findings,
                                impression=impression, labels=dict(correction.labels or label_report(correction.text))))
    return out[:limit] if limit else out


def phantom_validation(settings: Settings, *, studies: int = 200, size: int = 256, seed: int = 20240) -> list[HeldoutStudy]:
    """PhantomCXR's validation split, generated once under `<data>/heldout/phantomcxr-<seed>-<n>-<size>/`."""
    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import write_dataset

    folder = settings.resolved_data_dir / "heldout" / f"phantomcxr-{seed}-{studies}-{size}"
    done = folder / ".complete"
    if not done.exists():
        write_dataset(folder, studies, seed=seed, size=size)
        done.write_text("ok")
    return [HeldoutStudy(study_id=f"phantom-{r.study_id}", image_path=str(r.image_paths[0]), findings=r.findings,
                         impression=r.impression, labels=dict(r.labels))
            for r in load_dataset(folder) if r.split == "valid" and r.image_paths]


def select_heldout(db: Database, settings: Settings, *, min_heldout: int = 20, max_heldout: int | None = 200,
                   phantom_studies: int = 200, phantom_size: int = 256, negatives_for: list[str] | None = None,
                   min_negatives: int = 100, max_topup: int = TOPUP_MAX_STUDIES) -> HeldoutSet:
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
            raise OrapoError("no_heldout", "There is no held-out set: no signed held-out studies and no PhantomCXR validation studies.")
        heldout = HeldoutSet("phantomcxr_valid", phantom[:max_heldout] if max_heldout else phantom, signed=len(own))
    return top_up(heldout, list(negatives_for or []), min_negatives,
                  lambda start, n: phantom_pool(settings, start, n, size=phantom_size), limit=max_topup)


def round_heldout(db: Database, settings: Settings, policy: RoundPolicy, finding_changes: dict[str, dict[str, int]]) -> HeldoutSet:
    """A round's held-out set by its policy (`RoundPolicy`), topped up for the findings its corrections changed often."""
    return select_heldout(db, settings, min_heldout=policy.min_heldout, max_heldout=policy.max_heldout,
                          phantom_studies=policy.phantom_studies, phantom_size=policy.phantom_size,
                          negatives_for=corrected_findings(finding_changes, policy.min_finding_corrections),
                          min_negatives=policy.min_finding_negatives, max_topup=policy.max_topup_studies)


# --- topping the held-out set up with PhantomCXR studies at the usual prevalence -----------------------------------

#: PhantomCXR's seed for the top-up pool: far from the validation split's (20240), the replay's and the starter's.
TOPUP_SEED = 30_000_000
#: The top-up pool is generated (and cached) this many studies at a time, only as far as the findings need.
TOPUP_CHUNK = 100


def negatives_short(studies: list[HeldoutStudy], findings: list[str], minimum: int) -> dict[str, int]:
    """How many negatives each of `findings` lacks among `studies` to have `minimum` (only those that lack some)."""
    from orapo_core.facts.metrics import is_positive

    short = {f: minimum - sum(not is_positive(s.labels, f) for s in studies) for f in findings}
    return {f: n for f, n in short.items() if n > 0}


def top_up(heldout: HeldoutSet, findings: list[str], minimum: int, pool: Callable[[int, int], list[HeldoutStudy]], *,
           limit: int = TOPUP_MAX_STUDIES, chunk: int = TOPUP_CHUNK) -> HeldoutSet:
    """`heldout` with studies of `pool` added until each of `findings` has `minimum` negatives, or `limit` pool
    studies were looked at.

    `pool(start, n)` gives studies start .. start + n - 1 of one pool drawn at PhantomCXR's usual prevalence of every
    finding (`phantom_pool`), asked for `chunk` at a time. A pool study is added, in the pool's order, when it does
    not state a finding that still lacks negatives; it is a negative of every corrected finding it does not state,
    so a finding's negatives include films with the others (an effusion film among pleural other's). Added
    studies are marked `TOPUP_SOURCE`: the gate counts them for false-positive rates only (`evidence.finding_rows`).
    A finding still short after `limit` studies is left so, and the gate says it cannot measure it."""
    from orapo_core.facts.metrics import is_positive

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


def phantom_pool(settings: Settings, start: int, n: int, *, size: int = 256, seed: int = TOPUP_SEED) -> list[HeldoutStudy]:
    """Studies start .. start + n - 1 of the PhantomCXR top-up pool: every finding at its usual prevalence, study i
    drawn from (seed, i) alone as `write_dataset` draws it, so the pool is one stream however it is cut. Each slice
    is generated once under `<data>/heldout/phantomcxr-pool-<seed>-<size>/<start>-<n>/`."""
    import numpy as np

    from orapo_core.data import load_dataset
    from orapo_core.data.phantom import generate_study
    from orapo_core.data.phantom_io import DatasetWriter

    folder = settings.resolved_data_dir / "heldout" / f"phantomcxr-pool-{seed}-{size}" / f"{start}-{n}"
    if not (folder / ".complete").exists():
        with DatasetWriter(folder, seed=seed) as writer:
            for i in range(start, start + n):
                writer.add(i, generate_study(np.random.default_rng([seed, i]), size=size))
        (folder / ".complete").write_text("ok")
    return [HeldoutStudy(study_id=f"phantom-topup-{r.study_id}", image_path=str(r.image_paths[0]),
                         findings=r.findings, impression=r.impression, labels=dict(r.labels))
            for r in load_dataset(folder) if r.image_paths]
