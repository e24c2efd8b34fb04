"""Issue #35, disk full: copying the tokenizer into an output (preprocess, the merges, a checkpoint) and taking an
output's lock.

shutil.copytree collects each file's error into one shutil.Error whose argument is a list: a full disk there printed
that raw list. A full disk while the lock was written left an empty lock and a message without the output's name,
and the rerun, once space was freed, was refused as "locked by another process". Now: one line naming the output and
"free space and rerun", no lock, no temporary folder, the inputs byte for byte as they were, and the rerun works. A
lock file left empty or cut short by a writer that died is not held by anyone: it is taken over.

The full disk is simulated: shutil.copyfile (which copytree calls for every file) raises ENOSPC for the tokenizer's
files; the lock is written into a file object whose writes raise ENOSPC.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch
from clitools import FAST_PRETRAIN, SAMPLE, assert_one_line_error, run_main
from conftest import tree_digest

from xlnetcli.core.errors import DiskFull, XLNetError
from xlnetcli.core.files import lock_path, output_lock

NO_SPACE = "No space left on device"


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


@pytest.fixture(scope="module")
def pipeline(builds):
    return builds.pipeline(FAST_PRETRAIN)


def full_disk_for_tokenizers(monkeypatch) -> list[str]:
    """shutil.copyfile fails as on a full disk for every file it copies into a tokenizer folder (after writing a
    few bytes); other copies go through."""
    real, failed = shutil.copyfile, []

    def copyfile(src, dst, *, follow_symlinks=True):
        if "tokenizer" in Path(dst).parent.name:
            Path(dst).write_bytes(b"\0" * 10)
            failed.append(str(dst))
            raise OSError(errno.ENOSPC, NO_SPACE, str(dst))
        return real(src, dst, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(shutil, "copyfile", copyfile)
    return failed


def refused_for_a_full_disk(capsys, root: Path, out: Path, *args) -> None:
    """``xlnet ARGS`` onto a full disk: one line naming ``out`` and the way out; nothing under ``root`` changed."""
    before = tree_digest(root)
    code, _, err = run_main(capsys, *args)
    assert_one_line_error(code, err, str(out), "free space and rerun")
    assert "[(" not in err and "Errno" not in err, err  # never shutil.Error's raw list
    assert tree_digest(root) == before  # no output, no temporary folder, no lock; the inputs as they were


@pytest.fixture
def world(pipeline, tmp_path, capsys) -> Path:
    """tmp_path holding copies of the pipeline's shards and config, a shard part and a records part of them."""
    shutil.copytree(pipeline.shards, tmp_path / "shards")
    shutil.copyfile(pipeline.records / "config.yaml", tmp_path / "c.yaml")
    shard = ["shard", SAMPLE, "--tokenizer", pipeline.tokenizer, "--quiet"]
    preprocess = ["preprocess", "--shards", tmp_path / "shards", "--config", tmp_path / "c.yaml"]
    for args in (
        [*shard, "--out", tmp_path / "sp", "--part", "0/1"],
        [*preprocess, "--out", tmp_path / "rp", "--part", "0/1"],
    ):
        code, _, err = run_main(capsys, *args)
        assert code == 0, err
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [
        ["preprocess", "--shards", "{root}/shards", "--config", "{root}/c.yaml", "--out", "{out}"],
        ["shard-merge", "{root}/sp", "--out", "{out}"],
        ["preprocess-merge", "{root}/rp", "--out", "{out}"],
    ],
    ids=["preprocess", "shard-merge", "preprocess-merge"],
)
def test_disk_full_while_copying_the_tokenizer_is_one_line(world, capsys, monkeypatch, command):
    out = world / "out"
    args = [a.format(root=world, out=out) for a in command]
    failed = full_disk_for_tokenizers(monkeypatch)
    refused_for_a_full_disk(capsys, world, out, *args)
    assert failed  # the tokenizer copy was what failed
    monkeypatch.undo()  # space freed: the same command goes through
    code, _, err = run_main(capsys, *args)
    assert code == 0, err
    assert (out / "tokenizer" / "spiece.model").is_file()


def test_disk_full_while_copying_the_tokenizer_into_a_checkpoint(pipeline, tmp_path, monkeypatch):
    from xlnetcli.checkpoint.folders import save_model_dir
    from xlnetcli.config import load_config

    cfg = load_config(None, FAST_PRETRAIN)
    state = {"w": torch.zeros(2)}
    full_disk_for_tokenizers(monkeypatch)
    with pytest.raises(DiskFull) as e:
        save_model_dir(tmp_path / "step_2", state, cfg, pipeline.tokenizer)
    assert str(e.value).count("\n") == 0 and str(tmp_path / "step_2") in str(e.value), e.value
    assert "free space and rerun" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_other_copy_errors_are_one_line_too():
    from xlnetcli.core.files import os_error_line

    err = shutil.Error([("a/x", "b/x", "[Errno 13] Permission denied: 'b/x'"), ("a/y", "b/y", "[Errno 13] ...")])
    assert os_error_line(err) == "could not copy a/x to b/x: [Errno 13] Permission denied: 'b/x' (and 1 more files)"


# ---- the lock -------------------------------------------------------------------------------------------------------


def full_disk_for_locks(monkeypatch) -> None:
    """A file object opened for writing on a lock file (or its temporary) takes no bytes: ENOSPC, as a full disk."""
    real = os.fdopen

    class Full(io.StringIO):
        def __init__(self, fd: int) -> None:
            super().__init__()
            self.fd = fd

        def write(self, s: str) -> int:
            raise OSError(errno.ENOSPC, NO_SPACE)

        def close(self) -> None:
            os.close(self.fd)
            super().close()

    def fdopen(fd, mode="r", *args, **kwargs):
        if "w" in mode and ".lock" in os.readlink(f"/proc/self/fd/{fd}"):
            return Full(fd)
        return real(fd, mode, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen)


def test_disk_full_while_taking_the_lock_leaves_no_lock(world, capsys, monkeypatch):
    out = world / "merged"
    full_disk_for_locks(monkeypatch)
    refused_for_a_full_disk(capsys, world, out, "shard-merge", world / "sp", "--out", out)
    assert not lock_path(out).exists()
    monkeypatch.undo()  # space freed: the rerun takes the lock (it was never "locked by another process")
    code, _, err = run_main(capsys, "shard-merge", world / "sp", "--out", out)
    assert code == 0, err
    assert not lock_path(out).exists()


def test_disk_full_while_taking_the_lock_as_a_library_call(tmp_path, monkeypatch):
    full_disk_for_locks(monkeypatch)
    with pytest.raises(DiskFull, match="free space and rerun") as e, output_lock(tmp_path / "o"):
        pass
    assert str(tmp_path / "o") in str(e.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"", b'{"host": "h', b"\0\0\0\0", b'{"host": "' + socket.gethostname().encode()])
def test_an_empty_or_cut_short_lock_left_by_a_crash_is_taken_over(tmp_path, content):
    """What a writer killed (or out of space) while writing its lock leaves: held by nobody. Ten seconds old here;
    a younger one gets a second's grace (it may be being written on a filesystem without hard links)."""
    out = tmp_path / "o"
    lock = lock_path(out)
    lock.write_bytes(content)
    old = time.time() - 10
    os.utime(lock, (old, old))
    with output_lock(out):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    lock.write_bytes(content)  # just written: taken over after the grace, not refused
    t0 = time.monotonic()
    with output_lock(out):
        pass
    assert time.monotonic() - t0 < 5
    assert not lock.exists()


def test_a_whole_lock_of_a_live_process_is_still_refused(tmp_path):
    out = tmp_path / "o"
    lock = lock_path(out)
    lock.write_text(json.dumps({"host": "elsewhere.example", "pid": 4242, "started": 0}))
    live = r"being written by another xlnet run \(process 4242 on elsewhere"
    with pytest.raises(XLNetError, match=live), output_lock(out):
        pass
    assert json.loads(lock.read_text())["pid"] == 4242
    lock.write_text(json.dumps({"host": 3, "pid": 4242}))  # whole JSON, not ours: named, never taken
    with pytest.raises(XLNetError, match=r"locked by another xlnet process \(.*field 'host'.*remove"), output_lock(out):
        pass
    assert json.loads(lock.read_text())["host"] == 3


def test_without_hard_links_the_lock_is_created_exclusively(tmp_path, monkeypatch):
    """A filesystem without hard links (some network and FUSE mounts): the lock is created with O_EXCL and written;
    a full disk then removes it as well."""

    def no_link(src, dst, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    out = tmp_path / "o"
    with output_lock(out):
        assert json.loads(lock_path(out).read_text())["pid"] == os.getpid()
        with pytest.raises(XLNetError, match="already being written by this process"), output_lock(out):
            pass
    assert list(tmp_path.iterdir()) == []
    full_disk_for_locks(monkeypatch)
    with pytest.raises(DiskFull, match="free space and rerun"), output_lock(out):
        pass
    assert list(tmp_path.iterdir()) == []
