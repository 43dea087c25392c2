"""What the drafting model may be shown: chest radiographs only. Everything else is stored, never drafted.

The served model writes chest radiograph reports; shown a CT slice, an MR image,
an ultrasound or a wrist film it still writes one, fluently and wrongly. So
ingest decides, from what the file says and from cheap facts of its pixels,
whether an image is out of the model's scope, and says why in a few words
(`out_of_scope`), which the app stores with the study (`studies.not_drafted`)
and turns into the reader's sentence (`not_drafted_sentence`): "Study 3 is a
CT (Modality CT), not a chest radiograph: stored, not drafted."

The rules, in order:

1. DICOM Modality. Chest radiography is CR (computed radiography) or DX
   (digital radiography); DR is accepted too, a code some vendors write for DX
   although DICOM never defined it. Anything else (CT, MR, US, NM, MG, XA, RF,
   PX dental panoramic, ...) is out. A missing Modality, and OT ("other", what
   secondary captures of scanned films often say), tell nothing: the image is
   judged from its pixels, as a PNG or JPEG is.
2. DICOM Body Part Examined, when present and not empty: it must name the chest
   (case-insensitive; a word starting CHEST or THORA, or LUNG(S), CXR, TORAX).
   Absent is allowed: many chest radiographs leave it out, and de-identification
   drops a value that breaks its VR.
3. The pixels: a picture with many strongly coloured pixels (more than
   `COLOUR_LIMIT` of them with channels apart by more than `COLOUR_SPREAD` of the
   brightest value) is a photograph, a screenshot or a colour-mapped image, not
   a radiograph. A radiograph is grey; a small coloured annotation or ruler is
   allowed.

What these rules cannot tell: a grey PNG of a CT slice or of a knee passes rule
3. For those the drafting model's own unfamiliar-film score
(`orapo_core.models.unfamiliar`) is the second line: an image with no header
verdict (PNG, JPEG, DICOM without Modality or with OT) that scores far outside
even the films the model was calibrated on is refused at its first draft. And a
DICOM that says CR and CHEST while showing something else is believed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

#: DICOM Modality values of chest radiography (DR: not a DICOM term, but written by some vendors for DX).
CHEST_MODALITIES = ("CR", "DX", "DR")
#: Modality values that say nothing about what the image shows: judged from the pixels instead.
UNTELLING_MODALITIES = ("", "OT")
#: A pixel is strongly coloured when its channels lie further apart than this share of the brightest value.
COLOUR_SPREAD = 0.15
#: A picture with more than this share of strongly coloured pixels is not a radiograph.
COLOUR_LIMIT = 0.05

_CHEST_WORDS = re.compile(r"^(CHEST|THORA)|^(LUNGS?|CXR|TORAX)$")
_MODALITY_NAMES = {
    "CT": "a CT",
    "MR": "an MR image",
    "US": "an ultrasound",
    "NM": "a nuclear medicine image",
    "PT": "a PET image",
    "MG": "a mammogram",
    "XA": "an angiogram",
    "RF": "a fluoroscopy image",
    "PX": "a panoramic dental X-ray",
    "IO": "an intra-oral X-ray",
    "ES": "an endoscopy image",
    "XC": "a photograph",
    "SM": "a microscopy slide",
    "OP": "an eye photograph",
    "ECG": "an ECG",
}


def colour_share(rgb: np.ndarray) -> float:
    """The share of pixels of an (rows, columns, 3) picture whose channels differ by more than `COLOUR_SPREAD`
    of its brightest value: 0 for a grey picture, near 1 for a colour photograph."""
    if rgb.ndim != 3 or rgb.shape[2] < 3 or rgb.size == 0:
        return 0.0
    rgb = rgb[..., :3]
    top = float(rgb.max())
    if top <= 0:
        return 0.0
    spread = rgb.max(axis=2).astype(np.float64) - rgb.min(axis=2).astype(np.float64)
    return float(np.mean(spread > COLOUR_SPREAD * top))


def chest_body_part(body_part: str | None) -> bool | None:
    """True when Body Part Examined names the chest, False when it names something else, None when absent."""
    text = (body_part or "").strip().upper()
    if not text:
        return None
    return any(_CHEST_WORDS.search(word) for word in re.split(r"[^A-Z]+", text) if word)


def out_of_scope(meta: Mapping[str, Any], source_format: str) -> str | None:
    """Why this image is not a chest radiograph for the model, in words that follow "Study N is" (None: draft it).

    `meta` is `IngestedImage.meta` (its de-identified modality and body part, and `colour_share`);
    `source_format` 'dicom', 'png' or 'jpeg'."""
    modality = str(meta.get("modality") or "").strip().upper()
    if source_format == "dicom" and modality not in CHEST_MODALITIES and modality not in UNTELLING_MODALITIES:
        name = _MODALITY_NAMES.get(modality, f"a {modality} image")
        return f"{name} (Modality {modality}), not a chest radiograph"
    body_part = str(meta.get("body_part") or "").strip()
    if source_format == "dicom" and chest_body_part(body_part) is False:
        kind = f"a {modality} radiograph" if modality in CHEST_MODALITIES else "an image"
        return f"{kind} of the {body_part.upper()} (Body Part Examined {body_part.upper()}), not of the chest"
    share = float(meta.get("colour_share") or 0.0)
    if share > COLOUR_LIMIT:
        return f"a colour picture ({share:.0%} of its pixels strongly coloured), not a grey radiograph"
    return None


def far_reason(ratio: float) -> str:
    """Why an image whose header cannot say what it is is not drafted when the drafting model's unfamiliar-film
    score puts it far from every film it was calibrated on (`orapo_core.models.unfamiliar`)."""
    return (
        f"an image far unlike the films the drafting model knows (unfamiliar-film score {ratio:.1f} times its "
        "flag threshold), most likely not a chest radiograph"
    )


def not_drafted_sentence(study_id: int, reason: str) -> str:
    """The reader's sentence for a study stored but never drafted."""
    return f"Study {study_id} is {reason}: stored, not drafted."


def has_header_verdict(meta: Mapping[str, Any], source_format: str) -> bool:
    """Whether the file's own header says it is a chest radiograph (a DICOM of a chest modality); False for a PNG,
    a JPEG, or a DICOM with no or an untelling Modality, whose scope only the pixels can tell."""
    modality = str(meta.get("modality") or "").strip().upper()
    return source_format == "dicom" and modality in CHEST_MODALITIES
