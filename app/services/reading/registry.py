"""The served models in memory: one `Drafter` (and its `DraftBatcher`) per version, loaded once, warmed in the
background, calibrated in the background, and evicted least recently used.

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
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.services.reading.draft_batcher import DraftBatcher
from app.services.reading.scope import BackgroundCalibration
from app.services.reading.served import ServedModel, served_model
from app.settings import web_settings
from db import Database
from orapo_core.config import Settings
from orapo_core.models.loading import check_model_dir
from orapo_core.models.shared_base import SharedBase

if TYPE_CHECKING:
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

    def __init__(
        self,
        settings: Settings,
        database: Database,
        *,
        loader: Callable[[ServedModel], Drafter] | None = None,
        max_resident: int | None = None,
    ) -> None:
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
        from orapo_core.models.draft import Drafter  # noqa: PLC0415 -- loads numpy

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
        return Drafter(
            loaded,
            model_version=served.name,
            lock=base.lock,
            min_agreement=self._settings.draft_min_agreement,
            calibration_cache=self._settings.models_dir / "calibrations",
        )

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
