"""The tied LM head and its cross entropy (the PLM loss over the target rows, XLNet section 2.3): ``lm_head`` with
three implementations behind one seam: ``plain`` (F.cross_entropy), ``fused`` (_LMHeadLoss: no [n,V] softmax kept
for backward) and ``triton`` (the same function with its element-wise work in triton_lm_head.py's kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xlnetcli.core.errors import XLNetError
from xlnetcli.model.kernels import resolve_impl

HEAD_IMPLS = ("plain", "fused", "triton")


def lm_head(x, weight, bias, labels=None, label_mask=None, impl: str = "fused"):
    """The tied LM head and its loss: (logits = x W^T + b, loss or None). The loss is the mean cross entropy over
    the rows (label -100 = ignored), weighted by ``label_mask`` when given. ``impl`` (with labels): ``plain``
    F.cross_entropy; ``fused`` _LMHeadLoss, the same loss keeping no [n,V] softmax for backward; ``triton`` the
    same function with its element-wise work in two Triton kernels (triton_lm_head.py)."""
    if impl not in HEAD_IMPLS:
        raise XLNetError(f"LM head impl must be one of {', '.join(HEAD_IMPLS)}, got {impl!r}")
    if impl == "triton":
        resolve_impl(impl, x.device)  # refuses a device the triton kernels cannot run on
    if labels is not None and impl != "plain":
        flat = x.reshape(-1, x.shape[-1])
        if label_mask is None:
            w = torch.full((flat.shape[0],), 1.0 / max(flat.shape[0], 1), device=flat.device)
        else:
            w = label_mask.reshape(-1).float()
            w = w / w.sum().clamp_min(1.0)
        loss, logits = _LMHeadLoss.apply(flat, weight, bias, labels.reshape(-1).to(flat.device), w, impl == "triton")
        return logits.view(*x.shape[:-1], -1), loss
    logits = F.linear(x, weight, bias)
    if labels is None:
        return logits, None
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none")
    if label_mask is None:
        return logits, ce.mean()
    w = label_mask.reshape(-1).to(ce.dtype)
    return logits, (ce * w).sum() / w.sum().clamp_min(1.0)


def _triton_lm_head():
    """The module triton_lm_head, imported when first used (as _triton_attention)."""
    from xlnetcli.model import triton_lm_head  # noqa: PLC0415 - optional, see _triton_attention

    return triton_lm_head


class _LMHeadLoss(torch.autograd.Function):
    """logits = x W^T + b and loss = sum_i w_i CE(logits_i, labels_i) (label -100 = ignored row) in one function.
    Torch path: keeps only x and one log-sum-exp per row (not the [n,V] logits, log-probabilities or gradient):
    backward walks the vocabulary in column blocks, recomputing that block of logits (one extra head matmul),
    turning it into softmax - onehot, writing its rows of dW once and accumulating dx. ``use_triton``
    (triton_lm_head.py): the logits are kept, and one kernel each way does the loss's element-wise work."""

    BLOCK = 4096  # vocabulary columns per block
    ROWS = 256  # rows per forward log-sum-exp chunk (no [n,V] temporary)

    @staticmethod
    def forward(ctx, x, weight, bias, labels, w, use_triton=False):
        ctx.set_materialize_grads(False)  # unused logits get no [n,V] zero gradient
        logits = F.linear(x, weight, bias)
        ft = torch.promote_types(logits.dtype, torch.float32)  # fp32 (or fp64) softmax
        lab = labels.clamp_min(0)
        w = w.to(ft) * (labels != -100)
        ctx.use_triton = use_triton and logits.dtype != torch.float64
        if ctx.use_triton:
            lse, picked = _triton_lm_head().lse_and_label(logits, lab)
            ctx.save_for_backward(x, weight, logits, lab, w, lse)
        else:
            lse = torch.cat(
                [
                    torch.logsumexp(logits[r : r + _LMHeadLoss.ROWS].to(ft), -1)
                    for r in range(0, logits.shape[0], _LMHeadLoss.ROWS)
                ]
            )
            picked = logits.gather(1, lab[:, None])[:, 0].to(ft)
            ctx.save_for_backward(x, weight, bias, lab, w, lse)
        ctx.logits_dtype, ctx.bias_dtype = logits.dtype, bias.dtype
        return ((lse - picked) * w).sum(), logits

    @staticmethod
    def backward(ctx, g_loss, g_logits):
        x, weight, saved, lab, w, lse = ctx.saved_tensors
        ft, lp = lse.dtype, ctx.logits_dtype  # lp: recompute and multiply as the forward did (in the logits' dtype)
        coef = w * g_loss if g_loss is not None else torch.zeros_like(w)
        with torch.autocast(x.device.type, enabled=False):
            xl, wl = x.to(lp), weight.to(lp)
            if ctx.use_triton:
                g, db = _triton_lm_head().ce_grad(saved, lse, lab, coef, g_logits)
                return (g @ wl).to(x.dtype), (g.t() @ xl).to(weight.dtype), db.to(ctx.bias_dtype), None, None, None
            n, V = x.shape[0], weight.shape[0]
            dx = torch.zeros(n, weight.shape[1], dtype=ft, device=x.device)
            dw = torch.empty(weight.shape, dtype=ft, device=x.device)
            db = torch.empty(V, dtype=ft, device=x.device)
            rows = torch.arange(n, device=x.device)
            bl = saved.to(lp)
            xf, wf = x.to(ft), weight.to(ft)
            for c0 in range(0, V, _LMHeadLoss.BLOCK):
                c1 = min(V, c0 + _LMHeadLoss.BLOCK)
                g = torch.addmm(bl[c0:c1], xl, wl[c0:c1].t()).to(ft).sub_(lse[:, None]).exp_()
                # softmax - one-hot: 1 off each row's label column inside this block (0 off a column of a row whose
                # label lies elsewhere); integer indices, so no host sync (a boolean index would wait for a count)
                hit = ((lab >= c0) & (lab < c1)).to(ft)
                g[rows, (lab - c0).clamp(0, c1 - c0 - 1)] -= hit
                g.mul_(coef[:, None])
                if g_logits is not None:
                    g += g_logits[:, c0:c1]
                torch.sum(g, 0, out=db[c0:c1])
                if lp == ft:
                    torch.mm(g.t(), xf, out=dw[c0:c1])
                    dx.addmm_(g, wf[c0:c1])
                else:  # autocast (bf16/fp16 logits): the two matmuls in that dtype, as the forward's
                    g = g.to(lp)
                    dw[c0:c1] = g.t() @ xl
                    dx += g @ wl[c0:c1]
        return dx.to(x.dtype), dw.to(weight.dtype), db.to(ctx.bias_dtype), None, None, None
