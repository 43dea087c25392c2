"""One base model in memory for every served version built on it, each version's LoRA adapter a named adapter.

A round saves a LoRA adapter, not a model, so the baseline and the first round's
candidate (and a version rolled back to beside the one it replaced) are the same
base folder with different adapters. Loading the base once per version doubles
the web process's memory for a few MB of difference; with a 3B model that is
gigabytes. `SharedBase` loads a base folder once and PEFT's multi-adapter model
holds every adapter on it by name (`load_adapter` / `set_adapter` /
`delete_adapter`); each version gets a `LoadedModel` view whose `activate()`
selects its adapter (or, for the base itself, turns the adapters off) for the
length of one `generate`. All views of one base share one lock, since the active
adapter is state on the shared modules: two versions on one base draft one after
the other, never at once (which on a CPU would only split the same cores anyway).

A view released while one of its drafts waits for the lock still drafts: its
adapter is loaded again from its folder when it is next activated.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peft import PeftModel

from orapo_core.models.loading import LoadedModel, _check_adapter_dir, add_named_adapter, load_model


class SharedBase:
    """A base model folder loaded once, with any number of its versions' adapters on it."""

    def __init__(self, model_dir: str | Path, *, device: str | None = None, dtype: Any = None):
        self.base = load_model(model_dir, device=device, dtype=dtype)
        self.lock = threading.Lock()  # held around every generate on this base (and every adapter change)
        self._peft: PeftModel | None = None  # the PeftModel wrapping the base once the first adapter is loaded
        self._adapters: dict[str, Path] = {}  # adapter name -> its folder, for the adapters now on the model
        self._views: dict[str, str] = {}  # key of each view handed out and not released -> its adapter ("": none)

    @property
    def model_dir(self) -> Path:
        return self.base.model_dir

    def adapters(self) -> list[str]:
        """The names of the adapters now loaded on the base."""
        with self.lock:
            return sorted(self._adapters)

    def views(self) -> int:
        """How many versions' views are handed out and not released."""
        with self.lock:
            return len(self._views)

    def has_view(self, key: str) -> bool:
        with self.lock:
            return key in self._views

    def view(self, key: str, adapter_dir: str | Path | None = None) -> LoadedModel:
        """A LoadedModel for the version called `key`: this base with the adapter in `adapter_dir` (None: the base
        alone).

        Generate with the model its `using()` gives, under `self.lock` (the Drafter does both)."""
        name = "" if adapter_dir is None else _adapter_name(key)
        with self.lock:
            path = None
            if adapter_dir is not None:
                path = _check_adapter_dir(adapter_dir)
                self._load_adapter(name, path)
            self._views[key] = name
            model = self.base.model if adapter_dir is None else self._peft
        return LoadedModel(
            model=model,
            processor=self.base.processor,
            model_dir=self.base.model_dir,
            adapter_dir=path,
            device=self.base.device,
            dtype=self.base.dtype,
            activate=lambda: self._active(name, path),
        )

    def release(self, key: str) -> int:
        """Forget the view of version `key` (and unload its adapter); returns how many views remain on the base."""
        with self.lock:
            name = self._views.pop(key, "")
            if name:
                self._unload_adapter(name)
            return len(self._views)

    @contextlib.contextmanager
    def _active(self, name: str, adapter_dir: Path | None) -> Iterator[Any]:
        """The model to generate with, adapter `name` on (every other off) for the body; "" runs the base with no
        adapter at all.

        The caller holds `self.lock` (Drafter's generate lock is this lock)."""
        if not name or adapter_dir is None:  # (view() passes no folder exactly when the name is "")
            if self._peft is None:
                yield self.base.model
            else:
                with self._peft.disable_adapter():
                    yield self.base.model
            return
        reloaded = name not in self._adapters
        if reloaded:  # released while this draft waited for the lock: load it again, for this draft only
            self._load_adapter(name, adapter_dir)
        assert self._peft is not None  # adapter `name` is loaded: a PeftModel wraps the base
        try:
            self._peft.set_adapter(name)
            yield self._peft
        finally:
            if reloaded and name not in self._views.values():
                self._unload_adapter(name)

    def _load_adapter(self, name: str, path: Path) -> None:
        if name in self._adapters:
            return
        self._peft = add_named_adapter(self._peft if self._peft is not None else self.base.model, path, name)
        self._adapters[name] = path

    def _unload_adapter(self, name: str) -> None:
        if name not in self._adapters or self._peft is None:
            return
        self._peft.delete_adapter(name)
        del self._adapters[name]
        if not self._adapters:  # no adapter left: the plain base again, not a PeftModel holding none
            self._peft.unload()
            self._peft = None


def _adapter_name(key: str) -> str:
    # PEFT keeps adapters as module attributes: no dots; "default" would collide with PEFT's own default name
    return "v_" + "".join(c if c.isalnum() or c == "_" else "_" for c in str(key))
