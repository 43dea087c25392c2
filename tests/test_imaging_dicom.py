"""The DICOM grey-scale pipeline: modality LUT, VOI, MONOCHROME1, frames, and the real radiograph."""

from __future__ import annotations

import io

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.pixels import apply_modality_lut, apply_voi_lut
from pydicom.sequence import Sequence

from orapo_core.errors import OrapoError
from orapo_core.imaging import WINDOW_PRESETS, ingest_bytes, ingest_path, window
from tests.support.dicom import dicom_bytes, image_dataset, pydicom_data_file, ramp

SECRET = "test-secret"


def ingest(ds: Dataset):
    return ingest_bytes(dicom_bytes(ds), "image.dcm", secret=SECRET)


def pydicom_display(path, out_bits: int) -> np.ndarray:
    """The reference rendering: pydicom's own modality and VOI functions, scaled to 8 bits."""
    ds = pydicom.dcmread(path)
    voi = apply_voi_lut(apply_modality_lut(ds.pixel_array, ds), ds).astype(np.float64)
    display = np.rint(voi / ((1 << out_bits) - 1) * 255).astype(np.int16)
    return 255 - display if ds.PhotometricInterpretation == "MONOCHROME1" else display


@pytest.fixture(scope="module")
def radiograph():
    return ingest_path(pydicom_data_file("RG1_UNCI.dcm"), secret=SECRET)


def test_real_radiograph_shape_meta_and_window(radiograph):
    assert radiograph.source_format == "dicom"
    assert radiograph.pixels.shape == radiograph.display.shape == (1955, 1841)
    assert radiograph.display.dtype == np.uint8 and radiograph.pixels.dtype == np.uint16
    assert radiograph.bits_stored == 15
    meta = radiograph.meta
    assert (meta["view_position"], meta["modality"], meta["body_part"]) == ("PA", "CR", "CHEST")
    assert meta["photometric_interpretation"] == "MONOCHROME1" and meta["window_source"] == "window"
    assert meta["study_uid"].startswith("2.25.") and meta["patient_pseudonym"]
    # The file's window is 15000/30000 on the raw values; mirrored for MONOCHROME1 (max 32767).
    assert (radiograph.window_center, radiograph.window_width) == (32767 - 15000 + 1, 30000)


def test_monochrome1_renders_lungs_darker_than_mediastinum(radiograph):
    rows, columns = radiograph.display.shape
    band = slice(int(rows * 0.3), int(rows * 0.5))
    lungs = np.concatenate(
        [
            radiograph.display[band, int(columns * 0.2) : int(columns * 0.3)].ravel(),
            radiograph.display[band, int(columns * 0.7) : int(columns * 0.8)].ravel(),
        ]
    )
    mediastinum = radiograph.display[band, int(columns * 0.47) : int(columns * 0.53)]
    assert lungs.mean() + 30 < mediastinum.mean()
    # The model's pixels follow the same sense: higher is brighter.
    assert (
        radiograph.pixels[band, int(columns * 0.2) : int(columns * 0.3)].mean()
        < radiograph.pixels[band, int(columns * 0.47) : int(columns * 0.53)].mean()
    )


def test_display_matches_pydicoms_own_pipeline(radiograph):
    reference = pydicom_display(pydicom_data_file("RG1_UNCI.dcm"), out_bits=15)
    assert np.abs(radiograph.display.astype(np.int16) - reference).max() <= 1


def test_slider_window_reproduces_the_default_display(radiograph):
    again = window(radiograph.pixels, radiograph.window_center, radiograph.window_width)
    assert np.abs(again.astype(np.int16) - radiograph.display).max() <= 1
    # The table path for integers and the float path agree.
    as_float = window(radiograph.pixels.astype(np.float32), 20000, 8000)
    assert np.abs(as_float.astype(np.int16) - window(radiograph.pixels, 20000, 8000)).max() <= 1


@pytest.mark.slow  # decodes a 1955 x 1841 JPEG 2000 film
def test_lossless_jpeg2000_decodes_to_its_uncompressed_twin(radiograph):
    # pydicom-data pairs RG1_J2KR with RG1_UNCR (bit-identical) and RG1_J2KI with
    # RG1_UNCI; RG1_UNCI and RG1_J2KR are two renderings of the same exposure.
    j2kr = ingest_path(pydicom_data_file("RG1_J2KR.dcm"), secret=SECRET)
    uncr = ingest_path(pydicom_data_file("RG1_UNCR.dcm"), secret=SECRET)
    assert j2kr.pixels.shape == (1955, 1841)
    assert np.array_equal(j2kr.pixels, uncr.pixels)
    assert np.corrcoef(j2kr.pixels.ravel(), radiograph.pixels.ravel())[0, 1] > 0.999
    # Same patient and study in both files: same pseudonym and study UID; different instances.
    assert j2kr.meta["patient_pseudonym"] == radiograph.meta["patient_pseudonym"]
    assert j2kr.meta["study_uid"] == radiograph.meta["study_uid"]
    assert j2kr.meta["sop_instance_uid"] != radiograph.meta["sop_instance_uid"]
    # The de-identified copy is stored decompressed and reads back to the same stored values.
    back = pydicom.dcmread(io.BytesIO(j2kr.to_dicom_bytes()))
    assert back.file_meta.TransferSyntaxUID == pydicom.uid.ExplicitVRLittleEndian
    assert np.array_equal(back.pixel_array, pydicom.dcmread(pydicom_data_file("RG1_J2KR.dcm")).pixel_array)


def test_window_centre_and_width_from_the_file():
    ds = image_dataset(ramp(top=4095))
    ds.WindowCenter, ds.WindowWidth = 1000, 501
    image = ingest(ds)
    assert image.meta["window_source"] == "window"
    assert (image.window_center, image.window_width) == (1000, 501)
    values = image.pixels[0]
    assert (image.display[0][values <= 749] == 0).all() and (image.display[0][values >= 1250] == 255).all()
    reference = np.rint(apply_voi_lut(ds.pixel_array, ds).astype(np.float64) / 4095 * 255)
    assert np.abs(image.display - reference).max() <= 1


def test_voi_lut_sequence_is_preferred_to_the_window():
    ds = image_dataset(ramp(top=4095))
    ds.WindowCenter, ds.WindowWidth = 1000, 500  # ignored: the LUT comes first
    item = Dataset()
    item.LUTDescriptor = [4096, 0, 16]
    item.LUTData = list(np.rint(np.sqrt(np.arange(4096) / 4095) * 65535).astype(np.uint16))
    item["LUTData"].VR = "US"
    ds.VOILUTSequence = Sequence([item])
    image = ingest(ds)
    assert image.meta["window_source"] == "voi_lut_sequence"
    reference = np.rint(apply_voi_lut(ds.pixel_array, ds, prefer_lut=True).astype(np.float64) / 65535 * 255)
    assert np.abs(image.display - reference).max() <= 1
    # A square-root curve: the middle value renders well above mid-grey.
    middle = image.display[0][np.argmin(np.abs(image.pixels[0].astype(int) - 2048))]
    assert 175 <= middle <= 185


def test_min_max_when_the_file_gives_no_window():
    pixels = ramp(top=3000) + 500
    image = ingest(image_dataset(pixels))
    assert image.meta["window_source"] == "min_max"
    assert image.display[pixels == 500].max() == 0 and image.display[pixels == 3500].min() == 255
    assert np.all(np.diff(image.display[0].astype(int)) >= 0)


def test_rescale_is_applied_before_the_window():
    ds = image_dataset(ramp(top=1000))
    ds.RescaleSlope, ds.RescaleIntercept = 2, -100
    image = ingest(ds)
    assert np.array_equal(image.pixels, apply_modality_lut(ds.pixel_array, ds))
    ds.RescaleSlope, ds.RescaleIntercept = 0.5, 10.25
    image = ingest(ds)
    assert image.pixels.dtype == np.float32
    assert np.allclose(image.pixels, apply_modality_lut(ds.pixel_array, ds))


def test_monochrome1_is_the_mirror_of_monochrome2():
    pixels = ramp(top=4095)
    normal = image_dataset(pixels)
    normal.WindowCenter, normal.WindowWidth = 2000, 1000
    inverted = image_dataset(pixels, photometric="MONOCHROME1")
    inverted.WindowCenter, inverted.WindowWidth = 2000, 1000
    a, b = ingest(normal), ingest(inverted)
    assert np.abs(b.display.astype(int) - (255 - a.display.astype(int))).max() <= 1
    assert np.array_equal(b.pixels, 4095 - a.pixels)
    assert b.display[0, 0] == 255  # the lowest stored value is white in MONOCHROME1


def test_multi_frame_takes_the_first_frame_with_a_warning():
    frames = np.stack([ramp(), ramp()[:, ::-1], np.zeros_like(ramp())])
    image = ingest(image_dataset(frames))
    assert np.array_equal(image.pixels, frames[0])
    assert any("3 frames" in warning for warning in image.warnings)
    back = pydicom.dcmread(io.BytesIO(image.to_dicom_bytes()))
    assert int(back.get("NumberOfFrames", 1)) == 1 and np.array_equal(back.pixel_array, frames[0])


def test_colour_dicom_becomes_grey_with_a_warning():
    image = ingest_path(pydicom_data_file("SC_rgb.dcm"), secret=SECRET)
    assert image.pixels.ndim == 2 and any("colour" in warning for warning in image.warnings)


def test_presets_and_header_items(radiograph):
    assert set(WINDOW_PRESETS) >= {"default", "lung", "mediastinum", "bone"}
    assert radiograph.preset("default") == (radiograph.window_center, radiograph.window_width)
    assert radiograph.preset("lung")[0] < radiograph.preset("mediastinum")[0] < radiograph.preset("bone")[0]
    with pytest.raises(KeyError):
        radiograph.preset("brain")
    rows = dict(radiograph.header_items())
    assert rows["PatientIdentityRemoved"] == "YES" and rows["ViewPosition"] == "PA"
    assert "PixelData" not in rows and all(key for key in rows)
    png = radiograph.display_png_bytes()
    assert png.startswith(b"\x89PNG") and b"tEXt" not in png


def test_old_and_unusual_encodings():
    # Big endian: decoded to native byte order, stored back little endian.
    big = ingest_path(pydicom_data_file("emri_small_big_endian.dcm"), secret=SECRET)
    assert big.pixels.dtype.isnative and any("10 frames" in warning for warning in big.warnings)
    reference = pydicom.dcmread(pydicom_data_file("emri_small_big_endian.dcm")).pixel_array[0]
    assert np.array_equal(big.pixels, reference)
    assert np.array_equal(pydicom.dcmread(io.BytesIO(big.to_dicom_bytes())).pixel_array, reference)
    # No file meta header at all (pre-2000 style), palette colour.
    palette = ingest_path(pydicom_data_file("OT-PAL-8-face.dcm"), secret=SECRET)
    assert palette.pixels.shape == (480, 640) and any("colour" in warning for warning in palette.warnings)
    assert palette.pixels.max() > 255  # luminance of the 16-bit palette, not clipped to the 8 stored bits
    assert pydicom.dcmread(io.BytesIO(palette.to_dicom_bytes())).PatientIdentityRemoved == "YES"


def test_non_radiograph_objects_are_refused_by_kind():
    with pytest.raises(OrapoError) as caught:
        ingest_path(pydicom_data_file("liver.dcm"), secret=SECRET)
    assert caught.value.code == "not_an_image_object" and "Segmentation" in caught.value.message
    with pytest.raises(OrapoError) as caught:
        ingest_path(pydicom_data_file("SC_rgb_32bit.dcm"), secret=SECRET)
    assert caught.value.code == "unsupported_format" and "32-bit" in caught.value.message


def test_unforeseen_damage_is_still_a_sentence():
    ds = image_dataset()
    ds.WindowCenter, ds.WindowWidth = "1234", "5678"
    data = dicom_bytes(ds).replace(b"1234", b"abcd")  # not numbers: the window is ignored
    image = ingest_bytes(data, "image.dcm", secret=SECRET)
    assert image.meta["window_source"] == "min_max" and any("window is invalid" in w for w in image.warnings)
    ds = image_dataset()
    ds.BitsAllocated = 12  # no codec decodes a native 12-bit allocation
    with pytest.raises(OrapoError) as caught:
        ingest(ds)
    assert caught.value.code in ("dimension_mismatch", "undecodable_pixels", "unreadable_image")
    assert "\n" not in caught.value.message
