"""XLNet in one file: two-stream relative attention with Transformer-XL memory (batch-first everywhere).

Notation: B batch, L sequence length, M memory length, K = M + L keys, P predicted (query-stream) rows,
H heads, D head size, R = K + L relative positions. Facts: REFERENCE.md §6.

How this differs from the transformers implementation (same numbers, less work):
- the query stream is computed only for the P target rows (``target_index`` [B,P]); a one-hot ``target_mapping``
  [B,P,L] is accepted too and turned into indices (all-zero rows are padding: their attention output is zero, as HF);
- both streams share one attention call: the L content rows and the P query rows are stacked into L+P query rows
  that attend to the same keys, each row with its own relative offset and mask row;
- the positional projection W_r·pos_emb is done once per batch (twice with bi_data), not once per example;
- the position term is one [B,H,L+P,R] matmul followed by a gather (the "rel-shift") instead of per-example copies;
- ``attn_impl`` selects the attention kernel: "einsum" (plain reference), "sdpa"
  (``scaled_dot_product_attention`` with the position/segment terms and the mask folded into an additive bias);
  "auto" picks einsum (see AUTO_IMPL); ``maybe_compile`` wraps the model in ``torch.compile``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .errors import XLNetError

XLNetConfig = ModelConfig

# Named sizes (REFERENCE §8). Everything not listed keeps ModelConfig's default.
SIZES: dict[str, dict] = {
    "tiny": dict(vocab_size=8000, d_model=128, n_layer=4, n_head=4, d_head=32, d_inner=512, mem_len=96, reuse_len=64),
    "base": dict(vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_head=64, d_inner=3072),
    "large": dict(vocab_size=32000, d_model=1024, n_layer=24, n_head=16, d_head=64, d_inner=4096),
}

NEG_INF = -1e30  # additive mask value (as the original / HF); finite so fully masked rows stay finite


def named_config(name: str, **overrides) -> ModelConfig:
    """``named_config("base", dropout=0.0)`` -> ModelConfig for a named size."""
    if name not in SIZES:
        raise XLNetError(f"unknown model size {name!r} (known: {', '.join(SIZES)})")
    return ModelConfig(**{**SIZES[name], **overrides})


@dataclass
class XLNetOutput:
    hidden: torch.Tensor | None  # [B,L,d] content stream (after the final dropout); None with content_output=False
    query: torch.Tensor | None  # [B,P,d] query stream, or None without targets
    mems: list[torch.Tensor] | None  # per layer [B,M',d], detached


@dataclass
class LMOutput:
    logits: torch.Tensor  # [B,P,V] (query stream) or [B,L,V] (content stream, no targets)
    loss: torch.Tensor | None
    mems: list[torch.Tensor] | None
    hidden: torch.Tensor | None  # None with need_hidden=False
    query: torch.Tensor | None = None


def _activation(name: str):
    if name == "gelu":
        return F.gelu
    if name == "gelu_new":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise XLNetError(f"unknown ff_activation {name!r}")


# ----------------------------------------------------------------------------------------------------------------
# Attention core: the reference (einsum) formulation and the SDPA one. Both take the stacked query rows.


def attention_einsum(q, k, v, bias, dropatt: float, training: bool):
    """q [B,H,N,D] (already + r_w_bias), k/v [B,H,K,D], bias [B,H,N,K] = scale*(BD+EF) + mask -> [B,H,N,D]."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    score = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
    prob = torch.softmax(score, dim=-1)
    prob = F.dropout(prob, dropatt, training)
    return torch.matmul(prob, v)


def attention_sdpa(q, k, v, bias, dropatt: float, training: bool):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, dropout_p=dropatt if training else 0.0, scale=1.0 / math.sqrt(q.shape[-1])
    )


ATTENTION = {"einsum": attention_einsum, "sdpa": attention_sdpa}
# "auto" = "fused" (below): on CPU the SDPA call falls back to its math kernel (the bias needs a gradient) and measured
# no faster than the plain path; the fused path is faster and keeps ~4x less activation memory.
AUTO_IMPL = "fused"


# ----------------------------------------------------------------------------------------------------------------
# The fused training path ("fused", what "auto" picks): custom autograd functions that keep only what backward needs.
# Per layer the plain path keeps ~5 [B,H,N,K]-sized tensors (the [B,H,N,R] position scores the gather saves, the
# probabilities, the float dropout noise, the dropped probabilities); the fused core keeps the probabilities and a
# 1-byte keep mask. The FFN keeps its pre-activation and a keep mask (the activation is recomputed in backward);
# the loss keeps the logits the caller holds anyway plus one log-sum-exp per row.


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
            a = _activation(act_name)(h1)
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
            a = _activation(ctx.act_name)(h1)
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
        return (*(g.to(dt) for g, dt in zip(grads, ctx.dtypes)), None, None, None)


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
            qr = (q + r_r[:, None]).view(G, B // G, H, N, D).transpose(1, 2).reshape(G * H, (B // G) * N, D)
            bd = torch.bmm(qr, kr.reshape(G * H, R, D).transpose(1, 2)).view(G, H, B // G, N, R).transpose(1, 2)
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
            dbd = ds.new_zeros(G, H, B // G, N, R)
            idx = _split_halves(rel_index, B, G)
            dbd.transpose(1, 2).scatter_(4, idx.expand(G, B // G, H, N, K), ds.view(G, B // G, H, N, K))
            dbd = dbd.view(G * H, (B // G) * N, R)
            qr = (q + r_r[:, None]).view(G, B // G, H, N, D).transpose(1, 2).reshape(G * H, (B // G) * N, D)
            dkr = torch.bmm(dbd.transpose(1, 2), qr).view(G, H, R, D)
            del qr
            dqr = torch.bmm(dbd, kr.reshape(G * H, R, D)).view(G, H, B // G, N, D).transpose(1, 2).reshape(B, H, N, D)
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
        grads = tuple(None if g is None else g.to(dt) for g, dt in zip(grads, ctx.dtypes))
        return (*grads, None, None, None, None, None)


class _LMHeadLoss(torch.autograd.Function):
    """logits = x W^T + b and loss = sum_i w_i CE(logits_i, labels_i) (label -100 = ignored row) in one function.
    Keeps only x and one log-sum-exp per row (not the [n,V] logits, log-probabilities or gradient): backward walks
    the vocabulary in column blocks, recomputing that block of logits (one extra head matmul), turning it into
    softmax - onehot, writing its rows of dW once and accumulating dx."""

    BLOCK = 4096  # vocabulary columns per block
    ROWS = 256  # rows per forward log-sum-exp chunk (no [n,V] temporary)

    @staticmethod
    def forward(ctx, x, weight, bias, labels, w):
        logits = F.linear(x, weight, bias)
        ft = torch.promote_types(logits.dtype, torch.float32)  # fp32 (or fp64) softmax
        lse = torch.cat([torch.logsumexp(logits[r:r + _LMHeadLoss.ROWS].to(ft), -1)
                         for r in range(0, logits.shape[0], _LMHeadLoss.ROWS)])
        valid = labels != -100
        lab = labels.clamp_min(0)
        w = w.to(ft) * valid
        loss = ((lse - logits.gather(1, lab[:, None])[:, 0].to(ft)) * w).sum()
        ctx.save_for_backward(x, weight, bias, lab, w, lse)
        ctx.logits_dtype = logits.dtype
        return loss, logits

    @staticmethod
    def backward(ctx, g_loss, g_logits):
        x, weight, bias, lab, w, lse = ctx.saved_tensors
        ft = lse.dtype
        with torch.autocast(x.device.type, enabled=False):
            n, V = x.shape[0], weight.shape[0]
            coef = (w * g_loss)[:, None]
            dx = torch.zeros(n, weight.shape[1], dtype=ft, device=x.device)
            dw = torch.empty(weight.shape, dtype=ft, device=x.device)
            db = torch.empty(V, dtype=ft, device=x.device)
            rows = torch.arange(n, device=x.device)
            lp = ctx.logits_dtype  # recompute the block exactly as the forward did (in the logits' dtype)
            xl, wl, bl = x.to(lp), weight.to(lp), bias.to(lp)
            xf, wf = x.to(ft), weight.to(ft)
            for c0 in range(0, V, _LMHeadLoss.BLOCK):
                c1 = min(V, c0 + _LMHeadLoss.BLOCK)
                g = torch.addmm(bl[c0:c1], xl, wl[c0:c1].t()).to(ft).sub_(lse[:, None]).exp_()
                hit = (lab >= c0) & (lab < c1)
                g[rows[hit], lab[hit] - c0] -= 1.0
                g.mul_(coef)
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
        return dx.to(x.dtype), dw.to(weight.dtype), db.to(bias.dtype), None, None


# ----------------------------------------------------------------------------------------------------------------
# Modules


class RelativeAttention(nn.Module):
    """Relative multi-head attention shared by both streams; weights in the original [d, H, D] layout."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, h, dh = cfg.d_model, cfg.n_head, cfg.d_head
        self.n_head, self.d_head = h, dh
        for name in ("q", "k", "v", "o", "r"):
            setattr(self, name, nn.Parameter(torch.empty(d, h, dh)))
        if cfg.untie_r:  # per-layer biases (released models); otherwise the model passes shared ones
            self.r_w_bias = nn.Parameter(torch.empty(h, dh))
            self.r_r_bias = nn.Parameter(torch.empty(h, dh))
            self.r_s_bias = nn.Parameter(torch.empty(h, dh))
        self.seg_embed = nn.Parameter(torch.empty(2, h, dh))
        self.layer_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.dropout = cfg.dropout
        self.dropatt = cfg.dropatt

    def forward(self, x, mem, kr, rel_index, seg_same, mask_bias, biases, impl: str, h=None):
        """x [B,N,d] stacked query-row inputs (content rows first: the first L rows are h, unless h [B,L,d] is given:
        then x holds only query-stream rows and h is the content stream for keys and values);
        mem [B,M,d] or None; kr [G,H,R,D] projected positions (G = 1 or 2 halves);
        rel_index [1|B,1,N,K] column of kr for each (row, key); seg_same [B,N,K] bool (same segment) or None;
        mask_bias [B,1,N,K] additive mask; biases (r_w, r_r, r_s) [H,D]."""
        B, N, d = x.shape
        L = rel_index.shape[-1] - (0 if mem is None else mem.shape[1])
        H, D = self.n_head, self.d_head
        r_w, r_r, r_s = biases
        h = x[:, :L] if h is None else h
        cat = h if mem is None else torch.cat([mem, h], dim=1)
        K = cat.shape[1]
        q = (x @ self.q.view(d, H * D)).view(B, N, H, D).transpose(1, 2)  # [B,H,N,D]
        kv = cat @ torch.cat([self.k.view(d, H * D), self.v.view(d, H * D)], dim=1)
        k, v = kv.view(B, K, 2, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # [B,H,K,D] each
        if impl == "fused":  # mask_bias is the bool mask [B,1,N,K] (or None) here
            keep, ks = None, 1.0
            if self.training and self.dropatt > 0:
                keep, ks = keep_mask((B, H, N, K), self.dropatt, x.device)
            seg = None if seg_same is None else seg_same[:, None]
            vec = _RelAttnCore.apply(q, k, v, kr, r_w, r_r, r_s, self.seg_embed if seg is not None else None,
                                     rel_index, seg, mask_bias, keep, ks)
            return vec.transpose(1, 2).reshape(B, N, H * D) @ self.o.view(d, H * D).t()
        scale = 1.0 / math.sqrt(D)

        # position term: (q + r_r_bias) . kr[c], c = L - pos(row) + j  (the rel-shift), batch-shared kr
        G = kr.shape[0]
        qr = (q + r_r[:, None]).view(G, B // G, H, N, D)
        bd = torch.matmul(qr, kr.transpose(-1, -2)[:, None]).view(B, H, N, -1)  # [B,H,N,R]
        bd = torch.gather(bd, 3, rel_index.expand(B, H, N, K))
        bias = bd
        # segment term: (q + r_s_bias) . seg_embed[s], s = 0 if same segment else 1
        if seg_same is not None:
            ef = torch.matmul(q + r_s[:, None], self.seg_embed.permute(1, 2, 0))  # [B,H,N,2]
            ef0, ef1 = ef.unbind(-1)
            diff = torch.where(seg_same[:, None], 0.0, (ef1 - ef0)[..., None])
            bias = bias + ef0[..., None] + diff
        bias = bias * scale + mask_bias
        vec = ATTENTION[impl](q + r_w[:, None], k, v, bias, self.dropatt, self.training)  # [B,H,N,D]
        vec = vec.transpose(1, 2).reshape(B, N, H * D)
        out = vec @ self.o.view(d, H * D).t()
        return out


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer_1 = nn.Linear(cfg.d_model, cfg.d_inner)
        self.layer_2 = nn.Linear(cfg.d_inner, cfg.d_model)
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.act = _activation(cfg.ff_activation)
        self.act_name = cfg.ff_activation
        self.dropout = cfg.dropout

    def forward(self, x, fused: bool = False):
        if fused:
            keep, ks = None, 1.0
            if self.training and self.dropout > 0:
                keep, ks = keep_mask((*x.shape[:-1], self.layer_1.out_features), self.dropout, x.device)
                keep = keep.view(-1, keep.shape[-1])
            y = _FeedForwardCore.apply(x.reshape(-1, x.shape[-1]), self.layer_1.weight, self.layer_1.bias,
                                       self.layer_2.weight, self.layer_2.bias, self.act_name, keep, ks)
            return self.layer_norm(x + fused_dropout(y.view(x.shape), self.dropout, self.training))
        y = F.dropout(self.act(self.layer_1(x)), self.dropout, self.training)
        y = F.dropout(self.layer_2(y), self.dropout, self.training)
        return self.layer_norm(x + y)


class XLNetLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.rel_attn = RelativeAttention(cfg)
        self.ff = FeedForward(cfg)
        self.dropout = cfg.dropout

    def forward(self, x, mem, kr, rel_index, seg_same, mask_bias, biases, impl, valid_rows, h=None):
        a = self.rel_attn(x, mem, kr, rel_index, seg_same, mask_bias, biases, impl, h)
        if valid_rows is not None:  # padding target rows: zero attention output (as HF's one-hot mapping)
            a = a * valid_rows
        fused = impl == "fused"
        drop = fused_dropout if fused else F.dropout
        x = self.rel_attn.layer_norm(x + drop(a, self.dropout, self.training))
        return self.ff(x, fused)


class XLNetModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.word_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.mask_emb = nn.Parameter(torch.empty(cfg.d_model))
        if not cfg.untie_r:
            self.r_w_bias = nn.Parameter(torch.empty(cfg.n_head, cfg.d_head))
            self.r_r_bias = nn.Parameter(torch.empty(cfg.n_head, cfg.d_head))
            self.r_s_bias = nn.Parameter(torch.empty(cfg.n_head, cfg.d_head))
        self.layer = nn.ModuleList(XLNetLayer(cfg) for _ in range(cfg.n_layer))
        inv_freq = 1.0 / torch.pow(10000.0, torch.arange(0, cfg.d_model, 2.0) / cfg.d_model)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.initializer_range
        for name, p in self.named_parameters():
            if "layer_norm" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith(".bias") and "layer_" in name:
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, std)

    # -- helpers -----------------------------------------------------------------------------------------------

    def _biases(self, layer: XLNetLayer):
        src = layer.rel_attn if self.config.untie_r else self
        return src.r_w_bias, src.r_r_bias, src.r_s_bias

    def positional_encoding(self, L: int, K: int, bi: bool, dtype, device):
        """[G,R,d] sinusoids for pos_seq = K, K-1, ..., -L+1 (G=2 with bi_data: the second half negated)."""
        pos = torch.arange(K, -L, -1.0, device=device)
        seqs = [pos, -pos] if bi else [pos]
        clamp = self.config.clamp_len
        out = []
        for s in seqs:
            if clamp > 0:
                s = s.clamp(-clamp, clamp)
            x = s[:, None] * self.inv_freq.to(device)
            out.append(torch.cat([torch.sin(x), torch.cos(x)], dim=-1))
        return torch.stack(out).to(dtype)

    # -- forward -----------------------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        perm_mask: torch.Tensor | None = None,
        target_index: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
        return_mems: bool = True,
        bi_data: bool | None = None,
        content_output: bool = True,
    ) -> XLNetOutput:
        """``content_output=False`` (with targets): the last layer computes only the P query-stream rows, since a
        PLM loss needs nothing else; ``hidden`` is then None (query, mems and all gradients are unchanged)."""
        cfg = self.config
        B, L = input_ids.shape
        device = input_ids.device
        bi = cfg.bi_data if bi_data is None else bi_data
        if bi and B % 2:
            raise XLNetError(f"bi_data needs an even per-device batch (forward half + backward half), got {B}")
        M = self._check_mems(mems, B)
        K = M + L
        mem_list = mems if M else [None] * cfg.n_layer

        # target rows: indices [B,P] and (for a one-hot mapping with zero rows) which rows are real
        valid = None
        if target_mapping is not None and target_index is None:
            if target_mapping.shape[0] != B or target_mapping.shape[-1] != L:
                raise XLNetError(f"target_mapping must be [B={B}, P, L={L}], got {list(target_mapping.shape)}")
            target_index = target_mapping.argmax(-1)
            row_sum = target_mapping.sum(-1)
            if not bool((row_sum > 0).all()):
                valid = (row_sum > 0).to(self.mask_emb.dtype)
        if target_index is not None and (target_index.shape[0] != B or target_index.dim() != 2):
            raise XLNetError(f"target_index must be [B={B}, P], got {list(target_index.shape)}")
        P = 0 if target_index is None else target_index.shape[1]
        rows = torch.arange(L, device=device).expand(B, L)
        if P:
            rows = torch.cat([rows, target_index.to(device)], dim=1)  # position of every stacked row [B,N]
        N = L + P
        impl = AUTO_IMPL if cfg.attn_impl == "auto" else cfg.attn_impl
        drop = fused_dropout if impl == "fused" else F.dropout

        # masks (1 = cannot attend): padding columns + perm_mask; content rows may always see themselves
        mask = None
        if attention_mask is not None or perm_mask is not None:
            mask = torch.zeros(B, N, L, dtype=torch.bool, device=device)
            if attention_mask is not None:
                mask |= (attention_mask == 0)[:, None, :]
            if perm_mask is not None:
                pm = perm_mask > 0
                mask |= torch.gather(pm, 1, rows[:, :, None].expand(B, N, L)) if P else pm
            eye = torch.eye(L, dtype=torch.bool, device=device)
            mask[:, :L] &= ~eye
            if M:
                mask = torch.cat([mask.new_zeros(B, N, M), mask], dim=2)
            dtype = self.mask_emb.dtype
            if impl == "fused":
                mask_bias = mask[:, None]  # the fused core takes the bool mask
            else:
                mask_bias = torch.zeros(B, 1, N, K, dtype=dtype, device=device).masked_fill_(mask[:, None], NEG_INF)
        else:
            mask_bias = None if impl == "fused" else torch.zeros((), dtype=self.mask_emb.dtype, device=device)

        # segment equality [B,N,K]; memory counts as segment 0
        seg_same = None
        if token_type_ids is not None:
            seg_k = token_type_ids if not M else torch.cat([token_type_ids.new_zeros(B, M), token_type_ids], 1)
            seg_q = torch.gather(token_type_ids, 1, rows)
            seg_same = seg_q[:, :, None] == seg_k[:, None, :]

        # relative positions: column of the [R] table for (row at position t, key j) is L - t + j
        rel_index = (L - rows)[:, None, :, None] + torch.arange(K, device=device)  # [B,1,N,K]

        word = self.word_embedding(input_ids)
        h = drop(word, cfg.dropout, self.training)
        x = h
        if P:
            g = drop(self.mask_emb.expand(B, P, -1), cfg.dropout, self.training)
            x = torch.cat([h, g], dim=1)
        pos_emb = self.positional_encoding(L, K, bi, word.dtype, device)
        pos_emb = drop(pos_emb, cfg.dropout, self.training)
        valid_rows = None
        if valid is not None:
            valid_rows = torch.cat([valid.new_ones(B, L), valid], 1)[:, :, None]

        new_mems = [] if return_mems else None
        d = cfg.d_model
        skip_last = P > 0 and not content_output
        for i, layer in enumerate(self.layer):
            if return_mems:
                new_mems.append(self._cache_mem(x[:, :L], mem_list[i]))
            a = layer.rel_attn
            kr = (pos_emb @ a.r.view(d, -1)).view(pos_emb.shape[0], -1, a.n_head, a.d_head).transpose(1, 2)
            if skip_last and i == cfg.n_layer - 1:  # query rows only; the content rows serve as keys/values
                sl = lambda t: t if t is None or t.dim() == 0 else t[:, :, L:] if t.dim() == 4 else t[:, L:]  # noqa
                x = layer(x[:, L:], mem_list[i], kr, sl(rel_index), sl(seg_same), sl(mask_bias),
                          self._biases(layer), impl, sl(valid_rows), h=x[:, :L])
            else:
                x = layer(x, mem_list[i], kr, rel_index, seg_same, mask_bias, self._biases(layer), impl, valid_rows)
        x = drop(x, cfg.dropout, self.training)
        if skip_last:
            return XLNetOutput(hidden=None, query=x, mems=new_mems)
        return XLNetOutput(hidden=x[:, :L], query=x[:, L:] if P else None, mems=new_mems)

    def _cache_mem(self, cur: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
        cfg = self.config
        if cfg.reuse_len > 0:
            cur = cur[:, : cfg.reuse_len]
        new = cur if prev is None else torch.cat([prev, cur], dim=1)
        if cfg.mem_len > 0:
            new = new[:, -cfg.mem_len :]
        return new.detach()

    def _check_mems(self, mems, B: int) -> int:
        if mems is None or len(mems) == 0 or mems[0] is None:
            return 0
        cfg = self.config
        if len(mems) != cfg.n_layer:
            raise XLNetError(f"mems must hold one tensor per layer ({cfg.n_layer}), got {len(mems)}")
        M = mems[0].shape[1] if mems[0].dim() == 3 else -1
        for i, m in enumerate(mems):
            if m.dim() != 3 or m.shape[0] != B or m.shape[1] != M or m.shape[2] != cfg.d_model:
                raise XLNetError(
                    f"mems[{i}] must be [batch={B}, mem_len, d_model={cfg.d_model}] (batch-first, same length "
                    f"every layer), got {list(m.shape)}"
                )
        return M


class XLNetLMHeadModel(nn.Module):
    """XLNet with the tied LM head: logits = query_stream @ word_embedding^T + lm_bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.transformer = XLNetModel(cfg)
        self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, perm_mask=None, target_index=None,
                target_mapping=None, mems=None, return_mems=True, labels=None, label_mask=None,
                bi_data=None, need_hidden: bool = True) -> LMOutput:
        """``need_hidden=False``: skip the content stream of the last layer (the PLM loss only needs the query
        stream); ``hidden`` is then None, everything else is unchanged. Pretraining should pass it."""
        out = self.transformer(input_ids, token_type_ids, attention_mask, perm_mask, target_index, target_mapping,
                               mems, return_mems, bi_data, content_output=need_hidden)
        x = out.query if out.query is not None else out.hidden
        loss = None
        if labels is not None and self.transformer.config.attn_impl not in ("einsum", "sdpa"):
            # fused head + loss: the same mean (or label_mask-weighted mean) cross entropy, less memory
            flat = x.reshape(-1, x.shape[-1])
            if label_mask is None:
                w = torch.full((flat.shape[0],), 1.0 / max(flat.shape[0], 1), device=flat.device)
            else:
                w = label_mask.reshape(-1).float()
                w = w / w.sum().clamp_min(1.0)
            loss, logits = _LMHeadLoss.apply(flat, self.transformer.word_embedding.weight, self.lm_bias,
                                             labels.reshape(-1).to(flat.device), w)
            logits = logits.view(*x.shape[:-1], -1)
        else:
            logits = F.linear(x, self.transformer.word_embedding.weight, self.lm_bias)
        if labels is not None and loss is None:
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none")
            if label_mask is None:
                loss = ce.mean()
            else:
                w = label_mask.reshape(-1).to(ce.dtype)
                loss = (ce * w).sum() / w.sum().clamp_min(1.0)
        return LMOutput(logits=logits, loss=loss, mems=out.mems, hidden=out.hidden, query=out.query)


class SequenceSummary(nn.Module):
    """Pool [B,L,d] to [B,d]: last (the <cls> at the end), first, mean (over real tokens), attn (a learned query
    attending over real tokens); optional dense + tanh projection; then dropout."""

    def __init__(self, d_model: int, summary_type: str = "last", use_proj: bool = True, dropout: float = 0.1):
        super().__init__()
        if summary_type not in ("last", "first", "mean", "attn"):
            raise XLNetError(f"unknown summary_type {summary_type!r} (last, first, mean, attn)")
        self.summary_type = summary_type
        self.proj = nn.Linear(d_model, d_model) if use_proj else None
        self.query = nn.Parameter(torch.zeros(d_model)) if summary_type == "attn" else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        t = self.summary_type
        if t == "last":
            s = hidden[:, -1]
        elif t == "first":
            s = hidden[:, 0]
        else:
            m = torch.ones(hidden.shape[:2], device=hidden.device) if attention_mask is None else attention_mask
            m = m.to(hidden.dtype)
            if t == "mean":
                s = (hidden * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1.0)
            else:
                score = (hidden @ self.query) / math.sqrt(hidden.shape[-1])
                score = score.masked_fill(m == 0, NEG_INF)
                s = (torch.softmax(score, dim=-1)[..., None] * hidden).sum(1)
        if self.proj is not None:
            s = torch.tanh(self.proj(s))
        return self.dropout(s)


def build_model(cfg: ModelConfig | str, **overrides) -> XLNetLMHeadModel:
    """An LM model from a ModelConfig or a size name (tiny, base, large)."""
    if isinstance(cfg, str):
        cfg = named_config(cfg, **overrides)
    elif overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    return XLNetLMHeadModel(cfg)


def maybe_compile(model: nn.Module, enabled: bool = True, **kwargs) -> nn.Module:
    """``torch.compile`` the model when asked (shapes vary with memory length: dynamic=None lets torch decide)."""
    return torch.compile(model, **kwargs) if enabled else model


def num_params(model: nn.Module, embedding: bool = True) -> int:
    n = sum(p.numel() for p in model.parameters())
    if not embedding:
        n -= sum(p.numel() for name, p in model.named_parameters() if "word_embedding" in name)
    return n
