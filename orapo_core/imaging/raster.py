"""PNG and JPEG to pixels, keeping nothing of the file but its pixels.

EXIF, XMP, ICC and PNG text chunks can hold a patient's name or an accession
number, so only the pixel array leaves this module (EXIF orientation is applied
first, since it is geometry, not identity). The size is checked from the header
before the pixels are decoded, so a decompression bomb is refused unread.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image, ImageOps

from orapo_core.errors import OrapoError
from orapo_core.imaging.scope import colour_share


@dataclass
class RasterImage:
    pixels: np.ndarray  # uint8 or uint16, 2-D grey, higher is brighter
    bits_stored: int
    warnings: list[str] = field(default_factory=list)
    colour_share: float = 0.0  # share of strongly coloured pixels (orapo_core.imaging.scope.colour_share)


_NAMES = {"png": "PNG", "jpeg": "JPEG"}


def decode_raster(data: bytes, kind: str, max_pixels: int) -> RasterImage:
    """Decode a PNG or JPEG (already identified by its bytes) to a grey array."""
    label = _NAMES[kind]
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=[label])
        width, height = image.size
    except Image.DecompressionBombError:
        raise OrapoError(
            "too_many_pixels", f"This {label} image is too large to be a radiograph; it may be a decompression bomb."
        ) from None
    except Exception as exc:
        raise OrapoError(
            "truncated_file", f"This {label} file is incomplete or damaged; copy or export it again."
        ) from exc
    if width * height > max_pixels:
        raise OrapoError(
            "too_many_pixels",
            f"This image is {width:,} x {height:,} pixels, over the {max_pixels / 1e6:g}-megapixel limit; it is not a usable radiograph.",
        )
    try:
        image.load()
        image = ImageOps.exif_transpose(image)
    except Exception as exc:  # Pillow raises OSError or SyntaxError on cut or broken streams
        raise OrapoError(
            "truncated_file",
            f"This {label} file is incomplete or damaged (it ends too early); copy or export it again.",
        ) from exc

    notes: list[str] = []
    coloured = 0.0
    mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I"):
        pixels = np.asarray(image)
        if pixels.dtype != np.uint16:
            pixels = np.clip(pixels, 0, 65535).astype(np.uint16)
        bits = 16
    elif mode in ("L", "1"):
        pixels, bits = np.asarray(image.convert("L")), 8
    else:
        rgb = np.asarray(image.convert("RGB"))
        if not (np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 1], rgb[..., 2])):
            notes.append("This image is in colour; it was converted to grey-scale for reading.")
            coloured = colour_share(rgb)
        pixels, bits = np.asarray(image.convert("L")), 8
    return RasterImage(pixels=np.ascontiguousarray(pixels), bits_stored=bits, warnings=notes, colour_share=coloured)
