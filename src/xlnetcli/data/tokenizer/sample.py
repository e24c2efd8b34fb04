"""The training sample of `xlnet tokenize train`: normalised lines drawn while the corpus is read, never a full copy.

    sample = sample_corpus(files, SampleLimits(lines=10_000_000, nbytes=64 << 20, seed=42), uncased=False,
                           keep_accents=False, workers=2)
    sample.lines        # the sampled normalised lines, in input order

The corpus is read in blocks of whole lines (chunk i); ``workers`` processes normalise them (the parent is one of
them). Every raw line gets a uniform key from a generator seeded by (seed, chunk index), so a line's key depends only
on the inputs and the seed. The sample is the longest prefix of the lines sorted by key that fits both limits (lines
and UTF-8 bytes): a uniform sample without bias towards short lines, kept in input order. It is found while reading
(bottom-k by key): the parent keeps at most ``SLACK`` x the limits and compacts when over; a line whose key is at or
above the key of a line already dropped can no longer be in the sample and is dropped at once, in the worker. So the
sample is the same for any number of workers and any timing, and a corpus that fits keeps every line in input order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from xlnetcli.core.workers import ordered_map
from xlnetcli.data.corpus.inputs import Source
from xlnetcli.data.corpus.reader import FileStats, ReadStats, iter_file_text
from xlnetcli.data.tokenizer.normalize import combining_table, normalize_block

SLACK = 1.25  # the parent holds up to this many times the limits between compactions
NEWLINE = 10


@dataclass(frozen=True)
class SampleLimits:
    lines: int  # most lines in the sample (0 = no limit)
    nbytes: int  # most UTF-8 bytes in the sample, newlines included (0 = no limit)
    seed: int
    max_line_bytes: int  # longer lines are left out (SentencePiece would skip them)


@dataclass
class ChunkSample:
    """What normalising one chunk gives: counts of all its non-empty lines, and the lines still candidates."""

    index: int
    n_lines: int  # non-empty normalised lines
    n_chars: int  # their characters, one newline each included
    keys: np.ndarray  # float64 [k]
    nbytes: np.ndarray  # int64 [k]: UTF-8 bytes + 1
    lines: list[str]


@dataclass
class Sample:
    """The sampled lines in input order, and counts over the whole normalised corpus."""

    lines: list[str] = field(default_factory=list)
    nbytes: int = 0  # UTF-8 bytes of the sample, one newline per line included
    n_sample_lines: int = 0
    corpus_lines: int = 0
    corpus_chars: int = 0
    too_long: int = 0  # lines left out for being longer than max_line_bytes


def sample_chunk(
    index: int, text: str, lim: SampleLimits, uncased: bool, keep_accents: bool, below: float
) -> tuple[ChunkSample, int]:
    """Normalise one chunk of whole lines: (its ChunkSample with the non-empty lines whose key is below ``below``
    and that are not too long, the number of lines too long)."""
    norm = normalize_block(text, uncased, keep_accents)
    keys = np.random.default_rng([lim.seed, index]).random(len(norm))
    lens = np.fromiter(map(len, norm), np.int64, len(norm))
    keep = (lens > 0) & (keys < below)
    too_long = [i for i in np.flatnonzero(lens > lim.max_line_bytes // 4).tolist() if _too_long(norm[i], lim)]
    keep[too_long] = False  # a character is at most 4 UTF-8 bytes: only longer lines are measured
    cand = np.flatnonzero(keep)
    lines = [norm[i] for i in cand.tolist()]
    n = int((lens > 0).sum())
    return ChunkSample(index, n, int(lens.sum()) + n, keys[cand], _utf8_sizes(lines), lines), len(too_long)


def _too_long(line: str, lim: SampleLimits) -> bool:
    return len(line.encode("utf-8")) > lim.max_line_bytes


def _utf8_sizes(lines: list[str]) -> np.ndarray:
    """UTF-8 bytes of each line plus one (its newline)."""
    if not lines:
        return np.zeros(0, np.int64)
    b = np.frombuffer(("\n".join(lines) + "\n").encode("utf-8"), np.uint8)
    ends = np.flatnonzero(b == NEWLINE)
    return np.diff(ends, prepend=-1).astype(np.int64)


class _Reservoir:
    """Bottom-k by key under a line and a byte limit: candidates in input order, compacted when over SLACK x."""

    def __init__(self, lim: SampleLimits) -> None:
        self.lim = lim
        self.threshold = 1.0  # keys at or above it are out for good
        self.lines: list[str] = []
        self.keys: list[np.ndarray] = []
        self.nbytes: list[np.ndarray] = []
        self.n = self.size = 0

    def add(self, res: ChunkSample) -> None:
        keep = res.keys < self.threshold
        lines = res.lines if keep.all() else [s for s, k in zip(res.lines, keep.tolist(), strict=True) if k]
        self.lines += lines
        self.keys.append(res.keys[keep])
        self.nbytes.append(res.nbytes[keep])
        self.n += len(lines)
        self.size += int(self.nbytes[-1].sum())
        lim = self.lim
        if (lim.lines and self.n > SLACK * lim.lines) or (lim.nbytes and self.size > SLACK * lim.nbytes):
            self.compact()

    def compact(self) -> None:
        """Keep the longest prefix by key that fits the limits (in input order); the first key left out becomes the
        threshold."""
        keys, nbytes = np.concatenate(self.keys or [np.zeros(0)]), np.concatenate(self.nbytes or [np.zeros(0, int)])
        order = np.argsort(keys, kind="stable")
        fits = np.ones(len(keys), bool)
        if self.lim.lines:
            fits &= np.arange(1, len(keys) + 1) <= self.lim.lines
        if self.lim.nbytes:
            fits &= np.cumsum(nbytes[order]) <= self.lim.nbytes
        cut = int(fits.sum())  # both cumulative counts grow along ``order``: the fitting ones are a prefix
        if cut < len(keys):
            self.threshold = min(self.threshold, float(keys[order[cut]]))
            kept = np.sort(order[:cut])
            self.lines = [self.lines[i] for i in kept.tolist()]
            keys, nbytes = keys[kept], nbytes[kept]
        self.keys, self.nbytes = [keys], [nbytes]
        self.n, self.size = len(self.lines), int(nbytes.sum())


def iter_line_blocks(
    files: Iterable[Source], stats: ReadStats, on_bytes: Callable[[int], None] | None, text_field: str
):
    """Blocks of whole lines of all inputs in order (data/corpus/reader.py's iter_lines, joined)."""
    for path in files:
        fs = FileStats(path)
        stats.files.append(fs)
        tail = ""
        for text in iter_file_text(path, fs, on_bytes, text_field=text_field):
            text = tail + text
            cut = text.rfind("\n")
            if cut < 0:
                tail = text
                continue
            tail = text[cut + 1 :]
            yield text[:cut]
        if tail:
            yield tail


_WORKER: tuple[SampleLimits, bool, bool] | None = None


def _init_worker(lim: SampleLimits, uncased: bool, keep_accents: bool) -> None:
    global _WORKER
    _WORKER = (lim, uncased, keep_accents)


def _work(item: tuple[int, str, float]) -> tuple[ChunkSample, int]:
    assert _WORKER is not None
    index, text, below = item
    return sample_chunk(index, text, *_WORKER, below)


def sample_corpus(
    blocks: Iterable[str], lim: SampleLimits, uncased: bool, keep_accents: bool, workers: int = 1
) -> Sample:
    """Normalise ``blocks`` (iter_line_blocks) with ``workers`` processes and draw the sample (module doc)."""
    res = _Reservoir(lim)
    out = Sample()
    for chunk, too_long in _normalised(blocks, lim, uncased, keep_accents, workers, res):
        out.corpus_lines += chunk.n_lines
        out.corpus_chars += chunk.n_chars
        out.too_long += too_long
        res.add(chunk)
    res.compact()
    out.lines, out.nbytes, out.n_sample_lines = res.lines, res.size, len(res.lines)
    return out


def _normalised(
    blocks: Iterable[str], lim: SampleLimits, uncased: bool, keep_accents: bool, workers: int, res: _Reservoir
) -> Iterator[tuple[ChunkSample, int]]:
    """Each block's ChunkSample in input order; with workers > 1, helpers normalise while the parent reads, and the
    parent normalises a block itself when they are busy. The threshold sent with a block is the current one."""
    combining_table()  # built once here, inherited by forked helpers

    def here(item: tuple[int, str, float]) -> tuple[ChunkSample, int]:
        return sample_chunk(*item[:2], lim, uncased, keep_accents, item[2])

    items = ((i, text, res.threshold) for i, text in enumerate(blocks))  # the threshold when the block is sent
    yield from ordered_map(
        _work, items, helpers=workers - 1, local=here, initializer=_init_worker, initargs=(lim, uncased, keep_accents)
    )
