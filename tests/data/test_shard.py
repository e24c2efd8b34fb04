"""Sharding: format, exact content, determinism across workers, balance, validation split, every bad input."""

from __future__ import annotations

import errno
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from clitools import SAMPLE, assert_one_line_error, flip_bit, run_main, settings_config

import xlnetcli.data.corpus.inputs as corpus_inputs
import xlnetcli.data.shards.format as shardfmt
from xlnetcli.cli import cli
from xlnetcli.config import TokenizerConfig
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.data.shards.format import NpyStreamWriter, open_shards, read_manifest, verify_shards
from xlnetcli.data.shards.shard import ShardOptions, shard_corpus
from xlnetcli.data.special import EOD_ID
from xlnetcli.data.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok_dir(builds) -> Path:
    """Shared (conftest.py, the one test_formats and test_finetune use): read only."""
    return builds.tokenizer(TokenizerConfig(vocab_size=2000, character_coverage=0.9999, threads=1))


@pytest.fixture(scope="module")
def tok(tok_dir) -> Tokenizer:
    return Tokenizer.load(tok_dir)


def no_leftovers(parent: Path) -> bool:
    return not [p for p in parent.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]


def tree_bytes(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def shard(inputs, out, tok, valid_fraction=0.0, seed=42, **kw):
    kw.setdefault("quiet", True)
    cfg = settings_config("data", valid_fraction=valid_fraction, seed=seed)
    return shard_corpus(cfg, [str(i) for i in inputs], out, tok, ShardOptions(**kw))


# ---- end to end --------------------------------------------------------------------------------------------------


def test_end_to_end_tokenize_then_shard_cli(tmp_path):
    runner = CliRunner()
    tok = tmp_path / "tok"
    r = runner.invoke(cli, ["tokenize", "train", str(SAMPLE), "--out", str(tok), "--vocab-size", "2000", "--quiet"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "shards"
    r = runner.invoke(
        cli,
        [
            "shard",
            str(SAMPLE),
            "--tokenizer",
            str(tok),
            "--out",
            str(out),
            "--shards",
            "3",
            "--workers",
            "2",
            "--valid-fraction",
            "0.1",
            "--seed",
            "7",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "train shard(s)" in r.output
    m = verify_shards(out)
    assert m["format_version"] == 1 and m["dtype"] == "uint16" and m["vocab_size"] == 2000 and m["seed"] == 7
    t = Tokenizer.load(out / "tokenizer")
    assert m["tokenizer_sha256"] == t.sha256 == Tokenizer.load(tok).sha256
    assert "valid_fraction: 0.1" in (out / "config.yaml").read_text()
    assert len(m["splits"]["train"]) == 3 and len(m["splits"]["valid"]) == 1
    n_docs = sum(e["documents"] for s in m["splits"].values() for e in s)
    n_lines = sum(e["sentences"] for s in m["splits"].values() for e in s)
    text_lines = [ln for ln in SAMPLE.read_text(encoding="utf-8").split("\n") if ln.strip()]
    assert n_lines == len(text_lines)
    assert 0.03 < m["splits"]["valid"][0]["documents"] / n_docs < 0.2
    for split in ("train", "valid"):
        for (tokens, sentid), e in zip(open_shards(out, split), m["splits"][split], strict=True):
            assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16 and sentid.dtype == np.uint8
            assert tokens.shape == sentid.shape == (e["tokens"],)
            assert int((tokens == EOD_ID).sum()) == e["documents"]
            assert tokens[-1] == EOD_ID
            assert set(np.unique(sentid).tolist()) <= {0, 1}
    # encode of the whole sample equals the total of tokens (every line encoded, one <eod> per document)
    total = sum(len(t.encode_ids(ln)) for ln in text_lines) + n_docs
    assert total == sum(e["tokens"] for s in m["splits"].values() for e in s)


def test_exact_content_and_sentence_ids(tmp_path, tok):
    a = tmp_path / "a.txt"
    a.write_bytes(
        b"First doc line one.\nLine  two,\tspaced.\n\n\n  \nSecond doc.\r\nIn 2000, ok.\r\n\r\nThird "
        b"doc, no newline at end"
    )
    b = tmp_path / "b.txt"
    b.write_text("Fourth doc (other file).\nIts ``second'' line.\n")
    out = tmp_path / "s"
    shard([a, b], out, tok, shards=1, valid_fraction=0.0)
    ((tokens, sentid),) = list(open_shards(out, "train"))
    docs = [
        ["First doc line one.", "Line  two,\tspaced."],
        ["Second doc.", "In 2000, ok."],
        ["Third doc, no newline at end"],
        ["Fourth doc (other file).", "Its ``second'' line."],
    ]
    exp_t, exp_s, s = [], [], 0
    for doc in docs:
        for line in doc:
            ids = tok.encode_ids(line)
            exp_t += ids
            exp_s += [s] * len(ids)
            s ^= 1
        exp_t.append(EOD_ID)
        exp_s.append(s ^ 1)  # <eod> shares the id of the document's last line
    assert tokens.tolist() == exp_t
    assert sentid.tolist() == exp_s
    e = read_manifest(out)["splits"]["train"][0]
    assert (e["documents"], e["sentences"]) == (4, 7)
    assert read_manifest(out)["splits"]["valid"] == []
    assert not (out / "valid" / "shard_00000.tokens.npy").exists()


# ---- determinism and balance ---------------------------------------------------------------------------------------


def test_deterministic_for_any_worker_count(tmp_path, tok):
    outs = []
    for w in (1, 2, 3):
        out = tmp_path / f"w{w}"
        shard([SAMPLE], out, tok, shards=4, workers=w, valid_fraction=0.05, seed=3, chunk_chars=8192)
        outs.append(tree_bytes(out))
    assert outs[0] == outs[1] == outs[2]
    # chunking is an implementation detail: the default chunk size gives the same bytes
    shard([SAMPLE], tmp_path / "big", tok, shards=4, workers=1, valid_fraction=0.05, seed=3)
    assert tree_bytes(tmp_path / "big") == outs[0]
    # a different seed changes the validation split
    shard([SAMPLE], tmp_path / "seed4", tok, shards=4, valid_fraction=0.05, seed=4)
    assert tree_bytes(tmp_path / "seed4") != outs[0]


def test_shards_balanced(tmp_path, tok):
    out = tmp_path / "s"
    shard([SAMPLE], out, tok, shards=5, valid_fraction=0.0, chunk_chars=4096)
    m = read_manifest(out)
    sizes = [e["tokens"] for e in m["splits"]["train"]]
    largest_doc = 0
    for tokens, _ in open_shards(out):
        ends = np.flatnonzero(np.asarray(tokens) == EOD_ID)
        largest_doc = max(largest_doc, int(np.diff(np.concatenate([[-1], ends])).max()))
    assert max(sizes) - min(sizes) <= largest_doc


# ---- validation split ----------------------------------------------------------------------------------------------


def test_valid_files(tmp_path, tok, capsys):
    v = tmp_path / "valid.txt"
    v.write_text("A held-out document.\nWith two lines.\n\nAnother one.\n")
    out = tmp_path / "s"
    code, _, err = run_main(
        capsys, "shard", SAMPLE, "--tokenizer", tok.where.parent, "--out", out, "--valid", v, "--quiet"
    )
    assert code == 0, err
    m = read_manifest(out)
    assert m["splits"]["valid"][0]["documents"] == 2 and m["splits"]["valid"][0]["sentences"] == 3
    assert m["inputs"]["valid"] == [str(v)]
    code, _, err = run_main(
        capsys,
        "shard",
        SAMPLE,
        "--tokenizer",
        tok.where.parent,
        "--out",
        tmp_path / "x",
        "--valid",
        v,
        "--valid-fraction",
        "0.1",
    )
    assert_one_line_error(code, err, "either")
    code, _, err = run_main(
        capsys, "shard", SAMPLE, "--tokenizer", tok.where.parent, "--out", tmp_path / "y", "--valid", SAMPLE
    )
    assert_one_line_error(code, err, "both a training input and a --valid file")


def test_inputs_gz_directory_glob(tmp_path, tok):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    text = SAMPLE.read_text(encoding="utf-8")
    half = text.index("\n\n", len(text) // 2) + 2
    (d / "a.txt").write_text(text[:half], encoding="utf-8")
    with gzip.open(d / "sub" / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text[half:])
    (d / "notes.md").write_text("ignored: not a text suffix")
    shard([SAMPLE], tmp_path / "plain", tok, valid_fraction=0.0)
    shard([d], tmp_path / "dir", tok, valid_fraction=0.0)
    shard([str(d / "**" / "*.txt*")], tmp_path / "glob", tok, valid_fraction=0.0)
    want = tree_bytes(tmp_path / "plain")
    for name in ("dir", "glob"):
        got = tree_bytes(tmp_path / name)
        for k in want:
            if k.endswith(".npy"):
                assert got[k] == want[k], (name, k)


# ---- bad inputs ----------------------------------------------------------------------------------------------------


def test_missing_path_and_empty_dir_and_glob(tmp_path, tok, capsys):
    code, _, err = run_main(
        capsys, "shard", tmp_path / "nope.txt", "--tokenizer", tok.where.parent, "--out", tmp_path / "o"
    )
    assert_one_line_error(code, err, "nope.txt", "does not exist")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "image.png").write_bytes(b"\x89PNG")
    code, _, err = run_main(capsys, "shard", tmp_path / "d", "--tokenizer", tok.where.parent, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "holds no text files")
    code, _, err = run_main(
        capsys, "shard", str(tmp_path / "*.txt"), "--tokenizer", tok.where.parent, "--out", tmp_path / "o"
    )
    assert_one_line_error(code, err, "matches no files")
    assert not (tmp_path / "o").exists()


def test_unreadable_file(tmp_path, tok, monkeypatch, capsys):
    f = tmp_path / "secret.txt"
    f.write_text("some text\n")
    if os.geteuid() != 0:
        f.chmod(0)
    else:  # root reads anything: simulate the permission error at open()
        real_open = open

        def fake_open(path, *a, **k):
            if Path(path) == f:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_open(path, *a, **k)

        monkeypatch.setattr(corpus_inputs, "open", fake_open, raising=False)
    code, _, err = run_main(capsys, "shard", f, "--tokenizer", tok.where.parent, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "permission denied", "secret.txt")
    assert not (tmp_path / "o").exists() and no_leftovers(tmp_path)


def test_binary_file(tmp_path, tok, capsys):
    f = tmp_path / "data.txt"
    f.write_bytes(b"looks like text\n\x00\x01\x02\x03" * 100)
    code, _, err = run_main(capsys, "shard", f, "--tokenizer", tok.where.parent, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "binary")
    assert not (tmp_path / "o").exists() and no_leftovers(tmp_path)


def test_corrupt_gzip(tmp_path, tok, capsys):
    good = tmp_path / "good.txt.gz"
    with gzip.open(good, "wt") as fh:
        fh.write("hello world\n" * 5000)
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    code, _, err = run_main(capsys, "shard", bad, "--tokenizer", tok.where.parent, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "corrupt or truncated gzip")
    fake = tmp_path / "fake.gz"
    fake.write_text("plain text\n")
    code, _, err = run_main(capsys, "shard", fake, "--tokenizer", tok.where.parent, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "not gzip")


def test_invalid_utf8_replaced_and_counted(tmp_path, tok, capsys):
    f = tmp_path / "latin.txt"
    body = SAMPLE.read_bytes()[:50_000]
    f.write_bytes(body + b"\nCaf\xe9 cr\xe8me.\n")  # 2 bad bytes in ~50 KB: replaced, warned, counted
    out = tmp_path / "o"
    code, _, err = run_main(capsys, "shard", f, "--tokenizer", tok.where.parent, "--out", out, "--valid-fraction", "0")
    assert code == 0, err
    assert "replaced 2 invalid UTF-8 byte(s)" in err
    assert read_manifest(out)["invalid_utf8_bytes"] == 2


def test_invalid_utf8_refused_over_one_percent(tmp_path, tok, capsys):
    f = tmp_path / "latin1.txt"
    f.write_bytes("Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e \u00e0 la fran\u00e7aise.\n".encode("latin-1") * 200)
    code, _, err = run_main(capsys, "shard", f, "--tokenizer", tok.where.parent, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "invalid UTF-8", "iconv")
    assert not (tmp_path / "o").exists() and no_leftovers(tmp_path)


def test_empty_corpus(tmp_path, tok, capsys):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n \n\t\n")
    code, _, err = run_main(
        capsys,
        "shard",
        tmp_path / "empty.txt",
        tmp_path / "blank.txt",
        "--tokenizer",
        tok.where.parent,
        "--out",
        tmp_path / "o",
    )
    assert_one_line_error(code, err, "holds no text")
    assert not (tmp_path / "o").exists() and no_leftovers(tmp_path)


def test_too_many_shards(tmp_path, tok):
    f = tmp_path / "two.txt"
    f.write_text("one doc\n\ntwo doc\n")
    with pytest.raises(DataError, match="use fewer --shards"):
        shard([f], tmp_path / "o", tok, shards=3, valid_fraction=0.0)


def test_missing_and_corrupt_tokenizer(tmp_path, tok_dir, capsys):
    code, _, err = run_main(capsys, "shard", SAMPLE, "--tokenizer", tmp_path / "none", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "does not exist")
    bad = tmp_path / "badtok"
    bad.mkdir()
    (bad / "spiece.model").write_bytes((tok_dir / "spiece.model").read_bytes()[:-100])
    (bad / "xlnet_tokenizer.json").write_text((tok_dir / "xlnet_tokenizer.json").read_text())
    code, _, err = run_main(capsys, "shard", SAMPLE, "--tokenizer", bad, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "sha256 differs")
    assert not (tmp_path / "o").exists()


def test_existing_output_needs_overwrite(tmp_path, tok, capsys):
    out = tmp_path / "o"
    shard([SAMPLE], out, tok, valid_fraction=0.0)
    before = tree_bytes(out)
    code, _, err = run_main(capsys, "shard", SAMPLE, "--tokenizer", tok.where.parent, "--out", out, "--shards", "2")
    assert_one_line_error(code, err, "--overwrite")
    assert tree_bytes(out) == before
    code, _, err = run_main(
        capsys,
        "shard",
        SAMPLE,
        "--tokenizer",
        tok.where.parent,
        "--out",
        out,
        "--shards",
        "2",
        "--overwrite",
        "--quiet",
    )
    assert code == 0, err
    assert len(read_manifest(out)["splits"]["train"]) == 2
    assert no_leftovers(tmp_path)


def test_disk_full(tmp_path, tok, monkeypatch, capsys):
    calls = {"n": 0}
    real = NpyStreamWriter.write

    def full(self, arr):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real(self, arr)

    monkeypatch.setattr(NpyStreamWriter, "write", full)
    out = tmp_path / "o"
    code, _, err = run_main(capsys, "shard", SAMPLE, "--tokenizer", tok.where.parent, "--out", out, "--workers", "2")
    assert_one_line_error(code, err, "disk full")
    assert not out.exists() and no_leftovers(tmp_path)


def test_bad_numbers(tmp_path, tok):
    for kw in ({"shards": 0}, {"workers": 0}, {"valid_fraction": 1.0}):
        with pytest.raises(XLNetError):
            shard([SAMPLE], tmp_path / "o", tok, **kw)


# ---- reading -------------------------------------------------------------------------------------------------------


def test_manifest_and_shard_file_errors(tmp_path, tok):
    with pytest.raises(DataError, match="does not exist"):
        read_manifest(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"no manifest\.json"):
        read_manifest(tmp_path / "empty")
    out = tmp_path / "s"
    shard([SAMPLE], out, tok, shards=2, valid_fraction=0.0)
    raw = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(raw[:50])
    with pytest.raises(DataError, match="corrupt"):
        read_manifest(out)
    (out / "manifest.json").write_text(raw)
    f = out / "train" / "shard_00001.tokens.npy"
    flip_bit(f, 1)
    with pytest.raises(DataError, match="sha256 differs"):
        verify_shards(out)
    f.unlink()
    with pytest.raises(DataError, match="missing"):
        list(open_shards(out))


def test_npy_stream_writer_uint32(tmp_path):
    p = tmp_path / "x.npy"
    w = NpyStreamWriter(p, np.uint32)
    w.write(np.arange(10))
    w.write(np.array([70000, 5]))
    w.close()
    a = np.load(p, mmap_mode="r")
    assert a.dtype == np.uint32 and a.tolist() == [*range(10), 70000, 5]
    assert shardfmt.NPY_HEADER == 128 and p.stat().st_size == 128 + 12 * 4


def test_manifest_is_json_with_sha256(tmp_path, tok):
    out = tmp_path / "s"
    shard([SAMPLE], out, tok, valid_fraction=0.1)
    m = json.loads((out / "manifest.json").read_text())
    e = m["splits"]["train"][0]
    assert set(e) == {"tokens_file", "sentid_file", "tokens", "sentences", "documents", "sha256"}
    assert set(e["sha256"]) == {"tokens", "sentid"} and all(len(v) == 64 for v in e["sha256"].values())
