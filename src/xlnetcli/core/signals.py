"""Processes and signals: SIGTERM unwinding like Ctrl-C, whether a pid is alive, and helper processes that stop with
their parent."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from xlnetcli.core.errors import Preempted, Terminated

_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal this process gets when its parent dies


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated (a KeyboardInterrupt): cleanup runs as it does on Ctrl-C.

    A second SIGTERM during that cleanup is ignored. Outside the main thread (signals cannot be set) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    handler.interrupts = True  # type: ignore[attr-defined]  # preemption.PreemptionGuard: not the caller's own
    old = signal.signal(signal.SIGTERM, handler)
    stopping = False
    try:
        yield
    except Preempted:
        stopping = True
        raise
    finally:
        # a training stopped by SIGTERM is on its way out with its checkpoint (exit 75): a repeated SIGTERM must not
        # cut that short with 143, so with the default handler under us it stays ignored (errors.Preempted)
        signal.signal(signal.SIGTERM, signal.SIG_IGN if stopping and old in (signal.SIG_DFL, None) else old)


@contextlib.contextmanager
def sigterm_stops(message: str) -> Iterator[None]:
    """``sigterm_as_interrupt`` for a training's start: SIGTERM unwinds the block (its cleanup and the lock's release
    run) and leaves as a preemption does, ``Preempted(message)`` (exit 75: requeue); the engine's PreemptionGuard
    takes SIGTERM over while it trains."""
    with sigterm_as_interrupt():
        try:
            yield
        except Terminated:
            raise Preempted(message) from None


def interrupts(handler: Any) -> bool:
    """Whether ``handler`` is ``sigterm_as_interrupt``'s (SIGTERM raises Terminated), not a caller's own."""
    return bool(getattr(handler, "interrupts", False))


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True
    return True


def die_with_parent(parent: int) -> None:
    """End this worker as soon as its parent dies (SIGKILL, OOM), quietly: no BrokenPipeError traceback later."""
    try:  # Linux: the kernel sends SIGTERM (default action: exit) when the parent dies
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            raise OSError
    except (OSError, AttributeError):  # elsewhere: a watcher thread

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(0.2)
            os._exit(0)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # died before the above took effect
        os._exit(0)


def quiet_pool_worker(parent: int | None) -> None:
    """Signals in a helper process (core/workers.py): the parent handles Ctrl-C / SIGTERM (cleanup) and kills its
    helpers, so the helper ignores SIGINT, dies on SIGTERM without a traceback and, given the ``parent`` pid, dies with
    it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if parent is not None:
        die_with_parent(parent)


__all__ = ["die_with_parent", "interrupts", "pid_alive", "quiet_pool_worker", "sigterm_as_interrupt", "sigterm_stops"]
