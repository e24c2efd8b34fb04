"""Kernels behind one seam: the attention core of XLNet's two-stream relative attention, the feed-forward block and
the LM head + loss (lm_head.py). ``xlnet.py`` states the maths; this file decides how it runs.

The attention score of a stacked query row i (content rows first, then the P query-stream rows) against key j is
the paper's three terms (XLNet §2.3 and appendix A.2; Transformer-XL §3.3):

    score_ij = [ (q_i + r_w)·k_j  +  (q_i + r_r)·kr[L - pos_i + j]  +  (q_i + r_s)·seg_embed[s_ij] ] / sqrt(D)

(content, relative position, relative segment: s_ij = 0 when i and j are in the same segment), masked where i may not
see j, then softmax, attention dropout and the weighted sum of the values. ``relative_attention`` computes it with
the kernel named by ``attn_impl``:

- ``fused`` (what ``auto`` picks on CPU): custom autograd functions that keep only what backward needs;
- ``einsum``: the plain reference, every term a visible tensor (the parity baseline);
- ``sdpa``: the content term through ``scaled_dot_product_attention``; position, segment and mask terms are folded
  into one additive bias [B,H,N,K] that the kernel reads (and differentiates); native attention dropout;
- ``flex`` (CUDA, training needs ``dropatt`` = 0): FlexAttention with a ``score_mod`` that reads the position term
  from the [B,H,N,R] table by the rel-shift index, the segment term from a per-row scalar and the mask from a bool
  tensor, so no [B,H,N,K] float tensor is ever written.
- ``triton`` (what ``auto`` picks on CUDA with triton installed; on CPU only under TRITON_INTERPRET=1, for tests):
  the whole core as fused Triton kernels (triton_attention.py), FlashAttention-2's online softmax (Dao 2023) over
  the content product plus one bf16 bias tile per step (position, segment and mask terms, made once per call), a
  hash-based attention dropout recomputed in backward and a deterministic backward (no atomics); no probability or
  fp32 score tensor is written.

Shapes: B batch, H heads, N = L + P stacked rows, K = M + L keys, R = K + L relative positions, D head size,
G = 1 (or 2 with bi_data: the first B/G rows use position table 0, the rest table 1).
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xlnetcli.core.errors import XLNetError

NEG_INF = -1e30  # additive mask value (as the original / HF); finite so fully masked rows stay finite
IMPLS = ("fused", "einsum", "sdpa", "flex", "triton")


def resolve_impl(name: str, device: torch.device) -> str:
    """The kernel ``attn_impl`` names. ``auto``, as measured (BENCHMARKS.md): ``fused`` on CPU (fastest there, least
    memory); on CUDA ``triton`` where triton is installed and the GPU has bf16 (compute capability 8.0 or later:
    H200, Base micro 16, 62.9 ms per step eagerly against sdpa's 101.2, 47.4 ms compiled against the compiled einsum
    path's 48.4, in 8.9 GiB against 14.6), else ``sdpa`` when running eagerly and the plain ``einsum`` formulation
    inside torch.compile (inductor fuses the rel-shift, bias, mask, softmax and dropout into one kernel, which beats
    SDPA's bias-reading kernel). Each layer resolves it again (train.compile compiles every layer on its own)."""
    if name == "auto":
        if device.type != "cuda":
            return "fused"
        if _triton_usable(device):
            return "triton"
        return "einsum" if torch.compiler.is_compiling() else "sdpa"
    if name == "flex" and device.type != "cuda":
        raise XLNetError("model.attn_impl=flex needs a CUDA device (FlexAttention has no CPU backward); use auto")
    if name == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise XLNetError("model.attn_impl=triton needs a CUDA device (or TRITON_INTERPRET=1 on CPU, slow); use auto")
    return name


_TRITON_USABLE: dict[int | None, bool] = {}  # per CUDA device index: filled eagerly (the model resolves auto first)


def _triton_usable(device: torch.device) -> bool:
    """Whether ``auto`` may pick ``triton`` on this CUDA device: the package is installed and the GPU runs bf16."""
    if device.index not in _TRITON_USABLE:
        _TRITON_USABLE[device.index] = (
            torch.cuda.is_available()
            and importlib.util.find_spec("triton") is not None
            and torch.cuda.get_device_capability(device) >= (8, 0)
        )
    return _TRITON_USABLE[device.index]


def dropout_fn(impl: str):
    """The dropout for activations: the fused path's (a 1-byte keep mask saved for backward), else F.dropout."""
    return fused_dropout if impl == "fused" else F.dropout


def additive_mask(mask: torch.Tensor | None, impl: str, dtype: torch.dtype) -> torch.Tensor | None:
    """The bool mask as an additive float tensor (0 or NEG_INF), for the kernels that add it to the scores (einsum,
    sdpa); None for the others, which read the bool mask."""
    if mask is None or impl not in ("einsum", "sdpa"):
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, NEG_INF)


def mask_flags(mask: torch.Tensor | None, seg_same: torch.Tensor | None) -> torch.Tensor | None:
    """The mask and the same-segment bits ([B,1,N,K] bool) as one [B,1,N,K] uint8 tensor, bit 0 = cannot attend,
    bit 1 = same segment, which the triton kernel reads once per score; None when there are neither."""
    like = mask if mask is not None else seg_same
    if like is None:
        return None
    flags = torch.zeros(like.shape, dtype=torch.uint8, device=like.device)
    if mask is not None:
        flags |= mask.to(torch.uint8)
    if seg_same is not None:
        flags |= seg_same.to(torch.uint8) << 1
    return flags


def activation(name: str):
    if name == "gelu":
        return F.gelu
    if name == "gelu_new":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise XLNetError(f"unknown ff_activation {name!r}")


@dataclass
class AttnLayout:
    """Who attends to what, shared by every layer of one forward pass.

    rows [B,N]: the sequence position of each stacked query row (0..L-1 for the content stream, then the target
    positions); rel_index [1|B,1,N,K]: column of the position table for (row, key), L - rows + j; seg_same [B,1,N,K]
    bool or None; mask [B,1,N,K] bool (True = cannot attend) or None; mask_bias: the same mask as an additive float
    tensor (built only for the einsum / sdpa kernels)."""

    L: int
    rows: torch.Tensor
    rel_index: torch.Tensor
    seg_same: torch.Tensor | None
    mask: torch.Tensor | None
    mask_bias: torch.Tensor | None = None
    flags: torch.Tensor | None = None  # mask_flags(mask, seg_same), built only for the triton kernel
    content: bool = True  # the first L rows are the content stream (positions 0..L-1); False: query rows only

    def query_rows(self) -> AttnLayout:
        """The layout of the P query-stream rows alone (the last layer of pretraining computes only those)."""
        L = self.L
        cut = lambda t: None if t is None else t[:, :, L:]  # noqa: E731
        return AttnLayout(
            L,
            self.rows[:, L:],
            self.rel_index[:, :, L:],
            cut(self.seg_same),
            cut(self.mask),
            cut(self.mask_bias),
            cut(self.flags),
            content=False,
        )


def relative_attention(
    q, k, v, kr, biases, seg_embed, layout: AttnLayout, dropatt: float, training: bool, impl: str
) -> torch.Tensor:
    """The attention core. q [B,H,N,D] (no biases), k/v [B,H,K,D], kr [G,H,R,D] projected positions, biases
    (r_w, r_r, r_s) [H,D], seg_embed [2,H,D]. Returns the attention vectors [B,H,N,D]."""
    r_w, r_r, r_s = biases
    seg = seg_embed if layout.seg_same is not None else None
    if impl == "fused":
        keep, ks = None, 1.0
        if training and dropatt > 0:
            keep, ks = keep_mask((*q.shape[:3], k.shape[2]), dropatt, q.device)
        return _RelAttnCore.apply(
            q, k, v, kr, r_w, r_r, r_s, seg, layout.rel_index, layout.seg_same, layout.mask, keep, ks
        )
    if impl == "triton":
        p = dropatt if training else 0.0
        flags = layout.flags if layout.flags is not None else mask_flags(layout.mask, layout.seg_same)
        return _triton_attention()(q, k, v, kr, biases, seg, layout.rows, layout.L, layout.content, flags,
                                   layout.mask is not None, p)[0]  # fmt: skip
    if impl == "flex":
        return _flex_attention(q, k, v, kr, r_w, r_r, r_s, seg, layout, dropatt if training else 0.0)
    bias = _position_segment_bias(q, kr, r_r, r_s, seg, layout)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if layout.mask_bias is not None:
        bias = bias + layout.mask_bias
    qw = q + r_w[:, None]
    if impl == "sdpa":
        ct = _compute_dtype(q)
        return F.scaled_dot_product_attention(
            qw.to(ct), k.to(ct), v.to(ct), attn_mask=bias.to(ct), dropout_p=dropatt if training else 0.0, scale=scale
        )
    if impl == "einsum":
        prob = torch.softmax(torch.matmul(qw, k.transpose(-1, -2)) * scale + bias, dim=-1)
        return torch.matmul(F.dropout(prob, dropatt, training), v)
    raise XLNetError(f"unknown model.attn_impl {impl!r} (auto, {', '.join(IMPLS)})")


def _position_scores(q, kr, r_r):
    """(q + r_r)·kr for every row and every one of the R relative positions: [B,H,N,R] (before the rel-shift)."""
    B, H, N, D = q.shape
    G = kr.shape[0]
    qr = (q + r_r[:, None]).view(G, B // G, H, N, D)
    return torch.matmul(qr, kr.transpose(-1, -2)[:, None]).view(B, H, N, -1)


class _RelShift(torch.autograd.Function):
    """The rel-shift: out[..., i, j] = bd[..., i, shift_i + j] for j < K (each row reads a window of K consecutive
    relative positions, shift_i = L - pos_i). Backward is the inverse window read, grad_bd[..., i, c] =
    grad[..., i, c - shift_i] inside the window and 0 outside: a gather too, so no scatter and no atomic adds
    (deterministic on GPUs, and fused into one kernel under torch.compile)."""

    @staticmethod
    def forward(ctx, bd, shift, K: int):
        B, H, N, R = bd.shape
        ctx.save_for_backward(shift)
        ctx.R = R
        index = shift + torch.arange(K, device=bd.device)  # [B|1,1,N,K]
        return torch.gather(bd, 3, index.expand(B, H, N, K))

    @staticmethod
    def backward(ctx, grad):
        (shift,) = ctx.saved_tensors
        B, H, N, K = grad.shape
        j = torch.arange(ctx.R, device=grad.device) - shift  # [B|1,1,N,R]: which score column lands on c
        inside = (j >= 0) & (j < K)
        out = torch.gather(grad, 3, j.clamp(0, K - 1).expand(B, H, N, ctx.R))
        return torch.where(inside, out, 0.0).to(grad.dtype), None, None


def _position_segment_bias(q, kr, r_r, r_s, seg, layout: AttnLayout):
    """scale * (position term after the rel-shift + segment term): [B,H,N,K]."""
    D = q.shape[-1]
    K = layout.rel_index.shape[-1]
    # the window start per row, from the row positions (not layout.rel_index): under torch.compile the column is then
    # arithmetic inside the fused kernel rather than an int64 tensor loaded for every score
    shift = (layout.L - layout.rows)[:, None, :, None]
    bias = _RelShift.apply(_position_scores(q, kr, r_r), shift, K)
    if seg is not None:
        assert layout.seg_same is not None  # built together with the segment ids
        ef = torch.matmul(q + r_s[:, None], seg.permute(1, 2, 0))  # [B,H,N,2]: same segment, other segment
        bias = bias + torch.where(layout.seg_same, ef[..., :1], ef[..., 1:])
    return bias * (1.0 / math.sqrt(D))


def _triton_attention():
    """triton_attention.triton_rel_attention, imported when first used: triton is optional, and its interpreter
    switch (TRITON_INTERPRET) is read when the kernels are defined."""
    try:
        from xlnetcli.model.triton_attention import triton_rel_attention  # noqa: PLC0415 - optional, see above
    except ImportError as e:
        raise XLNetError(f"model.attn_impl=triton needs the triton package ({e}); use auto") from e
    return triton_rel_attention


_FLEX = None


def _flex_attention(q, k, v, kr, r_w, r_r, r_s, seg, layout: AttnLayout, dropatt: float):
    """FlexAttention: the content term in the kernel, the rest in ``score_mod`` from small tables.

    The position table bd [B,H,N,R] is read at column L - pos_i + j: for a fixed row that column is different for
    every key, so each entry of bd receives at most one gradient contribution (the backward is exact). The segment
    term is ef1_i + [same_ij]·(ef0_i - ef1_i); ef1_i is constant along the row and cancels in the softmax, so only
    delta_i = ef0_i - ef1_i enters the kernel."""
    global _FLEX
    if dropatt > 0:
        raise XLNetError("model.attn_impl=flex has no attention dropout; set model.dropatt=0 or use attn_impl=sdpa")
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415 - torch >= 2.5 only (we allow 2.4)

        _FLEX = torch.compile(flex_attention, dynamic=False)
    D = q.shape[-1]
    ct = _compute_dtype(q)
    L = layout.L
    scale = 1.0 / math.sqrt(D)
    bd = _position_scores(q, kr, r_r).to(ct)
    rows = layout.rows
    same = delta = None
    if seg is not None:
        assert layout.seg_same is not None  # built together with the segment ids
        same = layout.seg_same[:, 0]
        ef = torch.matmul(q + r_s[:, None], seg.permute(1, 2, 0))
        delta = (ef[..., 0] - ef[..., 1]).float()  # [B,H,N], fp32: its gradient sums over K keys
    mask = None if layout.mask is None else layout.mask[:, 0]

    def score_mod(score, b, h, i, j):
        s = score + bd[b, h, i, L - rows[b, i] + j] * scale
        if same is not None and delta is not None:  # both set, or neither
            s = s + torch.where(same[b, i, j], delta[b, h, i] * scale, 0.0)
        if mask is not None:
            s = torch.where(mask[b, i, j], s + NEG_INF, s)
        return s

    return _FLEX((q + r_w[:, None]).to(ct), k.to(ct), v.to(ct), score_mod=score_mod, scale=scale)


# ----------------------------------------------------------------------------------------------------------------
# The fused training path ("fused", what "auto" picks on CPU): custom autograd functions that keep only what
# backward needs. Per layer the plain path keeps ~5 [B,H,N,K]-sized tensors (the [B,H,N,R] position scores the
# gather saves, the probabilities, the float dropout noise, the dropped probabilities); the fused core keeps the
# probabilities and a 1-byte keep mask. The FFN keeps its pre-activation and a keep mask (the activation is
# recomputed in backward); the loss keeps the logits the caller holds anyway plus one log-sum-exp per row.


def keep_mask(shape, p: float, device) -> tuple[torch.Tensor, float]:
    """Dropout keep mask (bool, True with probability 1 - p') and its scale 1/(1 - p'), p' = p rounded to a multiple of
    2^-15. Each 64-bit random draw gives four 15-bit uniforms: ~8x cheaper than ``bernoulli_`` on CPU."""
    n = math.prod(shape)
    thresh = round(p * 32768)
    if thresh >= 32768:
        return torch.zeros(shape, dtype=torch.bool, device=device), 0.0
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_()
    keep = (bits.view(torch.int16)[:n].view(shape) & 0x7FFF) >= thresh
    return keep, 32768.0 / (32768 - thresh)


class _MaskedScale(torch.autograd.Function):
    """y = x * keep * scale (dropout with a given keep mask); saves only the 1-byte mask."""

    @staticmethod
    def forward(ctx, x, keep, scale: float):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_tensors
        return g.mul(keep).mul_(ctx.scale), None, None


def fused_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    keep, scale = keep_mask(x.shape, p, x.device)
    return _MaskedScale.apply(x, keep, scale)


def feed_forward(x, layer_1, layer_2, act_name: str, p: float, training: bool, fused: bool) -> torch.Tensor:
    """The position-wise feed-forward block before its residual: drop(layer_2(drop(act(layer_1(x))))). ``fused``:
    through _FeedForwardCore, which saves the pre-activation and a keep mask instead of the activations."""
    if fused:
        keep, ks = None, 1.0
        if training and p > 0:
            keep, ks = keep_mask((*x.shape[:-1], layer_1.out_features), p, x.device)
            keep = keep.view(-1, keep.shape[-1])
        y = _FeedForwardCore.apply(
            x.reshape(-1, x.shape[-1]), layer_1.weight, layer_1.bias, layer_2.weight, layer_2.bias, act_name, keep, ks
        )
        return fused_dropout(y.view(x.shape), p, training)
    y = F.dropout(activation(act_name)(layer_1(x)), p, training)
    return F.dropout(layer_2(y), p, training)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def _act_backward(name: str, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return g * (x > 0)
    return torch.ops.aten.gelu_backward(g, x, approximate="tanh" if name == "gelu_new" else "none")


class _FeedForwardCore(torch.autograd.Function):
    """y = drop(act(x W1^T + b1)) W2^T + b2 on [n, d] rows; saves x, the pre-activation and the keep mask and
    recomputes the activation in backward (instead of keeping activation, dropout noise and dropped activation)."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, act_name: str, keep, scale: float):
        ct = _compute_dtype(x)
        ctx.dtypes = (x.dtype, w1.dtype, b1.dtype, w2.dtype, b2.dtype)
        with torch.autocast(x.device.type, enabled=False):
            x, w1, b1, w2, b2 = (t.to(ct) for t in (x, w1, b1, w2, b2))
            h1 = torch.addmm(b1, x, w1.t())
            a = activation(act_name)(h1)
            if keep is not None:
                a.mul_(keep).mul_(scale)
            y = torch.addmm(b2, a, w2.t())
        ctx.save_for_backward(x, h1, w1, w2, keep)
        ctx.act_name, ctx.scale = act_name, scale
        return y

    @staticmethod
    def backward(ctx, gy):
        x, h1, w1, w2, keep = ctx.saved_tensors
        with torch.autocast(x.device.type, enabled=False):
            gy = gy.to(x.dtype)
            a = activation(ctx.act_name)(h1)
            if keep is not None:
                a.mul_(keep).mul_(ctx.scale)
            gw2 = gy.t() @ a
            del a
            ga = gy @ w2
            if keep is not None:
                ga.mul_(keep).mul_(ctx.scale)
            gh1 = _act_backward(ctx.act_name, ga, h1)
            del ga
            grads = (gh1 @ w1, gh1.t() @ x, gh1.sum(0), gw2, gy.sum(0))
        return (*(g.to(dt) for g, dt in zip(grads, ctx.dtypes, strict=True)), None, None, None)


def _split_halves(rel_index: torch.Tensor, B: int, G: int) -> torch.Tensor:
    """[B|1,1,N,K] -> [G,B/G,1,N,K] (or [1,1,1,N,K] when shared by the batch)."""
    N, K = rel_index.shape[-2:]
    return rel_index.reshape(G, B // G, 1, N, K) if rel_index.shape[0] == B else rel_index.reshape(1, 1, 1, N, K)


class _RelAttnCore(torch.autograd.Function):
    """The whole XLNet attention core for the stacked query rows, keeping only q, k, v, kr, the probabilities and
    the attention-dropout keep mask for backward.

    q [B,H,N,D] (no biases), k/v [B,H,K,D], kr [G,H,R,D] batch-shared projected positions (G = 1, or 2 with bi_data:
    the first B/G rows use kr[0]); biases r_w/r_r/r_s [H,D]; seg_embed [2,H,D] (or None with seg_same None);
    rel_index [1|B,1,N,K] column of kr for each (row, key); seg_same [B,1,N,K] bool; mask [B,1,N,K] bool
    (True = cannot attend) or None; keep [B,H,N,K] bool (attention dropout) or None. Returns [B,H,N,D].
    score = ((q+r_w)·k + (q+r_r)·kr[rel] + (q+r_s)·seg_embed[s]) / sqrt(D), masked, softmax, dropout, · v."""

    @staticmethod
    def forward(ctx, q, k, v, kr, r_w, r_r, r_s, seg_embed, rel_index, seg_same, mask, keep, keep_scale: float):
        B, H, N, D = q.shape
        K, (G, _, R, _) = k.shape[2], kr.shape
        ct = _compute_dtype(q)
        ins = (q, k, v, kr, r_w, r_r, r_s, seg_embed)
        ctx.dtypes = tuple(None if t is None else t.dtype for t in ins)
        with torch.autocast(q.device.type, enabled=False):
            q, k, v, kr, r_w, r_r, r_s, seg_embed = (None if t is None else t.to(ct) for t in ins)
            score = torch.matmul(q + r_w[:, None], k.transpose(-1, -2))  # [B,H,N,K] content term
            # position term: one [(B/G)*N, D] x [D, R] matmul per (half, head), then the rel-shift gather
            qr = (q + r_r[:, None]).reshape(G, B // G, H, N, D).transpose(1, 2).reshape(G * H, (B // G) * N, D)
            bd = torch.bmm(qr, kr.reshape(G * H, R, D).transpose(1, 2)).reshape(G, H, B // G, N, R).transpose(1, 2)
            idx = _split_halves(rel_index, B, G)
            score += torch.gather(bd, 4, idx.expand(G, B // G, H, N, K)).reshape(B, H, N, K)
            del bd
            if seg_same is not None:  # segment term: per row one of two scalars
                ef = torch.matmul(q + r_s[:, None], seg_embed.permute(1, 2, 0))  # [B,H,N,2]
                score += ef[..., 1:]
                score.addcmul_(seg_same, ef[..., :1] - ef[..., 1:])
            score.mul_(1.0 / math.sqrt(D))
            if mask is not None:
                score.masked_fill_(mask, NEG_INF)
            prob = torch.softmax(score, -1, dtype=torch.promote_types(ct, torch.float32)).to(ct)
            del score
            pd = prob if keep is None else prob.mul(keep).mul_(keep_scale)
            out = torch.matmul(pd, v)
        ctx.save_for_backward(q, k, v, kr, r_w, r_r, r_s, seg_embed, rel_index, seg_same, keep, prob)
        ctx.keep_scale = keep_scale
        return out

    @staticmethod
    def backward(ctx, go):
        q, k, v, kr, r_w, r_r, r_s, seg_embed, rel_index, seg_same, keep, prob = ctx.saved_tensors
        B, H, N, D = q.shape
        K, (G, _, R, _) = k.shape[2], kr.shape
        s = ctx.keep_scale
        with torch.autocast(q.device.type, enabled=False):
            go = go.to(q.dtype)
            pd = prob if keep is None else prob.mul(keep).mul_(s)
            dv = torch.matmul(pd.transpose(-1, -2), go)
            del pd
            dp = torch.matmul(go, v.transpose(-1, -2))
            if keep is not None:
                dp.mul_(keep).mul_(s)
            ds = torch._softmax_backward_data(dp, prob, -1, prob.dtype)
            del dp
            ds.mul_(1.0 / math.sqrt(D))  # d loss / d (content + position + segment terms)
            qw = q + r_w[:, None]
            dqw = torch.matmul(ds, k)
            dk = torch.matmul(ds.transpose(-1, -2), qw)
            del qw
            # position term: scatter back to the R columns (distinct per row), then the two matmuls
            # (the zeros are allocated [G,H,B/G,N,R] so that the bmm below reads them without a copy; the scatter
            # writes through the [G,B/G,H,N,R] view, whose result is used, not the base: torch.compile needs that)
            idx = _split_halves(rel_index, B, G)
            dbd = (
                ds.new_zeros(G, H, B // G, N, R)
                .transpose(1, 2)
                .scatter_(4, idx.expand(G, B // G, H, N, K), ds.reshape(G, B // G, H, N, K))
            )
            dbd = dbd.transpose(1, 2).reshape(G * H, (B // G) * N, R)
            qr = (q + r_r[:, None]).reshape(G, B // G, H, N, D).transpose(1, 2).reshape(G * H, (B // G) * N, D)
            dkr = torch.bmm(dbd.transpose(1, 2), qr).reshape(G, H, R, D)
            del qr
            dqr = (
                torch.bmm(dbd, kr.reshape(G * H, R, D)).reshape(G, H, B // G, N, D).transpose(1, 2).reshape(B, H, N, D)
            )
            del dbd
            dq = dqw + dqr
            dr_w, dr_r = dqw.sum((0, 2)), dqr.sum((0, 2))
            dr_s = dseg = None
            if seg_same is not None:
                # rows of ds sum to zero (softmax), so d(ef1) = -d(ef0)
                de0 = (ds * seg_same).sum(-1)
                de = torch.stack([de0, -de0], -1)  # [B,H,N,2]
                dqs = torch.matmul(de, seg_embed.transpose(0, 1))  # [B,H,N,D]
                dseg = torch.einsum("bhns,bhnd->shd", de, q + r_s[:, None])
                dq += dqs
                dr_s = dqs.sum((0, 2))
            grads = (dq, dk, dv, dkr, dr_w, dr_r, dr_s, dseg)
        out_grads = tuple(None if g is None else g.to(dt) for g, dt in zip(grads, ctx.dtypes, strict=True))
        return (*out_grads, None, None, None, None, None)
