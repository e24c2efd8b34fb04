"""Changing training settings on resume (issue 35, run lifecycle): after a divergence, resume with a lower lr (or
clipping, precision, more steps); each change is recorded (config.yaml, a "change" row of metrics.jsonl, a header
line), the lr schedule is the new settings' from the resumed step on (docs/operations.md, "Changing settings on
resume"), and keys that change what is trained are still refused, with a hint that fits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from clitools import FAST_PRETRAIN, TINY, assert_one_line_error, run_main

from xlnetcli.config import load_config
from xlnetcli.core.errors import XLNetError
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.optim import lr_factor
from xlnetcli.train.pretrain import PretrainWorkload, pretrain

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def records(builds) -> Path:
    """Shared (conftest.py): read only."""
    return builds.pipeline(FAST_PRETRAIN).records


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def _cfg(*extra: str):
    return load_config(TINY, [*FAST_PRETRAIN, "train.eval_every=never", *extra])


def _rows(run: Path, split: str) -> list[dict]:
    return [r for r in read_metrics(run) if r["split"] == split]


def _lr_of(step: int, lr: float, warmup: int, total: int) -> float:
    """The lr logged in the train row of ``step`` (the schedule's factor at step - 1 completed steps)."""
    return lr * lr_factor(step - 1, warmup, total)


@pytest.mark.slow
def test_divergence_then_resume_with_a_lower_lr_finishes(records, tmp_path, monkeypatch, capsys):
    """The documented flow: a run diverges at step 3 (its loss goes non-finite at lr 1e-3: simulated), the message
    names the last good checkpoint and a lower lr; `--resume --set train.lr=...` continues from it and finishes, the
    change recorded in config.yaml, metrics.jsonl and the header, the lr after the resumed step the new one's."""
    run = tmp_path / "run"
    cfg_args = ["train.max_steps=6", "train.save_every=1", "train.keep_last=3"]
    real_loss = PretrainWorkload.loss
    calls = {"n": 0}

    def diverges_at_step_3(self, model, batch, micro):
        loss = real_loss(self, model, batch, micro)
        calls["n"] += 1
        if self.cfg.train.lr == 1e-3 and calls["n"] > 4:  # 2 micro-batches a step: step 3 on
            return loss * float("nan")
        return loss

    monkeypatch.setattr(PretrainWorkload, "loss", diverges_at_step_3)
    with pytest.raises(XLNetError) as e:
        pretrain(_cfg(*cfg_args), records, run, quiet=True)
    msg = str(e.value)
    assert "training diverged at step 3" in msg and "step_0000002" in msg and "--resume 2" in msg
    assert "--set train.lr=0.0005" in msg
    # the advice, followed on the command line (no --config: the run's own)
    code, out, err = run_main(
        capsys, "pretrain", "--data", records, "--out", run, "--resume", "2", "--set", "train.lr=5e-4"
    )
    assert code == 0, err
    text = out + err
    assert "changed    at step 2: train.lr 0.001 -> 0.0005" in text, text
    assert f"lr of step 3 {_lr_of(3, 5e-4, 2, 6):.3g} (was {_lr_of(3, 1e-3, 2, 6):.3g})" in text, text
    changes = _rows(run, "change")
    assert [(r["step"], r["key"], r["was"], r["now"]) for r in changes] == [(2, "train.lr", 0.001, 0.0005)]
    lrs = {r["step"]: r["lr"] for r in _rows(run, "train")}
    assert sorted(lrs) == [1, 2, 3, 4, 5, 6]
    for step in (1, 2):
        assert lrs[step] == pytest.approx(_lr_of(step, 1e-3, 2, 6))
    for step in (3, 4, 5, 6):
        assert lrs[step] == pytest.approx(_lr_of(step, 5e-4, 2, 6))
    assert load_config(run / "config.yaml").train.lr == 5e-4
    assert load_config(run / "step_0000006" / "config.yaml").train.lr == 5e-4
    # a later exact resume of the finished run changes nothing and logs nothing
    rows = read_metrics(run)
    res = pretrain(load_config(run / "config.yaml"), records, run, resume="latest", quiet=True)
    assert res["already_complete"] and read_metrics(run) == rows


@pytest.mark.slow
def test_raising_max_steps_recomputes_the_schedule_over_the_new_total(records, tmp_path, capsys):
    """A finished 4-step run resumed with train.max_steps=8 (and clipping, bf16): the steps after 4 follow the
    schedule of an 8-step run (warmup kept, linear decay to 0 at step 8), as the header's line says; the changes are
    recorded; a max_steps below the checkpoint's step is refused."""
    run = tmp_path / "run"
    pretrain(_cfg("train.max_steps=4", "train.save_every=2"), records, run, quiet=True)
    before = {r["step"]: r["lr"] for r in _rows(run, "train")}
    new = _cfg("train.max_steps=8", "train.save_every=2", "train.clip_norm=0.5", "train.precision=bf16")
    res = pretrain(new, records, run, resume="latest")
    assert res["step"] == 8 and res["complete"]
    err = capsys.readouterr().err
    listed = "train.clip_norm 1.0 -> 0.5, train.max_steps 4 -> 8, train.precision fp32 -> bf16"
    assert f"changed    at step 4: {listed}" in err, err
    assert f"(linear, warmup 2, 8 steps): lr of step 5 {_lr_of(5, 1e-3, 2, 8):.3g} (was 0)" in err, err
    lrs = {r["step"]: r["lr"] for r in _rows(run, "train")}
    for step in (1, 2, 3, 4):
        assert lrs[step] == before[step] == pytest.approx(_lr_of(step, 1e-3, 2, 4))
    for step in (5, 6, 7, 8):
        assert lrs[step] == pytest.approx(_lr_of(step, 1e-3, 2, 8))
    changes = [(r["step"], r["key"], r["was"], r["now"]) for r in _rows(run, "change")]
    assert changes == [
        (4, "train.clip_norm", 1.0, 0.5),
        (4, "train.max_steps", 4, 8),
        (4, "train.precision", "fp32", "bf16"),
    ]
    saved = load_config(run / "config.yaml").train
    assert (saved.max_steps, saved.clip_norm, saved.precision) == (8, 0.5, "bf16")
    with pytest.raises(XLNetError, match=r"train.max_steps=6 is below step 8 of the checkpoint resumed"):
        pretrain(_cfg("train.max_steps=6", "train.save_every=2"), records, run, resume="latest", quiet=True)


@pytest.mark.slow
def test_an_exact_resume_records_no_change(records, tmp_path):
    run = tmp_path / "run"
    cfg = _cfg("train.max_steps=4", "train.save_every=2")
    pretrain(cfg, records, run, quiet=True, stop_after=2)
    pretrain(cfg, records, run, resume="latest", quiet=True)
    assert _rows(run, "change") == [] and [r["step"] for r in _rows(run, "train")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_keys_that_change_what_is_trained_are_refused_with_a_fitting_hint(records, tmp_path, capsys):
    """Architecture and optimizer keys outside the changeable ones are refused in one line that names the key, what a
    resume may change, and a way on (no 'omit --config' when no --config was given)."""
    run = tmp_path / "run"
    pretrain(_cfg("train.max_steps=2", "train.save_every=2"), records, run, quiet=True)
    for key in ("model.n_layer=3", "train.weight_decay=0.5", "model.dropout=0.2"):
        code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", run, "--resume", "--set", key)
        name = key.split("=")[0]
        assert_one_line_error(
            code,
            err,
            f"{name} cannot change when resuming",
            "a resume may change only train.clip_norm, train.lr, train.max_steps, train.precision, train.warmup_steps",
            f"--init {run}",
        )
        assert "omit --config" not in err
    assert _rows(run, "change") == []


@pytest.mark.slow
def test_finetune_resume_with_a_lower_lr(builds, tmp_path, monkeypatch, capsys):
    """The same for finetuning: a run stopped at step 4 (SIGTERM) and resumed with --set finetune.lr=...: the change
    is recorded and the steps after 4 use the new lr; finetune.max_steps cannot change on resume."""
    import os
    import signal

    from clitools import TRAIN_TSV, VALID_TSV
    from finetunetools import ft_cfg, pydocs_rows, random_init_checkpoint

    from xlnetcli.config import dump_config
    from xlnetcli.train.finetune import partial_dir
    from xlnetcli.train.finetune_workload import FinetuneWorkload

    work = random_init_checkpoint(builds, tmp_path / "work")
    train, valid = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    train.write_text("\n".join(["text\tlabel"] + [f"{t}\t{lab}" for t, lab in pydocs_rows(TRAIN_TSV, 120)]) + "\n")
    valid.write_text("\n".join(["text\tlabel"] + [f"{t}\t{lab}" for t, lab in pydocs_rows(VALID_TSV, 30)]) + "\n")
    cfg = tmp_path / "ft.yaml"
    sets = ["finetune.batch_size=16", "finetune.micro_batch_size=8", "finetune.max_steps=8", "finetune.log_every=1"]
    cfg.write_text(dump_config(ft_cfg(*sets, "finetune.eval_every=4", "finetune.save_every=2")))
    out = tmp_path / "out"
    argv = ["finetune", "--task", "classification", "--train", train, "--valid", valid, "--init", work / "init"]
    argv += ["--out", out, "--config", cfg, "--quiet"]
    real_loss = FinetuneWorkload.loss

    def sigterm_at_step_4(self, model, batch, micro):
        if self.examples.steps == 4 and micro == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(self, model, batch, micro)

    monkeypatch.setattr(FinetuneWorkload, "loss", sigterm_at_step_4)
    code, _, err = run_main(capsys, *argv)
    assert code == 75, err
    monkeypatch.setattr(FinetuneWorkload, "loss", real_loss)
    code, _, err = run_main(capsys, *argv, "--resume", "--set", "finetune.max_steps=10")
    assert_one_line_error(code, err, "finetune.max_steps cannot change when resuming", "finetune.lr")
    stopped = max(int(p.name.split("_")[1]) for p in partial_dir(out).glob("step_*"))
    code, _, err = run_main(capsys, *argv, "--resume", "--set", "finetune.lr=2e-4")
    assert code == 0, err
    changes = [(r["step"], r["key"], r["was"], r["now"]) for r in _rows(out, "change")]
    assert changes == [(stopped, "finetune.lr", 0.001, 0.0002)]
    lrs = {r["step"]: r["lr"] for r in _rows(out, "train")}
    warmup = round(ft_cfg().finetune.warmup_ratio * 8)
    for step in range(1, 9):
        lr = 1e-3 if step <= stopped else 2e-4
        assert lrs[step] == pytest.approx(_lr_of(step, lr, warmup, 8)), step
    assert load_config(out / "config.yaml").finetune.lr == 2e-4
