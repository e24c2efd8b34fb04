"""`xlnet preprocess`: shards -> permutation-LM records, built as the original data_utils did (docs/xlnet.md §2-4).

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
Memory is bounded: shards and records are read and written with pread/pwrite in blocks of STEP_BLOCK steps of the
job's rows (span masks sampled for all their segments at once); a random B span is one pread per window.
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
from .io import atomic_output_dir, atomic_write_json, check_output_not_input, sha256_file
from .log import print0, step_progress
from .special import CLS_ID, SEP_ID

FORMAT_VERSION = 1
MAX_GRAM = 5  # spans of 1..5 units, p(n) ∝ 1/n (original _sample_mask)
STEP_BLOCK = 256  # windows of one row built together (bounds memory: STEP_BLOCK x L tokens)
_SPLIT_IDS = {"train": 0, "valid": 1}
_NGRAM_P = (1.0 / np.arange(1, MAX_GRAM + 1)) / (1.0 / np.arange(1, MAX_GRAM + 1)).sum()
_NGRAM_CDF = np.cumsum(_NGRAM_P)
_KK = np.arange(1, MAX_GRAM + 1)[None, :]


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
    """bool [vocab]: the piece starts a word (docs/xlnet.md §4). Uses tokenizer.py when present."""
    if (tokenizer_dir / "xlnet_tokenizer.json").is_file() or (tokenizer_dir / "tokenizer.json").is_file():
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

    def read_many(self, starts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """tokens, sentence ids [k, width] of the ranges [s, s + width) (all inside the stream): one pread per file."""
        k = len(starts)
        fi = np.searchsorted(self.starts, starts, "right") - 1
        single = (starts + width <= self.starts[fi + 1]).tolist()
        isz = self.files[0][0].dtype.itemsize if self.files else 2
        tb, sb = [], []
        bases = self.starts.tolist()
        for s, f, one in zip(starts.tolist(), fi.tolist(), single):
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
        flip = np.asarray(self.flip + [False], bool)[fi] & np.asarray(single, bool)
        d = (d.reshape(k, width) & 1).astype(np.uint8) ^ flip[:, None].astype(np.uint8)
        return t.reshape(k, width), d

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

    def read_many(self, starts: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """tokens, sentence ids [k, width] of row ranges [a, a + width) (inside the row), in row order."""
        if not hasattr(self.stream, "read_many"):  # any object with read(a, b) (tests)
            pairs = [self.read(a, a + width) for a in starts.tolist()]
            return (np.array([t for t, _ in pairs]).reshape(-1, width),
                    np.array([s for _, s in pairs], np.uint8).reshape(-1, width))
        if not self.reverse:
            return self.stream.read_many(self.base + starts, width)
        t, s = self.stream.read_many(self.base + self.len - starts - width, width)
        return t[:, ::-1], s[:, ::-1]


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


def trim_lengths_np(a: np.ndarray, b: np.ndarray, tot: int) -> tuple[np.ndarray, np.ndarray]:
    """``trim_lengths`` on arrays: the longer one loses min(excess, |a - b|), then B and A alternately (B first)."""
    d = np.maximum(a + b - tot, 0)
    d1 = np.minimum(d, np.abs(a - b))
    a, b = a - np.where(a > b, d1, 0), b - np.where(b > a, d1, 0)
    d2 = d - d1
    return a - d2 // 2, b - (d2 - d2 // 2)


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


TOPUP_DRAWS = 24  # candidate positions drawn per segment for the top-up (exact fallback when they run short)


def mask_draw_width(goal: int) -> int:
    """Uniforms drawn per segment by ``sample_masks``: goal+5 span lengths, goal+5 left contexts, top-up candidates."""
    return 2 * (goal + 5) + TOPUP_DRAWS


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
    ``top_up=False`` returns the spans only (tests). Draws ``mask_draw_width(goal)`` uniforms per segment from ``rng``
    (one call), so a segment's mask depends only on its own draws: batching segments together changes nothing.
    """
    N = seg.shape[0]
    draws = rng.random((N, mask_draw_width(goal)))
    if reverse:
        return masks_from_draws(seg[:, ::-1], word_start, goal, alpha, beta, mode, draws, top_up)[:, ::-1]
    return masks_from_draws(seg, word_start, goal, alpha, beta, mode, draws, top_up)


def masks_from_draws(
    seg: np.ndarray,
    word_start: np.ndarray,
    goal: int,
    alpha: int,
    beta: int,
    mode: str,
    draws: np.ndarray,
    top_up: bool = True,
) -> np.ndarray:
    """``sample_masks`` on segments in reading order with pre-drawn uniforms ``draws`` [N, mask_draw_width(goal)].

    The original's loop (docs/xlnet.md §4) runs for all segments at once: iteration k uses each segment's k-th draws
    (span length n ~ 1/n, left context l), so the loop is a few array operations per iteration over the segments
    still active. Word starts are kept as one sorted array of flat positions (a sentinel word start at the end of
    every segment): "advance to the next word start" and "end after n words" are ``searchsorted``/index steps.
    """
    N, n = seg.shape
    mask = np.zeros((N, n), bool)
    if N == 0 or n == 0:
        return mask
    K = goal + 5
    M = n + 1  # flat layout: segment r occupies [r*M, r*M + n], position n a sentinel word start
    codes = word_start.astype(np.uint8)  # 1 = word start, 3 = <sep>/<cls> (functional; a word start too)
    codes[[i for i in (SEP_ID, CLS_ID) if i < len(codes)]] = 3
    wsx = np.empty((N, M), np.uint8)
    wsx[:, :n] = codes.take(seg)
    wsx[:, n] = 1
    fpos = np.flatnonzero(wsx == 3)  # flat positions of <sep>/<cls> in the [N, M] layout
    wx = wsx.reshape(-1)
    wx[fpos] = 1
    wx = wx.view(bool)  # 0/1 bytes
    wflat = np.flatnonzero(wx)  # sorted flat positions of word starts
    nxtw = np.cumsum(wx, dtype=np.int32)  # index in wflat of the next word start at or after each flat position
    nxtw -= wx
    wsent = nxtw[np.arange(N) * M + n]  # index in wflat of each segment's sentinel
    cw = wflat  # pieces before each word start (differences within a segment count pieces)
    if mode == "word" and len(fpos):  # count non-functional pieces only: subtract <sep>/<cls> word starts before
        isf = np.zeros(len(wflat) + 1, np.int32)
        isf[nxtw[fpos] + 1] = 1
        cw = wflat - np.cumsum(isf, dtype=np.int32)[:-1]
    # the loop state, in flat [N, M] positions; compacted to the segments still active
    act = np.arange(N) if goal > 0 else np.arange(0)
    cur = act * M
    row_end = cur + n
    sent = wsent[act]
    count = np.zeros(len(act), np.int64)
    u_n = np.ascontiguousarray(draws[:, :K].T)  # [K, N]: draw k of every segment contiguous
    u_l = np.ascontiguousarray(draws[:, K : 2 * K].T)
    ctx_of = np.arange(MAX_GRAM + 1) * alpha // beta
    cdf = _NGRAM_CDF * (1.0 / _NGRAM_CDF[-1])
    begs, ends = [], []
    it = 0
    while len(act):
        col = it % K
        left = goal - count
        ng = np.minimum(np.searchsorted(cdf, u_n[col][act], side="right") + 1, MAX_GRAM)
        np.minimum(ng, left, out=ng)
        ctx = ctx_of[ng]
        lctx = np.minimum((u_l[col][act] * ctx).astype(np.int64), ctx - 1)
        j = nxtw[np.minimum(cur + lctx, row_end)]  # next word start at or after cur + l
        if mode == "original":
            beg = wflat[j]
            end = beg + ng
            cnt = ng
            ok = end < row_end
        else:
            # end after k_fit words: the most words (<= n) whose non-functional pieces keep the count <= goal
            cj = cw[j]
            fit = cw[np.minimum(j[:, None] + _KK, sent[:, None])] <= (cj + left)[:, None]
            k_fit = (fit & (_KK <= ng[:, None])).sum(1)
            je = np.minimum(j + k_fit, sent)
            beg = wflat[j]
            end = wflat[je]
            cnt = cw[je] - cj
            ok = (je > j) & (end < row_end)
        count += np.where(ok, cnt, 0) if not ok.all() else cnt
        nxt_cur = end + (ctx - lctx)
        keep = ok & (count < goal) & (nxt_cur < row_end)
        if not ok.all():
            beg, end = beg[ok], end[ok]
        begs.append(beg)
        ends.append(end)
        if keep.all():
            cur = nxt_cur
        else:
            act, cur, row_end, sent, count = act[keep], nxt_cur[keep], row_end[keep], sent[keep], count[keep]
        it += 1
    if begs:
        b = np.concatenate(begs)
        lens = np.concatenate(ends) - b
        if len(b):
            b -= b // M  # [N, M] -> [N, n] positions (spans never reach the sentinel)
            starts = np.repeat(b - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
            mask.reshape(-1)[starts + np.arange(int(lens.sum()))] = True
    fseg = fpos - fpos // M  # <sep>/<cls> in [N, n] positions
    if mode == "word":
        mask.reshape(-1)[fseg] = False
    if not top_up:
        return mask
    # top up with single random positions until the goal is reached: candidates drawn uniformly in order, the first
    # eligible distinct ones taken (a uniform subset); segments whose candidates run short use an exact draw
    eligible = ~mask
    if mode == "word":
        eligible.reshape(-1)[fseg] = False
    need = goal - mask.sum(1)
    sel = np.flatnonzero(need > 0)
    if len(sel) == 0:
        return mask
    T = draws.shape[1] - 2 * K
    cand = np.minimum((draws[sel, 2 * K:] * n).astype(np.int64), n - 1)  # [S, T]
    flat = sel[:, None] * n + cand
    ok = eligible.reshape(-1)[flat]
    loc = (np.arange(len(sel)) * n)[:, None] + cand  # first occurrence of each candidate in its row
    first = np.full(len(sel) * n, T, np.int16)
    np.minimum.at(first, loc.reshape(-1), np.broadcast_to(np.arange(T, dtype=np.int16), loc.shape).reshape(-1))
    ok &= first[loc] == np.arange(T)[None, :]
    csum = np.cumsum(ok, axis=1)
    take = ok & (csum <= need[sel, None])
    mask.reshape(-1)[flat[take]] = True
    short = np.flatnonzero(csum[:, -1] < need[sel])
    for r in sel[short]:
        el = np.flatnonzero(eligible[r] & ~mask[r])
        k = int(goal - mask[r].sum())
        seed = [int(x * 2**53) for x in draws[r, :2]]
        pick = np.random.default_rng(seed).permutation(el)[: max(0, k)]
        mask[r, pick] = True
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


_CHUNK = 128  # tokens read either side of a random B span to find its sentence boundaries (scan further if needed)


def split_block(row: Row, p: _Params, U: np.ndarray, s0: int, s1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A/B split of the windows s0..s1 of one row (original _split_a_and_b), vectorised over the windows.

    ``U`` [n, 3]: per window, the uniforms for (random B?, A's cut point, B's random begin).
    Returns tokens [n, L] = [inp | A | <sep> | B | <sep> | <cls>], alen [n], label [n]."""
    L, R = p.seq_len, p.reuse_len
    tot = L - R - 3
    n = s1 - s0
    lo = s0 * R
    hi = min(row.len, (s1 - 1) * R + L + 2 * tot + 64)
    blk_t, blk_s = row.read(lo, hi)
    bpos = _boundaries(blk_s, lo)
    nb = len(bpos)
    scan = _RowScanner(row, 4 * L)
    i = (s0 + np.arange(n, dtype=np.int64)) * R
    begin = i + R
    j0 = np.searchsorted(bpos, begin + 1, "left")  # cut points: boundaries in (begin, begin + tot)
    j1 = np.searchsorted(bpos, begin + tot, "left")
    nc = j1 - j0
    end_idx = np.empty(n, np.int64)  # first boundary at or after begin + tot
    inb = j1 < nb
    end_idx[inb] = bpos[j1[inb]]
    for k in np.flatnonzero(~inb).tolist():
        end_idx[k] = row.len if hi >= row.len else scan.next_boundary(max(hi, int(begin[k]) + tot), row.len)
    lab0 = (nc == 0) | (U[:, 0] < 0.5)
    pick = j0 + np.minimum((U[:, 1] * nc).astype(np.int64), nc - 1)
    a_end = np.where(nc == 0, end_idx, bpos[np.clip(pick, 0, max(nb - 1, 0))] if nb else 0)
    b_begin, b_end = a_end.copy(), end_idx.copy()  # label 1: B is the true continuation
    # label 0: B is a random span of the row, extended to sentence boundaries (read around it: one pread per window)
    z = np.flatnonzero(lab0)
    w = min(tot + 2 * _CHUNK, row.len)
    cs = np.zeros(len(z), np.int64)
    chunk_t = np.empty((0, w), blk_t.dtype)
    if len(z):
        b_len = np.maximum(1, tot - (a_end[z] - begin[z]))
        bb = np.minimum((U[z, 2] * (row.len - b_len)).astype(np.int64), row.len - 1 - b_len)
        be = bb + b_len
        cs = np.clip(bb - _CHUNK, 0, row.len - w)
        chunk_t, chunk_s = row.read_many(cs, w)
        d = chunk_s[:, 1:] != chunk_s[:, :-1]  # boundary at row position cs + q, q = 1..w-1
        q = np.arange(1, w)[None, :]
        m = d & (q <= (bb - cs)[:, None])  # largest boundary <= bb
        has = m.any(1)
        prev = np.where(has, cs + (w - 1) - np.argmax(m[:, ::-1], 1), 0)
        bad = ~has & (cs > 0)
        limit = row.len - 1
        m = d & (q >= (be - cs)[:, None]) & (q < (limit - cs)[:, None])  # smallest boundary >= be, < limit
        has = m.any(1)
        nxt = np.where(has, cs + 1 + np.argmax(m, 1), limit)
        nxt = np.where(be < limit, nxt, be)
        bad2 = (be < limit) & ~has & (cs + w < limit)
        for k in np.flatnonzero(bad | bad2).tolist():
            if bad[k]:
                prev[k] = scan.prev_boundary(int(bb[k]))
            if bad2[k]:
                nxt[k] = scan.next_boundary(int(be[k]), limit)
        b_begin[z], b_end[z] = prev, nxt
    la, lb = trim_lengths_np(a_end - begin, b_end - b_begin, tot)
    if len(z):  # B outside its chunk (boundary found by a longer scan): read a chunk starting at B
        out_of = (b_begin[z] < cs) | (b_begin[z] + lb[z] > cs + w)
        if out_of.any():
            o = np.flatnonzero(out_of)
            cs[o] = np.minimum(b_begin[z[o]], row.len - w)
            chunk_t = chunk_t.copy()
            chunk_t[o] = row.read_many(cs[o], w)[0]
    # assemble: [inp | A] is row[i : i + R + la] (in the block), B is right-aligned before the final <sep> <cls>
    # (|A| + |B| = tot): both read as rows of a sliding window over one buffer, then merged at R + la
    src = np.concatenate([np.zeros(L, blk_t.dtype), blk_t, chunk_t.reshape(-1)])
    off_b = b_begin - lo + L
    if len(z):
        off_b[z] = L + len(blk_t) + np.arange(len(z)) * w + (b_begin[z] - cs)
    win = np.lib.stride_tricks.sliding_window_view(src, L - 2)
    out = np.empty((n, L), blk_t.dtype)
    out[:, : L - 2] = win[i - lo + L]
    np.copyto(out[:, : L - 2], win[off_b - (R + la + 1)], where=np.arange(L - 2)[None, :] > (R + la)[:, None])
    out[np.arange(n), R + la] = SEP_ID
    out[:, L - 2] = SEP_ID
    out[:, L - 1] = CLS_ID
    return out, la, (~lab0).astype(np.uint8)


def build_rows(
    rows: Sequence[Row], rngs: Sequence[np.random.Generator], p: _Params, ws_table: np.ndarray, s0: int, s1: int
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Examples of steps s0..s1 of several rows, masks sampled for all their segments at once.

    Each row draws from its own generator in a fixed order (split uniforms, then the mask uniforms of each part), and
    a segment's mask depends only on its own draws: the output is the same however rows are grouped (workers)."""
    L, R = p.seq_len, p.reuse_len
    goal1 = p.num_predict // 2
    goal0 = p.num_predict - goal1
    n = s1 - s0
    built, d0, d1 = [], [], []
    for row, rng in zip(rows, rngs):
        built.append(split_block(row, p, rng.random((n, 3)), s0, s1))
        d0.append(rng.random((n, mask_draw_width(goal0))))
        d1.append(rng.random((n, mask_draw_width(goal1))))

    def reading_order(a: int, b: int) -> np.ndarray:  # segments in reading order (backward rows flipped back)
        return np.concatenate([t[:, a:b][:, ::-1] if row.reverse else t[:, a:b] for row, (t, _, _) in zip(rows, built)])

    m0 = masks_from_draws(reading_order(0, R), ws_table, goal0, p.alpha, p.beta, p.mode, np.concatenate(d0))
    m1 = masks_from_draws(reading_order(R, L), ws_table, goal1, p.alpha, p.beta, p.mode, np.concatenate(d1))
    out = []
    for k, (row, (t, alen, label)) in enumerate(zip(rows, built)):
        masked = np.empty((n, L), bool)
        a, b = m0[k * n : (k + 1) * n], m1[k * n : (k + 1) * n]
        masked[:, :R] = a[:, ::-1] if row.reverse else a
        masked[:, R:] = b[:, ::-1] if row.reverse else b
        out.append((t, alen, label, masked))
    return out


def build_row(
    row: Row, steps: int, p: _Params, rng: np.random.Generator, ws_table: np.ndarray, s0: int = 0, s1: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Examples of steps s0..s1 of one row: tokens [n, L], alen [n], label [n], masked [n, L] bool."""
    return build_rows([row], [rng], p, ws_table, s0, steps if s1 is None else s1)[0]


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
        srcs = [row_source(g, job.bi_data, job.micro_batch_size) for g in job.rows]
        rows = [Row(stream, f, job.row_len, rev) for f, rev in srcs]
        rngs = [_row_rng(job.params.seed, job.split, job.pass_id, g) for g in job.rows]
        for s0 in range(0, job.steps, STEP_BLOCK):
            s1 = min(job.steps, s0 + STEP_BLOCK)
            for g, (tok, alen, label, masked) in zip(job.rows, build_rows(rows, rngs, job.params, ws_table, s0, s1)):
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
    verify: bool = True,
) -> dict:
    """Build records from a shard directory; returns meta.json's content.

    ``verify`` checks every shard file's sha256 against manifest.json first (a flipped byte is refused, naming the
    file, instead of being trained on)."""
    shards = Path(shards)
    check_output_not_input(out, [shards])
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
    if verify:
        from .shard import verify_shards

        verify_shards(shards, manifest, workers=workers)

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
        # a checksum per records file: pretraining refuses a file damaged on disk instead of training on it
        meta["sha256"] = {f.relative_to(tmp).as_posix(): sha256_file(f)
                          for f in sorted(tmp.glob("*/pass_*.npy"))}
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
        for name in ("tokens", "alen", "label", "masked"):
            p = records_dir / f"{prefix}.{name}.npy"
            want = digests.get(f"{prefix}.{name}.npy")
            if verify and want is not None and p.is_file():
                st = p.stat()
                key = (str(p.resolve()), st.st_size, st.st_mtime_ns, want)
                if key not in _VERIFIED:  # once per process (evaluation reopens the valid split)
                    if sha256_file(p) != want:
                        raise DataError(f"records file {p} does not match the checksum in meta.json (damaged on "
                                        "disk); rerun `xlnet preprocess`")
                    _VERIFIED.add(key)
            try:
                arrays.append(np.load(p, mmap_mode="r"))
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read records file {p}: {e}; rerun `xlnet preprocess`") from None
        out.append(PassRecords(*arrays))
    return meta, out
