"""Preemption: SIGTERM (what schedulers send before they kill) turned into a request to stop after the current
optimizer step, agreed by every rank."""

from __future__ import annotations

import signal
import threading
from typing import Any

import torch

from xlnetcli.core import dist
from xlnetcli.core.signals import interrupts
from xlnetcli.train.step_figures import HostCopy


class PreemptionGuard:
    """Turns SIGTERM into a request to stop after the current optimizer step (on every rank once any rank got it)."""

    def __init__(self) -> None:
        self.flag = False
        self._old: Any = None
        self._posted: HostCopy | None = None  # requested_late: the last step's reduced flags, on their way

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum: int, frame: Any) -> None:
        self.flag = True

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            # after a stop was requested the process leaves with its checkpoint (exit 75): a further SIGTERM (schedulers
            # and users repeat theirs) is the same request, and must not kill it with 143 on the way out (a handler
            # of the caller's own is given back). Under the start-up's handler (signals.sigterm_as_interrupt: the
            # training's start is interruptible, train/pretrain.py) the loop has ended either way: the last
            # checkpoint is written and what is left (the closing lines, finetuning's commit) is short, so a SIGTERM
            # is ignored until the call returns rather than cutting the wrap-up in the middle.
            if interrupts(self._old):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                return
            kill = self._old in (signal.SIG_DFL, None)
            signal.signal(signal.SIGTERM, signal.SIG_IGN if self.flag and kill else self._old)

    def requested(self, device: torch.device) -> bool:
        """Whether any rank got SIGTERM, agreed now (one collective and a read per step when distributed)."""
        return dist.any_rank(self.flag, device)

    def requested_late(self, device: torch.device) -> bool:
        """The same agreement a step late (the engine's deferred check): this step's flags are reduced on the device
        and read at the next call, so no step waits for one; every rank reads the same step's answer."""
        if not dist.in_group():
            return self.flag
        agreed = dist.all_reduce_max(torch.full((1,), float(self.flag), device=device))
        previous, self._posted = self._posted, HostCopy(agreed)
        return previous is not None and previous.read()[0] > 0
