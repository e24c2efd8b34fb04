"""Safe file output: nothing half-written. Write to a temporary sibling, fsync, then rename into place."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
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
    path = Path(path)
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


def check_output_dir(out: str | Path, overwrite: bool = False, what: str = "results") -> Path:
    """Refuse an output directory that already holds files unless ``overwrite``."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise XLNetError(f"output path {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise XLNetError(f"output directory {out} already holds {what}; pass --overwrite to replace it")
    return out


@contextlib.contextmanager
def atomic_output_dir(out: str | Path, overwrite: bool = False, what: str = "results") -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; on success it replaces ``out`` in one rename.

    On any error (including KeyboardInterrupt and a full disk) the temporary directory is removed and ``out`` is left
    as it was.
    """
    out = check_output_dir(out, overwrite, what)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        commit_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def commit_dir(tmp: Path, out: Path) -> None:
    """Make the finished folder ``tmp`` (a sibling of ``out``) become ``out``: fsync its files, then rename. A previous
    ``out`` is moved aside first and removed only once the new one is in place."""
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


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
