"""The run lifecycle (issue 35): going back to an earlier step is explicit and leaves a consistent run (--branch NEWRUN:
a new run folder; --rewind: in place, the later steps moved aside), a hand-edited RUN/config.yaml is refused on
resume, and SIGTERM while a run starts exits 75 in one line with the lock released (docs/operations.md, "Recovery
flows")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from clitools import FAST_PRETRAIN, TINY, assert_one_line_error, child_env, run_main, step_weights
from conftest import tree_digest

from xlnetcli.config import dump_config, load_config
from xlnetcli.core.files import lock_path
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.pretrain import PretrainWorkload, pretrain

torch.set_num_threads(1)

STEPS = ["train.max_steps=8", "train.save_every=2", "train.keep_last=10", "train.eval_every=never"]


@pytest.fixture(scope="module")
def records(builds) -> Path:
    """Shared (conftest.py): read only."""
    return builds.pipeline(FAST_PRETRAIN).records


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def _cfg(*extra: str):
    return load_config(TINY, [*FAST_PRETRAIN, *STEPS, *extra])


def _steps(run: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in run.glob("step_*"))


def _train_steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run) if r["split"] == "train"]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = step_weights(a), step_weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture
def finished(records, tmp_path) -> Path:
    """A finished 8-step run with checkpoints at 2, 4, 6, 8."""
    run = tmp_path / "run"
    pretrain(_cfg(), records, run, quiet=True)
    assert _steps(run) == [2, 4, 6, 8]
    return run


# ---- going back to an earlier step -----------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_from_an_earlier_step_in_place_is_refused_without_rewind(records, finished, tmp_path, capsys):
    """The issue's case: `--resume 4` on a finished run would train beside the old later checkpoints (and the next
    --resume took the old last one); it is refused in one line naming both ways on, nothing written."""
    before = tree_digest(finished)
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, "--resume", "4")
    assert_one_line_error(code, err, "checkpoints after step 4 (step_0000006, step_0000008)", "--branch", "--rewind")
    assert tree_digest(finished) == before
    for bad in (["--branch", tmp_path / "b"], ["--rewind"]):  # without --resume
        code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, *bad)
        assert_one_line_error(code, err, "goes with --resume STEP")
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, "--resume", "4", "--branch",
                            finished / "inside")  # fmt: skip
    assert_one_line_error(code, err, "--branch", "lies inside the input")
    assert tree_digest(finished) == before


@pytest.mark.slow
def test_branch_from_a_step_interrupted_and_requeued_is_a_consistent_run(records, finished, tmp_path, capsys):
    """Branch from step 4 with a lower lr into a new folder -> SIGTERM at step 6 (exit 75) -> requeued with
    `--out NEWRUN --resume` -> a run whose metric rows are steps 1-8 once each, with its own checkpoints only, and
    whose final weights are those of the same branch run uninterrupted; the run branched from is untouched."""
    before = tree_digest(finished)
    branch = ["--resume", "4", "--set", "train.lr=5e-4", "--quiet"]
    ref, new = tmp_path / "ref", tmp_path / "new"
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, *branch, "--branch", ref)
    assert code == 0, err
    # the same branch, stopped by SIGTERM during step 6
    real = PretrainWorkload.loss
    seen = {"n": 0}

    def sigterm_in_step_6(self, model, batch, micro):
        seen["n"] += 1  # 2 micro-batches a step, from step 5 on
        if seen["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, model, batch, micro)

    PretrainWorkload.loss = sigterm_in_step_6
    try:
        code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, *branch, "--branch", new)
    finally:
        PretrainWorkload.loss = real
    assert code == 75 and "continue with --resume" in err, err
    assert _steps(new) == [4, 6] and _train_steps(new) == [1, 2, 3, 4, 5, 6]
    # the same branch command again is refused (NEWRUN is a run now), then the requeue continues it
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, *branch, "--branch", new)
    assert_one_line_error(code, err, f"--branch {new} already holds a run", f"--out {new} --resume")
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", new, "--resume", "--quiet")
    assert code == 0, err
    assert _steps(new) == _steps(ref) == [4, 6, 8]
    assert _train_steps(new) == _train_steps(ref) == list(range(1, 9))
    assert _same_weights(new / "step_0000008", ref / "step_0000008")
    rows = read_metrics(new)
    branch_rows = [r for r in rows if r["split"] == "branch"]
    assert [(r["step"], r["from"]) for r in branch_rows] == [(4, str(finished.resolve()))]
    assert [(r["step"], r["key"], r["now"]) for r in rows if r["split"] == "change"] == [(4, "train.lr", 5e-4)]
    assert load_config(new / "config.yaml").train.lr == 5e-4
    # steps 1-4 are the original run's rows; the run branched from is as it was
    old = {r["step"]: r["loss"] for r in read_metrics(finished) if r["split"] == "train"}
    assert all(r["loss"] == old[r["step"]] for r in rows if r["split"] == "train" and r["step"] <= 4)
    assert tree_digest(finished) == before
    code, out, err = run_main(capsys, "pretrain", "--data", records, "--out", new, "--resume")
    assert code == 0 and "already complete: step 8 of 8" in out + err


@pytest.mark.slow
def test_rewind_in_place_interrupted_and_resumed_is_a_consistent_run(records, finished, capsys):
    """`--resume 4 --rewind`: the later steps and metric rows move aside, the run trains on from 4; stopped by SIGTERM
    at step 6 and resumed with a plain --resume, it ends with rows 1-8 once each and the weights of the exact run it
    replaced (kept aside)."""
    real = PretrainWorkload.loss
    seen = {"n": 0}

    def sigterm_in_step_6(self, model, batch, micro):
        seen["n"] += 1
        if seen["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, model, batch, micro)

    PretrainWorkload.loss = sigterm_in_step_6
    try:
        code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, "--resume", "4", "--rewind")
    finally:
        PretrainWorkload.loss = real
    assert code == 75, err
    aside = finished / "rewound_0000008_to_0000004"
    assert sorted(p.name for p in aside.iterdir()) == ["metrics.jsonl", "step_0000006", "step_0000008"]
    assert [r["step"] for r in read_metrics(aside) if r["split"] == "train"] == [5, 6, 7, 8]
    assert _steps(finished) == [2, 4, 6] and _train_steps(finished) == [1, 2, 3, 4, 5, 6]
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", finished, "--resume", "--quiet")
    assert code == 0, err
    assert _steps(finished) == [2, 4, 6, 8] and _train_steps(finished) == list(range(1, 9))
    assert _same_weights(finished / "step_0000008", aside / "step_0000008")  # an exact resume: the same run


# ---- a hand-edited config.yaml -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hand_edited_run_config_is_refused_on_resume(records, tmp_path, capsys):
    """RUN/config.yaml edited (model.dropout, train.weight_decay) disagrees with the checkpoint's checksummed
    config: `--resume` names both keys and --set for the changes a resume supports; nothing written. Restored, the
    resume goes on; an edit of a key a resume may change (train.lr) is taken and recorded, as --set would be."""
    run = tmp_path / "run"
    pretrain(_cfg(), records, run, quiet=True, stop_after=2)
    text = (run / "config.yaml").read_text()
    edited = text.replace("dropout: 0.1\n", "dropout: 0.3\n", 1).replace("weight_decay: 0.01\n", "weight_decay: 0.2\n")
    assert edited.count("0.3") > text.count("0.3") and "weight_decay: 0.2" in edited
    (run / "config.yaml").write_text(edited)
    before = tree_digest(run)
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", run, "--resume")
    needles = ["config.yaml differs from the config of checkpoint step_0000002", "model.dropout 0.3"]
    needles += ["checkpoint: 0.1", "train.weight_decay 0.2", "edited by hand", "with --set KEY=VALUE", "train.lr"]
    assert_one_line_error(code, err, *needles)
    assert tree_digest(run) == before
    (run / "config.yaml").write_text(text.replace("lr: 0.001\n", "lr: 0.0005\n", 1))
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", run, "--resume", "--quiet")
    assert code == 0, err
    assert [(r["key"], r["now"]) for r in read_metrics(run) if r["split"] == "change"] == [("train.lr", 5e-4)]


# ---- SIGTERM while starting ------------------------------------------------------------------------------------

# Runs `xlnet ARGS` with SIGTERM sent to itself as soon as the engine has set the run folder up (its config.yaml and
# metrics.jsonl written, the lock held, no step trained): the latest moment of the start.
_SIGTERM_IN_SETUP = """
import os, signal, sys
from xlnetcli.train.engine import Engine
real = Engine.setup
def setup(self, *args, **kwargs):
    out = real(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return out
Engine.setup = setup
from xlnetcli.cli import main
main(sys.argv[1:])
"""


def _xlnet_sigterm_in_setup(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", _SIGTERM_IN_SETUP, *[str(a) for a in args]]
    return subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)


def _assert_startup_stop(proc: subprocess.CompletedProcess) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 75, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("xlnet: stopped on SIGTERM while starting"), proc.stderr
    assert "rerun the same command" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_sigterm_while_a_pretraining_run_starts_exits_75_in_one_line_lock_released(records, tmp_path):
    """A fresh run: exit 75, one line, no lock, no run folder left (the same command starts it); a resume: the run
    folder byte for byte as it was, then the same command continues it."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(dump_config(_cfg("train.max_steps=4")))
    run = tmp_path / "run"
    argv = ["pretrain", "--config", cfg, "--data", records, "--out", run, "--quiet"]
    _assert_startup_stop(_xlnet_sigterm_in_setup(*argv))
    assert not lock_path(run).exists() and not run.exists()
    pretrain(load_config(cfg), records, run, quiet=True, stop_after=2)
    before = tree_digest(run)
    _assert_startup_stop(_xlnet_sigterm_in_setup(*argv, "--resume"))
    assert not lock_path(run).exists() and tree_digest(run) == before
    done = subprocess.run(
        [sys.executable, "-m", "xlnetcli", *[str(a) for a in argv], "--resume"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert _train_steps(run) == [1, 2, 3, 4]


@pytest.mark.slow
def test_sigterm_while_a_finetuning_run_starts_exits_75_in_one_line_lock_released(builds, tmp_path):
    from clitools import TRAIN_TSV
    from finetunetools import ft_cfg, pydocs_rows, random_init_checkpoint

    from xlnetcli.train.finetune import partial_dir

    work = random_init_checkpoint(builds, tmp_path / "work")
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(["text\tlabel"] + [f"{t}\t{lab}" for t, lab in pydocs_rows(TRAIN_TSV, 40)]) + "\n")
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(dump_config(ft_cfg("finetune.max_steps=2", "finetune.batch_size=8", "finetune.micro_batch_size=8")))
    out = tmp_path / "out"
    argv = ["finetune", "--task", "classification", "--train", train, "--init", work / "init", "--out", out]
    _assert_startup_stop(_xlnet_sigterm_in_setup(*argv, "--config", cfg, "--quiet"))
    assert not lock_path(out).exists() and not out.exists() and not partial_dir(out).exists()
