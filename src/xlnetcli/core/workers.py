"""Work items mapped in order over helper processes and this one: what `shard` and `tokenize train` encode with.

    for result in ordered_map(work, items, helpers=1, initializer=setup, initargs=(model,), local=encode_here):
        ...                                  # results in the order of ``items``, whoever computed them

Each helper is a forked process with two pipes of its own (items in, results out); on both sides a thread receives
messages as they arrive, so neither side ever waits long on the other's full pipe. Nothing is shared between
processes but those pipes: stopping (an error, Ctrl-C, SIGTERM, the consumer leaving early) is kill + wait, with no
lock or handler thread to join. (With ``multiprocessing.Pool``, whose ``terminate`` joins threads that may wait on
pipes and locks its killed workers held, `xlnet shard --workers 2` once did not exit within 60 s of a SIGTERM in CI.)
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from xlnetcli.core.errors import XLNetError
from xlnetcli.core.signals import quiet_pool_worker

_STOP = object()


def _helper_main(
    items: Any, results: Any, work: Callable, initializer: Callable | None, initargs: tuple, parent: int
) -> None:
    """A helper's life: set up, then compute each item its pipe brings and send back ("ok", result) or ("err", e)."""
    quiet_pool_worker(parent)
    if initializer is not None:
        initializer(*initargs)
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        try:
            while True:
                inbox.put(items.recv())
        except (EOFError, OSError):  # the parent closed the pipe (done) or died
            inbox.put(_STOP)

    threading.Thread(target=read, daemon=True).start()
    while (item := inbox.get()) is not _STOP:
        try:
            out: tuple = ("ok", work(item))
        except Exception as e:  # noqa: BLE001 - handed to the parent, which raises it
            out = ("err", e)
        try:
            results.send(out)
        except (BrokenPipeError, OSError):
            break
        except Exception as e:  # noqa: BLE001 - an exception that does not pickle: its text instead
            results.send(("err", RuntimeError(f"{type(e).__name__}: {e}")))
    os._exit(0)


class _Helper:
    """One helper process, the parent's ends of its pipes, and a thread here that receives its results as they come
    (so the helper never waits on a full pipe while this process computes an item itself)."""

    def __init__(self, ctx: Any, work: Callable, initializer: Callable | None, initargs: tuple) -> None:
        items_r, self.items = ctx.Pipe(duplex=False)
        self.results, results_w = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=_helper_main,
            args=(items_r, results_w, work, initializer, initargs, os.getpid()),
            daemon=True,
            name="xlnet-helper",
        )
        self._ends = (items_r, results_w)
        self.sent = self.received = 0
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("ok", result) | ("err", exception) | ("dead", None)
        self.receiver = threading.Thread(target=self._receive, daemon=True, name="xlnet-helper-results")

    def start(self) -> None:
        self.proc.start()
        for end in self._ends:  # the helper's ends, closed here: a dead helper then reads as EOF
            end.close()

    def _receive(self) -> None:
        try:
            while True:
                message = self.results.recv()
                self.received += 1
                self.inbox.put(message)
        except (EOFError, OSError):
            self.inbox.put(("dead", None))

    @property
    def holding(self) -> int:
        """Items sent whose result has not come back."""
        return self.sent - self.received

    def take(self, block: bool) -> tuple[bool, Any]:
        """(True, the next result), or (False, None) when it has not come and ``block`` is false."""
        try:
            status, value = self.inbox.get(block=block)
        except queue.Empty:
            return False, None
        if status == "dead":
            self.proc.join(timeout=1)
            raise XLNetError(
                f"a helper process died (exit code {self.proc.exitcode}); out of memory? retry with fewer --workers"
            )
        if status == "err":
            raise value
        return True, value

    def stop(self) -> None:
        """Kill the helper and wait for it (its death ends the receiving thread); close the pipes."""
        if self.proc.pid is not None:  # started
            self.proc.kill()
            self.proc.join()
        if self.receiver.is_alive():
            self.receiver.join(timeout=5)
        for end in (*self._ends, self.items, self.results):
            end.close()


def ordered_map(
    work: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    helpers: int,
    local: Callable[[Any], Any] | None = None,
    initializer: Callable | None = None,
    initargs: tuple = (),
    ahead: int = 2,
) -> Iterator[Any]:
    """``work(item)`` for every item, yielded in input order, computed by ``helpers`` forked processes and this one.

    A helper holds at most ``ahead`` items (one running, the next ready); when every helper is full this process
    computes the item itself with ``local`` (default ``work``), so N helpers + 1 = N + 1 busy processes. At most
    ``4 * (helpers + 1) + 4`` items are read ahead of the one yielded: memory stays a few items whatever the input.
    ``initializer(*initargs)`` runs once in each helper (set up what ``work`` reads). An exception raised by ``work``
    in a helper is raised here; the helpers are killed whenever the iteration ends, normally or not."""
    local = work if local is None else local
    if helpers < 1:
        yield from map(local, items)
        return
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pool: list[_Helper] = []
    try:
        for _ in range(helpers):
            pool.append(_Helper(ctx, work, initializer, initargs))
            pool[-1].start()
        for h in pool:  # threads once every fork is done: a child never starts with a thread's lock held
            h.receiver.start()
        pending: collections.deque = collections.deque()  # ("here", result) or ("helper", h), in input order
        window = 4 * (helpers + 1) + 4
        turn = 0
        for item in items:
            free = [h for h in pool if h.holding < ahead]
            if free:
                h = free[turn % len(free)]
                turn += 1
                h.items.send(item)
                h.sent += 1
                pending.append(("helper", h))
            else:
                pending.append(("here", local(item)))
            yield from _ready(pending, block=len(pending) >= window)
        while pending:
            yield from _ready(pending, block=True)
    finally:
        for h in pool:
            h.stop()


def _ready(pending: collections.deque, block: bool) -> Iterator[Any]:
    """The results at the head of ``pending`` that are available (``block``: wait for the first one)."""
    while pending:
        where, value = pending[0]
        if where == "helper":
            came, value = value.take(block)
            if not came:
                return
        pending.popleft()
        yield value
        block = False


__all__ = ["ordered_map"]
