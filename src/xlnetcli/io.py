"""Safe file output: nothing half-written. Write to a temporary sibling, fsync, then rename into place."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import XLNetError


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace a regular file in one rename. A symlink is followed (the link stays, its target is replaced); a
    device, fifo or socket is written through (``--output /dev/stdout``), never replaced by a file."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_file():
        if path.is_dir():
            raise XLNetError(f"{path} is a folder; pass a file path")
        with open(path, "wb") as f:  # char/block device, fifo, socket
            f.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def check_output_dir(out: str | Path, overwrite: bool = False, what: str = "results",
                     inputs: typing.Iterable[str | Path | None] = ()) -> Path:
    """Refuse an output directory that already holds files unless ``overwrite``, a symlinked one (replacing it would
    replace the link, not the folder it points to), and one that is, holds or lies inside one of ``inputs``."""
    out = Path(out)
    if out.is_symlink():
        raise XLNetError(f"output path {out} is a symbolic link; pass the folder it points to ({out.resolve()})")
    if out.exists() and not out.is_dir():
        raise XLNetError(f"output path {out} exists and is not a directory")
    check_output_not_input(out, inputs)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise XLNetError(f"output directory {out} already holds {what}; pass --overwrite to replace it")
    return out


def check_output_not_input(out: str | Path, inputs: typing.Iterable[str | Path | None]) -> None:
    """Refuse an output folder that is, contains or lies inside an input: replacing it would delete the input."""
    o = Path(out).resolve()
    for i in inputs:
        if i is None:
            continue
        p = Path(i).resolve()
        if o == p or o in p.parents or p in o.parents:
            rel = "is" if o == p else ("holds" if o in p.parents else "lies inside")
            raise XLNetError(f"output {out} {rel} the input {i}; choose an output folder apart from the inputs")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_path(out: str | Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lock"


@contextlib.contextmanager
def output_lock(out: str | Path) -> Iterator[None]:
    """One writer per output folder: ``.NAME.lock`` beside it holds the owner's host, pid and start time.

    A second process gets a one-line error naming the owner. A lock left by a process that died on this host is
    taken over; one from another host is reported (it may be alive), with the file to remove if it is not."""
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    mine = json.dumps({"host": host, "pid": os.getpid(), "started": time.time()})
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text(encoding="utf-8"))
                o_host, o_pid = str(owner["host"]), int(owner["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                # unreadable: a writer killed between create and write; anything older than a minute is stale
                with contextlib.suppress(OSError):
                    if time.time() - path.stat().st_mtime > 60:
                        path.unlink()
                        continue
                raise XLNetError(f"{out} is locked by another xlnet process ({path}); wait for it or remove the "
                                 "lock file if no xlnet process is running") from None
            if o_host == host and not _pid_alive(o_pid):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            if o_host == host and o_pid == os.getpid():
                raise XLNetError(f"{out} is already being written by this process")
            where = f"process {o_pid}" + ("" if o_host == host else f" on {o_host}")
            raise XLNetError(f"{out} is being written by another xlnet run ({where}); wait for it to finish or "
                             f"choose another output (if that run is dead, remove {path})")
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        break
    else:
        raise XLNetError(f"could not take the lock {path}; remove it if no xlnet process is running")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
                path.unlink()


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, overwrite: bool = False, what: str = "results",
                      inputs: typing.Iterable[str | Path | None] = (), lock: bool = True) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; on success it replaces ``out`` in one rename.

    On any error (including KeyboardInterrupt and a full disk) the temporary directory is removed and ``out`` is left
    as it was: a previous result is replaced only once the new one is complete. ``lock`` holds ``output_lock(out)``
    for the duration (a caller that already holds it passes False)."""
    with output_lock(out) if lock else contextlib.nullcontext():
        with _atomic_output_dir(out, overwrite, what, tuple(inputs)) as tmp:
            yield tmp


@contextlib.contextmanager
def _atomic_output_dir(out: str | Path, overwrite: bool, what: str, inputs: tuple) -> Iterator[Path]:
    out = check_output_dir(out, overwrite, what, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
