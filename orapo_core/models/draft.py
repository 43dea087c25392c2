"""Drafting a report for one image: a greedy draft, K sampled drafts, and their agreement.

The greedy draft is what the clinician edits; the K samples exist only to say how
sure the model is of each greedy sentence (self-consistency: a fact the samples
keep repeating is likelier right than one they contradict). The greedy draft and
its K samples share one prefill of the prompt and image (its KV cache copied to
every row) and decode as rows of one batch, which is most of the cost on a CPU.

A `Drafter` holds one loaded model: load once, draft many. The web app keeps one
per served model version; a lock serialises the forward passes, since
concurrent ones on one model would only compete for the same cores and memory.

Drafting goes through `orapo_core.models.decoding.ContinuousDecoder`, the
decoding loop `generate` runs, made open: a draft's prompt (and image) is
prefilled, its greedy row and K sampled rows join the rows already decoding,
and each row leaves the batch at its EOS, so a draft is done when its own rows
are, and a draft asked meanwhile joins at the next step instead of waiting for
the batch. `Drafter.draft_many` drafts several images in one such batch; the
web app's `DraftBatcher` keeps one running for all readers. An image's
greedy draft, and its samples for a given seed, are the same alone or in a
batch. A checkpoint whose generation config asks for what the loop does not
do is drafted with `generate` instead (one greedy-and-sampled call per batch).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from orapo_core.errors import OrapoError
from orapo_core.facts.consistency import (
    add_findings,
    findings_section_end,
    split_agreed,
    split_unsupported,
    stated_findings,
)
from orapo_core.models.decoding import ContinuousDecoder, DecodeRequest, unsupported_reason
from orapo_core.models.loading import LoadedModel, load_model
from orapo_core.models.picture import DEFAULT_MAX_SIDE, to_rgb_image
from orapo_core.models.prompt import PROMPT_VERSION, REPORT_PROMPT, render_prompt
from orapo_core.models.scoring import best_continuation
from orapo_core.models.unfamiliar import WARNING, FilmCheck, FilmScore
from orapo_core.models.verifier import FindingVerifier, prompt_states

if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image

#: How many sampled drafts measure each sentence's confidence (self-consistency), in the app and its gate.
DRAFT_SAMPLES = 4

log = logging.getLogger("orapo.draft")


@dataclass
class Draft:
    """A drafted report and everything needed to reproduce or audit it."""

    text: str
    samples: list[str]
    sentences: list[dict]  # [{"text": ..., "confidence": 0..1}] for each sentence of `text`
    flagged: list[Any]  # facts of `text` the samples disagree on, as self_consistency reports them
    model_name: str
    model_version: str | None
    prompt: str
    prompt_version: str
    sampling: dict
    latency_ms: float
    # what the language model was shown of the image, pooled (orapo_core.models.features); None when not captured
    image_features: list[float] | None = None
    # the greedy sentences left out of `text`: too few samples asserted their finding (`min_agreement`), or the
    # version's finding verifier did not find it on this film (orapo_core.models.verifier)
    withheld: list[str] = field(default_factory=list)
    # sentences the version's finding check put in: it read the finding on the film and the draft did not say it
    # (orapo_core.models.verifier); the model chose each among the sentences its round's reports state it with
    added: list[str] = field(default_factory=list)
    # the film's unfamiliar-film score (orapo_core.models.unfamiliar.FilmScore.to_dict: "unfamiliar" True when it
    # is unlike the model's training films); None when not checked (no calibration for this model yet)
    unfamiliar: dict | None = None

    @property
    def unfamiliar_warning(self) -> str | None:
        """The warning a draft of an unfamiliar film carries, else None."""
        return WARNING if (self.unfamiliar or {}).get("unfamiliar") else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Drafter:
    """One loaded model that drafts reports."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        model_version: str | None = None,
        prompt: str = REPORT_PROMPT,
        max_side: int | None = DEFAULT_MAX_SIDE,
        lock: threading.Lock | None = None,
        min_agreement: float = 0.0,
        calibration_cache: Path | None = None,
    ):
        if not 0.0 <= min_agreement <= 1.0:
            raise OrapoError(
                "draft_invalid", f"The sample agreement a finding needs must lie between 0 and 1, not {min_agreement}."
            )
        self.loaded = loaded
        # 0: the draft is the greedy text; above 0, a sentence asserting a finding that fewer than this share of
        # the draft's samples assert is left out of it (orapo_core.facts.keep_agreed; ORAPO_DRAFT_MIN_AGREEMENT)
        self.min_agreement = float(min_agreement)
        self.model_version = model_version
        self.prompt = prompt
        self.max_side = max_side
        self.prompt_text = render_prompt(loaded.processor, prompt)
        # drafters of versions on one shared base pass that base's lock (orapo_core.models.shared_base)
        self._lock = lock or threading.Lock()
        self._decoding: str | None = None  # "" once continuous decoding is known to work; else why not
        # the checks the version's round fitted for the findings it taught, or None (orapo_core.models.verifier)
        self.verifier = FindingVerifier.load(loaded.adapter_dir or loaded.model_dir)
        # how unlike its training films each drafted film is (orapo_core.models.unfamiliar); its calibration is
        # found beside the weights or under `calibration_cache`, computed only when asked (`films.calibration`)
        self.films = FilmCheck(loaded, cache_dir=calibration_cache, lock=self._lock)

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        adapter_dir: str | Path | None = None,
        *,
        model_version: str | None = None,
        **kwargs: Any,
    ) -> Drafter:
        return cls(load_model(model_dir, adapter_dir), model_version=model_version, **kwargs)

    def draft(
        self,
        image: Image.Image | np.ndarray,
        *,
        samples: int = 4,
        max_new_tokens: int = 192,
        temperature: float = 1.0,
        top_p: float = 0.95,
        seed: int | None = 0,
    ) -> Draft:
        """Draft a report for `image` (a PIL image, or a 2-D array: uint8 display or full bit depth)."""
        return self.draft_many(
            [image], samples=samples, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
        )[0]

    def prepare(self, image: Image.Image | np.ndarray) -> Image.Image:
        """The RGB picture the model is given for `image`; raises OrapoError for something that is not an image."""
        return to_rgb_image(image, max_side=self.max_side)

    def draft_many(
        self,
        images: Iterable[Image.Image | np.ndarray],
        *,
        samples: int = 4,
        max_new_tokens: int = 192,
        temperature: float = 1.0,
        top_p: float = 0.95,
        seed: int | None = 0,
    ) -> list[Draft]:
        """One Draft per image, in order, decoded together (`orapo_core.models.decoding`).

        Each Draft is what `draft` returns for its image alone: the same greedy text, and the same
        samples, drawn from the draft's own generator seeded by `seed`. `sampling["batch_size"]`
        records the batch when there was more than one image. A model whose generation config the
        continuous decoder does not support is drafted by one `generate` over all the images instead
        (its samples then come from one stream shared by the batch).
        """
        settings = self.sampling_settings(
            samples=samples, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
        )
        images = list(images)
        if not images:
            return []
        started = time.perf_counter()
        pictures = [self.prepare(image) for image in images]
        decoder = self.new_decoder()
        if decoder is not None:
            requests = [decoder.add(DecodeRequest(picture, **settings)) for picture in pictures]
            decoder.run()
            texts = [cast("list[str]", r.texts) for r in requests]  # `run` returns once every request is decoded
            results = [(t[0], t[1:], r.image_features) for t, r in zip(texts, requests, strict=True)]
        else:
            with self._lock:
                results = [
                    (greedy, sampled, None)
                    for greedy, sampled in self._generate_many(
                        pictures, samples, max_new_tokens, temperature, top_p, seed
                    )
                ]
        if any(features is None for _, _, features in results):  # `generate` captures none: the tower alone
            scores = self.films.score_pictures(pictures)
        else:
            scores = [None] * len(pictures)
        unsupported, supported = self.checked_findings(pictures)
        additions = [
            self.choose_additions(picture, greedy, vetoed, wanted)
            for picture, (greedy, _, _), vetoed, wanted in zip(pictures, results, unsupported, supported, strict=True)
        ]
        generated_s = time.perf_counter() - started
        # the shared decoding plus each image's own scoring, not the scoring of those before it
        return [
            self.compose(
                greedy,
                sampled,
                settings,
                batch_size=len(pictures),
                generated_s=generated_s,
                image_features=features,
                unsupported=vetoed,
                additions=added,
                film=film,
            )
            for (greedy, sampled, features), vetoed, added, film in zip(
                results, unsupported, additions, scores, strict=True
            )
        ]

    def checked_findings(self, pictures: Sequence[Image.Image]) -> tuple[list[set[str]], list[set[str]]]:
        """Per picture, the checked findings the model's own state does not support, and those it reads clearly
        enough to state (none without a verifier): one prompt-only forward per batch, beside the decoding."""
        if self.verifier is None:
            return [set() for _ in pictures], [set() for _ in pictures]
        with self._lock, self.loaded.using() as model:
            states = prompt_states(model, self.loaded.processor, self.prompt_text, pictures)
        return self.verifier.unsupported(states), self.verifier.supported(states)

    def finish(
        self, picture: Image.Image, greedy: str, sampled: list[str], settings: dict[str, Any], **kwargs: Any
    ) -> Draft:
        """The Draft of one picture decoded elsewhere (the app's running batch), the version's finding checks
        applied to it as `draft_many` applies them: `compose` with what they withhold and add."""
        (vetoed,), (wanted,) = self.checked_findings([picture])
        return self.compose(
            greedy,
            sampled,
            settings,
            unsupported=vetoed,
            additions=self.choose_additions(picture, greedy, vetoed, wanted),
            **kwargs,
        )

    def choose_additions(
        self, picture: Image.Image, greedy: str, unsupported: set[str], supported: set[str]
    ) -> dict[str, str]:
        """For each finding the check reads on `picture` and the greedy draft (less what the check withholds) does
        not state, the sentence to add: the one of the check's sentences the model reads most easily after the
        draft's findings (`orapo_core.models.scoring.best_continuation`), so side and size come from the film."""
        if not supported:
            return {}
        text, _ = split_unsupported(greedy, unsupported)
        wanted = sorted(supported - unsupported - stated_findings(text))
        if not wanted:
            return {}

        prefix = findings_section_end(text)
        assert self.verifier is not None  # `supported` is empty without one (`checked_findings`)
        chosen = {}
        with self._lock, self.loaded.using() as model:
            for name in wanted:
                candidates = self.verifier.checks[name].sentences
                best = (
                    best_continuation(
                        model, self.loaded.processor, picture, prefix, candidates, prompt_text=self.prompt_text
                    )
                    if len(candidates) > 1
                    else 0
                )
                chosen[name] = candidates[best]
        return chosen

    @staticmethod
    def sampling_settings(
        *,
        samples: int = 4,
        max_new_tokens: int = 192,
        temperature: float = 1.0,
        top_p: float = 0.95,
        seed: int | None = 0,
    ) -> dict[str, Any]:
        """Every sampling setting of a draft, `draft`'s defaults filled in; OrapoError for one out of range."""
        _check_sampling(samples, max_new_tokens, temperature, top_p)
        return dict(samples=samples, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)

    def new_decoder(self) -> ContinuousDecoder | None:
        """A `ContinuousDecoder` over this model (drafts joining and leaving a running batch step by step), or
        None when the model's generation config asks for something it does not do: then `generate` drafts."""
        if self._decoding is None:
            reason = unsupported_reason(self.loaded.model)
            self._decoding = reason or ""
            if reason:
                log.info("orapo: drafting %s with generate, not continuous batching: %s", self.loaded.name, reason)
        if self._decoding:
            return None
        return ContinuousDecoder(self.loaded, self.prompt_text, lock=self._lock)

    def compose(
        self,
        greedy: str,
        sampled: list[str],
        settings: dict,
        *,
        batch_size: int = 1,
        generated_s: float = 0.0,
        image_features: list[float] | None = None,
        unsupported: set[str] | None = None,
        additions: dict[str, str] | None = None,
        film: FilmScore | None = None,
    ) -> Draft:
        """The Draft of a greedy text and its samples: self-consistency scored, provenance recorded.

        `settings` are the draft's sampling settings; `batch_size`, the most drafts decoded alongside it
        (recorded when above 1); `generated_s`, the decoding time, to which this scoring's time is added;
        `image_features`, the image's pooled merged tokens when the decoder captured them; `unsupported`, the
        verified findings the verifier did not find on the image (their sentences are withheld); `additions`, the
        sentences the finding check puts in (`choose_additions`; a denial of their finding is withheld); `film`, the
        image's unfamiliar-film score when it was measured apart (else it is scored from `image_features`)."""
        scoring = time.perf_counter()
        text, withheld = split_agreed(greedy, sampled, self.min_agreement)
        text, vetoed = split_unsupported(text, unsupported or set())
        text, added, replaced = add_findings(text, additions or {})
        withheld = withheld + vetoed + replaced
        sentences, flagged = score_self_consistency(text, sampled) if sampled else ([], [])
        sampling = {
            "samples": settings["samples"],
            "max_new_tokens": settings["max_new_tokens"],
            "temperature": settings["temperature"],
            "top_p": settings["top_p"],
            "top_k": 0,
            "seed": settings["seed"],
        }
        if self.min_agreement and sampled:
            sampling["min_agreement"] = self.min_agreement
        if self.verifier is not None:
            sampling["verified_findings"] = sorted(self.verifier.checks)
        if batch_size > 1:
            sampling["batch_size"] = batch_size
        film = film or self.films.score(image_features)
        return Draft(
            text=text,
            samples=sampled,
            sentences=sentences,
            flagged=flagged,
            model_name=self.loaded.name,
            model_version=self.model_version,
            prompt=self.prompt,
            prompt_version=PROMPT_VERSION,
            sampling=sampling,
            latency_ms=round((generated_s + time.perf_counter() - scoring) * 1000, 1),
            image_features=image_features,
            withheld=withheld,
            added=added,
            unfamiliar=film.to_dict() if film is not None else None,
        )

    def _generate_many(
        self,
        pictures: Sequence[Image.Image],
        samples: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
    ) -> list[tuple[str, list[str]]]:
        import torch

        processor = self.loaded.processor
        # left padding: every row's prompt ends at the last column, where generation appends; the attention
        # mask marks the padding, and Qwen2-VL computes its (m)rope positions from that mask
        inputs = processor(
            text=[self.prompt_text] * len(pictures),
            images=list(pictures),
            return_tensors="pt",
            padding=True,
            padding_side="left",
        ).to(self.loaded.device)
        for key, value in inputs.items():
            if torch.is_floating_point(value) and value.dtype != self.loaded.dtype:
                inputs[key] = value.to(self.loaded.dtype)
        prompt_len = inputs["input_ids"].shape[1]
        tokenizer = processor.tokenizer
        common = dict(
            max_new_tokens=max_new_tokens,
            use_cache=True,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
        with torch.inference_mode(), self.loaded.using() as model:
            if samples == 0:
                greedy_ids = model.generate(**inputs, do_sample=False, **common)
                return [
                    (t.strip(), [])
                    for t in processor.batch_decode(greedy_ids[:, prompt_len:], skip_special_tokens=True)
                ]
            # One generate for the greedy draft and its K samples: each image's rows are its greedy row, then
            # its K sampled rows (num_return_sequences repeats rows in place), and `_GreedyRows` keeps only
            # the arg-max token on the greedy rows, so sampling them is greedy decoding. Half the decoding
            # steps of a greedy generate followed by a sampled one, for the same texts.
            # top_k=0: checkpoints such as Qwen2-VL ship top_k=1 in generation_config.json,
            # which would make every "sample" the greedy draft and the agreement meaningless.
            from transformers import LogitsProcessorList

            rows = samples + 1
            sampling = dict(
                do_sample=True,
                num_return_sequences=rows,
                temperature=temperature,
                top_p=top_p,
                top_k=0,
                logits_processor=LogitsProcessorList([_GreedyRows(rows)]),
                **common,
            )
            with torch.random.fork_rng(devices=[self.loaded.device] if self.loaded.device.startswith("cuda") else []):
                if seed is not None:
                    torch.manual_seed(seed)
                ids = model.generate(**inputs, **sampling)
        texts = [t.strip() for t in processor.batch_decode(ids[:, prompt_len:], skip_special_tokens=True)]
        return [(texts[i * rows], texts[i * rows + 1 : (i + 1) * rows]) for i in range(len(pictures))]


class _GreedyRows:
    """A logits processor that leaves only the arg-max token on every `rows`-th row (rows 0, rows, 2*rows...).

    It runs before the sampling warpers (temperature and top-p keep a lone token), so those rows decode
    exactly as greedy search would.
    """

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        greedy = scores[:: self.rows]
        keep = torch.full_like(greedy, float("-inf"))
        keep.scatter_(1, greedy.argmax(dim=-1, keepdim=True), 0.0)
        scores = scores.clone()
        scores[:: self.rows] = greedy + keep
        return scores


def score_self_consistency(greedy: str, samples: list[str]) -> tuple[list[dict], list[Any]]:
    """Per-sentence confidences of the greedy draft and the facts the samples disagree on.

    Delegates to `orapo_core.facts.self_consistency`, and turns what it returns
    into plain JSON-ready values (the draft is stored and sent to the browser).
    """
    from orapo_core.facts import self_consistency  # noqa: PLC0415 -- tests patch self_consistency

    result = self_consistency(greedy, samples)
    if isinstance(result, tuple):
        sentences, flagged = result
    elif isinstance(result, dict):
        sentences, flagged = result["sentences"], result["flagged"]
    else:
        sentences, flagged = result.sentences, result.flagged
    return [_sentence(s) for s in sentences], [_plain(f) for f in flagged]


def _sentence(item: Any) -> dict[str, Any]:
    if isinstance(item, tuple):
        text, confidence = item
        return {"text": str(text), "confidence": float(confidence)}
    plain = _plain(item)
    if not isinstance(plain, dict):
        raise TypeError(f"self_consistency returned a sentence of unexpected shape: {item!r}")
    plain["confidence"] = float(plain["confidence"])
    return plain


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _check_sampling(samples: int, max_new_tokens: int, temperature: float, top_p: float) -> None:
    if not 0 <= samples <= 32:
        raise OrapoError("draft_invalid", f"samples must be between 0 and 32; got {samples}.")
    if max_new_tokens < 1:
        raise OrapoError("draft_invalid", f"max_new_tokens must be at least 1; got {max_new_tokens}.")
    if not temperature > 0:
        raise OrapoError("draft_invalid", f"temperature must be above 0; got {temperature}.")
    if not 0 < top_p <= 1:
        raise OrapoError("draft_invalid", f"top_p must be in (0, 1]; got {top_p}.")
