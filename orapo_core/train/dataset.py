"""The training dataset of a round: one row per study, in the columns `OraPOTrainer` and FactS read.

Columns: ``prompt`` (one conversational user turn; TRL puts the image before the
text, which is exactly `orapo_core.models.prompt.build_messages`), ``image``,
``study_id``, ``labels`` (JSON of the 14 CheXpert observations: what FactS scores
against), ``reference_report``, ``oracle_report`` (the clinician's correction
when there is one, else the reference report) and, when any record has them,
``clinician_chosen``/``clinician_rejected``.

Studies are read by `orapo_core.data.load_dataset`, like every other part of
the product, so a round trains on any layout it reads; the correction columns a
round's CSV adds to the CheXpert Plus layout come with them, read in the same
pass (`orapo_core.data.loaders.CORRECTION_COLUMNS`).
"""

from __future__ import annotations

import csv
import functools
import json
import random
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from orapo_core.data.loaders import load_dataset
from orapo_core.data.records import CHEXPERT_14, StudyRecord
from orapo_core.errors import OrapoError
from orapo_core.models.prompt import REPORT_PROMPT

if TYPE_CHECKING:
    from datasets import Dataset

    from orapo_core.train.config import OraPOScriptArguments

# A study to train on: a StudyRecord or a row's dict (the columns of the module's docstring).
TrainingRecord = StudyRecord | Mapping[str, Any]
_Record = TypeVar("_Record", bound=TrainingRecord)


def oracle_for(record: Mapping[str, Any]) -> str:
    """The oracle of a study: the clinician's corrected report if there is one, else the reference report.

    The one rule for the chosen answer: the dataset writes it into ``oracle_report`` and the trainer reads rows
    through it too (`OraPOTrainer.oracle_text`), so a row built elsewhere is judged the same way."""
    corrected = (record.get("oracle_report") or "").strip()
    return corrected or (record.get("reference_report") or "").strip()


def _as_row(record: TrainingRecord) -> dict[str, Any]:
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


def build_training_dataset(records: Iterable[TrainingRecord], *, prompt_text: str | None = None) -> Dataset:
    """A `datasets.Dataset` from dicts (keys as the columns above; ``image`` a path or PIL image) or StudyRecords."""
    from datasets import Dataset, Image

    prompt_text = prompt_text or REPORT_PROMPT
    rows = [_as_row(r) for r in records]
    if not rows:
        raise OrapoError("no_studies", "The round has no studies to train on: check the CSV or the selection.")
    with_clinician = any(r.get("clinician_chosen") and r.get("clinician_rejected") for r in rows)
    columns: dict[str, list[Any]] = {
        k: [] for k in ("prompt", "image", "study_id", "labels", "reference_report", "oracle_report")
    }
    if with_clinician:
        columns["clinician_chosen"], columns["clinician_rejected"] = [], []
    for i, row in enumerate(rows):
        if row.get("image") is None:
            raise OrapoError(
                "no_image", f"Study {row.get('study_id', i)!r} has no image: every training study needs one."
            )
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


def _check_csv(path: Path) -> None:
    with path.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle), [])
    missing = {"path_to_image", "section_findings", "section_impression"} - set(header)
    if missing:
        raise OrapoError(
            "data_invalid",
            f"{path.name} lacks the column(s) {', '.join(sorted(missing))}: a CheXpert Plus CSV needs "
            "path_to_image, section_findings and section_impression.",
        )


def load_training_records(
    path: str | Path, *, kind: str = "auto", image_root: str | Path | None = None, split: str | None = None
) -> list[StudyRecord]:
    """The studies of a dataset (`orapo_core.data.load_dataset`, any layout it reads), a CSV's corrections with them.

    ``image_root`` re-roots images that the CSV lists relative to its own folder; ``split`` keeps only the
    studies of that split (train/valid/test), none: all of them.
    """
    path = Path(path)
    if not path.exists():
        raise OrapoError("data_missing", f"The training data {path} does not exist.")
    if path.is_file() and path.suffix == ".csv" and kind in ("auto", "chexpert_plus", "phantom"):
        _check_csv(path)
    records = load_dataset(path, kind=kind)
    csv_path = path if path.is_file() else next(iter(sorted(path.glob("*.csv"))), None)
    if csv_path is not None and csv_path.suffix == ".csv":
        if image_root is not None:
            base, root = csv_path.parent.resolve(), Path(image_root)
            for record in records:
                record.image_paths = [
                    root / p.resolve().relative_to(base) if p.resolve().is_relative_to(base) else p
                    for p in record.image_paths
                ]
    if split is not None:
        records = [r for r in records if r.split == split]
    return records


def _study_key(record: TrainingRecord) -> Hashable:
    return record["study_id"] if isinstance(record, Mapping) else record.study_id


def _labels(record: TrainingRecord) -> Mapping[str, int | None]:
    return (record.get("labels") if isinstance(record, Mapping) else record.labels) or {}


def select_studies(
    records: Sequence[_Record], *, max_studies: int | None, class_balanced: bool, seed: int = 0
) -> list[_Record]:
    """At most `max_studies` records (StudyRecords or dicts); class-balanced means round-robin over the observations' positive studies."""
    rng = random.Random(seed)
    records = list(records)
    rng.shuffle(records)
    if max_studies is None or max_studies >= len(records):
        return records
    if not class_balanced:
        return records[:max_studies]
    pools = {name: [r for r in records if _labels(r).get(name) == 1] for name in CHEXPERT_14}
    chosen: dict[Hashable, _Record] = {}
    while len(chosen) < max_studies and any(pools.values()):
        for name in CHEXPERT_14:
            pool = pools[name]
            while pool and _study_key(pool[0]) in chosen:
                pool.pop(0)
            if pool and len(chosen) < max_studies:
                record = pool.pop(0)
                chosen[_study_key(record)] = record
    for record in records:  # top up with studies positive for nothing, if needed
        if len(chosen) >= max_studies:
            break
        chosen.setdefault(_study_key(record), record)
    return list(chosen.values())


def load_round_dataset(script_args: OraPOScriptArguments) -> Dataset:
    """The round's dataset from `OraPOScriptArguments` (train_csv, dataset_kind, split, image_root, max_studies, class_balanced)."""
    if not script_args.train_csv:
        raise OrapoError(
            "data_missing",
            "The recipe names no training data: set train_csv to a CheXpert Plus style CSV or a dataset folder.",
        )
    records = load_training_records(
        script_args.train_csv, kind=script_args.dataset_kind, image_root=script_args.image_root, split=script_args.split
    )
    records = select_studies(
        records,
        max_studies=script_args.max_studies,
        class_balanced=script_args.class_balanced,
        seed=script_args.selection_seed,
    )
    return build_training_dataset(records, prompt_text=script_args.prompt_text)


def without_sentences_stating(report: str, findings: Collection[str]) -> str:
    """`report` with each sentence that states or hedges one of `findings` (CheXpert names, FactS labels of the
    sentence) taken out, the rest left as written. Remembered: a round asks again for the same oracle reports at
    every visit of their studies."""
    return _without_sentences_stating(report, tuple(sorted(findings))) if findings else report


@functools.lru_cache(maxsize=8192)
def _without_sentences_stating(report: str, findings: tuple[str, ...]) -> str:
    from orapo_core.facts import label_report  # noqa: PLC0415 -- the labeller is loaded only when used
    from orapo_core.facts.text import split_sentences  # noqa: PLC0415

    kept, last = [], 0
    for sentence in split_sentences(report):
        labels = label_report(sentence.text)
        if any(labels.get(name) in (1, -1) for name in findings):
            kept.append(report[last : sentence.start])
            last = sentence.end
    kept.append(report[last:])
    return "".join(kept)


def without_unread_additions(dataset: Dataset, findings: Iterable[str]) -> tuple[Dataset, int]:
    """`dataset` with the corrections that add one of `findings` left unapplied: on each row with a clinician's
    draft (``clinician_rejected``) that does not state such a finding, the sentences stating it are taken out of
    ``oracle_report`` and ``clinician_chosen``, and its positive or hedged label out of ``labels``, so no term of
    the round (FactS' reward, DPO's chosen answer, the oracle NLL) pulls the model toward writing it. Every other
    correction, a removal of the finding included, applies as signed; rows without a draft (replay) are left as
    they are. Returns the dataset and how many rows changed. A clinician's pair whose chosen answer then reads as
    its draft (the same words) gets the draft as its chosen answer, so the pair miner drops it."""
    from orapo_core.facts import label_report  # noqa: PLC0415 -- the labeller is loaded only when used
    from orapo_core.facts.labels import label_value  # noqa: PLC0415

    wanted = sorted(set(findings))
    if not wanted or "clinician_rejected" not in dataset.column_names:
        return dataset, 0
    oracles, chosens, labels = list(dataset["oracle_report"]), list(dataset["clinician_chosen"]), []
    changed = 0
    for i, (draft, row_labels) in enumerate(zip(dataset["clinician_rejected"], dataset["labels"], strict=True)):
        stated = label_report(draft) if draft else {}
        unapplied = [f for f in wanted if draft and stated.get(f) not in (1, -1)]
        before = (oracles[i], chosens[i])
        if unapplied:
            oracles[i] = without_sentences_stating(oracles[i], unapplied)
            if chosens[i]:
                chosens[i] = without_sentences_stating(chosens[i], unapplied)
                if chosens[i].split() == draft.split():
                    chosens[i] = draft
        if (oracles[i], chosens[i]) != before:
            changed += 1
            parsed = json.loads(row_labels) if row_labels else {}
            # its positive (or hedged) label goes with its sentences; a negation the report keeps stays
            row_labels = json.dumps(
                {k: v for k, v in parsed.items() if k not in unapplied or label_value(v) not in (1, -1)}
            )
        labels.append(row_labels)
    if not changed:
        return dataset, 0
    for name, values in (("oracle_report", oracles), ("clinician_chosen", chosens), ("labels", labels)):
        dataset = dataset.remove_columns(name).add_column(name, values)
    return dataset, changed
