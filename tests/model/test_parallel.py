"""model/parallel.py and the kernel seam on CPU: activation checkpointing and per-layer torch.compile change nothing,
FSDP2 shards every layer (not only the root) and trains as the unsharded model, the rel-shift's hand-written
backward is the true gradient, the FLOP count matches a by-hand count. The CUDA kernels are in test_gpu.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from modeltools import maxdiff, plm_batch, tiny_cfg, twins

from xlnetcli.core import dist
from xlnetcli.model import XLNetLayer, kernels
from xlnetcli.model.flops import forward_flops, peak_tflops, train_flops
from xlnetcli.model.kernels import _RelShift, resolve_impl
from xlnetcli.model.parallel import apply_activation_checkpointing, compile_layers, parallelize


def cfg(**kw):
    base = dict(d_model=64, n_head=2, d_head=32, d_inner=128, n_layer=2, bi_data=True, attn_impl="fused")
    base.update(kw)
    return tiny_cfg(**base)


def batch(B=4, P=3):
    ids, tt, perm, tmap = plm_batch(B, P, np.random.default_rng(0))
    labels = torch.randint(0, 60, (B, P), generator=torch.Generator().manual_seed(0))
    return dict(input_ids=ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap, labels=labels)


def train_grads(model, b, seed=1):
    """Loss and gradients of two steps carrying memory (the second attends to it), dropout drawn from ``seed``."""
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    mems = None
    for _ in range(2):
        out = model(**b, mems=mems, need_hidden=False)
        out.loss.backward()
        mems = out.mems
    grads = {
        k.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
        for k, p in model.named_parameters()
        if p.grad is not None
    }
    return out.loss.detach(), grads


@pytest.mark.parametrize("impl", ["fused", "einsum", "sdpa"])
def test_activation_checkpointing_is_bit_exact_with_dropout(impl):
    a, b = twins(cfg(attn_impl=impl, dropout=0.1, dropatt=0.1))
    apply_activation_checkpointing(b)
    assert b.state_dict().keys() == a.state_dict().keys()  # checkpoints stay loadable either way
    (la, ga), (lb, gb) = train_grads(a, batch()), train_grads(b, batch())
    assert torch.equal(la, lb) and ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


@pytest.mark.slow
def test_compiled_layers_match_eager():
    """Per-layer torch.compile (inductor on the CPU) of the default CPU kernel, dropout off."""
    a, b = twins(cfg(dropout=0.0, dropatt=0.0))
    compile_layers(b)
    (la, ga), (lb, gb) = train_grads(a, batch()), train_grads(b, batch())
    assert maxdiff(la, lb) <= 1e-5 and max(maxdiff(ga[k], gb[k]) for k in ga) <= 1e-5


@pytest.mark.slow
def test_fsdp_shards_every_layer_and_trains_like_one_model(tmp_path):
    """FSDP2 in a one-process gloo group: each layer is its own FSDP unit (the position projection lives in the
    layer), and the loss and gradients equal the unsharded model's."""
    from torch.distributed.fsdp import FSDPModule

    tdist = torch.distributed
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        a, b = twins(cfg(dropout=0.0, dropatt=0.0))
        env = dist.DistEnv(0, 1, 0, torch.device("cpu"), "gloo")
        b = parallelize(b, env, strategy="fsdp")
        layers = [m for m in b.modules() if isinstance(m, XLNetLayer)]
        assert len(layers) == 2 and all(isinstance(m, FSDPModule) for m in layers) and isinstance(b, FSDPModule)
        (la, ga), (lb, gb) = train_grads(a, batch()), train_grads(b, batch())
        gb = {k: g.full_tensor() if hasattr(g, "full_tensor") else g for k, g in gb.items()}
        assert maxdiff(la, lb) <= 1e-6 and max(maxdiff(ga[k], gb[k]) for k in ga) <= 1e-6
    finally:
        tdist.destroy_process_group()


def test_rel_shift_backward_is_the_gradient():
    g = torch.Generator().manual_seed(0)
    B, H, N, L, M = 3, 2, 7, 5, 4  # N = L content rows + 2 query rows
    K, R = M + L, M + 2 * L
    rows = torch.cat([torch.arange(L).expand(B, L), torch.randint(0, L, (B, N - L), generator=g)], 1)
    shift = (L - rows)[:, None, :, None]
    bd = torch.randn(B, H, N, R, dtype=torch.float64, generator=g, requires_grad=True)
    out = _RelShift.apply(bd, shift, K)
    assert torch.equal(out, torch.gather(bd, 3, (shift + torch.arange(K)).expand(B, H, N, K)))
    assert torch.autograd.gradcheck(lambda t: _RelShift.apply(t, shift, K), (bd,))


def test_kernel_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setitem(kernels._TRITON_USABLE, None, False)  # no triton, or a GPU without bf16
    assert resolve_impl("auto", cpu) == "fused" and resolve_impl("auto", cuda) == "sdpa"
    monkeypatch.setitem(kernels._TRITON_USABLE, None, True)
    assert resolve_impl("auto", cpu) == "fused" and resolve_impl("auto", cuda) == "triton"
    assert resolve_impl("einsum", cuda) == "einsum"
    with pytest.raises(Exception, match="flex needs a CUDA device"):
        resolve_impl("flex", cpu)


def test_flop_count_by_hand():
    """XLNet-Base, batch 1, L 512, M 384, P 85: the per-layer terms written out once more."""
    m = dataclasses.replace(
        tiny_cfg(), vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_head=64, d_inner=3072, bi_data=False
    )
    d, L, M, P, K, R = 768, 512, 384, 85, 896, 1408
    N = L + P
    proj = 2 * N * d * d + 4 * K * d * d + 2 * R * d * d + 2 * N * d * d + 4 * N * d * 3072
    attn = 6 * N * K * d
    last = 2 * P * d * d + 4 * K * d * d + 2 * R * d * d + 6 * P * K * d + 2 * P * d * d + 4 * P * d * 3072
    want = 11 * (proj + attn) + last + 2 * P * d * 32000
    assert forward_flops(m, 1, L, M, P) == pytest.approx(want)
    assert train_flops(m, 1, L, M, P) == pytest.approx(3 * want)
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4 and peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.4 and peak_tflops("some cpu") is None
