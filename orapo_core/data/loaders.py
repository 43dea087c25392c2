"""Readers for local copies of CheXpert Plus, MIMIC-CXR, IU X-ray and PhantomCXR.

Each public dataset is read in the layout it is distributed in -- nothing is
converted or downloaded -- and every reader ends in the same `StudyRecord`.
Labels come from the dataset's own CheXpert/CheXbert label files when a copy
has them; otherwise the report is labelled with FactS, imported only then, so
a dataset that ships labels never needs the labeler at all. A CheXpert Plus
layout CSV may carry a correction's columns too (`CORRECTION_COLUMNS`, what a
training round's CSV adds): they are read in the same pass, into each record's
`extra`.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

from orapo_core.data.phantom_io import CSV_NAME
from orapo_core.data.records import CHEXPERT_14, StudyRecord, empty_labels, parse_label, split_for
from orapo_core.errors import OrapoError

Labeler = Callable[[str], dict]
KINDS = ("chexpert_plus", "mimic_cxr", "iu_xray", "phantom")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".dcm")
# A study's correction, when the CSV has one: the corrected report (the oracle), the pair it makes (corrected over
# drafted) and that pair's id in the app's database. Read into `StudyRecord.extra`; they only matter to training.
CORRECTION_COLUMNS = ("oracle_report", "clinician_chosen", "clinician_rejected", "pair_id")
#: Exactly the columns a round writes (`app.services.rounds.data.write_training_csv`), each of which this reader reads:
#: the study key, its split, image, report sections, the 14 labels, and the correction.
ROUND_COLUMNS = ("id", "split", "path_to_image", "section_findings", "section_impression", *CHEXPERT_14,
                 *CORRECTION_COLUMNS)

csv.field_size_limit(1 << 28)  # report cells in CheXpert Plus exceed the 128 KiB default


def _open_text(path: Path) -> io.TextIOWrapper:
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with _open_text(path) as handle:
        yield from csv.DictReader(handle)


def _header(path: Path) -> list[str]:
    with _open_text(path) as handle:
        return next(csv.reader(handle), [])


def _find(root: Path, names: tuple[str, ...], depth: int = 3) -> Path | None:
    """The first file with one of these names in root or up to `depth` folders below it."""
    for level in range(depth + 1):
        for name in names:
            hits = sorted(root.glob("/".join(["*"] * level + [name])))
            if hits:
                return hits[0]
    return None


def _labels_from(row: dict[str, str]) -> dict[str, int | None] | None:
    if not all(name in row for name in CHEXPERT_14):
        return None
    return {name: parse_label(row[name]) for name in CHEXPERT_14}


def _facts_labeler() -> Labeler:
    try:
        from orapo_core.facts import label_report  # noqa: PLC0415 -- optional: try/except ImportError
    except ImportError as exc:
        raise OrapoError("facts_unavailable", f"this dataset has no label file and the FactS labeler cannot be imported ({exc}).") from None
    return lambda text: label_report(text, schema="chexpert")


class _LazyLabeler:
    """Builds the FactS labeler on first use only."""

    def __init__(self, labeler: Labeler | None):
        self._labeler = labeler

    def __call__(self, findings: str, impression: str) -> dict[str, int | None]:
        if self._labeler is None:
            self._labeler = _facts_labeler()
        raw = self._labeler("\n".join(t for t in (findings, impression) if t)) or {}
        labels = empty_labels()
        labels.update({name: parse_label(raw.get(name)) for name in CHEXPERT_14})
        return labels


def _split(value: str | None, key: str) -> str:
    value = (value or "").strip().lower()
    return {"validate": "valid", "validation": "valid", "val": "valid"}.get(value, value) or split_for(key)


# --- CheXpert Plus (and PhantomCXR, which writes the same layout) -------------------------------


def _resolve_image(root: Path, rel: str) -> Path:
    """CheXpert Plus lists .jpg names while the PNG release keeps them under PNG/ as .png."""
    rel_path = Path(rel)
    for base in (root, root / "PNG", root / "png"):
        for candidate in (rel_path, rel_path.with_suffix(".png"), rel_path.with_suffix(".jpg")):
            if (base / candidate).is_file():
                return base / candidate
    return root / rel_path


def _label_files(root: Path) -> list[Path]:
    """CheXbert/CheXpert label files shipped beside the CSV, impression labels first."""
    folders = [root, root / "chexbert_labels", root / "labels"]
    files = [p for d in folders if d.is_dir() for p in sorted(d.iterdir()) if p.suffix in (".csv", ".json", ".jsonl")]
    files = [p for p in files if "label" in str(p.relative_to(root)).lower() or "fixed" in p.name]
    return sorted(files, key=lambda p: (0 if "impression" in p.name else 1 if "report" in p.name else 2, p.name))


def _load_label_table(files: list[Path]) -> dict[str, dict[str, int | None]]:
    table: dict[str, dict[str, int | None]] = {}
    for path in files:
        if path.suffix == ".csv":
            rows = _rows(path) if "path_to_image" in _header(path) else iter(())
        else:
            text = path.read_text(encoding="utf-8").strip()
            rows = json.loads(text) if text.startswith("[") else (json.loads(line) for line in text.splitlines() if line.strip())
        for row in rows:
            labels = _labels_from({k: ("" if v is None else str(v)) for k, v in row.items()})
            if labels is not None and "path_to_image" in row:
                table.setdefault(str(row["path_to_image"]), labels)
    return table


def _plus_csv(root: Path) -> Path | None:
    preferred = root / "df_chexpert_plus_240401.csv"
    if preferred.is_file():
        return preferred
    for path in sorted(root.glob("*.csv")):
        header = _header(path)
        if "path_to_image" in header and "section_findings" in header:
            return path
    return None


def load_chexpert_plus(path: Path, labeler: Labeler | None = None, source: str = "chexpert_plus") -> list[StudyRecord]:
    csv_path = path if path.is_file() else _plus_csv(path)
    if csv_path is None:
        raise OrapoError("dataset_layout_unknown", f"no CheXpert Plus CSV (with path_to_image and section_findings) in {path}.")
    root = csv_path.parent
    studies: dict[str, StudyRecord] = {}
    rels: dict[str, list[str]] = {}
    for row in _rows(csv_path):
        rel = row.get("path_to_image") or row.get("path_to_dcm") or ""
        # One report per study folder: CheXpert Plus repeats it on every image row.
        key = row.get("id") or str(Path(rel).parent)
        record = studies.get(key)
        if record is None:
            record = StudyRecord(
                study_id=key, image_paths=[], view=(row.get("ap_pa") or row.get("frontal_lateral") or None),
                findings=(row.get("section_findings") or "").strip(), impression=(row.get("section_impression") or "").strip(),
                labels=_labels_from(row) or {}, source=source, split=_split(row.get("split"), key),
                patient_id=row.get("deid_patient_id") or None,
            )
            studies[key] = record
        for column in CORRECTION_COLUMNS:
            value = (row.get(column) or "").strip()
            if value:
                record.extra.setdefault(column, value)
        if rel:
            record.image_paths.append(_resolve_image(root, rel))
            rels.setdefault(key, []).append(rel)
    unlabelled = [r for r in studies.values() if not r.labels]
    if unlabelled:
        table = _load_label_table(_label_files(root))
        label = _LazyLabeler(labeler)
        for record in unlabelled:
            shipped = next((table[rel] for rel in rels.get(record.study_id, []) if rel in table), None)
            record.labels = shipped or label(record.findings, record.impression)
    return list(studies.values())


# --- MIMIC-CXR ---------------------------------------------------------------------------------

_SECTION = re.compile(r"^\s*([A-Z][A-Z /&()-]{2,}):", re.MULTILINE)


def parse_sections(text: str) -> dict[str, str]:
    """MIMIC-style `HEADER:` sections, whitespace collapsed; keys upper-case."""
    marks = list(_SECTION.finditer(text))
    sections = {}
    for mark, following in zip(marks, marks[1:] + [None]):
        body = text[mark.end(): following.start() if following else len(text)]
        sections[mark.group(1).strip()] = " ".join(body.split())
    return sections


def _files_dirs(root: Path) -> list[Path]:
    if root.name == "files":
        return [root]
    return [p for level in range(4) for p in sorted(root.glob("/".join(["*"] * level + ["files"]))) if p.is_dir()]


def _csv_table(path: Path | None, key: str) -> dict[str, dict[str, str]]:
    return {} if path is None else {row[key]: row for row in _rows(path) if row.get(key)}


def load_mimic_cxr(path: Path, labeler: Labeler | None = None) -> list[StudyRecord]:
    files_dirs = _files_dirs(path)
    if not files_dirs:
        raise OrapoError("dataset_layout_unknown", f"no MIMIC-CXR files/ folder in {path}.")
    search_root = path.parent if path.name == "files" else path
    labels_csv = _find(search_root, ("mimic-cxr-2.0.0-chexpert.csv", "mimic-cxr-2.0.0-chexpert.csv.gz"))
    label_rows = _csv_table(labels_csv, "study_id")
    meta = _csv_table(_find(search_root, ("mimic-cxr-2.0.0-metadata.csv", "mimic-cxr-2.0.0-metadata.csv.gz")), "dicom_id")
    splits = _csv_table(_find(search_root, ("mimic-cxr-2.0.0-split.csv", "mimic-cxr-2.0.0-split.csv.gz")), "dicom_id")
    reports: dict[str, Path] = {}
    images: dict[str, list[Path]] = {}
    for files in files_dirs:
        for report in files.glob("p*/p*/s*.txt"):
            reports.setdefault(report.stem, report)
        for study_dir in files.glob("p*/p*/s*"):
            if study_dir.is_dir():
                found = sorted(p for p in study_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
                images.setdefault(study_dir.name, []).extend(found)
    label = _LazyLabeler(labeler)
    records = []
    for study in sorted(set(reports) | set(images)):
        numeric = study.lstrip("s")
        sections = parse_sections(reports[study].read_text(encoding="utf-8", errors="replace")) if study in reports else {}
        findings, impression = sections.get("FINDINGS", ""), sections.get("IMPRESSION", "")
        row = label_rows.get(numeric)
        if row is not None:
            labels = empty_labels() | {k: parse_label(row.get(k)) for k in CHEXPERT_14}
        elif findings or impression:
            labels = label(findings, impression)
        else:
            continue  # neither a report nor labels: nothing to learn from
        paths = images.get(study, [])
        views = [meta.get(p.stem, {}).get("ViewPosition", "") for p in paths]
        view = next((v for v in ("PA", "AP") if v in views), next((v for v in views if v), None))
        split_row = next((splits[p.stem] for p in paths if p.stem in splits), None)
        patient = (reports.get(study) or (paths[0] if paths else Path("p0/s"))).parent.name
        records.append(StudyRecord(
            study_id=study, image_paths=paths, view=view, findings=findings, impression=impression, labels=labels,
            source="mimic_cxr", split=_split(split_row.get("split") if split_row else None, study), patient_id=patient,
        ))
    return records


# --- IU X-ray (Open-i) ---------------------------------------------------------------------------


def _iu_xml_files(root: Path) -> list[Path]:
    return [root] if root.is_file() else sorted(root.rglob("*.xml"))


def load_iu_xray(path: Path, labeler: Labeler | None = None) -> list[StudyRecord]:
    base = path.parent if path.is_file() else path
    pngs = {p.stem: p for p in sorted(base.rglob("*.png"))}
    label = _LazyLabeler(labeler)
    records = []
    for xml_path in _iu_xml_files(path):
        try:
            tree = ET.parse(xml_path)
        except ET.ParseError:
            continue
        sections = {(el.get("Label") or "").upper(): " ".join((el.text or "").split()) for el in tree.iter("AbstractText")}
        if not sections:
            continue
        uid = tree.find(".//uId")
        study_id = (uid.get("id") if uid is not None else None) or xml_path.stem
        image_ids = [el.get("id") for el in tree.iter("parentImage") if el.get("id")]
        findings, impression = sections.get("FINDINGS", ""), sections.get("IMPRESSION", "")
        records.append(StudyRecord(
            study_id=study_id, image_paths=[pngs[i] for i in image_ids if i in pngs], view=None,
            findings=findings, impression=impression, labels=label(findings, impression),
            source="iu_xray", split=split_for(study_id),
        ))
    return records


# --- detection -----------------------------------------------------------------------------------


def detect_layout(path: str | Path) -> str:
    """Which of KINDS the folder (or file) at `path` is laid out as."""
    path = Path(path)
    if not path.exists():
        raise OrapoError("dataset_not_found", f"{path} does not exist.")
    if path.is_file():
        if path.name == CSV_NAME:
            return "phantom"
        if path.suffix == ".csv" and "path_to_image" in _header(path):
            return "chexpert_plus"
        if path.suffix == ".xml":
            return "iu_xray"
    else:
        if (path / CSV_NAME).is_file():
            return "phantom"
        if _plus_csv(path) is not None:
            return "chexpert_plus"
        if _files_dirs(path) or _find(path, ("mimic-cxr-2.0.0-chexpert.csv", "mimic-cxr-2.0.0-chexpert.csv.gz"), depth=1):
            return "mimic_cxr"
        for xml_path in path.rglob("*.xml"):
            head = xml_path.read_text(encoding="utf-8", errors="replace")[:20000]
            if "AbstractText" in head:
                return "iu_xray"
    raise OrapoError("dataset_layout_unknown", f"{path} is not a CheXpert Plus, MIMIC-CXR, IU X-ray or PhantomCXR layout; name the kind or check the folder.")


def load_dataset(path: str | Path, kind: str = "auto", labeler: Labeler | None = None) -> list[StudyRecord]:
    """All studies under `path` as StudyRecords; `labeler(text) -> labels` replaces FactS where labels are missing."""
    path = Path(path)
    if not path.exists():
        raise OrapoError("dataset_not_found", f"{path} does not exist.")
    if kind == "auto":
        kind = detect_layout(path)
    if kind == "phantom":
        return load_chexpert_plus(path / CSV_NAME if path.is_dir() else path, labeler, source="phantom")
    if kind == "chexpert_plus":
        return load_chexpert_plus(path, labeler)
    if kind == "mimic_cxr":
        return load_mimic_cxr(path, labeler)
    if kind == "iu_xray":
        return load_iu_xray(path, labeler)
    raise OrapoError("unknown_dataset_kind", f"'{kind}' is not a dataset kind; use auto or one of: {', '.join(KINDS)}.")
