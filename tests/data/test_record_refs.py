"""Records that reference the shards (issue #21 item 2): the examples read back from the shards are the ones the
preprocessing built (the tokens records of format 1 stored), for any rows; they take under a byte per corpus token
per pass; they find their shards when moved and refuse shards that changed, and old records, in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from clitools import assert_one_line_error, flip_bit, preprocess_cfg, run_main

from xlnetcli.core.errors import DataError
from xlnetcli.data.records.format import find_shards, open_records, read_meta, row_source
from xlnetcli.data.records.masking import Spans, word_start_table
from xlnetcli.data.records.preprocess import STEP_BLOCK, _Params, _row_rng, build_rows
from xlnetcli.data.records.segments import Row
from xlnetcli.data.shards.format import MappedStream, PassStream, read_span

_SPLIT_IDS = {"train": 0, "valid": 1}


@pytest.fixture(scope="session")
def records_fwd(builds, shard_dir) -> Path:
    """The data tests' records without bi_data (forward rows only)."""
    return builds.records(shard_dir, preprocess_cfg("model.bi_data=false"), passes=2)


def reference(shard_dir: Path, meta: dict, split: str, pass_id: int) -> dict[str, np.ndarray]:
    """What format 1 stored for a pass: tokens [G, S, L], alen, label [G, S], masked [G, S, L], rebuilt with
    build_rows as `xlnet preprocess` builds them (each row its own generator, blocks of STEP_BLOCK steps); the file
    order is drawn here, not read from meta.json."""
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    entries = [(shard_dir / e["tokens_file"], shard_dir / e["sentid_file"]) for e in manifest["splits"][split]]
    order = np.random.default_rng([meta["seed"], _SPLIT_IDS[split], pass_id]).permutation(len(entries))
    info = meta["splits"][split]
    G, S, L = info["rows"], info["steps_per_pass"], meta["seq_len"]
    p = _Params(
        L,
        meta["reuse_len"],
        meta["num_predict"],
        Spans(meta["mask_alpha"], meta["mask_beta"], meta["mask_mode"], meta["max_gram"]),
        meta["seed"],
    )
    ws = word_start_table(shard_dir / "tokenizer", meta["word_rule"])
    stream = PassStream(entries, [int(k) for k in order])
    out = {
        "tokens": np.zeros((G, S, L), meta["dtype"]),
        "alen": np.zeros((G, S), np.int64),
        "label": np.zeros((G, S), np.uint8),
        "masked": np.zeros((G, S, L), bool),
    }
    try:
        for g in range(G):
            f, rev = row_source(g, meta["bi_data"], meta["micro_batch_size"])
            row, rng = Row(stream, f, info["row_len"], rev), _row_rng(meta["seed"], split, pass_id, g)
            for s0 in range(0, S, STEP_BLOCK):
                s1 = min(S, s0 + STEP_BLOCK)
                b = build_rows([row], [rng], p, ws, s0, s1)[0]
                for key in out:
                    out[key][g, s0:s1] = getattr(b, key)
    finally:
        stream.close()
    return out


def joins_seen(shard_dir: Path, meta: dict, split: str, pass_id: int) -> tuple[bool, bool]:
    """(some window [i, i + L) of a forward row spans two shard files, some row lies inside one file) in this pass:
    both ways of reading a row are exercised."""
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    sizes = np.array([e["tokens"] for e in manifest["splits"][split]])
    joins = np.cumsum(sizes[meta["splits"][split]["orders"][pass_id]])[:-1]
    info = meta["splits"][split]
    R, L, rl = meta["reuse_len"], meta["seq_len"], info["row_len"]
    rows = np.arange(info["forward_rows"]) * rl
    starts = (rows[:, None] + np.arange(info["steps_per_pass"]) * R).ravel()
    window = ((joins[None, :] > starts[:, None]) & (joins[None, :] < starts[:, None] + L)).any()
    inside = ~((joins[None, :] > rows[:, None]) & (joins[None, :] < rows[:, None] + rl)).any(1)
    return bool(window), bool(inside.any())


@pytest.mark.parametrize("which", ["records", "records_fwd"])
def test_examples_equal_what_preprocessing_built(request, shard_dir, which):
    """Every example of both passes and both splits, rows asked in a shuffled order: the token ids, targets and |A|
    are today's, with and without bi_data, over three train shards (windows across their joins) and one valid."""
    records = request.getfixturevalue(which)
    rng = np.random.default_rng(0)
    for split in ("train", "valid"):
        meta, passes = open_records(records, split)
        assert meta["format_version"] == 2 and len(passes) == 2
        G, S = meta["global_batch_size"], meta["splits"][split]["steps_per_pass"]
        if split == "train":
            assert len(meta["splits"][split]["shards"]) == 3
            assert all(joins_seen(shard_dir, meta, split, k) == (True, True) for k in range(2))
        for pass_id, p in enumerate(passes):
            want = reference(shard_dir, meta, split, pass_id)
            assert (np.asarray(p.label) == want["label"]).all()
            for s in range(S):
                rows = rng.permutation(G)
                ids, masked, alen = p.examples(rows, s)
                assert ids.dtype == want["tokens"].dtype and ids.shape == (G, meta["seq_len"])
                assert (ids == want["tokens"][rows, s]).all(), (split, pass_id, s)
                assert (masked == want["masked"][rows, s]).all() and (alen == want["alen"][rows, s]).all()
        assert not np.array_equal(np.asarray(passes[0].masked), np.asarray(passes[1].masked))


def test_any_rows_any_order(records):
    """Rows repeated, out of order, a single one: each row's example is the one it has in a full batch."""
    meta, passes = open_records(records)
    p = passes[1]
    full, fmask, falen = p.examples(np.arange(meta["global_batch_size"]), 5)
    for rows in ([7, 0, 3], [2, 2, 5], [6], np.array([1, 4], np.uint8)):
        ids, masked, alen = p.examples(np.asarray(rows), 5)
        assert (ids == full[rows]).all() and (masked == fmask[rows]).all() and (alen == falen[rows]).all()


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_mapped_stream_matches_the_concatenated_files(dtype):
    """Files of unequal sizes, an empty one among them, in a given order: any range of any span, across joins."""
    rng = np.random.default_rng(1)
    maps = [rng.integers(0, 70000 if dtype == np.uint32 else 1000, n).astype(dtype) for n in (5, 0, 17, 1, 9)]
    order = [3, 1, 0, 4, 2]
    whole = np.concatenate([maps[k] for k in order])
    s = MappedStream(maps, order)
    for a, n in [(0, len(whole)), (3, 20), (6, 1), (22, 10)]:
        cuts, parts = s.span(a, n)
        assert np.frombuffer(b"".join(parts), dtype).tolist() == whole[a : a + n].tolist()
        for q in range(n):
            for m in range(n - q + 1):
                out: list[memoryview] = []
                read_span(out, cuts, parts, q, m)
                assert (np.frombuffer(b"".join(out), dtype) == whole[a + q : a + q + m]).all()


def test_records_take_under_a_byte_per_corpus_token_per_pass(records):
    meta = read_meta(records)
    for split, info in meta["splits"].items():
        stored = sum(f.stat().st_size for f in (records / split).glob("pass_*.npy"))
        assert stored / (info["tokens"] * info["passes"]) <= 1.0, split
    assert not list(records.glob("*/*.tokens.npy"))


# ---- where the shards are ----------------------------------------------------------------------------------------


def test_records_and_shards_moved_together_or_records_alone(tmp_path, records, shard_dir):
    meta = read_meta(records)
    assert meta["shards"]["path"] == f"../{shard_dir.name}" and meta["shards"]["absolute"] == str(shard_dir.resolve())
    both = tmp_path / "both"
    shutil.copytree(records, both / "rec")
    shutil.copytree(shard_dir, both / shard_dir.name)
    assert find_shards(both / "rec", meta) == both / "rec" / ".." / shard_dir.name  # the copy, by the relative path
    alone = tmp_path / "alone" / "deeper" / "rec"
    shutil.copytree(records, alone)
    assert find_shards(alone, meta) == shard_dir.resolve()  # the original, by the absolute path
    other = tmp_path / "other"
    shutil.copytree(records, other / "rec")
    shutil.copytree(shard_dir, other / shard_dir.name)
    (other / shard_dir.name / "manifest.json").write_text("{}")
    assert find_shards(other / "rec", meta) == shard_dir.resolve()  # not the other shards found by the relative path
    want = open_records(records)[1][0].examples(np.arange(8), 3)
    for rec in (both / "rec", alone):
        got = open_records(rec)[1][0].examples(np.arange(8), 3)
        assert all((a == b).all() for a, b in zip(got, want, strict=True))


@pytest.fixture
def own(tmp_path, shard_dir) -> tuple[Path, Path]:
    """Records of a private copy of the shards (tests change or move those): (records, shards)."""
    from xlnetcli.data.records.preprocess import preprocess

    shards = tmp_path / "shards"
    shutil.copytree(shard_dir, shards)
    rec = tmp_path / "rec"
    preprocess(preprocess_cfg(), shards, rec, quiet=True)
    return rec, shards


def pretrain_refused(capsys, tmp_path, rec: Path, *needles: str) -> None:
    """`xlnet pretrain` on the records stops with one line, before writing a run folder."""
    out = tmp_path / "run"
    code, _, err = run_main(
        capsys, "pretrain", "--data", rec, "--out", out, "--set", "train.max_steps=1", "--set", "train.warmup_steps=0"
    )
    assert_one_line_error(code, err, *needles)
    assert not out.exists() or not any(out.glob("step_*"))


def test_shards_found_nowhere(capsys, tmp_path, own):
    rec, shards = own
    shards.rename(tmp_path / "elsewhere")
    pretrain_refused(capsys, tmp_path, rec, str(rec / ".." / "shards"), str(shards.resolve()), "xlnet preprocess")


def test_a_changed_shard_file_is_refused(capsys, tmp_path, own):
    rec, shards = own
    victim = shards / "train" / "shard_00001.tokens.npy"
    flip_bit(victim, 10)
    with pytest.raises(DataError, match=rf"shard file .*{victim.name} changed since the records .* re-run `xlnet pre"):
        open_records(rec, "train")
    open_records(rec, "train", verify=False)  # the same policy as the records' own files: --no-verify trusts them
    pretrain_refused(capsys, tmp_path, rec, victim.name, "changed", "re-run `xlnet preprocess`")
    # shorter, or cut: refused even unverified
    np.save(victim, np.load(victim)[:-1])
    with pytest.raises(DataError, match=rf"{victim.name} changed since .*meta.json says"):
        open_records(rec, "train", verify=False)
    victim.write_bytes(victim.read_bytes()[:-2])
    with pytest.raises(DataError, match=rf"{victim.name} changed since .*cannot be read"):
        open_records(rec, "train", verify=False)


def test_rewritten_shards_are_refused(capsys, tmp_path, own):
    rec, shards = own
    m = shards / "manifest.json"
    m.write_text(m.read_text() + " ")
    with pytest.raises(DataError, match=r"manifest\.json changed since the records"):
        open_records(rec, "valid", verify=False)
    pretrain_refused(capsys, tmp_path, rec, "manifest.json", "re-run `xlnet preprocess`")


def test_old_records_are_refused(capsys, tmp_path, records):
    rec = tmp_path / "rec"
    shutil.copytree(records, rec)
    meta = json.loads((rec / "meta.json").read_text())
    meta["format_version"] = 1
    (rec / "meta.json").write_text(json.dumps(meta))
    pretrain_refused(capsys, tmp_path, rec, "records format 1", "re-run `xlnet preprocess`")
