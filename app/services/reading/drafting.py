"""Viewing and drafting one study: the viewer's pixels, a stored draft, and uploads.

The models in memory are `app.services.reading.registry.ModelRegistry` (the served
version, loaded once, warmed and calibrated in the background, its drafts batched).
Only chest radiographs are drafted (`app.services.reading.scope`): `draft_study`
refuses a study stored as something else, and refuses the first draft of an image
whose header cannot say what it is when the draft's own film score is far from the
model's calibration (the draft is then neither stored nor shown).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from app.services.operations.metrics import count_draft
from app.services.reading.ingest import IngestOutcome, ingest_bytes
from app.services.reading.registry import ModelRegistry
from app.services.reading.scope import refuse_not_drafted, screen_draft, unfamiliar_summary
from app.services.reading.studies import first_image, open_study  # the access rule, shared
from db import AuditRepository, Database, DraftRepository
from db.records import DraftRecord, ImageRecord, UserRecord
from orapo_core.config import Settings
from orapo_core.errors import OrapoError
from orapo_core.models.draft import DRAFT_SAMPLES  # how many samples measure each sentence's confidence

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class ViewerPixels:
    pixels: Any  # 2-D array, full bit depth, higher is brighter
    default_window: tuple[float, float]
    value_range: tuple[float, float]


def viewer_pixels(settings: Settings, image: ImageRecord) -> ViewerPixels:
    """The stored de-identified DICOM read back at full bit depth (PNG/JPEG uploads are stored as DICOM too)."""
    import numpy as np

    from orapo_core.imaging.dicom_pixels import (  # noqa: PLC0415 -- loads pydicom, requests
        decode_first_frame,
        read_dataset,
    )

    path = settings.storage_dir / (image.dicom_path or image.display_path)
    if not path.is_file():
        raise OrapoError("image_missing", "The stored image file is missing from the storage folder.")
    if image.dicom_path:
        frame = decode_first_frame(read_dataset(path.read_bytes()))
        pixels, default = frame.pixels, (frame.window_center, frame.window_width)
    else:
        pixels = np.asarray(Image.open(path).convert("L"))
        default = (127.5, 256.0)
    if pixels.ndim == 3:  # colour secondary captures: view as grey
        pixels = pixels.mean(axis=2)
    return ViewerPixels(pixels, (float(default[0]), float(default[1])), (float(np.min(pixels)), float(np.max(pixels))))


def render(view: ViewerPixels, center: float, width: float, zoom: float = 1.0) -> np.ndarray:
    """The windowed 8-bit rendering, cropped around the centre for zoom > 1."""
    from orapo_core.imaging import window  # noqa: PLC0415 -- loads pydicom, requests

    pixels = view.pixels
    zoom = max(1.0, float(zoom or 1.0))
    if zoom > 1.0:
        h, w = pixels.shape[:2]
        ch, cw = max(1, int(h / zoom)), max(1, int(w / zoom))
        top, left = (h - ch) // 2, (w - cw) // 2
        pixels = pixels[top : top + ch, left : left + cw]
    return window(pixels, center, width)


def preset(view: ViewerPixels, name: str) -> tuple[float, float]:
    from orapo_core.imaging import preset_window  # noqa: PLC0415 -- loads pydicom, requests

    try:
        return preset_window(name, view.pixels, view.default_window)
    except KeyError:
        raise OrapoError("unknown_preset", f"There is no window preset called {name!r}.") from None


def draft_study(
    db: Database,
    settings: Settings,
    registry: ModelRegistry,
    user: UserRecord,
    study_id: int,
    *,
    samples: int = DRAFT_SAMPLES,
    progress: Callable[..., Any] | None = None,
) -> DraftRecord:
    """Draft the study's first image with the served model, store the draft, and return its record."""

    def step(fraction: float, what: str) -> None:
        if progress is not None:
            progress(fraction, desc=what)

    overview = open_study(db, user, study_id)
    refuse_not_drafted(overview.study)  # only chest radiographs are drafted
    image = first_image(overview)
    step(0.05, "Reading the image")
    view = viewer_pixels(settings, image)
    served = registry.served()
    step(0.15, f"Loading model {served.name}")
    batcher = registry.batcher(served)
    step(0.35, "Drafting the report and its samples")
    draft = batcher.draft(view.pixels, samples=samples)  # with whoever else is drafting now
    screen_draft(db, user, overview, image.source_format, draft)  # a film far from any the model knows: refused
    step(0.9, "Storing the draft")
    film = unfamiliar_summary(draft)  # how unlike the model's training films this one is (None: not checked)
    with db.session() as session:  # the draft and its audit entry stand or fall together
        record = DraftRepository(session).create(
            overview.study.id,
            model_name=draft.model_name,
            prompt=draft.prompt,
            text=draft.text,
            sampling={**draft.sampling, "prompt_version": draft.prompt_version, "model_version": served.name},
            facts={
                "flagged": draft.flagged,
                "withheld": list(getattr(draft, "withheld", []) or []),
                "added": list(getattr(draft, "added", []) or []),
                "unfamiliar": film,
            },
            sentence_scores=draft.sentences,
            latency_ms=int(draft.latency_ms),
            model_version_id=served.version_id,
            created_by=user.id,
            image_features=getattr(draft, "image_features", None),
        )
        AuditRepository(session).append(
            "draft.create",
            actor=user,
            object_type="study",
            object_id=overview.study.id,
            details={
                "draft_id": record.id,
                "model": served.name,
                "latency_ms": record.latency_ms,
                "unfamiliar": bool(film and film.get("unfamiliar")),
            },
        )
    count_draft(getattr(registry, "metrics", None), served.name, draft.latency_ms / 1000)
    return record


def ingest_upload(
    db: Database, settings: Settings, user: UserRecord, path: str | Path, release: Callable[[Path], bool] | None = None
) -> IngestOutcome:
    """Ingest one uploaded file and then delete it from the upload cache, whatever the outcome; with `release`,
    only when `release(path)` says no other session still waits to read the same cached file."""
    path = Path(path)
    try:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return IngestOutcome(
                file=path.name,
                ok=False,
                error="upload_gone",
                message="This file is no longer in the upload area; upload it again.",
            )
        return ingest_bytes(data, path.name, db=db, settings=settings, user=user, actor=user.username)
    finally:
        if release is None or release(path):
            _discard_upload(path)


def ingest_uploads(
    db: Database,
    settings: Settings,
    user: UserRecord,
    paths: Iterable[str | Path],
    release: Callable[[Path], bool] | None = None,
) -> list[IngestOutcome]:
    """Ingest a batch of uploaded files, one outcome each, in order. If one raises, every file of the batch not
    yet ingested is still deleted from the upload cache (as `release` allows) before the exception goes on."""
    pending = [Path(p) for p in paths or []]
    outcomes = []
    try:
        while pending:
            outcomes.append(ingest_upload(db, settings, user, pending[0], release))
            pending.pop(0)
    finally:
        for path in pending:
            if release is None or release(path):
                _discard_upload(path)
    return outcomes


def _discard_upload(path: Path) -> None:
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # Gradio keeps each upload in a folder of its own
    except OSError:
        pass
