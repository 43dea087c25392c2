"""Reference labels as they arrive from CSV files, pandas and `datasets`, made uniform.

A label may be 1, 0, -1, None, a float (1.0, NaN) or a string ("1.0", "", "-1");
a label set may be a dict or its JSON text; names may be CheXpert's, ChestX-ray14's
or a finer FactS concept. Everything downstream sees dict[str, int | None].
"""

from __future__ import annotations

import json
import math

from orapo_core.errors import OrapoError
from orapo_core.facts.ontology import CHEXPERT_14, CONCEPT_TO_CHESTXRAY14, CONCEPTS


def label_value(value: object) -> int | None:
    """1, 0, -1 or None from whatever a table holds."""
    if value is None or isinstance(value, bool) and not value:
        return None if value is None else 0
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return None
        number = value
    else:
        text = str(value).strip().lower()
        if text in ("", "nan", "none", "null", "na", "n/a"):
            return None
        try:
            number = float(text)
        except ValueError:
            raise OrapoError("bad_label", f"Label value {value!r} is not one of 1, 0, -1 or empty.") from None
    if number not in (1, 0, -1):
        raise OrapoError("bad_label", f"Label value {value!r} is not one of 1, 0, -1 or empty.")
    return int(number)


def normalize_labels(labels: object) -> dict[str, int | None]:
    """A label set keyed by observation name; JSON text is parsed, unknown names are kept as given."""
    if labels is None:
        return {}
    if isinstance(labels, (str, bytes)):
        text = labels.decode() if isinstance(labels, bytes) else labels
        if not text.strip():
            return {}
        try:
            labels = json.loads(text)
        except json.JSONDecodeError:
            raise OrapoError(
                "bad_labels", 'Reference labels must be a dict or its JSON text, e.g. {"Edema": 1}.'
            ) from None
    if not isinstance(labels, dict):
        raise OrapoError("bad_labels", f"Reference labels must be a dict, not {type(labels).__name__}.")
    # pandas/datasets spell names with underscores now and then ("Pleural_Effusion").
    known = {name.lower().replace("_", " "): name for name in (*CHEXPERT_14, *CONCEPTS)}
    # ChestX-ray14 names ("Effusion", "Pleural_Thickening") become the FactS concept they name.
    known.update({cx.lower().replace("_", " "): c for c, cx in CONCEPT_TO_CHESTXRAY14.items() if cx})
    out: dict[str, int | None] = {}
    for key, value in labels.items():
        name = known.get(str(key).lower().replace("_", " "), str(key))
        out[name] = label_value(value)
    return out


def with_no_finding(labels: dict[str, int | None]) -> dict[str, int | None]:
    """CheXpert's derived No Finding, filled in when the source left it out."""
    if labels.get("No Finding") is not None:
        return labels
    abnormal = any(v in (1, -1) for k, v in labels.items() if k not in ("No Finding", "Support Devices"))
    return {**labels, "No Finding": None if abnormal else 1}
