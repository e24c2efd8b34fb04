"""xlnet preprocess: example layout, A/B split, span masking, passes, determinism, bad input (docs/xlnet.md §2-4)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from clitools import TINY, preprocess_cfg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xlnetcli.config import load_config
from xlnetcli.core.errors import ConfigError, DataError
from xlnetcli.data.records.format import open_records, segment_ids
from xlnetcli.data.records.masking import Spans, sample_masks
from xlnetcli.data.records.preprocess import _Params, build_row, preprocess, row_source
from xlnetcli.data.records.segments import Row, trim_lengths
from xlnetcli.data.special import CLS_ID, SEP_ID


def stream_rows(shard_dir: Path, meta: dict, split: str = "train", pass_id: int = 0) -> np.ndarray:
    """Forward rows [n_fwd, row_len] of a pass, rebuilt independently (file order, sentence-id flips)."""
    m = json.loads((shard_dir / "manifest.json").read_text())
    entries = m["splits"][split]
    order = np.random.default_rng([meta["seed"], {"train": 0, "valid": 1}[split], pass_id]).permutation(len(entries))
    toks = np.concatenate([np.load(shard_dir / entries[k]["tokens_file"]) for k in order])
    n_fwd = meta["global_batch_size"] // (2 if meta["bi_data"] else 1)
    rl = meta["splits"][split]["row_len"]
    return toks[: n_fwd * rl].reshape(n_fwd, rl)


def pass_examples(p, meta: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every example of a pass: token ids [G, S, L], masked [G, S, L], alen [G, S] (read back from the shards)."""
    rows = np.arange(meta["global_batch_size"])
    got = [p.examples(rows, s) for s in range(p.alen.shape[1])]
    ids, masked, alen = (np.stack([g[k] for g in got], 1) for k in range(3))
    return ids, masked, alen


# ----------------------------------------------------------------------------------------------------------------
# Records from real text (1.8 MB of Python docs)


def test_meta_records_every_parameter(records):
    meta = json.loads((records / "meta.json").read_text())
    for key in (
        "format_version",
        "seq_len",
        "reuse_len",
        "perm_size",
        "bi_data",
        "num_predict",
        "mask_alpha",
        "mask_beta",
        "mask_mode",
        "tokenizer_sha256",
        "global_batch_size",
        "micro_batch_size",
        "passes",
    ):
        assert key in meta
    assert meta["passes"] == 2 and meta["splits"]["train"]["steps_per_pass"] > 100
    assert (records / "tokenizer" / "spiece.model").is_file() and (records / "config.yaml").is_file()
    # nothing L x L on disk, and no tokens: [G, S] decisions and [G, S, L/8] target bits
    L, G, S = meta["seq_len"], meta["global_batch_size"], meta["splits"]["train"]["steps_per_pass"]
    for f in (records / "train").iterdir():
        assert np.load(f, mmap_mode="r").shape == ((G, S, (L + 7) // 8) if f.name.endswith("masked.npy") else (G, S))


def test_layout_segments_and_targets(records):
    meta, passes = open_records(records)
    L, R, NP = meta["seq_len"], meta["reuse_len"], meta["num_predict"]
    goal1 = NP // 2
    for p in passes:
        tok, masked, alen = (a.reshape(len(a) * a.shape[1], -1) for a in pass_examples(p, meta))
        alen = alen.reshape(-1).astype(np.int64)
        assert (alen == np.asarray(p.alen).reshape(-1)).all()
        rows = np.arange(len(tok))
        # [inp | A | <sep> | B | <sep> | <cls>] with |A| + |B| = L - R - 3, both non-empty
        assert (alen >= 1).all() and (alen <= L - R - 4).all()
        assert (
            (tok[rows, R + alen] == SEP_ID).all()
            and (tok[:, L - 2] == SEP_ID).all()
            and (tok[:, L - 1] == CLS_ID).all()
        )
        func = (tok == SEP_ID) | (tok == CLS_ID)
        assert (func.sum(1) == 3).all()
        seg = segment_ids(alen, L, R)
        assert (seg[:, -1] == 2).all() and (seg[rows, R + alen] == 0).all() and (seg[:, L - 2] == 1).all()
        assert ((np.diff(seg, axis=1) >= 0).all()) and (seg[rows, R + alen + 1] == 1).all()
        # targets: never <sep>/<cls>; goal per part (word mode reaches it on real text)
        assert not (masked & func).any()
        n0, n1 = masked[:, :R].sum(1), masked[:, R:].sum(1)
        assert (n0 <= NP - goal1).all() and (n1 <= goal1).all()
        assert abs((n0 + n1).mean() - NP) <= 0.1 * NP


def test_rows_are_contiguous_streams_and_backward_rows_reverse(records, shard_dir):
    meta, passes = open_records(records)
    L, R, G, mb = meta["seq_len"], meta["reuse_len"], meta["global_batch_size"], meta["micro_batch_size"]
    for pass_id in (0, 1):
        rows = stream_rows(shard_dir, meta, "train", pass_id)
        tok = pass_examples(passes[pass_id], meta)[0]
        alen = np.asarray(passes[pass_id].alen).astype(int)
        label = np.asarray(passes[pass_id].label)
        S = tok.shape[1]
        for g in range(G):
            f, rev = row_source(g, True, mb)
            row = rows[f][::-1] if rev else rows[f]
            # every block: forward half then the same rows reversed
            assert (g % mb >= mb // 2) == rev
            for s in range(0, S, 7):
                i = s * R
                assert (tok[g, s, :R] == row[i : i + R]).all()
                a = alen[g, s]
                assert (tok[g, s, R : R + a] == row[i + R : i + R + a]).all()
                b = tok[g, s, R + a + 1 : L - 2]
                if label[g, s] == 1:  # B continues A (from A's cut point; A may have been trimmed at its end)
                    starts = range(i + R + a, i + L - 3 + 1)
                    assert any((b == row[x : x + len(b)]).all() for x in starts)
        # backward rows are exact reverses of their forward rows: reuse parts line up from the other end
        f0 = stream_rows(shard_dir, meta, "train", pass_id)[0]
        assert (tok[mb // 2, 0, :R] == f0[::-1][:R]).all()
    assert 0.2 < label.mean() < 0.55  # B random half of the time, always when A has no sentence cut point


def test_passes_differ_and_runs_are_deterministic(records, shard_dir, tmp_path):
    _meta, passes = open_records(records)
    assert not np.array_equal(np.asarray(passes[0].masked), np.asarray(passes[1].masked))
    other = tmp_path / "again"
    preprocess(preprocess_cfg("data.passes=2"), shard_dir, other, workers=2, quiet=True)
    for f in sorted((records / "train").iterdir()):
        assert (
            hashlib.sha256(f.read_bytes()).digest() == hashlib.sha256((other / "train" / f.name).read_bytes()).digest()
        )


def test_mask_mode_original_counts_subword_pieces(shard_dir, tmp_path):
    meta = preprocess(preprocess_cfg("data.mask_mode=original"), shard_dir, tmp_path / "o", quiet=True)
    assert meta["mask_mode"] == "original"
    _, passes = open_records(tmp_path / "o")
    L, R, NP = meta["seq_len"], meta["reuse_len"], meta["num_predict"]
    m = np.unpackbits(np.asarray(passes[0].masked), axis=-1, count=L, bitorder="little").reshape(-1, L)
    # the original always selects exactly its goal per part (<sep>/<cls> included; the loader drops those)
    assert (m[:, :R].sum(1) == NP - NP // 2).all() and (m[:, R:].sum(1) == NP // 2).all()


def test_cli_preprocess_and_bad_input(shard_dir, tmp_path, capsys):
    from xlnetcli.cli import main

    cfgf = tmp_path / "c.yaml"
    import yaml

    from xlnetcli.config import config_to_dict

    cfgf.write_text(yaml.safe_dump(config_to_dict(preprocess_cfg())))

    def run(*args):
        with pytest.raises(SystemExit) as e:
            main(["preprocess", "--shards", str(shard_dir), "--config", str(cfgf), *args])
        return e.value.code, capsys.readouterr().err

    code, err = run("--out", str(tmp_path / "ok"), "--passes", "1", "--mask-mode", "original")
    assert code == 0, err
    assert json.loads((tmp_path / "ok" / "meta.json").read_text())["mask_mode"] == "original"
    code, err = run("--out", str(tmp_path / "ok"))
    assert code == 2 and "--overwrite" in err
    # corpus too small: say how many tokens are needed and how many there are
    code, err = run("--out", str(tmp_path / "big"), "--set", "train.global_batch_size=65536")
    assert code == 2 and "need" in err and "tokens" in err and err.count("\n") == 1
    assert not (tmp_path / "big").exists()
    # num_predict larger than possible
    code, err = run(
        "--out",
        str(tmp_path / "np"),
        "--set",
        "model.reuse_len=8",
        "--set",
        "data.perm_size=8",
        "--set",
        "data.num_predict=30",
    )
    assert code == 2 and "num_predict" in err and not (tmp_path / "np").exists()
    # seq_len / reuse_len / perm_size inconsistent
    code, err = run("--out", str(tmp_path / "ps"), "--set", "data.perm_size=24")
    assert code == 2 and "perm_size" in err
    # odd per-device batch with bi_data
    code, err = run(
        "--out", str(tmp_path / "odd"), "--set", "train.micro_batch_size=3", "--set", "train.global_batch_size=9"
    )
    assert code == 2 and "even" in err


def test_bad_shards(shard_dir, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(shard_dir, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["tokenizer_sha256"] = "0" * 64
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="another tokenizer"):
        preprocess(preprocess_cfg(), bad, tmp_path / "x", quiet=True)
    with pytest.raises(DataError, match="vocab"):
        preprocess(
            load_config(None, ["train.micro_batch_size=4", "train.global_batch_size=8"]),
            shard_dir,
            tmp_path / "y",
            quiet=True,
        )
    with pytest.raises(DataError, match="shard"):
        preprocess(preprocess_cfg(), tmp_path / "nothing", tmp_path / "z", quiet=True)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    with pytest.raises(ConfigError):
        preprocess(preprocess_cfg("data.mask_alpha=1", "data.mask_beta=2"), shard_dir, tmp_path / "w", quiet=True)


# ----------------------------------------------------------------------------------------------------------------
# A/B split against a reference written straight from the original loop


def ref_split(tok, sid, begin, tot, u):
    data_len = len(tok)
    end_idx = begin + 1
    cuts = []
    while end_idx < data_len:
        if sid[end_idx] != sid[end_idx - 1]:
            if end_idx - begin >= tot:
                break
            cuts.append(end_idx)
        end_idx += 1
    if not cuts or u[0] < 0.5:
        label = 0
        a_end = end_idx if not cuts else cuts[min(int(u[1] * len(cuts)), len(cuts) - 1)]
        b_len = max(1, tot - (a_end - begin))
        b_begin = min(int(u[2] * (data_len - b_len)), data_len - 1 - b_len)
        b_end = b_begin + b_len
        while b_begin > 0 and sid[b_begin - 1] == sid[b_begin]:
            b_begin -= 1
        while b_end < data_len - 1 and sid[b_end - 1] == sid[b_end]:
            b_end += 1
    else:
        label = 1
        a_end = cuts[min(int(u[1] * len(cuts)), len(cuts) - 1)]
        b_begin, b_end = a_end, end_idx
    while a_end - begin + b_end - b_begin > tot:
        if a_end - begin > b_end - b_begin:
            a_end -= 1
        else:
            b_end -= 1
    return tok[begin:a_end], tok[b_begin:b_end], label


class ArrayStream:
    def __init__(self, tok, sid):
        self.tok, self.sid = tok, sid

    def read(self, a, b):
        return self.tok[a:b], self.sid[a:b]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 40), st.booleans(), st.sampled_from([(16, 8), (24, 12), (40, 16)]))
def test_split_matches_original_loop(seed, mean_sent, reverse, lr):
    L, R = lr
    rng = np.random.default_rng(seed)
    n = int(rng.integers(L, 8 * L))
    tok = rng.integers(9, 100, n).astype(np.uint16)
    sid = (np.cumsum(rng.random(n) < 1.0 / mean_sent) % 2).astype(np.uint8)
    row = Row(ArrayStream(tok, sid), 0, n, reverse)
    steps = (n - L) // R + 1
    p = _Params(L, R, 4, Spans(6, 1, "word"), 0)
    out, alen, label, _, bstart = build_row(row, steps, p, np.random.default_rng(seed), np.ones(100, bool))
    U = np.random.default_rng(seed).random((steps, 3))
    rt, rs = (tok[::-1], sid[::-1]) if reverse else (tok, sid)
    tot = L - R - 3
    for s in range(steps):
        a, b, lab = ref_split(rt, rs, s * R + R, tot, U[s])
        expect = np.concatenate([rt[s * R : s * R + R], a, [SEP_ID], b, [SEP_ID, CLS_ID]])
        assert (out[s] == expect).all() and alen[s] == len(a) and label[s] == lab
        assert (rt[bstart[s] : bstart[s] + len(b)] == b).all()  # what record_format.py stores: B's row position


@given(st.integers(1, 300), st.integers(1, 300), st.integers(2, 300))
def test_trim_closed_form(a, b, tot):
    x, y = a, b
    while x + y > tot:
        if x > y:
            x -= 1
        else:
            y -= 1
    assert trim_lengths(a, b, tot) == (x, y)


# ----------------------------------------------------------------------------------------------------------------
# Span masking properties


def _runs(m):
    d = np.diff(np.concatenate([[0], m.astype(int), [0]]))
    return list(zip(np.flatnonzero(d == 1), np.flatnonzero(d == -1), strict=True))


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 2**31),
    st.integers(8, 120),
    st.integers(1, 30),
    st.booleans(),
    st.sampled_from([(6, 1), (4, 1), (3, 2)]),
    st.booleans(),
)
def test_span_masking_properties(seed, n, goal, reverse, ab, with_func):
    rng = np.random.default_rng(seed)
    vocab = 50
    ws_table = rng.random(vocab) < 0.5
    ws_table[[SEP_ID, CLS_ID]] = True
    seg = rng.integers(9, vocab, (6, n))
    if with_func and n > 3:
        seg[:, -3:] = [SEP_ID, SEP_ID, CLS_ID][::-1] if reverse else [SEP_ID, SEP_ID, CLS_ID]
        seg[:, n // 2] = SEP_ID
    goal = min(goal, n - 4)
    if goal < 1:
        return
    alpha, beta = ab
    func = (seg == SEP_ID) | (seg == CLS_ID)
    for mode in ("word", "original"):
        m = sample_masks(seg, ws_table, goal, Spans(alpha, beta, mode), np.random.default_rng(seed), reverse)
        spans = sample_masks(
            seg, ws_table, goal, Spans(alpha, beta, mode), np.random.default_rng(seed), reverse, top_up=False
        )
        assert (spans <= m).all()
        if mode == "word":
            assert not (m & func).any()
            assert (m.sum(1) == goal).all()  # enough non-functional positions: the goal is always reached
        else:
            assert (m.sum(1) == goal).all()
        for k in range(len(seg)):
            s, sp = (seg[k][::-1], spans[k][::-1]) if reverse else (seg[k], spans[k])
            ws = ws_table[s]
            for a, b in _runs(sp):
                # spans begin at a word start (or right after a dropped <sep>/<cls> in word mode)
                assert ws[a] or (mode == "word" and a > 0 and (s[a - 1] in (SEP_ID, CLS_ID)))
                if mode == "word":  # whole words: the span ends where a word (or <sep>/<cls>) starts
                    assert b == len(s) or ws[b] or s[b] in (SEP_ID, CLS_ID)
                assert b < len(s) or mode == "word"


def test_span_lengths_follow_one_over_n():
    rng = np.random.default_rng(0)
    seg = rng.integers(9, 50, (400, 600))
    ws = np.ones(50, bool)  # every piece a word: span length = n
    spans = sample_masks(seg, ws, 1000, Spans(6, 1, "word"), rng, top_up=False)
    lens = np.array([b - a for k in range(len(seg)) for a, b in _runs(spans[k])])
    freq = np.bincount(lens, minlength=6)[1:6] / len(lens)
    p = (1 / np.arange(1, 6)) / (1 / np.arange(1, 6)).sum()
    assert np.abs(freq - p).max() < 0.03
    # each span of n takes n + n*alpha/beta tokens (context l before it, r = ctx - l after): 1/7 with alpha 6, beta 1
    assert spans.mean() == pytest.approx(1 / 7, rel=0.05)


@pytest.mark.parametrize("max_gram", [1, 3])
def test_max_gram_caps_span_lengths_with_the_same_one_over_n_law(max_gram):
    """data.max_gram: spans of 1..max_gram units, p(n) ∝ 1/n; 1 gives single units (the paper's "- span-based pred")."""
    rng = np.random.default_rng(1)
    seg = rng.integers(9, 50, (400, 600))
    ws = np.ones(50, bool)
    spans = sample_masks(seg, ws, 1000, Spans(6, 1, "word", max_gram), rng, top_up=False)
    lens = np.array([b - a for k in range(len(seg)) for a, b in _runs(spans[k])])
    assert lens.max() == max_gram
    freq = np.bincount(lens, minlength=max_gram + 1)[1:] / len(lens)
    p = (1 / np.arange(1, max_gram + 1)) / (1 / np.arange(1, max_gram + 1)).sum()
    assert np.abs(freq - p).max() < 0.03


def test_max_gram_is_recorded_and_checked_by_pretrain(builds):
    """Records built with data.max_gram=1 say so in meta.json; pretraining them with another value is refused."""
    from xlnetcli.core.errors import XLNetError
    from xlnetcli.data.records.format import read_meta
    from xlnetcli.train.pretrain import check_records

    over = [
        "tokenizer.vocab_size=1000",
        "model.vocab_size=1000",
        "data.seq_len=64",
        "model.reuse_len=32",
        "data.num_predict=10",
        "train.global_batch_size=4",
        "train.micro_batch_size=2",
        "data.max_gram=1",
    ]
    rec = builds.pipeline(over).records
    meta = read_meta(rec)
    assert meta["max_gram"] == 1
    check_records(load_config(TINY, over), meta, rec)
    with pytest.raises(XLNetError, match="max_gram"):
        check_records(load_config(TINY, over[:-1]), meta, rec)


def test_word_starts_of_a_bare_spiece_model_match_the_tokenizer_folder(tok_dir, tmp_path):
    """A tokenizer folder holding only spiece.model (no metadata file) gets the same word-start table as the full
    folder: user-defined symbols and punctuation start words, read from the model file's piece types."""
    from xlnetcli.data.records.masking import word_start_table

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "spiece.model").write_bytes((tok_dir / "spiece.model").read_bytes())
    full = word_start_table(tok_dir)
    assert full.sum() > 100
    assert (word_start_table(bare) == full).all()
