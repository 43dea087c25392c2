"""Every logged step as one JSON line, so the app can plot a round while it runs.

The file is appended to and flushed at each log, one self-contained object per
line (``step``, ``epoch`` and the trainer's logged values), so a reader tailing
it never sees half a record.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from transformers import (  # noqa: TID253 -- this module is heavy; light ones import it lazily
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)


def _plain(value: object) -> int | float | str | bool | None:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _plain(value.item())
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


class MetricsJsonlCallback(TrainerCallback):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        record: dict[str, object] = {"step": state.global_step, "epoch": state.epoch, "time": time.time()}
        record.update({k: _plain(v) for k, v in logs.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
