"""Tokenizer training at scale (data/tokenizer/sample.py, train.py): the sample drawn while reading is the longest
prefix by key within both limits, the same for any number of workers and any chunk timing; a corpus that fits is
kept whole in input order; only the sample reaches the disk; the model's bytes are reproducible."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from clitools import CORPUS, settings_config

from xlnetcli.core.errors import DataError
from xlnetcli.data.corpus.reader import ReadStats, iter_lines
from xlnetcli.data.tokenizer import normalize_text, train_tokenizer
from xlnetcli.data.tokenizer.sample import SampleLimits, iter_line_blocks, sample_chunk, sample_corpus


def _lines(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "  epsilon", "zeta\t", "\u00e9t\u00e9", "\u4e2d\u6587", ""]
    return [" ".join(rng.choice(words, int(rng.integers(0, 40)))) for _ in range(n)]


def _blocks(lines: list[str], per: int) -> list[str]:
    return ["\n".join(lines[i : i + per]) for i in range(0, len(lines), per)]


def _reference(blocks: list[str], lim: SampleLimits) -> list[str]:
    """The definition: every non-empty line with its key, sorted by key, the longest prefix within both limits,
    in input order."""
    rows = []
    for i, text in enumerate(blocks):
        keys = np.random.default_rng([lim.seed, i]).random(len(text.split("\n")))
        for j, line in enumerate(text.split("\n")):
            s = normalize_text(line)
            if s and len(s.encode()) <= lim.max_line_bytes:
                rows.append((keys[j], i, j, s))
    by_key = sorted(rows)
    n = size = 0
    keep = []
    for _key, i, j, s in by_key:
        n, size = n + 1, size + len(s.encode()) + 1
        if (lim.lines and n > lim.lines) or (lim.nbytes and size > lim.nbytes):
            break
        keep.append((i, j, s))
    return [s for _, _, s in sorted(keep)]


@pytest.mark.parametrize("limits", [(300, 0), (0, 6000), (500, 9000), (0, 0), (10**6, 10**9)])
def test_sample_is_the_key_prefix_for_any_workers(limits):
    lines = _lines(3000)
    blocks = _blocks(lines, 97)
    lim = SampleLimits(limits[0], limits[1], seed=7, max_line_bytes=150)
    want = _reference(blocks, lim)
    for workers in (1, 2, 3):
        got = sample_corpus(iter(blocks), lim, False, False, workers)
        assert got.lines == want
        assert got.n_sample_lines == len(want)
        assert got.nbytes == sum(len(s.encode()) + 1 for s in want)
        assert got.corpus_lines == sum(1 for line in lines if normalize_text(line))
    if limits[0] == 0 and limits[1] == 0:  # no limit: every line that fits SentencePiece, in input order
        assert want == [s for s in map(normalize_text, lines) if s and len(s.encode()) <= 150]


def test_sample_changes_with_the_seed_only():
    blocks = _blocks(_lines(2000), 50)
    a, b, c = (sample_corpus(iter(blocks), SampleLimits(200, 0, seed, 10**6), False, False) for seed in (1, 1, 2))
    assert a.lines == b.lines != c.lines


def test_a_stale_threshold_in_a_worker_changes_nothing():
    """A worker filters with the threshold known when the chunk was sent (higher than the final one): the parent's
    compaction ends at the same sample."""
    lim = SampleLimits(0, 3000, 3, 10**6)
    blocks = _blocks(_lines(1000), 40)
    full = [sample_chunk(i, t, lim, False, False, 1.0)[0] for i, t in enumerate(blocks)]
    assert all(len(c.lines) for c in full)
    want = sample_corpus(iter(blocks), lim, False, False).lines
    from xlnetcli.data.tokenizer.sample import _Reservoir

    res = _Reservoir(lim)
    for c in full:
        res.add(c)
    res.compact()
    assert res.lines == want


def test_blocks_are_the_lines_of_iter_lines(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one\n\ntwo  three\nno newline at the end", encoding="utf-8")
    g = tmp_path / "b.txt"
    g.write_text("x\n" * 300_000, encoding="utf-8")  # several read blocks
    joined = "\n".join(iter_line_blocks([f, g], ReadStats(), None, "text")).split("\n")
    assert joined == list(iter_lines([f, g]))


@pytest.mark.slow
def test_tiny_preset_trains_on_the_whole_corpus_in_order(tmp_path):
    """The bundled corpus fits any limit: the model is the one trained on every normalised line in input order, its
    bytes the same for 1 and 2 workers and from run to run (the trainer's temporary paths are not recorded)."""
    from xlnetcli.config import load_config

    cfg = load_config("tiny", ["tokenizer.vocab_size=1200"])
    shas = []
    for workers in (1, 2):
        tok = train_tokenizer(cfg, [CORPUS], tmp_path / f"w{workers}", quiet=True, workers=workers)
        shas.append(hashlib.sha256((tmp_path / f"w{workers}" / "spiece.model").read_bytes()).hexdigest())
        meta = tok.meta["train"]
        assert meta["sample_lines"] == meta["lines"] == sum(1 for s in iter_lines([CORPUS]) if normalize_text(s))
        assert meta["input_sentence_bytes"] == cfg.tokenizer.input_sentence_bytes
    assert shas[0] == shas[1]
    assert b"/tmp" not in (tmp_path / "w1" / "spiece.model").read_bytes()


def test_byte_limit_bounds_the_sample_and_the_temporary_file(tmp_path):
    cfg = settings_config("tokenizer", vocab_size=600, input_sentence_bytes=200_000, threads=1)
    tok = train_tokenizer(cfg, [CORPUS], tmp_path / "tok", quiet=True)
    meta = json.loads((tmp_path / "tok" / "xlnet_tokenizer.json").read_text())["train"]
    assert 190_000 < meta["sample_bytes"] <= 200_000 < meta["bytes"]
    assert meta["sample_lines"] < meta["lines"]
    assert tok.vocab_size == 600


def test_every_line_too_long_is_one_error(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text(("word " * 10_000 + "\n") * 3, encoding="utf-8")
    with pytest.raises(DataError, match="longer than 32768 bytes"):
        train_tokenizer(settings_config("tokenizer", vocab_size=100), [f], tmp_path / "o", quiet=True)
    assert not (tmp_path / "o").exists()
