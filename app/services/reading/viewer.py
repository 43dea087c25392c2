"""What the Read tab's viewer shows: one study's first image at full bit depth, for its reader only.

The browser viewer (Cornerstone3D, `viewer/`) windows, zooms and pans by itself; the server's part is to check
that the user may read the study (`drafting.open_study`: an administrator any, a radiologist their own) and to
hand over the decoded values of the stored de-identified DICOM: the same `viewer_pixels` the model drafts from,
modality LUT applied and MONOCHROME1 mirrored, as a raw little-endian array with a small header (size, type,
default window, the value range and the presets, computed here by `orapo_core.imaging.preset_window` so the
browser's presets and the server's are one definition). Shipping the decoded array rather than the DICOM file
keeps every codec pydicom reads (JPEG 2000, JPEG-LS, RLE...) viewable without WebAssembly decoders in the page.

`fallback_png` is the server-side rendering the page falls back to when the viewer's script cannot run.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PIL import Image

from app.services.reading import drafting
from db.records import ImageRecord, StudyOverview, UserRecord
from orapo_core.config import Settings
from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    import numpy as np

    from db.database import Database

PRESETS = ("lung", "mediastinum", "bone", "default", "full")
FALLBACK_MAX_SIDE = 1400  # the fallback <img> is scaled by the browser; more pixels only cost encoding time


@dataclass(frozen=True)
class ViewerImage:
    pixels: bytes  # rows x columns values, little-endian, row-major
    header: dict[str, Any]  # rows, columns, dtype, bits_stored, window, range, presets, modality


def _wire_array(pixels: np.ndarray) -> np.ndarray:
    """The smallest of uint8/uint16/int16/float32 that holds the values exactly (what the viewer reads)."""
    import numpy as np

    if pixels.dtype.kind in "ui" and pixels.size:
        lo, hi = int(pixels.min()), int(pixels.max())
        for dtype in ("<u2", "<i2") if pixels.dtype.itemsize > 1 else ("u1",):
            info = np.iinfo(dtype)
            if info.min <= lo and hi <= info.max:
                return pixels.astype(dtype, copy=False)
    return pixels.astype("<f4", copy=False)


def viewer_image(
    db: Database, settings: Settings, user: UserRecord, study_id: int, image_id: int | None = None
) -> ViewerImage:
    """The first image of a study this user may read, as the viewer loads it (`image_id`, if given, must be it)."""
    overview = drafting.open_study(db, user, study_id)
    image = drafting.first_image(overview)
    if image_id is not None and image_id != image.id:
        raise OrapoError("image_not_found", "This study has no such image.")
    return image_wire(settings, overview, image)


def image_wire(settings: Settings, overview: StudyOverview, image: ImageRecord) -> ViewerImage:
    """One image of a study in the viewer's wire format: its pixels in the smallest exact dtype, and the header the
    viewer reads (size, dtype, bit depth, modality, default window, value range and presets)."""
    import numpy as np

    view = drafting.viewer_pixels(settings, image)
    wire = np.ascontiguousarray(_wire_array(view.pixels))
    header = {
        "study": overview.study.id,
        "image": image.id,
        "rows": int(wire.shape[0]),
        "columns": int(wire.shape[1]),
        "dtype": wire.dtype.name,  # uint8, uint16, int16 or float32
        "bits_stored": image.bits_stored,
        "modality": overview.study.modality or "DX",
        "window": [float(v) for v in view.default_window],
        "range": [float(v) for v in view.value_range],
        "presets": {name: [float(v) for v in drafting.preset(view, name)] for name in PRESETS},
    }
    return ViewerImage(wire.tobytes(), header)


def fallback_png(db: Database, settings: Settings, user: UserRecord, study_id: int, preset: str) -> bytes:
    """The study's first image windowed on the server with a named preset, as a PNG (no script needed)."""
    view = drafting.viewer_pixels(settings, drafting.first_image(drafting.open_study(db, user, study_id)))
    picture = Image.fromarray(drafting.render(view, *drafting.preset(view, preset)))
    if max(picture.size) > FALLBACK_MAX_SIDE:
        picture.thumbnail((FALLBACK_MAX_SIDE, FALLBACK_MAX_SIDE), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    picture.save(out, format="PNG", compress_level=1)
    return out.getvalue()
