"""What a file really is, decided from its bytes, never from its name.

A PNG renamed `.dcm`, or a DICOM renamed `.png`, is refused rather than
silently decoded: the mismatch usually means the wrong file was picked, and a
clinician should know before a draft is written about it.
"""

from __future__ import annotations

from pathlib import PurePath

from orapo_core.errors import OrapoError

DICOM = "dicom"
PNG = "png"
JPEG = "jpeg"

_EXTENSIONS = {
    ".dcm": DICOM,
    ".dicom": DICOM,
    ".dic": DICOM,
    ".png": PNG,
    ".jpg": JPEG,
    ".jpeg": JPEG,
    ".jpe": JPEG,
    ".jfif": JPEG,
}

# Image formats we recognise only to name them in the refusal.
_OTHER_IMAGES = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"BM", "BMP"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"%PDF", "PDF"),
)

_NAMES = {DICOM: "a DICOM file", PNG: "a PNG image", JPEG: "a JPEG image"}


def _looks_like_bare_dicom(data: bytes) -> bool:
    # Some archives write DICOM without the 128-byte preamble: the stream then
    # opens with a little-endian group 0x0002 or 0x0008 tag.
    if len(data) < 8:
        return False
    group = int.from_bytes(data[0:2], "little")
    element = int.from_bytes(data[2:4], "little")
    return group in (0x0002, 0x0008) and element < 0x0100


def detect_format(data: bytes) -> str | None:
    """'dicom', 'png', 'jpeg', or None when the bytes are none of these."""
    if len(data) >= 132 and data[128:132] == b"DICM":
        return DICOM
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if _looks_like_bare_dicom(data):
        return DICOM
    return None


def format_from_name(filename: str) -> str | None:
    """The format a file's extension promises, or None for no or an unknown extension."""
    return _EXTENSIONS.get(PurePath(filename or "").suffix.lower())


def check_format(data: bytes, filename: str) -> str:
    """The format of `data`, refusing empty, unknown and misnamed files."""
    if not data:
        raise OrapoError("empty_file", "This file is empty; choose the image file again.")
    found = detect_format(data)
    if found is None:
        for magic, kind in _OTHER_IMAGES:
            if data.startswith(magic):
                raise OrapoError(
                    "unsupported_format",
                    f"This file is a {kind}, which is not accepted; upload a DICOM, PNG or JPEG image.",
                )
        raise OrapoError(
            "not_an_image",
            "This file is not a DICOM, PNG or JPEG image; it may be damaged or of another kind.",
        )
    promised = format_from_name(filename)
    if promised is not None and promised != found:
        suffix = PurePath(filename).suffix
        raise OrapoError(
            "content_mismatch",
            f"This file is named {suffix} but holds {_NAMES[found]}; check that it is the right file and rename it.",
        )
    return found
