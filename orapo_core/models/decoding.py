"""Continuous batching: drafts decoded together step by step, each joining and leaving when it is ready.

`transformers`' `generate` decodes a fixed batch: a draft asked while a batch
is decoding waits for the whole batch to end, and every draft of the batch
waits for its longest row (often one of the K samples rambling to
`max_new_tokens`). `ContinuousDecoder` is the loop `generate` runs, made open:

- `add` queues a request; the next `step` prefills its prompt and image (one
  forward for all requests added since, left-padded; the vision merger's output
  for the image is kept as the request's `image_features`), copies the prompt's KV
  cache to its greedy row and its K sampled rows, and merges them into the
  running batch (the shorter side left-padded with masked zeros);
- `step` decodes one token for every running row in one forward; a row ends at
  an EOS token or at its request's `max_new_tokens`, and leaves the batch (and
  the cache) at once; a request whose rows have all ended is returned, done.

Positions are explicit, per row: a row's next position is one past the last
position its prompt used, as `generate` computes it from the attention mask
(Qwen2-VL's 3-D rope positions included: its prompt's `rope_deltas` are kept
in the row's next position). So a request decodes the same tokens whoever
shares its steps, up to floating-point rounding: its greedy row is what
`generate` gives greedily (tested against it for every model family the
project builds), and its sampled rows draw from the request's own generator,
seeded by its `seed`, so its K samples depend on its seed alone, not on the
batch.

Sampling is what the drafter asks of `generate`: greedy rows take the arg-max;
sampled rows divide by the temperature, keep the smallest set of tokens whose
probability reaches `top_p` (top-k off), and draw. A checkpoint's
`repetition_penalty` applies to every row, as `generate` applies it; a
generation config asking for anything else this loop does not do (n-gram
blocking, suppressed or forced tokens, a minimum length, sliding-window
attention) is not supported (`unsupported_reason` says why) and the drafter
falls back to `generate`.

One decoder is driven by one thread; the forward passes run under the
drafter's lock and its version's adapter (`LoadedModel.using`), taken per
forward, so versions sharing a base take turns step by step.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orapo_core.models.features import capture_image_features

if TYPE_CHECKING:
    import torch

    from orapo_core.models.loading import LoadedModel

#: Generation-config settings this loop does not implement, with the value that means "off".
_UNSUPPORTED = {
    "no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "sequence_bias": (None,),
    "encoder_repetition_penalty": (None, 1.0),
    "exponential_decay_length_penalty": (None,),
    "renormalize_logits": (None, False),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
    "min_p": (None,),
    "typical_p": (None, 1.0),
}


def unsupported_reason(model: Any) -> str | None:
    """Why `model`'s generation config cannot be decoded by `ContinuousDecoder`; None when it can."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return "the model has no generation config"
    for name, off in _UNSUPPORTED.items():
        value = getattr(config, name, None)
        if value not in off:
            return f"its generation config sets {name}={value!r}"
    if getattr(model.config, "is_encoder_decoder", False):
        return "it is an encoder-decoder model"
    text = getattr(model.config, "text_config", None) or model.config
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(text, "use_sliding_window", False):
        return "its language model has sliding-window attention layers"
    return None


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """`scores` with -inf outside each row's nucleus: the fewest most likely tokens whose probability reaches
    `top_p` (as `transformers`' TopPLogitsWarper keeps them; the most likely token always stays)."""
    ordered, order = scores.sort(dim=-1, descending=False)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1 - top_p
    drop[:, -1] = False
    return scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))


@dataclass(eq=False)
class DecodeRequest:
    """One draft to decode: a prepared picture and its sampling settings; `texts` once done (greedy first)."""

    picture: Any
    samples: int = 4
    max_new_tokens: int = 192
    temperature: float = 1.0
    top_p: float = 0.95
    seed: int | None = 0
    texts: list[str] | None = None
    peers: int = 1  # the most requests that decoded alongside this one (itself included)
    # the vision merger's output for the picture, pooled (orapo_core.models.features); None without a merger
    image_features: list[float] | None = None
    _tokens: list[list[int]] = field(default_factory=list)
    _open: int = 0
    _generator: Any = None

    @property
    def done(self) -> bool:
        return self.texts is not None


@dataclass(eq=False)
class _Row:
    request: DecodeRequest
    index: int  # 0: the greedy row; 1..K: the samples


class ContinuousDecoder:
    """A running batch of drafts over one loaded model (see the module docstring)."""

    def __init__(self, loaded: LoadedModel, prompt_text: str, *, lock: threading.Lock | None = None) -> None:
        self.loaded = loaded
        self.prompt_text = prompt_text
        self.lock = lock or threading.Lock()
        model = loaded.model
        config = model.generation_config
        eos = config.eos_token_id
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        self.repetition_penalty = float(getattr(config, "repetition_penalty", None) or 1.0)
        self._rows: list[_Row] = []
        self._requests: list[DecodeRequest] = []
        self._pending: list[DecodeRequest] = []
        # set while rows are running (by the first prefill; cleared when the last row leaves)
        # the running rows' transformers DynamicCache: full-attention layers, whose keys and values are edited here
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # (rows, columns) 1 for real tokens, 0 for left padding
        self._next_pos: torch.Tensor | None = None  # (rows,) the position of each row's next token
        self._last: torch.Tensor | None = None  # (rows,) each row's last chosen token, not yet in the cache
        # (rows, columns) token ids of each row (padding: -1), kept only for a repetition penalty
        self._seen: torch.Tensor | None = None
        self._mrope = False

    # -- the batch -----------------------------------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Requests decoding or waiting for their prefill."""
        return len(self._requests) + len(self._pending)

    def add(self, request: DecodeRequest) -> DecodeRequest:
        """Queue `request`; it is prefilled and joins the batch at the next `step`."""
        import torch

        generator = torch.Generator(device="cpu")
        if request.seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(request.seed))
        request._generator = generator
        request._tokens = [[] for _ in range(request.samples + 1)]
        request._open = request.samples + 1
        self._pending.append(request)
        return request

    def step(self) -> list[DecodeRequest]:
        """Prefill what was added, decode one token for every running row; the requests that finished."""
        import torch

        with torch.inference_mode():
            if self._pending:
                cohort, self._pending = self._pending, []
                return self._prefill(cohort)
            if self._rows:
                return self._decode()
        return []

    def run(self) -> None:
        """Step until every request added has finished."""
        while self.active:
            self.step()

    @contextlib.contextmanager
    def _model(self) -> Iterator[Any]:
        with self.lock, self.loaded.using() as model:
            yield model

    # -- prefill and merge ---------------------------------------------------------------------------------------

    def _prefill(self, cohort: list[DecodeRequest]) -> list[DecodeRequest]:
        import torch

        processor = self.loaded.processor
        inputs = processor(
            text=[self.prompt_text] * len(cohort),
            images=[r.picture for r in cohort],
            return_tensors="pt",
            padding=True,
            padding_side="left",
        ).to(self.loaded.device)
        for key, value in inputs.items():
            if torch.is_floating_point(value) and value.dtype != self.loaded.dtype:
                inputs[key] = value.to(self.loaded.dtype)
        mask = inputs["attention_mask"].long()
        with self._model() as model:
            kwargs = dict(inputs)
            positions = model._prepare_position_ids_for_generation(inputs["input_ids"], dict(kwargs))
            with capture_image_features(model, inputs, len(cohort)) as features:
                out = model(**kwargs, position_ids=positions, use_cache=True, logits_to_keep=1)
        for request, vector in zip(cohort, features):
            request.image_features = vector
        logits = out.logits[:, -1, :].float()
        mrope = positions.ndim == 3
        spatial = positions[-3:] if mrope else positions[None]
        # one past the highest position each prompt used (for Qwen2-VL, its rope delta included)
        next_pos = spatial.masked_fill((mask == 0)[None], -1).amax(dim=(0, 2)) + 1
        if self._rows and mrope != self._mrope:
            raise RuntimeError("a prefill changed the model's position layout")
        self._mrope = mrope

        # each request's greedy row then its K sampled rows: the prompt's cache copied to every row
        expand = torch.tensor([i for i, r in enumerate(cohort) for _ in range(r.samples + 1)], device=mask.device)
        rows = [_Row(r, k) for r in cohort for k in range(r.samples + 1)]
        cache = out.past_key_values
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, expand)
            layer.values = layer.values.index_select(0, expand)
        seen = (
            inputs["input_ids"].masked_fill(mask == 0, -1).index_select(0, expand)
            if self.repetition_penalty != 1.0
            else None
        )
        batch = dict(
            cache=cache, mask=mask.index_select(0, expand), next_pos=next_pos.index_select(0, expand), seen=seen
        )
        self._merge(batch, rows)
        self._requests += cohort
        for request in self._requests:
            request.peers = max(request.peers, len(self._requests))
        # the prompt's last logits give each new row its first token
        new = torch.arange(len(self._rows) - len(rows), len(self._rows), device=mask.device)
        chosen = self._choose(
            logits.index_select(0, expand), rows, None if self._seen is None else self._seen.index_select(0, new)
        )
        last = chosen if self._last is None else torch.cat([self._last, chosen])
        self._last = last
        return self._record(chosen, first_row=len(self._rows) - len(rows))

    def _merge(self, batch: dict[str, Any], rows: list[_Row]) -> None:
        """Append `rows` (their cache, mask, positions) to the running batch, left-padding the shorter side."""
        import torch

        if not self._rows:
            self._cache, self._mask = batch["cache"], batch["mask"]
            self._next_pos, self._seen = batch["next_pos"], batch["seen"]
            self._rows = list(rows)
            self._last = None
            return
        assert self._mask is not None and self._next_pos is not None  # rows are running
        width = max(self._mask.shape[1], batch["mask"].shape[1])

        def pad(tensor: torch.Tensor, dim: int, value: int = 0) -> torch.Tensor:
            short = width - tensor.shape[dim]
            if short == 0:
                return tensor
            shape = list(tensor.shape)
            shape[dim] = short
            return torch.cat([torch.full(shape, value, dtype=tensor.dtype, device=tensor.device), tensor], dim=dim)

        for mine, theirs in zip(self._cache.layers, batch["cache"].layers):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)])
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)])
        self._mask = torch.cat([pad(self._mask, 1), pad(batch["mask"], 1)])
        if self._seen is not None:
            self._seen = torch.cat([pad(self._seen, 1, -1), pad(batch["seen"], 1, -1)])
        self._next_pos = torch.cat([self._next_pos, batch["next_pos"]])
        self._rows += rows

    # -- decoding ------------------------------------------------------------------------------------------------

    def _decode(self) -> list[DecodeRequest]:
        import torch

        n = len(self._rows)
        assert self._mask is not None and self._next_pos is not None and self._last is not None  # rows are running
        ones = torch.ones((n, 1), dtype=self._mask.dtype, device=self._mask.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        if self._seen is not None:
            self._seen = torch.cat([self._seen, self._last[:, None]], dim=1)
        position = self._next_pos[:, None]
        position = position[None].expand(3, n, 1) if self._mrope else position
        with self._model() as model:
            out = model(
                input_ids=self._last[:, None],
                attention_mask=self._mask,
                position_ids=position,
                past_key_values=self._cache,
                use_cache=True,
            )
        self._cache = out.past_key_values
        self._next_pos = self._next_pos + 1
        chosen = self._choose(out.logits[:, -1, :].float(), self._rows, self._seen)
        self._last = chosen
        return self._record(chosen, first_row=0)

    def _choose(self, logits: torch.Tensor, rows: list[_Row], seen: torch.Tensor | None) -> torch.Tensor:
        """The next token of each row: arg-max on greedy rows, a draw from the request's generator on the others."""
        import torch

        if self.repetition_penalty != 1.0:
            assert seen is not None  # kept whenever there is a penalty
            # every token a row holds (prompt and drafted so far; not its padding, -1) is penalised once
            held = (
                torch.zeros_like(logits, dtype=torch.int32).scatter_add_(
                    1, seen.clamp(min=0), (seen >= 0).to(torch.int32)
                )
                > 0
            )
            penalised = torch.where(logits < 0, logits * self.repetition_penalty, logits / self.repetition_penalty)
            logits = torch.where(held, penalised, logits)
        chosen = logits.argmax(dim=-1)
        by_request: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            if row.index > 0:
                by_request.setdefault(id(row.request), []).append(i)
        for indices in by_request.values():
            request = rows[indices[0]].request
            where = torch.tensor(indices, device=logits.device)
            scores = logits.index_select(0, where) / request.temperature
            if request.top_p < 1.0:
                scores = top_p_filter(scores, request.top_p)
            draws = torch.multinomial(scores.softmax(dim=-1).cpu(), 1, generator=request._generator)[:, 0]
            chosen[where] = draws.to(chosen.device)
        return chosen

    def _record(self, chosen: torch.Tensor, *, first_row: int) -> list[DecodeRequest]:
        """Append each row's chosen token; rows at EOS or at their length leave; the requests that are done."""
        import torch

        tokens = chosen.tolist()
        keep: list[int] = []
        finished: list[DecodeRequest] = []
        for i, row in enumerate(self._rows):
            if i < first_row:
                keep.append(i)
                continue
            token = tokens[i - first_row]
            generated = row.request._tokens[row.index]
            ended = token in self.eos
            if not ended:
                generated.append(token)
            if ended or len(generated) >= row.request.max_new_tokens:
                row.request._open -= 1
                if row.request._open == 0:
                    finished.append(row.request)
            else:
                keep.append(i)
        if len(keep) < len(self._rows):
            assert self._mask is not None  # rows are running
            self._drop(torch.tensor(keep, dtype=torch.long, device=self._mask.device))
            self._rows = [self._rows[i] for i in keep]
        for request in finished:
            decode = self.loaded.processor.batch_decode
            request.texts = [t.strip() for t in decode(request._tokens, skip_special_tokens=True)]
            request._generator = None
            self._requests.remove(request)
        return finished

    def _drop(self, keep: torch.Tensor) -> None:
        """Keep only the rows `keep`, and drop the columns of padding no remaining row needs."""
        if keep.numel() == 0:
            self._rows, self._cache, self._mask, self._next_pos, self._last, self._seen = (
                [],
                None,
                None,
                None,
                None,
                None,
            )
            return
        assert self._mask is not None and self._next_pos is not None  # rows are running
        mask = self._mask.index_select(0, keep)
        start = int((mask.sum(dim=0) > 0).int().argmax())  # the first column some row still uses
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, keep)[:, :, start:]
            layer.values = layer.values.index_select(0, keep)[:, :, start:]
        self._mask = mask[:, start:]
        if self._seen is not None:
            self._seen = self._seen.index_select(0, keep)[:, start:]
        self._next_pos = self._next_pos.index_select(0, keep)
        if self._last is not None:
            self._last = self._last.index_select(0, keep)
