"""Exact parity of model/xlnet.py with transformers.XLNetLMHeadModel (copied weights, float32, eval mode) and with a
plain reference written from the formulas (docs/xlnet.md §6) for what HF lacks (untie_r=false).

Tolerance: max abs difference <= 1e-5 on logits, returned memories and every parameter gradient."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from modeltools import TOL, L, R, V, maxdiff, plm_batch, tiny_cfg

from xlnetcli.core.errors import XLNetError
from xlnetcli.model import XLNetLMHeadModel, named_config
from xlnetcli.model.heads import SequenceSummary
from xlnetcli.model.state_dict_adapter import mems_from_hf, mems_to_hf, to_hf_config, to_hf_state

transformers = pytest.importorskip("transformers")

IMPLS = ["einsum", "sdpa", "fused"]


def pair(cfg, seed=0):
    torch.manual_seed(seed)
    ours = XLNetLMHeadModel(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorm / bias values so their gradients are checked meaningfully
        for name, p in ours.named_parameters():
            if "layer_norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    hc = to_hf_config(cfg, pretraining_layout=True)
    hc.pop("architectures"), hc.pop("model_type")
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**hc)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state(ours.state_dict(), cfg), strict=False)
    assert missing == ["lm_loss.weight"] and not unexpected  # tied to the embedding
    return ours, hf


# ---- comparison helpers ------------------------------------------------------------------------------------


def grads_ours(model, cfg):
    g = {k: (p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in model.named_parameters()}
    return to_hf_state(g, cfg)


def grads_hf(model):
    return {k: (p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in model.named_parameters()}


def run_both(ours, hf, cfg, ids, tt=None, am=None, perm=None, tmap=None, mems=None, use_index=False, check_grad=True):
    """Forward (+ backward of a fixed random projection of the logits) in both; assert parity; return new mems."""
    ours.zero_grad(set_to_none=True)
    hf.zero_grad(set_to_none=True)
    kw = dict(token_type_ids=tt, attention_mask=am, perm_mask=perm)
    if use_index:
        assert bool((tmap.sum(-1) > 0).all())
        o = ours(ids, **kw, target_index=tmap.argmax(-1), mems=mems)
    else:
        o = ours(ids, **kw, target_mapping=tmap, mems=mems)
    h = hf(ids, **kw, target_mapping=tmap, mems=mems_to_hf(mems), use_mems=True)
    assert o.logits.shape == h.logits.shape
    assert maxdiff(o.logits, h.logits) <= TOL
    hm = mems_from_hf(h.mems)
    assert len(o.mems) == len(hm)
    for a, b in zip(o.mems, hm, strict=True):
        assert a.shape == b.shape and maxdiff(a, b) <= TOL
        assert not a.requires_grad
    if check_grad:
        # a training-scale loss (mean cross entropy on random labels): the 1e-5 bound is absolute
        y = torch.randint(0, V, o.logits.shape[:-1], generator=torch.Generator().manual_seed(1)).reshape(-1)
        F.cross_entropy(o.logits.reshape(-1, V), y).backward()
        F.cross_entropy(h.logits.reshape(-1, V), y).backward()
        go, gh = grads_ours(ours, cfg), grads_hf(hf)
        for k, v in gh.items():
            if k == "lm_loss.weight":
                continue
            assert maxdiff(go[k], v) <= TOL, k
    return o.mems


# ---- parity with transformers ------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_no_target_mapping_segments(impl):
    """Content stream only (finetuning-style): segments A, B and <cls>, no perm_mask."""
    cfg = tiny_cfg(attn_impl=impl)
    ours, hf = pair(cfg)
    ids, tt, _, _ = plm_batch(2, 3, np.random.default_rng(0))
    run_both(ours, hf, cfg, ids, tt=tt)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("use_index", [False, True])
def test_plm_with_memory_and_reuse(impl, use_index):
    """Real factorisation-order perm_mask, target_mapping (with a zero padding row) or target_index, two consecutive
    segments so the second uses a non-empty memory; memories cached from the first reuse_len tokens."""
    cfg = tiny_cfg(attn_impl=impl)
    ours, hf = pair(cfg)
    rng = np.random.default_rng(1)
    pad = not use_index  # target_index has no padding rows: every row is a real target
    ids, tt, perm, tmap = plm_batch(2, 3, rng, pad=pad)
    mems = run_both(ours, hf, cfg, ids, tt=tt, perm=perm, tmap=tmap, use_index=use_index, check_grad=False)
    assert mems[0].shape == (2, R, cfg.d_model)
    ids2, tt2, perm2, tmap2 = plm_batch(2, 3, rng, pad=pad)
    mems2 = run_both(ours, hf, cfg, ids2, tt=tt2, perm=perm2, tmap=tmap2, mems=mems, use_index=use_index)
    assert mems2[0].shape == (2, cfg.mem_len, cfg.d_model)  # 8 + 8 -> last 12


@pytest.mark.parametrize("impl", IMPLS)
def test_bi_data_clamp_len_memory(impl):
    """bi_data (first half forward, second half backward with negated positions), clamp_len, with memory."""
    cfg = tiny_cfg(attn_impl=impl, bi_data=True, clamp_len=5)
    ours, hf = pair(cfg)
    rng = np.random.default_rng(2)
    ids, tt, perm, tmap = plm_batch(4, 3, rng)
    mems = run_both(ours, hf, cfg, ids, tt=tt, perm=perm, tmap=tmap, check_grad=False)
    ids, tt, perm, tmap = plm_batch(4, 3, rng)
    run_both(ours, hf, cfg, ids, tt=tt, perm=perm, tmap=tmap, mems=mems)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("with_targets", [False, True])
def test_left_padding_attention_mask(impl, with_targets):
    """Left-padded finetuning batch with an attention mask (1 = real token), with and without query stream."""
    cfg = tiny_cfg(attn_impl=impl, reuse_len=0, mem_len=0)
    ours, hf = pair(cfg)
    ids, tt, perm, tmap = plm_batch(3, 2, np.random.default_rng(3))
    am = torch.ones(3, L)
    am[1, :5] = 0
    am[2, :11] = 0
    ids = ids.masked_fill(am == 0, 5)
    tt = tt.masked_fill(am == 0, 0)
    run_both(ours, hf, cfg, ids, tt=tt, am=am, perm=perm if with_targets else None, tmap=tmap if with_targets else None)


def test_sdpa_matches_einsum_training_graph():
    """The two attention paths agree on loss and gradients (no HF involved), dropout off."""
    cfg = tiny_cfg(bi_data=True, clamp_len=6)
    ids, tt, perm, tmap = plm_batch(4, 3, np.random.default_rng(4))
    out = {}
    for impl in IMPLS:
        torch.manual_seed(0)
        m = XLNetLMHeadModel(dataclasses.replace(cfg, attn_impl=impl)).train()
        o = m(ids, tt, None, perm, target_mapping=tmap, labels=tmap.argmax(-1), label_mask=(tmap.sum(-1) > 0).float())
        o.loss.backward()
        out[impl] = (o.loss.detach(), {k: p.grad for k, p in m.named_parameters()})
    assert maxdiff(out["einsum"][0], out["sdpa"][0]) <= TOL
    for k, g in out["einsum"][1].items():
        assert maxdiff(g, out["sdpa"][1][k]) <= TOL, k


# ---- a plain reference from the formulas (untie_r=false, which HF lacks) ---------------------------------------


def sinusoid(pos, d):
    inv = 1.0 / torch.pow(10000.0, torch.arange(0, d, 2.0) / d)
    x = pos[..., None] * inv
    return torch.cat([torch.sin(x), torch.cos(x)], -1)


def plain_reference(model, ids, tt, perm, tmap, mems=None):
    """Direct transcription of docs/xlnet.md §6: explicit relative distances (no rel-shift), full query stream over all
    L rows then the target rows picked by target_mapping, shared or per-layer r biases."""
    cfg, tr = model.config, model.transformer
    B, L_ = ids.shape
    M = 0 if mems is None else mems[0].shape[1]
    h = tr.word_embedding(ids)
    g = tr.mask_emb.expand(B, L_, -1)
    i = torch.arange(L_)[:, None]
    j = torch.arange(M + L_)[None, :]
    dist = (M + i - j).float()  # relative distance of query i to key j
    if cfg.clamp_len > 0:
        dist = dist.clamp(-cfg.clamp_len, cfg.clamp_len)
    pos = sinusoid(dist, cfg.d_model)  # [L,K,d]
    data = torch.cat([torch.zeros(B, L_, M), perm], 2) > 0
    mask_g = data
    mask_h = data & ~torch.cat([torch.zeros(L_, M, dtype=torch.bool), torch.eye(L_, dtype=torch.bool)], 1)
    seg_k = torch.cat([torch.zeros(B, M, dtype=torch.long), tt], 1)
    s = (tt[:, :, None] != seg_k[:, None, :]).long()  # [B,L,K]
    new_mems = []
    for li, layer in enumerate(tr.layer):
        a = layer.rel_attn
        src = a if cfg.untie_r else tr
        new_mems.append(torch.cat(([] if mems is None else [mems[li]]) + [h[:, : cfg.reuse_len]], 1)[:, -cfg.mem_len :])
        cat = h if mems is None else torch.cat([mems[li], h], 1)
        k = torch.einsum("bjd,dnh->bjnh", cat, a.k)
        v = torch.einsum("bjd,dnh->bjnh", cat, a.v)
        r = torch.einsum("ijd,dnh->ijnh", pos, a.r)

        def attend(x, mask, a=a, src=src, k=k, v=v, r=r):
            q = torch.einsum("bid,dnh->binh", x, a.q)
            ac = torch.einsum("binh,bjnh->bnij", q + src.r_w_bias, k)
            bd = torch.einsum("binh,ijnh->bnij", q + src.r_r_bias, r)
            seg = torch.einsum("binh,snh->bins", q + src.r_s_bias, a.seg_embed)
            ef = torch.gather(seg, 3, s[:, :, None, :].expand(-1, -1, cfg.n_head, -1)).permute(0, 2, 1, 3)
            score = (ac + bd + ef) / math.sqrt(cfg.d_head) - 1e30 * mask[:, None].float()
            vec = torch.einsum("bnij,bjnh->binh", torch.softmax(score, -1), v)
            return a.layer_norm(x + torch.einsum("binh,dnh->bid", vec, a.o))

        h, g = layer.ff(attend(h, mask_h)), layer.ff(attend(g, mask_g))
    g = torch.einsum("bpl,bld->bpd", tmap, g)
    return F.linear(g, tr.word_embedding.weight, model.lm_bias), new_mems


@pytest.mark.parametrize("untie_r", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_plain_reference_untie_r(untie_r, impl):
    cfg = tiny_cfg(untie_r=untie_r, attn_impl=impl, clamp_len=7)
    torch.manual_seed(5)
    model = XLNetLMHeadModel(cfg).eval()
    if not untie_r:
        assert not hasattr(model.transformer.layer[0].rel_attn, "r_w_bias")
        assert model.transformer.r_w_bias.shape == (cfg.n_head, cfg.d_head)
    rng = np.random.default_rng(6)
    ids, tt, perm, tmap = plm_batch(2, 3, rng, pad=False)
    mems = model(ids, tt, None, perm, target_mapping=tmap).mems
    ids, tt, perm, tmap = plm_batch(2, 3, rng, pad=False)
    grads = []
    for fn in (
        lambda: model(ids, tt, None, perm, target_mapping=tmap, mems=mems),
        lambda: plain_reference(model, ids, tt, perm, tmap, mems),
    ):
        model.zero_grad(set_to_none=True)
        out = fn()
        logits, new_mems = (out.logits, out.mems) if hasattr(out, "logits") else out
        y = torch.randint(0, V, logits.shape[:-1], generator=torch.Generator().manual_seed(2)).reshape(-1)
        F.cross_entropy(logits.reshape(-1, V), y).backward()
        grads.append(
            (
                logits.detach(),
                [m.detach() for m in new_mems],
                {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None},
            )
        )
    (l1, m1, g1), (l2, m2, g2) = grads
    assert maxdiff(l1, l2) <= TOL
    for a, b in zip(m1, m2, strict=True):
        assert maxdiff(a, b) <= TOL
    assert g1.keys() == g2.keys()
    for k in g1:
        assert maxdiff(g1[k], g2[k]) <= TOL, k


# ---- errors and small pieces -------------------------------------------------------------------------------


def test_errors_are_one_line():
    cfg = tiny_cfg(bi_data=True)
    m = XLNetLMHeadModel(cfg).eval()
    ids = torch.randint(0, V, (3, L))
    with pytest.raises(XLNetError, match="even per-device batch"):
        m(ids)
    m2 = XLNetLMHeadModel(tiny_cfg()).eval()
    ids = torch.randint(0, V, (2, L))
    with pytest.raises(XLNetError, match=r"mems\[0\] must be \[batch=2"):
        m2(ids, mems=[torch.zeros(2, 4, 16)] * cfg.n_layer)
    with pytest.raises(XLNetError, match="one tensor per layer"):
        m2(ids, mems=[torch.zeros(2, 4, 32)])
    with pytest.raises(XLNetError, match="unknown model size"):
        named_config("huge")


def test_named_sizes():
    base = named_config("base")
    assert (base.n_layer, base.d_model, base.n_head, base.d_inner) == (12, 768, 12, 3072)
    large = named_config("large")
    assert (large.n_layer, large.d_model, large.n_head, large.d_inner) == (24, 1024, 16, 4096)
    assert named_config("tiny").d_model == 128


@pytest.mark.parametrize("kind", ["last", "first", "mean", "attn"])
def test_sequence_summary(kind):
    torch.manual_seed(0)
    h = torch.randn(2, 5, 8)
    am = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.float32)
    s = SequenceSummary(8, kind, use_proj=False, dropout=0.0)
    out = s(h, am)
    want = {
        "last": h[:, -1],
        "first": h[:, 0],
        "mean": torch.stack([h[0].mean(0), h[1, 2:].mean(0)]),
        "attn": torch.stack([h[0].mean(0), h[1, 2:].mean(0)]),
    }[kind]  # zero query -> uniform over real tokens
    assert maxdiff(out, want) <= 1e-6
    sp = SequenceSummary(8, kind, use_proj=True, dropout=0.0)
    assert sp(h, am).abs().max() <= 1.0


def test_named_sizes_are_packaged_pretraining_presets():
    """SIZES is written out (the demo preset is a recipe, not a size); each must stay a preset that builds a model."""
    from xlnetcli.config import PRESETS
    from xlnetcli.model import SIZES, named_config

    assert set(SIZES) <= {name for name, file in PRESETS.items() if "/" not in file}
    for name in SIZES:
        assert named_config(name).d_model > 0
