"""Corpora at URLs (data/remote.py): fsspec's memory:// filesystem and a plain HTTP server on the loopback address,
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
from xlnetcli.data.corpus import FileStats, expand_inputs, iter_file_text
from xlnetcli.data.remote import RemoteFile
from xlnetcli.data.shard import shard_corpus

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
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    srv.daemon_threads = True
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
    return shard_corpus(cfg, [str(i) for i in inputs], out, tok, quiet=True, shards=2, **kw)


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
