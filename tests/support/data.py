"""Small training data written the way users hand it to `orapo train`."""

from __future__ import annotations

import csv
from pathlib import Path

from orapo_core.data.records import CHEXPERT_14


def write_chexpert_csv(folder: Path, rows: list[dict]) -> Path:
    """A CheXpert Plus style CSV with one small PNG per study (a row's ``draft``: the clinician's pair columns, its
    ``oracle`` over that draft)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.csv"
    fields = ["path_to_image", "section_findings", "section_impression", *CHEXPERT_14, "oracle_report"]
    if any("draft" in row for row in rows):  # a clinician's correction: the oracle over the draft it corrected
        fields += ["clinician_chosen", "clinician_rejected"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for i, row in enumerate(rows):
            image = Path(f"train/patient{i:05d}/study1/view1_frontal.png")
            (folder / image).parent.mkdir(parents=True, exist_ok=True)
            Image.new("L", (56, 56), color=20 * i % 255).save(folder / image)
            labels = {name: "" for name in CHEXPERT_14} | {k: "1.0" for k in row.get("positive", [])}
            writer.writerow(
                {
                    "path_to_image": str(image),
                    "section_findings": row.get("findings", ""),
                    "section_impression": row.get("impression", ""),
                    "oracle_report": row.get("oracle", ""),
                    **(
                        {"clinician_chosen": row.get("oracle", ""), "clinician_rejected": row["draft"]}
                        if "draft" in row
                        else {}
                    ),
                    **labels,
                }
            )
    return path
