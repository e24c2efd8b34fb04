"""core/files.py: output locks of dead writers are taken over, special files are written through, stale temporary
folders of dead writers are removed (and only theirs), SIGTERM cleans up as Ctrl-C does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from xlnetcli.core.errors import Terminated, XLNetError
from xlnetcli.core.files import (
    atomic_output_dir,
    atomic_write_json,
    lock_path,
    output_lock,
    remove_stale_temps,
)
from xlnetcli.core.signals import sigterm_as_interrupt

# ---- one writer per output -----------------------------------------------------------------------------------


def test_a_lock_left_by_a_dead_process_is_taken_over_and_released(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "o"
    lock_path(out).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "started": 0}))
    with output_lock(out):
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
        with pytest.raises(XLNetError, match="already being written by this process"), output_lock(out):
            pass
    assert not lock_path(out).exists()
    # a lock from another host may belong to a live run: refused, naming the file to remove
    lock_path(out).write_text(json.dumps({"host": "elsewhere.example", "pid": 1}))
    with pytest.raises(XLNetError, match=r"on elsewhere\.example.*remove"), output_lock(out):
        pass


# ---- special files are written through, never replaced (atomic_write_json) ---------------------------------------


def test_special_file_targets_are_written_through_and_symlinks_followed(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    atomic_write_json(fifo, {"a": 1})
    assert json.loads(reader.communicate(timeout=30)[0]) == {"a": 1}
    assert fifo.is_fifo()
    target = tmp_path / "real.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_json(link, {"b": 2})
    assert link.is_symlink() and json.loads(target.read_text()) == {"b": 2}
    with pytest.raises(XLNetError, match="is a folder"):
        atomic_write_json(tmp_path, {})


# ---- temporary folders and signals ---------------------------------------------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_remove_stale_temps_only_touches_dead_writers_of_this_host(tmp_path):
    out = tmp_path / "shards"
    host = socket.gethostname()
    dead = tmp_path / f".shards.xlnet-{host}-{_dead_pid()}-abc123_z.tmp"
    live = tmp_path / f".shards.xlnet-{host}-{os.getpid()}-k2j4h5g6.tmp"
    other_host = tmp_path / f".shards.xlnet-{host}x-{_dead_pid()}-q1w2e3r4.tmp"
    other_out = tmp_path / f".shards2.xlnet-{host}-{_dead_pid()}-abcdefgh.tmp"
    not_ours = tmp_path / ".shards.backup.tmp"
    for d in (dead, live, other_host, other_out, not_ours):
        (d / "train").mkdir(parents=True)
        (d / "train" / "x.npy").write_bytes(b"x" * 100)
    assert remove_stale_temps(out) == [dead]
    assert not dead.exists()
    for d in (live, other_host, other_out, not_ours):
        assert d.is_dir(), d
    with atomic_output_dir(out) as tmp:  # our own name: host and pid inside
        assert tmp.name.startswith(f".shards.xlnet-{host}-{os.getpid()}-") and tmp.name.endswith(".tmp")
        (tmp / "f").write_text("x")
    assert (out / "f").is_file()


def test_sigterm_as_interrupt_in_process(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(Terminated), sigterm_as_interrupt(), atomic_output_dir(out) as tmp:
        (tmp / "part").write_text("x")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert not out.exists() and not list(tmp_path.iterdir())
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
