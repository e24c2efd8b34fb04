"""XLNet in one file: two-stream relative attention with Transformer-XL memory (batch-first everywhere).

Notation: B batch, L sequence length, M memory length, K = M + L keys, P predicted (query-stream) rows,
H heads, D head size, R = K + L relative positions (Yang et al. 2019, §2.3 and appendix A; Dai et al. 2019, §3.3).

How this differs from the transformers implementation (same numbers, less work):
- the query stream g is computed only for the P target rows (``target_index`` [B,P]); a one-hot ``target_mapping``
  [B,P,L] is accepted too and turned into indices (all-zero rows are padding: their attention output is zero, as HF);
- both streams share one attention call: the L content rows and the P query rows are stacked into L+P query rows
  that attend to the same keys, each row with its own relative offset and mask row (``kernels.AttnLayout``);
- the positional projection W_r·pos_emb is done once per batch (twice with bi_data) in each layer, not per example;
- how the attention core runs (the plain reference, a fused CPU path, SDPA or FlexAttention on CUDA) is chosen by
  ``attn_impl`` and lives in kernels.py; activation checkpointing, FSDP2 and torch.compile live in parallel.py.
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
from .kernels import (NEG_INF, AttnLayout, _FeedForwardCore, _LMHeadLoss, activation, fused_dropout, keep_mask,
                      relative_attention, resolve_impl)

XLNetConfig = ModelConfig

# Named sizes (docs/xlnet.md §8). Everything not listed keeps ModelConfig's default.
SIZES: dict[str, dict] = {
    "tiny": dict(vocab_size=8000, d_model=128, n_layer=4, n_head=4, d_head=32, d_inner=512, mem_len=96, reuse_len=64),
    "base": dict(vocab_size=32000, d_model=768, n_layer=12, n_head=12, d_head=64, d_inner=3072),
    "large": dict(vocab_size=32000, d_model=1024, n_layer=24, n_head=16, d_head=64, d_inner=4096),
}


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

    def forward(self, x, mem, pos_emb, layout: AttnLayout, biases, impl: str, h=None):
        """x [B,N,d] stacked query-row inputs: the content stream h (first L rows) and the query stream g (P rows);
        with ``h`` [B,L,d] given, x holds only the query-stream rows and h is the content stream for keys and values.
        mem [B,M,d] or None; pos_emb [G,R,d] sinusoids of the relative positions (G = 1, or 2 with bi_data);
        biases (r_w, r_r, r_s) [H,D] shared by all layers, or None: this layer's own (untie_r). Returns the attention
        output [B,N,d] (before the residual)."""
        B, N, d = x.shape
        if biases is None:
            biases = self.r_w_bias, self.r_r_bias, self.r_s_bias
        H, D = self.n_head, self.d_head
        h = x[:, : layout.L] if h is None else h
        cat = h if mem is None else torch.cat([mem, h], dim=1)  # keys and values: memory, then the content stream
        K = cat.shape[1]
        q = (x @ self.q.view(d, H * D)).view(B, N, H, D).transpose(1, 2)  # [B,H,N,D]
        kv = cat @ torch.cat([self.k.view(d, H * D), self.v.view(d, H * D)], dim=1)
        k, v = kv.view(B, K, 2, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # [B,H,K,D] each
        kr = (pos_emb @ self.r.view(d, H * D)).view(pos_emb.shape[0], -1, H, D).transpose(1, 2)  # [G,H,R,D]
        vec = relative_attention(q, k, v, kr, biases, self.seg_embed, layout, self.dropatt, self.training, impl)
        return vec.transpose(1, 2).reshape(B, N, H * D) @ self.o.view(d, H * D).t()


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer_1 = nn.Linear(cfg.d_model, cfg.d_inner)
        self.layer_2 = nn.Linear(cfg.d_inner, cfg.d_model)
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.act = activation(cfg.ff_activation)
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

    def forward(self, x, mem, pos_emb, layout: AttnLayout, biases, impl: str, valid_rows=None, h=None):
        a = self.rel_attn(x, mem, pos_emb, layout, biases, impl, h)
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

    def _biases(self, i: int):
        """(r_w, r_r, r_s) for layer i: its own (untie_r) or the ones shared by all layers."""
        if self.config.untie_r:
            return None  # the layer reads its own
        return self.r_w_bias, self.r_r_bias, self.r_s_bias

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
        impl = resolve_impl(cfg.attn_impl, device)
        drop = fused_dropout if impl == "fused" else F.dropout

        # masks (True = cannot attend): padding columns + perm_mask; content rows may always see themselves
        mask = mask_bias = None
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
            mask = mask[:, None]  # [B,1,N,K]
            if impl in ("einsum", "sdpa"):  # these kernels add the mask to the scores
                mask_bias = torch.zeros(mask.shape, dtype=self.mask_emb.dtype, device=device).masked_fill_(mask,
                                                                                                           NEG_INF)

        # relative segment encoding: does row i share key j's segment? (memory counts as segment 0)
        seg_same = None
        if token_type_ids is not None:
            seg_k = token_type_ids if not M else torch.cat([token_type_ids.new_zeros(B, M), token_type_ids], 1)
            seg_q = torch.gather(token_type_ids, 1, rows)
            seg_same = (seg_q[:, :, None] == seg_k[:, None, :])[:, None]  # [B,1,N,K]

        # relative positions: column of the [R] table for (row at position t, key j) is L - t + j
        rel_index = (L - rows)[:, None, :, None] + torch.arange(K, device=device)  # [B,1,N,K]
        layout = AttnLayout(L, rows, rel_index, seg_same, mask, mask_bias)

        # the two streams: content h starts from the word embeddings, query g from the learned mask embedding
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
        skip_last = P > 0 and not content_output
        for i, layer in enumerate(self.layer):
            if return_mems:
                new_mems.append(self._cache_mem(x[:, :L], mem_list[i]))
            biases = self._biases(i)
            if skip_last and i == cfg.n_layer - 1:  # query rows only; the content rows serve as keys/values
                x = layer(x[:, L:], mem_list[i], pos_emb, layout.query_rows(), biases, impl,
                          None if valid_rows is None else valid_rows[:, L:], h=x[:, :L])
            else:
                x = layer(x, mem_list[i], pos_emb, layout, biases, impl, valid_rows)
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
    """XLNet with the tied LM head: logits = query_stream @ word_embedding^T + lm_bias.

    With ``objective: mlm`` (the "DAE + Transformer-XL" ablation) the targets are read from the content stream at
    the target positions (their inputs are <mask>, data.py) and no query stream is computed."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.transformer = XLNetModel(cfg)
        self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        if cfg.objective == "mlm":  # no query stream: its start vector is unused (DDP needs every trained one used)
            self.transformer.mask_emb.requires_grad_(False)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, perm_mask=None, target_index=None,
                target_mapping=None, mems=None, return_mems=True, labels=None, label_mask=None,
                bi_data=None, need_hidden: bool = True) -> LMOutput:
        """``need_hidden=False``: skip the content stream of the last layer (the PLM loss only needs the query
        stream); ``hidden`` is then None, everything else is unchanged. Pretraining should pass it (``mlm`` ignores
        it: its targets are read from the content stream)."""
        if self.config.objective == "mlm" and (target_index is not None or target_mapping is not None):
            out = self.transformer(input_ids, token_type_ids, attention_mask, perm_mask, None, None, mems,
                                   return_mems, bi_data)
            x = _content_rows(out.hidden, target_index, target_mapping)
        else:
            out = self.transformer(input_ids, token_type_ids, attention_mask, perm_mask, target_index,
                                   target_mapping, mems, return_mems, bi_data, content_output=need_hidden)
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


def _content_rows(hidden: torch.Tensor, target_index: torch.Tensor | None,
                  target_mapping: torch.Tensor | None) -> torch.Tensor:
    """[B,P,d] content-stream rows at the targets: gathered by index, or mapped (zero rows give zero vectors)."""
    if target_index is not None:
        if target_index.dim() != 2 or target_index.shape[0] != hidden.shape[0]:
            raise XLNetError(f"target_index must be [B={hidden.shape[0]}, P], got {list(target_index.shape)}")
        idx = target_index.to(hidden.device)[:, :, None].expand(-1, -1, hidden.shape[-1])
        return torch.gather(hidden, 1, idx)
    B, L = hidden.shape[:2]
    if target_mapping.shape[0] != B or target_mapping.shape[-1] != L:
        raise XLNetError(f"target_mapping must be [B={B}, P, L={L}], got {list(target_mapping.shape)}")
    return torch.matmul(target_mapping.to(hidden.dtype), hidden)


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
