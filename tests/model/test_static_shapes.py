"""Static shapes (train.static_shapes, issue 23): the memory left-padded to mem_len from the first step, its padding
masked, computes what the unpadded memory does, with the same shapes at every step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from modeltools import V, plm_batch, tiny_cfg, twins

from xlnetcli.model.objective import Memories, forward


def _segments(n: int, B: int = 2, P: int = 4):
    """``n`` pretraining-style segments: inputs with target_index and labels (every target real)."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        ids, tt, perm, tmap = plm_batch(B, P, rng, pad=False)
        labels = torch.as_tensor(rng.integers(0, V, size=(B, P)))
        out.append(dict(input_ids=ids, token_type_ids=tt, perm_mask=perm, target_index=tmap.argmax(-1), labels=labels))
    return out


def _run(model, segments, static: bool):
    """Losses, per-step gradients (flattened) and the real memory after each step, through Memories."""
    c = model.config
    mems = Memories(c.mem_len, [range(2)], torch.device("cpu"), (c.n_layer, c.d_model) if static else None)
    losses, grads, real = [], [], []
    for seg in segments:
        model.zero_grad()
        out = forward(model, seg, **mems.inputs(0, seg["input_ids"].shape[0]))
        out.loss.backward()
        mems.carry(0, out)
        losses.append(out.loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        real.append(mems.state_dict()["layers"])
    return losses, grads, real


@pytest.mark.parametrize("impl", ["fused", "einsum", "sdpa"])
def test_padded_memory_computes_the_unpadded_maths(impl):
    """mem_len 12, reuse 8: the unpadded memory grows 0, 8, 12, 12; the padded one is 12 throughout. Same losses,
    gradients and (real) memories. Dropout off: its masks are drawn over tensors whose size includes the memory
    length (attention probabilities [B,H,N,K], the positional encoding [R,d]), so the same generator gives other
    masks; the maths are what is compared."""
    a, b = twins(tiny_cfg(mem_len=12, attn_impl=impl))
    segs = _segments(4)
    la, ga, ma = _run(a, segs, static=False)
    lb, gb, mb = _run(b, segs, static=True)
    assert [m[0].shape[1] for m in ma] == [8, 12, 12, 12] == [m[0].shape[1] for m in mb]
    for x, y in zip(la, lb, strict=True):
        assert y == pytest.approx(x, rel=1e-6)
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-7)
    for x, y in zip(ma, mb, strict=True):
        assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(x, y, strict=True))


def test_padding_gets_zero_attention_weight():
    """Whatever the padding columns hold, nothing of it reaches the loss: zero gradient into it, the same loss."""
    model = tiny_cfg(mem_len=12, attn_impl="fused")
    torch.manual_seed(0)
    from xlnetcli.model import XLNetLMHeadModel

    net = XLNetLMHeadModel(model).train()
    seg = _segments(1)[0]
    mems = Memories(12, [range(2)], torch.device("cpu"), (model.n_layer, model.d_model))
    args = mems.inputs(0, 2)
    assert args["mem_pad"].all() and args["mems"][0].shape == (2, 12, model.d_model)  # first step: all padding
    base = forward(net, seg, **args).loss
    junk = [torch.randn_like(m).requires_grad_() for m in args["mems"]]
    loss = forward(net, seg, junk, args["mem_pad"]).loss
    loss.backward()
    assert loss.item() == pytest.approx(base.item(), rel=1e-6)
    assert all(j.grad is not None and bool((j.grad == 0).all()) for j in junk)
    plain = forward(net, seg, None).loss
    assert plain.item() == pytest.approx(base.item(), rel=1e-6)


@pytest.mark.parametrize("static", [True, False])
def test_every_layer_sees_the_same_shapes_at_every_step(static):
    """A forward hook on every layer: with static shapes its inputs' shapes (the layout's tensors included) are one
    set across steps (first, growing, full memory); without, three."""
    a, _ = twins(tiny_cfg(mem_len=12, dropout=0.1, dropatt=0.1))
    seen: dict[str, set] = {}

    def shape(t):
        if isinstance(t, torch.Tensor):
            return tuple(t.shape)
        if dataclasses.is_dataclass(t):  # AttnLayout: its tensors' shapes
            return tuple(shape(getattr(t, f.name)) for f in dataclasses.fields(t))
        return t if isinstance(t, (int, str, bool)) or t is None else type(t).__name__

    def hook(name):
        def record(module, args, kwargs):
            seen.setdefault(name, set()).add(tuple(shape(t) for t in (*args, *kwargs.values())))

        return record

    for i, layer in enumerate(a.transformer.layer):
        layer.register_forward_pre_hook(hook(f"layer{i}"), with_kwargs=True)
    _run(a, _segments(4), static=static)
    assert len(seen) == 2 and all(len(s) == (1 if static else 3) for s in seen.values()), seen


@pytest.mark.slow
@pytest.mark.parametrize("static", [True, False])
def test_the_whole_step_compiles_once(static):
    """torch.compile of the whole model (aot_eager: dynamo and AOTAutograd's capture, no C++ compiler) over the
    padding, partial and full memory steps: one graph with static shapes, no graph break (without: one per shape)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    a, _ = twins(tiny_cfg(mem_len=12, dropout=0.1, dropatt=0.1))
    c = a.config
    step = torch.compile(a, backend="aot_eager", dynamic=False)
    mems = Memories(12, [range(2)], torch.device("cpu"), (c.n_layer, c.d_model) if static else None)
    for seg in _segments(4):
        out = step(**seg, need_hidden=False, **mems.inputs(0, 2))
        out.loss.backward()
        mems.carry(0, out)
    assert counters["stats"]["unique_graphs"] == (1 if static else 4) and not counters["graph_break"]
    torch._dynamo.reset()
