"""Builders of small DICOM files for the imaging tests, and the real DICOMs of the `pydicom-data` package."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

DX_FOR_PRESENTATION = "1.2.840.10008.5.1.4.1.1.1.1"
BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"


def ramp(rows: int = 64, columns: int = 48, top: int = 4095) -> np.ndarray:
    """A 16-bit horizontal ramp from 0 to `top`, different in every column."""
    line = np.linspace(0, top, columns).round().astype(np.uint16)
    return np.tile(line, (rows, 1))


def image_dataset(
    pixels: np.ndarray | None = None, *, bits_stored: int = 12, photometric: str = "MONOCHROME2"
) -> Dataset:
    """A minimal digital X-ray image dataset holding `pixels` (uint16, 2-D or frames x rows x columns)."""
    pixels = ramp() if pixels is None else pixels
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DX_FOR_PRESENTATION
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = DX_FOR_PRESENTATION
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID = generate_uid()
    ds.SeriesInstanceUID = generate_uid()
    ds.Modality = "DX"
    ds.PatientName = "Test^Patient"
    ds.PatientID = "TEST-1"
    ds.set_pixel_data(pixels, photometric, bits_stored, generate_instance_uid=False)
    return ds


def set_raw(ds: Dataset, keyword: str, text: str) -> None:
    """Put `text` into `ds` as it stands, unchecked by pydicom: what a sender that ignores the attribute's VR writes
    (a time of 'QZXTIME', an age of 'old'); written as is by `dicom_bytes`."""
    from pydicom.datadict import dictionary_VR, tag_for_keyword
    from pydicom.dataelem import RawDataElement
    from pydicom.tag import Tag

    tag = Tag(tag_for_keyword(keyword))
    value = text.encode("ascii")
    value += b" " * (len(value) % 2)  # even length, as every element's value
    ds[tag] = RawDataElement(tag, dictionary_VR(tag), len(value), value, 0, False, True)


def dicom_bytes(ds: Dataset) -> bytes:
    buffer = io.BytesIO()
    pydicom.dcmwrite(buffer, ds, enforce_file_format=True)
    return buffer.getvalue()


def write(ds: Dataset, path: Path) -> Path:
    path.write_bytes(dicom_bytes(ds))
    return path


def pydicom_data_file(name: str) -> Path:
    """A file of the `pydicom-data` package (real DICOMs such as RG1_UNCI.dcm), found without any download."""
    import importlib.util

    spec = importlib.util.find_spec("data_store")
    assert spec is not None and spec.origin, "pydicom-data is a test dependency: `make test` installs it"
    path = Path(spec.origin).parent / "data" / name
    assert path.exists(), f"{name} is not in pydicom-data"
    return path
