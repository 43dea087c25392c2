"""Viewing and drafting one study: the served model, the viewer's pixels, and a stored draft.

The served model is the promoted ModelVersion (base + adapter) when there is
one, else the configured or starter model (`app.services.served`, which rounds
ask too). `ModelRegistry` is made by the app factory, not at import, and keeps
one `Drafter` per version, so a promotion is picked up by the next draft without
a restart and two users never load the same weights twice; at most
`max_resident` of them (ORAPO_MAX_RESIDENT_MODELS, default 2: the served model
and the one before it, so a rollback drafts at once). Loading another evicts the
least recently used: drafts in flight on it finish, then nothing holds its
weights. Two versions on one base each load the base: sharing it would take one
PEFT model carrying several adapters, switched under one lock for all of them,
which `orapo_core.models` (one adapter and one lock per loaded model) does not do.
Each Drafter comes with a `DraftBatcher`: users who press
Draft at about the same time are drafted together in one batched `generate`
(`Drafter.draft_many`), which on a CPU costs little more than drafting one.
`orapo serve` warms the served model in the background as it starts
(`ModelRegistry.warm_in_background`: load, then one small draft), so the first
reader does not wait for the load; the page says so while it runs (`readiness`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.services.served import ServedModel, served_model
from app.services.studies import first_image, open_study  # the access rule, shared
from app.settings import DEFAULT_MAX_RESIDENT_MODELS
from db.records import ImageRecord, UserRecord
from orapo_core.config import Settings
from orapo_core.errors import OrapoError

#: How many sampled drafts measure each sentence's confidence (self-consistency).
DRAFT_SAMPLES = 4
#: The most drafts batched into one `generate`, and how long a draft waits for others when the model is idle.
DRAFT_MAX_BATCH = 8
DRAFT_MAX_WAIT_S = 0.02

log = logging.getLogger("orapo.drafting")


@dataclass(frozen=True)
class Readiness:
    """Where the start-up warm-up of the served model stands: idle (never asked), loading, ready or failed."""

    state: str
    name: str = ""
    message: str = ""


class ModelRegistry:
    """One Drafter per served model version, loaded on first use, at most `max_resident` of them (least recently
    used evicted first); safe across Gradio's worker threads.

    `max_resident` defaults to the settings' `max_resident_models` (ORAPO_MAX_RESIDENT_MODELS), else 2."""

    def __init__(self, settings: Settings, database, *, loader=None, max_resident: int | None = None):
        if max_resident is None:
            max_resident = getattr(settings, "max_resident_models", DEFAULT_MAX_RESIDENT_MODELS)
        if max_resident < 1:
            raise ValueError(f"max_resident must be at least 1 (the served model); got {max_resident}")
        self._settings = settings
        self._db = database
        self._loader = loader  # tests may inject a fake; default Drafter.from_dir
        self.max_resident = max_resident
        self._lock = threading.Lock()
        self._drafters: OrderedDict[str, Any] = OrderedDict()  # least recently used first
        self._batchers: dict[str, DraftBatcher] = {}
        self._readiness = Readiness("idle")

    def readiness(self) -> Readiness:
        return self._readiness

    def warm(self) -> Readiness:
        """Load the served model and draft one small blank image with it, so that the first reader's draft
        waits for neither. A failure is reported, not raised: the first draft loads again and says why."""
        try:
            served = self.served()
        except Exception as exc:  # noqa: BLE001 - reported on the page; the first draft raises it properly
            self._readiness = Readiness("failed", "the served model", _reason(exc))
            return self._readiness
        self._readiness = Readiness("loading", served.name)
        try:
            drafter = self.drafter(served)
        except Exception as exc:  # noqa: BLE001
            log.warning("orapo: the served model %s did not load at start-up: %s", served.name, _reason(exc))
            self._readiness = Readiness("failed", served.name, _reason(exc))
            return self._readiness
        try:
            import numpy as np

            drafter.draft(np.zeros((64, 64), dtype=np.uint8), samples=1, max_new_tokens=4)
        except Exception as exc:  # noqa: BLE001 - loaded is what matters; the first real draft runs as usual
            log.warning("orapo: the warm-up draft of %s failed: %s", served.name, _reason(exc))
        self._readiness = Readiness("ready", served.name)
        return self._readiness

    def warm_in_background(self) -> threading.Thread:
        """`warm` in a daemon thread; the readiness says "loading" from this call on."""
        self._readiness = Readiness("loading", self._readiness.name or "the served model")
        thread = threading.Thread(target=self.warm, name="orapo-model-warm-up", daemon=True)
        thread.start()
        return thread

    def served(self) -> ServedModel:
        return served_model(self._db, self._settings)

    def resident(self) -> list[str]:
        """The keys (`ServedModel.key`) of the loaded models, least recently used first."""
        with self._lock:
            return list(self._drafters)

    def drafter(self, served: ServedModel):
        evicted: list[DraftBatcher] = []
        with self._lock:  # one load per version even when two users press Draft at once
            drafter = self._drafters.get(served.key)
            if drafter is None:
                # room first: the registry holds at most `max_resident`, even while the new one loads
                while len(self._drafters) >= self.max_resident:
                    evicted += self._evict_oldest()
                load = self._loader or _load_drafter
                drafter = self._drafters[served.key] = load(served)
            self._drafters.move_to_end(served.key)
        for batcher in evicted:
            batcher.close()
        return drafter

    def batcher(self, served: ServedModel) -> DraftBatcher:
        """The one DraftBatcher in front of `served`'s Drafter: what the app drafts through."""
        drafter = self.drafter(served)
        with self._lock:
            batcher = self._batchers.get(served.key)
            if batcher is None or batcher.drafter is not drafter:
                batcher = DraftBatcher(drafter)
                if self._drafters.get(served.key) is drafter:
                    self._batchers[served.key] = batcher
                else:  # evicted by another thread meanwhile: this draft runs on it, then nothing keeps it
                    batcher.close()
            return batcher

    def _evict_oldest(self) -> list[DraftBatcher]:
        """Forget the least recently used Drafter (under the lock). Whoever is drafting on it keeps their reference
        and finishes; its batcher, closed by the caller outside the lock, stops once its queue is empty."""
        key, _ = self._drafters.popitem(last=False)
        log.info("orapo: unloading model %s (more than %d resident)", key, self.max_resident)
        batcher = self._batchers.pop(key, None)
        return [batcher] if batcher is not None else []


@dataclass(eq=False)  # compared by identity: the image may be an array
class _Request:
    image: Any
    settings: tuple  # sorted (name, value) pairs: only drafts with the same settings share a batch
    future: Future = field(default_factory=Future)
    submitted: float = field(default_factory=time.perf_counter)


class DraftBatcher:
    """Drafts concurrent requests together: one `draft_many` call for all those waiting.

    `draft` may be called from any number of threads; each caller blocks until its
    own image's Draft is ready (or its batch failed: then every caller in that batch
    gets the exception). One worker thread runs the batches, so the model runs one
    `generate` at a time. A request waits for others at most `max_wait_s` when the
    model is idle; while a batch is running, requests gather and all go (up to
    `max_batch`, oldest first) as soon as it ends. The worker thread starts on
    demand and ends after `idle_s` without work, or as soon as the queue is empty
    once `close` was called (the registry evicted its model: the worker must not
    keep the model alive while it idles).

    A drafter without `draft_many` is called with `draft` once per request.
    """

    def __init__(self, drafter, *, max_batch: int = DRAFT_MAX_BATCH, max_wait_s: float = DRAFT_MAX_WAIT_S,
                 idle_s: float = 30.0):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1; got {max_batch}")
        self.drafter = drafter
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.idle_s = idle_s
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._worker: threading.Thread | None = None
        self._closed = False

    def close(self) -> None:
        """Stop idling: the worker drafts what is queued and ends. A draft asked later still runs (on a worker
        that again ends when done), so closing never fails a caller that got this batcher before."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def draft(self, image, **settings):
        """The Draft of `image` (as `drafter.draft(image, **settings)` gives it), drafted in a batch with others.

        Its `latency_ms` is the time from this call to the draft, waiting for the batch included.
        """
        prepare = getattr(self.drafter, "prepare", None)
        if prepare is not None:
            image = prepare(image)  # a bad image fails its own caller here, not the batch it would join
        request = _Request(image, tuple(sorted(settings.items())))
        with self._cond:
            self._queue.append(request)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="orapo-draft-batcher", daemon=True)
                self._worker.start()
            self._cond.notify_all()
        draft = request.future.result()
        if hasattr(draft, "latency_ms"):
            draft = replace(draft, latency_ms=round((time.perf_counter() - request.submitted) * 1000, 1))
        return draft

    def _next_batch(self) -> list[_Request] | None:
        """Wait for work; the requests to draft together, or None when idle long enough to stop."""
        with self._cond:
            idle_since = time.monotonic()
            while not self._queue:
                left = self.idle_s - (time.monotonic() - idle_since)
                if left <= 0 or self._closed:
                    self._worker = None  # under the lock: a new request starts a new worker
                    return None
                self._cond.wait(left)
            while len(self._queue) < self.max_batch:
                left = self.max_wait_s - (time.perf_counter() - self._queue[0].submitted)
                if left <= 0:
                    break
                self._cond.wait(left)
            settings = self._queue[0].settings
            batch = [r for r in self._queue if r.settings == settings][: self.max_batch]
            taken = set(map(id, batch))
            self._queue = [r for r in self._queue if id(r) not in taken]
            return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                drafts = self._draft(batch)
            except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets it; the worker goes on
                for request in batch:
                    request.future.set_exception(exc)
            else:
                for request, draft in zip(batch, drafts):
                    request.future.set_result(draft)

    def _draft(self, batch: list[_Request]) -> list:
        settings = dict(batch[0].settings)
        draft_many = getattr(self.drafter, "draft_many", None)
        if draft_many is None:
            return [self.drafter.draft(r.image, **settings) for r in batch]
        drafts = draft_many([r.image for r in batch], **settings)
        if len(drafts) != len(batch):
            raise RuntimeError(f"draft_many returned {len(drafts)} drafts for {len(batch)} images")
        return drafts


def _reason(exc: Exception) -> str:
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"


def _load_drafter(served: ServedModel):
    from orapo_core.models.draft import Drafter

    return Drafter.from_dir(served.model_dir, served.adapter_dir, model_version=served.name)


@dataclass(frozen=True)
class ViewerPixels:
    pixels: Any  # 2-D array, full bit depth, higher is brighter
    default_window: tuple[float, float]
    value_range: tuple[float, float]


def viewer_pixels(settings: Settings, image: ImageRecord) -> ViewerPixels:
    """The stored de-identified DICOM read back at full bit depth (PNG/JPEG uploads are stored as DICOM too)."""
    import numpy as np

    from orapo_core.imaging.dicom_pixels import decode_first_frame, read_dataset

    path = settings.storage_dir / (image.dicom_path or image.display_path)
    if not path.is_file():
        raise OrapoError("image_missing", "The stored image file is missing from the storage folder.")
    if image.dicom_path:
        frame = decode_first_frame(read_dataset(path.read_bytes()))
        pixels, default = frame.pixels, (frame.window_center, frame.window_width)
    else:
        from PIL import Image

        pixels = np.asarray(Image.open(path).convert("L"))
        default = (127.5, 256.0)
    if pixels.ndim == 3:  # colour secondary captures: view as grey
        pixels = pixels.mean(axis=2)
    return ViewerPixels(pixels, (float(default[0]), float(default[1])), (float(np.min(pixels)), float(np.max(pixels))))


def render(view: ViewerPixels, center: float, width: float, zoom: float = 1.0):
    """The windowed 8-bit rendering, cropped around the centre for zoom > 1."""
    from orapo_core.imaging import window

    pixels = view.pixels
    zoom = max(1.0, float(zoom or 1.0))
    if zoom > 1.0:
        h, w = pixels.shape[:2]
        ch, cw = max(1, int(h / zoom)), max(1, int(w / zoom))
        top, left = (h - ch) // 2, (w - cw) // 2
        pixels = pixels[top:top + ch, left:left + cw]
    return window(pixels, center, width)


def preset(view: ViewerPixels, name: str) -> tuple[float, float]:
    from orapo_core.imaging import preset_window

    try:
        return preset_window(name, view.pixels, view.default_window)
    except KeyError:
        raise OrapoError("unknown_preset", f"There is no window preset called {name!r}.") from None


def draft_study(db, settings: Settings, registry: ModelRegistry, user: UserRecord, study_id: int, *,
                samples: int = DRAFT_SAMPLES, progress=None):
    """Draft the study's first image with the served model, store the draft, and return its record."""
    from db import AuditRepository, DraftRepository

    def step(fraction: float, what: str) -> None:
        if progress is not None:
            progress(fraction, desc=what)

    overview = open_study(db, user, study_id)
    image = first_image(overview)
    step(0.05, "Reading the image")
    view = viewer_pixels(settings, image)
    served = registry.served()
    step(0.15, f"Loading model {served.name}")
    batcher = registry.batcher(served)
    step(0.35, "Drafting the report and its samples")
    draft = batcher.draft(view.pixels, samples=samples)  # with whoever else is drafting now
    step(0.9, "Storing the draft")
    with db.session() as session:  # the draft and its audit entry stand or fall together
        record = DraftRepository(session).create(
            overview.study.id, model_name=draft.model_name, prompt=draft.prompt, text=draft.text,
            sampling={**draft.sampling, "prompt_version": draft.prompt_version, "model_version": served.name},
            facts={"flagged": draft.flagged}, sentence_scores=draft.sentences, latency_ms=int(draft.latency_ms),
            model_version_id=served.version_id, created_by=user.id,
        )
        AuditRepository(session).append("draft.create", actor=user, object_type="study", object_id=overview.study.id,
                                        details={"draft_id": record.id, "model": served.name,
                                                 "latency_ms": record.latency_ms})
    return record


def ingest_upload(db, settings: Settings, user: UserRecord, path: str | Path):
    """Ingest one uploaded file and then delete it from the upload cache, whatever the outcome."""
    from app.services.ingest import ingest_bytes

    path = Path(path)
    try:
        data = path.read_bytes()
        return ingest_bytes(data, path.name, db=db, settings=settings, user=user, actor=user.username)
    finally:
        _discard_upload(path)


def ingest_uploads(db, settings: Settings, user: UserRecord, paths: Iterable[str | Path]) -> list:
    """Ingest a batch of uploaded files, one outcome each, in order. If one raises, every file of the batch not
    yet ingested is still deleted from the upload cache before the exception goes on."""
    pending = [Path(p) for p in paths or []]
    outcomes = []
    try:
        while pending:
            outcomes.append(ingest_upload(db, settings, user, pending[0]))
            pending.pop(0)
    finally:
        for path in pending:
            _discard_upload(path)
    return outcomes


def _discard_upload(path: Path) -> None:
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()  # Gradio keeps each upload in a folder of its own
    except OSError:
        pass
