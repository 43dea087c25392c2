"""Exports: preference pairs and OraPO prompts as Hugging Face datasets, and the rule every export follows.

Pairs leave as `datasets` folders (`save_to_disk`) that TRL's trainers read
as they stand, with the images embedded as bytes (the folder is self-contained,
no paths into the storage folder): `trl-dpo` is the conversational
prompt/chosen/rejected layout with an `images` column that DPOTrainer's vision
collator expects, one row per stored pair with its id; `trl-grpo` is exactly the
dataset `orapo train` builds (`orapo_core.train.dataset.build_training_dataset`),
one row per signed training study, its clinician pair found by the report's id
(`clinician_draft`). Held-out studies never leave in a training export.

Reports leave as FHIR R4 bundles (`app.services.operations.export_fhir`) and as
DICOM SRs (`app.services.archive.export_sr`); both skip a study they cannot
export and say why (`build_each`, `SkippedStudy`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from db import DraftRepository, PairRepository, StudyRepository
from orapo_core.errors import OrapoError
from orapo_core.facts import label_report
from orapo_core.report_layout import report_text, same_text, split_report

if TYPE_CHECKING:
    from db import Database
    from db.records import CorrectionRecord, ImageRecord
    from orapo_core.config import Settings

T = TypeVar("T")

PAIR_FORMATS = ("trl-dpo", "trl-grpo")


@dataclass(frozen=True)
class ExportSummary:
    path: Path
    format: str
    rows: int
    skipped: int = 0

    def __str__(self) -> str:
        extra = f" ({self.skipped} skipped: no image)" if self.skipped else ""
        return f"{self.rows} rows in {self.format} format written to {self.path}{extra}"


def _image_bytes(settings: Settings, image: ImageRecord) -> bytes | None:
    path = settings.storage_dir / image.display_path
    return path.read_bytes() if path.is_file() else None


def _save(dataset: Any, out: Path) -> None:  # a `datasets.Dataset`
    if out.exists() and any(out.iterdir()):
        raise OrapoError("export_exists", f"{out} exists and is not empty; choose a new folder.")
    dataset.save_to_disk(str(out))


def export_pairs(
    db: Database,
    settings: Settings,
    out: str | Path,
    *,
    format: str = "trl-dpo",
    source: str | None = None,
    round_id: int | None = None,
) -> ExportSummary:
    """Write the preference pairs (`trl-dpo`) or the OraPO prompts (`trl-grpo`) as a `datasets` folder."""
    if format not in PAIR_FORMATS:
        raise OrapoError("invalid_format", f"The export format is one of {', '.join(PAIR_FORMATS)}, not {format!r}.")
    out = Path(out)
    if format == "trl-dpo":
        return _export_dpo(db, settings, out, source=source, round_id=round_id)
    return _export_grpo(db, settings, out)


def _export_dpo(
    db: Database, settings: Settings, out: Path, *, source: str | None, round_id: int | None
) -> ExportSummary:
    from datasets import Dataset, Features, Image, List, Value

    studies = StudyRepository(db)
    rows: dict[str, list] = {k: [] for k in ("prompt", "chosen", "rejected", "images", "study_id", "pair_id", "source")}
    skipped = 0
    for pair in PairRepository(db).list(source=source, round_id=round_id):
        image = (
            studies.get_image(pair.image_id)
            if pair.image_id is not None
            else next(iter(studies.images(pair.study_id)), None)
        )
        data = _image_bytes(settings, image) if image is not None else None
        if data is None:
            skipped += 1
            continue
        # TRL's vision collator inserts the image placeholder before the user's text (prepare_multimodal_messages).
        rows["prompt"].append([{"role": "user", "content": pair.prompt}])
        rows["chosen"].append([{"role": "assistant", "content": pair.chosen}])
        rows["rejected"].append([{"role": "assistant", "content": pair.rejected}])
        rows["images"].append([{"bytes": data, "path": None}])
        rows["study_id"].append(pair.study_id)
        rows["pair_id"].append(pair.id)
        rows["source"].append(pair.source)
    if not rows["prompt"]:
        raise OrapoError("nothing_to_export", "There are no preference pairs with images to export yet.")
    turn = List({"role": Value("string"), "content": Value("string")})
    features = Features(
        {
            "prompt": turn,
            "chosen": turn,
            "rejected": turn,
            "images": List(Image()),
            "study_id": Value("int64"),
            "pair_id": Value("int64"),
            "source": Value("string"),
        }
    )
    _save(Dataset.from_dict(rows, features=features), out)
    return ExportSummary(out, "trl-dpo", len(rows["prompt"]), skipped)


def _export_grpo(db: Database, settings: Settings, out: Path) -> ExportSummary:
    from orapo_core.train.dataset import build_training_dataset  # noqa: PLC0415 -- loads numpy

    studies = StudyRepository(db)
    records, skipped = [], 0
    for overview in reversed(studies.list(split="train", limit=1_000_000)):
        correction = overview.latest_correction
        if correction is None or correction.signed_at is None:
            continue
        image = next(iter(overview.images), None)
        data = _image_bytes(settings, image) if image is not None else None
        if data is None:
            skipped += 1
            continue
        draft_text = clinician_draft(db, correction)
        findings, impression = split_report(correction.text)
        records.append(
            {
                "study_id": str(overview.study.id),
                "image": {"bytes": data, "path": None},
                "labels": label_report(correction.text),
                "reference_report": report_text(findings, impression),
                "oracle_report": correction.text,
                "clinician_chosen": correction.text if draft_text else None,
                "clinician_rejected": draft_text,
            }
        )
    if not records:
        raise OrapoError(
            "nothing_to_export", "There are no signed reports of training studies with images to export yet."
        )
    dataset = build_training_dataset(records)
    _save(dataset, out)
    return ExportSummary(out, "trl-grpo", len(records), skipped)


def clinician_draft(db: Database, correction: CorrectionRecord) -> str | None:
    """The draft a clinician's report replaced, found by the report's id (its correction), never by its text.

    The draft of the last clinician pair stored with this correction; for a report stored without one, the draft it
    was made from if the reader changed it; None when the reader took the draft as it stood. The same rule a round
    applies to its studies (`app.services.rounds.data`), so `trl-grpo` pairs what a round would: another version of
    the report, or another study's, with the same words is not this report's pair."""
    pairs = PairRepository(db).list(correction_id=correction.id, source="clinician_edit")
    if pairs:
        return pairs[-1].rejected
    if correction.draft_id is None or correction.accepted_unchanged:
        return None
    text = DraftRepository(db).get(correction.draft_id).text
    return None if same_text(text, correction.text) else text


# --- the rule of every report export --------------------------------------------------------------


@dataclass(frozen=True)
class SkippedStudy:
    """A study an export left out, and why (an error code and its sentence)."""

    study_id: int
    error: str
    message: str


def build_each(study_ids: list[int], build: Callable[[int], T]) -> tuple[list[T], list[SkippedStudy]]:
    """`build(study_id)` for each study, in order: what was built, and the studies skipped with their reason (an
    `OrapoError`). The one rule of every export: a study that cannot be exported is skipped and the rest still go;
    a single study asked for raises its own error, and nothing at all built is `nothing_to_export`."""
    built: list[T] = []
    skipped: list[SkippedStudy] = []
    for study_id in study_ids:
        try:
            built.append(build(study_id))
        except OrapoError as exc:
            if len(study_ids) == 1:
                raise
            skipped.append(SkippedStudy(study_id, exc.code, exc.message))
    if not built:
        reasons = "; ".join(f"study {s.study_id}: {s.message}" for s in skipped)
        raise OrapoError("nothing_to_export", f"None of the {len(skipped)} studies could be exported ({reasons}).")
    return built, skipped
