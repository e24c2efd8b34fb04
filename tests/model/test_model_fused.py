"""The fused training path of model/kernels.py (attn_impl "fused" = "auto"): its custom autograd functions against plain
autograd formulations (float64 gradcheck with a fixed dropout mask), and the whole fused model against the plain
einsum path (loss, logits, memories and every gradient, <= 1e-5). Parity with transformers for "fused" runs in
test_model_parity.py (it is in IMPLS there)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from modeltools import TOL, maxdiff, plm_batch, tiny_cfg

from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.kernels import NEG_INF, _FeedForwardCore, _RelAttnCore, fused_dropout, keep_mask
from xlnetcli.model.lm_head import _LMHeadLoss


def attn_reference(q, k, v, kr, r_w, r_r, r_s, seg, rel_index, same, mask, keep, ks):
    """The core written with plain autograd ops (batch-shared kr of G halves, gathered rel-shift)."""
    B, H, N, D = q.shape
    G = kr.shape[0]
    krb = kr.repeat_interleave(B // G, 0)  # [B,H,R,D]
    bd = torch.einsum("bhnd,bhrd->bhnr", q + r_r[:, None], krb)
    bd = torch.gather(bd, 3, rel_index.expand(B, H, N, -1))
    score = torch.einsum("bhnd,bhkd->bhnk", q + r_w[:, None], k) + bd
    if seg is not None:
        ef = torch.einsum("bhnd,shd->bhns", q + r_s[:, None], seg)
        score = score + torch.where(same, ef[..., :1], ef[..., 1:])
    score = score / math.sqrt(D)
    if mask is not None:  # additive, as HF: a fully masked row attends uniformly and passes gradient through
        score = score + NEG_INF * mask
    p = torch.softmax(score, -1)
    if keep is not None:
        p = p * keep * ks
    return p @ v


@pytest.mark.parametrize(
    "G,with_seg,with_mask,with_drop",
    [(1, True, True, True), (2, True, False, True), (1, False, True, False), (2, False, False, False)],
)
@pytest.mark.slow
def test_attention_core_gradcheck(G, with_seg, with_mask, with_drop):
    g = torch.Generator().manual_seed(0)
    B, H, N, K, D, L = 4, 2, 7, 6, 3, 5  # N = L content rows + 2 query rows, K = 1 memory + L
    dt = torch.float64
    mk = lambda *s: torch.randn(*s, generator=g, dtype=dt, requires_grad=True)  # noqa: E731
    q, k, v = mk(B, H, N, D), mk(B, H, K, D), mk(B, H, K, D)
    kr = mk(G, H, K + L, D)
    r_w, r_r, r_s = mk(H, D), mk(H, D), mk(H, D)
    seg = mk(2, H, D) if with_seg else None
    rows = torch.cat([torch.arange(L).expand(B, L), torch.randint(0, L, (B, N - L), generator=g)], 1)
    rel_index = (L - rows)[:, None, :, None] + torch.arange(K)
    same = (torch.rand(B, 1, N, K, generator=g) > 0.5) if with_seg else None
    mask = (torch.rand(B, 1, N, K, generator=g) > 0.6) if with_mask else None
    keep = (torch.rand(B, H, N, K, generator=g) > 0.2) if with_drop else None
    args = (rel_index, same, mask, keep, 1.25)
    ins = (q, k, v, kr, r_w, r_r, r_s, seg)
    out = _RelAttnCore.apply(*ins, *args)
    ref = attn_reference(*ins, *args)
    assert maxdiff(out, ref) <= 1e-12
    grad_ins = tuple(t for t in ins if t is not None)

    def f(*ts):
        it = iter(ts)
        full = tuple(next(it) if t is not None else None for t in ins)
        return _RelAttnCore.apply(*full, *args)

    assert torch.autograd.gradcheck(f, grad_ins, eps=1e-6, atol=1e-6)
    if mask is not None:  # a fully masked row: same (HF) gradients as the additive-mask formulation
        mask[0, 0, 0] = True
        go = torch.randn(out.shape, generator=g, dtype=dt)
        got = torch.autograd.grad(_RelAttnCore.apply(*ins, *args), grad_ins, go, allow_unused=True)
        want = torch.autograd.grad(attn_reference(*ins, *args), grad_ins, go, allow_unused=True)
        for a, b in zip(got, want, strict=True):
            assert (a is None and b is None) or maxdiff(a, b) <= 1e-12


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("with_drop", [False, True])
def test_feed_forward_core_gradcheck(act, with_drop):
    g = torch.Generator().manual_seed(1)
    dt = torch.float64
    x = torch.randn(9, 4, generator=g, dtype=dt, requires_grad=True)
    w1, b1 = torch.randn(6, 4, dtype=dt, requires_grad=True), torch.randn(6, dtype=dt, requires_grad=True)
    w2, b2 = torch.randn(4, 6, dtype=dt, requires_grad=True), torch.randn(4, dtype=dt, requires_grad=True)
    keep = (torch.rand(9, 6, generator=g) > 0.3) if with_drop else None
    f = lambda *t: _FeedForwardCore.apply(*t, act, keep, 1.5)  # noqa: E731
    actf = {"gelu": F.gelu, "gelu_new": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu}[act]
    a = actf(x @ w1.t() + b1)
    ref = (a if keep is None else a * keep * 1.5) @ w2.t() + b2
    assert maxdiff(f(x, w1, b1, w2, b2), ref) <= 1e-12
    assert torch.autograd.gradcheck(f, (x, w1, b1, w2, b2), eps=1e-6, atol=1e-6)


def test_lm_head_loss_matches_cross_entropy():
    g = torch.Generator().manual_seed(2)
    n, d, V = 11, 5, 9000  # V spans three backward blocks
    x = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(V, d, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, V, (n,), generator=g)
    labels[3] = -100
    labels[5] = V - 1
    w = torch.rand(n, generator=g, dtype=torch.float64)
    loss, logits = _LMHeadLoss.apply(x, W, b, labels, w)
    extra = torch.randn(n, V, generator=g, dtype=torch.float64)
    (loss + (logits * extra).sum() * 1e-3).backward()
    got = [t.grad.clone() for t in (x, W, b)]
    for t in (x, W, b):
        t.grad = None
    ref_logits = F.linear(x, W, b)
    ce = F.cross_entropy(ref_logits, labels, reduction="none")
    ref = (ce * w).sum()
    (ref + (ref_logits * extra).sum() * 1e-3).backward()
    assert maxdiff(loss, ref) <= 1e-10 and maxdiff(logits, ref_logits) <= 1e-12
    for a, t in zip(got, (x, W, b), strict=True):
        assert maxdiff(a, t.grad) <= 1e-10


def test_keep_mask_and_dropout():
    torch.manual_seed(0)
    keep, scale = keep_mask((400, 1000), 0.1, "cpu")
    assert keep.dtype == torch.bool and keep.shape == (400, 1000)
    assert abs(keep.float().mean().item() - 0.9) < 0.003
    assert abs(scale - 1 / 0.9) < 1e-4
    assert not keep_mask((3, 4), 1.0, "cpu")[0].any()
    x = torch.randn(64, 32, requires_grad=True)
    y = fused_dropout(x, 0.5, True)
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] * 2.0)
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept)
    assert fused_dropout(x, 0.5, False) is x


def run_train(cfg, batch, mems=None, seed=0):
    ids, tt, perm, tmap = batch
    torch.manual_seed(seed)
    m = XLNetLMHeadModel(cfg).train()
    o = m(
        ids,
        tt,
        None,
        perm,
        target_mapping=tmap,
        mems=mems,
        labels=tmap.argmax(-1),
        label_mask=(tmap.sum(-1) > 0).float(),
    )
    o.loss.backward()
    return o, {k: p.grad for k, p in m.named_parameters()}


@pytest.mark.parametrize("bi_data", [False, True])
def test_fused_model_matches_einsum_training_graph(bi_data):
    """Fused vs plain einsum path, train mode with dropout off: loss, logits, mems and every gradient."""
    cfg = tiny_cfg(bi_data=bi_data, clamp_len=6, ff_activation="gelu_new")
    rng = np.random.default_rng(4)
    batch = plm_batch(4, 3, rng)
    mems = [torch.randn(4, 5, cfg.d_model) for _ in range(cfg.n_layer)]
    (oe, ge), (of, gf) = (run_train(dataclasses.replace(cfg, attn_impl=i), batch, mems) for i in ("einsum", "fused"))
    assert maxdiff(oe.loss, of.loss) <= TOL and maxdiff(oe.logits, of.logits) <= TOL
    for a, b in zip(oe.mems, of.mems, strict=True):
        assert maxdiff(a, b) <= TOL
    for k, g in ge.items():
        assert maxdiff(g, gf[k]) <= TOL, k


def test_fused_dropout_training_is_seeded_and_finite():
    cfg = tiny_cfg(attn_impl="auto", dropout=0.1, dropatt=0.1)
    batch = plm_batch(2, 3, np.random.default_rng(5))
    (o1, g1), (o2, g2) = run_train(cfg, batch, seed=3), run_train(cfg, batch, seed=3)
    assert torch.isfinite(o1.loss) and o1.loss.item() == o2.loss.item()
    assert all(torch.equal(g1[k], g2[k]) and torch.isfinite(g1[k]).all() for k in g1)
    o3, _ = run_train(dataclasses.replace(cfg, dropout=0.0, dropatt=0.0), batch, seed=3)
    assert o3.loss.item() != o1.loss.item()  # dropout is really applied


@pytest.mark.parametrize("impl", ["fused", "einsum"])
def test_need_hidden_false_skips_only_the_last_content_rows(impl):
    """need_hidden=False (pretraining): same loss, logits, mems and gradients; hidden is None."""
    cfg = tiny_cfg(attn_impl=impl, bi_data=True)
    batch = plm_batch(4, 3, np.random.default_rng(7))
    ids, tt, perm, tmap = batch
    mems = [torch.randn(4, 5, cfg.d_model) for _ in range(cfg.n_layer)]
    outs = []
    for need in (True, False):
        torch.manual_seed(0)
        m = XLNetLMHeadModel(cfg).train()
        o = m(
            ids,
            tt,
            None,
            perm,
            target_mapping=tmap,
            mems=mems,
            labels=tmap.argmax(-1),
            label_mask=(tmap.sum(-1) > 0).float(),
            need_hidden=need,
        )
        o.loss.backward()
        outs.append((o, {k: p.grad for k, p in m.named_parameters()}))
    (o1, g1), (o2, g2) = outs
    assert o2.hidden is None and o1.hidden is not None
    assert maxdiff(o1.loss, o2.loss) <= TOL and maxdiff(o1.logits, o2.logits) <= TOL
    for a, b in zip(o1.mems, o2.mems, strict=True):
        assert maxdiff(a, b) <= TOL
    for k in g1:
        assert maxdiff(g1[k], g2[k]) <= TOL, k


def test_fused_path_under_bf16_autocast():
    """bf16 autocast (CPU): runs, fp32 parameter gradients, loss and gradients close to fp32."""
    cfg = tiny_cfg(attn_impl="fused")
    batch = plm_batch(2, 3, np.random.default_rng(8))
    o32, g32 = run_train(cfg, batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o16, g16 = run_train(cfg, batch)
    assert abs(o16.loss.item() - o32.loss.item()) < 0.05
    for k, g in g32.items():
        assert g16[k].dtype == torch.float32 and torch.isfinite(g16[k]).all()
        assert maxdiff(g16[k], g) <= 0.05 * max(g.abs().max().item(), 1e-3) + 1e-3, k
