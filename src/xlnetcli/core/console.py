"""Console output: rank-0-only printing, rich progress bars, and a null logger for quiet ranks."""

from __future__ import annotations

import os
import sys
import time
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


class CountProgress:
    """Progress of a loop over a known number of items (examples, batches, fits) that prints nothing else while it
    works (`xlnet eval`, `--predict`, `xlnet probe`): in a terminal a bar with the count, items/s and ETA; otherwise
    (a log file, a pipe) plain lines like training's, ``eval: 320/1,000 examples (32%), 151.2 examples/s, ETA 4s``,
    at the first item, at each further tenth of the total or after ``every`` seconds, and at the end (the final line
    has the elapsed time instead of the ETA). Nothing when quiet, on ranks but 0, or with XLNET_NO_PROGRESS=1.

        with CountProgress("eval", len(data), "examples", quiet) as bar:
            for batch in batches: ...; bar.advance(len(batch))
    """

    def __init__(self, label: str, total: int, unit: str = "examples", quiet: bool = False, every: float = 30.0):
        self.label, self.total, self.unit, self.every = label, max(1, total), unit, every
        self.enabled, self.live = _enabled(quiet), progress_is_live(quiet)
        self._progress = step_progress(quiet) if self.live else NullProgress()
        self.done = self._said = self._tenth = 0
        self._start = self._last = time.perf_counter()

    def __enter__(self) -> CountProgress:
        self._progress.__enter__()
        self._task = self._progress.add_task(self.label, total=self.total, info="")
        self._start = self._last = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)
        if exc[0] is None and self.enabled and not self.live and self.done != self._said:
            self._line(time.perf_counter())  # a loop that ended short of its total still says where it ended

    def advance(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)  # under torchrun rank 0 counts its batches times the ranks
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.live:
            self._progress.update(self._task, completed=self.done, info=f"{self._rate(now):,.1f} {self.unit}/s")
            return
        tenth = 10 * self.done // self.total
        if not self._said or tenth > self._tenth or now - self._last >= self.every or self.done >= self.total:
            self._tenth = tenth
            self._line(now)

    def _rate(self, now: float) -> float:
        return self.done / max(now - self._start, 1e-9)

    def _line(self, now: float) -> None:
        rate, elapsed = self._rate(now), now - self._start
        when = (
            f"in {duration(elapsed)}" if self.done >= self.total else f"ETA {duration((self.total - self.done) / rate)}"
        )
        console.print(
            f"{self.label}: {self.done:,}/{self.total:,} {self.unit} ({100 * self.done // self.total}%), "
            f"{rate:,.1f} {self.unit}/s, {when}",
            soft_wrap=True,
        )
        self._said, self._last = self.done, now
