"""Writes PhantomCXR studies as PNG and DICOM files plus a CheXpert-Plus-layout CSV.

The DICOMs carry realistic CR tags and a complete, obviously fake identity
(names, IDs, birth date, accession number, institution, referring physician)
so that the de-identification path has real PHI fields to strip. Identities,
dates and UIDs come from their own random stream keyed by (seed, index), so
adding a tag never shifts the images, and nothing reads the clock: the same
seed writes the same bytes.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Protocol

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from orapo_core.data.records import CHEXPERT_14, format_label, split_for
from orapo_core.errors import OrapoError

CSV_NAME = "phantom_cxr.csv"
META_NAME = "phantom_cxr.json"
CSV_COLUMNS = [
    "id", "path_to_image", "path_to_dcm", "frontal_lateral", "ap_pa", "deid_patient_id",
    "patient_report_date_order", "section_findings", "section_impression", "split", *CHEXPERT_14,
]
FORMATS = ("png", "dicom")

_GIVEN = ["JANE", "JOHN", "ALEX", "SAM", "RILEY", "JORDAN", "CASEY", "MORGAN", "TAYLOR", "ROBIN"]
_FAMILY = ["DOE", "ROE", "PHANTOMSON", "TESTWORTH", "SAMPLEY", "FAKEMAN", "MOCKRIDGE", "DUMMINGS", "SYNTHWICK", "PLACEHOLDER"]
_DOCTORS = ["ROE^RICHARD^^DR", "SMITHFAKE^ANNA^^DR", "NOBODY^NORA^^DR", "EXAMPLE^EVAN^^DR"]
CR_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.1"


def fake_identity(seed: int, index: int) -> dict[str, str]:
    """A clearly fake patient and visit, stable for (seed, index)."""
    rng = np.random.default_rng([seed, index, 0x5048])  # "PH": a stream of its own
    birth_year = int(rng.integers(1930, 2006))
    study_year = int(rng.integers(2020, 2026))
    return {
        "PatientName": f"{_FAMILY[rng.integers(len(_FAMILY))]}^{_GIVEN[rng.integers(len(_GIVEN))]}",
        "PatientID": f"PHX{int(rng.integers(10**6, 10**7))}",
        "PatientBirthDate": f"{birth_year}{int(rng.integers(1, 13)):02d}{int(rng.integers(1, 29)):02d}",
        "PatientSex": "F" if rng.random() < 0.5 else "M",
        "PatientAge": f"{study_year - birth_year:03d}Y",
        "AccessionNumber": f"ACCPH{int(rng.integers(10**7, 10**8))}",
        "StudyDate": f"{study_year}{int(rng.integers(1, 13)):02d}{int(rng.integers(1, 29)):02d}",
        "StudyTime": f"{int(rng.integers(0, 24)):02d}{int(rng.integers(0, 60)):02d}{int(rng.integers(0, 60)):02d}",
        "InstitutionName": "Phantom General Hospital (synthetic)",
        "InstitutionAddress": f"{int(rng.integers(1, 999))} Nowhere Lane, Phantomville",
        "ReferringPhysicianName": _DOCTORS[rng.integers(len(_DOCTORS))],
        "OperatorsName": f"{_FAMILY[rng.integers(len(_FAMILY))]}^TECH",
        "StationName": f"PHANTOM-CR{int(rng.integers(1, 9))}",
        "PhotometricInterpretation": "MONOCHROME1" if rng.random() < 0.5 else "MONOCHROME2",
    }


def write_png(path: Path, image: np.ndarray, bits: int = 8) -> None:
    if bits == 8:
        Image.fromarray(np.round(image * 255).astype(np.uint8), mode="L").save(path, optimize=False)
    elif bits == 16:
        Image.fromarray(np.round(image * 65535).astype(np.uint16)).save(path)
    else:
        raise OrapoError("bad_png_bits", f"PNG images are written with 8 or 16 bits, not {bits}.")


def write_dicom(path: Path, image: np.ndarray, view: str, seed: int, index: int) -> dict[str, str]:
    """A 12-bit CR image; MONOCHROME1 studies store inverted pixels, as such scanners do."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid

    who = fake_identity(seed, index)
    pixels = np.round(image * 4095).astype(np.uint16)
    if who["PhotometricInterpretation"] == "MONOCHROME1":
        pixels = (4095 - pixels).astype(np.uint16)
    key = [f"phantomcxr:{seed}:{index}"]
    study_uid = generate_uid(entropy_srcs=key + ["study"])
    series_uid = generate_uid(entropy_srcs=key + ["series"])
    sop_uid = generate_uid(entropy_srcs=key + ["image"])

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(CR_SOP_CLASS)
    meta.MediaStorageSOPInstanceUID = sop_uid
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = generate_uid(entropy_srcs=["orapo-phantomcxr"])
    meta.ImplementationVersionName = "ORAPO_PHANTOM"

    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = CR_SOP_CLASS
    ds.SOPInstanceUID = sop_uid
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    for tag in ("PatientName", "PatientID", "PatientBirthDate", "PatientSex", "PatientAge", "AccessionNumber",
                "StudyDate", "StudyTime", "InstitutionName", "InstitutionAddress", "ReferringPhysicianName",
                "OperatorsName", "StationName"):
        setattr(ds, tag, who[tag])
    ds.SeriesDate = ds.ContentDate = ds.AcquisitionDate = who["StudyDate"]
    ds.SeriesTime = ds.ContentTime = who["StudyTime"]
    ds.StudyID = str(index + 1)
    ds.SeriesNumber = 1
    ds.InstanceNumber = 1
    ds.Modality = "CR"
    ds.Manufacturer = "OraPO PhantomCXR"
    ds.ManufacturerModelName = "Synthetic CR"
    ds.StudyDescription = "XR CHEST 1 VIEW"
    ds.SeriesDescription = f"CHEST {view}"
    ds.BodyPartExamined = "CHEST"
    ds.ViewPosition = view
    ds.PatientOrientation = ["L", "F"] if view == "PA" else ["R", "F"]
    spacing = f"{430.0 / image.shape[0]:.4f}"
    ds.PixelSpacing = [spacing, spacing]
    ds.ImagerPixelSpacing = [spacing, spacing]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = who["PhotometricInterpretation"]
    ds.Rows, ds.Columns = (int(v) for v in image.shape)
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    ds.WindowCenter = 2048
    ds.WindowWidth = 4096
    ds.RescaleIntercept = 0
    ds.RescaleSlope = 1
    ds.PixelData = pixels.tobytes()
    ds.save_as(path, enforce_file_format=True)
    return who


class WrittenStudy(Protocol):
    """What `DatasetWriter.add` reads of a study: `orapo_core.data.phantom.PhantomStudy` (which imports this module)."""

    image: np.ndarray
    view: str
    labels: dict[str, int | None]
    report_findings: str
    report_impression: str


class DatasetWriter:
    """Streams studies to disk: image files as they come, one CSV row each."""

    def __init__(self, out_dir: Path, seed: int, formats: tuple[str, ...] = ("png",), png_bits: int = 8):
        unknown = set(formats) - set(FORMATS)
        if unknown or not formats:
            raise OrapoError("bad_format", f"PhantomCXR writes png, dicom or both, not {', '.join(sorted(unknown)) or 'nothing'}.")
        if png_bits not in (8, 16):
            raise OrapoError("bad_png_bits", f"PNG images are written with 8 or 16 bits, not {png_bits}.")
        self.out_dir, self.seed, self.formats, self.png_bits = out_dir, seed, formats, png_bits
        self.csv_path = out_dir / CSV_NAME
        self._count = 0

    def __enter__(self) -> "DatasetWriter":
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.csv_path, "w", newline="", encoding="utf-8")
        self._csv = csv.writer(self._file, lineterminator="\n")
        self._csv.writerow(CSV_COLUMNS)
        return self

    def add(self, index: int, study: WrittenStudy) -> None:
        study_id = f"phantom-{self.seed}-{index:06d}"
        split = split_for(study_id)
        folder = f"{split}/patient{index:05d}/study1"
        (self.out_dir / folder).mkdir(parents=True, exist_ok=True)
        png = dcm = ""
        if "png" in self.formats:
            png = f"{folder}/view1_frontal.png"
            write_png(self.out_dir / png, study.image, self.png_bits)
        if "dicom" in self.formats:
            dcm = f"{folder}/view1_frontal.dcm"
            write_dicom(self.out_dir / dcm, study.image, study.view, self.seed, index)
        labels = [format_label(study.labels[name]) for name in CHEXPERT_14]
        self._csv.writerow([study_id, png or dcm, dcm, "Frontal", study.view, f"patient{index:05d}", 1,
                            study.report_findings, study.report_impression, split, *labels])
        self._count += 1

    def __exit__(self, *exc: object) -> None:
        self._file.close()
        meta = {"generator": "PhantomCXR", "seed": self.seed, "studies": self._count, "formats": list(self.formats), "csv": CSV_NAME}
        (self.out_dir / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
