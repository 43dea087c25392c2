"""Every bad upload is refused with its own code and one plain sentence, and nothing is written."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import MPEG2MPML, ExplicitVRLittleEndian, JPEG2000Lossless, generate_uid

from orapo_core.errors import OrapoError
from orapo_core.imaging import ingest_bytes, ingest_path
from tests.support.dicom import BASIC_TEXT_SR, dicom_bytes, image_dataset, pydicom_data_file, write

SECRET = "test-secret"


def refusal(data: bytes, filename: str, **kwargs) -> OrapoError:
    with pytest.raises(OrapoError) as caught:
        ingest_bytes(data, filename, secret=SECRET, **kwargs)
    error = caught.value
    # One plain sentence for a clinician: no newline, no traceback, no Python names.
    assert "\n" not in error.message and error.message.endswith(".")
    assert "Error" not in error.message and "Traceback" not in error.message
    return error


def png_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def with_png_size(png: bytes, width: int, height: int) -> bytes:
    """The same PNG with its IHDR claiming another size (a decompression bomb's header)."""
    ihdr = bytearray(png[16:29])
    ihdr[0:8] = struct.pack(">II", width, height)
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + bytes(ihdr)))
    return png[:16] + bytes(ihdr) + crc + png[33:]


def test_empty_file(tmp_path: Path):
    path = tmp_path / "chest.dcm"
    path.write_bytes(b"")
    with pytest.raises(OrapoError) as caught:
        ingest_path(path, secret=SECRET)
    assert caught.value.code == "empty_file"


def test_garbage_bytes():
    garbage = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert refusal(garbage, "chest.dcm").code == "not_an_image"
    assert refusal(b"hello, this is a text file\n", "notes").code == "not_an_image"


def test_other_image_format_is_named():
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(buffer, format="GIF")
    error = refusal(buffer.getvalue(), "chest.gif")
    assert error.code == "unsupported_format" and "GIF" in error.message


def test_structured_report_is_not_an_image_object():
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = BASIC_TEXT_SR
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    sr = Dataset()
    sr.file_meta = meta
    sr.SOPClassUID = BASIC_TEXT_SR
    sr.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    sr.Modality = "SR"
    sr.PatientName = "Doe^Jane"
    error = refusal(dicom_bytes(sr), "report.dcm")
    assert error.code == "not_an_image_object"
    assert "structured report" in error.message and "Doe" not in error.message


def test_image_without_pixel_data():
    ds = image_dataset()
    del ds.PixelData
    assert refusal(dicom_bytes(ds), "chest.dcm").code == "no_pixel_data"


def test_rows_and_columns_that_disagree_with_pixel_data():
    ds = image_dataset()
    ds.Rows = ds.Rows + 10
    assert refusal(dicom_bytes(ds), "chest.dcm").code == "dimension_mismatch"
    ds = image_dataset()
    ds.Columns = ds.Columns // 2  # now the pixel data is twice as long as declared
    assert refusal(dicom_bytes(ds), "chest.dcm").code == "dimension_mismatch"


def test_truncated_dicom():
    data = dicom_bytes(image_dataset())
    assert refusal(data[: len(data) - 1000], "chest.dcm").code == "truncated_file"
    real = pydicom_data_file("RG1_UNCI.dcm").read_bytes()
    assert refusal(real[: len(real) // 2], "chest.dcm").code == "truncated_file"
    j2k = pydicom_data_file("RG1_J2KR.dcm").read_bytes()
    assert refusal(j2k[: len(j2k) - 5000], "chest.dcm").code == "truncated_file"


def test_truncated_png_and_jpeg():
    array = np.random.default_rng(1).integers(0, 256, (256, 256), dtype=np.uint8)
    png = png_bytes(array)
    assert refusal(png[: len(png) // 2], "chest.png").code == "truncated_file"
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=90)
    jpeg = buffer.getvalue()
    assert refusal(jpeg[: len(jpeg) // 2], "chest.jpg").code == "truncated_file"


def test_unsupported_transfer_syntax():
    ds = image_dataset()
    ds.file_meta.TransferSyntaxUID = MPEG2MPML
    ds.PixelData = encapsulate([b"\x00" * 64])
    ds["PixelData"].VR = "OB"
    data = dicom_bytes(ds)
    error = refusal(data, "chest.dcm")
    assert error.code == "unsupported_transfer_syntax" and "MPEG2" in error.message
    # A transfer syntax nobody has heard of (same length, so the header stays valid).
    unknown = data.replace(str(MPEG2MPML).encode(), b"1.2.840.10008.1.2.4.999")
    assert unknown != data
    assert refusal(unknown, "chest.dcm").code == "unsupported_transfer_syntax"


def test_undecodable_compressed_pixels():
    ds = image_dataset()
    ds.file_meta.TransferSyntaxUID = JPEG2000Lossless
    ds.PixelData = encapsulate([b"this is not a JPEG 2000 codestream" * 4])
    ds["PixelData"].VR = "OB"
    assert refusal(dicom_bytes(ds), "chest.dcm").code == "undecodable_pixels"


def test_pixel_cap_is_checked_on_the_header_before_decoding():
    ds = image_dataset()
    ds.Rows, ds.Columns = 60_000, 60_000  # 3.6 gigapixels declared, a few kilobytes present
    error = refusal(dicom_bytes(ds), "chest.dcm")
    assert error.code == "too_many_pixels" and "50-megapixel" in error.message
    real = pydicom_data_file("RG1_UNCI.dcm").read_bytes()
    assert refusal(real, "chest.dcm", max_pixels=1_000_000).code == "too_many_pixels"
    ingest_bytes(real, "chest.dcm", secret=SECRET, max_pixels=1955 * 1841)  # exactly at the cap is accepted


def test_png_decompression_bomb_header():
    small = png_bytes(np.zeros((4, 4), np.uint8))
    assert refusal(with_png_size(small, 9_000, 9_000), "chest.png").code == "too_many_pixels"
    assert refusal(with_png_size(small, 40_000, 40_000), "chest.png").code == "too_many_pixels"
    assert refusal(png_bytes(np.zeros((40, 40), np.uint8)), "chest.png", max_pixels=1_000).code == "too_many_pixels"


def test_content_that_disagrees_with_the_name():
    png = png_bytes(np.zeros((8, 8), np.uint8))
    error = refusal(png, "chest.dcm")
    assert error.code == "content_mismatch" and ".dcm" in error.message and "PNG" in error.message
    dicom = dicom_bytes(image_dataset())
    assert refusal(dicom, "chest.png").code == "content_mismatch"
    assert refusal(dicom, "chest.JPG").code == "content_mismatch"
    # Without a known extension the content decides (PACS exports often have none).
    assert ingest_bytes(dicom, "IM000001", secret=SECRET).source_format == "dicom"
    assert ingest_bytes(png, "upload", secret=SECRET).source_format == "png"


def test_refusal_and_acceptance_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    source = write(image_dataset(), tmp_path / "chest.dcm")
    image = ingest_path(source, secret=SECRET)
    image.to_dicom_bytes(), image.display_png_bytes()
    with pytest.raises(OrapoError):
        ingest_bytes(b"\x00" * 10, "chest.dcm", secret=SECRET)
    assert list(work.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chest.dcm", "cwd"]
