"""Issue #22, class 8: a start that fails leaves nothing (or a rerun takes over).

A pretraining or finetuning run that fails before its first step (a tracker that cannot start, a probe file with one
class) leaves no run folder (a folder that was there is left as it was), so the same command then just runs, instead
of asking for --resume. A run killed after it started logging but before its first checkpoint is taken over by the
same command.
"""

from __future__ import annotations

import pytest
from clitools import FAST_PRETRAIN, TRAIN_TSV, VALID_TSV, assert_one_line_error, run_main, train_losses, write_config
from finetunetools import random_init_checkpoint

from xlnetcli.core.errors import XLNetError

pytestmark = pytest.mark.slow  # each test trains a few steps


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


@pytest.fixture(scope="module")
def rec(builds):
    return builds.pipeline(FAST_PRETRAIN).records


def no_tracker(monkeypatch) -> None:
    """The tracker fails to start as one without credentials does (report/trackers.py's one line)."""

    def start_trackers(*args, **kwargs):
        raise XLNetError("report_to wandb: could not start a run (no API key); log in with `wandb login`")

    monkeypatch.setattr("xlnetcli.report.metrics_log.start_trackers", start_trackers)


def _cfg(tmp_path, *sets: str):
    return write_config(
        tmp_path / "cfg.yaml",
        [*FAST_PRETRAIN, "train.max_steps=2", "train.save_every=2", "train.eval_every=never", *sets],
    )


def test_pretrain_whose_tracker_cannot_start_leaves_no_run_folder(rec, tmp_path, monkeypatch, capsys):
    cfg, run = _cfg(tmp_path), tmp_path / "run"
    no_tracker(monkeypatch)
    code, _, err = run_main(capsys, "pretrain", "--config", cfg, "--data", rec, "--out", run, "--quiet")
    assert_one_line_error(code, err, "report_to wandb")
    assert not run.exists()
    (tmp_path / "empty").mkdir()  # a folder that was there stays, as it was
    code, _, err = run_main(capsys, "pretrain", "--config", cfg, "--data", rec, "--out", tmp_path / "empty", "--quiet")
    assert_one_line_error(code, err, "report_to wandb")
    assert list((tmp_path / "empty").iterdir()) == []
    monkeypatch.undo()
    code, _, err = run_main(capsys, "pretrain", "--config", cfg, "--data", rec, "--out", run, "--quiet")
    assert code == 0, err  # the same command, no --resume needed
    assert (run / "step_0000002" / "model.safetensors").is_file()


def test_a_probe_file_with_one_class_is_refused_before_the_run_folder_is_made(rec, tmp_path, capsys):
    one = tmp_path / "one.tsv"
    one.write_text("text\tlabel\n" + "".join(f"sentence number {i}\tsame\n" for i in range(40)))
    cfg, run = _cfg(tmp_path, "train.probe_every=1", f"train.probe_file={one}"), tmp_path / "run"
    code, _, err = run_main(capsys, "pretrain", "--config", cfg, "--data", rec, "--out", run, "--quiet")
    assert_one_line_error(code, err, str(one), "at least 2 different labels")
    assert not run.exists()


def test_a_run_killed_before_its_first_checkpoint_is_taken_over_by_the_same_command(rec, tmp_path, capsys):
    from xlnetcli.config import load_config
    from xlnetcli.train.pretrain import pretrain

    cfg = _cfg(tmp_path, "train.max_steps=3", "train.save_every=end")
    pretrain(load_config(cfg), rec, tmp_path / "a", quiet=True)
    run = tmp_path / "run"
    pretrain(load_config(cfg), rec, run, quiet=True, stop_after=1)  # as if killed after step 1: no checkpoint
    assert (run / "metrics.jsonl").is_file() and not list(run.glob("step_*"))
    code, _, err = run_main(capsys, "pretrain", "--config", cfg, "--data", rec, "--out", run, "--quiet")
    assert code == 0, err
    assert train_losses(run) == train_losses(tmp_path / "a")


def test_finetune_whose_tracker_cannot_start_leaves_nothing(builds, tmp_path, monkeypatch, capsys):
    init = random_init_checkpoint(builds, tmp_path) / "init"
    out = tmp_path / "ft"
    args = ["finetune", "--task", "classification", "--train", TRAIN_TSV, "--valid", VALID_TSV, "--init", init]
    sets = ["--set", "finetune.max_steps=1", "--set", "finetune.max_seq_length=32", "--quiet"]
    no_tracker(monkeypatch)
    code, _, err = run_main(capsys, *args, "--out", out, *sets)
    assert_one_line_error(code, err, "report_to wandb")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init"]  # no out, no .ft.partial, no lock
    monkeypatch.undo()
    code, _, err = run_main(capsys, *args, "--out", out, *sets)
    assert code == 0, err
