"""Sharding split across machines (issue #21 item 4): `xlnet shard --part I/N` + `xlnet shard-merge` give the shard
folder of one host byte for byte (every file, manifest.json included), whatever N; mixed-up parts are refused."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from clitools import SAMPLE, assert_one_line_error, flip_bit, run_main, settings_config

from xlnetcli.config import TokenizerConfig
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.data.parts import parse_part
from xlnetcli.data.shards.parts import assign_files, merge_shard_parts, shard_part
from xlnetcli.data.shards.shard import ShardOptions, shard_corpus

SHARDS = 3


def digest(root: Path) -> dict[str, str]:
    """Every file under ``root``: relative path -> sha256 (folders implied)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def part_tok(builds) -> Path:
    """The shared tokenizer of test_shard.py (read only)."""
    return builds.tokenizer(TokenizerConfig(vocab_size=2000, character_coverage=0.9999, threads=1))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Path]:
    """tests/fixtures/sample.txt cut at blank lines into 5 files of unequal sizes (one gzip-compressed, one empty)."""
    d = tmp_path_factory.mktemp("parts_corpus")
    docs = re.split(r"\n\s*\n", SAMPLE.read_text(encoding="utf-8"))
    cuts = [0, len(docs) // 2, len(docs) * 5 // 8, len(docs) * 3 // 4, len(docs) * 7 // 8, len(docs)]
    files = []
    for k in range(5):
        p = d / f"c{k}.txt"
        p.write_text("\n\n".join(docs[cuts[k] : cuts[k + 1]]) + "\n", encoding="utf-8")
        files.append(p)
    empty = d / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    return [*files[:2], empty, *files[2:]]


def cfg(valid_fraction=0.1, seed=42):
    return settings_config("data", valid_fraction=valid_fraction, seed=seed)


@pytest.fixture(scope="module")
def one_host(tmp_path_factory, corpus, part_tok) -> Path:
    out = tmp_path_factory.mktemp("one_host") / "shards"
    shard_corpus(cfg(), [str(p) for p in corpus], out, part_tok, ShardOptions(shards=SHARDS, quiet=True))
    return out


def make_parts(root: Path, corpus, part_tok, n: int, c=None, **kw) -> list[Path]:
    out = []
    for i in range(n):
        p = root / f"part{i}"
        shard_part(
            c or cfg(), [str(f) for f in corpus], p, part_tok, (i, n), ShardOptions(shards=SHARDS, quiet=True, **kw)
        )
        out.append(p)
    return out


# ---- byte-identical --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_parts_merged_are_byte_identical_to_one_host(tmp_path, corpus, part_tok, one_host, n):
    """N = 8 > 6 input files: some parts hold no file, and still merge."""
    parts = make_parts(tmp_path, corpus, part_tok, n, workers=2 if n == 2 else 1)
    merged = tmp_path / "merged"
    s = merge_shard_parts(list(reversed(parts)), merged, quiet=True)  # any order
    want = digest(one_host)
    assert "manifest.json" in want and "config.yaml" in want and any(k.startswith("tokenizer/") for k in want)
    assert digest(merged) == want
    m = json.loads((merged / "manifest.json").read_text())
    assert s.tokens["train"] == sum(e["tokens"] for e in m["splits"]["train"])
    assert s.documents["valid"] > 0


def test_a_part_that_holds_no_file_says_so(tmp_path, capsys, corpus, part_tok):
    """Issue 35: `shard --part` with more parts than input files wrote an empty part without a word; now a warning
    says so (8 parts over 6 files), and only for the parts that hold none."""
    args = [*map(str, corpus), "--tokenizer", part_tok, "--shards", SHARDS, "--quiet"]
    said = {}
    for i in range(8):
        code, out, err = run_main(capsys, "shard", *args, "--out", tmp_path / f"p{i}", "--part", f"{i}/8")
        assert code == 0, err
        files = json.loads((tmp_path / f"p{i}" / "part.json").read_text())["files"]
        said[i] = (f"part {i}/8 holds none of the {len(corpus)} input files" in out + err, not files)
    assert all(warned == empty for warned, empty in said.values()) and any(e for _, e in said.values()), said


def test_valid_files_and_workers_byte_identical(tmp_path, corpus, part_tok):
    """--valid files are dealt to parts like the others; the part's --workers changes nothing."""
    train, valid = [str(p) for p in corpus[:-1]], [str(corpus[-1])]
    one = tmp_path / "one"
    shard_corpus(cfg(0.0), train, one, part_tok, ShardOptions(shards=2, valid_inputs=valid, quiet=True))
    parts = []
    for i in range(2):
        parts.append(tmp_path / f"p{i}")
        shard_part(
            cfg(0.0),
            train,
            parts[-1],
            part_tok,
            (i, 2),
            ShardOptions(shards=2, valid_inputs=valid, workers=2, quiet=True),
        )
    merge_shard_parts(parts, tmp_path / "merged", quiet=True)
    assert digest(tmp_path / "merged") == digest(one)


def test_cli_part_and_merge(tmp_path, capsys, corpus, part_tok, one_host):
    args = [*map(str, corpus), "--tokenizer", part_tok, "--shards", SHARDS, "--valid-fraction", 0.1, "--seed", 42]
    for i in range(2):
        code, out, err = run_main(capsys, "shard", *args, "--out", tmp_path / "parts" / str(i), "--part", f"{i}/2")
        assert code == 0, err
        assert f"wrote part {i}/2" in out + err
    parts = sorted((tmp_path / "parts").iterdir())
    code, out, err = run_main(capsys, "shard-merge", *parts, "--out", tmp_path / "m")
    assert code == 0, err
    assert "merged 2 part(s)" in out + err
    assert digest(tmp_path / "m") == digest(one_host)


def test_an_input_file_called_merge_is_an_input(tmp_path, capsys, monkeypatch, part_tok):
    """Merging is `xlnet shard-merge`, so `xlnet shard merge` shards a file named merge; without one, the error
    names the merge command."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(capsys, "shard", "merge", "--tokenizer", part_tok, "--out", "none", "--quiet")
    assert_one_line_error(code, err, "xlnet shard-merge")
    shutil.copyfile(SAMPLE, tmp_path / "merge")
    code, _, err = run_main(capsys, "shard", "merge", "--tokenizer", part_tok, "--out", "shards", "--quiet")
    assert code == 0, err
    code, _, err = run_main(capsys, "preprocess", "merge", "parts/0", "--out", "records")  # the earlier spelling
    assert_one_line_error(code, err, "xlnet preprocess-merge PARTS")
    assert (tmp_path / "shards" / "manifest.json").is_file()


def test_assignment_is_balanced_and_whole_files():
    assert assign_files([10, 1, 1, 8, 0], 2) == [0, 1, 1, 1, 0]
    assert assign_files([5, 5, 5], 5) == [0, 1, 2]
    assert sorted(set(assign_files(list(range(100)), 8))) == list(range(8))


# ---- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["2/2", "3/2", "-1/2", "0/0", "x/2", "1", "1/2/3"])
def test_part_index_out_of_range(tmp_path, capsys, part_tok, text):
    with pytest.raises(XLNetError, match="--part"):
        parse_part(text)
    code, _, err = run_main(
        capsys, "shard", SAMPLE, "--tokenizer", part_tok, "--out", tmp_path / "p", "--part", text, "--quiet"
    )
    assert_one_line_error(code, err, "--part")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("text", ["0/100001", "0/100000000000000000000", "0/1e20"])
def test_more_parts_than_a_sane_number_are_refused_at_once(tmp_path, capsys, part_tok, text):
    """Issue 35: `--part 0/100000000000000000000` hung (every part's load was tabulated before a byte was read)."""
    with pytest.raises(XLNetError, match="100000"):
        parse_part(text)
    code, _, err = run_main(
        capsys, "shard", SAMPLE, "--tokenizer", part_tok, "--out", tmp_path / "p", "--part", text, "--quiet"
    )
    assert_one_line_error(code, err, "--part", "N <= 100000")
    assert not (tmp_path / "p").exists()


@pytest.fixture(scope="module")
def two_parts(tmp_path_factory, corpus, part_tok) -> list[Path]:
    """Parts 0 and 1 of 2 (read only: tests copy them before changing them)."""
    return make_parts(tmp_path_factory.mktemp("two_parts"), corpus, part_tok, 2)


def refused(capsys, tmp_path, parts, *needles):
    out = tmp_path / "merged"
    code, _, err = run_main(capsys, "shard-merge", *parts, "--out", out)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".merged")]  # no temporary left either


def test_missing_and_duplicated_parts(tmp_path, capsys, two_parts):
    refused(capsys, tmp_path, two_parts[:1], "part 1/2 is missing")
    refused(capsys, tmp_path, [two_parts[0], two_parts[0], two_parts[1]], "part 0/2 given twice")
    copy = tmp_path / "copy"
    shutil.copytree(two_parts[1], copy)
    refused(capsys, tmp_path, [*two_parts, copy], "part 1/2 given twice")
    refused(capsys, tmp_path, [two_parts[0], tmp_path / "nope"], "does not exist")
    refused(capsys, tmp_path, [two_parts[0], SAMPLE.parent], "not a shard part")


def test_parts_of_different_runs(tmp_path, capsys, corpus, part_tok, builds, two_parts):
    other_seed = tmp_path / "seed"
    shard_part(
        cfg(seed=7), [str(f) for f in corpus], other_seed, part_tok, (1, 2), ShardOptions(shards=SHARDS, quiet=True)
    )
    refused(capsys, tmp_path, [two_parts[0], other_seed], "differ in seed")
    other_n = tmp_path / "n3"
    shard_part(cfg(), [str(f) for f in corpus], other_n, part_tok, (1, 3), ShardOptions(shards=SHARDS, quiet=True))
    refused(capsys, tmp_path, [two_parts[0], other_n], "part of 2", "part of 3")
    other_shards = tmp_path / "shards"
    shard_part(
        cfg(), [str(f) for f in corpus], other_shards, part_tok, (1, 2), ShardOptions(shards=SHARDS + 1, quiet=True)
    )
    refused(capsys, tmp_path, [two_parts[0], other_shards], "differ in shards")
    other_inputs = tmp_path / "inputs"
    shard_part(
        cfg(), [str(f) for f in corpus[:-1]], other_inputs, part_tok, (1, 2), ShardOptions(shards=SHARDS, quiet=True)
    )
    refused(capsys, tmp_path, [two_parts[0], other_inputs], "differ in inputs")
    tok2 = builds.tokenizer(TokenizerConfig(vocab_size=1000, character_coverage=0.9999, threads=1))
    other_tok = tmp_path / "tok"
    shard_part(cfg(), [str(f) for f in corpus], other_tok, tok2, (1, 2), ShardOptions(shards=SHARDS, quiet=True))
    refused(capsys, tmp_path, [two_parts[0], other_tok], "differ in tokenizer")


def test_corrupted_part_is_refused(tmp_path, capsys, two_parts):
    bad = tmp_path / "bad"
    shutil.copytree(two_parts[1], bad)
    meta = json.loads((bad / "part.json").read_text())
    victim = bad / meta["files"][0]["files"]["tokens"]
    flip_bit(victim, 3)
    refused(capsys, tmp_path, [two_parts[0], bad], "sha256 differs", victim.name)
    victim.unlink()
    refused(capsys, tmp_path, [two_parts[0], bad], "is missing")
    (bad / "part.json").write_text("{}")
    refused(capsys, tmp_path, [two_parts[0], bad], "not a shard part")


@pytest.mark.parametrize("parts", [200_000, 10**20, 1e20])
def test_a_part_json_with_an_absurd_part_count_is_refused(tmp_path, capsys, two_parts, parts):
    """A hand-edited part.json claiming 10**20 parts hung the merge (it listed the missing ones)."""
    bad = tmp_path / "bad"
    shutil.copytree(two_parts[0], bad)
    meta = json.loads((bad / "part.json").read_text())
    (bad / "part.json").write_text(json.dumps({**meta, "parts": parts}))
    refused(capsys, tmp_path, [bad], "part.json: field 'parts'", "rerun `xlnet shard --part`")


def test_merge_keeps_an_earlier_output(tmp_path, two_parts):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(XLNetError, match="--overwrite"):
        merge_shard_parts(two_parts, out, quiet=True)
    with pytest.raises(DataError, match="missing"):
        merge_shard_parts(two_parts[:1], out, overwrite=True, quiet=True)
    assert (out / "keep").read_text() == "x"


# ---- preprocess parts ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def records_root(tmp_path_factory, shard_dir, records) -> Path:
    """A folder holding ``one``: the data tests' records as one host writes them there. Records say where their
    shards are relative to themselves, so a merge compares byte for byte with one host writing to the same folder:
    merges go next to ``one``."""
    from clitools import preprocess_cfg

    from xlnetcli.data.records.preprocess import preprocess

    root = tmp_path_factory.mktemp("records_root")
    preprocess(preprocess_cfg("data.passes=2"), shard_dir, root / "one", quiet=True)
    want, got = digest(records), digest(root / "one")
    assert {k: v for k, v in got.items() if k != "meta.json"} == {k: v for k, v in want.items() if k != "meta.json"}
    return root


@pytest.mark.parametrize("n", [1, 3, 8])
def test_record_parts_merged_are_byte_identical_to_one_host(tmp_path, shard_dir, records_root, n):
    """G = 8 rows: 3 parts of 2-3 rows; 8 parts of one row each (bi_data pairs split across parts). The parts lie
    elsewhere, some deeper than others (their relative paths to the shards differ), the merge next to one host's."""
    from clitools import preprocess_cfg

    from xlnetcli.data.records.parts import merge_record_parts
    from xlnetcli.data.records.preprocess import preprocess

    parts = []
    for i in range(n):
        parts.append(tmp_path / "parts" / ("deeper" if i % 2 else "") / f"r{i}")
        preprocess(preprocess_cfg("data.passes=2"), shard_dir, parts[-1], part=(i, n), quiet=True, verify=False)
    merged = records_root / f"merged{n}"
    merge_record_parts(list(reversed(parts)), merged)
    want = digest(records_root / "one")
    assert "meta.json" in want and "config.yaml" in want
    assert digest(merged) == want
    shutil.rmtree(merged)


def test_record_parts_cli_and_bad_input(tmp_path, capsys, shard_dir, records_root):
    from clitools import preprocess_cfg

    from xlnetcli.config import save_config

    cfgf = save_config(preprocess_cfg("data.passes=2"), tmp_path, "c.yaml")
    base = ["preprocess", "--shards", shard_dir, "--config", cfgf]
    for i in range(2):
        code, _, err = run_main(capsys, *base, "--out", tmp_path / f"p{i}", "--part", f"{i}/2")
        assert code == 0, err
    merged = records_root / "merged_cli"
    code, _, err = run_main(capsys, "preprocess-merge", tmp_path / "p1", tmp_path / "p0", "--out", merged)
    assert code == 0, err
    assert digest(merged) == digest(records_root / "one")
    shutil.rmtree(merged)
    code, _, err = run_main(capsys, *base, "--out", tmp_path / "bad", "--part", "2/2")
    assert_one_line_error(code, err, "--part")
    assert not (tmp_path / "bad").exists()
    code, _, err = run_main(capsys, *base, "--out", tmp_path / "bad", "--part", "0/9")  # G = 8 rows to share
    assert_one_line_error(code, err, "9 parts, more than 8", "train.global_batch_size is 8")
    assert not (tmp_path / "bad").exists()
    for parts in (1e20, 10**20):  # a hand-edited part.json: a traceback, or a hang listing the missing parts
        absurd = tmp_path / "absurd"
        shutil.copytree(tmp_path / "p0", absurd, dirs_exist_ok=True)
        meta = json.loads((absurd / "part.json").read_text())
        (absurd / "part.json").write_text(json.dumps({**meta, "parts": parts}))
        code, _, err = run_main(capsys, "preprocess-merge", absurd, "--out", tmp_path / "x")
        assert_one_line_error(code, err, "part.json: field 'parts'", "rerun `xlnet preprocess --part`")
    for args, needle in [
        ([tmp_path / "p0"], "part 1/2 is missing"),
        ([tmp_path / "p0", tmp_path / "p0", tmp_path / "p1"], "part 0/2 given twice"),
        ([tmp_path / "p0", shard_dir], "not a records part"),
    ]:
        code, _, err = run_main(capsys, "preprocess-merge", *args, "--out", tmp_path / "x")
        assert_one_line_error(code, err, needle)
        assert not (tmp_path / "x").exists()
    other = tmp_path / "other"
    run_main(capsys, *base, "--set", "data.seed=7", "--out", other, "--part", "1/2")
    code, _, err = run_main(capsys, "preprocess-merge", tmp_path / "p0", other, "--out", tmp_path / "x")
    assert_one_line_error(code, err, "differ in records settings (seed 42 against 7")  # which key, both values
    bad = tmp_path / "p1c"
    shutil.copytree(tmp_path / "p1", bad)
    victim = bad / "train" / "pass_000.masked.npy"
    flip_bit(victim, 3)  # the last row: part 1's
    code, _, err = run_main(capsys, "preprocess-merge", tmp_path / "p0", bad, "--out", tmp_path / "x")
    assert_one_line_error(code, err, "sha256 differs")
    assert not (tmp_path / "x").exists()
