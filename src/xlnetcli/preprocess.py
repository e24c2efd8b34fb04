"""`xlnet preprocess`: shards -> permutation-LM records, built as the original data_utils did (REFERENCE §2-4).

    preprocess("shards/", "records/", cfg, passes=2)       # what `xlnet preprocess` calls

Layout of the examples (the original's ``create_tfrecords``):
- the token stream of a pass (the shards concatenated in a per-pass shuffled order, sentence ids flipped so they keep
  alternating across shard joins) is cut into contiguous rows: G = train.global_batch_size rows, or G/2 rows with
  bi_data, each then used forward and time-reversed. With bi_data, rows are grouped in blocks of
  train.micro_batch_size (one device's batch): [mb/2 forward rows ; the same rows reversed].
- row g, step s: ``inp = row[sR : sR+R]`` then an A/B split of the text after it, giving
  ``[inp | A | <sep> | B | <sep> | <cls>]`` (length L) with |A| + |B| = L - R - 3 exactly.
- prediction targets: span masking with n ~ p(n) ∝ 1/n (n <= 5), each span inside about n*alpha/beta tokens, goal
  num_predict - num_predict//2 in the reuse part and num_predict//2 in the rest; then single positions top up.

Records directory::

    meta.json            every parameter (see ``META_KEYS``), splits, steps per pass, file names
    config.yaml          the resolved config
    tokenizer/           copy of the shards' tokenizer
    train/pass_000.tokens.npy   [G, S, L] uint16|uint32  token ids of row g at step s
    train/pass_000.alen.npy     [G, S]    uint16         |A|  (segment ids follow: see ``segment_ids``)
    train/pass_000.label.npy    [G, S]    uint8          1 = B is A's true continuation (stored, never used)
    train/pass_000.masked.npy   [G, S, ceil(L/8)] uint8  packed bits (little endian): selected for prediction
    valid/...

Nothing L x L is stored: the factorisation order is sampled online by data.py each time an example is read.
Memory is bounded: shards and records are read and written with pread/pwrite in blocks of steps, one row at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import string
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import Config, save_config
from .errors import ConfigError, DataError
from .io import atomic_output_dir, atomic_write_json, sha256_file
from .log import print0, step_progress
from .special import CLS_ID, SEP_ID

FORMAT_VERSION = 1
MAX_GRAM = 5  # spans of 1..5 units, p(n) ∝ 1/n (original _sample_mask)
STEP_BLOCK = 256  # windows of one row built together (bounds memory: STEP_BLOCK x L tokens)
_SPLIT_IDS = {"train": 0, "valid": 1}
_NGRAM_P = (1.0 / np.arange(1, MAX_GRAM + 1)) / (1.0 / np.arange(1, MAX_GRAM + 1)).sum()
_NGRAM_CDF = np.cumsum(_NGRAM_P)


# ----------------------------------------------------------------------------------------------------------------
# Reading .npy files with pread (no mmap: resident memory stays bounded whatever the corpus size)


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


def create_npy(path: Path, shape: tuple[int, ...], dtype: Any) -> None:
    """An .npy file of the given shape, zero-filled (sparse on disk until written)."""
    m = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    del m


# ----------------------------------------------------------------------------------------------------------------
# Shards


def _read_shard_manifest(shard_dir: Path) -> dict:
    try:
        from .shard import read_manifest  # type: ignore[attr-defined]

        return read_manifest(shard_dir)
    except ImportError:
        pass
    path = shard_dir / "manifest.json"
    if not path.is_file():
        raise DataError(f"{shard_dir} is not a shard directory (no manifest.json); run `xlnet shard` first")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
        m["splits"]["train"]
    except (ValueError, KeyError, TypeError):
        raise DataError(f"{path} is corrupt; rerun `xlnet shard`") from None
    return m


def word_start_table(tokenizer_dir: Path) -> np.ndarray:
    """bool [vocab]: the piece starts a word (REFERENCE §4). Uses tokenizer.py when present."""
    if (tokenizer_dir / "tokenizer.json").is_file():
        try:
            from .tokenizer import Tokenizer  # type: ignore[attr-defined]
        except ImportError:
            pass
        else:
            return np.asarray(Tokenizer.load(tokenizer_dir).word_start_mask(), dtype=bool)
    import sentencepiece as spm

    model = tokenizer_dir / "spiece.model"
    if not model.is_file():
        raise DataError(f"tokenizer model missing: {model}")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    punct = set(string.punctuation)
    out = np.zeros(sp.get_piece_size(), dtype=bool)
    for i in range(sp.get_piece_size()):
        p = sp.id_to_piece(i)
        out[i] = p.startswith("▁") or sp.is_control(i) or sp.is_unknown(i) or sp.is_user_defined(i) or p in punct
    return out


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
                tok.close(), sid.close()
                continue
            self.files.append((tok, sid))
            lengths.append(tok.size)
        self.starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        self.total = int(self.starts[-1])
        # flip flags: the first id of a file must differ from the last id of the previous one
        self.flip = []
        prev = None
        for tok, sid in self.files:
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

    def close(self) -> None:
        for tok, sid in self.files:
            tok.close()
            sid.close()


class Row:
    """Row ``f`` of ``n_rows`` contiguous rows of a stream, optionally time-reversed (bi_data)."""

    def __init__(self, stream: PassStream, f: int, row_len: int, reverse: bool):
        self.stream, self.base, self.len, self.reverse = stream, f * row_len, row_len, reverse

    def read(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = max(0, a), min(self.len, b)
        if not self.reverse:
            return self.stream.read(self.base + a, self.base + b)
        end = self.base + self.len
        t, s = self.stream.read(end - b, end - a)
        return t[::-1], s[::-1]


# ----------------------------------------------------------------------------------------------------------------
# A/B split (original _split_a_and_b, with the scans done on boundary positions)


def trim_lengths(a: int, b: int, tot: int) -> tuple[int, int]:
    """Closed form of the original loop: while a + b > tot, shorten the longer one (B on ties)."""
    d = a + b - tot
    if d <= 0:
        return a, b
    if a > b:
        if a - b >= d:
            return a - d, b
        d -= a - b
        a = b
    elif b > a:
        if b - a >= d:
            return a, b - d
        d -= b - a
        b = a
    # equal: B first, then alternate
    return a - d // 2, b - (d - d // 2)


def _boundaries(sid: np.ndarray, lo: int) -> np.ndarray:
    """Absolute positions p (> lo) with sid[p] != sid[p-1], for the ids ``sid`` of positions lo, lo+1, ..."""
    return np.flatnonzero(sid[1:] != sid[:-1]) + (lo + 1)


class _RowScanner:
    """Finds sentence boundaries of a row, from a cached block or by reading further."""

    def __init__(self, row: Row, chunk: int):
        self.row, self.chunk = row, chunk

    def next_boundary(self, p: int, limit: int) -> int:
        """Smallest boundary q >= p (q <= limit - 1), else ``limit``."""
        while p < limit:
            hi = min(limit, p + self.chunk)
            _, s = self.row.read(p - 1, hi)
            bs = _boundaries(s, p - 1)
            if len(bs):
                return int(bs[0])
            p = hi
        return limit

    def prev_boundary(self, p: int) -> int:
        """Largest boundary q <= p, else 0."""
        while p > 0:
            lo = max(0, p - self.chunk)
            _, s = self.row.read(lo, p + 1)
            bs = _boundaries(s, lo)
            if len(bs):
                return int(bs[-1])
            p = lo
        return 0


# ----------------------------------------------------------------------------------------------------------------
# Span masking (original _sample_mask), vectorised over many segments


def sample_masks(
    seg: np.ndarray,
    word_start: np.ndarray,
    goal: int,
    alpha: int,
    beta: int,
    mode: str,
    rng: np.random.Generator,
    reverse: bool = False,
    top_up: bool = True,
) -> np.ndarray:
    """bool [N, n]: positions selected for prediction in each of N segments ``seg`` [N, n] of token ids.

    ``word_start``: bool [vocab]. ``mode`` "word": spans of n whole words, never over <sep>/<cls>, count capped at
    ``goal``. "original": the original's spans of n subword pieces starting at a word start (its bug #220), <sep>/<cls>
    may be selected (the loader drops them). ``reverse``: the segments are time-reversed text; spans are sampled
    in reading order (the segments are flipped, masked, and the mask flipped back), as the original.
    ``top_up=False`` returns the spans only (tests).
    """
    if reverse:
        seg = seg[:, ::-1]
    N, n = seg.shape
    ws = word_start[seg]
    func = (seg == SEP_ID) | (seg == CLS_ID)
    rows = np.arange(N)
    pos = np.arange(n + 1)
    # next word start at or after p (n if none), for p in 0..n
    nxt = np.where(np.concatenate([ws, np.ones((N, 1), bool)], 1), pos, n)
    nxt = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
    if mode == "word":
        cws = np.zeros((N, n + 1), np.int64)  # word starts before p
        np.cumsum(ws, axis=1, out=cws[:, 1:])
        wpos = np.full((N, n + 2), n, np.int64)  # position of the k-th word start (n when fewer)
        r_, c_ = np.nonzero(ws)
        wpos[r_, cws[r_, c_]] = c_
        fcum = np.zeros((N, n + 1), np.int64)
        np.cumsum(func, axis=1, out=fcum[:, 1:])
    diff = np.zeros((N, n + 1), np.int64)
    count = np.zeros(N, np.int64)
    cur = np.zeros(N, np.int64)
    active = np.ones(N, bool) if goal > 0 else np.zeros(N, bool)
    while active.any():
        ng = np.searchsorted(_NGRAM_CDF, rng.random(N) * _NGRAM_CDF[-1], side="right") + 1
        ng = np.minimum(np.minimum(ng, MAX_GRAM), goal - count)
        ctx = np.maximum(ng, 1) * alpha // beta
        lctx = np.minimum((rng.random(N) * ctx).astype(np.int64), ctx - 1)
        beg = nxt[rows, np.minimum(cur + lctx, n)]
        stop = beg >= n
        begc = np.minimum(beg, n - 1)
        if mode == "original":
            end = beg + ng
        else:
            left = goal - count
            kk = np.arange(1, MAX_GRAM + 1)
            idx = np.minimum(cws[rows, begc][:, None] + kk[None, :], n + 1)
            ends = wpos[rows[:, None], idx]  # [N, 5] end of a span of k words
            pieces = (ends - begc[:, None]) - (fcum[rows[:, None], np.minimum(ends, n)] - fcum[rows, begc][:, None])
            fits = (kk[None, :] <= ng[:, None]) & (pieces <= left[:, None])
            k_fit = np.where(fits.any(1), MAX_GRAM - np.argmax(fits[:, ::-1], axis=1), 0)
            stop |= k_fit == 0
            end = ends[rows, np.maximum(k_fit, 1) - 1]
        stop |= end >= n
        ok = active & ~stop
        if ok.any():
            r = rows[ok]
            diff[r, beg[ok]] += 1
            diff[r, end[ok]] -= 1
            if mode == "original":
                count[ok] += end[ok] - beg[ok]
            else:
                count[ok] += (end[ok] - beg[ok]) - (fcum[r, end[ok]] - fcum[r, beg[ok]])
            cur[ok] = end[ok] + (ctx[ok] - lctx[ok])
        active &= ~stop & (count < goal) & (cur < n)
    mask = np.cumsum(diff[:, :n], axis=1) > 0
    if mode == "word":
        mask &= ~func
    # top up with single random positions until the goal is reached
    need = goal - mask.sum(1)
    if top_up and (need > 0).any():
        eligible = ~mask if mode == "original" else ~mask & ~func
        keys = np.where(eligible, rng.random((N, n)), 2.0)
        order = np.argsort(keys, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(n)[None, :].repeat(N, 0), axis=1)
        mask |= eligible & (rank < need[:, None])
    if reverse:
        mask = mask[:, ::-1]
    return mask


def segment_ids(alen: np.ndarray, seq_len: int, reuse_len: int) -> np.ndarray:
    """int64 [..., L]: 0 for the reuse part, A and the first <sep>; 1 for B and the second <sep>; 2 for <cls>."""
    pos = np.arange(seq_len)
    a = np.asarray(alen, dtype=np.int64)[..., None]
    return (pos >= reuse_len + a + 1).astype(np.int64) + (pos >= seq_len - 1)


# ----------------------------------------------------------------------------------------------------------------
# Building one row


@dataclass
class _Params:
    seq_len: int
    reuse_len: int
    num_predict: int
    alpha: int
    beta: int
    mode: str
    seed: int
    dtype: str


def _row_rng(seed: int, split: str, pass_id: int, row: int) -> np.random.Generator:
    return np.random.default_rng([seed, _SPLIT_IDS[split], pass_id, row, 0x584C4E])


def build_row(
    row: Row, steps: int, p: _Params, rng: np.random.Generator, ws_table: np.ndarray, s0: int = 0, s1: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Examples of steps s0..s1 of one row: tokens [n, L], alen [n], label [n], masked [n, L] bool."""
    L, R = p.seq_len, p.reuse_len
    tot = L - R - 3
    s1 = steps if s1 is None else s1
    n = s1 - s0
    lo = s0 * R
    hi = min(row.len, (s1 - 1) * R + L + 2 * tot + 64)
    blk_t, blk_s = row.read(lo, hi)
    bpos = _boundaries(blk_s, lo)
    scan = _RowScanner(row, 4 * L)
    U = rng.random((n, 3))
    out = np.empty((n, L), dtype=blk_t.dtype)
    alen = np.empty(n, np.int64)
    label = np.empty(n, np.uint8)

    def tokens(a: int, b: int) -> np.ndarray:
        if lo <= a and b <= hi:
            return blk_t[a - lo : b - lo]
        return row.read(a, b)[0]

    for k in range(n):
        i = (s0 + k) * R
        begin = i + R
        j0 = int(np.searchsorted(bpos, begin + 1, "left"))
        j1 = int(np.searchsorted(bpos, begin + tot, "left"))
        cuts = bpos[j0:j1]
        if j1 < len(bpos):
            end_idx = int(bpos[j1])
        elif hi >= row.len:
            end_idx = row.len
        else:
            end_idx = scan.next_boundary(max(hi, begin + tot), row.len)
        nc = len(cuts)
        if nc == 0 or U[k, 0] < 0.5:
            lab = 0
            a_end = end_idx if nc == 0 else int(cuts[min(int(U[k, 1] * nc), nc - 1)])
            b_len = max(1, tot - (a_end - begin))
            b_begin = min(int(U[k, 2] * (row.len - b_len)), row.len - 1 - b_len)
            b_end = b_begin + b_len
            b_begin = scan.prev_boundary(b_begin)
            if b_end < row.len - 1:
                b_end = scan.next_boundary(b_end, row.len - 1)
        else:
            lab = 1
            a_end = int(cuts[min(int(U[k, 1] * nc), nc - 1)])
            b_begin, b_end = a_end, end_idx
        la, lb = trim_lengths(a_end - begin, b_end - b_begin, tot)
        out[k, :R] = tokens(i, begin)
        out[k, R : R + la] = tokens(begin, begin + la)
        out[k, R + la] = SEP_ID
        out[k, R + la + 1 : L - 2] = tokens(b_begin, b_begin + lb)
        out[k, L - 2] = SEP_ID
        out[k, L - 1] = CLS_ID
        alen[k], label[k] = la, lab
    goal1 = p.num_predict // 2
    goal0 = p.num_predict - goal1
    masked = np.empty((n, L), bool)
    masked[:, :R] = sample_masks(out[:, :R], ws_table, goal0, p.alpha, p.beta, p.mode, rng, row.reverse)
    masked[:, R:] = sample_masks(out[:, R:], ws_table, goal1, p.alpha, p.beta, p.mode, rng, row.reverse)
    return out, alen, label, masked


# ----------------------------------------------------------------------------------------------------------------
# Whole passes


@dataclass
class _Job:
    entries: list[tuple[str, str]]
    order: list[int]
    out_prefix: str
    split: str
    pass_id: int
    rows: list[int]
    n_rows_fwd: int
    row_len: int
    steps: int
    bi_data: bool
    micro_batch_size: int
    params: _Params
    ws_path: str
    vocab_size: int


def row_source(g: int, bi_data: bool, mb: int) -> tuple[int, bool]:
    """(forward row index, reversed?) of output row g. bi_data: blocks of mb = [mb/2 forward ; same reversed]."""
    if not bi_data:
        return g, False
    half = mb // 2
    block, k = divmod(g, mb)
    return block * half + (k % half), k >= half


def _run_job(job: _Job) -> int:
    ws_table = np.load(job.ws_path)
    stream = PassStream([(Path(a), Path(b)) for a, b in job.entries], job.order)
    files = {
        name: NpyFile(f"{job.out_prefix}.{name}.npy", write=True) for name in ("tokens", "alen", "label", "masked")
    }
    L = job.params.seq_len
    nb = (L + 7) // 8
    done = 0
    try:
        for g in job.rows:
            f, rev = row_source(g, job.bi_data, job.micro_batch_size)
            row = Row(stream, f, job.row_len, rev)
            rng = _row_rng(job.params.seed, job.split, job.pass_id, g)
            for s0 in range(0, job.steps, STEP_BLOCK):
                s1 = min(job.steps, s0 + STEP_BLOCK)
                tok, alen, label, masked = build_row(row, job.steps, job.params, rng, ws_table, s0, s1)
                if tok.size and int(tok.max()) >= job.vocab_size:
                    raise DataError(
                        f"shard token id {int(tok.max())} >= vocab size {job.vocab_size}: the shards were made with "
                        "another tokenizer; rerun `xlnet shard` with this tokenizer"
                    )
                files["tokens"].write((g * job.steps + s0) * L, tok)
                files["alen"].write(g * job.steps + s0, alen)
                files["label"].write(g * job.steps + s0, label)
                files["masked"].write((g * job.steps + s0) * nb, np.packbits(masked, axis=1, bitorder="little"))
                done += s1 - s0
    finally:
        for fh in files.values():
            fh.close()
        stream.close()
    return done


# ----------------------------------------------------------------------------------------------------------------
# Entry point


def check_params(cfg: Config) -> None:
    """Raise ConfigError for settings the example layout cannot satisfy."""
    L, R = cfg.data.seq_len, cfg.model.reuse_len
    if R < 1:
        raise ConfigError("model.reuse_len must be >= 1 for pretraining records (the original uses seq_len/2)")
    if L - R < 5:
        raise ConfigError(f"data.seq_len - model.reuse_len must be >= 5 for A <sep> B <sep> <cls>, got {L - R}")
    P = cfg.perm_size
    if P > R or P > L - R or R % P or (L - R) % P:
        raise ConfigError(
            f"data.perm_size ({P}) must divide model.reuse_len ({R}) and data.seq_len - model.reuse_len ({L - R})"
        )
    goal1 = cfg.data.num_predict // 2
    goal0 = cfg.data.num_predict - goal1
    if goal0 > R or goal1 > L - R - 3:
        raise ConfigError(
            f"data.num_predict ({cfg.data.num_predict}) is larger than possible: {goal0} targets in the reuse part "
            f"(at most model.reuse_len = {R}) and {goal1} in the rest (at most seq_len - reuse_len - 3 = {L - R - 3})"
        )
    if cfg.data.mask_alpha < cfg.data.mask_beta:
        raise ConfigError(
            f"data.mask_alpha ({cfg.data.mask_alpha}) must be >= data.mask_beta ({cfg.data.mask_beta}): "
            "each span needs a context of at least one token"
        )
    G, mb = cfg.train.global_batch_size, cfg.train.micro_batch_size
    if cfg.model.bi_data and (mb % 2 or G % mb):
        raise ConfigError(
            f"with model.bi_data the per-device batch train.micro_batch_size ({mb}) must be even and divide "
            f"train.global_batch_size ({G})"
        )


def preprocess(
    shards: str | Path,
    out: str | Path,
    cfg: Config,
    passes: int | None = None,
    mask_mode: str | None = None,
    overwrite: bool = False,
    workers: int = 1,
    quiet: bool = False,
) -> dict:
    """Build records from a shard directory; returns meta.json's content."""
    shards = Path(shards)
    passes = cfg.data.passes if passes is None else passes
    mode = cfg.data.mask_mode if mask_mode is None else mask_mode
    if mode not in ("word", "original"):
        raise ConfigError(f"--mask-mode must be word or original, got {mode!r}")
    if passes < 1:
        raise ConfigError(f"--passes must be >= 1, got {passes}")
    check_params(cfg)
    manifest = _read_shard_manifest(shards)
    tok_dir = shards / "tokenizer"
    spm_path = tok_dir / "spiece.model"
    if not spm_path.is_file():
        raise DataError(f"{shards}: tokenizer/spiece.model is missing; rerun `xlnet shard`")
    sha = sha256_file(spm_path)
    if manifest.get("tokenizer_sha256") != sha:
        raise DataError(
            f"{shards}: the shards were made with another tokenizer (manifest sha256 "
            f"{str(manifest.get('tokenizer_sha256'))[:12]}…, tokenizer/ {sha[:12]}…); rerun `xlnet shard`"
        )
    vocab = int(manifest.get("vocab_size", -1))
    if vocab != cfg.model.vocab_size:
        raise DataError(
            f"{shards}: shards use a {vocab}-piece tokenizer but model.vocab_size is {cfg.model.vocab_size}; "
            "set model.vocab_size and tokenizer.vocab_size to match or re-shard"
        )
    ws_table = word_start_table(tok_dir)
    if len(ws_table) < vocab:
        raise DataError(f"{tok_dir}: tokenizer has {len(ws_table)} pieces, the manifest says {vocab}")

    L, R = cfg.data.seq_len, cfg.model.reuse_len
    G, mb, bi = cfg.train.global_batch_size, cfg.train.micro_batch_size, cfg.model.bi_data
    n_fwd = G // 2 if bi else G
    dtype = manifest.get("dtype", "uint16")
    if dtype not in ("uint16", "uint32"):
        raise DataError(f"{shards}: unsupported token dtype {dtype!r} in manifest.json")
    params = _Params(L, R, cfg.data.num_predict, cfg.data.mask_alpha, cfg.data.mask_beta, mode, cfg.data.seed, dtype)

    plans = {}
    for split in ("train", "valid"):
        entries = manifest["splits"].get(split) or []
        paths = [(str(shards / e["tokens_file"]), str(shards / e["sentid_file"])) for e in entries]
        for a, b in paths:
            if not Path(a).is_file() or not Path(b).is_file():
                raise DataError(f"shard file missing: {a if not Path(a).is_file() else b}; rerun `xlnet shard`")
        total = sum(int(e["tokens"]) for e in entries)
        need = n_fwd * L
        if total < need:
            if split == "train":
                raise DataError(
                    f"corpus too small for one window: {n_fwd} rows x seq_len {L} need {need} tokens, the train split "
                    f"has {total}; add text or lower train.global_batch_size / data.seq_len"
                )
            print0(f"[yellow]valid split skipped: {total} tokens, one window per row needs {need}[/yellow]")
            continue
        row_len = total // n_fwd
        steps = (row_len - L) // R + 1
        plans[split] = (paths, total, row_len, steps)

    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "seq_len": L,
        "reuse_len": R,
        "perm_size": cfg.perm_size,
        "bi_data": bi,
        "num_predict": cfg.data.num_predict,
        "num_predict_reuse": cfg.data.num_predict - cfg.data.num_predict // 2,
        "mask_alpha": cfg.data.mask_alpha,
        "mask_beta": cfg.data.mask_beta,
        "mask_mode": mode,
        "max_gram": MAX_GRAM,
        "seed": cfg.data.seed,
        "tokenizer_sha256": sha,
        "vocab_size": vocab,
        "dtype": dtype,
        "global_batch_size": G,
        "micro_batch_size": mb,
        "passes": passes,
        "layout": "rows [G, steps, L]; bi_data blocks of micro_batch_size = [forward half ; same rows reversed]",
        "splits": {},
    }
    total_examples = sum(passes * G * s for (_, _, _, s) in plans.values())
    with atomic_output_dir(out, overwrite, "records") as tmp:
        ws_path = tmp / ".word_start.npy"
        np.save(ws_path, ws_table)
        jobs = []
        for split, (paths, total, row_len, steps) in plans.items():
            (tmp / split).mkdir()
            files = []
            for pass_id in range(passes):
                order = list(np.random.default_rng([cfg.data.seed, _SPLIT_IDS[split], pass_id]).permutation(len(paths)))
                prefix = tmp / split / f"pass_{pass_id:03d}"
                create_npy(Path(f"{prefix}.tokens.npy"), (G, steps, L), dtype)
                create_npy(Path(f"{prefix}.alen.npy"), (G, steps), np.uint16)
                create_npy(Path(f"{prefix}.label.npy"), (G, steps), np.uint8)
                create_npy(Path(f"{prefix}.masked.npy"), (G, steps, (L + 7) // 8), np.uint8)
                files.append(f"{split}/pass_{pass_id:03d}")
                chunk = max(1, min(mb, G // max(1, workers)))
                for g0 in range(0, G, chunk):
                    jobs.append(
                        _Job(paths, [int(x) for x in order], str(prefix), split, pass_id, list(range(g0, min(G, g0 + chunk))),
                             n_fwd, row_len, steps, bi, mb, params, str(ws_path), vocab)
                    )
            meta["splits"][split] = {
                "tokens": total, "rows": G, "row_len": row_len, "steps_per_pass": steps, "passes": passes,
                "examples": passes * G * steps, "files": files,
            }
        with step_progress(quiet) as bar:
            task = bar.add_task("preprocess", total=total_examples, info="examples")
            if workers <= 1:
                for job in jobs:
                    bar.advance(task, _run_job(job))
            else:
                import multiprocessing as mp

                with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as ex:
                    for n in ex.map(_run_job, jobs):
                        bar.advance(task, n)
        ws_path.unlink()
        shutil.copytree(tok_dir, tmp / "tokenizer")
        save_config(cfg, tmp)
        atomic_write_json(tmp / "meta.json", meta)
    return meta


# ----------------------------------------------------------------------------------------------------------------
# Reading records back


def read_meta(records_dir: str | Path) -> dict:
    path = Path(records_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{records_dir} is not a records directory (no meta.json); run `xlnet preprocess` first")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise DataError(f"{path} is corrupt; rerun `xlnet preprocess`") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: records format {meta.get('format_version')} is not {FORMAT_VERSION}; re-preprocess")
    return meta


@dataclass
class PassRecords:
    tokens: np.ndarray  # [G, S, L] memmap
    alen: np.ndarray  # [G, S]
    label: np.ndarray  # [G, S]
    masked: np.ndarray  # [G, S, ceil(L/8)] packed bits

    def masked_bool(self, rows: Any, step: int, seq_len: int) -> np.ndarray:
        return np.unpackbits(self.masked[rows, step], axis=-1, count=seq_len, bitorder="little").astype(bool)


def open_records(records_dir: str | Path, split: str = "train") -> tuple[dict, list[PassRecords]]:
    """(meta, one PassRecords of memmaps per pass) for a split."""
    records_dir = Path(records_dir)
    meta = read_meta(records_dir)
    if split not in meta["splits"]:
        raise DataError(f"{records_dir} has no {split!r} split (has: {', '.join(meta['splits']) or 'none'})")
    out = []
    for prefix in meta["splits"][split]["files"]:
        arrays = []
        for name in ("tokens", "alen", "label", "masked"):
            p = records_dir / f"{prefix}.{name}.npy"
            try:
                arrays.append(np.load(p, mmap_mode="r"))
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read records file {p}: {e}; rerun `xlnet preprocess`") from None
        out.append(PassRecords(*arrays))
    return meta, out
