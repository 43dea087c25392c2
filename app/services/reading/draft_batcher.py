"""Drafts of readers who press Draft at about the same time, decoded together.

On a CPU a decoding step of forty rows costs a fraction of forty steps of one,
so readers drafting together wait little longer than one. The batcher keeps one
running batch (`orapo_core.models.decoding.ContinuousDecoder`, from
`Drafter.new_decoder`): a draft asked while others decode joins them at the next
step, and each caller gets its draft as soon as its own rows end, not when the
longest draft of the batch does. A drafter without a decoder (a checkpoint whose
generation config the decoder does not support, or a stand-in) is called with
`draft_many` for each gathered batch instead, as before: those waiting when a
batch ends go together in the next. The registry (`app.services.reading.drafting`) puts
one `DraftBatcher` in front of each resident model.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orapo_core.models.decoding import DecodeRequest

if TYPE_CHECKING:
    from orapo_core.models.decoding import ContinuousDecoder
    from orapo_core.models.draft import Draft

#: The most drafts decoding at once, and how long a draft waits for others when the model is idle.
DRAFT_MAX_BATCH = 8
DRAFT_MAX_WAIT_S = 0.02


@dataclass(eq=False)  # compared by identity: the image may be an array
class _Request:
    image: Any
    settings: tuple[tuple[str, Any], ...]  # sorted (name, value) pairs: a gathered batch (draft_many) holds one set
    future: Future[Any] = field(default_factory=Future)  # the Draft, or the DecodeRequest decoded in a running batch
    submitted: float = field(default_factory=time.perf_counter)
    decoding: Any = None  # its DecodeRequest while a ContinuousDecoder decodes it


class DraftBatcher:
    """Drafts concurrent requests together, in one running batch (or one `draft_many` call per gathered batch).

    `draft` may be called from any number of threads; each caller blocks until its
    own image's Draft is ready (or the step or batch it was in failed: then every
    caller decoding in it gets the exception). One worker thread drives the model,
    one forward at a time. A request waits for others at most `max_wait_s` when the
    model is idle; while drafts are decoding, a request joins them at the next step
    (at most `max_batch` drafts decode at once; others wait, oldest first). With a
    drafter that has no `new_decoder`, requests gather while a batch runs and all go
    (up to `max_batch`) as soon as it ends. The worker thread starts on demand and
    ends after `idle_s` without work, or as soon as the queue is empty once `close`
    was called (the registry evicted its model: the worker must not keep the model
    alive while it idles).

    A drafter without `draft_many` or `new_decoder` is called with `draft` once per request.
    """

    def __init__(
        self,
        drafter: Any,
        *,
        max_batch: int = DRAFT_MAX_BATCH,
        max_wait_s: float = DRAFT_MAX_WAIT_S,
        idle_s: float = 30.0,
    ) -> None:
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
        self._asked = 0  # drafts asked and not yet answered: waiting for the model, decoding or being scored

    def depth(self) -> int:
        """How many drafts were asked of this batcher and are not answered yet (the metrics' queue depth)."""
        return self._asked

    def close(self) -> None:
        """Stop idling: the worker drafts what is queued and ends. A draft asked later still runs (on a worker
        that again ends when done), so closing never fails a caller that got this batcher before."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the worker to end (after `close`); True when none is running."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
        return worker is None or not worker.is_alive()

    def draft(self, image: Any, **settings: Any) -> Draft:
        """The Draft of `image` (as `drafter.draft(image, **settings)` gives it), drafted in a batch with others.

        Its `latency_ms` is the time from this call to the draft, waiting for the batch included.
        """
        complete = getattr(self.drafter, "sampling_settings", None)
        if complete is not None:
            settings = complete(**settings)  # a bad setting fails its own caller here, not the batch it would join
        prepare = getattr(self.drafter, "prepare", None)
        if prepare is not None:
            image = prepare(image)  # a bad image fails its own caller here, not the batch it would join
        request = _Request(image, tuple(sorted(settings.items())))
        with self._cond:
            self._queue.append(request)
            self._asked += 1
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="orapo-draft-batcher", daemon=True)
                self._worker.start()
            self._cond.notify_all()
        try:
            return self._answer(request)
        finally:
            with self._cond:
                self._asked -= 1

    def _answer(self, request: _Request) -> Draft:
        """The caller's Draft, once the worker has decoded it (checked and scored here, in the caller's thread)."""
        draft = request.future.result()
        if request.decoding is not None:  # decoded in the running batch: check, score and record it here, off the loop
            decoded = request.decoding
            # with the version's finding checks, as draft_many drafts (what the gate and the benchmarks measured)
            draft = self.drafter.finish(
                request.image,
                decoded.texts[0],
                decoded.texts[1:],
                dict(request.settings),
                batch_size=decoded.peers,  # its latency is set just below
                image_features=decoded.image_features,
            )
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
        new_decoder = getattr(self.drafter, "new_decoder", None)
        if new_decoder is not None and (decoder := new_decoder()) is not None:
            return self._run_continuous(decoder, new_decoder)
        while (batch := self._next_batch()) is not None:
            try:
                drafts = self._draft(batch)
            except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets it; the worker goes on
                for request in batch:
                    request.future.set_exception(exc)
            else:
                for request, draft in zip(batch, drafts):
                    request.future.set_result(draft)

    def _admit(self, running: int) -> list[_Request] | None:
        """The requests to add to a running batch of `running` drafts (waiting for work when it is empty); None when
        idle long enough to stop."""
        if running == 0:
            return self._next_batch()
        with self._cond:
            taken, self._queue = self._queue[: self.max_batch - running], self._queue[self.max_batch - running :]
            return taken

    def _run_continuous(self, decoder: ContinuousDecoder, new_decoder: Callable[[], ContinuousDecoder]) -> None:
        decoding: dict[int, _Request] = {}  # id(DecodeRequest) -> its caller's request
        while (admitted := self._admit(len(decoding))) is not None:
            for request in admitted:
                settings = dict(request.settings)
                request.decoding = decoder.add(DecodeRequest(request.image, **settings))
                decoding[id(request.decoding)] = request
            if not decoding:
                continue
            try:
                finished = decoder.step()
            except BaseException as exc:  # noqa: BLE001 - every draft in the batch gets it; the worker goes on
                for request in decoding.values():
                    request.future.set_exception(exc)
                decoding.clear()
                decoder = new_decoder()
                continue
            for done in finished:
                decoding.pop(id(done)).future.set_result(done)

    def _draft(self, batch: list[_Request]) -> list[Draft]:
        settings = dict(batch[0].settings)
        draft_many = getattr(self.drafter, "draft_many", None)
        if draft_many is None:
            return [self.drafter.draft(r.image, **settings) for r in batch]
        drafts = draft_many([r.image for r in batch], **settings)
        if len(drafts) != len(batch):
            raise RuntimeError(f"draft_many returned {len(drafts)} drafts for {len(batch)} images")
        return drafts
