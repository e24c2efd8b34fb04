"""The A/B split: each window ``inp`` of a row is followed by two text segments (the original ``_split_a_and_b``).

    tokens, alen, label, bstart = split_block(row, seq_len, reuse_len, U, s0, s1)     # windows s0..s1 of one row

``[inp | A | <sep> | B | <sep> | <cls>]`` with |inp| = reuse_len and |A| + |B| = seq_len - reuse_len - 3 exactly
(docs/xlnet.md §3): A ends at a sentence boundary after the window; B is its true continuation (label 1) or, with
probability 1/2, a random span of the row extended to sentence boundaries (label 0); the longer of A, B is trimmed
(``trim_lengths``). The scans are done on sentence-boundary positions, vectorised over the windows of a block.
Window s (i = s * reuse_len) reads ``row[i : i + reuse_len + |A|]``, <sep>, ``row[bstart : bstart + |B|]``, <sep>,
<cls> (row positions): (|A|, bstart) give the tokens back from the row (record_format.py stores only those).
A ``Row`` is one contiguous row of a pass's token stream (shard_format.PassStream), read forward or time-reversed.
"""

from __future__ import annotations

import bisect

import numpy as np

from xlnetcli.data.shards.format import PassStream
from xlnetcli.data.special import CLS_ID, SEP_ID


class Row:
    """Row ``f`` of ``n_rows`` contiguous rows of a stream, optionally time-reversed (bi_data)."""

    def __init__(self, stream: PassStream, f: int, row_len: int, reverse: bool):
        self.stream, self.base, self.len, self.reverse = stream, f * row_len, row_len, reverse
        self.no_boundary = _Stretches()  # long stretches found without a sentence boundary (_RowScanner)

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
            return (
                np.array([t for t, _ in pairs]).reshape(-1, width),
                np.array([s for _, s in pairs], np.uint8).reshape(-1, width),
            )
        if not self.reverse:
            return self.stream.read_many(self.base + starts, width)
        t, s = self.stream.read_many(self.base + self.len - starts - width, width)
        return t[:, ::-1], s[:, ::-1]


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


class _Stretches:
    """Disjoint row ranges [a, b) known to hold no sentence boundary, sorted; touching or overlapping ones merged."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def find(self, p: int) -> tuple[int, int] | None:
        """The stretch holding position p, if any."""
        k = bisect.bisect_right(self.starts, p) - 1
        return (self.starts[k], self.ends[k]) if k >= 0 and p < self.ends[k] else None

    def add(self, a: int, b: int) -> None:
        lo = bisect.bisect_left(self.ends, a)  # the first stretch ending at or after a
        hi = bisect.bisect_right(self.starts, b)  # the stretches starting at or before b
        if lo < hi:
            a, b = min(a, self.starts[lo]), max(b, self.ends[hi - 1])
        self.starts[lo:hi], self.ends[lo:hi] = [a], [b]


class _RowScanner:
    """Finds sentence boundaries of a row by reading on from a position, in chunks.

    A scan that crosses more than one chunk without a boundary records the stretch it crossed on the row
    (``Row.no_boundary``), and later scans jump over it: a sentence-free line of a million tokens (a table, a
    PostScript dump) is read once per row, not once per window that looks into it."""

    def __init__(self, row: Row, chunk: int):
        self.row, self.chunk = row, chunk

    def next_boundary(self, p: int, limit: int) -> int:
        """Smallest boundary q >= p (q <= limit - 1), else ``limit``."""
        start = p
        while p < limit:
            known = self.row.no_boundary.find(p)
            if known is not None:
                p = known[1]
                continue
            hi = min(limit, p + self.chunk)
            _, s = self.row.read(p - 1, hi)
            bs = _boundaries(s, p - 1)
            if len(bs):
                self._learn(start, int(bs[0]))
                return int(bs[0])
            p = hi
        self._learn(start, p)
        return limit

    def prev_boundary(self, p: int) -> int:
        """Largest boundary q <= p, else 0."""
        end = p + 1
        while p > 0:
            known = self.row.no_boundary.find(p)
            if known is not None:
                p = known[0] - 1
                continue
            lo = max(0, p - self.chunk)
            _, s = self.row.read(lo, p + 1)
            bs = _boundaries(s, lo)
            if len(bs):
                self._learn(int(bs[-1]) + 1, end)
                return int(bs[-1])
            p = lo
        self._learn(1, end)
        return 0

    def _learn(self, a: int, b: int) -> None:
        """No boundary in [a, b): worth keeping when it is longer than a chunk."""
        if b - a > self.chunk:
            self.row.no_boundary.add(a, b)


_CHUNK = 128  # tokens read either side of a random B span to find its sentence boundaries (scan further if needed)


def split_block(
    row: Row, seq_len: int, reuse_len: int, U: np.ndarray, s0: int, s1: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A/B split of the windows s0..s1 of one row (original _split_a_and_b), vectorised over the windows.

    ``U`` [n, 3]: per window, the uniforms for (random B?, A's cut point, B's random begin).
    Returns tokens [n, L] = [inp | A | <sep> | B | <sep> | <cls>], alen [n], label [n], bstart [n] (B's first row
    position: A's end before trimming for a true continuation, else where the random span begins)."""
    L, R = seq_len, reuse_len
    tot = L - R - 3
    n = s1 - s0
    lo = s0 * R
    hi = min(row.len, (s1 - 1) * R + L + 2 * tot + 64)
    blk_t, blk_s = row.read(lo, hi)
    bpos = _boundaries(blk_s, lo)
    scan = _RowScanner(row, 4 * L)
    i = (s0 + np.arange(n, dtype=np.int64)) * R
    begin = i + R
    a_end, end_idx, lab0 = _cut_a(row, bpos, begin, tot, hi, scan, U)
    b_begin, b_end = a_end.copy(), end_idx.copy()  # label 1: B is the true continuation
    z = np.flatnonzero(lab0)
    w = min(tot + 2 * _CHUNK, row.len)
    b_chunks = _RandomB(row, z, w, tot - (a_end[z] - begin[z]), U[z, 2], scan, blk_t.dtype)
    b_begin[z], b_end[z] = b_chunks.begin, b_chunks.end
    la, lb = trim_lengths_np(a_end - begin, b_end - b_begin, tot)
    b_chunks.cover(b_begin[z], lb[z])
    # assemble: [inp | A] is row[i : i + R + la] (in the block), B is right-aligned before the final <sep> <cls>
    # (|A| + |B| = tot): both read as rows of a sliding window over one buffer, then merged at R + la
    src = np.concatenate([np.zeros(L, blk_t.dtype), blk_t, b_chunks.tokens.reshape(-1)])
    off_b = b_begin - lo + L
    if len(z):
        off_b[z] = L + len(blk_t) + np.arange(len(z)) * w + (b_begin[z] - b_chunks.starts)
    win = np.lib.stride_tricks.sliding_window_view(src, L - 2)
    out = np.empty((n, L), blk_t.dtype)
    out[:, : L - 2] = win[i - lo + L]
    np.copyto(out[:, : L - 2], win[off_b - (R + la + 1)], where=np.arange(L - 2)[None, :] > (R + la)[:, None])
    out[np.arange(n), R + la] = SEP_ID
    out[:, L - 2] = SEP_ID
    out[:, L - 1] = CLS_ID
    return out, la, (~lab0).astype(np.uint8), b_begin


def _cut_a(
    row: Row, bpos: np.ndarray, begin: np.ndarray, tot: int, hi: int, scan: _RowScanner, U: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A's end, the first boundary at or after begin + tot, label-0 windows) per window starting A at ``begin``.

    A ends at a sentence boundary in (begin, begin + tot) drawn uniformly (U[:, 1]); with none, A runs to the first
    boundary after and B is random (label 0), as it is with probability 1/2 (U[:, 0]). ``bpos``: the boundaries of
    the block read up to ``hi``; beyond it ``scan`` reads on."""
    nb = len(bpos)
    j0 = np.searchsorted(bpos, begin + 1, "left")  # cut points: boundaries in (begin, begin + tot)
    j1 = np.searchsorted(bpos, begin + tot, "left")
    nc = j1 - j0
    end_idx = np.empty(len(begin), np.int64)  # first boundary at or after begin + tot
    inb = j1 < nb
    end_idx[inb] = bpos[j1[inb]]
    for k in np.flatnonzero(~inb).tolist():
        end_idx[k] = row.len if hi >= row.len else scan.next_boundary(max(hi, int(begin[k]) + tot), row.len)
    lab0 = (nc == 0) | (U[:, 0] < 0.5)
    pick = j0 + np.minimum((U[:, 1] * nc).astype(np.int64), nc - 1)
    a_end = np.where(nc == 0, end_idx, bpos[np.clip(pick, 0, max(nb - 1, 0))] if nb else 0)
    return a_end, end_idx, lab0


class _RandomB:
    """Label-0 B segments: a random span of the row of ``tot - |A|`` tokens (at least 1), extended to sentence
    boundaries. Each is read with ``_CHUNK`` tokens either side, one pread per window, into ``tokens`` [k, width]
    starting at row positions ``starts``; a boundary outside that chunk is found by a longer scan."""

    def __init__(
        self,
        row: Row,
        windows: np.ndarray,
        width: int,
        want: np.ndarray,
        u_begin: np.ndarray,
        scan: _RowScanner,
        dtype: np.dtype,
    ) -> None:
        self.row, self.width = row, width
        self.starts = np.zeros(len(windows), np.int64)
        self.tokens = np.empty((0, width), dtype)
        self.begin = self.end = np.zeros(0, np.int64)
        if not len(windows):
            return
        w = width
        b_len = np.maximum(1, want)
        bb = np.minimum((u_begin * (row.len - b_len)).astype(np.int64), row.len - 1 - b_len)
        be = bb + b_len
        cs = self.starts = np.clip(bb - _CHUNK, 0, row.len - w)
        self.tokens, chunk_s = row.read_many(cs, w)
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
        self.begin, self.end = prev, nxt

    def cover(self, b_begin: np.ndarray, b_len: np.ndarray) -> None:
        """Re-read the chunk of a trimmed B [b_begin, b_begin + b_len) that its chunk does not hold (its boundary was
        found by a longer scan), starting at B."""
        if not len(b_begin):
            return
        out_of = (b_begin < self.starts) | (b_begin + b_len > self.starts + self.width)
        if out_of.any():
            o = np.flatnonzero(out_of)
            self.starts[o] = np.minimum(b_begin[o], self.row.len - self.width)
            self.tokens = self.tokens.copy()
            self.tokens[o] = self.row.read_many(self.starts[o], self.width)[0]
