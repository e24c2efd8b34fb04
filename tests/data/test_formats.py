"""Corpus formats for `shard` and `tokenize train`: JSONL (plain, .gz, .zst), Parquet, datasets save_to_disk folders,
zstd text. Each is built here from lines of the bundled corpus and must give exactly what the equivalent plain text
file gives; bad records, missing fields and missing optional packages are one-line errors."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

import pytest
from clitools import CORPUS, assert_one_line_error, run_main, settings_config

import xlnetcli.data.corpus.reader as corpus_mod
from xlnetcli.config import TokenizerConfig
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.data.corpus.inputs import detect_format, expand_inputs
from xlnetcli.data.corpus.reader import FileStats, iter_file_text
from xlnetcli.data.shards.shard import ShardOptions, shard_corpus
from xlnetcli.data.tokenizer import train_tokenizer

pytestmark = pytest.mark.slow  # every test here trains, runs subprocesses or builds large inputs


pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")
datasets = pytest.importorskip("datasets")


N_DOCS = 1800  # enough text that a compressed file spans several read blocks


def _documents(n: int = N_DOCS) -> list[str]:
    """The first n documents of the bundled corpus; every third gets a blank and a whitespace-only line inside it (a
    record's blank lines do not split it: it stays one document)."""
    docs = [d for d in CORPUS.read_text(encoding="utf-8").split("\n\n") if d.strip()][:n]
    out = []
    for i, d in enumerate(docs):
        lines = d.split("\n")
        if i % 3 == 0 and len(lines) > 1:
            lines = [lines[0], "", " \t", *lines[1:]]
        out.append("\n".join(lines))
    return out


def _plain(docs: list[str]) -> str:
    """The text-format file equivalent to the records: each record's non-blank lines, then a blank line."""
    return "".join("\n".join(ln for ln in d.split("\n") if ln.strip()) + "\n\n" for d in docs)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("formats")
    docs = _documents()
    plain = _plain(docs)
    jsonl = "".join(json.dumps({"id": i, "text": t, "meta": {"n": i}}) + "\n" for i, t in enumerate(docs))
    out = {
        "plain": d / "plain.txt",
        "jsonl": d / "c.jsonl",
        "jsonl.gz": d / "c.jsonl.gz",
        "jsonl.zst": d / "c.jsonl.zst",
        "txt.zst": d / "p.txt.zst",
        "json.gz": d / "c4-style.json.gz",
        "parquet": d / "c.parquet",
        "datasets": d / "ds",
    }
    out["plain"].write_text(plain, encoding="utf-8")
    out["jsonl"].write_text(jsonl, encoding="utf-8")
    with gzip.open(out["jsonl.gz"], "wt", encoding="utf-8") as f:
        f.write(jsonl)
    with gzip.open(out["json.gz"], "wt", encoding="utf-8") as f:
        f.write(jsonl)
    # two zstd frames (as pzstd or `cat a.zst b.zst` make): both are read
    half = len(jsonl) // 2
    half = jsonl.index("\n", half) + 1
    cz = zstandard.ZstdCompressor()
    out["jsonl.zst"].write_bytes(cz.compress(jsonl[:half].encode()) + cz.compress(jsonl[half:].encode()))
    out["txt.zst"].write_bytes(cz.compress(plain.encode()))
    # several row groups; the text in a column not named "text"
    pq.write_table(pa.table({"id": list(range(len(docs))), "body": docs}), out["parquet"], row_group_size=300)
    datasets.Dataset.from_dict({"text": docs, "n": list(range(len(docs)))}).save_to_disk(
        str(out["datasets"]), num_shards=2
    )
    return out


@pytest.fixture(scope="module")
def tok_dir(builds) -> Path:
    """Shared (conftest.py): read only."""
    return builds.tokenizer(TokenizerConfig(vocab_size=2000, character_coverage=0.9999, threads=1))


def _field(name: str) -> str:
    return "body" if name == "parquet" else "text"


def _shard_bytes(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*.npy"))}


# ---- identical to the plain text file ----------------------------------------------------------------------------


def test_detect_format(files):
    assert {k: detect_format(p) for k, p in files.items()} == {
        "plain": corpus_mod.InputFormat("text"),
        "jsonl": corpus_mod.InputFormat("jsonl"),
        "jsonl.gz": corpus_mod.InputFormat("jsonl", "gzip"),
        "jsonl.zst": corpus_mod.InputFormat("jsonl", "zstd"),
        "txt.zst": corpus_mod.InputFormat("text", "zstd"),
        "json.gz": corpus_mod.InputFormat("jsonl", "gzip"),
        "parquet": corpus_mod.InputFormat("parquet"),
        "datasets": corpus_mod.InputFormat("datasets"),
    }


def test_shards_identical_to_plain_text(files, tok_dir, tmp_path):
    cfg, kw = settings_config("data", valid_fraction=0.1, seed=3), dict(shards=2, quiet=True)
    want = shard_corpus(cfg, [files["plain"]], tmp_path / "plain", tok_dir, ShardOptions(**kw))
    ref = _shard_bytes(tmp_path / "plain")
    assert want.documents["train"] + want.documents["valid"] == N_DOCS  # one document per record
    for name, path in files.items():
        if name == "plain":
            continue
        got = shard_corpus(cfg, [path], tmp_path / name, tok_dir, ShardOptions(text_field=_field(name), **kw))
        assert (got.tokens, got.documents) == (want.tokens, want.documents), name
        assert _shard_bytes(tmp_path / name) == ref, name


def test_shard_cli_text_field_and_workers(files, tok_dir, tmp_path, capsys):
    code, _, err = run_main(
        capsys,
        "shard",
        files["plain"],
        "--tokenizer",
        tok_dir,
        "--out",
        tmp_path / "a",
        "--valid-fraction",
        "0",
        "--quiet",
    )
    assert code == 0, err
    code, _, err = run_main(
        capsys,
        "shard",
        files["parquet"],
        "--text-field",
        "body",
        "--tokenizer",
        tok_dir,
        "--out",
        tmp_path / "b",
        "--valid-fraction",
        "0",
        "--workers",
        "2",
        "--quiet",
    )
    assert code == 0, err
    assert _shard_bytes(tmp_path / "a") == _shard_bytes(tmp_path / "b")
    # a --valid file may be in another format too
    code, _, err = run_main(
        capsys,
        "shard",
        files["plain"],
        "--valid",
        files["datasets"],
        "--tokenizer",
        tok_dir,
        "--out",
        tmp_path / "c",
        "--quiet",
    )
    assert code == 0, err
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["splits"]["valid"][0]["documents"] == N_DOCS and m["inputs"]["valid"] == [str(files["datasets"])]


def test_tokenizer_training_input_identical_to_plain_text(files, tmp_path, monkeypatch):
    """SentencePiece's own training is not bit-reproducible run to run (it differs on the same file), so what is
    compared is what our code hands it: the normalised training text, byte for byte, and the counts."""
    import sentencepiece as spm

    seen: list[str] = []
    real = spm.SentencePieceTrainer.train

    def spy(**kw):
        seen.append(hashlib.sha256(Path(kw["input"]).read_bytes()).hexdigest())
        return real(**kw)

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", spy)
    cfg = settings_config("tokenizer", vocab_size=600, character_coverage=0.9999, threads=1)
    metas = {}
    for name, path in files.items():
        tok = train_tokenizer(cfg, [path], tmp_path / name, quiet=True, text_field=_field(name))
        metas[name] = (tok.meta["train"]["lines"], tok.meta["train"]["bytes"], tok.vocab_size)
    assert len(seen) == len(files) and len(set(seen)) == 1
    assert len(set(metas.values())) == 1


def test_tokenize_train_cli_datasets_folder(files, tmp_path, capsys):
    code, _out, err = run_main(
        capsys, "tokenize", "train", files["datasets"], "--out", tmp_path / "t", "--vocab-size", "600", "--quiet"
    )
    assert code == 0, err
    assert (tmp_path / "t" / "spiece.model").is_file()
    assert json.loads((tmp_path / "t" / "xlnet_tokenizer.json").read_text())["train"]["inputs"] == [
        str(files["datasets"])
    ]


def test_directory_and_glob_pick_up_every_format(files, tok_dir, tmp_path):
    docs = _documents()
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text(_plain(docs[:400]), encoding="utf-8")
    (d / "b.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(json.dumps({"text": t}) + "\n" for t in docs[400:800]).encode())
    )
    pq.write_table(pa.table({"text": docs[800:]}), d / "sub" / "c.parquet")
    (d / "notes.md").write_text("ignored")
    (d / "stats.json").write_text("{}")  # a stray .json in a folder is not taken for JSONL
    assert [p.name for p in expand_inputs([d])] == ["a.txt", "b.jsonl.zst", "c.parquet"]
    none_held_out = settings_config("data", valid_fraction=0.0)
    shard_corpus(none_held_out, [d], tmp_path / "dir", tok_dir, ShardOptions(quiet=True))
    shard_corpus(none_held_out, [files["plain"]], tmp_path / "plain", tok_dir, ShardOptions(quiet=True))
    assert _shard_bytes(tmp_path / "dir") == _shard_bytes(tmp_path / "plain")
    assert expand_inputs([str(files["datasets"].parent / "d*")]) == [files["datasets"]]  # a glob may name one


def test_reading_streams_in_bounded_blocks(files, monkeypatch):
    """Record formats are read batch by batch: no block holds the whole file."""
    monkeypatch.setattr(corpus_mod, "RECORD_BATCH", 100)  # Parquet / datasets rows per batch (1024 by default)
    size = len(files["plain"].read_text(encoding="utf-8"))
    for name in ("jsonl", "jsonl.zst", "parquet", "datasets"):
        blocks = list(iter_file_text(files[name], FileStats(files[name]), block=1 << 16, text_field=_field(name)))
        assert len(blocks) > 2 and max(map(len, blocks)) < size / 2, name
        assert "".join(blocks) == files["plain"].read_text(encoding="utf-8"), name


def test_null_records_are_skipped_and_counted(tok_dir, tmp_path, capsys):
    docs = _documents(50)
    pq.write_table(pa.table({"text": [*docs[:10], None, None, *docs[10:]]}), tmp_path / "n.parquet")
    (tmp_path / "n.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in [*docs[:5], None, *docs[5:]]))
    (tmp_path / "p.txt").write_text(_plain(docs))
    for name in ("n.parquet", "n.jsonl"):
        code, _, err = run_main(
            capsys,
            "shard",
            tmp_path / name,
            "--tokenizer",
            tok_dir,
            "--out",
            tmp_path / name[2:],
            "--valid-fraction",
            "0",
            "--quiet",
        )
        assert code == 0, err
        assert f"skipped {2 if 'parquet' in name else 1} record(s) whose text is null" in err
    shard_corpus(
        settings_config("data", valid_fraction=0.0),
        [tmp_path / "p.txt"],
        tmp_path / "p",
        tok_dir,
        ShardOptions(quiet=True),
    )
    assert _shard_bytes(tmp_path / "parquet") == _shard_bytes(tmp_path / "jsonl") == _shard_bytes(tmp_path / "p")


# ---- bad input: one line, file and line named, nothing written ---------------------------------------------------


def _refused(capsys, tmp_path, tok_dir, path, *needles, extra=()):
    out = tmp_path / "out"
    code, _, err = run_main(capsys, "shard", path, "--tokenizer", tok_dir, "--out", out, *extra)
    assert_one_line_error(code, err, *needles)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    code, _, err = run_main(capsys, "tokenize", "train", path, "--out", out, "--vocab-size", "600", *extra)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


def test_jsonl_errors(tok_dir, tmp_path, capsys):
    f = tmp_path / "a.jsonl"
    f.write_text('{"text": "one"}\n\n{"body": "two", "id": 2}\n')
    _refused(capsys, tmp_path, tok_dir, f, "a.jsonl line 3", "no field 'text'", "fields: body, id", "--text-field")
    f.write_text('{"text": "one"}\n{"text": "two"\n')
    _refused(capsys, tmp_path, tok_dir, f, "a.jsonl line 2 is not JSON")
    f.write_text('{"text": "one"}\n["a", "list"]\n')
    _refused(capsys, tmp_path, tok_dir, f, "a.jsonl line 2", "expected an object")
    f.write_text('{"text": ["a", "list"]}\n')
    _refused(capsys, tmp_path, tok_dir, f, "a.jsonl line 1", "field 'text' is list, expected a string")
    g = tmp_path / "b.jsonl.gz"
    with gzip.open(g, "wt") as fh:
        fh.write('{"text": "fine"}\n' * 3 + '{"txt": "typo"}\n')
    _refused(capsys, tmp_path, tok_dir, g, "b.jsonl.gz line 4", "no field 'text'")
    _refused(capsys, tmp_path, tok_dir, g, "b.jsonl.gz line 1", "no field 'body'", extra=("--text-field", "body"))


def test_zstd_errors(files, tok_dir, tmp_path, capsys):
    t = tmp_path / "t.txt.zst"
    t.write_bytes(files["txt.zst"].read_bytes()[:20000])
    _refused(capsys, tmp_path, tok_dir, t, "t.txt.zst", "truncated zstd")
    f = tmp_path / "fake.zst"
    f.write_text("plain text\n")
    _refused(capsys, tmp_path, tok_dir, f, "fake.zst", "not zstd data")


def test_parquet_and_datasets_errors(files, tok_dir, tmp_path, capsys):
    _refused(
        capsys,
        tmp_path,
        tok_dir,
        files["parquet"],
        "c.parquet",
        "no column 'text'",
        "columns: id, body",
        "--text-field",
    )
    _refused(
        capsys,
        tmp_path,
        tok_dir,
        files["parquet"],
        "column 'id' holds int64, expected text",
        extra=("--text-field", "id"),
    )
    bad = tmp_path / "cut.parquet"
    bad.write_bytes(files["parquet"].read_bytes()[:5000])
    _refused(capsys, tmp_path, tok_dir, bad, "cut.parquet", "not a readable Parquet file")
    fake = tmp_path / "fake.parquet"
    fake.write_text("text, not parquet\n")
    _refused(capsys, tmp_path, tok_dir, fake, "fake.parquet", "not a Parquet file")
    _refused(
        capsys,
        tmp_path,
        tok_dir,
        files["datasets"],
        "ds",
        "no column 'body'",
        "columns: text, n",
        extra=("--text-field", "body"),
    )
    dd = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": ["a b"]}), "test": datasets.Dataset.from_dict({"text": ["c"]})}
    ).save_to_disk(str(dd))
    capsys.readouterr()  # datasets' own progress bar while saving
    _refused(capsys, tmp_path, tok_dir, dd, "DatasetDict", "splits: test, train", f"{dd / 'test'}")
    code, _, err = run_main(
        capsys,
        "shard",
        dd / "train",
        "--tokenizer",
        tok_dir,
        "--out",
        tmp_path / "ok",
        "--valid-fraction",
        "0",
        "--quiet",
    )
    assert code == 0, err


@pytest.mark.parametrize(
    "kind,blocked,extra",
    [
        ("parquet", ["pyarrow", "pyarrow.parquet"], "parquet"),
        ("datasets", ["datasets"], "datasets"),
        ("jsonl.zst", ["zstandard", "compression", "compression.zstd"], "zstd"),
        ("txt.zst", ["zstandard", "compression", "compression.zstd"], "zstd"),
    ],
)
def test_missing_optional_package_names_the_extra(kind, blocked, extra, files, tok_dir, tmp_path, monkeypatch, capsys):
    for mod in blocked:
        monkeypatch.setitem(sys.modules, mod, None)  # import raises ImportError
    # refused before any work: also when the file comes after a plain one
    with pytest.raises(XLNetError, match=rf"pip install 'xlnetcli\[{extra}\]'"):
        expand_inputs([files["plain"], files[kind]])
    _refused(
        capsys, tmp_path, tok_dir, files[kind], f"pip install 'xlnetcli[{extra}]'", extra=("--text-field", _field(kind))
    )


def test_detect_format_refusals(tmp_path):
    g = tmp_path / "x.txt.gz"
    g.write_text("not gzip")
    with pytest.raises(DataError, match=r"has a \.gz name but is not gzip data"):
        detect_format(g)
    z = tmp_path / "x.parquet.gz"
    with gzip.open(z, "wb") as f:
        f.write(b"PAR1")
    with pytest.raises(DataError, match="Parquet files compress internally"):
        detect_format(z)
    # compressed data with another name: the magic bytes decide
    h = tmp_path / "corpus.txt"
    h.write_bytes(gzip.compress(b"hello\n"))
    assert detect_format(h) == corpus_mod.InputFormat("text", "gzip")
