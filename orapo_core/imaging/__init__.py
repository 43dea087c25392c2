"""Image ingest: DICOM, PNG and JPEG in; de-identified pixels, rendering and header out.

`ingest_bytes` either returns an `IngestedImage` or raises `OrapoError` with a
code and one sentence a clinician can act on; it never writes to disk.
"""

from orapo_core.imaging.deid import deidentify, hashed_uid, pseudonym
from orapo_core.imaging.ingest import DEFAULT_MAX_PIXELS, IngestedImage, ingest_bytes, ingest_path
from orapo_core.imaging.sniff import detect_format
from orapo_core.imaging.windowing import WINDOW_PRESETS, preset_window, window

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "IngestedImage",
    "WINDOW_PRESETS",
    "deidentify",
    "detect_format",
    "hashed_uid",
    "ingest_bytes",
    "ingest_path",
    "preset_window",
    "pseudonym",
    "window",
]
