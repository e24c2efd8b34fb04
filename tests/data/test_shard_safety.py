"""Shards are checked and runs leave nothing behind: preprocess verifies the manifest's sha256 (a flipped byte is
refused, naming the file); a killed `shard` / `tokenize train` leaves a temporary folder that the next run removes;
SIGTERM cleans up as Ctrl-C does (preprocess with helpers too); a `shard` worker whose parent died exits quietly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from clitools import (
    CORPUS,
    MICRO_MODEL,
    TINY,
    assert_one_line_error,
    child_env,
    child_pids,
    flip_bit,
    run_main,
    set_args,
    wait_gone,
)

from xlnetcli.config import load_config
from xlnetcli.core.errors import DataError
from xlnetcli.data.records.preprocess import preprocess
from xlnetcli.data.shards.format import verify_shards

pytestmark = pytest.mark.slow  # every test here trains, runs subprocesses or builds large inputs

SETS = [
    "tokenizer.vocab_size=1000",
    "model.vocab_size=1000",
    "data.seq_len=32",
    "model.reuse_len=16",
    "data.num_predict=6",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "data.valid_fraction=0.05",
]


@pytest.fixture(scope="module")
def shards(builds) -> Path:
    """Shared (conftest.py): read only; tests that flip a byte work on a copy."""
    return builds.shards(builds.tokenizer(load_config(TINY, SETS).tokenizer), shards=2, valid_fraction=0.05)


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _flip_token(path: Path, at: int, vocab: int) -> None:
    """Change one token id in place to another id inside the vocabulary (the data still looks plausible)."""
    arr = np.load(path, mmap_mode="r+")
    v = int(arr[at])
    arr[at] = v ^ 1 if (v ^ 1) < vocab else v - 1
    arr.flush()
    del arr


# ---- manifest sha256 ------------------------------------------------------------------------------------------


def test_preprocess_refuses_a_flipped_byte_naming_the_shard(shards, tmp_path, capsys):
    bad = _copy(shards, tmp_path / "shards")
    target = bad / "train" / "shard_00001.tokens.npy"
    _flip_token(target, 200, 1000)
    args = ["preprocess", "--shards", bad, "--config", TINY, *set_args(SETS)]
    code, _, err = run_main(capsys, *args, "--out", tmp_path / "rec")
    assert_one_line_error(code, err, str(target), "sha256", "rerun `xlnet shard`")
    assert not (tmp_path / "rec").exists() and not list(tmp_path.glob(".rec.*"))
    code, _, err = run_main(capsys, *args, "--out", tmp_path / "rec", "--workers", "2")  # hashed in parallel
    assert_one_line_error(code, err, str(target))
    # --no-verify: the user takes the data as it is
    code, _out, err = run_main(capsys, *args, "--out", tmp_path / "rec", "--no-verify")
    assert code == 0, err
    assert json.loads((tmp_path / "rec" / "meta.json").read_text())["splits"]["train"]["tokens"] > 0


def test_no_verify_records_are_readable_and_checked_against_what_they_were_made_from(shards, tmp_path, capsys):
    """#35: records made with --no-verify from a shard that no longer matches its manifest could never be read (every
    reader refused the shard as changed since). They record the sha256 of the bytes they were made from, say so in a
    line, open with every check on, and a later change to those bytes is still refused."""
    from xlnetcli.data.records.format import open_records

    bad = _copy(shards, tmp_path / "shards")
    target = bad / "train" / "shard_00001.tokens.npy"
    _flip_token(target, 200, 1000)
    args = ["preprocess", "--shards", bad, "--config", TINY, *set_args(SETS), "--out", tmp_path / "rec", "--no-verify"]
    code, out, err = run_main(capsys, *args)
    assert code == 0, err
    assert "1 shard file(s) do not match" in out + err and "train/shard_00001.tokens.npy" in out + err
    for split in ("train", "valid"):
        open_records(tmp_path / "rec", split)  # verified: the shards are as the records were made from them
    code, _, err = run_main(
        capsys,
        "pretrain",
        "--data",
        tmp_path / "rec",
        "--out",
        tmp_path / "run",
        *set_args([*MICRO_MODEL, "model.n_layer=1", "train.max_steps=1", "train.warmup_steps=0"]),
    )
    assert code == 0, err
    _flip_token(target, 300, 1000)  # changed after the records were made: refused as any records would
    with pytest.raises(DataError, match=r"shard_00001\.tokens\.npy changed since the records"):
        open_records(tmp_path / "rec", "train")


def test_verify_names_the_sentence_id_file_and_old_manifests(shards, tmp_path):
    bad = _copy(shards, tmp_path / "shards")
    sid = bad / "valid" / "shard_00000.sentid.npy"
    flip_bit(sid, 1)
    with pytest.raises(DataError, match=r"shard_00000\.sentid\.npy does not match manifest\.json"):
        verify_shards(bad)
    with pytest.raises(DataError, match=r"valid/shard_00000\.sentid\.npy"):
        preprocess(load_config(TINY, SETS), bad, tmp_path / "rec", quiet=True)
    m = json.loads((bad / "manifest.json").read_text())
    del m["splits"]["train"][0]["sha256"]
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"records no sha256.*--no-verify"):
        verify_shards(bad)
    assert verify_shards(shards)["splits"]["train"]  # the untouched shards pass


# ---- stale temporary folders ------------------------------------------------------------------------------------


def _big_corpus(path: Path, copies: int = 60) -> Path:
    text = CORPUS.read_bytes()
    with open(path, "wb") as f:
        for _ in range(copies):
            f.write(text + b"\n")
    return path


def _start(args: list, err_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "xlnetcli", *map(str, args)],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=open(err_path, "wb"),
    )


def _temps(out: Path) -> list[Path]:
    return list(out.parent.glob(f".{out.name}.*.tmp"))


def _wait_for_temp(p: subprocess.Popen, out: Path, after: float = 0.7) -> None:
    deadline = time.time() + 120
    while not _temps(out):
        assert p.poll() is None, "finished before it could be interrupted"
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(after)  # well into the work
    assert p.poll() is None, "finished before it could be interrupted"


@pytest.fixture(scope="module")
def big(builds, tmp_path_factory) -> tuple[Path, Path]:
    """A corpus that takes seconds to shard (about 5 s with 2 workers on 2 idle cores: 15 copies took 1.6 s, too
    close to the 1 s the parent-death test waits), and the shared tokenizer (read only)."""
    big = _big_corpus(tmp_path_factory.mktemp("big") / "big.txt")
    return big, builds.tokenizer(load_config(TINY, SETS).tokenizer)


def _command(kind: str, big: tuple[Path, Path], out: Path) -> list:
    corpus, tok = big
    if kind == "shard":
        return ["shard", corpus, "--tokenizer", tok, "--out", out, "--workers", "2", "--quiet"]
    return ["tokenize", "train", corpus, "--out", out, "--vocab-size", "1000", "--threads", "1", "--quiet"]


@pytest.mark.parametrize("kind", ["shard", "tokenize"])
def test_sigkill_leaves_a_temp_that_the_next_run_removes(kind, big, tmp_path):
    out = tmp_path / "out"
    p = _start(_command(kind, big, out), tmp_path / "err1")
    _wait_for_temp(p, out)
    p.send_signal(signal.SIGKILL)
    p.wait()
    time.sleep(0.5)  # a shard worker ends with its parent
    left = _temps(out)
    assert len(left) == 1 and not out.exists()  # what the issue saw: a hidden temp folder, no output
    corpus = big[0]
    small = tmp_path / "small.txt"
    small.write_bytes(CORPUS.read_bytes()[:400_000])
    args = [a if a != corpus else small for a in _command(kind, big, out)]
    r = subprocess.run(
        [sys.executable, "-m", "xlnetcli", *map(str, args)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert _temps(out) == [] and out.is_dir()


@pytest.mark.parametrize("kind", ["shard", "tokenize"])
def test_sigterm_cleans_up_like_ctrl_c(kind, big, tmp_path):
    out = tmp_path / "out"
    p = _start(_command(kind, big, out), tmp_path / "err")
    _wait_for_temp(p, out)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    err = (tmp_path / "err").read_text()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["xlnet: terminated (SIGTERM); partial output removed"], err
    assert _temps(out) == [] and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_shard_worker_whose_parent_died_exits_quietly(big, tmp_path):
    out = tmp_path / "out"
    p = _start(_command("shard", big, out), tmp_path / "err")
    _wait_for_temp(p, out, after=1.0)
    kids = child_pids(p.pid)
    p.send_signal(signal.SIGKILL)  # the parent only: its workers are orphaned mid-chunk
    p.wait()
    wait_gone(kids, 20, "a worker outlived its parent")
    time.sleep(0.3)
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.fixture(scope="module")
def big_shards(big, tmp_path_factory) -> Path:
    """The big corpus sharded (seconds): enough for a preprocess that runs long enough to be interrupted."""
    out = tmp_path_factory.mktemp("big_shards") / "shards"
    r = subprocess.run(
        [sys.executable, "-m", "xlnetcli", *map(str, _command("shard", big, out))],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return out


def test_preprocess_sigterm_with_helpers_cleans_up_and_leaves_no_process(big_shards, tmp_path):
    out = tmp_path / "rec"
    args = ["preprocess", "--shards", big_shards, "--out", out, "--config", TINY, *set_args(SETS), "--workers", "2"]
    p = _start(args, tmp_path / "err")
    _wait_for_temp(p, out, after=1.0)
    kids = child_pids(p.pid)
    assert kids  # a helper is running
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    lines = [ln for ln in (tmp_path / "err").read_text().splitlines() if ln.strip()]
    assert lines == ["xlnet: terminated (SIGTERM); partial output removed"], lines
    assert _temps(out) == [] and not out.exists()
    wait_gone(kids)
