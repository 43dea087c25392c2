"""PhantomCXR images: the cues a reader uses are there and measurable; DICOM and PNG output."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from orapo_core.data.phantom import FINDING_KINDS, generate_study, write_dataset

SIZE = 128
NONE = dict.fromkeys(FINDING_KINDS, 0.0)


def _studies(n: int, prevalence: dict, seed: int):
    return [generate_study(np.random.default_rng([seed, i]), size=SIZE, prevalence=prevalence) for i in range(n)]


def _width(mask: np.ndarray) -> int:
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[-1] - cols[0] + 1)


def test_cardiothoracic_ratio_exceeds_half_exactly_for_cardiomegaly():
    studies = _studies(40, NONE | {"cardiomegaly": 0.5, "pleural_effusion": 0.3, "atelectasis": 0.3}, seed=1)
    flags = []
    for s in studies:
        ctr = _width(s.masks["heart"]) / _width(s.masks["lung_right"] | s.masks["lung_left"])
        has = "cardiomegaly" in s.kinds
        assert (ctr > 0.5) == has, (ctr, s.findings)
        flags.append(has)
    assert 5 < sum(flags) < 35


def _cp_box(s, side: str) -> np.ndarray:
    r, c = s.landmarks[f"cp_angle_{side}"]
    inward = 1 if side == "right" else -1  # patient right is on the image left
    c0, c1 = sorted((c + inward * int(0.015 * SIZE), c + inward * int(0.08 * SIZE)))
    return s.image[r - int(0.06 * SIZE) : r - int(0.01 * SIZE), c0:c1]


def test_costophrenic_angle_is_brighter_with_effusion():
    studies = _studies(40, NONE | {"pleural_effusion": 0.5}, seed=2)
    wet, dry = [], []
    for s in studies:
        sides = {f.side for f in s.findings}
        for side in ("right", "left"):
            (wet if side in sides or "bilateral" in sides else dry).append(_cp_box(s, side).mean())
            if side in sides or "bilateral" in sides:
                assert s.masks["effusion"].any()
    assert len(wet) > 8 and len(dry) > 8
    assert np.mean(wet) > np.mean(dry) + 0.2
    assert min(wet) > np.median(dry)


def _erode(mask: np.ndarray, steps: int = 2) -> np.ndarray:
    for _ in range(steps):
        p = np.pad(mask, 1)
        mask = p[1:-1, 1:-1] & p[:-2, 1:-1] & p[2:, 1:-1] & p[1:-1, :-2] & p[1:-1, 2:]
    return mask


def test_pneumothorax_region_is_darker_and_without_lung_markings():
    studies = _studies(16, NONE | {"pneumothorax": 1.0}, seed=3)
    ratios = []
    for s in studies:
        # Edges dropped: the chest wall and the pleural line are not texture.
        region = _erode(s.masks["pneumothorax"])
        lungs = _erode(s.masks["lung_right"] | s.masks["lung_left"])
        # The same region mirrored about the midline into the other lung, which keeps its vessels.
        midline = s.landmarks["carina"][1]
        rows, cols = np.nonzero(region)
        mirrored = 2 * midline - cols
        inside = (mirrored >= 0) & (mirrored < SIZE)
        mirror = np.zeros_like(region)
        mirror[rows[inside], mirrored[inside]] = True
        mirror &= lungs
        assert region.sum() > 5 and mirror.sum() > 5
        assert s.image[region].mean() < s.image[mirror].mean() - 0.05, s.findings
        if region.sum() > 60:
            ratios.append(s.image[region].std() / s.image[mirror].std())
    assert len(ratios) >= 6
    assert max(ratios) < 0.95 and np.median(ratios) < 0.85


def test_devices_are_metal_bright_and_edema_brightens_both_hila():
    base = _studies(8, NONE, seed=4)
    tubes = _studies(8, NONE | {"support_devices": 1.0}, seed=4)
    assert np.mean([s.image.max() for s in tubes]) > np.mean([s.image.max() for s in base]) + 0.05
    wet = _studies(8, NONE | {"edema": 1.0}, seed=5)

    def hila(s):
        lungs = s.masks["lung_right"] | s.masks["lung_left"]
        return s.image[lungs].mean()

    assert np.mean([hila(s) for s in wet]) > np.mean([hila(s) for s in base]) + 0.05


def test_dicom_has_both_photometric_interpretations_and_fake_phi(tmp_path):
    pydicom = pytest.importorskip("pydicom")
    write_dataset(tmp_path, 10, seed=9, size=64, formats=("dicom", "png"))
    seen = set()
    for dcm in sorted(tmp_path.rglob("*.dcm")):
        ds = pydicom.dcmread(dcm)
        assert ds.Modality == "CR" and ds.BodyPartExamined == "CHEST" and ds.ViewPosition in ("PA", "AP")
        assert ds.BitsStored == 12 and int(ds.pixel_array.max()) <= 4095 and ds.pixel_array.shape == (64, 64)
        for tag in (
            "PatientName",
            "PatientID",
            "PatientBirthDate",
            "AccessionNumber",
            "InstitutionName",
            "ReferringPhysicianName",
        ):
            assert str(getattr(ds, tag)).strip(), tag
        assert str(ds.PatientID).startswith("PHX") and "synthetic" in ds.InstitutionName
        assert ds.StudyInstanceUID != ds.SOPInstanceUID and len(ds.PixelSpacing) == 2
        png = np.asarray(Image.open(dcm.with_suffix(".png")), dtype=np.float64) / 255
        pixels = ds.pixel_array.astype(np.float64) / 4095
        if ds.PhotometricInterpretation == "MONOCHROME1":
            pixels = 1 - pixels  # stored inverted: displayed the same way as the PNG
        assert np.abs(pixels - png).max() < 0.01
        seen.add(ds.PhotometricInterpretation)
    assert seen == {"MONOCHROME1", "MONOCHROME2"}


def test_sixteen_bit_png(tmp_path):
    write_dataset(tmp_path, 1, seed=2, size=64, png_bits=16)
    (png,) = tmp_path.rglob("*.png")
    image = Image.open(png)
    array = np.asarray(image)
    assert array.shape == (64, 64) and array.max() > 255
    assert np.abs(array / 65535 - generate_study(np.random.default_rng([2, 0]), size=64).image).max() < 1e-4
