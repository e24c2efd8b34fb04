"""train.static_shapes in pretraining: the same losses and weights as without it, and exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from clitools import FAST_PRETRAIN, TINY, step_weights, train_losses

from xlnetcli.config import load_config
from xlnetcli.train.checkpointer import load_train_state
from xlnetcli.train.pretrain import pretrain

torch.set_num_threads(1)

# mem_len 24 with 16 reused tokens a step: the unpadded memory grows 0, 16, 24, 24 (padding, partial, full)
BASE = [
    *FAST_PRETRAIN,
    "model.mem_len=24",
    "train.max_steps=4",
    "train.eval_every=never",
    "train.save_every=1",
    "train.keep_last=4",
]


@pytest.fixture(scope="module")
def records(builds) -> Path:
    return builds.pipeline(FAST_PRETRAIN).records


def _weights_close(a: Path, b: Path, tol: float) -> None:
    wa, wb = step_weights(a), step_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=tol, atol=tol), k


@pytest.mark.slow
def test_static_shapes_train_the_same_model(records, tmp_path):
    """Dropout off (its masks are drawn over tensors sized by the memory length, so they differ with the padding):
    losses within 1e-6 relative, weights within 1e-6."""
    off = ["model.dropout=0", "model.dropatt=0", "train.precision=fp32"]
    pretrain(load_config(TINY, [*BASE, *off]), records, tmp_path / "plain", quiet=True)
    pretrain(load_config(TINY, [*BASE, *off, "train.static_shapes=true"]), records, tmp_path / "static", quiet=True)
    plain, static = train_losses(tmp_path / "plain"), train_losses(tmp_path / "static")
    assert [s for s, _ in static] == [1, 2, 3, 4]
    for (_, x), (_, y) in zip(plain, static, strict=True):
        assert y == pytest.approx(x, rel=1e-6)
    _weights_close(tmp_path / "plain" / "step_0000004", tmp_path / "static" / "step_0000004", 1e-6)
    # the checkpoints hold the real memory only, as without static shapes: 16 states after step 1, then 24
    for step, n in ((1, 16), (2, 24)):
        for run in ("plain", "static"):
            mems = load_train_state(tmp_path / run / f"step_{step:07d}")["ranks"][0]["mems"]
            assert mems["rows"].tolist() == [0, 1, 2, 3] and mems["layers"][0].shape == (4, n, 64)


@pytest.mark.slow
def test_static_shapes_resume_exactly(records, tmp_path):
    """Dropout on: stopped after step 1 (memory 16 of 24: re-padded on resume), resumed, bit-identical to the
    uninterrupted static run."""
    cfg = load_config(TINY, [*BASE, "train.static_shapes=true"])
    pretrain(cfg, records, tmp_path / "a", quiet=True)
    pretrain(cfg, records, tmp_path / "b", quiet=True, stop_after=1)
    pretrain(cfg, records, tmp_path / "b", resume="latest", quiet=True)
    assert train_losses(tmp_path / "b") == train_losses(tmp_path / "a")
    wa, wb = step_weights(tmp_path / "a" / "step_0000004"), step_weights(tmp_path / "b" / "step_0000004")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize(
    "over, says",
    [
        (["train.cuda_graphs=true"], "needs train.compile=true and train.static_shapes=true"),
        (["train.cuda_graphs=true", "train.compile=true"], "needs train.compile=true and train.static_shapes=true"),
        (
            ["train.cuda_graphs=true", "train.compile=true", "train.static_shapes=true",
             "train.activation_checkpointing=true"],
            "train.activation_checkpointing=false",
        ),
    ],
)  # fmt: skip
def test_cuda_graphs_without_what_they_need_are_refused(over, says):
    from xlnetcli.core.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        load_config(TINY, over)


def test_cuda_graphs_are_refused_on_several_processes_and_on_the_cpu(records, tmp_path):
    """One line before anything is made: torchrun (2 processes), or a run on the CPU."""
    from xlnetcli.config.checks import check_config
    from xlnetcli.core.errors import ConfigError

    cfg = load_config(TINY, [*BASE, "train.cuda_graphs=true", "train.compile=true", "train.static_shapes=true"])
    with pytest.raises(ConfigError, match=r"train.cuda_graphs runs in one process, got 2"):
        check_config(cfg, world=2, stage="pretrain")
    with pytest.raises(ConfigError, match=r"needs a CUDA device, this run is on cpu \(set train.cuda_graphs=false\)"):
        pretrain(cfg, records, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
