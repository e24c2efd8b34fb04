"""Corpora at URLs (data/corpus/remote.py): fsspec's memory:// filesystem and a plain HTTP server on the loopback
address,
started here (no network). The same bytes give the same shards and tokenizer, local or remote; files stream; every
failure of a remote read is one `xlnet: error:` line naming the URL, with nothing written."""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import socket
import threading
import uuid
from pathlib import Path

import pytest
from clitools import SAMPLE, assert_one_line_error, run_main, settings_config

from xlnetcli.config import TokenizerConfig
from xlnetcli.core.errors import DataError
from xlnetcli.data.corpus.inputs import expand_inputs
from xlnetcli.data.corpus.reader import FileStats, iter_file_text
from xlnetcli.data.corpus.remote import RemoteFile
from xlnetcli.data.shards.shard import ShardOptions, shard_corpus

fsspec = pytest.importorskip("fsspec")

TEXT = SAMPLE.read_bytes()


@pytest.fixture(scope="module")
def tok_dir(builds) -> Path:
    """Shared with test_shard.py (conftest.py's builds): read only."""
    return builds.tokenizer(TokenizerConfig(vocab_size=2000, character_coverage=0.9999, threads=1))


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files of the served folder, plus /truncated.txt (closes after half its Content-Length) and /slow.txt (waits
    for the test's event after the first 64 KiB)."""

    release: threading.Event

    def do_GET(self) -> None:
        if self.path in ("/truncated.txt", "/slow.txt"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(TEXT)))
            self.end_headers()
            half = 1 << 16
            self.wfile.write(TEXT[:half])
            self.wfile.flush()
            if self.path == "/truncated.txt":
                self.close_connection = True
                return
            self.release.wait(30)
            self.wfile.write(TEXT[half:])
            return
        super().do_GET()

    def do_HEAD(self) -> None:
        if self.path in ("/truncated.txt", "/slow.txt"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(TEXT)))
            self.end_headers()
            return
        super().do_HEAD()

    def log_message(self, *args) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that stops reading early (the format probe reads 4 bytes) resets the connection: expected


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base URL, served folder): sample.txt, its .gz copy, sub/more.txt and a hidden file."""
    pytest.importorskip("aiohttp", reason="fsspec's http:// needs aiohttp (the `remote` extra)")
    root = tmp_path_factory.mktemp("served")
    (root / "sample.txt").write_bytes(TEXT)
    (root / "sample.txt.gz").write_bytes(gzip.compress(TEXT, mtime=0))
    (root / "sub").mkdir()
    (root / "sub" / "more.txt").write_text("More text.\n", encoding="utf-8")
    (root / ".hidden.txt").write_text("hidden\n", encoding="utf-8")
    release = threading.Event()
    handler = type("H", (_Handler,), {"release": release})
    srv = _Server(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}/", release
    release.set()
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def mem():
    """A fresh folder of fsspec's memory filesystem: memory://<id>/ (removed after the test)."""
    fs = fsspec.filesystem("memory")
    root = f"/{uuid.uuid4().hex}"
    yield fs, f"memory://{root}"
    fs.rm(root, recursive=True)


def shard(inputs, out, tok, **kw):
    cfg = settings_config("data", valid_fraction=0.1, seed=7)
    return shard_corpus(cfg, [str(i) for i in inputs], out, tok, ShardOptions(quiet=True, shards=2, **kw))


def shard_bytes(d: Path) -> dict[str, bytes]:
    """The shard files and the manifest's splits: all but the recorded input names."""
    files = {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.glob("*/*.npy"))}
    manifest = json.loads((d / "manifest.json").read_text())
    return {**files, "splits": json.dumps(manifest["splits"]).encode()}


def test_shards_identical_local_http_gzip_memory(tmp_path, tok_dir, server, mem):
    base, _ = server
    fs, root = mem
    fs.pipe(f"{root}/sample.txt", TEXT)
    local = shard([SAMPLE], tmp_path / "local", tok_dir)
    want = shard_bytes(tmp_path / "local")
    assert len(want) == 7  # 2 train shards and a valid one (tokens, sentence ids) and the splits
    for name, url in [("http", base + "sample.txt"), ("gz", base + "sample.txt.gz"), ("mem", f"{root}/sample.txt")]:
        s = shard([url], tmp_path / name, tok_dir)
        assert shard_bytes(tmp_path / name) == want, name
        assert s.tokens == local.tokens and s.documents == local.documents
        assert json.loads((tmp_path / name / "manifest.json").read_text())["inputs"]["train"] == [url]
    # --valid from a URL: the same split as the local file gives
    more = tmp_path / "more.txt"
    more.write_text("More text.\n", encoding="utf-8")
    a = shard([SAMPLE], tmp_path / "va", tok_dir, valid_inputs=[base + "sub/more.txt"])
    b = shard([SAMPLE], tmp_path / "vb", tok_dir, valid_inputs=[more])
    assert a.documents == b.documents == {"train": local.documents["train"] + local.documents["valid"], "valid": 1}
    assert shard_bytes(tmp_path / "va") == shard_bytes(tmp_path / "vb")


def test_tokenize_train_from_url_same_model(tmp_path, server, capsys):
    base, _ = server
    args = ["--vocab-size", "500", "--threads", "1", "--quiet"]
    assert run_main(capsys, "tokenize", "train", SAMPLE, "--out", tmp_path / "local", *args)[0] == 0
    assert run_main(capsys, "tokenize", "train", base + "sample.txt.gz", "--out", tmp_path / "url", *args)[0] == 0
    local, url = (json.loads((tmp_path / d / "xlnet_tokenizer.json").read_text()) for d in ("local", "url"))
    assert url["sha256"] == local["sha256"] and url["train"]["inputs"] == [base + "sample.txt.gz"]


def test_directories_globs_and_duplicates(server, mem):
    base, _ = server
    fs, root = mem
    for name in ("a.txt", "sub/c.txt", ".hidden.txt", "sub/.d/e.txt", "docs/notes.md"):
        fs.pipe(f"{root}/{name}", b"x\n")
    fs.pipe(f"{root}/b.jsonl.gz", gzip.compress(b'{"text": "x"}\n'))
    names = [f.name for f in expand_inputs([root])]
    assert names == ["a.txt", "b.jsonl.gz", "c.txt"]  # recursive, sorted, hidden and non-corpus names left out
    assert all(isinstance(f, RemoteFile) and f.size == fs.size(f.path) for f in expand_inputs([root]))
    assert [f.name for f in expand_inputs([f"{root}/*.txt", f"{root}/**/*.txt"])] == ["a.txt", "c.txt"]  # de-dup
    assert [str(f) for f in expand_inputs([base])] == [
        base + "sample.txt",
        base + "sample.txt.gz",
        base + "sub/more.txt",
    ]
    assert [str(f) for f in expand_inputs([base + "*.gz"])] == [base + "sample.txt.gz"]
    for bad, msg in [(f"{root}/*.zzz", "matches no files"), (f"{root}/docs", "holds no text files")]:
        with pytest.raises(DataError, match=msg):
            expand_inputs([bad])


def test_http_streams_before_the_response_ends(server):
    """The first text block arrives while the server still holds back the rest: nothing is downloaded first."""
    base, release = server
    release.clear()
    [f] = expand_inputs([base + "slow.txt"])
    blocks = iter_file_text(f, FileStats(f), block=1 << 20)
    first = next(blocks)
    assert not release.is_set() and 0 < len(first) <= 1 << 16
    release.set()
    assert (first + "".join(blocks)).encode() == TEXT


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed at once: nothing listens there


@pytest.mark.parametrize(
    ("path", "needles"),
    [
        ("missing.txt", ["missing.txt does not exist"]),
        ("truncated.txt", ["cannot read http://127.0.0.1", "truncated.txt"]),
        ("refused", ["cannot read http://127.0.0.1:", "refused.txt"]),
    ],
)
def test_bad_urls_one_line_nothing_written(tmp_path, tok_dir, server, capsys, path, needles):
    base, _ = server
    url = f"http://127.0.0.1:{_refused_port()}/refused.txt" if path == "refused" else base + path
    for argv in (["shard", url, "--tokenizer", tok_dir], ["tokenize", "train", url, "--vocab-size", "500"]):
        code, _, err = run_main(capsys, *argv, "--out", tmp_path / "out", "--quiet")
        assert_one_line_error(code, err, *needles)
        assert not any(tmp_path.iterdir())  # no output, no temporary folder left
    # a truncated file after a good one: the run fails, nothing half-written
    code, _, err = run_main(capsys, "shard", SAMPLE, url, "--tokenizer", tok_dir, "--out", tmp_path / "o", "--quiet")
    assert_one_line_error(code, err, *needles)
    assert not any(tmp_path.iterdir())


def test_unknown_protocol_missing_package_and_remote_parquet(tmp_path, tok_dir, mem, capsys, monkeypatch):
    fs, root = mem
    code, _, err = run_main(capsys, "shard", "nosuch://bucket/a.txt", "--tokenizer", tok_dir, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "unknown protocol nosuch://")

    def no_s3fs(protocol):
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec, "get_filesystem_class", no_s3fs)
    code, _, err = run_main(capsys, "tokenize", "train", "s3://bucket/corpus/*.gz", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "reading s3:// URLs needs the s3fs package: pip install s3fs")
    monkeypatch.undo()
    fs.pipe(f"{root}/t.parquet", b"PAR1" + b"\0" * 16)
    code, _, err = run_main(capsys, "shard", f"{root}/t.parquet", "--tokenizer", tok_dir, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "Parquet inputs must be local files")
    assert not any(tmp_path.iterdir())


def test_outputs_checked_against_local_inputs_only(tmp_path, tok_dir, server, capsys):
    base, _ = server
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(TEXT)
    code, _, err = run_main(
        capsys, "shard", base + "sample.txt", corpus / "a.txt", "--tokenizer", tok_dir, "--out", corpus, "--overwrite"
    )
    assert_one_line_error(code, err, "holds the input")
    code, _, err = run_main(
        capsys,
        "shard",
        base + "sample.txt",
        "--valid",
        base + "sample.txt",
        "--tokenizer",
        tok_dir,
        "--out",
        tmp_path / "o",
    )
    assert_one_line_error(code, err, "is both a training input and a --valid file")
