"""A training step asks the device nothing back: no op of its forward, loss and backward makes the host wait for
a GPU (a value read as a Python number, a count of True entries for a boolean index), pretraining's and each
finetuning head's. Checked on the CPU by recording every op torch dispatches: the same ops run on CUDA, where each
of these would drain the device's queue (the LM head's backward once counted its label hits per vocabulary block
this way: 4 waits a Base step; the classification heads checked for unlabelled rows on the host)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from modeltools import plm_batch, tiny_cfg
from torch.utils._python_dispatch import TorchDispatchMode

from xlnetcli.config.schema import FinetuneConfig
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.heads import UNLABELLED, FinetuneModel

SYNCING = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "masked_select", "unique_dim", "_unique2"}


def _bool_index(name: str, args: tuple) -> bool:
    """x[mask] / x[mask] = v with a boolean mask: its True entries are counted on the host to size the result."""
    if name not in ("index", "index_put", "index_put_") or len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return False
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in args[1])


class OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.waits: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNCING or _bool_index(name, args):
            self.waits.append(str(func))
        return func(*args, **(kwargs or {}))


def impls() -> list:
    try:
        import triton  # noqa: F401
    except ImportError:
        return ["fused", "einsum"]
    return ["fused", "einsum", pytest.param("triton", marks=pytest.mark.slow)]  # Triton's interpreter: slow on CPU


@pytest.mark.parametrize("impl", impls())
def test_a_training_step_reads_nothing_back_from_the_device(impl):
    """Forward with memory and targets (target_index, as the pretraining stream gives), the fused LM head's loss and
    backward, under bf16 autocast as on a GPU: no syncing op, none of them a boolean index."""
    torch.manual_seed(0)
    model = XLNetLMHeadModel(tiny_cfg(attn_impl=impl, d_head=16, dropout=0.1, dropatt=0.1)).train()
    ids, tt, perm, tmap = plm_batch(2, 3, np.random.default_rng(0))
    labels = torch.randint(0, 60, (2, 3))
    target_index = tmap.argmax(-1)
    mems = [torch.randn(2, 4, model.config.d_model) for _ in range(model.config.n_layer)]
    log = OpLog()
    with log, torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, token_type_ids=tt, perm_mask=perm, target_index=target_index, labels=labels, mems=mems,
                    need_hidden=False)  # fmt: skip
        out.loss.backward()
    assert out.loss.isfinite()
    assert not log.waits, log.waits


@pytest.mark.parametrize("task", ["classification", "regression", "multiple-choice", "squad"])
def test_a_finetuning_step_reads_nothing_back_from_the_device(task):
    """The task heads' losses too: the classification loss once counted its unlabelled rows on the host (a sync
    each step); a class label -1 now marks an unlabelled row that the loss leaves out, decided on the device."""
    torch.manual_seed(0)
    model = FinetuneModel(tiny_cfg(attn_impl="fused", dropout=0.1), FinetuneConfig(), task, 3).train()
    B, L = 4, 10
    ids = torch.randint(5, 60, (B, 2, L) if task == "multiple-choice" else (B, L))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones(ids.shape)}
    if task == "squad":
        batch.update(
            p_mask=torch.zeros(B, L),
            cls_index=torch.full((B,), L - 1),
            start_positions=torch.tensor([1, 2, 3, 4]),
            end_positions=torch.tensor([2, 3, 4, 5]),
            is_impossible=torch.tensor([0, 1, 0, 0]),
        )
    elif task == "multiple-choice":
        batch.update(option_mask=torch.ones(B, 2), labels=torch.tensor([0, 1, 1, 0]))
    else:
        batch["labels"] = torch.tensor([0.5, 1.0, 2.0, 0.0]) if task == "regression" else torch.tensor([0, 2, 1, 2])
    log = OpLog()
    with log, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(batch)["loss"]
        loss.backward()
    assert loss.isfinite()
    assert not log.waits, log.waits


def test_unlabelled_rows_are_left_out_of_the_classification_loss():
    torch.manual_seed(0)
    model = FinetuneModel(tiny_cfg(attn_impl="fused"), FinetuneConfig(), "classification", 3).eval()
    ids = torch.randint(5, 60, (4, 10))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones(4, 10)}
    out = model({**batch, "labels": torch.tensor([0, UNLABELLED, 2, UNLABELLED])})
    want = F.cross_entropy(out["logits"][[0, 2]], torch.tensor([0, 2]))
    assert torch.allclose(out["loss"], want)
    assert model({**batch, "labels": torch.full((4,), UNLABELLED)})["loss"].isnan()
