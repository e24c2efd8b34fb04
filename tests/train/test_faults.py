"""Fault injection: SIGKILL a pretraining run at many random moments (a third of them while a checkpoint is being
written); every `--resume` continues, and the final checkpoint is byte-identical to an uninterrupted run's."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import pytest
from clitools import BIN, MICRO_MODEL, child_env, kill_and_resume, train_losses, write_config

from xlnetcli.core.files import sha256_file

KILLS = int(os.environ.get("XLNET_FAULT_KILLS", "9"))  # 3 of them mid-save; XLNET_FAULT_KILLS=60 for a long sweep
STEPS = 60
FAULT_RUN = [
    *MICRO_MODEL,
    "model.n_layer=2",
    "train.warmup_steps=2",
    "train.log_every=1",
    "train.eval_batches=1",
    "train.eval_every=5",
    "train.save_every=1",
    "train.keep_last=2",
    f"train.max_steps={STEPS}",
]


@pytest.fixture(scope="module")
def setup(builds, tmp_path_factory) -> tuple[Path, Path]:
    """The records (shared, conftest.py: read only) and the config file of the runs."""
    cfg = write_config(tmp_path_factory.mktemp("faults") / "cfg.yaml", FAULT_RUN)
    return builds.pipeline(FAULT_RUN).records, cfg


def _start(records: Path, cfg: Path, out: Path) -> subprocess.Popen:
    cmd = [
        str(BIN / "xlnet"),
        "pretrain",
        "--config",
        str(cfg),
        "--data",
        str(records),
        "--out",
        str(out),
        "--resume",
        "--quiet",
    ]
    return subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_for_progress(proc: subprocess.Popen, run: Path, timeout: float = 120) -> bool:
    """Until the run has logged a new metric line (it is past start-up), or has exited."""

    def lines() -> int:
        try:  # a restart before the first checkpoint removes the file: it may vanish between two looks
            return (run / "metrics.jsonl").read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    start, deadline = lines(), time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        if lines() > start:
            return True
        time.sleep(0.005)
    return False


def _wait_for_save(proc: subprocess.Popen, run: Path, timeout: float = 120) -> bool:
    """Until a checkpoint is being written (its hidden temp folder exists), or the process exited."""
    deadline = time.time() + timeout
    while proc.poll() is None and time.time() < deadline:
        if run.is_dir() and any(p.name.startswith(".step_") for p in run.iterdir()):
            return True
        time.sleep(0.001)
    return False


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_the_uninterrupted_checkpoint(setup, tmp_path):
    records, cfg = setup
    ref = subprocess.run(
        [
            str(BIN / "xlnet"),
            "pretrain",
            "--config",
            str(cfg),
            "--data",
            str(records),
            "--out",
            str(tmp_path / "ref"),
            "--quiet",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ref.returncode == 0, ref.stderr
    rng = random.Random(20261123)
    run = tmp_path / "faulty"
    during_save = 0

    def strike(proc: subprocess.Popen, k: int) -> None:
        nonlocal during_save
        if k % 3 == 2:  # a third of the kills land while a checkpoint is being written
            during_save += _wait_for_save(proc, run)
        elif _wait_for_progress(proc, run):
            time.sleep(rng.uniform(0.0, 0.1))

    kills = kill_and_resume(lambda: _start(records, cfg, run), KILLS, strike)
    assert kills == KILLS and during_save >= KILLS // 3 - 1, (kills, during_save)
    final = f"step_{STEPS:07d}"
    for name in ("model.safetensors", "train_state.safetensors", "config.yaml", "meta.json"):
        assert sha256_file(run / final / name) == sha256_file(tmp_path / "ref" / final / name), name
    assert train_losses(run) == train_losses(tmp_path / "ref")
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temp folder left behind
