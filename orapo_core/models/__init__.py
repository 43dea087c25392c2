"""Loading any local image-text-to-text model, LoRA adapters, the report prompt, and drafting.

Names are resolved lazily so that `import orapo_core.models` costs nothing:
torch and transformers load when a model does.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LoadedModel": "loading",
    "load_model": "loading",
    "load_for_training": "loading",
    "save_adapter": "loading",
    "unload_adapter": "loading",
    "resolve_model_dir": "loading",
    "check_model_dir": "loading",
    "default_device": "loading",
    "REPORT_PROMPT": "prompt",
    "PROMPT_VERSION": "prompt",
    "build_messages": "prompt",
    "render_prompt": "prompt",
    "Draft": "draft",
    "Drafter": "draft",
    "to_rgb_image": "picture",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
