"""The records format (`xlnet preprocess` writes it, pretrain_stream.py reads it): meta.json and one set of .npy
files per pass.

    meta, passes = open_records("records/", "train")    # one PassRecords of memmaps per pass, checksums verified
    passes[0].tokens[g, s]                               # [L] token ids of row g at step s

Records directory::

    meta.json            every parameter (format_version, seq_len, reuse_len, num_predict, mask settings, batch
                         layout, ...), splits, steps per pass, file names, a sha256 per records file
    config.yaml          the resolved config (data.mask_mode and data.passes as used)
    tokenizer/           copy of the shards' tokenizer
    train/pass_000.tokens.npy   [G, S, L] uint16|uint32  token ids of row g at step s (bi_data: ``row_source``)
    train/pass_000.alen.npy     [G, S]    uint16         |A|  (segment ids follow: see ``segment_ids``)
    train/pass_000.label.npy    [G, S]    uint8          1 = B is A's true continuation (stored, never used)
    train/pass_000.masked.npy   [G, S, ceil(L/8)] uint8  packed bits (little endian): selected for prediction
    valid/...

An example is ``[inp | A | <sep> | B | <sep> | <cls>]`` (docs/xlnet.md §3); nothing L x L is stored: the
factorisation order is sampled online by pretrain_stream.py each time an example is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from xlnetcli.core.errors import DataError
from xlnetcli.core.files import sha256_file
from xlnetcli.core.shapes import describe, json_field, read_json_object, str_map
from xlnetcli.data.shard_format import NpyFile

FORMAT_VERSION = 1
ARRAYS = ("tokens", "alen", "label", "masked")  # the files of one pass: {prefix}.{name}.npy


# ----------------------------------------------------------------------------------------------------------------
# Writing


def create_npy(path: Path, shape: tuple[int, ...], dtype: Any) -> None:
    """An .npy file of the given shape, zero-filled (sparse on disk until written)."""
    m = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    del m


def create_pass(prefix: str | Path, rows: int, steps: int, seq_len: int, dtype: Any) -> None:
    """The four zero-filled files of one pass (``prefix`` = split/pass_NNN), filled later by ``PassWriter``s."""
    create_npy(Path(f"{prefix}.tokens.npy"), (rows, steps, seq_len), dtype)
    create_npy(Path(f"{prefix}.alen.npy"), (rows, steps), np.uint16)
    create_npy(Path(f"{prefix}.label.npy"), (rows, steps), np.uint8)
    create_npy(Path(f"{prefix}.masked.npy"), (rows, steps, (seq_len + 7) // 8), np.uint8)


class PassWriter:
    """Writes blocks of examples into the files of one pass with pwrite (workers write disjoint rows in parallel)."""

    def __init__(self, prefix: str | Path, steps: int, seq_len: int):
        self.steps, self.seq_len, self.nb = steps, seq_len, (seq_len + 7) // 8
        self.files = {name: NpyFile(f"{prefix}.{name}.npy", write=True) for name in ARRAYS}

    def write(
        self, row: int, s0: int, tokens: np.ndarray, alen: np.ndarray, label: np.ndarray, masked: np.ndarray
    ) -> None:
        """Examples s0, s0+1, ... of ``row``: tokens [n, L], alen [n], label [n], masked [n, L] bool."""
        at = row * self.steps + s0
        self.files["tokens"].write(at * self.seq_len, tokens)
        self.files["alen"].write(at, alen)
        self.files["label"].write(at, label)
        self.files["masked"].write(at * self.nb, np.packbits(masked, axis=1, bitorder="little"))

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()


def checksums(records_dir: Path) -> dict[str, str]:
    """meta.json's ``sha256``: one checksum per records file, so a file damaged on disk is refused, not trained on."""
    return {f.relative_to(records_dir).as_posix(): sha256_file(f) for f in sorted(records_dir.glob("*/pass_*.npy"))}


# ----------------------------------------------------------------------------------------------------------------
# Row layout: a stored row g is (forward row f, reversed?) by ``row_source`` under the records' micro_batch_size; a
# reader with another micro-batch size (or number of processes) finds its rows with ``stored_rows``.


def row_source(g: int, bi_data: bool, mb: int) -> tuple[int, bool]:
    """(forward row index, reversed?) of output row g. bi_data: blocks of mb = [mb/2 forward ; same reversed]."""
    if not bi_data:
        return g, False
    half = mb // 2
    block, k = divmod(g, mb)
    return block * half + (k % half), k >= half


def stored_rows(rows: Any, bi_data: bool, mb: int, mb_records: int) -> np.ndarray:
    """int64: the stored rows of reading rows ``rows`` of a reader whose micro-batches hold ``mb`` rows: reading row
    g' is (f, rev) = ``row_source(g', bi_data, mb)``, stored where ``row_source`` under the records' micro-batch size
    ``mb_records`` put (f, rev). The identity without bi_data or when ``mb == mb_records``."""
    rows = np.asarray(rows, dtype=np.int64)
    if not bi_data:
        return rows
    half, half_rec = mb // 2, mb_records // 2
    block, k = np.divmod(rows, mb)
    f, rev = block * half + k % half, k >= half
    return f // half_rec * mb_records + f % half_rec + rev * half_rec


# ----------------------------------------------------------------------------------------------------------------
# Reading


def segment_ids(alen: np.ndarray, seq_len: int, reuse_len: int) -> np.ndarray:
    """int64 [..., L]: 0 for the reuse part, A and the first <sep>; 1 for B and the second <sep>; 2 for <cls>."""
    pos = np.arange(seq_len)
    a = np.asarray(alen, dtype=np.int64)[..., None]
    return (pos >= reuse_len + a + 1).astype(np.int64) + (pos >= seq_len - 1)


def read_meta(records_dir: str | Path) -> dict:
    path = Path(records_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{records_dir} is not a records directory (no meta.json); run `xlnet preprocess` first")
    meta = read_json_object(path, DataError, "rerun `xlnet preprocess`")
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: records format {meta.get('format_version')} is not {FORMAT_VERSION}; re-preprocess")
    _check_meta_shape(meta, path)
    return meta


def _check_meta_shape(meta: dict, path: Path) -> None:
    """Every field a reader uses, of its kind and in range: one line naming the file and the field otherwise."""
    for key in ("seq_len", "reuse_len", "num_predict", "global_batch_size", "micro_batch_size", "vocab_size"):
        json_field(meta, key, int, path, lo=0 if key == "reuse_len" else 1, hi=2**31 - 1)
    json_field(meta, "passes", int, path, lo=1, default=1)
    splits = json_field(meta, "splits", dict, path)
    for name, split in splits.items():
        where = f"{path} splits.{name}"
        if not isinstance(split, dict):
            raise DataError(f"{where}: must be an object, found {describe(split)}")
        for key in ("rows", "steps_per_pass"):
            json_field(split, key, int, where, lo=0, hi=2**40)
        files = json_field(split, "files", list, where)
        if not all(isinstance(f, str) and ".." not in Path(f).parts and not Path(f).is_absolute() for f in files):
            raise DataError(f"{where}: field 'files' must list relative paths inside the records folder")
    if "sha256" in meta:
        str_map(meta, "sha256", path)


def _check_shapes(arrays: list[np.ndarray], split: dict, meta: dict, prefix: Path) -> None:
    """The arrays of one pass against meta.json's counts: [rows, steps, seq_len] tokens and so on."""
    rows, steps, seq_len = split["rows"], split["steps_per_pass"], meta["seq_len"]
    want = {"tokens": (rows, steps, seq_len), "alen": (rows, steps), "label": (rows, steps)}
    want["masked"] = (rows, steps, (seq_len + 7) // 8)
    for name, arr in zip(ARRAYS, arrays, strict=True):
        if tuple(arr.shape) != want[name]:
            raise DataError(
                f"records file {prefix}.{name}.npy has shape {list(arr.shape)} but meta.json's counts say "
                f"{list(want[name])}; rerun `xlnet preprocess`"
            )


@dataclass
class PassRecords:
    tokens: np.ndarray  # [G, S, L] memmap
    alen: np.ndarray  # [G, S]
    label: np.ndarray  # [G, S]
    masked: np.ndarray  # [G, S, ceil(L/8)] packed bits

    def masked_bool(self, rows: Any, step: int, seq_len: int) -> np.ndarray:
        return np.unpackbits(self.masked[rows, step], axis=-1, count=seq_len, bitorder="little").view(bool)


_VERIFIED: set[tuple[str, int, int, str]] = set()


def open_records(records_dir: str | Path, split: str = "train", verify: bool = True) -> tuple[dict, list[PassRecords]]:
    """(meta, one PassRecords of memmaps per pass) for a split; ``verify`` checks each file against the sha256 in
    meta.json (records written before checksums were recorded pass unchecked)."""
    records_dir = Path(records_dir)
    meta = read_meta(records_dir)
    if split not in meta["splits"]:
        raise DataError(f"{records_dir} has no {split!r} split (has: {', '.join(meta['splits']) or 'none'})")
    digests = meta.get("sha256") or {}
    out = []
    for prefix in meta["splits"][split]["files"]:
        arrays = []
        for name in ARRAYS:
            p = records_dir / f"{prefix}.{name}.npy"
            want = digests.get(f"{prefix}.{name}.npy")
            if verify and want is not None and p.is_file():
                st = p.stat()
                key = (str(p.resolve()), st.st_size, st.st_mtime_ns, want)
                if key not in _VERIFIED:  # once per process (evaluation reopens the valid split)
                    if sha256_file(p) != want:
                        raise DataError(
                            f"records file {p} does not match the checksum in meta.json (damaged on "
                            "disk); rerun `xlnet preprocess`"
                        )
                    _VERIFIED.add(key)
            try:
                arrays.append(np.load(p, mmap_mode="r"))
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read records file {p}: {e}; rerun `xlnet preprocess`") from None
        _check_shapes(arrays, meta["splits"][split], meta, records_dir / prefix)
        out.append(PassRecords(*arrays))
    return meta, out
