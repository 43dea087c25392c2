"""One study, whatever dataset it came from.

CheXpert Plus, MIMIC-CXR, IU X-ray and PhantomCXR spell the same facts four
ways; every loader ends in a `StudyRecord` so that training, evaluation and
export never need to know which one they are reading.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

from orapo_core.facts.ontology import CHEXPERT_14  # the one label space (stdlib-only, cheap to import)
from orapo_core.report_layout import report_text

SPLITS = ("train", "valid", "test")


@dataclass
class StudyRecord:
    """A study: its images, its report sections and CheXpert-convention labels.

    `labels` maps each of `CHEXPERT_14` to 1 (positive), 0 (negative),
    -1 (uncertain) or None (not mentioned).
    """

    study_id: str
    image_paths: list[Path]
    view: str | None
    findings: str
    impression: str
    labels: dict[str, int | None]
    source: str
    split: str
    patient_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def report(self) -> str:
        """The reference report in the project's layout (`orapo_core.report_layout.report_text`)."""
        return report_text(self.findings, self.impression)


def empty_labels() -> dict[str, int | None]:
    return {name: None for name in CHEXPERT_14}


def parse_label(value: object) -> int | None:
    """A CheXpert cell ("1.0", "-1", "", "nan", 0.0 ...) as 1, 0, -1 or None."""
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("", "nan", "none", "null"):
        return None
    try:
        number = int(float(text))
    except ValueError:
        return None
    return number if number in (-1, 0, 1) else None


def format_label(value: int | None) -> str:
    """The CheXpert CSV spelling: 1.0, 0.0, -1.0 or an empty cell."""
    return "" if value is None else f"{float(value):.1f}"


def split_for(key: str) -> str:
    """A deterministic 80/10/10 train/valid/test split from a stable key.

    crc32 rather than `hash()` because Python salts string hashes per process.
    """
    bucket = zlib.crc32(key.encode("utf-8")) % 100
    return "train" if bucket < 80 else ("valid" if bucket < 90 else "test")
