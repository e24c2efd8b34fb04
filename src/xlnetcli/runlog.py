"""Run logs: metrics as JSON lines (and TensorBoard when installed); a null logger keeps non-zero ranks quiet."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends one JSON object per line to ``metrics.jsonl``; mirrors scalars to TensorBoard if available."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except Exception:  # tensorboard not installed: JSONL only
                self._tb = None

    def log(self, step: int, split: str = "train", **metrics: Any) -> None:
        row = {"step": step, "split": split, "time": round(time.time(), 3), **metrics}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self._tb.add_scalar(f"{split}/{k}", v, step)

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


class NullLogger:
    def log(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self) -> None:
        return None


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
