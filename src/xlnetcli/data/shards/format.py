"""The shard format (`xlnet shard` writes it, `xlnet preprocess` reads it): manifest.json and the .npy files.

    m = read_manifest("shards/")               # checked manifest.json
    verify_shards("shards/", m, workers=4)     # every file against its sha256
    for tokens, sentid in open_shards("shards/", "train"): ...     # memory maps, manifest order

Directory::

    manifest.json        format_version, tokenizer_sha256, vocab_size, dtype (uint16|uint32), seed, valid_fraction,
                         splits: {train: [entry], valid: [entry]}, inputs, bytes, invalid_utf8_bytes
                         entry = {tokens_file, sentid_file, tokens, sentences, documents, sha256: {tokens, sentid}}
    config.yaml          the resolved config (when given)
    tokenizer/           the tokenizer the shards were encoded with
    train/shard_NNNNN.tokens.npy   [n] token ids, one <eod> after each document
    train/shard_NNNNN.sentid.npy   [n] uint8 sentence ids: flip at every input line (docs/xlnet.md §2)
    valid/shard_00000.{tokens,sentid}.npy

Shard .npy files have a fixed 128-byte header (written last by ``NpyStreamWriter``). ``NpyFile`` reads and writes
any C-order .npy at element offsets with pread/pwrite (no mmap: resident memory stays bounded whatever the corpus
size); ``PassStream`` reads the shards of one split as one token stream (preprocessing), ``MappedStream`` gathers any
segments of the same stream from memory maps of the token files (records read their tokens through it).
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from xlnetcli.core.errors import DataError
from xlnetcli.core.files import sha256_file
from xlnetcli.core.shapes import describe, json_field, read_folder_json, str_map
from xlnetcli.data.parts import part_folder_hint

FORMAT_VERSION = 1
NPY_HEADER = 128  # fixed .npy header size so that shards can be streamed and the header written last


# ---------------------------------------------------------------------------------------------------------------------
# .npy files: streamed writer, pread/pwrite at offsets


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    d = f"{{'descr': {np.dtype(dtype).str!r}, 'fortran_order': False, 'shape': ({n:d},), }}"
    body = d.ljust(NPY_HEADER - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")


class NpyStreamWriter:
    """Append 1-D data to a .npy file whose length is unknown until close (the header is written last)."""

    def __init__(self, path: Path, dtype: DTypeLike) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.f = open(path, "wb", buffering=1 << 20)  # noqa: SIM115
        self.f.write(b"\0" * NPY_HEADER)

    def write(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        self.f.write(arr.data.cast("B"))
        self.n += arr.size

    def close(self) -> None:
        if self.f.closed:
            return
        self.f.flush()
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, self.n))
        self.f.close()


class NpyFile:
    """A 1-D (or C-order N-D) .npy file read or written at element offsets with pread/pwrite."""

    def __init__(self, path: str | Path, write: bool = False):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                major, _ = np.lib.format.read_magic(f)
                read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read_header(f)
                self.offset = f.tell()
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {self.path}: {e}") from None
        if fortran:
            raise DataError(f"{self.path}: Fortran-order arrays are not supported")
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape)) if self.shape else 1
        self.fd = os.open(self.path, os.O_RDWR if write else os.O_RDONLY)

    def read(self, start: int, stop: int) -> np.ndarray:
        n = max(0, stop - start)
        nbytes = n * self.dtype.itemsize
        buf = os.pread(self.fd, nbytes, self.offset + start * self.dtype.itemsize)
        if len(buf) != nbytes:
            raise DataError(f"{self.path} is truncated (expected {self.size} values)")
        return np.frombuffer(buf, dtype=self.dtype)

    def write(self, start: int, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtype).tobytes()
        off = self.offset + start * self.dtype.itemsize
        while data:
            n = os.pwrite(self.fd, data, off)
            data, off = data[n:], off + n

    def close(self) -> None:
        os.close(self.fd)


class PassStream:
    """The token stream of one pass: shard files in a given order, read as one array with pread.

    Sentence ids are flipped per file where needed so that they keep alternating across file joins (original)."""

    def __init__(self, entries: Sequence[tuple[Path, Path]], order: Sequence[int]):
        self.files = []
        lengths = []
        for k in order:
            tok, sid = NpyFile(entries[k][0]), NpyFile(entries[k][1])
            if len(tok.shape) != 1 or tok.shape != sid.shape:
                raise DataError(f"{entries[k][0]}: tokens and sentence ids differ in shape or are not 1-D")
            if tok.size == 0:
                tok.close()
                sid.close()
                continue
            self.files.append((tok, sid))
            lengths.append(tok.size)
        self.starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        self.total = int(self.starts[-1])
        # flip flags: the first id of a file must differ from the last id of the previous one
        self.flip = []
        prev = None
        for _, sid in self.files:
            first, last = int(sid.read(0, 1)[0]) & 1, int(sid.read(sid.size - 1, sid.size)[0]) & 1
            f = prev is not None and first == prev
            self.flip.append(f)
            prev = last ^ int(f)

    def read(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = max(0, a), min(self.total, b)
        if b <= a:
            return np.empty(0, self.files[0][0].dtype), np.empty(0, np.uint8)
        k0 = int(np.searchsorted(self.starts, a, "right")) - 1
        toks, sids = [], []
        k = k0
        while a < b:
            tok, sid = self.files[k]
            lo = a - int(self.starts[k])
            hi = min(b, int(self.starts[k + 1])) - int(self.starts[k])
            toks.append(tok.read(lo, hi))
            s = sid.read(lo, hi) & 1
            sids.append(s ^ 1 if self.flip[k] else s)
            a += hi - lo
            k += 1
        if len(toks) == 1:
            return toks[0], sids[0]
        return np.concatenate(toks), np.concatenate(sids)

    def read_many(self, starts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """tokens, sentence ids [k, width] of the ranges [s, s + width) (all inside the stream): one pread per file."""
        k = len(starts)
        fi = np.searchsorted(self.starts, starts, "right") - 1
        single = (starts + width <= self.starts[fi + 1]).tolist()
        isz = self.files[0][0].dtype.itemsize if self.files else 2
        tb, sb = [], []
        bases = self.starts.tolist()
        for s, f, one in zip(starts.tolist(), fi.tolist(), single, strict=True):
            if one:
                tok, sid = self.files[f]
                off = s - bases[f]
                tb.append(os.pread(tok.fd, width * isz, tok.offset + off * isz))
                sb.append(os.pread(sid.fd, width * sid.dtype.itemsize, sid.offset + off * sid.dtype.itemsize))
            else:  # crosses a file join (rare)
                t, d = self.read(s, s + width)
                tb.append(t.tobytes())
                sb.append(d.astype(self.files[f][1].dtype).tobytes())
        t = np.frombuffer(b"".join(tb), dtype=self.files[0][0].dtype) if k else np.empty(0, np.uint16)
        d = np.frombuffer(b"".join(sb), dtype=self.files[0][1].dtype) if k else np.empty(0, np.uint8)
        if t.size != k * width or d.size != k * width:
            raise DataError("a shard file is truncated; rerun `xlnet shard`")
        flip = np.asarray([*self.flip, False], bool)[fi] & np.asarray(single, bool)
        d = (d.reshape(k, width) & 1).astype(np.uint8) ^ flip[:, None].astype(np.uint8)
        return t.reshape(k, width), d

    def close(self) -> None:
        for tok, sid in self.files:
            tok.close()
            sid.close()


class MappedStream:
    """The token stream of one pass as ``PassStream`` orders it (token files in ``order``, empty ones skipped), read
    from memory maps without a copy: ``span(a, n)`` is the buffers of stream positions [a, a + n), one per file, and
    ``read_span`` appends those of any range of a span, for one ``join`` of many segments. ``maps``: the 1-D token
    arrays in manifest order (memory maps, shared by the passes that order them differently)."""

    def __init__(self, maps: Sequence[np.ndarray], order: Sequence[int]):
        kept = [maps[k] for k in order if len(maps[k])]
        self.views = [m.data for m in kept]  # memoryviews: sliced without numpy's per-view cost
        self.ends: list[int] = np.cumsum([len(m) for m in kept], dtype=np.int64).tolist()
        self.starts = [e - len(m) for e, m in zip(self.ends, kept, strict=True)]
        self.dtype = kept[0].dtype if kept else np.dtype(np.uint16)

    def span(self, a: int, n: int) -> tuple[list[int], list[memoryview]]:
        """(where each buffer starts, relative to a; the buffers) of stream positions [a, a + n) (inside the
        stream): one buffer per file they lie in."""
        cuts: list[int] = []
        parts: list[memoryview] = []
        q, k = 0, bisect.bisect_right(self.ends, a)
        while n > 0:
            lo, take = a - self.starts[k], min(n, self.ends[k] - a)
            cuts.append(q)
            parts.append(self.views[k][lo : lo + take])
            a, n, q, k = a + take, n - take, q + take, k + 1
        return cuts, parts


def read_span(out: list[Any], cuts: list[int], parts: list[memoryview], q: int, n: int) -> None:
    """Append to ``out`` the buffers of positions [q, q + n) of a span (``MappedStream.span``; q relative to its
    start): one per file crossed."""
    j = bisect.bisect_right(cuts, q) - 1
    while n > 0:
        lo = q - cuts[j]
        take = min(n, len(parts[j]) - lo)
        out.append(parts[j][lo : lo + take])
        q, n, j = q + take, n - take, j + 1


# ---------------------------------------------------------------------------------------------------------------------
# reading


def read_manifest(shard_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and check manifest.json of a shard directory (DataError if missing or corrupt)."""
    d = Path(shard_dir)
    path = d / "manifest.json"
    if d.is_dir() and not path.is_file() and (hint := part_folder_hint(d, "xlnet-shard-part")):
        raise hint
    m = read_folder_json(d, "manifest.json", "shard directory", "xlnet shard", "xlnet shard")
    if m.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: unsupported or missing format_version (expected {FORMAT_VERSION})")
    for key in ("tokenizer_sha256", "vocab_size", "dtype", "splits"):
        if key not in m:
            raise DataError(f"{path} lacks {key!r}; rerun `xlnet shard`")
    if m["dtype"] not in ("uint16", "uint32"):
        raise DataError(f"{path}: unknown dtype {m['dtype']!r}")
    splits = m["splits"]
    if not isinstance(splits, dict) or not isinstance(splits.get("train"), list):
        raise DataError(f"{path}: 'splits' must hold a 'train' list")
    splits.setdefault("valid", [])
    json_field(m, "vocab_size", int, path, lo=9, hi=2**31 - 1)
    json_field(m, "tokenizer_sha256", str, path)
    for name, entries in splits.items():
        if not isinstance(entries, list):
            raise DataError(f"{path}: splits.{name} must be a list, found {describe(entries)}")
        for i, e in enumerate(entries):
            _check_entry(e, f"{path} splits.{name}[{i}]")
    return m


def _check_entry(e: Any, where: str) -> None:
    """One shard of the manifest: its files (relative paths inside the folder), token count and checksums."""
    if not isinstance(e, dict):
        raise DataError(f"{where}: must be an object, found {describe(e)}")
    for key in ("tokens_file", "sentid_file"):
        name = json_field(e, key, str, where)
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise DataError(f"{where}: field {key!r} must be a path inside the shard folder, found {name!r}")
    json_field(e, "tokens", int, where, lo=0, hi=2**48)
    if "sha256" in e:
        str_map(e, "sha256", where)


def open_shards(shard_dir: str | os.PathLike[str], split: str = "train") -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (tokens, sentid) memory maps of every shard of ``split`` in manifest order."""
    d = Path(shard_dir)
    m = read_manifest(d)
    if split not in m["splits"]:
        raise DataError(f"{d}/manifest.json has no split {split!r}")
    for e in m["splits"][split]:
        arrs = []
        for key in ("tokens_file", "sentid_file"):
            p = d / e[key]
            try:
                arrs.append(np.load(p, mmap_mode="r"))
            except FileNotFoundError:
                raise DataError(f"shard file {p} is missing; rerun `xlnet shard`") from None
            except (ValueError, OSError) as err:
                raise DataError(f"shard file {p} is corrupt ({err}); rerun `xlnet shard`") from None
        tokens, sentid = arrs
        if tokens.shape != (e["tokens"],) or sentid.shape != tokens.shape:
            raise DataError(
                f"shard {d / e['tokens_file']} has {tokens.shape[0]} tokens, manifest says "
                f"{e['tokens']}; rerun `xlnet shard`"
            )
        yield tokens, sentid


def verify_shards(
    shard_dir: str | os.PathLike[str], manifest: dict[str, Any] | None = None, workers: int = 1
) -> dict[str, Any]:
    """Check the sha256 of every shard file against the manifest; returns the manifest (DataError on mismatch).

    Files are streamed in 1 MiB blocks; with ``workers`` > 1 several files are hashed at once (hashlib releases the
    GIL). The first corrupted file in manifest order is named.
    """
    d = Path(shard_dir)
    m = read_manifest(d) if manifest is None else manifest
    files: list[tuple[Path, str]] = []
    for entries in m["splits"].values():
        for e in entries:
            for key, kind in (("tokens_file", "tokens"), ("sentid_file", "sentid")):
                p = d / e[key]
                want = e.get("sha256", {}).get(kind) if isinstance(e.get("sha256"), dict) else None
                if not isinstance(want, str):
                    raise DataError(
                        f"{d}/manifest.json records no sha256 for {e[key]}; rerun `xlnet shard` (or pass --no-verify)"
                    )
                if not p.is_file():
                    raise DataError(f"shard file {p} is missing; rerun `xlnet shard`")
                files.append((p, want))

    def check(item: tuple[Path, str]) -> None:
        p, want = item
        if sha256_file(p) != want:
            raise DataError(f"{p} does not match manifest.json (sha256 differs): corrupted; rerun `xlnet shard`")

    if workers > 1 and len(files) > 1:
        with ThreadPoolExecutor(min(workers, len(files))) as ex:
            for _ in ex.map(check, files):
                pass
    else:
        for item in files:
            check(item)
    return m


def check_shards(
    shard_dir: str | os.PathLike[str], vocab_size: int, verify: bool = True, workers: int = 1
) -> tuple[dict[str, Any], str]:
    """(manifest, tokenizer sha256) of a shard directory about to be read, checked against its own tokenizer/ and the
    vocabulary the reader expects; ``verify`` checks every file's sha256 too (a flipped byte is refused, naming the
    file, instead of being trained on)."""
    shards = Path(shard_dir)
    manifest = read_manifest(shards)
    spm_path = shards / "tokenizer" / "spiece.model"
    if not spm_path.is_file():
        raise DataError(f"{shards}: tokenizer/spiece.model is missing; rerun `xlnet shard`")
    sha = sha256_file(spm_path)
    if manifest.get("tokenizer_sha256") != sha:
        raise DataError(
            f"{shards}: the shards were made with another tokenizer (manifest sha256 "
            f"{str(manifest.get('tokenizer_sha256'))[:12]}…, tokenizer/ {sha[:12]}…); rerun `xlnet shard`"
        )
    vocab = int(manifest.get("vocab_size", -1))
    if vocab != vocab_size:
        raise DataError(
            f"{shards}: shards use a {vocab}-piece tokenizer but model.vocab_size is {vocab_size}; pass "
            f"--set model.vocab_size={vocab} (tokenizer.vocab_size follows), or re-shard with a tokenizer of "
            f"{vocab_size} pieces"
        )
    if verify:
        verify_shards(shards, manifest, workers=workers)
    return manifest, sha


def split_files(
    shard_dir: str | os.PathLike[str], manifest: dict[str, Any], split: str
) -> tuple[list[tuple[str, str]], int]:
    """([(tokens file, sentid file)] in manifest order, total tokens) of a split; DataError if a file is missing."""
    shards = Path(shard_dir)
    entries = manifest["splits"].get(split) or []
    paths = [(str(shards / e["tokens_file"]), str(shards / e["sentid_file"])) for e in entries]
    for a, b in paths:
        if not Path(a).is_file() or not Path(b).is_file():
            raise DataError(f"shard file missing: {a if not Path(a).is_file() else b}; rerun `xlnet shard`")
    return paths, sum(int(e["tokens"]) for e in entries)


__all__ = [
    "FORMAT_VERSION",
    "NPY_HEADER",
    "MappedStream",
    "NpyFile",
    "NpyStreamWriter",
    "PassStream",
    "check_shards",
    "open_shards",
    "read_manifest",
    "read_span",
    "split_files",
    "verify_shards",
]
