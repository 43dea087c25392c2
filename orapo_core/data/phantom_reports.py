"""Radiology-style FINDINGS and IMPRESSION text for a PhantomCXR study.

Every sentence is written together with the CheXpert labels it states, so the
labels are exactly what the text says -- a hedged sentence gives -1, a
pertinent negative gives 0, an observation never mentioned stays blank --
rather than what the image contains. Several phrasings per finding keep a
model from learning one template by heart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.data.phantom_finding import DrawnFinding, required
from orapo_core.data.records import CHEXPERT_14

Sentence = tuple[str, dict[str, int]]
T = TypeVar("T")

_ORDINAL = {4: "4th", 5: "5th", 6: "6th", 7: "7th", 8: "8th", 9: "9th"}


def _choose(rng: np.random.Generator, options: Sequence[T]) -> T:
    return options[int(rng.integers(len(options)))]


def _where(f: DrawnFinding) -> str:
    side, zone = required(f.side, "side"), required(f.location, "location")
    if f.variant == "lobar":
        if zone == "middle":
            return "right middle lobe" if side == "right" else "lingula"
        return f"{side} {zone} lobe"
    return {"upper": f"{side} upper lung", "middle": f"{side} midlung", "lower": f"{side} lung base"}[zone]


def _devices(f: DrawnFinding) -> list[str]:
    return {
        "ett": [
            "Endotracheal tube terminates approximately {n} cm above the carina.",
            "The endotracheal tube tip is {n} cm above the carina.",
        ],
        "ng": [
            "Enteric tube courses below the diaphragm with the tip in the stomach.",
            "A nasogastric tube extends into the stomach.",
        ],
        "cvc": [
            "Right internal jugular central venous catheter terminates in the SVC.",
            "Right IJ central line with tip in the mid SVC.",
        ],
        "picc": [
            "Left upper extremity PICC terminates in the lower SVC.",
            "A left-sided PICC line ends at the cavoatrial junction.",
        ],
        "pacemaker": [
            "Left chest wall pacemaker with leads in the right atrium and right ventricle.",
            "Dual-lead cardiac pacemaker in place.",
        ],
    }[required(f.location, "location")]


def _finding_sentences(f: DrawnFinding, rng: np.random.Generator) -> tuple[list[Sentence], Sentence | None]:
    """(findings-section sentences, impression sentence) for one finding."""
    obs = {
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
    }[f.kind]
    v = 1 if f.certain else -1
    lab = {obs: v}
    k = f.kind
    if k == "cardiomegaly":
        severity = required(f.severity, "severity")
        adv = {"mild": "mildly", "moderate": "moderately", "severe": "severely"}[severity]
        if f.certain:
            s = _choose(
                rng,
                [
                    f"The heart is {adv} enlarged.",
                    f"{severity.capitalize()} cardiomegaly.",
                    f"There is {severity} cardiomegaly.",
                ],
            )
            return [(s, lab)], (_choose(rng, [f"{severity.capitalize()} cardiomegaly.", "Cardiomegaly."]), lab)
        return [("Possible mild cardiomegaly.", lab)], ("Possible cardiomegaly.", lab)
    if k == "enlarged_cardiomediastinum":
        if f.certain:
            s = _choose(
                rng,
                [
                    "The mediastinum is widened.",
                    "There is widening of the superior mediastinum.",
                    f"{'Marked' if f.severity == 'marked' else 'Mild'} mediastinal widening.",
                ],
            )
            return [(s, lab)], ("Mediastinal widening.", lab)
        return [("Possible mediastinal widening, which may be related to projection.", lab)], None
    if k == "lung_opacity":
        w = _where(f)
        if f.certain:
            s = _choose(
                rng,
                [
                    f"Patchy opacity in the {w}.",
                    f"Hazy opacity at the {w}.",
                    f"There is a patchy airspace opacity in the {w}.",
                ],
            )
            return [(s, lab)], (f"Patchy {w} opacity.", lab)
        return [(f"Possible subtle opacity in the {w}.", lab)], None
    if k == "consolidation":
        w = _where(f)
        if f.certain:
            s = _choose(
                rng,
                [
                    f"Consolidation in the {w}.",
                    f"Dense consolidation in the {w} with air bronchograms.",
                    f"There is focal consolidation in the {w}.",
                ],
            )
            return [(s, lab)], (f"Consolidation in the {w}.", lab)
        return [(f"Possible early consolidation in the {w}.", lab)], (f"Possible {w} consolidation.", lab)
    if k == "pneumonia":
        w = _where(f)
        seen = (_choose(rng, [f"Airspace opacity in the {w}.", f"Patchy opacity in the {w}."]), {"Lung Opacity": 1})
        if f.certain:
            return [seen], (
                _choose(rng, [f"Findings consistent with pneumonia in the {w}.", f"Pneumonia in the {w}."]),
                {"Pneumonia": 1},
            )
        return [seen], (
            _choose(
                rng,
                [
                    f"The {w} opacity may represent pneumonia in the appropriate clinical setting.",
                    f"Pneumonia in the {w} cannot be excluded.",
                ],
            ),
            {"Pneumonia": -1},
        )
    if k == "atelectasis":
        side = required(f.side, "side")
        if f.variant == "lobar":
            s = f"{side.capitalize()} lower lobe collapse with volume loss and elevation of the {side} hemidiaphragm, consistent with atelectasis."
            if not f.certain:
                s = f"Elevation of the {side} hemidiaphragm with possible {side} lower lobe atelectasis."
            return [(s, lab)], (
                f"{'' if f.certain else 'Possible '}{side} lower lobe atelectasis.".strip().capitalize(),
                lab,
            )
        if side == "bilateral":
            s = _choose(rng, ["Bibasilar atelectasis.", "Plate-like atelectasis at both lung bases."])
        elif f.certain:
            s = _choose(
                rng, [f"Linear atelectasis at the {side} base.", f"Plate-like atelectasis in the {side} lower lung."]
            )
        else:
            s = f"Possible minimal atelectasis at the {side} base."
        return [(s, lab)], (
            ("Bibasilar atelectasis." if side == "bilateral" else f"{side.capitalize()} basilar atelectasis."),
            lab,
        ) if f.certain else None
    if k == "edema":
        severity = required(f.severity, "severity")
        if f.certain:
            phrasings = {
                "mild": [
                    "Mild interstitial pulmonary edema.",
                    "Mild pulmonary vascular congestion and interstitial edema.",
                ],
                "moderate": [
                    "Moderate pulmonary edema with perihilar haziness.",
                    "Moderate interstitial edema with Kerley B lines.",
                ],
                "severe": [
                    "Severe pulmonary edema.",
                    "Severe pulmonary edema with perihilar haziness and Kerley B lines.",
                ],
            }[severity]
            sentence = _choose(rng, phrasings)
            # Haziness is itself an opacity, whatever it is attributed to.
            return [(sentence, lab | ({"Lung Opacity": 1} if "haziness" in sentence else {}))], (
                f"{severity.capitalize()} pulmonary edema.",
                lab,
            )
        return [("Perihilar haziness may represent mild pulmonary edema.", lab | {"Lung Opacity": 1})], (
            "Possible mild pulmonary edema.",
            lab,
        )
    if k == "lung_lesion":
        side, location, size = required(f.side, "side"), required(f.location, "location"), required(f.size, "size")
        w = {"upper": f"{side} upper lung", "middle": f"{side} midlung", "lower": f"{side} lower lung"}[location]
        mm = int(round(size * 2 * 430))
        if f.variant == "mass":
            s = f"There is a {mm / 10:.1f} cm mass in the {w}." if f.certain else f"Possible mass in the {w}."
            imp = (
                f"{w.capitalize()} mass; CT chest recommended."
                if f.certain
                else f"Possible {w} mass; CT chest recommended."
            )
        else:
            s = (
                _choose(rng, [f"A {mm} mm nodule in the {w}.", f"There is a {mm} mm pulmonary nodule in the {w}."])
                if f.certain
                else f"Possible nodule in the {w}."
            )
            imp = (
                f"{w.capitalize()} pulmonary nodule; recommend CT for further evaluation."
                if f.certain
                else f"Possible {w} nodule; recommend CT for further evaluation."
            )
        return [(s, lab)], (imp, lab)
    if k == "pneumothorax":
        side, severity = required(f.side, "side"), required(f.severity, "severity")
        where = f"{side} apical" if severity == "small" else side
        if f.certain:
            s = _choose(
                rng,
                [
                    f"{severity.capitalize()} {where} pneumothorax.",
                    f"There is a {severity} {where} pneumothorax with a visible pleural line and absent lung markings peripherally.",
                ],
            )
            return [(s, lab)], (f"{severity.capitalize()} {side} pneumothorax.", lab)
        return [(f"Cannot exclude a tiny {side} apical pneumothorax.", lab)], (
            f"Possible small {side} apical pneumothorax.",
            lab,
        )
    if k == "pleural_effusion":
        side, severity = required(f.side, "side"), required(f.severity, "severity")
        if side == "bilateral":
            s = _choose(
                rng,
                [
                    f"{severity.capitalize()} bilateral pleural effusions.",
                    f"There are {severity} bilateral pleural effusions with blunting of the costophrenic angles.",
                ],
            )
            return [(s, lab)], (f"{severity.capitalize()} bilateral pleural effusions.", lab)
        if f.certain:
            s = _choose(
                rng,
                [
                    f"{severity.capitalize()} {side} pleural effusion.",
                    f"{severity.capitalize()} {side} pleural effusion with blunting of the costophrenic angle.",
                    f"There is a {severity} {side} pleural effusion.",
                ],
            )
            return [(s, lab)], (f"{severity.capitalize()} {side} pleural effusion.", lab)
        return [(f"Blunting of the {side} costophrenic angle, possibly a small pleural effusion.", lab)], (
            f"Possible small {side} pleural effusion.",
            lab,
        )
    if k == "pleural_other":
        side, variant = required(f.side, "side"), required(f.variant, "variant")
        s = {
            "thickening": f"Pleural thickening along the {side} lateral chest wall.",
            "apical_cap": f"{side.capitalize()} apical pleural thickening.",
            "plaques": f"Calcified pleural plaques along the {side} chest wall.",
        }[variant]
        return [(s, lab)], None
    if k == "fracture":
        side, location = required(f.side, "side"), required(f.location, "location")
        rib = _ORDINAL[int(location)]
        if f.certain:
            s = _choose(
                rng,
                [f"Acute fracture of the {side} {rib} posterior rib.", f"Displaced fracture of the {side} {rib} rib."],
            )
            return [(s, lab)], (f"{side.capitalize()} {rib} rib fracture.", lab)
        return [(f"Possible fracture of the {side} {rib} rib.", lab)], (f"Possible {side} {rib} rib fracture.", lab)
    if k == "support_devices":
        return [(_choose(rng, _devices(f)).format(n=int(rng.integers(3, 7))), lab)], None
    raise ValueError(k)


_NEGATIVES: dict[str, list[Sentence]] = {
    "heart": [("Heart size is normal.", {"Cardiomegaly": 0}), ("The heart is normal in size.", {"Cardiomegaly": 0})],
    "silhouette": [
        ("The cardiomediastinal silhouette is within normal limits.", {"Enlarged Cardiomediastinum": 0}),
        ("Normal mediastinal contours.", {"Enlarged Cardiomediastinum": 0}),
    ],
    "consolidation": [("No focal consolidation.", {"Consolidation": 0})],
    # Said only when nothing in the lungs is abnormal: it denies any opacity too.
    "clear_lungs": [
        ("The lungs are clear without focal consolidation.", {"Consolidation": 0, "Lung Opacity": 0}),
        ("The lungs are clear.", {"Lung Opacity": 0}),
    ],
    "edema": [("No pulmonary edema.", {"Edema": 0})],
    "pleura": [
        ("No pleural effusion or pneumothorax.", {"Pleural Effusion": 0, "Pneumothorax": 0}),
        ("No pneumothorax or pleural effusion.", {"Pleural Effusion": 0, "Pneumothorax": 0}),
    ],
    "pneumothorax": [("No pneumothorax.", {"Pneumothorax": 0})],
    "effusion": [("No pleural effusion.", {"Pleural Effusion": 0})],
    "fracture": [("No displaced rib fracture.", {"Fracture": 0})],
}

_NORMAL_IMPRESSIONS = [
    "No acute cardiopulmonary process.",
    "No acute cardiopulmonary abnormality.",
    "No acute intrathoracic process.",
    "Normal chest radiograph.",
]


# Findings inside the lungs: with any of them a report cannot call the lungs clear.
_PARENCHYMAL = {"consolidation", "pneumonia", "lung_opacity", "atelectasis", "edema", "lung_lesion", "pneumothorax"}


def _negatives(kinds: set[str], rng: np.random.Generator, normal: bool) -> list[Sentence]:
    """Pertinent negatives for what is absent; always the core set for a normal study."""
    out: list[Sentence] = []
    keep = 1.0 if normal else 0.6
    if "cardiomegaly" not in kinds and rng.random() < keep:
        out.append(_choose(rng, _NEGATIVES["heart"]))
    if not kinds & {"cardiomegaly", "enlarged_cardiomediastinum"} and rng.random() < keep:
        out.append(_choose(rng, _NEGATIVES["silhouette"]))
    if not kinds & {"consolidation", "pneumonia"} and rng.random() < keep:
        lungs_clear = not kinds & _PARENCHYMAL and rng.random() < 0.5
        out.append(_choose(rng, _NEGATIVES["clear_lungs" if lungs_clear else "consolidation"]))
    if "edema" not in kinds and rng.random() < (0.5 if normal else 0.4):
        out.append(_NEGATIVES["edema"][0])
    ptx, eff = "pneumothorax" in kinds, "pleural_effusion" in kinds
    if not ptx and not eff:
        if rng.random() < max(keep, 0.8):
            out.append(_choose(rng, _NEGATIVES["pleura"]))
    elif not ptx and rng.random() < 0.8:
        out.append(_NEGATIVES["pneumothorax"][0])
    elif not eff and rng.random() < 0.8:
        out.append(_NEGATIVES["effusion"][0])
    if "fracture" not in kinds and rng.random() < 0.3:
        out.append(_NEGATIVES["fracture"][0])
    return out


def merge_labels(label_sets: Iterable[Mapping[str, int]]) -> dict[str, int | None]:
    """CheXpert merging: positive beats uncertain beats negative beats unmentioned."""
    rank = {1: 3, -1: 2, 0: 1}
    labels: dict[str, int | None] = {name: None for name in CHEXPERT_14}
    for labs in label_sets:
        for obs, value in labs.items():
            current = labels[obs]
            if current is None or rank[value] > rank[current]:
                labels[obs] = value
    # No Finding: nothing but support devices is positive or uncertain.
    abnormal = any(labels[o] in (1, -1) for o in CHEXPERT_14 if o not in ("No Finding", "Support Devices"))
    labels["No Finding"] = None if abnormal else 1
    return labels


def write_report(
    findings: Sequence[DrawnFinding], rng: np.random.Generator, view: str
) -> tuple[str, str, dict[str, int | None]]:
    """(findings text, impression text, labels) for the drawn findings."""
    order = [
        "support_devices",
        "consolidation",
        "pneumonia",
        "lung_opacity",
        "edema",
        "atelectasis",
        "lung_lesion",
        "pleural_effusion",
        "pneumothorax",
        "pleural_other",
        "cardiomegaly",
        "enlarged_cardiomediastinum",
        "fracture",
    ]
    ranked = sorted(findings, key=lambda f: order.index(f.kind))
    kinds = {f.kind for f in findings}
    normal = not (kinds - {"support_devices"})
    body: list[Sentence] = []
    impressions: list[Sentence] = []
    for f in ranked:
        sentences, impression = _finding_sentences(f, rng)
        body.extend(sentences)
        if impression is not None and f.kind != "support_devices":
            impressions.append(impression)
    # Two findings can describe one opacity in the same words (a consolidation and the pneumonia it shows): say it
    # once. No random draw depends on this, so every other report stays as it was.
    seen_text: set[str] = set()
    unique: list[Sentence] = []
    for sentence in body:
        if sentence[0] not in seen_text:
            seen_text.add(sentence[0])
            unique.append(sentence)
    body = unique
    negatives = _negatives(kinds, rng, normal)
    # Devices lead, then positives, then the pertinent negatives, as a reader dictates.
    findings_text = " ".join(s for s, _ in body + negatives)
    if view == "AP" and rng.random() < 0.5:
        findings_text = "Portable AP upright view of the chest. " + findings_text
    if normal:
        impressions = [(_choose(rng, _NORMAL_IMPRESSIONS), {})]
        if "support_devices" in kinds:
            impressions.insert(
                0,
                (
                    _choose(rng, ["Support devices as described above.", "Lines and tubes in standard position."]),
                    {"Support Devices": 1},
                ),
            )
    if len(impressions) > 1 and rng.random() < 0.5:
        impression_text = " ".join(f"{i}. {s}" for i, (s, _) in enumerate(impressions, 1))
    else:
        impression_text = " ".join(s for s, _ in impressions)
    labels = merge_labels(lab for _, lab in body + negatives + impressions)
    return findings_text, impression_text, labels
