"""Corpora in object storage and at URLs: fsspec paths (s3://, gs://, az://, https://, hf://, memory://, ...) as
inputs of `xlnet tokenize train` and `xlnet shard` (the `remote` extra: fsspec, and aiohttp for http(s)).

A URL names a file, a "directory" (listed recursively, as a local folder is) or a glob (fsspec's glob). Files are
streamed: HTTP as one response read block by block, object stores through their filesystem's read-ahead buffer (one
block per open file), so memory stays bounded whatever the file's size and nothing is written to disk. Credentials
come from the usual environment of each filesystem (AWS_* and ~/.aws for s3fs, Application Default Credentials for
gcsfs, AZURE_STORAGE_* for adlfs, HF_TOKEN for huggingface_hub); xlnetcli adds none of its own.

Every failure of a remote read (404, refused connection, a stream that ends before its Content-Length, a missing
credential) becomes one DataError naming the URL.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xlnetcli.core.errors import DataError, XLNetError

# The package each protocol's fsspec implementation needs (fsspec alone serves memory:// and a few others).
PROTOCOL_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "adl": "adlfs",
    "hf": "huggingface_hub",
    "http": "aiohttp",
    "https": "aiohttp",
}
HTTP_CONNECT_TIMEOUT = 60  # seconds to connect
HTTP_READ_TIMEOUT = 300  # seconds without a byte before a streamed HTTP read fails (no limit on the whole response)
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def url_protocol(s: str) -> str | None:
    """The protocol of a URL-like input ("s3" for s3://bucket/key); None for a local path (file:// included)."""
    m = _URL.match(s)
    return None if m is None or m.group(1).lower() in ("file", "local") else m.group(1).lower()


@dataclass(frozen=True)
class RemoteFile:
    """One file at a URL: what data/corpus/reader.py reads in place of a local Path."""

    url: str  # as shown in messages and recorded in manifests
    path: str = field(compare=False)  # the filesystem's own path (no protocol for most)
    fs: Any = field(compare=False, repr=False)
    size: int | None = field(default=None, compare=False)  # None when the server does not say

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]

    @property
    def key(self) -> str:
        """The same for two spellings of one file (de-duplicating inputs)."""
        return str(self.fs.unstrip_protocol(self.path))

    def is_dir(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.url

    def open(self) -> RemoteStream:
        kw: dict[str, Any] = {}
        if _is_http(self.fs):
            kw = {"block_size": 0}  # one streamed response, not a range request per block
            if self.size:
                kw["size"] = self.size  # no second HEAD request
        try:
            return RemoteStream(self.fs.open(self.path, "rb", **kw), self.url)
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own types (aiohttp, botocore, ...)
            raise remote_error(self.url, e) from None


class RemoteStream:
    """A remote file object whose every failure is one DataError naming the URL."""

    def __init__(self, f: Any, url: str) -> None:
        self._f, self.url = f, url

    def read(self, n: int = -1) -> bytes:
        try:
            return bytes(self._f.read(n))
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own types (aiohttp, botocore, ...)
            raise remote_error(self.url, e) from None

    def tell(self) -> int:
        return int(self._f.tell())

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a failed stream may fail again: the read already said why
            self._f.close()

    def __enter__(self) -> RemoteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remote_error(url: str, e: BaseException) -> DataError:
    """One line for a failed remote operation: not found, access denied, or the filesystem's own words."""
    cause = e.__cause__ if isinstance(e, FileNotFoundError) and e.__cause__ is not None else e
    status = getattr(cause, "status", None)  # aiohttp.ClientResponseError
    if isinstance(cause, FileNotFoundError) or status == 404:
        return DataError(f"input {url} does not exist" + (" (HTTP 404)" if status == 404 else ""))
    if isinstance(cause, PermissionError) or status in (401, 403):
        return DataError(f"cannot read {url}: access denied; check the credentials in the environment")
    msg = " ".join(str(cause).split())[:300] or "the stream ended early"
    return DataError(f"cannot read {url}: {type(cause).__name__}: {msg}")


def _is_http(fs: Any) -> bool:
    return any(p in ("http", "https") for p in _protocols(fs))


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _fsspec() -> Any:
    try:
        import fsspec  # noqa: PLC0415 - optional (the `remote` extra)
    except ImportError:
        raise XLNetError("reading URLs needs the fsspec package: pip install 'xlnetcli[remote]'") from None
    return fsspec


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, its path) for a URL; one line naming the package when the protocol's is missing."""
    fsspec = _fsspec()
    protocol = url_protocol(url) or "file"
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise DataError(f"unknown protocol {protocol}:// in {url} (fsspec has no filesystem for it)") from None
    except ImportError:
        pkg = PROTOCOL_PACKAGES.get(protocol)
        what = f"the {pkg} package: pip install {pkg}" if pkg else "a package fsspec names"
        raise XLNetError(f"reading {protocol}:// URLs needs {what}") from None
    options: dict[str, Any] = {}
    if protocol in ("http", "https"):
        import aiohttp  # noqa: PLC0415 - optional (the `remote` extra); present: fsspec's http loaded above

        # aiohttp's default limits the whole response to 5 minutes: a large file streams longer than that
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=HTTP_CONNECT_TIMEOUT, sock_read=HTTP_READ_TIMEOUT)
        options["client_kwargs"] = {"timeout": timeout}
    try:
        return fsspec.core.url_to_fs(url, **options)
    except Exception as e:  # noqa: BLE001 - filesystems fail at creation in their own types (bad options, credentials)
        raise remote_error(url, e) from None


def _has_magic(path: str, http: bool) -> bool:
    return any(c in path for c in "*[") or (not http and "?" in path)  # "?" starts an HTTP query string


def expand_url(url: str, is_corpus_name: Callable[[str], bool]) -> tuple[str, list[RemoteFile]]:
    """(kind, files) for a URL, files sorted: "file" (the file itself), "glob" (fsspec glob's matches) or "directory"
    (its files whose name passes ``is_corpus_name``, recursively, hidden ones left out). HTTP(S) URLs ending in "/"
    are directories (the server's index page lists them); other HTTP URLs are files."""
    fs, path = filesystem(url)
    http = _is_http(fs)
    try:
        if _has_magic(path, http):
            magic = re.search(r"[*?\[]", path)
            fixed = path[: magic.start() if magic else len(path)].rsplit("/", 1)[0] + "/"
            found = sorted(fs.glob(path, detail=True).items())
            # as Python's glob: files only, none with a hidden part below the pattern's fixed folder
            return "glob", [_file(fs, p, i) for p, i in found if i.get("type") != "directory" and _shown(p, fixed)]
        info: dict[str, Any] = {"type": "directory"} if http and path.endswith("/") else fs.info(path)
        if info.get("type") != "directory":
            return "file", [RemoteFile(url, path, fs, info.get("size"))]
        root = path.rstrip("/") + "/"
        found = sorted(fs.find(path, detail=True).items())
        keep = [(p, i) for p, i in found if i.get("type") != "directory" and is_corpus_name(p.rsplit("/", 1)[-1])]
        return "directory", [_file(fs, p, i) for p, i in keep if _shown(p, root)]
    except XLNetError:
        raise
    except Exception as e:  # noqa: BLE001 - each filesystem raises its own types (aiohttp, botocore, ...)
        raise remote_error(url, e) from None


def _shown(path: str, root: str) -> bool:
    """No part of ``path`` below ``root`` is hidden (starts with a dot)."""
    rel = path[len(root) :] if path.startswith(root) else path.rsplit("/", 1)[-1]
    return not any(part.startswith(".") for part in rel.split("/"))


def _file(fs: Any, path: str, info: dict) -> RemoteFile:
    return RemoteFile(str(fs.unstrip_protocol(path)), path, fs, info.get("size"))
