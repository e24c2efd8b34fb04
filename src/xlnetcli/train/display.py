"""What a run shows on the terminal: the progress bar over optimizer steps, and its printed lines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xlnetcli.core.console import console, progress_is_live, step_progress


def printer(enabled: bool) -> Callable[..., None]:
    """console.print, one unwrapped line per message (rank 0, not quiet); a no-op otherwise."""
    if not enabled:
        return lambda *a, **k: None
    return lambda *a, **k: console.print(*a, soft_wrap=True, **k)


class StepBar:
    """The progress bar over optimizer steps (nothing when quiet or not rank 0). ``live``: it is drawn (stderr is a
    terminal); when it is not, each train row is also printed as one plain line."""

    def __init__(self, label: str, total: int, done: int, quiet: bool) -> None:
        self.live = progress_is_live(quiet)
        self._progress = step_progress(quiet=quiet)
        self._label, self._total, self._done = label, total, done
        self._bar: Any = None

    def __enter__(self) -> StepBar:
        self._progress.__enter__()
        self._bar = self._progress.add_task(self._label, total=self._total, completed=self._done, info="")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def update(self, step: int, info: str | None = None) -> None:
        if info is None:
            self._progress.update(self._bar, completed=step)
        else:
            self._progress.update(self._bar, completed=step, info=info)
