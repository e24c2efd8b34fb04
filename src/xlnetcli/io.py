"""Safe file output: nothing half-written. Write to a temporary sibling, fsync, then rename into place.

Temporary files and folders are created private (tempfile's 0600/0700) and given the umask's usual modes (0666 and
0777 without the umask's bits) before they are renamed into place, so outputs are shared as any other tool's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
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


def umask() -> int:
    """The process umask, read without changing it where Linux exposes it (threads may create files meanwhile)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def mkstemp_shared(**kwargs: Any) -> tuple[int, str]:
    """tempfile.mkstemp, with the mode an ordinary open() would give (0666 & ~umask) instead of 0600."""
    fd, name = tempfile.mkstemp(**kwargs)
    os.fchmod(fd, 0o666 & ~umask())
    return fd, name


def mkdtemp_shared(**kwargs: Any) -> str:
    """tempfile.mkdtemp, with the mode an ordinary mkdir would give (0777 & ~umask) instead of 0700."""
    name = tempfile.mkdtemp(**kwargs)
    os.chmod(name, 0o777 & ~umask())
    return name


def share_modes(root: Path) -> None:
    """Give every file and folder under ``root`` the mode open()/mkdir would under the umask: some writers (tempfile,
    safetensors) create 0600 files, which would keep a run from the rest of a team."""
    mask = umask()
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        want = (0o777 if stat.S_ISDIR(st.st_mode) or mode & 0o111 else 0o666) & ~mask
        if mode != want:
            os.chmod(p, want)


def ensure_open_files(needed: int, what: str) -> None:
    """Make room for ``needed`` open files: raise the soft limit up to the hard one (as torchrun users would with
    `ulimit -n`), or refuse in one line before any work."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard == resource.RLIM_INFINITY or needed <= hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))
            return
    raise XLNetError(f"{what} needs {needed} open files at once but the limit is {soft} (hard {hard}, see "
                     "`ulimit -n`); use fewer or raise the limit")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = mkstemp_shared(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
    tmp = Path(mkdtemp_shared(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        share_modes(tmp)
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
