"""Issue #22, class 4: a full disk anywhere is the one-line disk-full message.

safetensors reports ENOSPC as ``SafetensorError: Error while serializing: IoError(Os { code: 28, ... })``, not as an
OSError; every tensor write goes through core.files.save_safetensors, which raises it as one, and the atomic writers
turn a full disk into DiskFull naming the output. The partial output is removed and an earlier result is untouched.
The full disk is simulated: safetensors' save_file (or os.fsync) raises what a full disk raises, after writing part of
the file.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from clitools import FAST_PRETRAIN, TRAIN_TSV, VALID_TSV, assert_one_line_error, run_main, set_args, write_config
from conftest import tree_digest
from finetunetools import ft_cfg, random_init_checkpoint

from xlnetcli.core.files import save_safetensors

ENOSPC_TEXT = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'


def full_disk_safetensors(monkeypatch, after: int = 0) -> list[str]:
    """From the ``after``+1-th call on, safetensors' save_file writes 100 bytes and fails as on a full disk."""
    import safetensors.torch as st
    from safetensors import SafetensorError

    real, calls = st.save_file, []

    def save_file(tensors, filename, metadata=None):
        calls.append(str(filename))
        if len(calls) > after:
            Path(filename).write_bytes(b"\0" * 100)
            raise SafetensorError(ENOSPC_TEXT)
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(st, "save_file", save_file)
    return calls


def full_disk_fsync(monkeypatch) -> None:
    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)


def no_temps(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


@pytest.fixture(scope="module")
def world(builds, tmp_path_factory) -> Path:
    """init/ (a pretrained step folder), ft/ (a 2-step finetuned run), the TSVs it was trained on, hf/ (its export)."""
    from xlnetcli.interop.huggingface import export_hf
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    root = random_init_checkpoint(builds, tmp_path_factory.mktemp("diskfull"))
    (root / "train.tsv").write_text("\n".join(TRAIN_TSV.read_text().splitlines()[:41]) + "\n")
    (root / "valid.tsv").write_text("\n".join(VALID_TSV.read_text().splitlines()[:21]) + "\n")
    cfg = ft_cfg("finetune.max_steps=2", "finetune.eval_every=2")
    finetune(
        cfg,
        FinetuneArgs("classification", root / "train.tsv", root / "valid.tsv", root / "init", root / "ft", quiet=True),
    )
    export_hf(root / "ft", root / "hf")
    return root


def test_a_safetensors_io_error_is_an_os_error(tmp_path, monkeypatch):
    import torch
    from safetensors import SafetensorError

    full_disk_safetensors(monkeypatch)
    with pytest.raises(OSError) as e:
        save_safetensors({"a": torch.zeros(3)}, tmp_path / "m.safetensors")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "m.safetensors")
    import safetensors.torch as st

    def other_error(tensors, filename, metadata=None):
        raise SafetensorError("Error while serializing: MisalignedSlice")

    monkeypatch.setattr(st, "save_file", other_error)
    with pytest.raises(SafetensorError, match="MisalignedSlice"):  # not an I/O failure: as it was
        save_safetensors({"a": torch.zeros(3)}, tmp_path / "m.safetensors")


@pytest.mark.slow
def test_export_onto_a_full_disk(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "hf"
    shutil.copytree(world / "hf", out)
    before = tree_digest(out)
    full_disk_safetensors(monkeypatch)
    code, _, err = run_main(capsys, "export", world / "ft", "--out", out, "--overwrite")
    assert_one_line_error(code, err, f"disk full while writing {out}", "partial output was removed", "untouched")
    assert tree_digest(out) == before and not no_temps(tmp_path)
    code, _, err = run_main(capsys, "export", world / "ft", "--out", tmp_path / "new")
    assert_one_line_error(code, err, "disk full while writing")
    assert not (tmp_path / "new").exists() and not no_temps(tmp_path)


@pytest.mark.slow
def test_import_onto_a_full_disk(world, tmp_path, monkeypatch, capsys):
    full_disk_safetensors(monkeypatch)
    code, _, err = run_main(capsys, "import", "--from-hf", world / "hf", "--out", tmp_path / "ck")
    assert_one_line_error(code, err, f"disk full while writing {tmp_path / 'ck'}")
    assert not (tmp_path / "ck").exists() and not no_temps(tmp_path)


@pytest.mark.slow
def test_finetune_onto_a_full_disk_keeps_the_earlier_result(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "ft"
    shutil.copytree(world / "ft", out)
    before = tree_digest(out)
    full_disk_safetensors(monkeypatch)
    args = ["finetune", "--task", "classification", "--train", world / "train.tsv", "--valid", world / "valid.tsv"]
    sets = set_args(["finetune.max_steps=2", "finetune.eval_every=2", "finetune.max_seq_length=64"])
    code, _, err = run_main(capsys, *args, "--init", world / "init", "--out", out, "--overwrite", *sets, "--quiet")
    assert_one_line_error(code, err, "disk full while writing checkpoint", "partial folder was removed")
    assert tree_digest(out) == before and not no_temps(tmp_path)  # nothing resumable: the partial run is gone too


@pytest.mark.slow
def test_pretraining_checkpoint_onto_a_full_disk_then_resume(builds, tmp_path, monkeypatch, capsys):
    """The weights' write fails (safetensors' own error): one line naming the last good checkpoint; --resume ends the
    run with the weights of an uninterrupted one."""
    import torch
    from clitools import step_weights

    rec = builds.pipeline(FAST_PRETRAIN).records
    cfg = write_config(
        tmp_path / "cfg.yaml", [*FAST_PRETRAIN, "train.max_steps=4", "train.save_every=2", "train.eval_every=never"]
    )
    code, _, err = run_main(capsys, "pretrain", "--config", cfg, "--data", rec, "--out", tmp_path / "a", "--quiet")
    assert code == 0, err
    full_disk_safetensors(monkeypatch, after=2)  # step 2: model + train state written; step 4's model fails
    run = tmp_path / "b"
    code, _, err = run_main(capsys, "pretrain", "--config", cfg, "--data", rec, "--out", run, "--quiet")
    last_good = f"last good checkpoint {run / 'step_0000002'}"
    assert_one_line_error(code, err, "disk full while writing checkpoint", last_good)
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("step_")) == ["step_0000002"]
    assert not no_temps(run)
    monkeypatch.undo()
    code, _, err = run_main(capsys, "pretrain", "--data", rec, "--out", run, "--resume", "--quiet")
    assert code == 0, err
    wa, wb = step_weights(tmp_path / "a" / "step_0000004"), step_weights(run / "step_0000004")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_eval_and_plot_outputs_onto_a_full_disk_leave_the_earlier_file(world, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "valid.json", tmp_path / "c.png"
    out.write_text("earlier\n")
    png.write_bytes(b"earlier")
    full_disk_fsync(monkeypatch)
    code, _, err = run_main(capsys, "eval", world / "ft", "--file", world / "valid.tsv", "--output", out)
    assert_one_line_error(code, err, f"disk full while writing {out}", "untouched")
    code, _, err = run_main(capsys, "plot", world / "ft", "--out", png)
    assert_one_line_error(code, err, f"disk full while writing {png}")
    assert out.read_text() == "earlier\n" and png.read_bytes() == b"earlier" and not no_temps(tmp_path)
