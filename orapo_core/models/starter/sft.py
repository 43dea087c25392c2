"""The starter's warm start: a short supervised run on PhantomCXR, on CPU.

A plain torch loop rather than a trainer library: a few hundred steps on one
fixed prompt need no more, and every source of randomness is ours to seed
(studies from `(seed, i)`, batches and augmentation from one numpy generator,
weights from `torch.manual_seed`), so a build is repeatable on one machine and
thread count. The learning-rate schedule runs on steps, never on the clock: the
wall-clock cap only stops a slow machine early (the card says so), it does not
change what a finished build is.

Three choices make a model that reads the image within minutes:

- The architecture gives the image ONE visual token, a position-aware function
  of the whole downsampled film (see `architecture`), so the text model's
  readout is trivial: every answer position can attend to it.
- The vision tower is first trained alone (`vision_steps`, ~0.1 s a step) as a
  multi-label classifier of the PhantomCXR findings through a linear probe on
  that token; the report run then starts from a token that already carries the
  findings, at a low tower learning rate, with the probes still on.
- Rare findings (pneumothorax, fracture, lung lesion, pleural other) are kept
  at a fraction of their PhantomCXR prevalence, on purpose: the starter should
  be weak exactly where OraPO's rounds have something to learn. The common ones
  are drawn more often (0.3) than PhantomCXR draws them.

Auxiliary probes (discarded after the run; the saved folder is a plain
Qwen2-VL): one on the visual token(s) in grid order, one on the text model's
state at every answer position, so the readout is trained directly too.

What did not work (measured 2026-11-30, drafts of held-out phantoms labelled by
FactS): with the family's usual 14 px patches (64 visual tokens, no absolute
positions in the tower) no variant of learning rates, probe weights, a
structured DCT init or rope_theta made the text model read the image; it wrote
one report for every film, and cardiomegaly was never drafted. A pooled
classifier on that tower reached AUC ~0.6 for cardiomegaly after 200 steps; on
the one-token tower, 1.0 after 300. Default plan measured the same day (1 thread,
a second build beside it): cardiomegaly, effusion and edema drafted for 10 of
10 forced studies, consolidation 7, devices 8, normals 10 of 10 with no
finding; macro-F1 0.489 over 14 observations on 100 held-out studies (common
findings 0.835, rare 0.0); ridge AUC of the saved token 0.99-1.0 for
cardiomegaly, edema, effusion and devices.

The loss counts answer tokens only; the prompt is the same for every study, so
learning it would only teach the model to repeat it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from orapo_core.data.phantom import DEFAULT_PREVALENCE, FINDING_KINDS, generate_study, resolve_prevalence
from orapo_core.models.prompt import render_prompt
from orapo_core.report_layout import report_text

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

RARE_KINDS = ("pneumothorax", "fracture", "lung_lesion", "pleural_other")
# Findings the starter must already report when they are in the image; drawn more often in the
# warm start than PhantomCXR draws them, so the normal report is no longer the answer that costs least.
COMMON_KINDS = ("cardiomegaly", "lung_opacity", "edema", "consolidation", "pleural_effusion", "support_devices")


@dataclass(frozen=True)
class WarmStartPlan:
    """How the starter is warm-started (defaults: what `orapo starter build` does)."""

    seed: int = 0
    n_train: int = 2000
    steps: int = 300
    max_minutes: float = 20.0  # the whole build; ~9 min on two idle cores (2026-12-07)
    batch_size: int = 16
    lr: float = 2e-3
    vision_lr: float = 1e-4  # the tower's rate in the report run: low, so what `vision_steps` taught it stays
    warmup_steps: int = 20
    weight_decay: float = 0.01
    aux_weight: float = 0.5
    # 0.25 until 2026-12-07; with 0.5 and the larger warm-up below, one round teaches the model pleural other.
    rare_fraction: float = 0.5
    common_prevalence: float = 0.3  # if above 0, the common findings' training prevalence (never below default)
    probe_lr: float = 2e-4  # if above 0, the probes' own learning rate
    vision_steps: int = 3000  # steps of the vision tower alone on the findings (multi-label) before the report run
    # The vision warm-up has a training set of its own, every finding drawn at this prevalence: the tower must
    # *see* the rare findings (so a round can teach the text model to say them) even though the report run
    # keeps them scarce. 0 reuses the report set (the first shipped starter: pneumothorax lost in the token).
    vision_prevalence: float = 0.3
    vision_n_train: int = 8000
    vision_batch: int = 32
    vision_pretrain_lr: float = 1e-3
    # If above 0: every report step also reads this many of the vision warm-up's films (every finding at
    # `vision_prevalence`) through the prompt alone, and trains both probes on them, so the state where an
    # answer begins learns to carry the rare findings that the reports keep scarce. 0: off (the build shipped
    # until 2026-12-07); 16 since, with the larger vision warm-up above (docs/pages/research/round-matrix.md).
    perception_batch: int = 16
    threads: int = 2
    prevalence: dict = field(default_factory=dict)  # filled by `training_prevalence`

    def to_dict(self) -> dict:
        return asdict(self)


def training_prevalence(rare_fraction: float, common_prevalence: float = 0.0) -> dict[str, float]:
    """PhantomCXR's default prevalences with the rare findings cut to `rare_fraction` of theirs
    and the common ones raised to `common_prevalence` (when that is above their default)."""
    common = {k: max(DEFAULT_PREVALENCE[k], common_prevalence) for k in COMMON_KINDS}
    return resolve_prevalence({**common, **{k: DEFAULT_PREVALENCE[k] * rare_fraction for k in RARE_KINDS}})


@dataclass
class TrainingSet:
    """Studies held in memory at the model's input size: 8-bit images, answer token ids, finding targets."""

    images: np.ndarray  # (n, side, side) uint8, as a PhantomCXR PNG stores them
    answers: list[list[int]]
    targets: np.ndarray  # (n, len(FINDING_KINDS)) float32, 1 where the finding is drawn
    counts: dict[str, int]


def make_training_set(
    plan: WarmStartPlan,
    tokenizer: PreTrainedTokenizerBase,
    side: int,
    progress: Callable[[int, int], None] | None = None,
) -> TrainingSet:
    """The report run's studies: rare findings scarce, common ones frequent (`training_prevalence`)."""
    prevalence = plan.prevalence or training_prevalence(plan.rare_fraction, plan.common_prevalence)
    # (seed, 1, i): a stream of its own, apart from the tokenizer's reports and any evaluation set.
    return _draw_studies(plan.n_train, (plan.seed, 1), prevalence, side, tokenizer, progress)


def make_vision_set(plan: WarmStartPlan, side: int, progress: Callable[[int, int], None] | None = None) -> TrainingSet:
    """The vision warm-up's films: every finding at `plan.vision_prevalence`, no reports (the tower reads no text)."""
    prevalence = {kind: plan.vision_prevalence for kind in FINDING_KINDS}
    return _draw_studies(plan.vision_n_train, (plan.seed, 4), prevalence, side, None, progress)


def _draw_studies(
    n: int,
    stream: tuple[int, int],
    prevalence: dict[str, float],
    side: int,
    tokenizer: PreTrainedTokenizerBase | None,
    progress: Callable[[int, int], None] | None,
) -> TrainingSet:
    kinds = list(FINDING_KINDS)
    images = np.empty((n, side, side), dtype=np.uint8)
    answers: list[list[int]] = []
    targets = np.zeros((n, len(kinds)), dtype=np.float32)
    for i in range(n):
        study = generate_study(np.random.default_rng([*stream, i]), size=side, prevalence=prevalence)
        images[i] = np.round(study.image * 255).astype(np.uint8)
        if tokenizer is not None:
            answer = report_text(study.report_findings, study.report_impression) + tokenizer.eos_token
            answers.append(tokenizer(answer, add_special_tokens=False)["input_ids"])
        for kind in study.kinds:
            targets[i, kinds.index(kind)] = 1.0
        if progress is not None:
            progress(i + 1, n)
    counts = {k: int(targets[:, j].sum()) for j, k in enumerate(kinds)}
    return TrainingSet(images, answers, targets, counts)


def augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A different window and gamma, as the same film exported by another viewer would have."""
    x = image.astype(np.float32) / 255.0
    if rng.random() < 0.5:
        low, high = float(x.min()), float(x.max())
        x = (x - low) / max(high - low, 1e-6)  # the full-range stretch `to_rgb_image` gives raw pixel arrays
    x = np.clip(x, 0.0, 1.0) ** rng.uniform(0.8, 1.25)
    return np.round(x * 255).astype(np.uint8)


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The learning-rate factor at `step`: linear warm-up over `warmup` steps, then cosine to a tenth of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def _picture(array: np.ndarray) -> Image.Image:
    """An 8-bit grey array as the RGB picture the processor takes."""
    return Image.fromarray(array).convert("RGB")


class WarmStart:
    """One supervised run over a `TrainingSet`; `run` returns what the build card records."""

    def __init__(
        self, model: Any, processor: Any, plan: WarmStartPlan, *, n_kinds: int, side: int, n_tokens: int
    ) -> None:
        import torch

        self.model, self.processor, self.plan = model, processor, plan
        hidden = model.config.text_config.hidden_size
        # Two probes, discarded after the run: one over the visual tokens in grid order (it
        # knows where each token sits, which the tower's relative positions do not tell it),
        # one on the text model's state where the answer begins, so the readout of the image
        # by the text model's attention is trained directly too.
        self.probe = torch.nn.ModuleDict(
            {"visual": torch.nn.Linear(n_tokens * hidden, n_kinds), "answer": torch.nn.Linear(hidden, n_kinds)}
        )
        self.visual: list[torch.Tensor] = []
        model.model.visual.merger.register_forward_hook(lambda _m, _i, out: self.visual.append(out))
        prompt = self._prompt_inputs(side)
        self.prompt_ids = prompt["input_ids"][0]
        self.prompt_mm = prompt.get("mm_token_type_ids")
        self.optimizer = torch.optim.AdamW(self._param_groups(), betas=(0.9, 0.95), eps=1e-8)

    def _prompt_inputs(self, side: int) -> Any:
        blank = Image.new("RGB", (side, side))
        return self.processor(text=[render_prompt(self.processor)], images=[blank], return_tensors="pt")

    def _param_groups(self) -> list[dict[str, Any]]:
        plan = self.plan
        groups: dict[tuple[bool, bool, bool], dict[str, Any]] = {}
        named = [(f"model.{n}", p) for n, p in self.model.named_parameters()] + [
            (f"probe.{n}", p) for n, p in self.probe.named_parameters()
        ]
        for name, param in named:
            vision = ".visual." in name or name.startswith("probe.")
            decay = param.ndim >= 2 and "embed_tokens" not in name
            probe = name.startswith("probe.") and plan.probe_lr > 0
            key = (vision, decay, probe)
            lr = plan.probe_lr if probe else plan.vision_lr if vision else plan.lr
            groups.setdefault(key, {"params": [], "lr": lr, "weight_decay": plan.weight_decay if decay else 0.0})[
                "params"
            ].append(param)
        for group in groups.values():
            group["initial_lr"] = group["lr"]
        return list(groups.values())

    def lr_factor(self, step: int) -> float:
        return warmup_cosine(step, self.plan.warmup_steps, self.plan.steps)

    def batch(self, data: TrainingSet, indices: np.ndarray, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        import torch

        pictures = [_picture(augment(data.images[i], rng)) for i in indices]
        vision = self.processor.image_processor(images=pictures, return_tensors="pt")
        n_prompt = len(self.prompt_ids)
        length = n_prompt + max(len(data.answers[i]) for i in indices)
        pad = self.processor.tokenizer.pad_token_id
        input_ids = torch.full((len(indices), length), pad, dtype=torch.long)
        labels = torch.full_like(input_ids, -100)
        attention = torch.zeros_like(input_ids)
        for row, i in enumerate(indices):
            answer = torch.tensor(data.answers[i], dtype=torch.long)
            end = n_prompt + len(answer)
            input_ids[row, :n_prompt], input_ids[row, n_prompt:end] = self.prompt_ids, answer
            labels[row, n_prompt:end] = answer
            attention[row, :end] = 1
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention,
            "labels": labels,
            "pixel_values": vision["pixel_values"],
            "image_grid_thw": vision["image_grid_thw"],
        }
        if self.prompt_mm is not None:
            mm = torch.zeros_like(input_ids)
            mm[:, :n_prompt] = self.prompt_mm[0]
            inputs["mm_token_type_ids"] = mm
        return inputs

    def pretrain_vision(
        self, data: TrainingSet, *, deadline: float | None = None, on_step: Callable[[int, dict], None] | None = None
    ) -> dict:
        """`plan.vision_steps` steps of the vision tower and the visual probe alone, on the findings.

        Cheap (no text model: ~0.1 s a step on one core) and it is what makes the
        visual token carry the findings before the text model starts to read it;
        the report run that follows keeps the probe on, so it stays that way.
        """
        import torch

        plan, visual = self.plan, self.model.model.visual
        rng = np.random.default_rng([plan.seed, 3])
        params = list(visual.parameters()) + list(self.probe["visual"].parameters())
        optimizer = torch.optim.AdamW(
            params, lr=plan.vision_pretrain_lr, betas=(0.9, 0.95), weight_decay=plan.weight_decay
        )
        warmup = max(1, min(plan.warmup_steps, plan.vision_steps // 10))
        started, stopped_by, losses = time.perf_counter(), "steps", []
        visual.train()
        for step in range(plan.vision_steps):
            if deadline is not None and time.perf_counter() > deadline:
                stopped_by = "time"
                break
            indices = rng.choice(len(data.images), size=min(plan.vision_batch, len(data.images)), replace=False)
            pictures = [_picture(augment(data.images[i], rng)) for i in indices]
            vision = self.processor.image_processor(images=pictures, return_tensors="pt")
            for group in optimizer.param_groups:
                group["lr"] = plan.vision_pretrain_lr * warmup_cosine(step, warmup, plan.vision_steps)
            self.visual.clear()
            visual(vision["pixel_values"], grid_thw=vision["image_grid_thw"])
            logits = self.probe["visual"](self.visual[0].reshape(len(indices), -1))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(data.targets[indices]))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(step, {"vision_loss": losses[-1]})
        tail = losses[-20:] or [float("nan")]
        return {
            "vision_steps_done": len(losses),
            "vision_stopped_by": stopped_by,
            "vision_seconds": round(time.perf_counter() - started, 1),
            "final_vision_loss": round(sum(tail) / len(tail), 4),
        }

    def perception_loss(self, films: TrainingSet, rng: np.random.Generator) -> torch.Tensor:
        """Both probes' loss on `plan.perception_batch` films read through the prompt alone (no report)."""
        import torch

        indices = rng.choice(len(films.images), size=min(self.plan.perception_batch, len(films.images)), replace=False)
        pictures = [_picture(augment(films.images[i], rng)) for i in indices]
        vision = self.processor.image_processor(images=pictures, return_tensors="pt")
        input_ids = self.prompt_ids[None].expand(len(indices), -1)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "pixel_values": vision["pixel_values"],
            "image_grid_thw": vision["image_grid_thw"],
        }
        if self.prompt_mm is not None:
            inputs["mm_token_type_ids"] = self.prompt_mm.expand(len(indices), -1)
        self.visual.clear()
        output = self.model(**inputs, output_hidden_states=True)
        target = torch.from_numpy(films.targets[indices])
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        return bce(self.probe["visual"](self.visual[0].reshape(len(indices), -1)), target) + bce(
            self.probe["answer"](output.hidden_states[-1][:, -1]), target
        )

    def run(
        self,
        data: TrainingSet,
        *,
        deadline: float | None = None,
        on_step: Callable[[int, dict], None] | None = None,
        perception: TrainingSet | None = None,
    ) -> dict:
        """Train for `plan.steps` steps, or until `deadline` (a `time.perf_counter()` value) passes.
        `perception`: the films `plan.perception_batch` draws from (the vision warm-up's)."""
        import torch

        plan, model = self.plan, self.model
        rng = np.random.default_rng([plan.seed, 2])
        seen = np.random.default_rng([plan.seed, 5])
        perceive = perception is not None and plan.perception_batch > 0
        order, cursor = rng.permutation(len(data.images)), 0
        started, stopped_by = time.perf_counter(), "steps"
        model.train()
        losses = []
        for step in range(plan.steps):
            if deadline is not None and time.perf_counter() > deadline:
                stopped_by = "time"
                break
            if cursor + plan.batch_size > len(order):
                order, cursor = rng.permutation(len(data.images)), 0
            indices = order[cursor : cursor + plan.batch_size]
            cursor += plan.batch_size
            inputs = self.batch(data, indices, rng)
            for group in self.optimizer.param_groups:
                group["lr"] = group["initial_lr"] * self.lr_factor(step)
            self.visual.clear()
            output = model(**inputs, output_hidden_states=True)
            report_loss = output.loss
            tokens = self.visual[0].reshape(len(indices), -1)
            # The answer probe reads every answer position (and the last prompt token), so each
            # position's attention over the image is trained to find what the report must say.
            n_prompt = len(self.prompt_ids)
            states = output.hidden_states[-1][:, n_prompt - 1 : -1]
            mask = (inputs["labels"][:, n_prompt:] != -100).to(states.dtype)
            target = torch.from_numpy(data.targets[indices])
            bce = torch.nn.functional.binary_cross_entropy_with_logits
            per_position = bce(
                self.probe["answer"](states), target[:, None, :].expand(-1, states.shape[1], -1), reduction="none"
            ).mean(-1)
            answer_loss = (per_position * mask).sum() / mask.sum()
            probe_loss = bce(self.probe["visual"](tokens), target) + answer_loss
            if perceive and perception is not None:
                probe_loss = probe_loss + self.perception_loss(perception, seen)
            loss = report_loss + plan.aux_weight * probe_loss
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in self.optimizer.param_groups for p in g["params"]], 1.0)
            self.optimizer.step()
            record = {"report_loss": report_loss.item(), "probe_loss": probe_loss.item()}
            losses.append(record)
            if on_step is not None:
                on_step(step, record)
        model.eval()
        tail = losses[-20:] or [{"report_loss": float("nan"), "probe_loss": float("nan")}]
        return {
            "steps_done": len(losses),
            "stopped_by": stopped_by,
            "train_seconds": round(time.perf_counter() - started, 1),
            "final_report_loss": round(sum(r["report_loss"] for r in tail) / len(tail), 4),
            "final_probe_loss": round(sum(r["probe_loss"] for r in tail) / len(tail), 4),
        }
