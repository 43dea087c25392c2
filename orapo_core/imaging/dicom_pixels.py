"""DICOM to pixels: refuse what cannot be a radiograph, then decode one frame.

Every check that can be made on the header is made before any pixel is decoded,
so a decompression bomb or a lying header costs nothing. The grey-scale
pipeline is modality LUT, then VOI (a VOI LUT sequence, else the file's window,
else the full range), then MONOCHROME1 inversion. pydicom's own functions do
the look-up tables; rescale and windowing are done here in float32/integer and
through a value table (see windowing.py), because pydicom's float64 arrays cost
ten times more on a 2000x2000 radiograph.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
import pydicom  # noqa: TID253 -- this module is heavy; light ones import it lazily
from pydicom.dataset import Dataset  # noqa: TID253 -- this module is heavy; light ones import it lazily
from pydicom.pixels import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    apply_color_lut,
    apply_modality_lut,
    apply_voi_lut,
    get_decoder,
    pixel_array,
)
from pydicom.uid import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    UID,
    ExplicitVRBigEndian,
    ExplicitVRLittleEndian,
    ImplicitVRLittleEndian,
)

from orapo_core.errors import OrapoError
from orapo_core.imaging.scope import colour_share
from orapo_core.imaging.windowing import full_range_window, render, voi_function

# pydicom warns about a value that does not conform to its VR by quoting it ("Invalid value for VR TM: 'QZXTIME'"),
# and a warning reaches the server's log, where header values (PHI) must never go. De-identification checks every
# value against its VR itself (`orapo_core.imaging.deid.conforms`) and drops what does not conform, so pydicom's own
# check on reading is off for the whole process.
pydicom.config.settings.reading_validation_mode = pydicom.config.IGNORE


@dataclass
class DecodedFrame:
    """The first frame of a DICOM image, in the MONOCHROME2 sense, with its default window."""

    stored: np.ndarray  # the frame as stored (before the modality LUT), for the de-identified file
    pixels: np.ndarray  # after the modality LUT, inverted if MONOCHROME1: higher is brighter
    display: np.ndarray  # uint8 rendering with the file's own VOI
    window_center: float
    window_width: float
    window_source: str  # 'voi_lut_sequence' | 'window' | 'min_max'
    photometric_out: str  # photometric interpretation of `stored` (YBR is decoded to RGB), upper case
    warnings: list[str] = field(default_factory=list)
    colour_share: float = 0.0  # share of strongly coloured pixels (orapo_core.imaging.scope.colour_share)


def _truncated() -> OrapoError:
    return OrapoError(
        "truncated_file",
        "This DICOM file is incomplete or damaged (it ends too early); copy or export it again.",
    )


def read_dataset(data: bytes) -> Dataset:
    """Parse a DICOM byte stream, refusing one that is cut short or damaged."""
    bare = len(data) < 132 or data[128:132] != b"DICM"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ds = pydicom.dcmread(io.BytesIO(data), force=bare)
        except Exception as exc:  # pydicom raises many kinds on a cut or mangled stream
            raise _truncated() from exc
    if any("end of file" in str(w.message).lower() for w in caught):
        raise _truncated()
    # pydicom silently keeps a value shorter than its declared length when the
    # file ends inside it, which is how a cut-off upload usually looks.
    for tag in list(ds.keys()):
        raw = ds.get_item(tag)
        length = getattr(raw, "length", None)
        value = getattr(raw, "value", None)
        if isinstance(value, bytes) and length not in (None, 0xFFFFFFFF) and len(value) < length:
            raise _truncated()
    if "TransferSyntaxUID" not in ds.file_meta:
        # Old files without a file meta header: pydicom found the encoding by
        # reading, which names the transfer syntax unless the pixels are compressed.
        implicit, little = ds.original_encoding
        pixel_elem = ds.get_item("PixelData") if "PixelData" in ds else None
        if (
            implicit is None
            or getattr(pixel_elem, "is_undefined_length", False)
            or getattr(pixel_elem, "length", 0) == 0xFFFFFFFF
        ):
            raise OrapoError(
                "unsupported_transfer_syntax",
                "This DICOM file does not say how its pixels are encoded; export it again as a standard DICOM file.",
            )
        ds.file_meta.TransferSyntaxUID = (
            ImplicitVRLittleEndian if implicit else ExplicitVRLittleEndian if little else ExplicitVRBigEndian
        )
    return ds


def _object_kind(ds: Dataset) -> str | None:
    """A plain name for a non-image SOP class, or None for an image (or unknown) class."""
    modality = str(ds.get("Modality", "")).upper()
    sop_class = UID(str(ds.get("SOPClassUID", "")))
    name = sop_class.name if sop_class and sop_class.is_valid else ""
    if "SR Storage" in name or modality == "SR":
        return "a DICOM structured report"
    if sop_class and sop_class.type == "SOP Class" and "Image" not in name and "Storage" in name:
        return f"a DICOM {name.replace(' Storage', '').strip()} object"
    if modality in {"KO", "PR", "DOC", "ECG", "RTSTRUCT", "RTPLAN", "RTDOSE", "REG", "SEG"}:
        return f"a DICOM {modality} object"
    return None


def check_image_header(ds: Dataset, max_pixels: int) -> None:
    """Every refusal that the header alone can justify, before any pixel is decoded."""
    kind = _object_kind(ds)
    if kind is not None:
        raise OrapoError(
            "not_an_image_object", f"This file is {kind}, which holds no image; upload the radiograph itself."
        )
    if "PixelData" not in ds:
        if "FloatPixelData" in ds or "DoubleFloatPixelData" in ds:
            raise OrapoError(
                "unsupported_format",
                "This DICOM file holds floating-point pixels, which are not accepted; upload the radiograph as exported by the modality.",
            )
        raise OrapoError(
            "no_pixel_data",
            "This DICOM file holds no image (no pixel data); upload the radiograph itself, or export it again if the file was cut short.",
        )
    rows, columns = int(ds.get("Rows") or 0), int(ds.get("Columns") or 0)
    if rows <= 0 or columns <= 0 or "BitsAllocated" not in ds:
        raise OrapoError(
            "dimension_mismatch", "This DICOM file does not give the size of its image; it is damaged, export it again."
        )
    if int(ds.BitsAllocated) > 16:
        raise OrapoError(
            "unsupported_format",
            f"This DICOM file holds {int(ds.BitsAllocated)}-bit pixels, which are not accepted; upload the radiograph as exported for viewing (8 to 16 bits).",
        )
    if rows * columns > max_pixels:
        raise OrapoError(
            "too_many_pixels",
            f"This image is {columns:,} x {rows:,} pixels, over the {max_pixels / 1e6:g}-megapixel limit; it is not a usable radiograph.",
        )
    syntax = ds.file_meta.TransferSyntaxUID
    try:
        decoder = get_decoder(syntax)
    except NotImplementedError:
        decoder = None
    if decoder is None or not decoder.is_available:
        label = syntax.name if syntax.is_valid and syntax.name != syntax else f"an unknown encoding ({syntax})"
        raise OrapoError(
            "unsupported_transfer_syntax",
            f"This DICOM file uses {label}, which cannot be decoded here; export it uncompressed or as JPEG 2000.",
        )
    if not syntax.is_compressed:
        frames = int(ds.get("NumberOfFrames") or 1)
        samples = int(ds.get("SamplesPerPixel") or 1)
        if str(ds.get("PhotometricInterpretation", "")).upper() == "YBR_FULL_422":
            samples = 2  # chroma is shared by pixel pairs: two values per pixel
        bits = int(ds.BitsAllocated)
        expected = (rows * columns * samples * frames * bits + 7) // 8
        actual = len(ds.PixelData)
        if actual not in (expected, expected + 1):  # one byte of padding to even length is legal
            raise OrapoError(
                "dimension_mismatch",
                f"This DICOM file says its image is {columns} x {rows} pixels, but its pixel data does not match that size; it is damaged, export it again.",
            )


def _modality_values(stored: np.ndarray, ds: Dataset) -> tuple[np.ndarray, float]:
    """Modality-LUT output and the sum of its possible extremes (the MONOCHROME1 mirror)."""
    bits = int(ds.get("BitsStored") or ds.BitsAllocated)
    signed = int(ds.get("PixelRepresentation") or 0) == 1
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if "ModalityLUTSequence" in ds:
        out_bits = int(ds.ModalityLUTSequence[0].LUTDescriptor[2])
        return apply_modality_lut(stored, ds), float((1 << out_bits) - 1)
    slope = float(ds.get("RescaleSlope", 1) or 1)
    intercept = float(ds.get("RescaleIntercept", 0) or 0)
    mirror = slope * (lo + hi) + 2 * intercept
    if slope == 1 and intercept == 0:
        if not signed and stored.dtype.kind == "u" and hi < np.iinfo(stored.dtype).max:
            # Bits above BitsStored may hold overlays or junk; they are not image.
            stored = np.minimum(stored, hi)
        return stored, mirror
    if slope.is_integer() and intercept.is_integer():
        return stored.astype(np.int32) * int(slope) + int(intercept), mirror
    return stored.astype(np.float32) * np.float32(slope) + np.float32(intercept), mirror


def _mirror(values: np.ndarray, mirror: float) -> np.ndarray:
    if values.dtype.kind == "u":
        return np.subtract(values.dtype.type(mirror), values, dtype=values.dtype)
    if values.dtype.kind == "i":
        return (int(mirror) - values).astype(values.dtype, copy=False)
    return np.float32(mirror) - values


def _file_window(ds: Dataset) -> tuple[float, float] | None:
    """The first window centre and width of the file, or None when absent or not numbers."""
    try:
        center, width = ds.get("WindowCenter"), ds.get("WindowWidth")
        if center is None or width is None:
            return None
        if isinstance(center, pydicom.multival.MultiValue):
            center = center[0]
        if isinstance(width, pydicom.multival.MultiValue):
            width = width[0]
        return float(center), float(width)
    except (TypeError, ValueError, IndexError):  # pydicom converts DS text on access
        return None


def _voi_lut_transfer(ds: Dataset) -> tuple[Callable[[np.ndarray], np.ndarray], float, float]:
    item = ds.VOILUTSequence[0]
    entries, first, bits = (int(v) for v in item.LUTDescriptor)
    entries = entries or 65536
    span = apply_voi_lut(np.arange(first, first + entries, dtype=np.int64), ds, index=0, prefer_lut=True)
    top = max(float((1 << bits) - 1), float(np.max(span)))

    def transfer(x: np.ndarray) -> np.ndarray:
        y = apply_voi_lut(np.rint(x).astype(np.int64), ds, index=0, prefer_lut=True)
        return np.clip(y.astype(np.float64) / top, 0.0, 1.0) * 255.0

    # The slider needs a linear window: the one spanning the LUT's input range.
    return transfer, first + entries / 2.0, float(entries)


def _grey(stored: np.ndarray, ds: Dataset, notes: list[str]) -> tuple[np.ndarray, str, float]:
    """Grey values of the frame, the photometric interpretation `stored` is in, and its share of strongly coloured
    pixels (0 for a grey frame)."""
    photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).upper()
    if photometric in ("MONOCHROME1", "MONOCHROME2"):
        return stored, photometric, 0.0
    if photometric == "PALETTE COLOR":
        rgb = apply_color_lut(stored, ds)
    else:  # RGB, or YBR that pydicom already converted to RGB
        rgb, photometric = stored, "RGB"
    notes.append("This image is in colour; it was converted to grey-scale for reading.")
    luminance = rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114
    return np.rint(luminance).astype(rgb.dtype), photometric, colour_share(rgb)


def decode_first_frame(ds: Dataset) -> DecodedFrame:
    """Decode the first frame of a header-checked dataset and render its default window."""
    notes: list[str] = []
    frames = int(ds.get("NumberOfFrames") or 1)
    if frames > 1:
        notes.append(f"This file holds {frames} frames; only the first is shown and used.")
    try:
        stored = pixel_array(ds, index=0 if frames > 1 else None)
    except Exception as exc:  # each codec raises its own kinds
        raise OrapoError(
            "undecodable_pixels",
            "The image inside this DICOM file could not be decoded; it is damaged or its compression is not supported.",
        ) from exc
    if not stored.dtype.isnative:  # big-endian files decode to big-endian arrays
        stored = stored.astype(stored.dtype.newbyteorder("="))
    rows, columns = int(ds.Rows), int(ds.Columns)
    if stored.shape[:2] != (rows, columns):
        raise OrapoError(
            "dimension_mismatch",
            f"This DICOM file says its image is {columns} x {rows} pixels, but the image decodes to another size; it is damaged, export it again.",
        )
    grey, photometric_out, coloured = _grey(stored, ds, notes)
    monochrome1 = str(ds.get("PhotometricInterpretation", "")).upper() == "MONOCHROME1"
    colour = photometric_out not in ("MONOCHROME1", "MONOCHROME2")
    if colour:
        values, mirror = grey, 0.0  # modality and VOI LUTs do not apply to colour
    else:
        values, mirror = _modality_values(grey, ds)
    pixels = _mirror(values, mirror) if monochrome1 else values

    center = width = None
    if "VOILUTSequence" in ds and not colour:
        transfer, center, width = _voi_lut_transfer(ds)
        display = render(values, transfer)
        if monochrome1:
            display = 255 - display
            center = mirror - center + 1.0
        source = "voi_lut_sequence"
    elif "WindowCenter" in ds and not colour:
        file_window = _file_window(ds)
        if file_window is None or file_window[1] <= 0:
            notes.append("The file's display window is invalid; the full range is shown instead.")
        else:
            center, width = file_window
            function = str(ds.get("VOILUTFunction", "LINEAR") or "LINEAR").upper()
            if monochrome1:
                # Mirroring x -> M - x mirrors the window; LINEAR's half-pixel offset adds one.
                center = mirror - center + (1.0 if function not in ("LINEAR_EXACT", "SIGMOID") else 0.0)
            display = render(pixels, voi_function(center, width, function))
            source = "window"
    if center is None or width is None:  # (set together)
        center, width = full_range_window(pixels)
        display = render(pixels, voi_function(center, width))
        source = "min_max"
    return DecodedFrame(
        stored=stored,
        pixels=pixels,
        display=display,
        window_center=float(center),
        window_width=float(width),
        window_source=source,
        photometric_out=photometric_out,
        warnings=notes,
        colour_share=coloured,
    )
