"""The picture a model is shown of a film: 8-bit RGB, no larger than `DEFAULT_MAX_SIDE` a side.

One definition for everything that shows a model a film: drafting (`draft.Drafter.prepare`), a round's
finding checks fitted on the prompt states of its training films (`verifier.fit_round_verifier`), and the
benchmarks, so a check reads the films as the drafts it vets see them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PIL import Image

from orapo_core.errors import OrapoError

if TYPE_CHECKING:
    import numpy as np

# Radiographs are often 3000 px a side; a VLM's own resize would keep far more
# visual tokens than a report needs, and those tokens dominate CPU latency.
DEFAULT_MAX_SIDE = 1024


def to_rgb_image(image: Image.Image | np.ndarray, *, max_side: int | None = DEFAULT_MAX_SIDE) -> Image.Image:
    """An 8-bit RGB PIL image from a PIL image or an array, no larger than `max_side` a side.

    A 2-D array that is not uint8 is full bit depth (a DICOM's stored values):
    its full range is mapped to 0..255, the same default window the viewer uses.
    """
    import numpy as np

    if isinstance(image, Image.Image) and image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        image = np.asarray(image)  # PIL's own conversion to 8 bits clips instead of scaling
    if isinstance(image, np.ndarray):
        picture = Image.fromarray(_to_uint8(image)).convert("RGB")
    elif isinstance(image, Image.Image):
        picture = image.convert("RGB")
    else:
        raise OrapoError("image_invalid", f"Cannot draft from a {type(image).__name__}: give an image or a 2-D array.")
    if max_side and max(picture.size) > max_side:
        picture = picture.copy()
        picture.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
    return picture


def _to_uint8(pixels: np.ndarray) -> np.ndarray:
    import numpy as np

    if pixels.ndim == 3 and pixels.shape[2] in (3, 4) and pixels.dtype == np.uint8:
        return pixels[..., :3]
    if pixels.ndim != 2 or pixels.size == 0:
        raise OrapoError("image_invalid", f"Expected a 2-D grey image; got an array of shape {pixels.shape}.")
    if pixels.dtype == np.uint8:
        return pixels
    values = np.nan_to_num(pixels.astype(np.float32, copy=False))
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return np.zeros(values.shape, dtype=np.uint8)
    return np.round((values - low) * (255.0 / (high - low))).astype(np.uint8)
