"""Nothing lost, nothing silently wrong: output locks, outputs that are inputs, special-file targets, checksums of
checkpoints and records, torn metrics lines, byte-reproducible checkpoints, a step folder without its train state."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from clitools import BIN, MICRO_MODEL, SAMPLE, TINY, assert_one_line_error, child_env, flip_bit

from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.checkpoint.load import load_model_dir
from xlnetcli.config import load_config
from xlnetcli.core.errors import CheckpointError, DataError
from xlnetcli.core.files import lock_path
from xlnetcli.report.metrics_log import read_metrics

INTEGRITY_RUN = [
    *MICRO_MODEL,
    "model.n_layer=1",
    "train.warmup_steps=1",
    "train.log_every=1",
    "train.eval_batches=1",
    "train.save_every=2",
    "train.max_steps=4",
    "train.eval_every=never",
]


def _xlnet(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = child_env()
    return subprocess.run(
        [str(BIN / "xlnet"), *map(str, args)], env=env, capture_output=True, text=True, timeout=300, cwd=cwd
    )


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert_one_line_error(proc.returncode, proc.stderr, *needles)


@pytest.fixture(scope="module")
def pipeline(builds, tmp_path_factory) -> dict[str, Path]:
    """tokenizer -> shards -> records (shared, conftest.py: read only) -> a 4-step pretraining run of this module
    with checkpoints at steps 2 and 4."""
    from xlnetcli.train.pretrain import pretrain

    tmp = tmp_path_factory.mktemp("integrity")
    torch.set_num_threads(1)
    tok, shards, rec = builds.pipeline(INTEGRITY_RUN)
    pretrain(load_config(TINY, INTEGRITY_RUN), rec, tmp / "run", device="cpu", quiet=True)
    return {"tok": tok, "shards": shards, "rec": rec, "run": tmp / "run"}


# ---- one writer per output -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_writer_gets_a_one_line_error_naming_the_first(pipeline, tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out = tmp_path / "shards"
        lock_path(out).write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid, "started": 0}))
        proc = _xlnet("shard", "--out", out, "--tokenizer", pipeline["tok"], SAMPLE)
        _one_line_error(proc, "being written by another xlnet run", str(sleeper.pid))
        assert not out.exists()
        lock_path(tmp_path / "run").write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid}))
        proc = _xlnet("pretrain", "--config", TINY, "--data", pipeline["rec"], "--out", tmp_path / "run")
        _one_line_error(proc, "being written by another xlnet run")
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow
def test_two_pretraining_processes_on_one_folder_one_is_refused(pipeline, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    from xlnetcli.config import dump_config

    cfg.write_text(dump_config(load_config(TINY, [*INTEGRITY_RUN, "train.max_steps=400", "train.save_every=end"])))
    env = child_env()
    first = subprocess.Popen(
        [
            str(BIN / "xlnet"),
            "pretrain",
            "--config",
            str(cfg),
            "--data",
            str(pipeline["rec"]),
            "--out",
            str(tmp_path / "run"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        import time

        deadline = time.time() + 120
        while not (tmp_path / "run" / "metrics.jsonl").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
        second = _xlnet("pretrain", "--config", cfg, "--data", pipeline["rec"], "--out", tmp_path / "run")
        _one_line_error(second, "being written by another xlnet run", str(first.pid))
    finally:
        first.kill()
        first.wait()


# ---- an output that is an input ------------------------------------------------------------------------------


@pytest.mark.slow
def test_outputs_that_are_or_hold_an_input_are_refused_and_the_input_survives(pipeline, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(SAMPLE, corpus / "a.txt")
    proc = _xlnet("tokenize", "train", corpus, "--out", corpus, "--overwrite", "--set", "tokenizer.vocab_size=500")
    _one_line_error(proc, "holds the input")
    assert (corpus / "a.txt").read_bytes() == SAMPLE.read_bytes()
    shards = tmp_path / "shards"
    shutil.copytree(pipeline["shards"], shards)
    before = sorted(p.name for p in shards.rglob("*"))
    proc = _xlnet("preprocess", "--shards", shards, "--out", shards, "--overwrite")
    _one_line_error(proc, "is the input")
    assert sorted(p.name for p in shards.rglob("*")) == before
    proc = _xlnet("shard", "--tokenizer", pipeline["tok"], "--out", tmp_path, "--overwrite", corpus / "a.txt")
    _one_line_error(proc, "holds the input")
    proc = _xlnet("export", pipeline["run"], "--out", pipeline["run"] / "step_0000004" / "hf")
    _one_line_error(proc, "lies inside the input")
    assert (pipeline["run"] / "step_0000004" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_full_device_as_output_is_a_one_line_disk_full_error(pipeline, tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    proc = _xlnet("eval", pipeline["run"], "--data", pipeline["rec"], "--output", "/dev/full")
    _one_line_error(proc, "disk full")
    assert Path("/dev/full").is_char_device()


@pytest.mark.slow
def test_a_symlinked_output_folder_is_refused(pipeline, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    proc = _xlnet("export", pipeline["run"], "--out", tmp_path / "link", "--overwrite")
    _one_line_error(proc, "symbolic link")
    assert (tmp_path / "link").is_symlink()


# ---- checksums ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_flipped_bit_in_a_checkpoint_is_refused_on_load_and_resume(pipeline, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(pipeline["run"], run)
    meta = json.loads((run / "step_0000004" / "meta.json").read_text())
    assert set(meta["sha256"]) >= {
        "model.safetensors",
        "train_state.safetensors",
        "config.yaml",
        "tokenizer/spiece.model",
    }
    load_model_dir(run)  # intact: loads
    flip_bit(run / "step_0000004" / "model.safetensors", 100)
    with pytest.raises(CheckpointError, match=r"model\.safetensors does not match the checksum"):
        load_model_dir(run)
    proc = _xlnet("export", run, "--out", tmp_path / "hf")
    _one_line_error(proc, "does not match the checksum")
    assert not (tmp_path / "hf").exists()
    flip_bit(run / "step_0000002" / "train_state.safetensors", 50)
    proc = _xlnet("pretrain", "--data", pipeline["rec"], "--out", run, "--resume", "2", "--rewind")
    _one_line_error(proc, "train_state.safetensors does not match the checksum")
    assert (run / "step_0000004").is_dir() and not list(run.glob("rewound_*"))  # refused before the rewind


@pytest.mark.slow
def test_a_flipped_bit_in_the_records_is_refused_when_pretraining_opens_them(pipeline, tmp_path):
    from xlnetcli.data.records.format import open_records

    rec = tmp_path / "rec"
    shutil.copytree(pipeline["rec"], rec)
    meta = json.loads((rec / "meta.json").read_text())
    assert "train/pass_000.masked.npy" in meta["sha256"]
    flip_bit(rec / "train" / "pass_000.masked.npy", 100)
    with pytest.raises(DataError, match=r"pass_000\.masked\.npy does not match the checksum"):
        open_records(rec, "train")
    open_records(rec, "train", verify=False)
    proc = _xlnet("pretrain", "--data", rec, "--out", tmp_path / "run")
    _one_line_error(proc, "does not match the checksum", "re-run `xlnet preprocess`")
    assert not (tmp_path / "run" / "step_0000002").exists()


@pytest.mark.slow
def test_checkpoints_are_byte_reproducible_across_processes(pipeline, tmp_path):
    from xlnetcli.core.files import sha256_file

    code = (
        "import sys, torch; from xlnetcli.checkpoint.folders import save_model_dir;"
        "from xlnetcli.checkpoint.load import load_model_dir;"
        "from xlnetcli.model import XLNetLMHeadModel;"
        "cfg, sd, _ = load_model_dir(sys.argv[1]); m = XLNetLMHeadModel(cfg.model); m.load_state_dict(sd);"
        "save_model_dir(sys.argv[2], m, cfg, tokenizer_dir=sys.argv[3], meta={'kind': 'pretrain', 'step': 4})"
    )
    for name, seed in (("a", "1"), ("b", "2")):  # different hash seeds: dict/set orders differ between the two
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run(
            [sys.executable, "-c", code, str(pipeline["run"]), str(tmp_path / name), str(pipeline["tok"])],
            env=env,
            check=True,
            timeout=120,
        )
    files = sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*") if p.is_file())
    for f in files:
        assert sha256_file(tmp_path / "a" / f) == sha256_file(tmp_path / "b" / f), f


# ---- crash leftovers --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_torn_last_metrics_line_is_skipped_by_readers_and_dropped_on_resume(pipeline, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(pipeline["run"], run)
    rows = read_metrics(run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "split": "train", "lo')  # killed mid-append
    assert read_metrics(run) == rows
    proc = _xlnet("plot", run, "--out", tmp_path / "c.png")
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr  # 2 only when matplotlib is missing
    (run / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(DataError, match="line 2"):
        read_metrics(run)
    shutil.rmtree(run)
    shutil.copytree(pipeline["run"], run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "split": "tr')
    proc = _xlnet("pretrain", "--data", pipeline["rec"], "--out", run, "--resume", "2", "--rewind")
    assert proc.returncode == 0, proc.stderr
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(ln) for ln in lines)

    def key(r):
        return r["step"], r["loss"], r["lr"]

    assert [key(r) for r in read_metrics(run) if r["split"] == "train"] == [
        key(r) for r in rows if r["split"] == "train"
    ]


@pytest.mark.slow
def test_a_step_folder_without_its_train_state_is_not_silently_restarted(pipeline, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(pipeline["run"], run)
    shutil.rmtree(run / "step_0000002")
    (run / "step_0000004" / "train_state.safetensors").unlink()
    metrics = (run / "metrics.jsonl").read_bytes()
    proc = _xlnet("pretrain", "--data", pipeline["rec"], "--out", run, "--resume")
    _one_line_error(proc, "step_0000004", "no train_state")
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert (run / "step_0000004" / "model.safetensors").is_file()


def test_save_model_dir_records_checksums_last(tmp_path, pipeline):
    from xlnetcli.model import XLNetLMHeadModel

    cfg, sd, _ = load_model_dir(pipeline["run"])
    m = XLNetLMHeadModel(cfg.model)
    m.load_state_dict(sd)
    save_model_dir(tmp_path / "c", m, cfg, meta={"kind": "x"}, extra_files={"extra.bin": b"123"})
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert meta["kind"] == "x" and set(meta["sha256"]) == {"model.safetensors", "config.yaml", "extra.bin"}
