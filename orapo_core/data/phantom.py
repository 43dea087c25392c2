"""PhantomCXR: synthetic frontal chest radiographs with known findings and paired reports.

Real chest X-ray data cannot ship with the project and cannot be downloaded, so
tests, the starter model and the first training rounds run on studies made
here from a seed. Findings are drawn independently at CheXpert-like
prevalences (rare findings really rare, about a third of studies normal), then
drawn into the image (`phantom_render`) and written up as a radiology report
whose sentences carry their own CheXpert labels (`phantom_reports`), so the
ground truth of image, text and labels is one object. Same seed, same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.data.phantom_io import DatasetWriter
from orapo_core.data.phantom_render import CONSPICUITY, DEFAULT_CONSPICUITY, render
from orapo_core.data.phantom_reports import write_report
from orapo_core.errors import OrapoError

# Finding kind -> the CheXpert observation it is labelled as.
FINDING_KINDS: dict[str, str] = {
    "cardiomegaly": "Cardiomegaly",
    "enlarged_cardiomediastinum": "Enlarged Cardiomediastinum",
    "lung_opacity": "Lung Opacity",
    "lung_lesion": "Lung Lesion",
    "edema": "Edema",
    "consolidation": "Consolidation",
    "pneumonia": "Pneumonia",
    "atelectasis": "Atelectasis",
    "pneumothorax": "Pneumothorax",
    "pleural_effusion": "Pleural Effusion",
    "pleural_other": "Pleural Other",
    "fracture": "Fracture",
    "support_devices": "Support Devices",
}

# Per-study probabilities. Common findings at 10-25%, rare ones at 2-5% as in
# CheXpert Plus; with independent draws about a third of studies are normal.
DEFAULT_PREVALENCE: dict[str, float] = {
    "cardiomegaly": 0.18,
    "enlarged_cardiomediastinum": 0.06,
    "lung_opacity": 0.10,
    "lung_lesion": 0.04,
    "edema": 0.10,
    "consolidation": 0.10,
    "pneumonia": 0.06,
    "atelectasis": 0.15,
    "pneumothorax": 0.04,
    "pleural_effusion": 0.20,
    "pleural_other": 0.02,
    "fracture": 0.03,
    "support_devices": 0.20,
}

# How often a present finding is reported with hedging (label -1); hedged
# findings are also drawn milder, as they are when a reader hesitates.
UNCERTAIN_RATE: dict[str, float] = {
    "cardiomegaly": 0.1, "enlarged_cardiomediastinum": 0.2, "lung_opacity": 0.1, "lung_lesion": 0.15,
    "edema": 0.15, "consolidation": 0.15, "pneumonia": 0.4, "atelectasis": 0.15, "pneumothorax": 0.1,
    "pleural_effusion": 0.1, "pleural_other": 0.0, "fracture": 0.15, "support_devices": 0.0,
}

DEVICES = ("ett", "ng", "cvc", "picc", "pacemaker")


@dataclass(frozen=True)
class Finding:
    """One drawn finding. `side` is the patient's side (right is on the image left)."""

    kind: str
    side: str | None = None  # "right", "left", "bilateral"
    severity: str | None = None  # small/moderate/large, mild/moderate/severe, mild/marked
    location: str | None = None  # zone (upper/middle/lower), rib number, or device name
    variant: str | None = None  # lobar/patchy, plate/lobar, nodule/mass, thickening/apical_cap/plaques
    certain: bool = True
    size: float | None = None  # cardiothoracic ratio, or lesion radius (normalised units)


@dataclass
class PhantomStudy:
    """A generated study: the image, its ground truth and its report."""

    image: np.ndarray  # float32 in [0, 1], bright = dense (MONOCHROME2 sense)
    findings: list[Finding]
    report_findings: str
    report_impression: str
    labels: dict[str, int | None]
    view: str  # "PA" or "AP"
    masks: dict[str, np.ndarray] = field(default_factory=dict)
    landmarks: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def image_uint16(self, bits: int = 16) -> np.ndarray:
        return np.round(self.image * (2**bits - 1)).astype(np.uint16)


def _normalise_key(key: str) -> str:
    return key.strip().lower().replace(" ", "_").replace("-", "_")


_ALIASES = {_normalise_key(obs): kind for kind, obs in FINDING_KINDS.items()} | {
    "effusion": "pleural_effusion", "lesion": "lung_lesion", "nodule": "lung_lesion", "opacity": "lung_opacity",
    "devices": "support_devices", "ecm": "enlarged_cardiomediastinum", "ptx": "pneumothorax",
}


def resolve_prevalence(overrides: Mapping[str, float] | None = None) -> dict[str, float]:
    """Defaults with `overrides` applied; keys may be finding kinds or CheXpert names."""
    prevalence = dict(DEFAULT_PREVALENCE)
    for key, value in (overrides or {}).items():
        kind = _ALIASES.get(_normalise_key(key))
        if kind is None:
            raise OrapoError("unknown_finding", f"'{key}' is not a PhantomCXR finding; use one of: {', '.join(FINDING_KINDS)}.")
        value = float(value)
        if not 0.0 <= value <= 1.0:
            raise OrapoError("bad_prevalence", f"the prevalence of {kind} must be between 0 and 1, not {value}.")
        prevalence[kind] = value
    return prevalence


def _pick(rng: np.random.Generator, options: dict[str, float]) -> str:
    keys = list(options)
    p = np.asarray([options[k] for k in keys], dtype=np.float64)
    return keys[int(rng.choice(len(keys), p=p / p.sum()))]


def sample_findings(rng: np.random.Generator, prevalence: Mapping[str, float]) -> list[Finding]:
    findings: list[Finding] = []
    # A fixed order and a fixed number of draws per kind keep a seed's studies stable.
    for kind in FINDING_KINDS:
        present = rng.random() < prevalence.get(kind, 0.0)
        certain = rng.random() >= UNCERTAIN_RATE[kind]
        side = _pick(rng, {"right": 0.55, "left": 0.45})
        if not present:
            continue
        if kind == "cardiomegaly":
            sev = "mild" if not certain else _pick(rng, {"mild": 0.5, "moderate": 0.3, "severe": 0.2})
            lo, hi = {"mild": (0.56, 0.59), "moderate": (0.59, 0.63), "severe": (0.63, 0.68)}[sev]
            ctr = rng.uniform(0.54, 0.57) if not certain else rng.uniform(lo, hi)
            findings.append(Finding(kind, severity=sev, certain=certain, size=float(ctr)))
        elif kind == "enlarged_cardiomediastinum":
            findings.append(Finding(kind, severity=_pick(rng, {"mild": 0.6, "marked": 0.4}), certain=certain))
        elif kind in ("consolidation", "pneumonia", "lung_opacity"):
            variant = "patchy" if kind == "lung_opacity" else _pick(rng, {"lobar": 0.6, "patchy": 0.4} if kind == "consolidation" else {"lobar": 0.4, "patchy": 0.6})
            zone = _pick(rng, {"lower": 0.55, "upper": 0.25, "middle": 0.2})
            findings.append(Finding(kind, side=side, location=zone, variant=variant, certain=certain))
        elif kind == "atelectasis":
            variant = _pick(rng, {"plate": 0.7, "lobar": 0.3})
            where = side if variant == "lobar" or not certain else _pick(rng, {side: 0.6, "bilateral": 0.4})
            findings.append(Finding(kind, side=where, location="lower", variant=variant, certain=certain))
        elif kind == "edema":
            sev = "mild" if not certain else _pick(rng, {"mild": 0.4, "moderate": 0.4, "severe": 0.2})
            findings.append(Finding(kind, side="bilateral", severity=sev, certain=certain))
        elif kind == "lung_lesion":
            variant = _pick(rng, {"nodule": 0.7, "mass": 0.3})
            radius = rng.uniform(0.014, 0.022) if variant == "nodule" else rng.uniform(0.04, 0.06)
            zone = _pick(rng, {"upper": 0.4, "middle": 0.3, "lower": 0.3})
            findings.append(Finding(kind, side=side, location=zone, variant=variant, certain=certain, size=float(radius)))
        elif kind == "pneumothorax":
            sev = "small" if not certain else _pick(rng, {"small": 0.5, "moderate": 0.3, "large": 0.2})
            findings.append(Finding(kind, side=side, severity=sev, certain=certain))
        elif kind == "pleural_effusion":
            sev = "small" if not certain else _pick(rng, {"small": 0.5, "moderate": 0.35, "large": 0.15})
            where = side if not certain else _pick(rng, {side: 0.7, "bilateral": 0.3})
            findings.append(Finding(kind, side=where, severity=sev, certain=certain))
        elif kind == "pleural_other":
            findings.append(Finding(kind, side=side, variant=_pick(rng, {"thickening": 0.5, "apical_cap": 0.25, "plaques": 0.25})))
        elif kind == "fracture":
            findings.append(Finding(kind, side=side, location=str(int(rng.integers(4, 9))), certain=certain))
        elif kind == "support_devices":
            count = int(rng.choice([1, 2, 3], p=[0.5, 0.35, 0.15]))
            for device in rng.choice(DEVICES, size=count, replace=False, p=[0.3, 0.25, 0.2, 0.1, 0.15]):
                findings.append(Finding(kind, location=str(device)))
    return findings


def generate_study(rng_or_seed: np.random.Generator | int, size: int = 512, prevalence: Mapping[str, float] | None = None,
                   conspicuity: str | None = None) -> PhantomStudy:
    """Draws findings, renders the image and writes the report for one study.

    `conspicuity` ("clear", the default, or "subtle", the first rendering) sets how visible the small findings
    are drawn; it changes no random draw, so a seed gives the same findings and report either way."""
    conspicuity = conspicuity or DEFAULT_CONSPICUITY
    if conspicuity not in CONSPICUITY:
        raise OrapoError("bad_conspicuity", f"conspicuity must be one of {', '.join(CONSPICUITY)}, not {conspicuity!r}.")

    if size < 64 or size > 4096:
        raise OrapoError("bad_size", f"PhantomCXR images must be 64 to 4096 pixels wide, not {size}.")
    rng = rng_or_seed if isinstance(rng_or_seed, np.random.Generator) else np.random.default_rng(int(rng_or_seed))
    findings = sample_findings(rng, resolve_prevalence(prevalence))
    # Portable AP films go with the sick: lines, tubes and fluid.
    sick = any(f.kind in ("support_devices", "edema", "pleural_effusion") for f in findings)
    view = "AP" if rng.random() < (0.7 if sick else 0.2) else "PA"
    image, masks, landmarks = render(findings, rng, size, conspicuity)
    text_findings, text_impression, labels = write_report(findings, rng, view)
    return PhantomStudy(image, findings, text_findings, text_impression, labels, view, masks, landmarks)


def iter_studies(n: int, seed: int, size: int = 512, prevalence: Mapping[str, float] | None = None,
                 conspicuity: str | None = None) -> Iterable[tuple[int, PhantomStudy]]:
    """Study i depends only on (seed, i), so any slice of a dataset can be regenerated alone."""
    for i in range(n):
        yield i, generate_study(np.random.default_rng([seed, i]), size=size, prevalence=prevalence,
                                conspicuity=conspicuity)


def write_dataset(
    out_dir: str | Path,
    n: int,
    seed: int = 0,
    size: int = 512,
    formats: Iterable[str] = ("png",),
    prevalence: Mapping[str, float] | None = None,
    progress: Callable[[int, int], None] | None = None,
    png_bits: int = 8,
    conspicuity: str | None = None,
) -> Path:
    """Writes n studies and a CheXpert-Plus-layout CSV under out_dir; returns the CSV path."""
    if n < 0:
        raise OrapoError("bad_count", f"the number of studies must be zero or more, not {n}.")
    with DatasetWriter(Path(out_dir), seed=seed, formats=tuple(formats), png_bits=png_bits) as writer:
        for i, study in iter_studies(n, seed, size=size, prevalence=prevalence, conspicuity=conspicuity):
            writer.add(i, study)
            if progress is not None:
                progress(i + 1, n)
    return writer.csv_path
