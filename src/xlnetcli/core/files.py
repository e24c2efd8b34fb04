"""Safe file output: nothing half-written. Write to a temporary sibling, fsync, then rename into place.

Temporary files and folders are created private (tempfile's 0600/0700) and given the umask's usual modes (0666 and
0777 without the umask's bits) before they are renamed into place, so outputs are shared as any other tool's.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # pragma: no cover - not on POSIX
    resource = None  # type: ignore[assignment]

from xlnetcli.core.errors import DiskFull, XLNetError
from xlnetcli.core.shapes import dumps_strict, json_field
from xlnetcli.core.signals import pid_alive

# Temporary output folders are named .<out>.xlnet-<host>-<pid>-<random>.tmp, so that a later run can tell the ones
# whose writer is dead (killed: SIGKILL, OOM, power) from those of a live one, and remove only the former.
TEMP_TAG = "xlnet"
_TEMP_RE = re.compile(rf"\.{TEMP_TAG}-(?P<host>.+)-(?P<pid>\d+)-[a-z0-9_]+\.tmp$")


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
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status", encoding="ascii") as f:
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
    if resource is None:  # pragma: no cover - not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard == resource.RLIM_INFINITY or needed <= hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))
            return
    raise XLNetError(
        f"{what} needs {needed} open files at once but the limit is {soft} (hard {hard}, see "
        "`ulimit -n`); use fewer or raise the limit"
    )


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace a regular file in one rename. A symlink is followed (the link stays, its target is replaced); a
    device, fifo or socket is written through (``--output /dev/stdout``), never replaced by a file. A full disk is
    DiskFull: the temporary file is removed and the file as it was is left."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_file():
        if path.is_dir():
            raise XLNetError(f"{path} is a folder; pass a file path")
        with disk_full_as_error(path), open(path, "wb") as f:  # char/block device, fifo, socket
            f.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = mkstemp_shared(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with disk_full_as_error(path):
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
    """Strict JSON: a NaN or infinite number (a metric without a value) is written as null."""
    atomic_write_text(path, dumps_strict(obj, indent=2, sort_keys=False) + "\n")


def check_output_dir(
    out: str | Path, overwrite: bool = False, what: str = "results", inputs: typing.Iterable[str | Path | None] = ()
) -> Path:
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


def check_output_not_input(
    out: str | Path, inputs: typing.Iterable[str | Path | None], what: str = "folder", option: str = "output"
) -> None:
    """Refuse an output that is, holds or lies inside an input, also through symbolic links (real paths compared) and
    hard links (the same file, or a file inside an input folder): writing it would replace or delete the input.
    Every input stands with what it reads through its manifest (``inputs_behind``: the shards of records or of a
    records part), so that an output never replaces the files behind an input either. ``what`` ("folder" or "file")
    and ``option`` (how the output was given) word the message."""
    o = Path(os.path.realpath(out))
    for i in inputs:
        if i is None:
            continue
        for path, name in [(Path(i), f"the input {i}"), *inputs_behind(i)]:
            p = Path(os.path.realpath(path))
            if o == p or _same_file(o, p):
                rel = "is"
            elif o in p.parents:
                rel = "holds"
            elif p in o.parents:
                rel = "lies inside"
            elif _hard_link_into(o, p):
                rel = "is a hard link to a file of"
            else:
                continue
            apart = "the inputs" if path == Path(i) else "the inputs and the files they read"
            raise XLNetError(f"{option} {out} {rel} {name}; choose an output {what} apart from {apart}")


def inputs_behind(i: str | Path) -> list[tuple[Path, str]]:
    """What the input folder ``i`` reads through its manifest, as (folder, how a message names it): records
    (meta.json) and a records part (part.json) read the shard folder their ``shards`` entry names, relative to them
    or absolute (both, where they exist: the reader takes the first whose manifest matches). Read leniently, before
    any reader checks the file: a file that cannot be read adds nothing (its reader refuses it later)."""
    i = Path(i)
    seen = {os.path.realpath(i)}
    found: list[tuple[Path, str]] = []
    for name in ("meta.json", "part.json"):
        try:
            if not (i / name).is_file() or (i / name).stat().st_size > 1 << 26:
                continue
            obj = json.loads((i / name).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if name == "part.json":  # a part's plan holds the meta.json its merge writes
            obj = obj.get("plan") if isinstance(obj, dict) else None
            obj = obj.get("meta") if isinstance(obj, dict) else None
        shards = obj.get("shards") if isinstance(obj, dict) else None
        if not isinstance(shards, dict):
            continue
        for where in (shards.get("path"), shards.get("absolute")):
            d = i / where if isinstance(where, str) and where else None
            if d is not None and os.path.lexists(d) and os.path.realpath(d) not in seen:
                seen.add(os.path.realpath(d))
                found.append((d, f"the shards {os.path.normpath(d)} read by the input {i}"))
    return found


def check_file_outputs(outputs: dict[str, str | Path | None], inputs: typing.Iterable[str | Path | None]) -> None:
    """File outputs ({option: path}, None: not asked for), before any work: none a folder, none an input
    (check_output_not_input) and no two the same file."""
    inputs = list(inputs)
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        if Path(path).is_dir():
            raise XLNetError(f"{option} {path} is a folder; pass a file path")
        check_output_not_input(path, inputs, "file", option)
        real = os.path.realpath(path)
        if real in seen:
            raise XLNetError(f"{seen[real]} and {option} name the same file {path}; give each its own")
        seen[real] = option


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist
        return False


def _hard_link_into(out: Path, folder: Path) -> bool:
    """Whether the existing file ``out`` has another name inside the input ``folder``."""
    try:
        st = out.stat()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2 or not folder.is_dir():
        return False
    for f in folder.rglob("*"):
        with contextlib.suppress(OSError):
            s = f.lstat()
            if (s.st_ino, s.st_dev) == (st.st_ino, st.st_dev):
                return True
    return False


def lock_path(out: str | Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.lock"


def remove_stale_temps(out: str | Path) -> list[Path]:
    """Remove temporary folders of ``out`` left by killed writers on this host; returns those removed.

    Only our own naming is touched: .<out>.xlnet-<host>-<pid>-<random>.tmp whose host is this one and whose pid is not
    running (a live writer's folder is kept).
    """
    out = Path(out)
    host = socket.gethostname()
    removed: list[Path] = []
    if not out.parent.is_dir():
        return removed
    for p in out.parent.glob(glob.escape(f".{out.name}.") + "*.tmp"):
        rest = p.name[len(out.name) + 1 :]
        m = _TEMP_RE.fullmatch(rest)
        stale = m is not None and m["host"] == host and not pid_alive(int(m["pid"]))
        if stale and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV)
_LOCK_GRACE_S = 1.0  # a lock file not yet readable this young may be being written (filesystems without hard links)


def _create_lock(path: Path, content: str, out: Path) -> bool:
    """Create the lock file ``path`` holding ``content`` whole, or not at all: written to a temporary file beside it,
    then hard-linked into place (which fails when ``path`` exists). False when ``path`` exists. A full disk is
    DiskFull naming ``out``, and leaves no lock behind (a lock left empty would refuse the rerun)."""
    fd, tmp = mkstemp_shared(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(content)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in _NO_HARD_LINKS:
                    raise
            try:  # no hard links here: create exclusively and write; a reader waits _LOCK_GRACE_S for the content
                lock_fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:
                return False
            try:
                with os.fdopen(lock_fd, "w", encoding="utf-8") as f:
                    f.write(content)
            except BaseException:
                with contextlib.suppress(OSError):
                    path.unlink()
                raise
            return True
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise DiskFull(f"disk full while taking the lock of {out} ({path}); free space and rerun") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _lock_owner(path: Path) -> dict[str, Any] | None:
    """The owner recorded in an existing lock file; None when it holds no JSON (empty or cut short: its writer died
    before writing it whole, or is writing it right now on a filesystem without hard links)."""
    try:
        text = path.read_text(encoding="utf-8")
        owner = json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(owner, dict):
        raise XLNetError(f"{path}: not a JSON object")
    return owner


@contextlib.contextmanager
def output_lock(out: str | Path) -> Iterator[None]:
    """One writer per output folder: ``.NAME.lock`` beside it holds the owner's host, pid and start time.

    A second process gets a one-line error naming the owner. A lock left by a process that died on this host is
    taken over; one from another host is reported (it may be alive), with the file to remove if it is not. The lock
    appears whole (written beside it, then linked into place): an empty or cut-short lock file is the leftover of a
    writer that died (or ran out of space) while taking it, and is taken over."""
    out = Path(out)
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    mine = json.dumps({"host": host, "pid": os.getpid(), "started": time.time()})
    deadline = time.monotonic() + _LOCK_GRACE_S + 1
    while True:
        if _create_lock(path, mine, out):
            break
        try:
            owner = _lock_owner(path)
            if owner is not None:
                o_host: str = json_field(owner, "host", str, path, XLNetError)
                o_pid: int = json_field(owner, "pid", int, path, XLNetError, lo=1, hi=2**31 - 1)
        except XLNetError as e:  # whole JSON, but not a lock this version writes: someone's, left alone
            raise XLNetError(
                f"{out} is locked by another xlnet process ({e}); wait for it or remove {path} if no xlnet process "
                "is running"
            ) from None
        if owner is None:
            with contextlib.suppress(OSError):
                young = time.time() - path.stat().st_mtime < _LOCK_GRACE_S
                if young and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                path.unlink()  # left by a writer that died before writing it whole
            if time.monotonic() < deadline:
                continue
            raise XLNetError(f"could not take the lock {path} of {out}; remove it if no xlnet process is running")
        if o_host == host and not pid_alive(o_pid):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            if time.monotonic() < deadline:
                continue
            raise XLNetError(f"could not take the lock {path} of {out}; remove it if no xlnet process is running")
        if o_host == host and o_pid == os.getpid():
            raise XLNetError(f"{out} is already being written by this process") from None
        where = f"process {o_pid}" + ("" if o_host == host else f" on {o_host}")
        raise XLNetError(
            f"{out} is being written by another xlnet run ({where}); wait for it to finish or "
            f"choose another output (if that run is dead, remove {path})"
        ) from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
                path.unlink()


@contextlib.contextmanager
def atomic_output_dir(
    out: str | Path,
    overwrite: bool = False,
    what: str = "results",
    inputs: typing.Iterable[str | Path | None] = (),
    lock: bool = True,
) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; on success it replaces ``out`` in one rename.

    On any error (including KeyboardInterrupt and a full disk) the temporary directory is removed and ``out`` is left
    as it was: a previous result is replaced only once the new one is complete. ``lock`` holds ``output_lock(out)``
    for the duration (a caller that already holds it passes False). Temporary folders of ``out`` left by killed runs
    are removed first (remove_stale_temps)."""
    with (
        output_lock(out) if lock else contextlib.nullcontext(),
        _atomic_output_dir(out, overwrite, what, tuple(inputs)) as tmp,
    ):
        yield tmp


@contextlib.contextmanager
def _atomic_output_dir(out: str | Path, overwrite: bool, what: str, inputs: tuple) -> Iterator[Path]:
    out = check_output_dir(out, overwrite, what, inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    tmp = Path(
        mkdtemp_shared(
            prefix=f".{out.name}.{TEMP_TAG}-{socket.gethostname()}-{os.getpid()}-", suffix=".tmp", dir=out.parent
        )
    )
    try:
        with disk_full_as_error(out):
            yield tmp
            share_modes(tmp)
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


_FULL_CODES = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = re.compile(rf"\[Errno ({'|'.join(str(c) for c in _FULL_CODES)})\]")


def copy_errors(exc: BaseException) -> list[tuple[str, str, str]]:
    """The (source, destination, reason) of each file shutil.copytree could not copy (it raises them all at once,
    as a list in its one argument); [] for any other exception."""
    if not isinstance(exc, shutil.Error):
        return []
    found = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
    return [tuple(str(x) for x in e) for e in found if isinstance(e, tuple) and len(e) == 3]  # type: ignore[misc]


def is_disk_full(exc: BaseException) -> bool:
    """A full disk or quota: ENOSPC/EDQUOT, or a copytree that failed on one (shutil.Error lists each file's error
    as text)."""
    if isinstance(exc, shutil.Error):
        return any(_FULL_TEXT.search(why) for _, _, why in copy_errors(exc))
    return isinstance(exc, DiskFull) or (isinstance(exc, OSError) and exc.errno in _FULL_CODES)


def os_error_line(exc: OSError) -> str:
    """One line for an OSError the tool did not foresee: its reason and file; for shutil.Error (a copytree that
    failed) the first file it could not copy, and how many more, never its raw list."""
    errors = copy_errors(exc)
    if errors:
        src, dst, why = errors[0]
        more = f" (and {len(errors) - 1} more files)" if len(errors) > 1 else ""
        return f"could not copy {src} to {dst}: {why}{more}"
    return f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"


@contextlib.contextmanager
def disk_full_as_error(out: str | Path) -> Iterator[None]:
    """A full disk (or quota) while writing ``out`` becomes DiskFull, one line naming ``out`` (the caller removes its
    partial output). Nested writers raise the outermost output's message."""
    existed = Path(out).exists()
    try:
        yield
    except (OSError, DiskFull) as e:
        if not is_disk_full(e):
            raise
        earlier = "; the earlier one is untouched" if existed else ""
        raise DiskFull(
            f"disk full while writing {out} (the partial output was removed{earlier}); free space and rerun"
        ) from None


# safetensors reports an I/O failure as SafetensorError("Error while serializing: IoError(Os { code: 28, ...")
_SAFETENSORS_OS_ERROR = re.compile(r"Os \{ code: (\d+)")


def save_safetensors(tensors: dict[str, Any], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' save_file, its I/O failures raised as OSError (errno, path): a full disk is then the one-line
    disk-full message (disk_full_as_error, the CLI) instead of a SafetensorError traceback."""
    from safetensors import SafetensorError  # noqa: PLC0415 - heavy (torch): only where tensors are written
    from safetensors.torch import save_file  # noqa: PLC0415

    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        m = _SAFETENSORS_OS_ERROR.search(str(e))
        code = int(m.group(1)) if m else errno.ENOSPC if "No space left" in str(e) else None
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from None
