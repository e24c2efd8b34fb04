"""The LM head's Triton kernels (model/triton_lm_head.py) against its torch path and F.cross_entropy: the loss, the
log-sum-exp and every gradient (x, the tied weight, the bias), with ignored rows, weighted rows, vocabulary and row
counts that are no multiple of a tile, logits that are also used (their own gradient added), fp32 and bf16 logits;
deterministic, and chosen by the model exactly when the attention core is triton. Triton's interpreter on CPU
(tests/conftest.py sets TRITON_INTERPRET=1 there), the compiled kernels with CUDA. Skipped without triton."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from modeltools import maxdiff, plm_batch, tiny_cfg

from xlnetcli.core.errors import XLNetError
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.lm_head import _LMHeadLoss, lm_head

pytest.importorskip("triton")
from xlnetcli.model import triton_attention as ta
from xlnetcli.model import triton_lm_head as th

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and not ta.INTERPRETED:
    pytest.skip("triton was imported before TRITON_INTERPRET=1 (tests/conftest.py sets it)", allow_module_level=True)


def head_case(n=37, d=8, V=300, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    W = torch.randn(V, d, generator=g, dtype=dtype) * 0.5
    b = torch.randn(V, generator=g, dtype=dtype)
    labels = torch.randint(0, V, (n,), generator=g)
    labels[3] = -100
    labels[5] = V - 1  # the last column (the last tile's edge)
    labels[6] = 0
    w = torch.rand(n, generator=g)
    return [t.to(DEVICE).requires_grad_(t.is_floating_point()) for t in (x, W, b)], labels.to(DEVICE), w.to(DEVICE)


def run(use_triton, params, labels, w, extra=None):
    x, W, b = (t.detach().clone().requires_grad_() for t in params)
    loss, logits = _LMHeadLoss.apply(x, W, b, labels, w, use_triton)
    total = loss if extra is None else loss + (logits.float() * extra).sum()
    total.backward()
    return loss.detach(), logits.detach(), x.grad, W.grad, b.grad


@pytest.mark.parametrize("with_logits_grad", [False, True])
def test_triton_head_matches_the_torch_path_and_cross_entropy_fp32(with_logits_grad):
    params, labels, w = head_case()
    extra = torch.randn(37, 300, device=DEVICE) * 1e-2 if with_logits_grad else None
    got = run(True, params, labels, w, extra)
    want = run(False, params, labels, w, extra)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and maxdiff(a, b) <= 2e-5, maxdiff(a, b)
    x, W, b = params
    ce = F.cross_entropy(F.linear(x.double(), W.double(), b.double()), labels, reduction="none")
    assert maxdiff(got[0], (ce * w.double()).sum()) <= 2e-5


def test_lse_and_label_rows_and_tiles():
    """Log-sum-exp over a vocabulary spanning several column steps (a partial last one), large logits (a shifted
    max), the label's logit at both edges; an empty batch."""
    g = torch.Generator().manual_seed(1)
    n, V = 5, 2 * th.LSE_COLS + 7
    logits = (torch.randn(n, V, generator=g) * 30 + torch.arange(n)[:, None] * 1e3).to(DEVICE)
    labels = torch.tensor([0, V - 1, 17, th.LSE_COLS, 3], device=DEVICE)
    lse, picked = th.lse_and_label(logits, labels)
    assert maxdiff(lse, torch.logsumexp(logits.double(), -1)) <= 1e-3  # |lse| ~ 4e3: fp32's last bits
    assert torch.equal(picked, logits.gather(1, labels[:, None])[:, 0])
    e_lse, e_picked = th.lse_and_label(logits[:0], labels[:0])
    assert e_lse.shape == e_picked.shape == (0,)


def test_triton_head_bf16_logits_as_under_autocast():
    """bf16 logits (as autocast's head makes them): the loss in fp32 from the same bf16 logits, the gradients
    through bf16 products as the torch path's; deterministic."""
    params, labels, w = head_case(n=21, d=16, V=520, seed=3)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        got = run(True, params, labels, w)
        again = run(True, params, labels, w)
        want = run(False, params, labels, w)
    assert got[1].dtype == torch.bfloat16 and got[0].dtype == torch.float32
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a, b)
    assert maxdiff(got[0], want[0]) <= 1e-4  # the same bf16 logits, two fp32 log-sum-exps
    assert torch.equal(got[1], want[1])
    for a, b in zip(got[2:], want[2:], strict=True):  # bf16 products: rounding of g and of the block sums
        assert maxdiff(a, b) <= 2e-2 * b.abs().max().item(), (maxdiff(a, b), b.abs().max().item())


@pytest.mark.parametrize("use_triton", [False, True])
def test_unused_loss_or_unused_logits_need_no_zero_gradient(use_triton, monkeypatch):
    """Only the logits used (no gradient of the loss), and only the loss used: no [n,V] zero gradient of the
    logits is made (ctx.set_materialize_grads(False)), both paths."""
    seen = []
    real = _LMHeadLoss.backward
    monkeypatch.setattr(
        _LMHeadLoss, "backward", staticmethod(lambda ctx, gl, glog: seen.append(glog) or real(ctx, gl, glog))
    )
    params, labels, w = head_case(n=9, V=70)
    x, W, b = (t.detach().clone().requires_grad_() for t in params)
    _, logits = _LMHeadLoss.apply(x, W, b, labels, w, use_triton)
    logits.sum().backward()
    assert maxdiff(b.grad, torch.full_like(b, 9.0)) <= 1e-5
    assert maxdiff(x.grad, W.sum(0).expand(9, -1)) <= 1e-4
    loss, _ = _LMHeadLoss.apply(x, W, b, labels, w, use_triton)
    loss.backward()
    assert seen[0] is not None and seen[1] is None
    assert torch.isfinite(x.grad).all()


@pytest.mark.slow  # the whole model in Triton's interpreter
def test_the_model_takes_the_triton_head_with_the_triton_core(monkeypatch):
    calls = []
    real = th.ce_grad
    monkeypatch.setattr(th, "ce_grad", lambda *a: calls.append(1) or real(*a))
    ids, tt, perm, tmap = plm_batch(2, 3, np.random.default_rng(0))
    labels = torch.randint(0, 60, (2, 3))
    for impl, expect in (("triton", 1), ("fused", 0), ("einsum", 0)):
        torch.manual_seed(0)
        model = XLNetLMHeadModel(tiny_cfg(attn_impl=impl, d_head=16)).to(DEVICE)
        calls.clear()
        out = model(ids.to(DEVICE), token_type_ids=tt.to(DEVICE), perm_mask=perm.to(DEVICE),
                    target_mapping=tmap.to(DEVICE), labels=labels.to(DEVICE))  # fmt: skip
        out.loss.backward()
        assert len(calls) == expect, impl
    with pytest.raises(XLNetError, match="LM head impl"):
        lm_head(ids.float(), ids.float(), None, labels, impl="cuda")
    if DEVICE.type == "cpu":
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(XLNetError, match="needs a CUDA device"):
            lm_head(ids.float(), ids.float(), None, labels, impl="triton")
