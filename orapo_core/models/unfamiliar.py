"""How unlike the served model's training films an image is: the unfamiliar-film score, and its calibration.

A model drafts fluently whatever it is shown; on a film unlike those it learnt
from, its words are least to be trusted. The score says when that is so, from
the model's own eyes: the image's pooled vision features (the merger's output
averaged over the image's tokens, exactly what `orapo_core.models.features`
stores with each draft) and their Mahalanobis distance to the features of
PhantomCXR films, the synthetic chest radiographs the starter (and every round
after it) was trained on.

Calibration (`FilmCalibration.fit`), once per model: `N_REFERENCE` PhantomCXR
films give the mean and covariance, the covariance shrunk towards a multiple of
the identity by the Ledoit-Wolf intensity (the features can outnumber the
films); `N_HELDOUT` other PhantomCXR films, from another stream, give the flag
threshold, the `QUANTILE` (99th percentile) of their distances: about 1 film in
100 like the training films is flagged by chance. A film past it is
"unfamiliar"; its draft carries the warning "this film is unlike the model's
training films; read every sentence".

`FAR_FACTOR` times the threshold is "far": further from the training films
than real chest radiographs are seen to fall (`benchmarks/bench_unfamiliar.py`,
docs/pages/research/benchmarks.md). Only an image whose header cannot say what
it is (PNG, JPEG, a DICOM without Modality or with OT) is refused for that, at
its first draft (`orapo_core.imaging.scope`); a DICOM that says CR or DX chest
is drafted, with the warning.

Where the calibration lives: `CALIBRATION_FILE` (an NPZ of a few hundred kB
beside the weights: in the adapter folder for a version trained with one, else
in the model folder), computed once and written there; when that folder is
read-only, under the data folder (`<data>/models/calibrations/<fingerprint>.npz`).
The fingerprint (the config and the weight files' names and sizes, the
adapter's too, and the calibration's own settings) ties it to the weights: a
file that no longer fits them is ignored and computed again. The shipped
starter ships its calibration. Computing one renders `N_REFERENCE +
N_HELDOUT` PhantomCXR films at `SIDE` pixels and runs only the vision tower on
them: about a minute on one CPU core for the starter, longer for a large model,
so the server does it while it warms the model up and `orapo draft` only when
asked (`--calibrate`); until then a draft says the check has not run.

What the score cannot tell: it measures distance from *PhantomCXR*, so every
real radiograph is "unfamiliar" to a model trained only on PhantomCXR (which is
true, and worth the warning). It does not say what the image is, nor whether the
draft is wrong; a familiar-looking film can still be drafted wrongly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np  # noqa: TID253 -- this module is heavy; light ones import it lazily
from PIL import Image

from orapo_core.data.phantom import generate_study
from orapo_core.models.features import capture_image_features
from orapo_core.models.picture import to_rgb_image

log = logging.getLogger("orapo.unfamiliar")

CALIBRATION_FILE = "unfamiliar_calibration.npz"
#: PhantomCXR films that give the training distribution's mean and covariance, and that give its threshold.
N_REFERENCE = 256
N_HELDOUT = 256
#: The films' side in pixels (the processor resizes them as it resizes any upload).
SIDE = 256
#: The generator streams: (SEED, 0, i) reference films, (SEED, 1, i) held-out ones; apart from the starter's.
SEED = 20261206
#: The held-out films' distance quantile that is the flag threshold (0.99: 1 in 100 flagged by chance).
QUANTILE = 0.99
#: A distance past FAR_FACTOR times the threshold is far outside the films a model has seen, real radiographs too.
FAR_FACTOR = 3.0
FORMAT = 1
#: The warning a flagged draft carries, wherever it is shown.
WARNING = "This film is unlike the model's training films; read every sentence."


@dataclass(frozen=True)
class FilmScore:
    """One image's unfamiliar-film score: its distance and the calibration's two thresholds."""

    distance: float
    threshold: float
    far_threshold: float

    @property
    def unfamiliar(self) -> bool:
        return self.distance > self.threshold

    @property
    def far(self) -> bool:
        return self.distance > self.far_threshold

    @property
    def ratio(self) -> float:
        """The distance in units of the threshold (above 1: flagged)."""
        return self.distance / self.threshold if self.threshold > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "distance": round(self.distance, 4),
            "threshold": round(self.threshold, 4),
            "far_threshold": round(self.far_threshold, 4),
            "unfamiliar": self.unfamiliar,
            "far": self.far,
        }


@dataclass(frozen=True)
class FilmCalibration:
    """A model's training-film distribution in its vision features: mean, shrunk covariance (as its principal
    directions and their variances, and the variance left in every other direction), and the thresholds."""

    mean: np.ndarray  # (d,)
    basis: np.ndarray  # (d, r): orthonormal principal directions of the reference films
    variances: np.ndarray  # (r,): the shrunk covariance's variance along each of them
    floor: float  # the shrunk covariance's variance in every direction orthogonal to the basis
    threshold: float
    far_threshold: float
    shrinkage: float
    fingerprint: str = ""
    meta: dict[str, Any] | None = None

    @classmethod
    def fit(
        cls,
        reference: np.ndarray,
        heldout: np.ndarray,
        *,
        quantile: float = QUANTILE,
        far_factor: float = FAR_FACTOR,
        fingerprint: str = "",
        meta: dict[str, Any] | None = None,
    ) -> FilmCalibration:
        """Fit on `reference` feature rows (n, d); the threshold is `quantile` of `heldout`'s distances."""
        x = np.asarray(reference, dtype=np.float64)
        if x.ndim != 2 or len(x) < 3:
            raise ValueError(f"need at least 3 reference feature rows, got an array of shape {x.shape}")
        n, d = x.shape
        mean = x.mean(axis=0)
        centred = x - mean
        _, singular, vt = np.linalg.svd(centred, full_matrices=False)
        keep = singular > singular.max() * 1e-9 if singular.size and singular.max() > 0 else np.zeros(0, bool)
        basis, sample_var = vt[keep].T, singular[keep] ** 2 / n  # S = basis diag(sample_var) basis^T (1/n)
        mu = float(sample_var.sum()) / d  # the target: mu * identity
        if mu <= 0:
            raise ValueError("the reference films' features do not vary: nothing to calibrate against")
        # Ledoit-Wolf: delta = ||S - mu I||^2 / d, beta = mean over films of ||x x^T - S||^2 / n / d
        delta = (float(((sample_var - mu) ** 2).sum()) + (d - len(sample_var)) * mu * mu) / d
        proj = centred @ basis
        norms = (centred * centred).sum(axis=1)
        per_film = norms**2 - 2 * (proj**2 @ sample_var) + float((sample_var**2).sum())
        beta = min(float(per_film.sum()) / n / n / d, delta)
        shrinkage = beta / delta if delta > 0 else 1.0
        variances = (1 - shrinkage) * sample_var + shrinkage * mu
        floor = shrinkage * mu
        if floor <= 0:  # no shrinkage at all: keep the unseen directions from dividing by zero
            floor = mu * 1e-6
        calibration = cls(mean, basis, variances, float(floor), 0.0, 0.0, float(shrinkage), fingerprint, meta)
        held = calibration.distances(np.asarray(heldout, dtype=np.float64))
        threshold = float(np.quantile(held, quantile))
        return cls(
            mean,
            basis,
            variances,
            float(floor),
            threshold,
            far_factor * threshold,
            float(shrinkage),
            fingerprint,
            {
                **(meta or {}),
                "n_reference": n,
                "n_heldout": int(len(held)),
                "quantile": quantile,
                "far_factor": far_factor,
                "features": d,
            },
        )

    def distances(self, features: np.ndarray) -> np.ndarray:
        """Mahalanobis distance of each feature row (n, d) under the shrunk covariance."""
        x = np.atleast_2d(np.asarray(features, dtype=np.float64)) - self.mean
        along = x @ self.basis
        rest = np.maximum((x * x).sum(axis=1) - (along * along).sum(axis=1), 0.0)
        return np.sqrt((along * along / self.variances).sum(axis=1) + rest / self.floor)

    def score(self, features: Sequence[float] | np.ndarray | None) -> FilmScore | None:
        """The score of one image's pooled features; None without features or for features of another size."""
        if features is None:
            return None
        x = np.asarray(features, dtype=np.float64)
        if x.shape != self.mean.shape or not np.all(np.isfinite(x)):
            return None
        return FilmScore(float(self.distances(x)[0]), self.threshold, self.far_threshold)

    def save(self, path: Path) -> Path:
        """Write the calibration (atomically: a reader never sees half a file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        header = json.dumps(
            {
                "format": FORMAT,
                "threshold": self.threshold,
                "far_threshold": self.far_threshold,
                "floor": self.floor,
                "shrinkage": self.shrinkage,
                "fingerprint": self.fingerprint,
                "meta": self.meta or {},
            },
            sort_keys=True,
        )
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(
                    f,
                    header=np.array(header),
                    mean=self.mean.astype(np.float32),
                    basis=self.basis.astype(np.float32),
                    variances=self.variances,
                )
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep other users of a shared model folder from reading it
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: Path) -> FilmCalibration | None:
        """The calibration in `path`, or None when there is none or it is unreadable or of another format."""
        try:
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(str(data["header"]))
                if header.get("format") != FORMAT:
                    return None
                return cls(
                    data["mean"].astype(np.float64),
                    data["basis"].astype(np.float64),
                    data["variances"].astype(np.float64),
                    float(header["floor"]),
                    float(header["threshold"]),
                    float(header["far_threshold"]),
                    float(header["shrinkage"]),
                    str(header["fingerprint"]),
                    dict(header.get("meta") or {}),
                )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def fingerprint(model_dir: Path, adapter_dir: Path | None = None) -> str:
    """What ties a calibration to the weights it was computed with: their config and files' names and sizes (not
    their bytes, which would take seconds to hash for a large model), the adapter's too, and this module's
    calibration settings."""
    digest = hashlib.sha256(json.dumps([FORMAT, N_REFERENCE, N_HELDOUT, SIDE, SEED, QUANTILE, FAR_FACTOR]).encode())
    for folder in (model_dir, adapter_dir):
        if folder is None:
            continue
        for name in ("config.json", "adapter_config.json"):
            if (folder / name).is_file():
                digest.update(name.encode() + (folder / name).read_bytes())
        for weights in sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")]):
            digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:24]


class CalibrationStopped(RuntimeError):
    """A calibration under way was stopped (the server is stopping)."""


def _check(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise CalibrationStopped("the unfamiliar-film calibration was stopped")


def phantom_pictures(
    n: int, stream: int, *, side: int = SIDE, start: int = 0, stop: threading.Event | None = None
) -> list:
    """PhantomCXR films (SEED, stream, i) for i in [start, start + n), as drafting shows a PNG of one: 8-bit RGB."""
    pictures = []
    for i in range(start, start + n):
        _check(stop)
        study = generate_study(np.random.default_rng([SEED, stream, i]), size=side)
        pictures.append(to_rgb_image(Image.fromarray(np.round(study.image * 255).astype(np.uint8))))
    return pictures


def film_features(
    loaded: Any,
    pictures: Sequence[Any],
    *,
    lock: threading.Lock | None = None,
    batch: int = 32,
    stop: threading.Event | None = None,
) -> np.ndarray:
    """(images, features): each picture's pooled vision features, as drafting captures them, from the vision tower
    alone (no language model forward). `loaded` is a `LoadedModel`; `pictures`, RGB pictures (`to_rgb_image`)."""
    import torch

    processor = loaded.processor
    rows: list[list[float] | None] = []
    for b in range(0, len(pictures), batch):
        _check(stop)
        chunk = list(pictures[b : b + batch])
        inputs = processor.image_processor(images=chunk, return_tensors="pt").to(loaded.device)
        pixel_values = inputs["pixel_values"].to(loaded.dtype)
        with (
            lock or contextlib.nullcontext(),
            loaded.using() as model,
            torch.inference_mode(),
            capture_image_features(model, inputs, len(chunk)) as pooled,
        ):
            model.get_image_features(pixel_values=pixel_values, image_grid_thw=inputs.get("image_grid_thw"))
        rows.extend(pooled)
    if any(row is None for row in rows):
        raise ValueError("this model's vision features could not be captured (no vision merger)")
    return np.asarray(rows, dtype=np.float64)


def calibration_paths(loaded: Any, cache_dir: Path | None) -> tuple[Path, Path | None]:
    """(beside the weights, under the data folder) for a loaded model's calibration."""
    home = Path(loaded.adapter_dir or loaded.model_dir)
    cached = None if cache_dir is None else Path(cache_dir) / f"{fingerprint(loaded.model_dir, loaded.adapter_dir)}.npz"
    return home / CALIBRATION_FILE, cached


def find_calibration(loaded: Any, cache_dir: Path | None = None) -> FilmCalibration | None:
    """The calibration computed for these weights, beside them or under the data folder; None when there is none."""
    wanted = fingerprint(loaded.model_dir, loaded.adapter_dir)
    for path in calibration_paths(loaded, cache_dir):
        if path is not None and path.is_file():
            calibration = FilmCalibration.load(path)
            if calibration is not None and calibration.fingerprint == wanted:
                return calibration
    return None


def build_calibration(
    loaded: Any,
    cache_dir: Path | None = None,
    *,
    lock: threading.Lock | None = None,
    n_reference: int = N_REFERENCE,
    n_heldout: int = N_HELDOUT,
    side: int = SIDE,
    stop: threading.Event | None = None,
) -> FilmCalibration:
    """Compute the calibration of a loaded model and store it beside its weights, else under `cache_dir`.
    Setting `stop` ends it early (`CalibrationStopped`), between two films or two batches."""
    started = time.perf_counter()
    reference = film_features(loaded, phantom_pictures(n_reference, 0, side=side, stop=stop), lock=lock, stop=stop)
    heldout = film_features(loaded, phantom_pictures(n_heldout, 1, side=side, stop=stop), lock=lock, stop=stop)
    calibration = FilmCalibration.fit(
        reference,
        heldout,
        fingerprint=fingerprint(loaded.model_dir, loaded.adapter_dir),
        meta={
            "films": "PhantomCXR",
            "side": side,
            "seed": SEED,
            "model": loaded.name,
            "seconds": round(time.perf_counter() - started, 1),
        },
    )
    beside, cached = calibration_paths(loaded, cache_dir)
    for path in (beside, cached):
        if path is None:
            continue
        try:
            calibration.save(path)
            log.info("orapo: unfamiliar-film calibration of %s written to %s", loaded.name, path)
            break
        except OSError:
            continue  # a read-only model folder: the data folder's cache next
    return calibration


class FilmCheck:
    """A drafter's unfamiliar-film check: its model's calibration (found, or computed once when asked), and the
    score of an image's features. Safe across threads; a calibration is computed once however many ask."""

    def __init__(self, loaded: Any, *, cache_dir: Path | None = None, lock: threading.Lock | None = None):
        self.loaded = loaded
        self.cache_dir = cache_dir
        self._model_lock = lock
        self._lock = threading.Lock()
        self._building = threading.Lock()
        self._calibration: FilmCalibration | None = None
        self._looked = False
        self._stop = threading.Event()

    def calibration(self, *, build: bool = False) -> FilmCalibration | None:
        """The model's calibration; computed now when there is none and `build` (else None)."""
        with self._lock:
            if self._calibration is None and not self._looked:
                self._calibration = find_calibration(self.loaded, self.cache_dir)
                self._looked = True
            if self._calibration is not None or not build:
                return self._calibration
        with self._building:  # one computation however many ask; drafts meanwhile are scored as not checked
            if self._calibration is None:
                built = build_calibration(self.loaded, self.cache_dir, lock=self._model_lock, stop=self._stop)
                with self._lock:
                    self._calibration = built
        return self._calibration

    def cancel(self) -> None:
        """Stop a calibration under way (`CalibrationStopped` in its thread) and any asked later."""
        self._stop.set()

    def score(self, features: Sequence[float] | np.ndarray | None) -> FilmScore | None:
        calibration = self.calibration()
        return None if calibration is None else calibration.score(features)

    def score_pictures(self, pictures: Sequence[Any]) -> list[FilmScore | None]:
        """Scores of pictures not drafted yet (a vision-tower forward each); Nones when there is no calibration."""
        calibration = self.calibration()
        if calibration is None:
            return [None for _ in pictures]
        return [calibration.score(row) for row in film_features(self.loaded, pictures, lock=self._model_lock)]
