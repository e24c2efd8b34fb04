"""Issue #22, class 9: signals in quick succession.

Schedulers and users repeat SIGTERM. Two of them 0.3 s apart must end a pretraining run the way one does: the
checkpoint written, exit 75, and an exact resume; the second must never kill the process with 143 on its way out
(preemption.PreemptionGuard ignores SIGTERM once a stop was requested). Real subprocesses, several trials in one run.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clitools import FAST_PRETRAIN, child_env, step_weights, train_losses, write_config

pytestmark = pytest.mark.slow  # 4 pretraining processes

TRIALS = 2  # the first stops a fresh run, the second a resumed one
STEPS = 60


def _cmd(records: Path, cfg: Path, run: Path, *extra: str) -> list[str]:
    base = [sys.executable, "-m", "xlnetcli", "pretrain", "--config", str(cfg), "--data", str(records)]
    return [*base, "--out", str(run), "--quiet", *extra]


def _rows(run: Path) -> int:
    try:
        return (run / "metrics.jsonl").read_text().count("\n")
    except OSError:
        return 0


def test_two_sigterms_in_quick_succession_exit_75_and_resume_exactly(builds, tmp_path):
    records = builds.pipeline(FAST_PRETRAIN).records
    cfg = write_config(
        tmp_path / "cfg.yaml",
        [*FAST_PRETRAIN, f"train.max_steps={STEPS}", "train.save_every=end", "train.eval_every=never"],
    )
    ref = subprocess.run(_cmd(records, cfg, tmp_path / "ref"), env=child_env(), capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    run, codes = tmp_path / "run", []
    for _ in range(TRIALS):
        start = _rows(run)
        proc = subprocess.Popen(_cmd(records, cfg, run, "--resume"), env=child_env(), stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while proc.poll() is None and _rows(run) < start + 3 and time.time() < deadline:
            time.sleep(0.01)  # training is under way in this process
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        codes.append(proc.returncode)
        assert proc.returncode == 75 and "written; continue with --resume" in err, (codes, err)
    final = subprocess.run(_cmd(records, cfg, run, "--resume"), env=child_env(), capture_output=True, text=True)
    assert final.returncode == 0, final.stderr
    assert train_losses(run) == train_losses(tmp_path / "ref")
    last = f"step_{STEPS:07d}"
    wa, wb = step_weights(tmp_path / "ref" / last), step_weights(run / last)
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
