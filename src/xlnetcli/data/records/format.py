"""The records format (`xlnet preprocess` writes it, pretrain_stream.py reads it): meta.json and one set of .npy
files per pass that reference the shards: per example only what preprocessing decided (|A|, where B starts, the
label, the target bits); the tokens are read from the memory-mapped shards when a batch is built.

    meta, passes = open_records("records/", "train")     # one PassRecords per pass, checksums verified
    ids, masked, alen = passes[0].examples(rows, step)    # [B, L] token ids, [B, L] targets, [B] |A| of any rows

Records directory::

    meta.json            every parameter (format_version, seq_len, reuse_len, num_predict, mask settings, batch
                         layout, ...), a sha256 per records file, and the shards the records read:
                         shards = {path (relative to this folder), absolute, manifest_sha256};
                         splits.NAME = {rows, forward_rows, row_len, steps_per_pass, files (one prefix per pass),
                         shards: [{file, tokens, sha256}] (the split's token files in manifest order),
                         orders: one permutation of those per pass (the pass's token stream), ...}
    config.yaml          the resolved config (data.mask_mode and data.passes as used)
    tokenizer/           copy of the shards' tokenizer
    train/pass_000.alen.npy     [G, S]    uint16          |A|  (segment ids follow: see ``segment_ids``)
    train/pass_000.bstart.npy   [G, S]    uint32|uint64   row position where B starts
    train/pass_000.label.npy    [G, S]    uint8           1 = B is A's true continuation (stored, never used)
    train/pass_000.masked.npy   [G, S, ceil(L/8)] uint8   packed bits (little endian): selected for prediction
    valid/...

An example is ``[inp | A | <sep> | B | <sep> | <cls>]`` (docs/xlnet.md §3). A pass's token stream is the split's
token files concatenated in the pass's order, cut into ``forward_rows`` rows of ``row_len`` tokens; stored row g
reads forward row f (``row_sources``), forward or time-reversed (bi_data). Example (g, s) is, in row positions
(i = s * reuse_len, la = |A|): ``row[i : i + R + la]``, <sep>, ``row[bstart : bstart + L - R - 3 - la]``, <sep>,
<cls> (segments.split_block). That is about 7 + L/8 bytes per example, under one byte per corpus token per pass
(the tokens themselves were 2-4 bytes x L per example, about 4 copies of the corpus). Nothing L x L is stored: the
factorisation order is sampled online by pretrain_stream.py each time an example is read.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xlnetcli.core.errors import DataError
from xlnetcli.core.files import sha256_file
from xlnetcli.core.shapes import describe, fix_hint, json_field, read_json_object, str_map
from xlnetcli.data.parts import part_folder_hint
from xlnetcli.data.shards.format import MappedStream, NpyFile, read_span
from xlnetcli.data.special import CLS_ID, SEP_ID

FORMAT_VERSION = 2  # 1: the tokens were copied into the records ([G, S, L] per pass)
ARRAYS = ("alen", "bstart", "label", "masked")  # the files of one pass: {prefix}.{name}.npy
_RERUN = "re-run `xlnet preprocess`"


# ----------------------------------------------------------------------------------------------------------------
# Layout: a stored row g is (forward row f, reversed?) by ``row_source`` under the records' micro_batch_size; a
# reader with another micro-batch size (or number of processes) finds its rows with ``stored_rows``.


def bstart_dtype(row_len: int) -> np.dtype:
    """uint32 for B's row position, uint64 for rows of 2**32 tokens or more."""
    return np.dtype(np.uint32 if row_len <= 2**32 else np.uint64)


def row_source(g: int, bi_data: bool, mb: int) -> tuple[int, bool]:
    """(forward row index, reversed?) of stored row g. bi_data: blocks of mb = [mb/2 forward ; same reversed]."""
    if not bi_data:
        return g, False
    half = mb // 2
    block, k = divmod(g, mb)
    return block * half + (k % half), k >= half


def row_sources(rows: np.ndarray, bi_data: bool, mb: int) -> tuple[np.ndarray, np.ndarray]:
    """``row_source`` of an int array of stored rows: (forward rows, reversed?)."""
    rows = np.asarray(rows, np.int64)
    if not bi_data:
        return rows, np.zeros(rows.shape, bool)
    half = mb // 2
    block, k = rows // mb, rows % mb
    return block * half + k % half, k >= half


def stored_rows(rows: Any, bi_data: bool, mb: int, mb_records: int) -> np.ndarray:
    """int64: the stored rows of reading rows ``rows`` of a reader whose micro-batches hold ``mb`` rows: reading row
    g' is (f, rev) = ``row_source(g', bi_data, mb)``, stored where ``row_source`` under the records' micro-batch size
    ``mb_records`` put (f, rev). The identity without bi_data or when ``mb == mb_records``."""
    rows = np.asarray(rows, dtype=np.int64)
    if not bi_data:
        return rows
    f, rev = row_sources(rows, bi_data, mb)
    half_rec = mb_records // 2  # row_sources' inverse under the records' micro-batch size
    return f // half_rec * mb_records + f % half_rec + rev * half_rec


def segment_ids(alen: np.ndarray, seq_len: int, reuse_len: int) -> np.ndarray:
    """int64 [..., L]: 0 for the reuse part, A and the first <sep>; 1 for B and the second <sep>; 2 for <cls>."""
    pos = np.arange(seq_len)
    a = np.asarray(alen, dtype=np.int64)[..., None]
    return (pos >= reuse_len + a + 1).astype(np.int64) + (pos >= seq_len - 1)


# ----------------------------------------------------------------------------------------------------------------
# Writing


def create_npy(path: Path, shape: tuple[int, ...], dtype: Any) -> None:
    """An .npy file of the given shape, zero-filled (sparse on disk until written)."""
    m = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    del m


def create_pass(prefix: str | Path, rows: int, steps: int, seq_len: int, row_len: int) -> None:
    """The four zero-filled files of one pass (``prefix`` = split/pass_NNN), filled later by ``PassWriter``s."""
    create_npy(Path(f"{prefix}.alen.npy"), (rows, steps), np.uint16)
    create_npy(Path(f"{prefix}.bstart.npy"), (rows, steps), bstart_dtype(row_len))
    create_npy(Path(f"{prefix}.label.npy"), (rows, steps), np.uint8)
    create_npy(Path(f"{prefix}.masked.npy"), (rows, steps, (seq_len + 7) // 8), np.uint8)


class PassWriter:
    """Writes blocks of examples into the files of one pass with pwrite (workers write disjoint rows in parallel)."""

    def __init__(self, prefix: str | Path, steps: int, seq_len: int):
        self.steps, self.seq_len, self.nb = steps, seq_len, (seq_len + 7) // 8
        self.files = {name: NpyFile(f"{prefix}.{name}.npy", write=True) for name in ARRAYS}

    def write(
        self, row: int, s0: int, alen: np.ndarray, bstart: np.ndarray, label: np.ndarray, masked: np.ndarray
    ) -> None:
        """Examples s0, s0+1, ... of ``row``: alen [n], bstart [n], label [n], masked [n, L] bool."""
        at = row * self.steps + s0
        self.files["alen"].write(at, alen)
        self.files["bstart"].write(at, bstart)
        self.files["label"].write(at, label)
        self.files["masked"].write(at * self.nb, np.packbits(masked, axis=1, bitorder="little"))

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()


def checksums(records_dir: Path) -> dict[str, str]:
    """meta.json's ``sha256``: one checksum per records file, so a file damaged on disk is refused, not trained on."""
    return {f.relative_to(records_dir).as_posix(): sha256_file(f) for f in sorted(records_dir.glob("*/pass_*.npy"))}


def shards_location(shards: str | Path, records_dir: str | Path) -> dict[str, str]:
    """meta.json's ``shards`` path and absolute: where records written to ``records_dir`` find ``shards`` (the
    relative path first, so that records and shards moved together still find each other)."""
    where = Path(shards).resolve()
    return {"path": os.path.relpath(where, Path(records_dir).resolve()), "absolute": str(where)}


def split_shards(manifest: dict[str, Any], split: str, read: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """meta.json's ``splits.NAME.shards``: the split's token files in manifest order, with their sha256: the
    manifest's (verified against the files), or with ``read`` (`--no-verify`: {file: sha256 of its bytes as the
    records were made from them}) those, so that the records check what they were built from."""
    out = []
    for e in manifest["splits"].get(split) or []:
        sha = e.get("sha256")
        entry = {"file": e["tokens_file"], "tokens": int(e["tokens"])}
        if read is not None:
            entry["sha256"] = read[e["tokens_file"]]
        elif isinstance(sha, dict) and isinstance(sha.get("tokens"), str):
            entry["sha256"] = sha["tokens"]
        out.append(entry)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Reading


def read_meta(records_dir: str | Path) -> dict:
    """A records folder's meta.json (how it was preprocessed), or a one-line DataError."""
    if not Path(records_dir).is_dir():
        raise DataError(f"records folder {records_dir} does not exist; create it with xlnet preprocess")
    path = Path(records_dir) / "meta.json"
    if not path.is_file():
        raise part_folder_hint(Path(records_dir), "xlnet-records-part") or DataError(
            f"{records_dir} is not a records directory (no meta.json); run `xlnet preprocess` first"
        )
    meta = read_json_object(path, DataError, _RERUN)
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        old = isinstance(version, int) and not isinstance(version, bool) and 0 < version < FORMAT_VERSION
        raise DataError(
            f"{path}: records format {version}, this version reads format {FORMAT_VERSION}"
            + (" (records that reference the shards instead of copying their tokens)" if old else "")
            + f"; {_RERUN} on the shards (shards and checkpoints stay readable)"
        )
    with fix_hint(_RERUN):
        check_meta_shape(meta, path)
        _check_listed(meta, path)
    return meta


def _check_listed(meta: dict, path: Path) -> None:
    """meta.json's checksums cover every records file of every split: a meta.json without them would be read with
    no check at all (a step folder in the same state is refused too)."""
    if not meta.get("sha256"):
        raise DataError(f"{path} lists no checksums (field 'sha256'), so the records files cannot be checked")
    for name, split in meta["splits"].items():
        for prefix in split["files"]:
            for array in ARRAYS:
                if f"{prefix}.{array}.npy" not in meta["sha256"]:
                    raise DataError(f"{path}: field 'sha256' has no checksum for {prefix}.{array}.npy (split {name})")


def check_meta_shape(meta: dict, path: str | Path) -> None:
    """Every field a reader uses, of its kind and in range: one line naming the file and the field otherwise (a
    records part's plan.meta too, which has no checksums yet)."""
    for key in ("seq_len", "reuse_len", "num_predict", "global_batch_size", "micro_batch_size", "vocab_size"):
        json_field(meta, key, int, path, lo=0 if key == "reuse_len" else 1, hi=2**31 - 1)
    passes = json_field(meta, "passes", int, path, lo=1, default=1)
    json_field(meta, "bi_data", bool, path)
    if json_field(meta, "dtype", str, path) not in ("uint16", "uint32"):
        raise DataError(f"{path}: field 'dtype' must be uint16 or uint32, found {describe(meta['dtype'])}")
    shards = json_field(meta, "shards", dict, path)
    for key in ("path", "absolute", "manifest_sha256"):
        json_field(shards, key, str, f"{path} shards")
    splits = json_field(meta, "splits", dict, path)
    for name, split in splits.items():
        where = f"{path} splits.{name}"
        if not isinstance(split, dict):
            raise DataError(f"{where}: must be an object, found {describe(split)}")
        for key in ("rows", "steps_per_pass"):
            json_field(split, key, int, where, lo=0, hi=2**40)
        for key in ("forward_rows", "row_len"):
            json_field(split, key, int, where, lo=1, hi=2**62)
        files = json_field(split, "files", list, where)
        if not all(isinstance(f, str) and _inside(f) for f in files):
            raise DataError(f"{where}: field 'files' must list relative paths inside the records folder")
        entries = json_field(split, "shards", list, where)
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise DataError(f"{where} shards[{i}]: must be an object, found {describe(e)}")
            if not _inside(json_field(e, "file", str, f"{where} shards[{i}]")):
                raise DataError(f"{where} shards[{i}]: field 'file' must be a path inside the shard folder")
            json_field(e, "tokens", int, f"{where} shards[{i}]", lo=0, hi=2**48)
            json_field(e, "sha256", str, f"{where} shards[{i}]", default=None)
        orders = json_field(split, "orders", list, where)
        if len(orders) != len(files) or len(files) != passes or not all(_is_order(o, len(entries)) for o in orders):
            raise DataError(f"{where}: field 'orders' must hold one order of the split's shards per pass")
    if "sha256" in meta:
        str_map(meta, "sha256", path)


def _is_order(order: Any, n: int) -> bool:
    """A permutation of 0..n-1 (JSON integers)."""
    return isinstance(order, list) and all(type(k) is int for k in order) and sorted(order) == list(range(n))


def _inside(name: str) -> bool:
    return ".." not in Path(name).parts and not Path(name).is_absolute()


def check_shapes(arrays: list[np.ndarray], split: dict, meta: dict, prefix: Path) -> None:
    """The arrays of one pass against meta.json's counts: [rows, steps] alen and so on."""
    rows, steps, seq_len = split["rows"], split["steps_per_pass"], meta["seq_len"]
    want: dict[str, tuple[int, ...]] = {"alen": (rows, steps), "bstart": (rows, steps), "label": (rows, steps)}
    want["masked"] = (rows, steps, (seq_len + 7) // 8)
    for name, arr in zip(ARRAYS, arrays, strict=True):
        if tuple(arr.shape) != want[name] or arr.dtype.kind != "u":
            raise DataError(
                f"records file {prefix}.{name}.npy has shape {list(arr.shape)} ({arr.dtype}) but meta.json's counts "
                f"say {list(want[name])} (unsigned); {_RERUN}"
            )


@dataclass
class PassRecords:
    """One pass of a split: the stored decisions [G, S] and the pass's token stream in the shards."""

    alen: np.ndarray  # [G, S] memmap
    bstart: np.ndarray  # [G, S]
    label: np.ndarray  # [G, S]
    masked: np.ndarray  # [G, S, ceil(L/8)] packed bits
    stream: MappedStream  # the shards in this pass's order
    seq_len: int
    reuse_len: int
    row_len: int
    bi_data: bool
    micro_batch_size: int  # the bi_data block

    def __post_init__(self) -> None:
        self._rows: dict[bytes, Any] = {}  # rows -> their layout: a stream asks the same few micro-batches
        dt = self.stream.dtype
        self._sep, self._tail, self._liat = (
            np.array(x, dt).tobytes() for x in ([SEP_ID], [SEP_ID, CLS_ID], [CLS_ID, SEP_ID])
        )

    def _layout(self, rows: np.ndarray) -> tuple[list[tuple[Any, tuple[list[int], list[memoryview]], bool]], Any, Any]:
        """For stored rows ``rows``: [(the row's buffer when it lies in one shard file else None, its buffers
        (MappedStream.span), time-reversed?)], how to index them (a slice when contiguous) and the batch rows to flip
        back (None, a slice or indices). Kept by rows: a stream asks the same ones at every step."""
        key = rows.tobytes()
        hit = self._rows.get(key)
        if hit is None:
            f, rev = row_sources(rows, self.bi_data, self.micro_batch_size)
            spans = [self.stream.span(base, self.row_len) for base in (f * self.row_len).tolist()]
            src = [(s[1][0] if len(s[1]) == 1 else None, s, r) for s, r in zip(spans, rev.tolist(), strict=True)]
            at: Any = rows
            if len(rows) and (np.diff(rows) == 1).all():
                at = slice(int(rows[0]), int(rows[0]) + len(rows))
            flip: Any = np.flatnonzero(rev)
            if not len(flip):
                flip = None
            elif (np.diff(flip) == 1).all():
                flip = slice(int(flip[0]), int(flip[-1]) + 1)
            if len(self._rows) >= 4096:
                self._rows.clear()
            hit = self._rows[key] = (src, at, flip)
        return hit

    def examples(self, rows: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(token ids [B, L] in the shards' dtype, masked [B, L] bool, alen [B]) of stored rows ``rows`` (any int
        array) at ``step``. Each example is two segments of its row, ``row[i : i + R + la]`` and ``row[bstart :
        bstart + L - R - 3 - la]`` (i = step * R): slices of the shards' memory maps joined, with the <sep>, <sep>
        <cls> between them, in one copy. A time-reversed row is assembled mirrored ([<cls> <sep> | B | <sep> | A],
        each segment in stream order) and flipped whole."""
        rows = np.asarray(rows, np.int64)
        L, R, rl = self.seq_len, self.reuse_len, self.row_len
        src, at, flip = self._layout(rows)
        alen = self.alen[at, step]
        i, lb = step * R, L - R - 3
        sep, tail, liat = self._sep, self._tail, self._liat
        # A is row[i : i + R + la], B row[b0 : b0 + lb - la]; row position p is the row's stream position p forward,
        # rl - 1 - p reversed (whose mirrored row reads the same stream ranges up: row[rl - end : rl - start])
        iR, e0, e1, c = i + R, rl - i - R, rl - i, rl - lb
        pieces: list[Any] = []
        put = pieces.extend
        for (row, span, rev), la, b0 in zip(src, alen.tolist(), self.bstart[at, step].tolist(), strict=True):
            if row is None:  # the row spans shard files: each segment from the file(s) it lies in
                cuts, parts = span
                segs = (
                    ((c - b0 + la, lb - la, liat, sep), (e0 - la, R + la, b"", b""))
                    if rev
                    else ((i, R + la, b"", sep), (b0, lb - la, b"", tail))
                )
                for q, n, before, after in segs:
                    j = bisect.bisect_right(cuts, q) - 1
                    pieces.append(before)
                    if q + n <= cuts[j] + len(parts[j]):
                        pieces.append(parts[j][q - cuts[j] : q - cuts[j] + n])
                    else:
                        read_span(pieces, cuts, parts, q, n)
                    pieces.append(after)
            elif rev:
                put((liat, row[c - b0 + la : rl - b0], sep, row[e0 - la : e1]))
            else:
                put((row[i : iR + la], sep, row[b0 : b0 + lb - la], tail))
        ids = np.frombuffer(bytearray().join(pieces), self.stream.dtype).reshape(len(rows), L)
        if flip is not None:
            ids[flip] = ids[flip, ::-1]
        masked = np.unpackbits(self.masked[at, step], axis=-1, count=L, bitorder="little").view(bool)
        return ids, masked, alen


_VERIFIED: set[tuple[str, int, int, str]] = set()


def _verify(p: Path, want: str | None, message: str) -> None:
    """``p`` against its recorded sha256, once per process per (file, size, mtime) (evaluation reopens a split)."""
    if want is None or not p.is_file():
        return
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, want)
    if key not in _VERIFIED:
        if sha256_file(p) != want:
            raise DataError(message)
        _VERIFIED.add(key)


def find_shards(records_dir: Path, meta: dict) -> Path:
    """The shard folder the records read: next to them by the relative path (moved together), else at the absolute
    path, the first whose manifest.json is the one recorded; refused in one line when neither holds a manifest.json,
    or when the manifest.json found changed."""
    ref = meta["shards"]
    near, far = records_dir / ref["path"], Path(ref["absolute"])
    found = [d for d in (near, far) if (d / "manifest.json").is_file()]
    if not found:
        raise DataError(
            f"the shards of the records {records_dir} are neither at {near} (relative to the records) nor at {far}; "
            f"put them back there, or {_RERUN} on the shards where they are now"
        )
    for d in found:
        if sha256_file(d / "manifest.json") == ref["manifest_sha256"]:
            return d
    raise DataError(
        f"{found[0] / 'manifest.json'} changed since the records {records_dir} were made (sha256 differs from "
        f"meta.json): the shards were rewritten; {_RERUN}"
    )


def check_tokenizer_copy(folder: Path, want: Any, record: Path, shards: Path | None, what: str = "records") -> None:
    """The tokenizer copy of records or a records part (``folder``/tokenizer/spiece.model) is the one the shards were
    encoded with: its sha256 is ``want`` (meta.json's or part.json's ``tokenizer_sha256``, the file ``record``) and,
    when ``shards`` is given, the shards' own tokenizer/spiece.model's. A copy swapped for another tokenizer would be
    carried into every checkpoint, whose embeddings never saw its pieces; refused in one line naming both files."""
    mine = folder / "tokenizer" / "spiece.model"
    theirs = Path(os.path.normpath(shards / "tokenizer" / "spiece.model")) if shards else None  # no rec/../shards
    have = sha256_file(mine) if mine.is_file() else None
    ref = sha256_file(theirs) if theirs is not None and theirs.is_file() else None
    if have is not None and have == want and ref in (None, want):
        return
    redo = "rerun `xlnet preprocess`" if what == "records" else "rerun that part"
    made = f"the {what} {folder} {'were' if what == 'records' else 'was'} made with"
    if have is None:
        source = f" (a copy of {theirs})" if ref == want else ""
        raise DataError(f"{mine} is missing: the {what} {folder} lost its tokenizer copy; restore it{source} or {redo}")
    if have == want:  # ref differs: the shards' tokenizer was replaced after the records were made
        raise DataError(
            f"the shards' tokenizer {theirs} (sha256 {str(ref)[:12]}) is not {mine} ({have[:12]}), the one {made}: "
            f"the shards' copy was replaced; restore it, or rerun `xlnet shard` and {redo}"
        )
    if ref == want:
        raise DataError(
            f"{mine} (sha256 {have[:12]}) is not the shards' tokenizer {theirs} ({want[:12]}) {made}: the copy was "
            f"replaced; copy {theirs} over it, or {redo}"
        )
    also = f", nor is the shards' {theirs} ({str(ref)[:12]})" if ref is not None else ""
    raise DataError(
        f"{mine} (sha256 {have[:12]}) is not the tokenizer {made} ({record} says {str(want)[:12]}){also}; {redo} "
        "with the shards' tokenizer"
    )


def _open_shard_files(shards: Path, records_dir: Path, entries: list[dict], verify: bool, dtype: str) -> list:
    """Memory maps of the split's token files (manifest order), each as long as meta.json says and, with ``verify``,
    matching its sha256."""
    out = []
    for e in entries:
        p = shards / e["file"]
        changed = f"shard file {p} changed since the records {records_dir} were made"
        if not p.is_file():
            raise DataError(f"shard file {p} (read by the records {records_dir}) is missing; restore it or {_RERUN}")
        if verify:
            _verify(p, e.get("sha256"), f"{changed} (sha256 differs from meta.json); {_RERUN}")
        try:
            arr = np.asarray(np.load(p, mmap_mode="r")) if e["tokens"] else np.empty(0, dtype)
        except (OSError, ValueError) as err:
            raise DataError(f"{changed}: it cannot be read ({err}); {_RERUN}") from None
        if arr.shape != (e["tokens"],) or arr.dtype != np.dtype(dtype):
            raise DataError(
                f"{changed} ({list(arr.shape)} {arr.dtype}, meta.json says [{e['tokens']}] {dtype}); {_RERUN}"
            )
        out.append(arr)
    return out


def open_records(records_dir: str | Path, split: str = "train", verify: bool = True) -> tuple[dict, list[PassRecords]]:
    """(meta, one PassRecords per pass) for a split; ``verify`` checks each records file, and each shard file the
    split reads, against the sha256 in meta.json (the shards' manifest.json is always checked)."""
    records_dir = Path(records_dir)
    meta = read_meta(records_dir)
    if split not in meta["splits"]:
        raise DataError(f"{records_dir} has no {split!r} split (has: {', '.join(meta['splits']) or 'none'})")
    info = meta["splits"][split]
    digests = meta.get("sha256") or {}
    arrays_of = []
    for prefix in info["files"]:
        arrays = []
        for name in ARRAYS:
            p = records_dir / f"{prefix}.{name}.npy"
            if verify:
                _verify(
                    p,
                    digests.get(f"{prefix}.{name}.npy"),
                    f"records file {p} does not match the checksum in meta.json (damaged on disk); {_RERUN}",
                )
            try:
                arrays.append(np.asarray(np.load(p, mmap_mode="r")))
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read records file {p}: {e}; {_RERUN}") from None
        check_shapes(arrays, info, meta, records_dir / prefix)
        arrays_of.append(arrays)
    shards = find_shards(records_dir, meta)
    maps = _open_shard_files(shards, records_dir, info["shards"], verify, meta["dtype"])
    if sum(len(m) for m in maps) < info["forward_rows"] * info["row_len"]:
        raise DataError(f"the shards in {shards} hold fewer tokens than the records {records_dir} read; {_RERUN}")
    out = [
        PassRecords(
            alen=arrays[0],
            bstart=arrays[1],
            label=arrays[2],
            masked=arrays[3],
            stream=MappedStream(maps, order),
            seq_len=meta["seq_len"],
            reuse_len=meta["reuse_len"],
            row_len=info["row_len"],
            bi_data=meta["bi_data"],
            micro_batch_size=meta["micro_batch_size"],
        )
        for arrays, order in zip(arrays_of, info["orders"], strict=True)
    ]
    return meta, out
