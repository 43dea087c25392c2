"""The training dataset of a round: one row per study, in the columns `OraPOTrainer` and FactS read.

Columns: ``prompt`` (one conversational user turn; TRL puts the image before the
text, which is exactly `orapo_core.models.prompt.build_messages`), ``image``,
``study_id``, ``labels`` (JSON of the 14 CheXpert observations: what FactS scores
against), ``reference_report``, ``oracle_report`` (the clinician's correction
when there is one, else the reference report) and, when any record has them,
``clinician_chosen``/``clinician_rejected``.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path

from orapo_core.data.records import CHEXPERT_14, parse_label
from orapo_core.errors import OrapoError


def default_prompt_text() -> str:
    try:
        from orapo_core.models.prompt import REPORT_PROMPT
    except ImportError:  # the models package is optional for data-only use
        return "Write the findings and impression of this chest X-ray."
    return REPORT_PROMPT


def reference_report(findings: str | None, impression: str | None) -> str:
    parts = []
    if findings and findings.strip():
        parts.append(f"FINDINGS: {findings.strip()}")
    if impression and impression.strip():
        parts.append(f"IMPRESSION: {impression.strip()}")
    return "\n\n".join(parts)


def oracle_for(record: Mapping) -> str:
    """The oracle of a study: the clinician's corrected report if there is one, else the reference report."""
    corrected = (record.get("oracle_report") or "").strip()
    return corrected or (record.get("reference_report") or "").strip()


def _as_row(record) -> dict:
    if isinstance(record, Mapping):
        return dict(record)
    # A StudyRecord (orapo_core.data.records) or anything shaped like one.
    extra = dict(getattr(record, "extra", {}) or {})
    return {
        "study_id": record.study_id,
        "image": str(record.image_paths[0]) if record.image_paths else None,
        "labels": record.labels,
        "reference_report": record.report,
        "oracle_report": extra.get("oracle_report"),
        "clinician_chosen": extra.get("clinician_chosen"),
        "clinician_rejected": extra.get("clinician_rejected"),
    }


def build_training_dataset(records: Iterable, *, prompt_text: str | None = None):
    """A `datasets.Dataset` from dicts (keys as the columns above; ``image`` a path or PIL image) or StudyRecords."""
    from datasets import Dataset, Image

    prompt_text = prompt_text or default_prompt_text()
    rows = [_as_row(r) for r in records]
    if not rows:
        raise OrapoError("no_studies", "The round has no studies to train on: check the CSV or the selection.")
    with_clinician = any(r.get("clinician_chosen") and r.get("clinician_rejected") for r in rows)
    columns: dict[str, list] = {k: [] for k in ("prompt", "image", "study_id", "labels", "reference_report", "oracle_report")}
    if with_clinician:
        columns["clinician_chosen"], columns["clinician_rejected"] = [], []
    for i, row in enumerate(rows):
        if row.get("image") is None:
            raise OrapoError("no_image", f"Study {row.get('study_id', i)!r} has no image: every training study needs one.")
        labels = row.get("labels") or {}
        columns["prompt"].append([{"role": "user", "content": prompt_text}])
        columns["image"].append(str(row["image"]) if isinstance(row["image"], Path) else row["image"])
        columns["study_id"].append(str(row.get("study_id") or f"study-{i}"))
        columns["labels"].append(labels if isinstance(labels, str) else json.dumps(labels))
        columns["reference_report"].append(row.get("reference_report") or "")
        columns["oracle_report"].append(oracle_for(row))
        if with_clinician:
            columns["clinician_chosen"].append(row.get("clinician_chosen") or "")
            columns["clinician_rejected"].append(row.get("clinician_rejected") or "")
    return Dataset.from_dict(columns).cast_column("image", Image())


def _study_id_from_path(path: str) -> str:
    parent = Path(path).parent
    return parent.as_posix() if parent.as_posix() not in ("", ".") else Path(path).stem


def read_chexpert_csv(path: str | Path, *, image_root: str | Path | None = None) -> list[dict]:
    """Rows of a CheXpert Plus style CSV as training records (one per study: its first image)."""
    path = Path(path)
    if not path.is_file():
        raise OrapoError("data_missing", f"The training CSV {path} does not exist.")
    root = Path(image_root) if image_root else path.parent
    records: dict[str, dict] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = {"path_to_image", "section_findings", "section_impression"} - set(reader.fieldnames or [])
        if missing:
            raise OrapoError(
                "data_invalid",
                f"{path.name} lacks the column(s) {', '.join(sorted(missing))}: a CheXpert Plus CSV needs "
                "path_to_image, section_findings and section_impression.",
            )
        for row in reader:
            image = row["path_to_image"].strip()
            study_id = (row.get("study_id") or "").strip() or _study_id_from_path(image)
            if study_id in records:
                continue
            image_path = Path(image) if Path(image).is_absolute() else root / image
            records[study_id] = {
                "study_id": study_id,
                "image": str(image_path),
                "labels": {name: parse_label(row.get(name)) for name in CHEXPERT_14},
                "reference_report": reference_report(row.get("section_findings"), row.get("section_impression")),
                "oracle_report": (row.get("oracle_report") or "").strip() or None,
                "clinician_chosen": (row.get("clinician_chosen") or "").strip() or None,
                "clinician_rejected": (row.get("clinician_rejected") or "").strip() or None,
            }
    return list(records.values())


def select_studies(records: list[dict], *, max_studies: int | None, class_balanced: bool, seed: int = 0) -> list[dict]:
    """At most `max_studies` records; class-balanced means round-robin over the observations' positive studies."""
    rng = random.Random(seed)
    records = list(records)
    rng.shuffle(records)
    if max_studies is None or max_studies >= len(records):
        return records
    if not class_balanced:
        return records[:max_studies]
    pools = {name: [r for r in records if (r.get("labels") or {}).get(name) == 1] for name in CHEXPERT_14}
    chosen: dict[str, dict] = {}
    while len(chosen) < max_studies and any(pools.values()):
        for name in CHEXPERT_14:
            pool = pools[name]
            while pool and pool[0]["study_id"] in chosen:
                pool.pop(0)
            if pool and len(chosen) < max_studies:
                record = pool.pop(0)
                chosen[record["study_id"]] = record
    for record in records:  # top up with studies positive for nothing, if needed
        if len(chosen) >= max_studies:
            break
        chosen.setdefault(record["study_id"], record)
    return list(chosen.values())


def load_chexpert_dataset(script_args):
    """The round's dataset from `OraPOScriptArguments` (train_csv, image_root, max_studies, class_balanced)."""
    if not script_args.train_csv:
        raise OrapoError("data_missing", "The recipe names no training data: set train_csv to a CheXpert Plus style CSV.")
    records = read_chexpert_csv(script_args.train_csv, image_root=script_args.image_root)
    records = select_studies(
        records, max_studies=script_args.max_studies, class_balanced=script_args.class_balanced, seed=script_args.selection_seed
    )
    return build_training_dataset(records, prompt_text=script_args.prompt_text)
