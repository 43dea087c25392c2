"""Viewing and drafting one study: the served model, the viewer's pixels, and a stored draft.

The served model is the promoted ModelVersion (base + adapter) when there is
one, else the configured or starter model (`app.services.reading.served`, which rounds
ask too). `ModelRegistry` is made by the app factory, not at import, and keeps
one `Drafter` per version, so a promotion is picked up by the next draft without
a restart and two users never load the same weights twice; at most
`max_resident` of them (ORAPO_MAX_RESIDENT_MODELS, default 2: the served model
and the one before it, so a rollback drafts at once). Loading another evicts the
least recently used: drafts in flight on it finish, then nothing holds its
weights. Versions on one base folder share one copy of it
(`orapo_core.models.shared_base`: the base loaded once, each version's LoRA
adapter a named adapter on it, one lock for all of them), so the baseline and
a round's candidate cost one base and two adapters, not two models.
Each Drafter comes with a `DraftBatcher`: users who press
Draft at about the same time are decoded together in one running batch, a draft
asked while others decode joining them at the next step
(`orapo_core.models.decoding`), which on a CPU costs far less than drafting them
one after another.
`orapo serve` warms the served model in the background as it starts
(`ModelRegistry.warm_in_background`: load, then one small draft), so the first
reader does not wait for the load; the page says so while it runs (`readiness`).
From then on each model it loads that has no unfamiliar-film calibration yet is
calibrated in the background (`app.services.reading.scope.BackgroundCalibration`).
Only chest radiographs are drafted (`app.services.reading.scope`): `draft_study`
refuses a study stored as something else, and checks an image whose header cannot
say what it is against the model's calibration first.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.operations.metrics import count_draft
from app.services.reading.draft_batcher import DraftBatcher
from app.services.reading.scope import BackgroundCalibration, refuse_not_drafted, screen_pixels, unfamiliar_summary
from app.services.reading.served import ServedModel, served_model
from app.services.reading.studies import first_image, open_study  # the access rule, shared
from app.settings import web_settings
from db import Database
from db.records import DraftRecord, ImageRecord, UserRecord
from orapo_core.config import Settings
from orapo_core.errors import OrapoError
from orapo_core.models.draft import DRAFT_SAMPLES  # how many samples measure each sentence's confidence

if TYPE_CHECKING:
    import numpy as np

    from app.services.reading.ingest import IngestOutcome
    from orapo_core.models.draft import Drafter

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

    `max_resident` defaults to the settings' `max_resident_models` (ORAPO_MAX_RESIDENT_MODELS, default 2)."""

    # the app's `app.services.operations.metrics.AppMetrics` (`build_app` sets it): counts each stored draft
    metrics = None

    def __init__(self, settings: Settings, database: Database, *, loader: Callable[[ServedModel], Drafter] | None = None,
                 max_resident: int | None = None) -> None:
        web = web_settings(settings)  # an engine Settings (benchmarks, tests) takes the web fields from the environment
        if max_resident is None:
            max_resident = web.max_resident_models
        if max_resident < 1:
            raise ValueError(f"max_resident must be at least 1 (the served model); got {max_resident}")
        self._settings = settings
        self._db = database
        self._loader = loader  # tests may inject a fake; default Drafter.from_dir
        self.max_resident = max_resident
        self.draft_wait_s = web.draft_wait_ms / 1000  # ORAPO_DRAFT_WAIT_MS
        self._lock = threading.Lock()
        self._drafters: OrderedDict[str, Any] = OrderedDict()  # least recently used first
        self._batchers: dict[str, DraftBatcher] = {}
        self._bases: dict[Path, Any] = {}  # base folder -> its SharedBase, while a resident version uses it
        self._readiness = Readiness("idle")
        self._calibrations: BackgroundCalibration | None = None  # a serving registry calibrates what it loads

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
        """`warm` in a daemon thread; the readiness says "loading" from this call on. From then on, each model
        loaded without an unfamiliar-film calibration is calibrated in the background (`BackgroundCalibration`)."""
        self._calibrations = self._calibrations or BackgroundCalibration()
        self._readiness = Readiness("loading", self._readiness.name or "the served model")
        thread = self._warm_up = threading.Thread(target=self.warm, name="orapo-model-warm-up", daemon=True)
        thread.start()
        return thread

    def wait_for_warm_up(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a warm-up under way; True when none is running any more."""
        thread = getattr(self, "_warm_up", None)
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def close(self, timeout: float = 30.0) -> bool:
        """The server is stopping: no batcher idles on, and the warm-up and every draft under way end before the
        interpreter does (a thread still inside torch when it finalizes aborts the process: "terminate called
        without an active exception"). True when every such thread ended within `timeout` seconds."""
        with self._lock:
            batchers = list(self._batchers.values())
        for batcher in batchers:
            batcher.close()
        done = self.wait_for_warm_up(timeout)
        calibrations = getattr(self, "_calibrations", None)
        done = (calibrations is None or calibrations.close(timeout)) and done
        return all([batcher.join(timeout) for batcher in batchers]) and done

    def served(self) -> ServedModel:
        return served_model(self._db, self._settings)

    def queue_depth(self) -> int:
        """Drafts asked of the resident models' batchers and not answered yet. Read without the lock, which a load
        holds for as long as it takes: a scrape of the metrics never waits for one."""
        return sum(batcher.depth() for batcher in list(self._batchers.values()))

    def is_loaded(self, served: ServedModel) -> bool:
        """Whether `served` is loaded now (without the lock, as `queue_depth`: for `/readyz`)."""
        return served.key in self._drafters

    def resident(self) -> list[str]:
        """The keys (`ServedModel.key`) of the loaded models, least recently used first."""
        with self._lock:
            return list(self._drafters)

    def bases(self) -> list[Path]:
        """The base folders loaded in memory (each once, whatever number of resident versions use it)."""
        with self._lock:
            return list(self._bases)

    def drafter(self, served: ServedModel) -> Drafter:
        evicted: list[tuple[str, DraftBatcher | None]] = []
        with self._lock:  # one load per version even when two users press Draft at once
            drafter = self._drafters.get(served.key)
            loaded_now = drafter is None
            if drafter is None:
                # room first: the registry holds at most `max_resident`, even while the new one loads
                while len(self._drafters) >= self.max_resident:
                    evicted.append(self._evict_oldest())
                self._release(evicted)
                drafter = self._drafters[served.key] = (self._loader or self._load_on_shared_base)(served)
            self._drafters.move_to_end(served.key)
        for _, batcher in evicted:
            if batcher is not None:
                batcher.close()
        calibrations = getattr(self, "_calibrations", None)
        if loaded_now and calibrations is not None:
            calibrations.start(drafter, served.name)
        return drafter

    def _load_on_shared_base(self, served: ServedModel) -> Drafter:
        """A Drafter for `served` on its base folder's one SharedBase (loaded now if no resident version uses it)."""
        from orapo_core.models.draft import Drafter
        from orapo_core.models.loading import check_model_dir
        from orapo_core.models.shared_base import SharedBase

        folder = check_model_dir(served.model_dir).resolve()
        base = self._bases.get(folder)
        if base is None:
            base = self._bases[folder] = SharedBase(folder)
        try:
            loaded = base.view(served.key, served.adapter_dir)
        except Exception:
            if not base.views():
                self._bases.pop(folder, None)
            raise
        return Drafter(loaded, model_version=served.name, lock=base.lock,
                       min_agreement=self._settings.draft_min_agreement,
                       calibration_cache=self._settings.models_dir / "calibrations")

    def _release(self, evicted: list[tuple[str, Any]]) -> None:
        """Unload the adapters of evicted versions from their shared bases, and bases no resident version uses
        (under the registry's lock, so a version loaded again meanwhile cannot lose its view). Waits for a draft
        in flight on the base (the base's lock); drafts queued behind it load the adapter again for themselves."""
        for key, _ in evicted:
            for folder, base in list(self._bases.items()):
                if base.has_view(key) and base.release(key) == 0:
                    del self._bases[folder]

    def batcher(self, served: ServedModel) -> DraftBatcher:
        """The one DraftBatcher in front of `served`'s Drafter: what the app drafts through."""
        drafter = self.drafter(served)
        with self._lock:
            batcher = self._batchers.get(served.key)
            if batcher is None or batcher.drafter is not drafter:
                batcher = DraftBatcher(drafter, max_wait_s=self.draft_wait_s)
                if self._drafters.get(served.key) is drafter:
                    self._batchers[served.key] = batcher
                else:  # evicted by another thread meanwhile: this draft runs on it, then nothing keeps it
                    batcher.close()
            return batcher

    def _evict_oldest(self) -> tuple[str, DraftBatcher | None]:
        """Forget the least recently used Drafter (under the lock). Whoever is drafting on it keeps their reference
        and finishes; its batcher, closed by the caller outside the lock, stops once its queue is empty."""
        key, _ = self._drafters.popitem(last=False)
        log.info("orapo: unloading model %s (more than %d resident)", key, self.max_resident)
        return key, self._batchers.pop(key, None)


def _reason(exc: Exception) -> str:
    return getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"


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


def render(view: ViewerPixels, center: float, width: float, zoom: float = 1.0) -> np.ndarray:
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


def draft_study(db: Database, settings: Settings, registry: ModelRegistry, user: UserRecord, study_id: int, *,
                samples: int = DRAFT_SAMPLES, progress: Callable[..., Any] | None = None) -> DraftRecord:
    """Draft the study's first image with the served model, store the draft, and return its record."""
    from db import AuditRepository, DraftRepository

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
    screen_pixels(db, user, overview, image.source_format, getattr(batcher, "drafter", None), view.pixels)
    step(0.35, "Drafting the report and its samples")
    draft = batcher.draft(view.pixels, samples=samples)  # with whoever else is drafting now
    step(0.9, "Storing the draft")
    film = unfamiliar_summary(draft)  # how unlike the model's training films this one is (None: not checked)
    with db.session() as session:  # the draft and its audit entry stand or fall together
        record = DraftRepository(session).create(
            overview.study.id, model_name=draft.model_name, prompt=draft.prompt, text=draft.text,
            sampling={**draft.sampling, "prompt_version": draft.prompt_version, "model_version": served.name},
            facts={"flagged": draft.flagged, "withheld": list(getattr(draft, "withheld", []) or []),
                   "added": list(getattr(draft, "added", []) or []), "unfamiliar": film},
            sentence_scores=draft.sentences, latency_ms=int(draft.latency_ms),
            model_version_id=served.version_id, created_by=user.id,
            image_features=getattr(draft, "image_features", None),
        )
        AuditRepository(session).append("draft.create", actor=user, object_type="study", object_id=overview.study.id,
                                        details={"draft_id": record.id, "model": served.name,
                                                 "latency_ms": record.latency_ms,
                                                 "unfamiliar": bool(film and film.get("unfamiliar"))})
    count_draft(getattr(registry, "metrics", None), served.name, draft.latency_ms / 1000)
    return record


def ingest_upload(db: Database, settings: Settings, user: UserRecord, path: str | Path,
                  release: Callable[[Path], bool] | None = None) -> IngestOutcome:
    """Ingest one uploaded file and then delete it from the upload cache, whatever the outcome; with `release`,
    only when `release(path)` says no other session still waits to read the same cached file."""
    from app.services.reading.ingest import IngestOutcome, ingest_bytes

    path = Path(path)
    try:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return IngestOutcome(file=path.name, ok=False, error="upload_gone",
                                 message="This file is no longer in the upload area; upload it again.")
        return ingest_bytes(data, path.name, db=db, settings=settings, user=user, actor=user.username)
    finally:
        if release is None or release(path):
            _discard_upload(path)


def ingest_uploads(db: Database, settings: Settings, user: UserRecord, paths: Iterable[str | Path],
                   release: Callable[[Path], bool] | None = None) -> list[IngestOutcome]:
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
