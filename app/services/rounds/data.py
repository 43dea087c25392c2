"""What a round trains on, written as the file the worker reads.

The training set is every training-split study whose latest signed report no
round has used yet, plus (by `replay_fraction`) a seeded sample of studies that
earlier rounds used. It is written as a CheXpert Plus style CSV because that is
what `orapo train` reads: the same file a user could hand to the command, with
exactly the columns the dataset loader reads, in one pass
(`orapo_core.data.loaders.ROUND_COLUMNS`): the FactS labels the report was
stored with, the corrected report as the oracle, and the clinician's own draft
-> corrected pair with its id. A study's pair is found by its correction's id,
never again by its text. What the round is judged on, the held-out set, is
`app.services.rounds.heldout`.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.services.reading.reading_order import pairs_by_order
from app.services.rounds.evidence import finding_changes
from app.services.rounds.metrics import Selection
from db import CorrectionRepository, DraftRepository, PairRepository, StudyRepository
from orapo_core.data import load_dataset
from orapo_core.data.loaders import ROUND_COLUMNS
from orapo_core.data.phantom import write_dataset
from orapo_core.data.records import CHEXPERT_14, format_label
from orapo_core.errors import OrapoError
from orapo_core.facts import label_report
from orapo_core.report_layout import report_text, same_text, split_report

if TYPE_CHECKING:
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
    reading_order: str | None = (
        None  # the worklist ordering the study was read from (app.services.reading.reading_order)
    )
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
        return finding_changes((s.labels, label_report(s.draft_text)) for s in self.new if s.draft_text)

    def summary(self) -> Selection:
        return Selection(
            new_studies=[s.study_id for s in self.new],
            replayed_studies=[s.study_id for s in self.replay],
            phantom_replay=len(self.phantom_replay),
            correction_ids=[s.correction_id for s in self.new],
            pair_ids=sorted({p for s in self.studies for p in s.pair_ids}),
            clinician_pairs=sum(1 for s in self.studies if s.draft_text),
            pairs_by_order=pairs_by_order(self.new),
            finding_changes=self.finding_changes(),
        )


def first_image_path(settings: Settings, images: Iterable[ImageRecord]) -> str | None:
    """The path of the first of a study's images whose display file is in storage; None when none is."""
    for image in images:
        path = settings.storage_dir / image.display_path
        if path.exists():
            return str(path)
    return None


def _round_study(
    db: Database, settings: Settings, correction: CorrectionRecord, images: Iterable[ImageRecord], *, replay: bool
) -> RoundStudy | None:
    image_path = first_image_path(settings, images)
    if image_path is None:
        return None
    pairs = PairRepository(db).list(correction_id=correction.id, source="clinician_edit")
    draft_text = pairs[-1].rejected if pairs else None
    if draft_text is None and correction.draft_id is not None and not correction.accepted_unchanged:
        text = DraftRepository(db).get(correction.draft_id).text
        draft_text = None if same_text(text, correction.text) else text
    # the labels the report was saved with; a report stored without them (an import) is labelled here, once
    labels = dict(correction.labels or label_report(correction.text))
    return RoundStudy(
        study_id=correction.study_id,
        correction_id=correction.id,
        image_path=image_path,
        corrected_report=correction.text,
        draft_text=draft_text,
        pair_ids=tuple(p.id for p in pairs),
        replay=replay,
        reading_order=correction.reading_order,
        labels=labels,
    )


def select_round_studies(
    db: Database,
    settings: Settings,
    *,
    replay_fraction: float = 0.0,
    replay_max: int | None = None,
    seed: int = 0,
    phantom_size: int | None = None,
) -> RoundSelection:
    """The round's studies: every untrained signed report of the training split, plus replayed older ones.

    Replay is what keeps a round from learning "always say the corrected finding": the corrections of one
    week may all carry it, the replayed studies mostly do not. Older signed studies are replayed first;
    with `phantom_size` (given only while the PhantomCXR starter is served) PhantomCXR studies drawn at
    their usual prevalence make up what is missing, since the starter's own training distribution is the
    one thing a fresh install has to rehearse."""
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
        older = [
            o
            for o in studies.list(status="trained", split="train", limit=100_000)
            if o.latest_correction is not None and o.latest_correction.signed_at is not None
        ]
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
    # Seeds far from the validation split's (20240) and from every starter build stream.
    folder = settings.resolved_data_dir / "replay" / f"phantomcxr-{9_000_000 + seed}-{n}-{size}"
    if not (folder / ".complete").exists():
        write_dataset(folder, n, seed=9_000_000 + seed, size=size)
        (folder / ".complete").write_text("ok")
    studies = [(r, report_text(r.findings, r.impression)) for r in load_dataset(folder) if r.image_paths][:n]
    return [
        PhantomReplayStudy(
            study_id=f"phantom-replay-{r.study_id}",
            image_path=str(r.image_paths[0]),
            report=report,
            labels=label_report(report),
        )
        for r, report in studies
    ]


def write_training_csv(selection: RoundSelection, path: Path) -> Path:
    """The round's studies as the CheXpert Plus style CSV `orapo train --train_csv` reads: `ROUND_COLUMNS`, each
    study's labels as stored with its report, its clinician pair with the pair's id."""
    if not selection.studies:
        raise OrapoError("nothing_to_train", "There are no signed, untrained corrections of training studies yet.")
    rows = [
        (f"study-{s.study_id}", s.image_path, s.corrected_report, s.labels, s.draft_text, s.pair_id)
        for s in selection.studies
    ]
    rows += [(p.study_id, p.image_path, p.report, p.labels, None, None) for p in selection.phantom_replay]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=ROUND_COLUMNS)
        writer.writeheader()
        for key, image_path, report, labels, draft_text, pair_id in rows:
            findings, impression = split_report(report)
            writer.writerow(
                {
                    "id": key,
                    "split": "train",
                    "path_to_image": image_path,
                    "section_findings": findings,
                    "section_impression": impression,
                    **{name: format_label(labels.get(name)) for name in CHEXPERT_14},
                    "oracle_report": report,
                    "clinician_chosen": report if draft_text else "",
                    "clinician_rejected": draft_text or "",
                    "pair_id": "" if pair_id is None or not draft_text else str(pair_id),
                }
            )
    return path
