"""Run logs: metrics as JSON lines, mirrored to the trackers of ``report_to``; a null logger keeps other ranks quiet.

    logger = MetricsLogger(run_dir, report_to=cfg.train.report_to, config=cfg)   # rank 0 only
    logger.log(step, "train", loss=2.3, lr=1e-4)    # metrics.jsonl row; scalars as train/loss, train/lr at `step`

report_to (train.report_to for pretraining, finetune.report_to for finetuning) is a comma string or list of:
  tensorboard  TensorBoard event files in RUN/tensorboard/ (needs the tensorboard package)
  wandb        Weights & Biases (the `wandb` extra); WANDB_PROJECT (default xlnet), WANDB_MODE=offline, WANDB_DIR
               (default: the run folder) and the other WANDB_* variables apply; the x axis is the metric "step"
  mlflow       MLflow (the `mlflow` extra); MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME (default xlnet) apply
  auto         TensorBoard when it is installed, nothing else (the default);  none: metrics.jsonl only
The run config is logged once as parameters (wandb: nested config; MLflow: section.key params). A resumed run (its
metrics.jsonl already holds rows) continues the same wandb / MLflow run: their ids are kept in RUN/trackers.json.
A tracker that fails in the middle of a run is reported once and dropped; training goes on (metrics.jsonl is the
record).
"""

from __future__ import annotations

import atexit
import json
import math
import time
from pathlib import Path
from typing import Any

from xlnetcli.core.console import console
from xlnetcli.core.errors import DataError
from xlnetcli.core.shapes import describe, dumps_strict
from xlnetcli.report.trackers import TRACKERS_FILE, close_trackers, one_line, start_trackers

# What a run folder holds besides its subfolders (step folders, tensorboard/): config, metrics, a finetuning run's
# results, the trackers' run ids
RUN_FILES = ("config.yaml", "metrics.jsonl", "results.json", TRACKERS_FILE)


def run_inputs(run_dir: str | Path) -> list[Path]:
    """What an output must never replace when the run folder ``run_dir`` is read: its own files (RUN_FILES) and every
    subfolder. A new file beside them (`xlnet eval RUN --output RUN/valid.json`, `xlnet plot`'s curves.png) is fine."""
    run = Path(run_dir)
    if not run.is_dir():
        return [run]
    return [run / name for name in RUN_FILES] + [p for p in run.iterdir() if p.is_dir()]


class MetricsLogger:
    """Appends one JSON object per line to ``metrics.jsonl``; mirrors numeric values to the ``report_to`` trackers.

    Trackers are started here (a missing package or a failed start is a one-line XLNetError, before any training).
    """

    def __init__(self, run_dir: str | Path, report_to: str | list[str] = "auto", config: Any = None) -> None:
        run_dir = Path(run_dir)
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        resumed = self.path.is_file() and self.path.stat().st_size > 0
        self._trackers: list[Any] = start_trackers(run_dir, report_to, config, resumed)
        self._f = self.path.open("a", encoding="utf-8")
        self._closed = False
        atexit.register(self._at_exit)  # a run that died with an exception marks its tracker runs failed

    def log(self, step: int, split: str = "train", **metrics: Any) -> None:
        row = {"step": step, "split": split, "time": round(time.time(), 3), **metrics}
        self._f.write(dumps_strict(row) + "\n")  # a NaN loss is written as null
        self._f.flush()
        scalars = {
            f"{split}/{k}": float(v)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        if not scalars:
            return
        for t in list(self._trackers):
            try:
                t.log(step, scalars)
            except Exception as e:  # noqa: BLE001 - a tracker outage must not end a long run: report once, go on
                console.print(
                    f"warning: report_to {t.name}: {one_line(e)}; no longer logging to it "
                    "(metrics.jsonl keeps every row)",
                    markup=False,
                )
                self._trackers.remove(t)

    def note(self, step: int, split: str, **fields: Any) -> None:
        """A row of metrics.jsonl that is no metric (a setting changed on resume): not sent to the trackers."""
        self._f.write(dumps_strict({"step": step, "split": split, "time": round(time.time(), 3), **fields}) + "\n")
        self._f.flush()

    def _close_trackers(self, ok: bool) -> None:
        close_trackers(self._trackers, ok)
        self._trackers = []

    def close(self, ok: bool = True) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._f.close()
        self._close_trackers(ok)

    def _at_exit(self) -> None:
        self.close(ok=False)


class NullLogger:
    def log(self, *args: Any, **kwargs: Any) -> None:
        return None

    def note(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self, *args: Any, **kwargs: Any) -> None:
        return None


def read_metrics(run_dir: str | Path, warn: bool = True) -> list[dict]:
    """The rows of ``metrics.jsonl``. A torn last line (a process killed while appending) is skipped and reported;
    a bad line before the last one means the file was damaged otherwise, and is an error naming the line; so is a
    row without an integer ``step`` >= 0 (every row the tool writes has one) or one nested too deeply to parse."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    # lines end at \n only (JSON Lines): str.splitlines would also break at a U+2028 a JSON string may hold raw
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
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
        except RecursionError:  # not a torn line: a complete one nested deeper than Python's stack
            raise DataError(f"{path} line {i} is nested too deeply to read; the file is damaged") from None
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            found = "none" if "step" not in row else describe(step)
            raise DataError(f"{path} line {i} has no step (found {found}); every row needs one: fix or remove the line")
        rows.append(row)
    return rows
