"""Window/level to an 8-bit rendering, fast enough for a viewer's slider.

Integer images are windowed through a look-up table built over the values the
image actually holds (at most 65536 entries for 16-bit data) and then gathered,
instead of evaluating the window formula on every one of millions of pixels;
float images fall back to vectorised numpy. The formulas are those of DICOM
PS3.3 C.11.2.1.2 (LINEAR, LINEAR_EXACT, SIGMOID), with output 0..255.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily

# Radiographs have no physical unit (unlike CT's Hounsfield units), so the
# presets are fractions of the image's own range between its 0.5th and 99.5th
# percentiles: (centre, width), in the MONOCHROME2 sense where higher is
# brighter. 'default' is the window the file asked for (see IngestedImage).
WINDOW_PRESETS: dict[str, tuple[float, float] | None] = {
    "default": None,
    "full": (0.5, 1.0),
    "lung": (0.42, 0.75),  # the darker values widened: lung markings, pneumothorax edges
    "mediastinum": (0.65, 0.5),  # brighter values: heart borders, lines and tubes
    "bone": (0.8, 0.4),  # brightest values: ribs, clavicles, spine
}

# Beyond this span of integer values a table costs more than it saves.
_MAX_LUT_SPAN = 1 << 20


def voi_function(center: float, width: float, function: str = "LINEAR") -> Callable[[np.ndarray], np.ndarray]:
    """The VOI window of PS3.3 C.11.2.1.2 as a function from values to floats in 0..255."""
    function = (function or "LINEAR").upper()
    c = float(center)
    if function == "SIGMOID":
        w = max(float(width), 1e-6)
        return lambda x: 255.0 / (1.0 + np.exp(-4.0 * (x - c) / w))
    if function == "LINEAR_EXACT":
        w = max(float(width), 1e-6)
        return lambda x: np.clip((x - c) / w + 0.5, 0.0, 1.0) * 255.0
    w = max(float(width), 1.0)
    if w == 1.0:  # a threshold: the linear formula divides by w - 1
        return lambda x: np.where(x > c - 0.5, 255.0, 0.0)
    return lambda x: np.clip((x - (c - 0.5)) / (w - 1.0) + 0.5, 0.0, 1.0) * 255.0


def render(values: np.ndarray, transfer: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """`transfer` (values -> 0..255 floats) applied to `values`, as rounded uint8."""
    values = np.asarray(values)
    if values.dtype.kind in "ui" and values.size:
        lo, hi = int(values.min()), int(values.max())
        if hi - lo < _MAX_LUT_SPAN:
            if lo >= 0 and values.dtype.kind == "u" and hi < _MAX_LUT_SPAN:
                # Index the table with the pixels themselves: no offset copy.
                lut = np.rint(transfer(np.arange(hi + 1, dtype=np.float64))).astype(np.uint8)
                return lut[values]
            lut = np.rint(transfer(np.arange(lo, hi + 1, dtype=np.float64))).astype(np.uint8)
            return lut[values.astype(np.int64) - lo]
    out = transfer(values.astype(np.float32, copy=False))
    return np.rint(out).astype(np.uint8)


def window(pixels: np.ndarray, center: float, width: float) -> np.ndarray:
    """A linear window (DICOM LINEAR) of `pixels` to uint8; higher values render brighter."""
    return render(pixels, voi_function(center, width, "LINEAR"))


def full_range_window(pixels: np.ndarray) -> tuple[float, float]:
    """The (centre, width) mapping the image's minimum to 0 and its maximum to 255."""
    lo, hi = float(np.min(pixels)), float(np.max(pixels))
    if pixels.dtype.kind in "ui":
        # For LINEAR, c - 0.5 - (w-1)/2 = min and c - 0.5 + (w-1)/2 = max.
        return (lo + hi + 1.0) / 2.0, max(hi - lo + 1.0, 1.0)
    return (lo + hi) / 2.0 + 0.5, max(hi - lo + 1.0, 1.0)


def preset_window(name: str, pixels: np.ndarray, default: tuple[float, float]) -> tuple[float, float]:
    """The (centre, width) of a named preset for these pixels (see WINDOW_PRESETS)."""
    if name not in WINDOW_PRESETS:
        raise KeyError(f"unknown window preset {name!r}; choose one of {sorted(WINDOW_PRESETS)}")
    fractions = WINDOW_PRESETS[name]
    if fractions is None:
        return default
    # Percentiles of the central region only: collimator shutters, markers and
    # the air outside the body fill the borders with extreme values that would
    # otherwise stretch every preset (the lung window came out nearly white).
    rows, cols = pixels.shape[:2]
    centre = pixels[rows // 6 : rows - rows // 6, cols // 6 : cols - cols // 6]
    # A strided sample is enough for percentiles and keeps a click instant.
    step = max(1, int(np.sqrt(centre.size / 250_000)))
    lo, hi = (float(v) for v in np.percentile(centre[::step, ::step], (1.0, 99.0)))
    span = max(hi - lo, 1.0)
    return lo + fractions[0] * span, max(fractions[1] * span, 1.0)
