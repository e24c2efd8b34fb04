"""Elastic layout: one set of records trains on any number of processes and micro-batch size for the same global
batch, and a checkpoint of one layout resumes on another (memories and data cursor re-assigned by row) with the
uninterrupted run's losses and memories, up to float rounding. Dropout off: its masks cannot follow a layout change."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import (
    BIN,
    FAST_PRETRAIN,
    assert_one_line_error,
    child_env,
    run_main,
    step_weights,
    train_losses,
    write_config,
)
from conftest import tree_digest

from xlnetcli.config import load_config
from xlnetcli.core.errors import CheckpointError
from xlnetcli.model.objective import Memories
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.checkpointer import load_train_state
from xlnetcli.train.pretrain import pretrain

torch.set_num_threads(1)  # the same as the subprocesses (OMP_NUM_THREADS=1)

K, SPLIT = 6, 3  # steps of a run; the checkpoint a layout change resumes from
RUN = [
    *FAST_PRETRAIN,  # records of 4 rows laid out for micro-batches of 2 (bi_data)
    f"train.max_steps={K}",
    f"train.save_every={SPLIT}",
    "train.eval_every=3",
    "train.keep_last=5",
    "model.dropout=0.0",
    "model.dropatt=0.0",
]
CPU = ["--device", "cpu"]


@pytest.fixture(scope="module")
def records(builds) -> Path:
    """Shared (conftest.py): read only."""
    return builds.pipeline(FAST_PRETRAIN).records


def _torchrun(*args) -> None:
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "xlnetcli", "pretrain", *CPU]
    out = subprocess.run(
        [*cmd, *map(str, args), "--quiet"], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]


def _mems_by_row(step_dir: Path) -> dict[int, list[torch.Tensor]]:
    """Every rank's saved memories of a step folder, by records row."""
    out = {}
    for rank in load_train_state(step_dir)["ranks"]:
        m = rank["mems"]
        for i, g in enumerate(m["rows"].tolist()):
            out[g] = [x[i] for x in m["layers"]]
    return out


def _assert_same_run(run: Path, ref: Path, tol: float = 1e-5) -> list[float]:
    """Losses, evaluations, final weights and memories of ``run`` equal ``ref``'s within float rounding; returns the
    relative loss differences."""
    la, lb = train_losses(ref), train_losses(run)
    assert [s for s, _ in lb] == [s for s, _ in la] == list(range(1, K + 1))
    assert [b for _, b in lb] == pytest.approx([a for _, a in la], rel=tol)
    ea = [r["loss"] for r in read_metrics(ref) if r["split"] == "eval"]
    eb = [r["loss"] for r in read_metrics(run) if r["split"] == "eval"]
    assert len(ea) == 3 and eb == pytest.approx(ea, rel=tol)
    final = f"step_{K:07d}"
    wa, wb = step_weights(ref / final), step_weights(run / final)
    assert wa.keys() == wb.keys() and max((wa[k] - wb[k]).abs().max().item() for k in wa) < tol
    ma, mb = _mems_by_row(ref / final), _mems_by_row(run / final)
    assert sorted(ma) == sorted(mb) == [0, 1, 2, 3]
    assert all(torch.allclose(x, y, atol=tol) for g in ma for x, y in zip(ma[g], mb[g], strict=True))
    return [abs(b - a) / abs(a) for (_, a), (_, b) in zip(la, lb, strict=True)]


@pytest.fixture(scope="module")
def one(records, tmp_path_factory) -> tuple[Path, Path]:
    """(config file, run folder) of the uninterrupted reference: 1 process, micro 2 x accumulation 2, K steps."""
    root = tmp_path_factory.mktemp("elastic")
    cfg_file = write_config(root / "cfg.yaml", RUN)
    pretrain(load_config(cfg_file), records, root / "one", quiet=True)
    return cfg_file, root / "one"


def _copy_to_split(ref: Path, out: Path) -> Path:
    """The reference run as it stood at step SPLIT (its later step folder removed), to resume from there."""
    shutil.copytree(ref, out)
    shutil.rmtree(out / f"step_{K:07d}")
    return out


@pytest.mark.slow
def test_two_processes_resume_on_one_and_one_on_two(records, one, tmp_path, capsys):
    """(2 processes to K, resumed from step SPLIT on 1) and (1 process, resumed from step SPLIT on 2): the
    uninterrupted 1-process run's losses, evaluations, weights and memories."""
    cfg_file, ref = one
    two = tmp_path / "two_then_one"
    _torchrun("--config", cfg_file, "--data", records, "--out", two)  # micro 2 x accumulation 1 on each rank
    code, out, err = run_main(capsys, "pretrain", "--data", records, "--out", two, "--resume", SPLIT, "--rewind", *CPU)
    assert code == 0, err
    said = [ln for ln in (out + err).splitlines() if "re-assigned by row" in ln]
    assert len(said) == 1, out + err
    assert "2 process(es) x micro 2 x accumulation 1 continued on 1 x micro 2 x accumulation 2" in said[0]
    assert "dropout re-seeded" in said[0]
    diffs = _assert_same_run(two, ref)

    one_two = _copy_to_split(ref, tmp_path / "one_then_two")
    _torchrun("--data", records, "--out", one_two, "--resume", SPLIT)
    diffs += _assert_same_run(one_two, ref)
    print(f"largest relative loss difference from the uninterrupted run: {max(diffs):.2e}")
    assert load_train_state(one_two / f"step_{K:07d}")["world_size"] == 2


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_on_one_process_and_back(records, one, tmp_path, capsys):
    """The optimizer state of FSDP (keyed by parameter name) onto one plain process, and one process's (keyed by
    index) onto FSDP on 2 processes: the uninterrupted run's losses, weights and memories."""
    cfg_file, ref = one
    fsdp = tmp_path / "fsdp_then_one"
    _torchrun("--config", cfg_file, "--data", records, "--out", fsdp, "--set", "train.distributed=fsdp")
    code, _, err = run_main(
        capsys, "pretrain", "--data", records, "--out", fsdp, "--resume", SPLIT, "--rewind", "--quiet", *CPU
    )
    assert code == 0, err
    _assert_same_run(fsdp, ref)
    one_fsdp = _copy_to_split(ref, tmp_path / "one_then_fsdp")
    _torchrun("--data", records, "--out", one_fsdp, "--resume", SPLIT, "--set", "train.distributed=fsdp")
    _assert_same_run(one_fsdp, ref)


@pytest.mark.slow
def test_micro_batch_size_change_on_one_process(records, tmp_path, capsys):
    """Micro-batches of 4 (the records were laid out for 2: every micro-batch re-paired at read time) to step SPLIT,
    then of 2 with accumulation 2: the uninterrupted micro-4 run's losses, weights and memories."""
    cfg_file = write_config(tmp_path / "cfg.yaml", [*RUN, "train.micro_batch_size=4"])
    ref = tmp_path / "four"
    pretrain(load_config(cfg_file), records, ref, quiet=True)
    run = _copy_to_split(ref, tmp_path / "four_then_two")
    args = ("pretrain", "--data", records, "--out", run, "--resume", SPLIT, "--set", "train.micro_batch_size=2")
    code, out, err = run_main(capsys, *args, *CPU)
    assert code == 0, err
    assert "1 process(es) x micro 4 x accumulation 1 continued on 1 x micro 2 x accumulation 2" in out + err
    diffs = _assert_same_run(run, ref)
    print(f"largest relative loss difference from the uninterrupted run: {max(diffs):.2e}")
    assert load_config(run / "config.yaml").train.micro_batch_size == 2


@pytest.mark.slow
def test_a_layout_change_reseeds_dropout_deterministically(records, tmp_path, capsys):
    """Dropout on: each process's generators cannot follow a layout change, so they are re-seeded from (train.seed,
    step, rank): two such resumes are the same run, which is not the uninterrupted one."""
    over = [*RUN, "model.dropout=0.1", "model.dropatt=0.1", "train.micro_batch_size=4", "train.eval_every=never"]
    cfg_file = write_config(tmp_path / "cfg.yaml", over)
    ref = tmp_path / "ref"
    pretrain(load_config(cfg_file), records, ref, quiet=True)
    resumed = []
    for name in ("a", "b"):
        run = _copy_to_split(ref, tmp_path / name)
        args = ("pretrain", "--data", records, "--out", run, "--resume", SPLIT, "--set", "train.micro_batch_size=2")
        code, _, err = run_main(capsys, *args, "--quiet", *CPU)
        assert code == 0, err
        resumed.append(train_losses(run))
    assert resumed[0] == resumed[1]
    assert resumed[0][:SPLIT] == train_losses(ref)[:SPLIT] and resumed[0][SPLIT:] != train_losses(ref)[SPLIT:]


@pytest.mark.slow
def test_what_cannot_change_is_refused_in_one_line(records, tmp_path, capsys):
    """The global batch (the records' rows) cannot change on resume: one line naming both values, nothing touched."""
    run = tmp_path / "run"
    cfg_file = write_config(tmp_path / "cfg.yaml", [*RUN, "train.max_steps=2", "train.save_every=2"])
    pretrain(load_config(cfg_file), records, run, quiet=True)
    before = tree_digest(run)
    code, _, err = run_main(
        capsys, "pretrain", "--data", records, "--out", run, "--resume", "--set", "train.global_batch_size=8", *CPU
    )
    assert_one_line_error(code, err, "global_batch_size=4", "train.global_batch_size=8")
    assert tree_digest(run) == before


# ---- memories by row (no training) ------------------------------------------------------------------------------


def _filled(rows: list[list[int]], n_layer: int = 2, m: int = 3, d: int = 4) -> Memories:
    """Memories whose state for records row g is filled with g + layer / 10."""
    mems = Memories(8, rows, torch.device("cpu"))
    for a, r in enumerate(rows):
        g = torch.tensor(r, dtype=torch.float32)[:, None, None]
        mems.mems[a] = [(g + i / 10).expand(len(r), m, d).clone() for i in range(n_layer)]
    return mems


@pytest.mark.parametrize("static", [False, True])
def test_memories_are_reassigned_by_row(static):
    """Two ranks with one micro-batch each ([0, 2] and [1, 3]) saved; one rank with two micro-batches ([0, 1], [2, 3])
    takes each row's memory from whichever rank saved it."""
    saved = [_filled([[0, 2]]).state_dict(), _filled([[1, 3]]).state_dict()]
    assert saved[1]["rows"].tolist() == [1, 3] and saved[1]["layers"][1].shape == (2, 3, 4)
    mine = Memories(8, [np.array([0, 1]), np.array([2, 3])], torch.device("cpu"), (2, 4) if static else None)
    mine.load_state_dicts(saved)
    for a, rows in enumerate(([0, 1], [2, 3])):
        for i in range(2):
            want = torch.tensor(rows, dtype=torch.float32)[:, None, None] + i / 10
            assert torch.equal(mine._real(a)[i], want.expand(2, 3, 4))
    if static:  # left-padded to mem_len, the padding masked
        assert mine.mems[0][0].shape == (2, 8, 4) and mine.pads[0][:, :5].all() and not mine.pads[0][:, 5:].any()
    assert torch.equal(mine.state_dict()["layers"][1], _filled([[0, 1], [2, 3]]).state_dict()["layers"][1])
    with pytest.raises(CheckpointError, match="no memory for records row 1"):
        mine.load_state_dicts(saved[:1])


def test_memories_of_train_state_format_1_are_read():
    """Format 1 keyed a rank's memories by global micro-batch index k (rows k*mb .. (k+1)*mb - 1)."""
    old = {1: [torch.full((2, 3, 4), 1.0)], 0: [torch.full((2, 3, 4), 0.0)]}
    mine = Memories(8, [[1, 2]], torch.device("cpu"))
    mine.load_state_dicts([old])
    assert mine.mems[0][0][:, 0, 0].tolist() == [0.0, 1.0]
    mine.load_state_dicts([{0: None, 1: None}])
    assert mine.mems == [None]
