"""Sentence-boundary scans of a row (segments._RowScanner): the same answers as a brute-force search, and a long
sentence-free stretch read once per row, not once per window that looks into it (a 1.3M-token line once made
`preprocess --config tiny` take 496 s for 5 MB instead of 1.2 s)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from xlnetcli.data.records.segments import Row, _RowScanner, _Stretches


class CountingStream:
    def __init__(self, sid: np.ndarray):
        self.tok = np.zeros(len(sid), np.uint16)
        self.sid, self.tokens_read = sid, 0

    def read(self, a, b):
        self.tokens_read += max(0, b - a)
        return self.tok[a:b], self.sid[a:b]


def _boundaries(sid: np.ndarray) -> np.ndarray:
    return np.flatnonzero(sid[1:] != sid[:-1]) + 1


def _sids(rng: np.random.Generator, n: int, long_runs: int) -> np.ndarray:
    """Sentence ids with short sentences and a few runs thousands of tokens long."""
    change = rng.random(n) < 0.1
    for _ in range(long_runs):
        a = int(rng.integers(0, n))
        change[a : a + int(rng.integers(500, 5000))] = False
    return (np.cumsum(change) % 2).astype(np.uint8)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(0, 6), st.booleans())
def test_scans_match_a_brute_force_search_in_any_order(seed, long_runs, reverse):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2000, 20000))
    sid = _sids(rng, n, long_runs)
    row = Row(CountingStream(sid), 0, n, reverse)
    seen = sid[::-1] if reverse else sid
    bounds = _boundaries(seen)
    scan = _RowScanner(row, 64)
    for p in rng.integers(1, n, 300).tolist():
        limit = int(rng.choice([n, n - 1]))
        after = bounds[(bounds >= p) & (bounds < limit)]
        assert scan.next_boundary(p, limit) == (int(after[0]) if len(after) else limit)
        before = bounds[bounds <= p]
        assert scan.prev_boundary(p) == (int(before[-1]) if len(before) else 0)
    for a, b in zip(row.no_boundary.starts, row.no_boundary.ends, strict=True):
        assert not ((bounds >= a) & (bounds < b)).any()  # what was learnt is true


def test_a_long_sentence_free_line_is_read_once_per_row():
    n, line = 400_000, (1000, 301_000)  # one 300K-token line among short sentences
    change = np.arange(n) % 20 == 0
    change[line[0] : line[1]] = False
    change[[line[0], line[1]]] = True
    sid = (np.cumsum(change) % 2).astype(np.uint8)
    stream = CountingStream(sid)
    row = Row(stream, 0, n, False)
    scan = _RowScanner(row, 2048)
    queries = 0
    for p in range(line[0] + 1, line[1], 256):  # every window inside the line asks for the boundary after it
        assert scan.next_boundary(p, n) == line[1]
        queries += 1
    for p in range(line[0] + 128, line[1], 997):  # random B spans inside it ask for the one before
        assert scan.prev_boundary(p) == line[0]
        queries += 1
    # the line once or twice, then one chunk per query to see the boundary at its end (without: about 2e8 tokens)
    assert stream.tokens_read < 2 * (line[1] - line[0]) + queries * (2048 + 1)


def test_stretches_merge_when_they_touch_or_overlap():
    s = _Stretches()
    for a, b in [(10, 20), (30, 40), (20, 25), (50, 60), (35, 52), (0, 5)]:
        s.add(a, b)
    assert list(zip(s.starts, s.ends, strict=True)) == [(0, 5), (10, 25), (30, 60)]
    assert s.find(24) == (10, 25) and s.find(25) is None and s.find(59) == (30, 60) and s.find(7) is None
