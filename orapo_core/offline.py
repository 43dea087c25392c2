"""Offline by construction: every entry point calls `enforce_offline()` first.

The variables are set with `setdefault` semantics only where a user has not
chosen otherwise for analytics and telemetry, but the hub is always forced
offline: no code path of this project may download weights or data.
"""

from __future__ import annotations

import os

_OFFLINE_ENV = {
    "GRADIO_ANALYTICS_ENABLED": "False",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
}


def enforce_offline() -> None:
    for key, value in _OFFLINE_ENV.items():
        os.environ[key] = value


enforce_offline()
