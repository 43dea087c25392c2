"""Upload to `IngestedImage`: identify, refuse, decode, de-identify; write nothing.

The caller gets values only: the full-bit-depth pixels for the model, an 8-bit
rendering for the viewer, de-identified metadata, and a de-identified DICOM it
may store. Nothing of the original header survives in what is returned.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
import pydicom  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image
from pydicom.dataset import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    Dataset,
    FileMetaDataset,
)
from pydicom.uid import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    ExplicitVRLittleEndian,
    SecondaryCaptureImageStorage,
)

from orapo_core.errors import OrapoError
from orapo_core.imaging import sniff
from orapo_core.imaging.deid import deidentify, hashed_uid
from orapo_core.imaging.dicom_pixels import check_image_header, decode_first_frame, read_dataset
from orapo_core.imaging.raster import decode_raster
from orapo_core.imaging.scope import out_of_scope
from orapo_core.imaging.windowing import preset_window, window

DEFAULT_MAX_PIXELS = 50_000_000
_BINARY_VRS = frozenset({"OB", "OW", "OF", "OD", "OL", "OV", "UN"})


@dataclass
class IngestedImage:
    """One accepted image: pixels (higher is brighter), a rendering, and de-identified metadata."""

    source_format: str  # 'dicom' | 'png' | 'jpeg'
    pixels: np.ndarray  # 2-D, full bit depth after the modality LUT, MONOCHROME2 sense
    display: np.ndarray  # 2-D uint8 rendering with the default window
    window_center: float
    window_width: float
    bits_stored: int
    # de-identified header values, and `not_drafted`: why the image is no chest radiograph for the model, in words
    # following "Study N is" (orapo_core.imaging.scope), None for one to draft
    meta: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    deidentified: Dataset | None = None  # the de-identified header and first frame (DICOM input only)

    def window(self, center: float, width: float) -> np.ndarray:
        """The pixels rendered with another window (the viewer's slider)."""
        return window(self.pixels, center, width)

    def preset(self, name: str) -> tuple[float, float]:
        """(centre, width) of a WINDOW_PRESETS entry for this image; 'default' is the file's own."""
        return preset_window(name, self.pixels, (self.window_center, self.window_width))

    def display_png_bytes(self) -> bytes:
        """The display rendering as a PNG with no metadata chunks."""
        buffer = io.BytesIO()
        Image.fromarray(self.display, mode="L").save(buffer, format="PNG", compress_level=1)
        return buffer.getvalue()

    def to_dicom_bytes(self) -> bytes:
        """A de-identified DICOM file (explicit VR little endian); a secondary capture for PNG/JPEG."""
        ds = self.deidentified if self.deidentified is not None else _secondary_capture(self)
        buffer = io.BytesIO()
        pydicom.dcmwrite(buffer, ds, enforce_file_format=True)
        return buffer.getvalue()

    def header_items(self) -> list[tuple[str, str]]:
        """The de-identified header as (keyword, value) rows; no private, binary or pixel elements."""
        ds = self.deidentified if self.deidentified is not None else _secondary_capture(self)
        rows: list[tuple[str, str]] = []
        for elem in ds:
            if elem.tag.is_private or elem.VR in _BINARY_VRS or not elem.keyword:
                continue
            if elem.VR == "SQ":
                rows.append((elem.keyword, f"{len(elem.value)} item(s)"))
            else:
                rows.append((elem.keyword, "" if elem.value is None else str(elem.value)))
        return rows


def ingest_bytes(data: bytes, filename: str, *, secret: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> IngestedImage:
    """Accept one uploaded file or refuse it with an OrapoError (code and one plain sentence)."""
    kind = sniff.check_format(data, filename)
    try:
        if kind == sniff.DICOM:
            return _ingest_dicom(data, secret=secret, max_pixels=max_pixels)
        return _ingest_raster(data, kind, secret=secret, max_pixels=max_pixels)
    except OrapoError:
        raise
    except Exception as exc:
        # A file odd in a way no check foresaw: still a sentence, never a traceback
        # (the cause stays chained for the log).
        raise OrapoError(
            "unreadable_image",
            "This image could not be read; it may be damaged or of an unusual kind, export it again.",
        ) from exc


def ingest_path(path: str | Path, *, secret: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> IngestedImage:
    """`ingest_bytes` on a file read from disk."""
    path = Path(path)
    return ingest_bytes(path.read_bytes(), path.name, secret=secret, max_pixels=max_pixels)


def _ingest_dicom(data: bytes, *, secret: str, max_pixels: int) -> IngestedImage:
    ds = read_dataset(data)
    check_image_header(ds, max_pixels)
    frame = decode_first_frame(ds)
    header, notes = deidentify(ds, secret=secret)
    _store_first_frame(header, frame.stored, frame.photometric_out, ds)

    bits_stored = int(ds.get("BitsStored") or ds.BitsAllocated)
    meta = {
        "view_position": str(header.get("ViewPosition", "") or "") or None,
        "laterality": str(header.get("ImageLaterality", "") or header.get("Laterality", "") or "") or None,
        "modality": str(header.get("Modality", "") or "") or None,
        "body_part": str(header.get("BodyPartExamined", "") or "") or None,
        "rows": int(ds.Rows),
        "columns": int(ds.Columns),
        "photometric_interpretation": str(ds.get("PhotometricInterpretation", "")),
        "transfer_syntax": str(ds.file_meta.TransferSyntaxUID),
        "transfer_syntax_name": ds.file_meta.TransferSyntaxUID.name,
        "number_of_frames": int(ds.get("NumberOfFrames") or 1),
        "pixel_spacing": _pixel_spacing(header),
        "burned_in_annotation": str(header.get("BurnedInAnnotation", "") or "") or None,
        "bits_stored": bits_stored,
        "window_source": frame.window_source,
        "patient_pseudonym": str(header.PatientID),
        "patient_sex": str(header.get("PatientSex", "") or "") or None,
        "patient_age": str(header.get("PatientAge", "") or "") or None,
        "study_uid": str(header.get("StudyInstanceUID", "") or "") or None,
        "series_uid": str(header.get("SeriesInstanceUID", "") or "") or None,
        "sop_instance_uid": str(header.get("SOPInstanceUID", "") or "") or None,
        "study_date": str(header.get("StudyDate", "") or "") or None,
        "colour_share": frame.colour_share,
    }
    meta["not_drafted"] = out_of_scope(meta, sniff.DICOM)
    return IngestedImage(
        source_format=sniff.DICOM,
        pixels=frame.pixels,
        display=frame.display,
        window_center=frame.window_center,
        window_width=frame.window_width,
        bits_stored=bits_stored,
        meta=meta,
        warnings=frame.warnings + notes,
        deidentified=header,
    )


def _store_first_frame(header: Dataset, stored: np.ndarray, photometric: str, source: Dataset) -> None:
    """Put the decoded first frame in the de-identified header, uncompressed."""
    bits = int(source.get("BitsStored") or source.BitsAllocated)
    if stored.dtype.kind == "u" and bits < stored.dtype.itemsize * 8:
        stored = np.minimum(stored, (1 << bits) - 1)  # junk above BitsStored is not image
    if stored.dtype.itemsize * 8 < bits:
        bits = stored.dtype.itemsize * 8
    # Set first: pydicom will not put native pixels into a big-endian or compressed dataset.
    header.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    header.set_pixel_data(stored, photometric, bits, generate_instance_uid=False)
    if "PerFrameFunctionalGroupsSequence" in header:
        del header.PerFrameFunctionalGroupsSequence[1:]


def _pixel_spacing(ds: Dataset) -> list[float] | None:
    for keyword in ("PixelSpacing", "ImagerPixelSpacing"):
        value = ds.get(keyword)
        if value is not None:
            try:
                spacing = [float(v) for v in value]
            except (TypeError, ValueError):
                continue
            if len(spacing) == 2 and all(v > 0 for v in spacing):
                return spacing
    return None


def _ingest_raster(data: bytes, kind: str, *, secret: str, max_pixels: int) -> IngestedImage:
    raster = decode_raster(data, kind, max_pixels)
    pixels = raster.pixels
    if raster.bits_stored == 8:
        center, width = 128.0, 256.0  # identity: the image as the sender saw it
    else:
        lo, hi = float(pixels.min()), float(pixels.max())
        center, width = (lo + hi + 1.0) / 2.0, max(hi - lo + 1.0, 1.0)
    # UIDs come from the pixels, so the same picture uploaded twice is the same instance.
    content = hashlib.sha256(pixels.tobytes()).hexdigest()
    rows, columns = pixels.shape
    meta = {
        "view_position": None,
        "laterality": None,
        "modality": None,
        "body_part": None,
        "rows": rows,
        "columns": columns,
        "photometric_interpretation": "MONOCHROME2",
        "transfer_syntax": None,
        "transfer_syntax_name": None,
        "number_of_frames": 1,
        "pixel_spacing": None,
        "burned_in_annotation": None,
        "bits_stored": raster.bits_stored,
        "window_source": "identity" if raster.bits_stored == 8 else "min_max",
        "patient_pseudonym": None,
        "patient_sex": None,
        "patient_age": None,
        "study_uid": hashed_uid(secret, "study:" + content),
        "series_uid": hashed_uid(secret, "series:" + content),
        "sop_instance_uid": hashed_uid(secret, "instance:" + content),
        "study_date": None,
        "colour_share": raster.colour_share,
    }
    meta["not_drafted"] = out_of_scope(meta, kind)
    return IngestedImage(
        source_format=kind,
        pixels=pixels,
        display=window(pixels, center, width),
        window_center=center,
        window_width=width,
        bits_stored=raster.bits_stored,
        meta=meta,
        warnings=raster.warnings,
    )


def _secondary_capture(image: IngestedImage) -> Dataset:
    """A minimal secondary-capture DICOM for a PNG/JPEG upload; it carries no patient data."""
    meta = image.meta
    file_meta = FileMetaDataset()
    file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    file_meta.MediaStorageSOPInstanceUID = meta["sop_instance_uid"]
    file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = file_meta
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = meta["sop_instance_uid"]
    ds.StudyInstanceUID = meta["study_uid"]
    ds.SeriesInstanceUID = meta["series_uid"]
    ds.Modality = "OT"
    ds.ConversionType = "WSD"
    ds.PatientName = ""
    ds.PatientID = ""
    ds.PatientIdentityRemoved = "YES"
    ds.DeidentificationMethod = f"converted from {image.source_format.upper()}; file metadata discarded"
    ds.WindowCenter = image.window_center
    ds.WindowWidth = image.window_width
    ds.set_pixel_data(image.pixels, "MONOCHROME2", image.bits_stored, generate_instance_uid=False)
    return ds
