"""Loading any local image-text-to-text checkpoint, and LoRA adapters on top of it: the one loader.

Serving (`Drafter`), evaluation, training rounds (`orapo_core.train.run`) and
the benchmarks all load a model here, so all of them get the same checks (a
test holds every other module to it: no other `from_pretrained` of a model in
`app/`, `orapo_core/` or `benchmarks/`). Every path goes through
`AutoModelForImageTextToText` and the folder's own processor with
`local_files_only=True`: a model is a folder, never a hub name, so a typo cannot
turn into a download. A folder whose weights do not fit its config is refused
rather than served, or trained, with freshly initialised (random) layers, which
transformers would otherwise only warn about.

`load_model` loads for generation (eval mode, a served adapter applied);
`load_for_training` loads the policy a round trains (train mode, the recipe's
dtype and attention, no adapter: the trainer applies the recipe's LoRA).

Training rounds save LoRA adapters (a few MB) rather than whole models; a
served version is the base folder plus one adapter folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from orapo_core.errors import OrapoError
from orapo_core.models.compat import load_processor

if TYPE_CHECKING:
    import torch
    from peft import PeftModel

    from orapo_core.config import Settings

_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


@dataclass
class LoadedModel:
    """A model ready to generate, with the processor that feeds it."""

    model: Any
    processor: Any
    model_dir: Path
    adapter_dir: Path | None
    device: str
    dtype: Any
    # set by orapo_core.models.shared_base for a version on a base shared with others: selects the version's
    # adapter on the shared modules and yields the model to run; None: `model` as it is
    activate: Callable[[], contextlib.AbstractContextManager[Any]] | None = None

    @contextlib.contextmanager
    def using(self) -> Iterator[Any]:
        """The model to run inference with, ready for this version (its adapter active) for the body."""
        if self.activate is None:
            yield self.model
        else:
            with self.activate() as model:
                yield model

    @property
    def name(self) -> str:
        return self.model_dir.name

    @property
    def has_adapter(self) -> bool:
        from peft import PeftModel

        return isinstance(self.model, PeftModel)


def default_device() -> tuple[str, Any]:
    """bf16 on a GPU; float32 on a CPU, where bf16 matmuls are slower, not faster."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.bfloat16
    return "cpu", torch.float32


def resolve_model_dir(model_dir: str | Path | None = None, settings: Settings | None = None) -> Path:
    """The folder to serve, draft, evaluate or train from: the one given, else ORAPO_MODEL_DIR, else the starter.

    The starter is the data folder's (`<data>/models/starter`). A fresh data folder gets the one shipped in
    `assets/starter/` copied in, as `orapo serve` does on its first start, so `orapo draft`, `orapo eval` and
    `orapo train` work on a fresh clone. Building one (when nothing suitable is shipped) takes minutes and is
    left to `orapo starter build` or `orapo serve`.
    """
    if model_dir is not None:
        return Path(model_dir).expanduser()
    if settings is None:
        from orapo_core.config import Settings  # noqa: PLC0415 -- loads pydantic_settings, pydantic

        settings = Settings()
    if settings.model_dir is not None:
        return settings.model_dir.expanduser()
    starter = settings.models_dir / "starter"
    if (starter / "config.json").exists():
        return starter
    from orapo_core.models.starter import build  # noqa: PLC0415 -- loads numpy

    starter.parent.mkdir(parents=True, exist_ok=True)
    if build.copy_shipped_starter(starter, shipped_dir=build.SHIPPED_DIR) is None:
        raise OrapoError(
            "model_not_found",
            f"The starter model is not built yet ({starter}) and none that fits is shipped: run "
            "`orapo starter build` (a few minutes), or point ORAPO_MODEL_DIR at a saved checkpoint.",
        )
    return starter


def check_model_dir(model_dir: str | Path) -> Path:
    """Refuse a folder that cannot be a checkpoint, before transformers says so less clearly."""
    path = Path(model_dir).expanduser()
    if not path.exists():
        raise OrapoError(
            "model_not_found", f"The folder {path} does not exist: point ORAPO_MODEL_DIR at a saved checkpoint."
        )
    if not (path / "config.json").is_file():
        raise OrapoError(
            "model_invalid", f"The folder {path} has no config.json: point ORAPO_MODEL_DIR at a saved checkpoint."
        )
    if not any(any(path.glob(pattern)) for pattern in _WEIGHT_PATTERNS):
        raise OrapoError("model_invalid", f"The folder {path} has a config.json but no weights (*.safetensors).")
    return path


def load_model(
    model_dir: str | Path,
    adapter_dir: str | Path | None = None,
    *,
    device: str | None = None,
    dtype: Any = None,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load `model_dir` (and the LoRA adapter saved in `adapter_dir`, if given) for generation."""
    path = check_model_dir(model_dir)
    if device is None or dtype is None:
        default = default_device()
        device, dtype = device or default[0], dtype or default[1]
    model, processor = _load_checked(
        path, dtype=dtype, device_map=device if device != "cpu" else None, attn_implementation=attn_implementation
    )
    model.eval()
    adapter_path = None
    if adapter_dir is not None:
        adapter_path = _check_adapter_dir(adapter_dir)
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path, is_trainable=False)
        model.eval()
    return LoadedModel(
        model=model, processor=processor, model_dir=path, adapter_dir=adapter_path, device=str(device), dtype=dtype
    )


def load_for_training(
    model_dir: str | Path, *, dtype: Any = "float32", attn_implementation: str | None = None
) -> LoadedModel:
    """Load `model_dir` as the policy of a training round, with the same checks as `load_model`.

    `dtype` is the recipe's (``"float32"``, ``"bfloat16"``, a torch dtype, or ``"auto"``: the checkpoint's own);
    `attn_implementation` goes to transformers as given. The model stays on the CPU in train mode and without
    any adapter: the trainer places it (Accelerate, DeepSpeed) and applies the recipe's LoRA itself.
    """
    path = check_model_dir(model_dir)
    model, processor = _load_checked(
        path, dtype=as_torch_dtype(dtype), device_map=None, attn_implementation=attn_implementation
    )
    model.train()
    return LoadedModel(
        model=model,
        processor=processor,
        model_dir=path,
        adapter_dir=None,
        device=str(next(model.parameters()).device),
        dtype=model.dtype,
    )


def as_torch_dtype(dtype: Any) -> Any:
    """A recipe's dtype name as a torch dtype; None and ``"auto"`` are passed on as they are."""
    if dtype is None or dtype == "auto" or not isinstance(dtype, str):
        return dtype
    import torch

    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise OrapoError("model_invalid", f"dtype must be auto, float32, bfloat16 or float16; got {dtype!r}.")
    return value


def _load_checked(path: Path, *, dtype: Any, device_map: Any, attn_implementation: str | None) -> tuple[Any, Any]:
    """The model and processor of `path`, refused (OrapoError) unless every weight fits the config."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        # with output_loading_info, (the model, what was missing, unexpected or mismatched)
        model, info = cast(
            "tuple[Any, dict[str, Any]]",
            AutoModelForImageTextToText.from_pretrained(
                path,
                config=config,
                dtype=dtype,
                device_map=device_map,
                local_files_only=True,
                output_loading_info=True,
                **extra,
            ),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OrapoError("model_invalid", f"The folder {path} is not an image-text-to-text checkpoint: {exc}") from exc
    except RuntimeError as exc:  # transformers 5 raises this for tensors of the wrong shape
        raise OrapoError("model_invalid", f"The weights in {path} do not match its config.json ({exc}).") from exc
    broken = sorted(info["missing_keys"]) + sorted(k[0] for k in info["mismatched_keys"])
    if broken:
        raise OrapoError(
            "model_invalid",
            f"The weights in {path} do not match its config.json ({len(broken)} tensors missing or "
            f"of the wrong shape, e.g. {broken[0]}).",
        )
    try:
        processor = load_processor(path, config)
    except (OSError, ValueError, ImportError) as exc:
        raise OrapoError("model_invalid", f"The folder {path} has no usable processor: {exc}") from exc
    return model, processor


def save_adapter(model: LoadedModel | torch.nn.Module, adapter_dir: str | Path) -> Path:
    """Save the LoRA adapter of a PEFT model (or `LoadedModel`) into `adapter_dir`: weights and config only."""
    from peft import PeftModel

    model = model.model if isinstance(model, LoadedModel) else model
    if not isinstance(model, PeftModel):
        raise OrapoError("adapter_invalid", "Only a model with a LoRA adapter attached can be saved as an adapter.")
    path = Path(adapter_dir)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    return path


def add_named_adapter(model: torch.nn.Module, adapter_dir: str | Path, name: str) -> PeftModel:
    """The LoRA adapter saved in `adapter_dir` put on `model` as adapter `name`, for inference; `model` is a
    base model (a PeftModel wrapping it is returned) or a PeftModel already holding other adapters (returned)."""
    from peft import PeftModel

    path = _check_adapter_dir(adapter_dir)
    if isinstance(model, PeftModel):
        model.load_adapter(path, adapter_name=name, is_trainable=False)
    else:
        model = PeftModel.from_pretrained(model, path, adapter_name=name, is_trainable=False)
    model.eval()
    return model


def unload_adapter(loaded: LoadedModel) -> LoadedModel:
    """The base model again, with the adapter's layers removed (not merged) from it."""
    if not loaded.has_adapter:
        return loaded
    base = loaded.model.unload()
    return LoadedModel(
        model=base,
        processor=loaded.processor,
        model_dir=loaded.model_dir,
        adapter_dir=None,
        device=loaded.device,
        dtype=loaded.dtype,
    )


def _check_adapter_dir(adapter_dir: str | Path) -> Path:
    path = Path(adapter_dir).expanduser()
    if not path.exists():
        raise OrapoError("adapter_not_found", f"The adapter folder {path} does not exist.")
    if not (path / "adapter_config.json").is_file():
        raise OrapoError(
            "adapter_invalid", f"The folder {path} has no adapter_config.json: it is not a saved LoRA adapter."
        )
    return path
