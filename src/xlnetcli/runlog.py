"""Run logs: metrics as JSON lines (and TensorBoard when installed); a null logger keeps non-zero ranks quiet."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from .errors import DataError
from .log import console


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


def read_metrics(run_dir: str | Path, warn: bool = True) -> list[dict]:
    """The rows of ``metrics.jsonl``. A torn last line (a process killed while appending) is skipped and reported;
    a bad line before the last one means the file was damaged otherwise, and is an error naming the line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if i == len(lines):
                if warn:
                    console.print(f"[yellow]{path}: skipped a torn last line (a run was killed while logging)[/]")
                break
            raise DataError(f"{path} line {i} is not a JSON object; the file is damaged") from None
        rows.append(row)
    return rows
