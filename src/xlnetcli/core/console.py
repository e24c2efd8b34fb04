"""Console output: rank-0-only printing, rich progress bars, and a null logger for quiet ranks."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

# soft_wrap: a message is one line however long (a redirected log must stay grep-able; rich would wrap at 80 columns)
console = Console(stderr=True, highlight=False, soft_wrap=True)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_rank0() -> bool:
    return rank() == 0


def print0(*args: Any, **kwargs: Any) -> None:
    """Print on rank 0 only (to stderr, so stdout stays for machine-readable output)."""
    if is_rank0():
        console.print(*args, **kwargs)


class NullProgress:
    """Stands in for a rich Progress on non-zero ranks and when output is not a terminal-like stream."""

    def __enter__(self) -> NullProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def add_task(self, *args: Any, **kwargs: Any) -> TaskID:
        return TaskID(0)

    def update(self, *args: Any, **kwargs: Any) -> None:
        return None

    def advance(self, *args: Any, **kwargs: Any) -> None:
        return None


def _enabled(quiet: bool) -> bool:
    return is_rank0() and not quiet and os.environ.get("XLNET_NO_PROGRESS") != "1"


def progress_is_live(quiet: bool = False) -> bool:
    """True when a progress bar is drawn (rank 0, not quiet, stderr a terminal). When it is not (nohup, SLURM, a
    pipe), training prints one plain line per log interval instead."""
    return _enabled(quiet) and console.is_terminal


def duration(seconds: float) -> str:
    """3725 -> '1h02m', 95 -> '1m35s', 7 -> '7s'."""
    s = int(max(0.0, seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def byte_progress(quiet: bool = False) -> Progress | NullProgress:
    """A progress bar over bytes: shows MB/s and ETA."""
    if not _enabled(quiet):
        return NullProgress()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=not sys.stderr.isatty(),
    )


def step_progress(quiet: bool = False) -> Progress | NullProgress:
    """A progress bar over steps with a free-form info field (loss, lr, tokens/s)."""
    if not _enabled(quiet):
        return NullProgress()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=not sys.stderr.isatty(),
    )
