"""PNG and JPEG uploads: 8 and 16 bits, colour, orientation, and no metadata kept."""

from __future__ import annotations

import io

import numpy as np
import pydicom
from PIL import Image, PngImagePlugin

from orapo_core.imaging import ingest_bytes

SECRET = "test-secret"


def chest_like(rows: int = 120, columns: int = 100, top: int = 255) -> np.ndarray:
    """A smooth image with dark 'lungs' either side of a bright middle band."""
    x = np.linspace(-1, 1, columns)
    profile = 0.3 + 0.7 * np.exp(-((x / 0.25) ** 2))
    return np.tile(np.rint(profile * top), (rows, 1))


def encode(array: np.ndarray, fmt: str, **save) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **save)
    return buffer.getvalue()


def test_8_bit_png_is_shown_as_sent():
    pixels = chest_like().astype(np.uint8)
    image = ingest_bytes(encode(pixels, "PNG"), "chest.png", secret=SECRET)
    assert image.source_format == "png" and image.bits_stored == 8
    assert np.array_equal(image.pixels, pixels) and np.array_equal(image.display, pixels)
    assert image.deidentified is None and image.warnings == []


def test_16_bit_png_keeps_full_depth():
    pixels = (chest_like(top=4000) + 17).astype(np.uint16)
    image = ingest_bytes(encode(pixels, "PNG"), "chest.png", secret=SECRET)
    assert image.bits_stored == 16 and image.pixels.dtype == np.uint16
    assert np.array_equal(image.pixels, pixels)
    assert image.display.min() == 0 and image.display.max() == 255  # min/max window
    back = pydicom.dcmread(io.BytesIO(image.to_dicom_bytes()))
    assert np.array_equal(back.pixel_array, pixels) and back.PatientIdentityRemoved == "YES"


def test_jpeg_grey_and_colour():
    pixels = chest_like().astype(np.uint8)
    grey = ingest_bytes(encode(pixels, "JPEG", quality=95), "chest.jpg", secret=SECRET)
    assert grey.source_format == "jpeg" and grey.pixels.shape == pixels.shape
    assert np.abs(grey.pixels.astype(int) - pixels).mean() < 3 and grey.warnings == []
    # A grey picture saved as RGB is not "colour"; a tinted one is, and says so.
    as_rgb = ingest_bytes(encode(np.dstack([pixels] * 3), "PNG"), "chest.png", secret=SECRET)
    assert as_rgb.pixels.ndim == 2 and as_rgb.warnings == []
    tinted = np.dstack([pixels, pixels, (pixels // 2).astype(np.uint8)])
    colour = ingest_bytes(encode(tinted, "JPEG", quality=95), "chest.jpeg", secret=SECRET)
    assert colour.pixels.ndim == 2 and any("colour" in warning for warning in colour.warnings)


def test_metadata_is_stripped():
    pixels = chest_like().astype(np.uint8)
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "Patient Jane Doe MRN-774411")
    info.add_itxt("Description", "Jane Doe born 1950")
    png = encode(pixels, "PNG", pnginfo=info)
    assert b"Jane Doe" in png
    exif = Image.Exif()
    exif[0x010E] = "Jane Doe MRN-774411"  # ImageDescription
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    jpeg = encode(pixels, "JPEG", quality=95, exif=exif.tobytes())
    assert b"Jane Doe" in jpeg
    for data, name in ((png, "chest.png"), (jpeg, "chest.jpg")):
        image = ingest_bytes(data, name, secret=SECRET)
        for output in (image.display_png_bytes(), image.to_dicom_bytes(), repr(image.meta).encode()):
            assert b"Jane Doe" not in output and b"774411" not in output
    # EXIF orientation is geometry, so it is applied before the EXIF goes.
    assert ingest_bytes(jpeg, "chest.jpg", secret=SECRET).pixels.shape == (pixels.shape[1], pixels.shape[0])


def test_same_picture_same_uids_and_secret_matters():
    data = encode(chest_like().astype(np.uint8), "PNG")
    a = ingest_bytes(data, "a.png", secret=SECRET)
    b = ingest_bytes(data, "b.png", secret=SECRET)
    c = ingest_bytes(data, "a.png", secret="other")
    assert a.meta["sop_instance_uid"] == b.meta["sop_instance_uid"] != c.meta["sop_instance_uid"]
    assert a.meta["sop_instance_uid"].startswith("2.25.")
    rows = dict(a.header_items())
    assert rows["SOPInstanceUID"] == a.meta["sop_instance_uid"] and rows["Modality"] == "OT"
