"""Drafts of readers who press Draft at about the same time, made together in one batched `generate`.

On a CPU a decoding step costs about the same for one sequence as for thirty-two
(`orapo_core.models.draft.Drafter.draft_many`), so eight readers drafted in one
call wait little longer than one. The registry (`app.services.drafting`) puts one
`DraftBatcher` in front of each resident model.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

#: The most drafts batched into one `generate`, and how long a draft waits for others when the model is idle.
DRAFT_MAX_BATCH = 8
DRAFT_MAX_WAIT_S = 0.02


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


