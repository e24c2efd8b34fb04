"""attn_impl "triton" (model/triton_attention.py) in Triton's interpreter on CPU, against the float64 einsum path of
model/kernels.py: the output and the gradient of every input (q, k, v, kr, the three biases, seg_embed) with memory
0 and > 0, query-stream rows, bi_data's two position tables, segments, perm masks with fully masked rows, dropout
(through the kernel's debug keep mask), and the whole model's loss and gradients. Skipped without triton.
The interpreter runs a kernel at Python speed: one case per property stays in `make test-fast`, the other shapes,
layouts and the whole model are marked slow.

The interpreter is chosen when a kernel is defined (@triton.jit reads TRITON_INTERPRET): tests/conftest.py sets it
on machines without CUDA before anything imports triton. With CUDA the same tests run the compiled kernels."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from modeltools import maxdiff, plm_batch, tiny_cfg

from xlnetcli.core.errors import XLNetError
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.kernels import (
    AttnLayout,
    _position_segment_bias,
    additive_mask,
    mask_flags,
    relative_attention,
    resolve_impl,
)

pytest.importorskip("triton")
from triton.runtime.jit import JITFunction

from xlnetcli.model import triton_attention as ta

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEVICE.type == "cpu" and (not ta.INTERPRETED or isinstance(ta.tl.rand, JITFunction)):
    pytest.skip("triton was imported before TRITON_INTERPRET=1 (tests/conftest.py sets it)", allow_module_level=True)

TOL32 = 2e-5  # fp32 kernel against the float64 reference (values and gradients are O(1))


def case(B=2, H=2, D=16, L=12, M=8, P=4, G=1, seg=True, mask=True, seed=0):
    """Random attention inputs and their layout; with ``mask`` one content row and one query row fully masked."""
    g = torch.Generator().manual_seed(seed)
    N, K = L + P, M + L
    mk = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    ins = [mk(B, H, N, D), mk(B, H, K, D), mk(B, H, K, D), mk(G, H, K + L, D), mk(H, D), mk(H, D), mk(H, D)]
    ins.append(mk(2, H, D))
    rows = torch.cat([torch.arange(L).expand(B, L), torch.randint(0, L, (B, P), generator=g)], 1)
    rel = (L - rows)[:, None, :, None] + torch.arange(K)
    same = (torch.rand(B, 1, N, K, generator=g) > 0.5) if seg else None
    m = None
    if mask:
        m = torch.rand(B, 1, N, K, generator=g) > 0.6
        m[0, 0, 1] = True
        m[B - 1, 0, N - 1] = True
    on = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return [t.to(DEVICE) for t in ins], AttnLayout(L, on(rows), on(rel), on(same), on(m))


def reference(ins, layout: AttnLayout, keep=None, p=0.0):
    """The einsum path in float64 (keep: a given dropout mask instead of F.dropout's)."""
    q, k, v, kr, r_w, r_r, r_s, seg = ins
    lay = dataclasses.replace(layout, mask_bias=additive_mask(layout.mask, "einsum", torch.float64))
    if keep is None:
        return relative_attention(q, k, v, kr, (r_w, r_r, r_s), seg, lay, 0.0, False, "einsum")
    bias = _position_segment_bias(q, kr, r_r, r_s, seg if lay.seg_same is not None else None, lay)
    if lay.mask_bias is not None:
        bias = bias + lay.mask_bias
    prob = torch.softmax((q + r_w[:, None]) @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, -1)
    return (prob * keep / (1 - p)) @ v


def run_triton(ins, layout: AttnLayout, p=0.0):
    q, k, v, kr, r_w, r_r, r_s, seg = ins
    seg = seg if layout.seg_same is not None else None
    flags = mask_flags(layout.mask, layout.seg_same)
    return ta.triton_rel_attention(
        q, k, v, kr, (r_w, r_r, r_s), seg, layout.rows, layout.L, layout.content, flags, layout.mask is not None, p,
        debug_keep=p > 0,
    )  # fmt: skip


def check(ins, layout: AttnLayout, p=0.0, tol=TOL32, dtype=torch.float32):
    """Output and every input's gradient, the kernel in ``dtype`` against float64."""
    xs = [t.to(dtype).requires_grad_(True) for t in ins]
    out, keep = run_triton(xs, layout, p)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    grads = torch.autograd.grad(out, xs, go.to(dtype), allow_unused=True)
    x64 = [t.detach().double().requires_grad_(True) for t in xs]
    ref = reference(x64, layout, keep, p)
    want = torch.autograd.grad(ref, x64, go.double(), allow_unused=True)
    assert maxdiff(out.double(), ref) <= tol
    names = ("q", "k", "v", "kr", "r_w", "r_r", "r_s", "seg_embed")
    for name, a, b in zip(names, grads, want, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            assert maxdiff(a.double(), b) <= tol * max(1.0, b.abs().max().item()), name
    return keep


@pytest.fixture(params=["band", "table"])
def positions(request, monkeypatch):
    """Both ways of the content rows' position scores (triton_attention.CONTENT_POSITIONS)."""
    monkeypatch.setattr(ta, "CONTENT_POSITIONS", request.param)
    return request.param


@pytest.mark.parametrize(
    "B,M,P,G,seg,mask",
    [
        (2, 8, 4, 1, True, True),  # memory, query rows, segments and masks: the quick case
        *(
            pytest.param(*shape, marks=pytest.mark.slow)
            for shape in [
                (2, 0, 4, 2, True, True),
                (2, 8, 0, 2, False, True),
                (2, 0, 0, 1, True, False),
                (2, 8, 4, 2, False, False),
                (4, 8, 4, 2, True, True),  # two rows per table (bi_data): the table's [G, H, B/G·P, R] layout
            ]
        ),
    ],
)
def test_core_matches_float64_einsum(B, M, P, G, seg, mask, positions):
    ins, layout = case(B=B, M=M, P=P, G=G, seg=seg, mask=mask)
    check(ins, layout)


@pytest.mark.slow
def test_keys_values_and_output_gradient_as_the_layer_lays_them_out(positions):
    """k and v as the layer makes them, views of one [B,K,2,H,D] projection (rows 2·H·D apart), and the output's
    gradient as the o projection gives it back ([B,N,H·D] viewed per head): the kernels read them in place (no copy
    to [B,H,rows,D]) and give the same output and gradients, bit for bit (band rows: one batch row per table, their
    kernels are the interpreter's slowest)."""
    ins, layout = case(B=4 if positions == "table" else 2, M=8, P=4, G=2)
    q, k, v, *rest = ins
    kv = torch.stack([k, v], 0).permute(1, 3, 0, 2, 4).contiguous()  # [B,K,2,H,D]
    kk, vv = kv.permute(2, 0, 3, 1, 4).unbind(0)
    assert torch.equal(kk, k) and not kk.is_contiguous()
    assert ta._kv_strides(kk, vv)[0] is kk  # read in place
    go = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    go_rows = go.transpose(1, 2).contiguous().transpose(1, 2)  # [B,N,H,D] in memory
    assert torch.equal(go_rows, go) and not go_rows.is_contiguous()

    def run(k_, v_, go):
        xs = [t.detach().clone() if t.is_contiguous() else t.detach() for t in (q, k_, v_, *rest)]
        xs = [t.requires_grad_(True) for t in xs]
        out = run_triton(xs, layout, 0.2)[0]
        return [out, *torch.autograd.grad(out, xs, go)]

    torch.manual_seed(0)
    want = run(k, v, go)
    torch.manual_seed(0)
    got = run(kk, vv, go_rows)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def test_the_op_takes_k_and_v_in_unlike_layouts():
    """The op checks k's and v's strides itself (the kernels read both with k's): k a view of the projection and v
    row-major give what two row-major tensors do."""
    ins, layout = case(B=2, M=8, P=4, G=1)
    q, k, v, kr, r_w, r_r, r_s, seg = ins
    kk = torch.stack([k, v], 0).permute(1, 3, 0, 2, 4).contiguous().permute(2, 0, 3, 1, 4)[0]
    qw, qr = (q + r_w[:, None]).contiguous(), (q + r_r[:, None]).contiguous()
    ef = torch.matmul(q + r_s[:, None], seg.permute(1, 2, 0)).contiguous()
    flags = mask_flags(layout.mask, layout.seg_same)[:, 0].contiguous()
    rows = layout.rows.to(torch.int32).contiguous()
    seed = torch.zeros((), dtype=torch.int32, device=DEVICE)
    args = (kr.contiguous(), ef, rows, flags, True, layout.L, 0, layout.L, 0.0, seed)
    want = ta.rel_attn(qw, qr, k, v, *args)[0]
    assert torch.equal(ta.rel_attn(qw, qr, kk, v, *args)[0], want)


@pytest.mark.slow
@pytest.mark.parametrize("B,M,P,G", [(4, 8, 4, 2), (2, 0, 3, 1)])
def test_content_bias_from_the_forward_table(B, M, P, G, monkeypatch):
    """CONTENT_BIAS "table" (kept for the GPU benchmark's same-call comparison): the content rows' bias read from the
    forward table, as before the band product in _bias_kernel; the same maths."""
    monkeypatch.setattr(ta, "CONTENT_BIAS", "table")
    before = []
    table = ta._table
    monkeypatch.setattr(ta, "_table", lambda qr, kr, n: before.append(n) or table(qr, kr, n))
    ins, layout = case(B=B, M=M, P=P, G=G)
    check(ins, layout, p=0.2)
    assert before == [0]  # the forward table covers the content rows too
    monkeypatch.setattr(ta, "CONTENT_BIAS", "band")
    check(ins, layout, p=0.2)
    assert before == [0, layout.L]  # the default: the query rows only


@pytest.mark.slow
@pytest.mark.parametrize("L,M,P,G", [(16, 8, 4, 2), (9, 5, 3, 1), (20, 0, 6, 2)])
def test_core_matches_float64_einsum_more_shapes(L, M, P, G):
    """Several key and row tiles (L, K > 16), and lengths that are not multiples of the tile."""
    ins, layout = case(L=L, M=M, P=P, G=G, seed=L)
    check(ins, layout)


def test_query_rows_only():
    """The last pretraining layer: only the P query rows (layout.query_rows(), no content rows in the call)."""
    ins, layout = case(M=8, P=5, G=2)
    L = layout.L
    ins[0] = ins[0][:, :, L:].contiguous()
    check(ins, layout.query_rows())


@pytest.mark.parametrize("positions", ["table", pytest.param("band", marks=pytest.mark.slow)], indirect=True)
def test_dropout_through_the_debug_keep_mask(positions):
    """The kernels' hashed keep mask is hash_keep_mask's (the output and gradients match the reference given the mask
    torch computes), its rate, reproducible under torch.manual_seed, and the same mask recomputed in backward."""
    ins, layout = case(M=8, P=4, G=2)
    torch.manual_seed(5)
    keep = check(ins, layout, p=0.3)
    assert keep is not None and keep.shape == (2, 2, 16, 20)
    assert abs(keep.float().mean().item() - 0.7) < 0.06
    torch.manual_seed(5)
    again = run_triton(ins, layout, 0.3)[1]
    assert again is not None and torch.equal(keep, again)


@pytest.mark.parametrize("n_table", [0, 12])
def test_table_bias_is_the_rel_shifted_position_and_segment_term(n_table):
    """_table_bias: the table rows' bias is the reference's position + segment term, scaled to log2 units, NEG_INF
    where masked; the content rows' position term from the table (n_table 0) or the band product in the kernel
    (n_table = L)."""
    ins, layout = case(B=2, H=2, L=12, M=8, P=4, G=2)
    q, k, _, kr, _, r_r, r_s, seg = ins
    B, H, N, _ = q.shape
    K = k.shape[2]
    qr = (q + r_r[:, None]).contiguous()
    ef = torch.matmul(q + r_s[:, None], seg.permute(1, 2, 0)).contiguous()
    flags = mask_flags(layout.mask, layout.seg_same)[:, 0].contiguous()
    rows = layout.rows.to(torch.int32).contiguous()
    bias = ta._table_bias(qr, kr.contiguous(), ef, rows, flags, True, layout.L, 0, n_table, K)
    want = _position_segment_bias(q, kr, r_r, r_s, seg, layout) * math.log2(math.e)
    want = want.masked_fill(layout.mask, -1e30)
    assert bias.shape == (B, H, N, K) and maxdiff(bias, want) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("positions", ["table", "band"])
def test_backward_writes_every_entry_it_allocates(positions, monkeypatch):
    """Every buffer backward takes from torch.empty is written whole: the same gradients, bit for bit, when each
    allocation starts as NaN (dq writes the table's gradient at its rel-shifted columns and zeros in the columns no
    key reads; a missed entry would carry NaN into dqr or dkr)."""
    monkeypatch.setattr(ta, "CONTENT_POSITIONS", positions)
    B = 4 if positions == "table" else 2  # two batch rows per table where dq writes the table's gradient
    ins, layout = case(B=B, H=2, L=12, M=8, P=4, G=2)
    xs = [t.requires_grad_(True) for t in ins]
    go = torch.randn(B, 2, 16, 16, generator=torch.Generator().manual_seed(5)).to(DEVICE)

    def grads():
        return torch.autograd.grad(run_triton(xs, layout, 0.2)[0], xs, go)

    torch.manual_seed(0)
    clean = grads()
    empty = torch.empty

    def poisoned(*a, **kw):
        t = empty(*a, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    torch.manual_seed(0)
    dirty = grads()
    for a, b in zip(clean, dirty, strict=True):
        assert torch.equal(a, b)


def test_hash_keep_mask_statistics():
    """The dropout hash over 4M scores: the keep rate within 5 standard deviations of 1 - p (p rounded to 24 bits),
    neighbouring keys, rows, heads and seeds agree as often as independent draws would (p^2 + (1-p)^2), and the
    24-bit threshold keeps p's scale exact."""
    p = 0.1
    keep = ta.hash_keep_mask(12345, (4, 4, 256, 1024), p, "cpu")
    n = keep.numel()
    q = 1 - ta.dropout_threshold(p)[0] / 2**24
    assert abs(keep.float().mean().item() - q) < 5 * math.sqrt(q * (1 - q) / n)
    agree = q * q + (1 - q) * (1 - q)
    other_seed = ta.hash_keep_mask(12346, (4, 4, 256, 1024), p, "cpu")
    for a, b in ((keep[..., 1:], keep[..., :-1]), (keep[:, :, 1:], keep[:, :, :-1]), (keep[:, 1:], keep[:, :-1]),
                 (keep, other_seed)):  # fmt: skip
        rate = (a == b).float().mean().item()
        assert abs(rate - agree) < 5 * math.sqrt(agree * (1 - agree) / a.numel()), rate
    t, scale = ta.dropout_threshold(p)
    assert t == round(p * 2**24) and scale == 1 / (1 - t / 2**24)
    assert ta.dropout_threshold(0.0) == (0, 1.0)


def test_fp16_inputs():
    """fp16 tiles (tl.dot on fp16, fp32 accumulation) against float64, at fp16 accuracy."""
    ins, layout = case(M=8, P=4)
    check([t * 0.5 for t in ins], layout, tol=2e-2, dtype=torch.float16)


def run_model(cfg, batch, mems):
    ids, tt, perm, tmap = (t.to(DEVICE) for t in batch)
    torch.manual_seed(0)
    m = XLNetLMHeadModel(cfg).train().to(DEVICE)
    o = m(ids, tt, None, perm, target_mapping=tmap, mems=mems, labels=tmap.argmax(-1),
          label_mask=(tmap.sum(-1) > 0).float(), need_hidden=False)  # fmt: skip
    o.loss.backward()
    return o.loss, {k: p.grad for k, p in m.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "bi_data,positions",
    [(True, "band"), (True, "table"), (False, "table")],
    indirect=["positions"],
)
def test_model_matches_einsum(bi_data, positions):
    """XLNetLMHeadModel (tiny: d_head 8, padded to a 16-wide tile) with memory, segments, perm masks and padded
    target rows: loss and every parameter's gradient, triton against einsum (both fp32)."""
    cfg = tiny_cfg(bi_data=bi_data)
    batch = plm_batch(2, 3, np.random.default_rng(4))
    mems = [torch.randn(2, 5, cfg.d_model).to(DEVICE) for _ in range(cfg.n_layer)]
    (le, ge), (lt, gt) = (run_model(dataclasses.replace(cfg, attn_impl=i), batch, mems) for i in ("einsum", "triton"))
    assert maxdiff(le, lt) <= 1e-5
    for k, g in ge.items():
        assert maxdiff(g, gt[k]) <= 1e-5, k


def test_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(XLNetError, match="attn_impl=triton needs a CUDA device"):
        resolve_impl("triton", torch.device("cpu"))


@pytest.mark.slow
def test_activation_checkpointing_recomputes_the_same_dropout():
    """Under torch.utils.checkpoint the op runs again in backward: its seed comes from torch's RNG, which checkpoint
    restores, so the recomputed keep mask and the gradients equal the plain run's (bit for bit)."""
    ins, layout = case(M=8, P=4)
    grads = []
    for ckpt in (False, True):
        xs = [t.clone().requires_grad_(True) for t in ins]
        f = lambda *a: run_triton(list(a), layout, 0.3)[0]  # noqa: E731
        torch.manual_seed(11)
        out = torch.utils.checkpoint.checkpoint(f, *xs, use_reentrant=False) if ckpt else f(*xs)
        grads.append(torch.autograd.grad(out.square().sum(), xs))
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_compiled_layers_match_eager():
    """Per-layer torch.compile (train.compile) around the custom op: the same loss and gradients as eager (the op is
    one node to inductor). Inductor on the CPU lowered what failed on CUDA (a uint8 view of the bool mask), so
    tests/test_gpu.py repeats this on a GPU."""
    from modeltools import twins

    from xlnetcli.model.parallel import compile_layers

    cfg = tiny_cfg(dropout=0.0, dropatt=0.0, attn_impl="triton", d_head=16)
    ids, tt, perm, tmap = (t.to(DEVICE) for t in plm_batch(2, 3, np.random.default_rng(0)))
    eager, comp = (m.to(DEVICE) for m in twins(cfg))
    compile_layers(comp)
    res = []
    for m in (eager, comp):
        o = m(ids, tt, None, perm, target_mapping=tmap, labels=tmap.argmax(-1),
              label_mask=(tmap.sum(-1) > 0).float(), need_hidden=False)  # fmt: skip
        o.loss.backward()
        res.append((o.loss.detach(), {k.replace("._orig_mod", ""): p.grad for k, p in m.named_parameters()}))
    (l0, g0), (l1, g1) = res
    assert maxdiff(l0, l1) <= 1e-6
    assert g0.keys() == g1.keys() and max(maxdiff(g0[k], g1[k]) for k in g0) <= 1e-6


@pytest.mark.parametrize(
    "tile,positions",
    [
        ((32, 16), "table"),
        *(pytest.param(*p, marks=pytest.mark.slow) for p in (((16, 32), "table"), ((32, 16), "band"))),
    ],
    indirect=["positions"],
)
def test_row_and_key_tiles_may_differ(tile, positions, monkeypatch):
    """Table rows run with BM rows by BN keys per tile (GPU_TILES' BN); band rows keep BN = BM (the band's BM + BN
    rows must be a power of two): both, with dropout, against float64 given the kernel's keep mask."""
    monkeypatch.setattr(ta, "INTERPRETER_TILE", tile)
    ins, layout = case(L=20, M=8, P=6, G=2, seed=3)
    torch.manual_seed(2)
    check(ins, layout, p=0.3)
