"""XLNet (Yang et al. 2019) on Transformer-XL (Dai et al. 2019): two-stream relative attention with memory,
batch-first everywhere.

``XLNetModel.forward`` builds its inputs in the order the paper introduces them, each step a short method:
the factorisation-order (perm) mask and the two-stream masks (§2.2-2.3), partial prediction's target rows (§2.3),
relative positional encodings (§2.4; Dai §3.3), relative segment encodings (§2.5) and the memory of the previous
segment (§2.4; Dai §3.2). It then runs the content stream h and the query stream g through the layers.

Notation: B batch, L sequence length, M memory length, K = M + L keys, P predicted (query-stream) rows,
N = L + P stacked query rows, H heads, D head size, R = K + L relative positions.

How this differs from the transformers implementation (same numbers, less work):
- the query stream g is computed only for the P target rows (``target_index`` [B,P]); a one-hot ``target_mapping``
  [B,P,L] is accepted too and turned into indices (all-zero rows are padding: their attention output is zero, as HF);
- both streams share one attention call: the L content rows and the P query rows are stacked into N query rows
  that attend to the same keys, each row with its own relative offset and mask row (``kernels.AttnLayout``);
- the positional projection W_r·pos_emb is done once per batch (twice with bi_data) in each layer, not per example;
- how the attention core, the feed-forward block and the LM head + loss run is chosen by ``attn_impl`` in
  kernels.py; activation checkpointing, FSDP2 and torch.compile live in parallel.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from xlnetcli.config import ModelConfig, load_config
from xlnetcli.core.errors import XLNetError
from xlnetcli.model.kernels import (
    AttnLayout,
    additive_mask,
    dropout_fn,
    feed_forward,
    mask_flags,
    relative_attention,
    resolve_impl,
)
from xlnetcli.model.lm_head import lm_head

# The named sizes: the pretraining presets of the paper's sizes, plus tiny for a CPU (presets/{tiny,base,large}.yaml;
# the demo preset is tiny's recipe, presets/finetune/ holds task presets).
SIZES: tuple[str, ...] = ("tiny", "base", "large")


def named_config(name: str, **overrides) -> ModelConfig:
    """``named_config("base", dropout=0.0)`` -> the ``model:`` section of preset ``name``, with overrides."""
    if name not in SIZES:
        raise XLNetError(f"unknown model size {name!r} (known: {', '.join(SIZES)})")
    return dataclasses.replace(load_config(name).model, **overrides)


@dataclass
class XLNetOutput:
    hidden: torch.Tensor | None  # [B,L,d] content stream (after the final dropout); None with content_output=False
    query: torch.Tensor | None  # [B,P,d] query stream, or None without targets
    mems: list[torch.Tensor] | None  # per layer [B,M',d], detached
    mem_pad: torch.Tensor | None = None  # [B,M'] padding columns of the next memory (given a padded memory)


@dataclass
class LMOutput:
    logits: torch.Tensor  # [B,P,V] (query stream) or [B,L,V] (content stream, no targets)
    loss: torch.Tensor | None
    mems: list[torch.Tensor] | None
    hidden: torch.Tensor | None  # None with need_hidden=False
    query: torch.Tensor | None = None
    mem_pad: torch.Tensor | None = None


# ----------------------------------------------------------------------------------------------------------------
# One layer


class RelativeAttention(nn.Module):
    """Two-stream relative multi-head attention (§2.3, appendix A.2); weights in the original [d, H, D] layout."""

    # projections [d, H, D], registered by name in __init__ (this order: the state-dict order)
    q: nn.Parameter
    k: nn.Parameter
    v: nn.Parameter
    o: nn.Parameter
    r: nn.Parameter

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
    """LayerNorm(x + drop(W2·drop(act(W1·x + b1)) + b2)), the position-wise block (Vaswani et al. 2017)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer_1 = nn.Linear(cfg.d_model, cfg.d_inner)
        self.layer_2 = nn.Linear(cfg.d_inner, cfg.d_model)
        self.layer_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.act_name = cfg.ff_activation
        self.dropout = cfg.dropout

    def forward(self, x, fused: bool = False):
        y = feed_forward(x, self.layer_1, self.layer_2, self.act_name, self.dropout, self.training, fused)
        return self.layer_norm(x + y)


class XLNetLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.rel_attn = RelativeAttention(cfg)
        self.ff = FeedForward(cfg)
        self.dropout = cfg.dropout

    def forward(self, x, mem, pos_emb, layout: AttnLayout, biases, impl: str, valid_rows=None, h=None):
        """``impl`` is model.attn_impl, resolved again here: a layer compiled on its own (train.compile) gets what
        ``auto`` picks inside torch.compile. The layout and dropout the model built serve all that ``auto`` picks on
        one device (CUDA: triton in both, or without triton sdpa and einsum, which both read the additive mask)."""
        impl = resolve_impl(impl, x.device)
        a = self.rel_attn(x, mem, pos_emb, layout, biases, impl, h)
        if valid_rows is not None:  # padding target rows: zero attention output (as HF's one-hot mapping)
            a = a * valid_rows
        x = self.rel_attn.layer_norm(x + dropout_fn(impl)(a, self.dropout, self.training))
        return self.ff(x, impl == "fused")


# ----------------------------------------------------------------------------------------------------------------
# The model


class XLNetModel(nn.Module):
    inv_freq: torch.Tensor  # buffer (not in the state dict)

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.word_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.mask_emb = nn.Parameter(torch.empty(cfg.d_model))  # the query stream's start vector w (§2.3)
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
        mem_pad: torch.Tensor | None = None,
        mem_len: int | None = None,
        detach_mems: bool = True,
    ) -> XLNetOutput:
        """``perm_mask`` [B,L,L] (1 = row i may not see token j), ``target_index`` [B,P] or ``target_mapping``
        [B,P,L], ``mems`` per layer [B,M,d]. ``content_output=False`` (with targets): the last layer computes only
        the P query-stream rows, since a PLM loss needs nothing else; ``hidden`` is then None (query, mems and all
        gradients are unchanged). ``mem_pad`` [B,M] bool (True = padding) marks memory columns that hold no state:
        masked for every row, so a memory padded on the left to a fixed length (static shapes, train.static_shapes)
        computes what the unpadded one does; ``XLNetOutput.mem_pad`` is then the next memory's padding.
        ``mem_len`` (a reader of consecutive windows, model/documents.py): the next memory is the last ``mem_len``
        states of the memory and this whole segment, in place of the pretraining rule (model.mem_len, reuse_len), and
        ``XLNetOutput.mem_pad`` is its padding (the memory's, then this segment's ``attention_mask == 0``);
        ``detach_mems=False`` keeps the next memory in the graph (gradient through it into this segment).

        It stays whole: its steps are already the methods below, in the paper's order, and what is left is the
        two-stream layer loop, which reads top to bottom beside the tensors (x, mems, layout) it threads through."""
        cfg = self.config
        B, L = input_ids.shape
        bi = cfg.bi_data if bi_data is None else bi_data
        if bi and B % 2:
            raise XLNetError(f"bi_data needs an even per-device batch (forward half + backward half), got {B}")
        M = self._memory_length(mems, B)
        target_index, valid_rows = self._target_rows(target_index, target_mapping, B, L)
        P = 0 if target_index is None else target_index.shape[1]
        rows = self._stacked_rows(target_index, B, L, input_ids.device)
        impl = resolve_impl(cfg.attn_impl, input_ids.device)
        mask = self._two_stream_mask(attention_mask, perm_mask, rows, L, M, mem_pad)
        layout = AttnLayout(
            L,
            rows,
            self._relative_positions(rows, L, M + L),
            self._relative_segments(token_type_ids, rows, M),
            mask,
            additive_mask(mask, impl, self.mask_emb.dtype),
        )
        if impl == "triton":  # the mask and segment bits as one byte per score, made once for every layer
            layout.flags = mask_flags(layout.mask, layout.seg_same)
        drop = dropout_fn(impl)
        h, g = self._two_streams(input_ids, P, drop)
        x = h if g is None else torch.cat([h, g], dim=1)
        pos_emb = drop(self.positional_encoding(L, M + L, bi, h.dtype, h.device), cfg.dropout, self.training)
        biases = None if cfg.untie_r else (self.r_w_bias, self.r_r_bias, self.r_s_bias)

        new_mems: list[torch.Tensor] | None = [] if return_mems else None
        query_only = P > 0 and not content_output
        for i, layer in enumerate(self.layer):
            mem = mems[i] if M and mems is not None else None
            if new_mems is not None:  # return_mems
                new_mems.append(self._cache_mem(x[:, :L], mem, mem_len, detach_mems))
            if query_only and i == cfg.n_layer - 1:  # query rows only; the content rows serve as keys/values
                x = layer(
                    x[:, L:],
                    mem,
                    pos_emb,
                    layout.query_rows(),
                    biases,
                    cfg.attn_impl,
                    None if valid_rows is None else valid_rows[:, L:],
                    h=x[:, :L],
                )
            else:
                x = layer(x, mem, pos_emb, layout, biases, cfg.attn_impl, valid_rows)
        x = drop(x, cfg.dropout, self.training)
        pad = None if new_mems is None else self._cache_pad(mem_pad, attention_mask, L, mem_len)
        if query_only:
            return XLNetOutput(hidden=None, query=x, mems=new_mems, mem_pad=pad)
        return XLNetOutput(hidden=x[:, :L], query=x[:, L:] if P else None, mems=new_mems, mem_pad=pad)

    # -- the steps of the forward pass, in the order the paper introduces them -----------------------------------

    @staticmethod
    def _two_stream_mask(attention_mask, perm_mask, rows, L: int, M: int, mem_pad=None):
        """§2.2-2.3 factorisation order and two-stream masks: [B,1,N,K] bool, True = cannot attend (None when
        nothing is masked). Row i sees token j only if j comes before i's position in the factorisation order
        (perm_mask) and is not padding; a content row also sees itself, a query row takes perm_mask's row as is;
        memory columns are visible to all but the padding ones (``mem_pad`` [B,M])."""
        if attention_mask is None and perm_mask is None and mem_pad is None:
            return None
        B, N = rows.shape
        mask = torch.zeros(B, N, L, dtype=torch.bool, device=rows.device)
        if attention_mask is not None:
            mask |= (attention_mask == 0)[:, None, :]
        if perm_mask is not None:
            pm = perm_mask > 0
            mask |= torch.gather(pm, 1, rows[:, :, None].expand(B, N, L)) if N > L else pm
        mask[:, :L] &= ~torch.eye(L, dtype=torch.bool, device=rows.device)
        if M:
            mem = mask.new_zeros(B, N, M) if mem_pad is None else mem_pad[:, None, :].expand(B, N, M)
            mask = torch.cat([mem, mask], dim=2)
        return mask[:, None]

    def _two_streams(self, input_ids, P: int, drop):
        """§2.3 two-stream attention: the content stream h starts from the word embeddings, the query stream g from
        the learned vector w (``mask_emb``). -> (h [B,L,d], g [B,P,d] or None), after dropout."""
        p = self.config.dropout
        h = drop(self.word_embedding(input_ids), p, self.training)
        g = drop(self.mask_emb.expand(input_ids.shape[0], P, -1), p, self.training) if P else None
        return h, g

    @staticmethod
    def _stacked_rows(target_index, B: int, L: int, device) -> torch.Tensor:
        """§2.3, both streams in one attention call: the sequence position of every stacked row [B,N], the L content
        rows (0..L-1) then the P query rows (the target positions)."""
        rows = torch.arange(L, device=device).expand(B, L)
        if target_index is not None and target_index.shape[1]:
            rows = torch.cat([rows, target_index.to(device)], dim=1)
        return rows

    def _target_rows(self, target_index, target_mapping, B: int, L: int):
        """§2.3 partial prediction: only the P target positions get a query stream. -> (target_index [B,P] or None,
        valid_rows [B,N,1] or None): a one-hot mapping's all-zero rows are padding, their attention output zeroed."""
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
        if valid is None:
            return target_index, None
        return target_index, torch.cat([valid.new_ones(B, L), valid], 1)[:, :, None]

    def positional_encoding(self, L: int, K: int, bi: bool, dtype, device):
        """§2.4 / Dai §3.3 relative positional encoding: [G,R,d] sinusoids of the distances K, K-1, ..., -L+1
        (G=2 with bi_data: the backward half of the batch reads the negated distances)."""
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

    @staticmethod
    def _relative_positions(rows, L: int, K: int) -> torch.Tensor:
        """§2.4 / Dai §3.3: [B,1,N,K] the column of positional_encoding's R distances for (row at position t, key
        j), L - t + j."""
        return (L - rows)[:, None, :, None] + torch.arange(K, device=rows.device)

    def _memory_length(self, mems, B: int) -> int:
        """§2.4 / Dai §3.2 segment recurrence: M, the length of the previous segments' cached states (one [B,M,d]
        per layer, checked; 0 without memory)."""
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

    def _cache_mem(
        self, cur: torch.Tensor, prev: torch.Tensor | None, mem_len: int | None = None, detach: bool = True
    ) -> torch.Tensor:
        """§2.4 / Dai §3.2: a layer's next memory, [B,M',d]: the first ``reuse_len`` content-stream states of this
        segment join the memory, which keeps its last ``mem_len``; detached (no gradient into past segments).
        Given ``mem_len``, the whole segment joins and that many states are kept; ``detach=False`` keeps the graph."""
        cfg = self.config
        if mem_len is None and cfg.reuse_len > 0:
            cur = cur[:, : cfg.reuse_len]
        keep = cfg.mem_len if mem_len is None else mem_len
        new = cur if prev is None else torch.cat([prev, cur], dim=1)
        if keep > 0:
            new = new[:, -keep:]
        return new.detach() if detach else new

    def _cache_pad(self, mem_pad, attention_mask, L: int, mem_len: int | None = None) -> torch.Tensor | None:
        """The next memory's padding columns, [B,M'] (None without a padded memory): ``mem_pad`` followed by the
        states this segment adds, cut as ``_cache_mem`` cuts the states (a left-padded memory of mem_len stays
        mem_len, its padding shrinks). Pretraining's segments add real states; a reader's (``mem_len``) add its whole
        window, whose own padding (``attention_mask == 0``) joins, a padded memory or not."""
        cfg = self.config
        if mem_len is None:
            if mem_pad is None:
                return None
            n = cfg.reuse_len if 0 < cfg.reuse_len < L else L
            new = torch.cat([mem_pad, mem_pad.new_zeros(mem_pad.shape[0], n)], dim=1)
            return new[:, -cfg.mem_len :] if cfg.mem_len > 0 else new
        own = attention_mask == 0
        return (own if mem_pad is None else torch.cat([mem_pad, own], dim=1))[:, -mem_len:]

    @staticmethod
    def _relative_segments(token_type_ids, rows, M: int):
        """§2.5 relative segment encoding: [B,1,N,K] whether row i and key j are in the same segment (memory counts
        as segment 0), or None without token_type_ids."""
        if token_type_ids is None:
            return None
        B = token_type_ids.shape[0]
        seg_k = token_type_ids if not M else torch.cat([token_type_ids.new_zeros(B, M), token_type_ids], 1)
        seg_q = torch.gather(token_type_ids, 1, rows)
        return (seg_q[:, :, None] == seg_k[:, None, :])[:, None]


class XLNetLMHeadModel(nn.Module):
    """XLNet with the tied LM head: logits = query_stream @ word_embedding^T + lm_bias.

    With ``objective: mlm`` (the "DAE + Transformer-XL" ablation) the targets are read from the content stream at
    the target positions (their inputs are <mask>, data/records/stream.py) and no query stream is computed."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.transformer = XLNetModel(cfg)
        self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        if cfg.objective == "mlm":  # no query stream: its start vector is unused (DDP needs every trained one used)
            self.transformer.mask_emb.requires_grad_(False)

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        perm_mask=None,
        target_index=None,
        target_mapping=None,
        mems=None,
        return_mems=True,
        labels=None,
        label_mask=None,
        bi_data=None,
        need_hidden: bool = True,
        mem_pad=None,
    ) -> LMOutput:
        """``need_hidden=False``: skip the content stream of the last layer (the PLM loss only needs the query
        stream); ``hidden`` is then None, everything else is unchanged. Pretraining should pass it (``mlm`` ignores
        it: its targets are read from the content stream). ``labels`` [B,P] (-100 = ignored) give ``loss``, the
        mean cross entropy, weighted by ``label_mask`` [B,P] when given. ``mem_pad``: XLNetModel.forward's."""
        if self.config.objective == "mlm" and (target_index is not None or target_mapping is not None):
            out = self.transformer(
                input_ids, token_type_ids, attention_mask, perm_mask, None, None, mems, return_mems, bi_data,
                mem_pad=mem_pad,
            )  # fmt: skip
            x = _content_rows(out.hidden, target_index, target_mapping)
        else:
            out = self.transformer(
                input_ids,
                token_type_ids,
                attention_mask,
                perm_mask,
                target_index,
                target_mapping,
                mems,
                return_mems,
                bi_data,
                content_output=need_hidden,
                mem_pad=mem_pad,
            )
            x = out.query if out.query is not None else out.hidden
        # the head + loss as the attention core runs: plain with the plain kernels, triton with triton, else fused
        head = "plain" if self.config.attn_impl in ("einsum", "sdpa") else "fused"
        if head == "fused" and resolve_impl(self.config.attn_impl, x.device) == "triton":
            head = "triton"
        logits, loss = lm_head(x, self.transformer.word_embedding.weight, self.lm_bias, labels, label_mask, head)
        return LMOutput(
            logits=logits, loss=loss, mems=out.mems, hidden=out.hidden, query=out.query, mem_pad=out.mem_pad
        )


def _content_rows(
    hidden: torch.Tensor, target_index: torch.Tensor | None, target_mapping: torch.Tensor | None
) -> torch.Tensor:
    """[B,P,d] content-stream rows at the targets: gathered by index, or mapped (zero rows give zero vectors)."""
    if target_index is not None:
        if target_index.dim() != 2 or target_index.shape[0] != hidden.shape[0]:
            raise XLNetError(f"target_index must be [B={hidden.shape[0]}, P], got {list(target_index.shape)}")
        idx = target_index.to(hidden.device)[:, :, None].expand(-1, -1, hidden.shape[-1])
        return torch.gather(hidden, 1, idx)
    assert target_mapping is not None  # the caller passes target_index or target_mapping
    B, L = hidden.shape[:2]
    if target_mapping.shape[0] != B or target_mapping.shape[-1] != L:
        raise XLNetError(f"target_mapping must be [B={B}, P, L={L}], got {list(target_mapping.shape)}")
    return torch.matmul(target_mapping.to(hidden.dtype), hidden)


def build_model(cfg: ModelConfig | str, **overrides) -> XLNetLMHeadModel:
    """An LM model from a ModelConfig or a size name (tiny, base, large: the presets' ``model:`` sections)."""
    if isinstance(cfg, str):
        cfg = named_config(cfg, **overrides)
    elif overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    return XLNetLMHeadModel(cfg)


def num_params(model: nn.Module, embedding: bool = True) -> int:
    """Parameters of ``model``; ``embedding=False`` leaves out the word embedding."""
    n = sum(p.numel() for p in model.parameters())
    if not embedding:
        n -= sum(p.numel() for name, p in model.named_parameters() if "word_embedding" in name)
    return n
