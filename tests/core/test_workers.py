"""ordered_map (core/workers.py): results in input order whoever computes them, a helper's error raised here, a dead
helper named in one line, and no helper left behind however the iteration ends (the shard SIGTERM hang)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from clitools import child_pids, wait_gone

from xlnetcli.core.errors import XLNetError
from xlnetcli.core.workers import ordered_map

BIG = 300_000  # bytes per item: several times a pipe's buffer, as shard's 256 KiB chunks are


def _slow_square(x: int) -> tuple[int, int, str]:
    time.sleep(random.random() * 0.01)
    return x * x, os.getpid(), "y" * BIG


def _here(x: int) -> tuple[int, int, str]:
    return x * x, os.getpid(), "y" * BIG


def _children() -> list[int]:
    return child_pids(os.getpid())


@pytest.fixture
def others():
    """Children this process had before the test (a test of another module in the same pytest worker may leave a
    long-lived one, e.g. torch.compile's pool): the assertions below count only the helpers a test made."""
    return set(_children())


@pytest.mark.parametrize("helpers", [0, 1, 3])
def test_results_come_in_input_order_from_helpers_and_this_process(helpers):
    before = set(_children())
    out = list(ordered_map(_slow_square, ("x" * BIG and i for i in range(60)), helpers=helpers, local=_here))
    assert [r[0] for r in out] == [i * i for i in range(60)]
    pids = {r[1] for r in out}
    assert os.getpid() in pids or helpers > 0
    if helpers:
        assert len(pids - {os.getpid()}) >= 1  # the helpers did work
    assert set(_children()) <= before  # none left behind


def _fails_at_7(x: int) -> int:
    if x == 7:
        raise ValueError(f"bad item {x}")
    return x


def test_an_error_in_a_helper_is_raised_here_with_its_type(others):
    with pytest.raises(ValueError, match="bad item 7"):
        list(ordered_map(_fails_at_7, range(40), helpers=2, local=lambda x: x if x != 7 else _fails_at_7(x)))
    time.sleep(0.1)
    assert set(_children()) <= others


def _dies(x: int) -> int:
    os._exit(3)


def test_a_helper_that_dies_is_a_one_line_error(others):
    with pytest.raises(XLNetError, match=r"a helper process died \(exit code 3\)"):
        list(ordered_map(_dies, range(40), helpers=1, local=lambda x: time.sleep(0.05) or x))
    assert set(_children()) <= others


_INIT: list[int] = []


def _init(v: int) -> None:
    _INIT.append(v)


def _read_init(x: int) -> int:
    return _INIT[0] + x


def test_the_initializer_runs_in_each_helper_only():
    out = list(
        ordered_map(_read_init, range(30), helpers=2, local=lambda x: 100 + x, initializer=_init, initargs=(100,))
    )
    assert out == [100 + x for x in range(30)]
    assert _INIT == []  # not in this process


def test_leaving_early_at_random_points_never_hangs_and_leaves_no_helper(others):
    """The consumer stops (break, an exception) at random points while items larger than a pipe are in flight in
    both directions: every helper is gone at once (what multiprocessing.Pool.terminate could not promise)."""
    rng = random.Random(0)
    for _ in range(25):
        stop_at = rng.randrange(0, 30)
        t0 = time.time()
        gen = ordered_map(_slow_square, range(100), helpers=2, local=_here)
        for i, _r in enumerate(gen):
            if i == stop_at:
                break
        gen.close()
        assert time.time() - t0 < 30
        assert set(_children()) <= others


def test_sigterm_mid_stream_unwinds_and_kills_the_helpers(tmp_path):
    """A process mapping under sigterm_as_interrupt, sent SIGTERM while items are in flight: exits promptly through
    its cleanup, and its helpers die with it."""
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            from xlnetcli.core.errors import Terminated
            from xlnetcli.core.signals import sigterm_as_interrupt
            from xlnetcli.core.workers import ordered_map

            def work(x):
                return "z" * 300_000

            def here(x):
                time.sleep(0.001)
                return "z" * 300_000

            try:
                with sigterm_as_interrupt():
                    for i, _ in enumerate(ordered_map(work, iter(int, 1), helpers=2, local=here)):
                        if i == 50:
                            print("running", flush=True)
            except Terminated:
                print("cleaned", flush=True)
                sys.exit(143)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for delay in (0.0, 0.05, 0.3):
        p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "running"
        time.sleep(delay)
        kids = child_pids(p.pid)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 143
        assert p.stdout.read().strip() == "cleaned"
        wait_gone(kids)
