"""``attn_impl: triton``: XLNet's two-stream relative attention core as fused Triton kernels (forward and backward).

The maths is kernels.py's (module docstring): for stacked row i at sequence position pos_i and key j,

    s_ij = [ qw_i·k_j + qr_i·kr[L - pos_i + j] + ef_i[s_ij] ] / sqrt(D),  qw = q + r_w, qr = q + r_r,
    ef_i = (q_i + r_s)·seg_embed [2 scalars: same segment, other segment],

masked (a masked score is replaced by NEG_INF = -1e30, as the reference's additive mask does in floating point:
a fully masked row attends uniformly to every key and passes gradient through), softmax, dropout, · v.

The kernels follow FlashAttention-2 (Dao 2023, arXiv:2307.08691): per tile of BM rows an online softmax over
tiles of BN keys (running max m, sum l, rescaled accumulator), scores kept in log2 units (times log2 e, folded into
the scale) so that each weight is one ex2; m and 1/l are kept per row (not their log-sum-exp: in a fully masked row
m = -1e30 absorbs log l) and backward recomputes p = 2^(s - m) / l, with delta_i = do_i·out_i, ds = p (dp - delta).
No probability or fp32 score tensor is written. The position term comes one of two ways:

- a table (every query-stream row, and the content rows with CONTENT_POSITIONS "table", the default): the rows'
  bias [B,H,rows,K], the position term together with the segment term and the mask, made by _bias_kernel once per
  call; the query rows' position term read from bdq = qr·kr^T [G,H,B/G·P,R] (one batched matmul) at column L - pos_i + j
  (Transformer-XL's rel-shift), the content rows' from a band product inside the kernel (below); the attention
  kernels read one contiguous bias tile per step (no per-score address arithmetic, no byte decoding), and backward
  reads the same bias (kept from forward: 2 bytes per score in bf16). dq writes the bias's gradient straight into
  the table's columns (the rel-shift's transpose, zeros where no key reads) and two batched products take it to qr
  and kr;
- a band (content rows, pos_i = i, with CONTENT_POSITIONS "band"): the position term of a (row tile i0, key tile j0)
  reads the kr rows rb = L - i0 - (BM-1) + j0 ... rb + BM + BN - 1, multiplies them once (T = qr·band^T,
  [BM, BM+BN]) and skews the product in registers, S[a, c] = T[a, c - a + BM - 1] (tl.gather): no [N,R] or [N,K]
  tensor, at the cost of two extra tile products, the gather and a dkr kernel (slower: BENCHMARKS.md); the
  segment term (two scalars ef_i per row, chosen by the same-segment bit) and the mask bit are read per score from
  one byte per (row, key) shared by the heads (kernels.mask_flags).

Attention dropout: keep_ij = hash(row_key_i + j) >= t (_hash: a 32-bit integer hash, two multiply-xorshift
rounds; row_key_i = hash(hash(((b·H + h)·N + i)) ^ seed), stored by forward with the row's softmax statistics; t =
p rounded to 24 bits). Every kernel recomputes the bits it needs (about ten integer instructions per score), so
nothing of the score matrix's size is kept for dropout; hash_keep_mask computes the same mask with torch for tests.

Backward is deterministic: no atomics, every gradient written by one program that sums in a fixed order. One
kernel per row tile (dqw, the band rows' dqr, the two segment-scalar gradients, the table's gradient), one per key
tile (dk, dv), and for band rows one per tile of relative positions (dkr, walking the rows in (i, r) space, where
key j = i + r - L: the content and value products are then the skewed band ones).

The torch side (``triton_rel_attention``) adds the biases, computes ef with ordinary ops, and calls the
custom op ``xlnet::rel_attn_v3`` (torch.library.custom_op, its backward registered with register_autograd), so that
torch.compile and activation checkpointing see one node. The kernels run on CUDA, or on CPU tensors under Triton's
interpreter (TRITON_INTERPRET=1, read when this module is imported)."""

import math
import os

import torch
import triton
import triton.language as tl

NEG_INF = tl.constexpr(-1e30)  # kernels.NEG_INF (kernels.py imports this module lazily); constexpr: kernels read it
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # what @triton.jit reads: the kernels below are interpreted
LOG2E = tl.constexpr(1.4426950408889634)  # the kernels keep scores in log2 units: exp(x) = 2^(x log2 e)
FAST_EXP2 = tl.constexpr(not INTERPRETED)  # 2^x by one ex2.approx.ftz (the interpreter has no inline PTX)


# ----------------------------------------------------------------------------------------------------------------
# Tile helpers


@triton.jit
def _load_rows(ptr, start, n, D: tl.constexpr, W: tl.constexpr, BD: tl.constexpr, S=None):
    """Rows start .. start+W-1 of a [n, D] matrix at ptr whose rows lie S elements apart (None: D, row-major): [W, BD],
    zero outside. With D == BD (head sizes 16, 32, 64, 128) the mask is per row, so the loads can be vectorised along
    D."""
    t = start + tl.arange(0, W)
    d = tl.arange(0, BD)
    ok = (t >= 0) & (t < n)
    rows = t[:, None] * D if S is None else t[:, None] * S
    if D == BD:
        return tl.load(ptr + rows + d[None, :], mask=ok[:, None], other=0.0)
    return tl.load(ptr + rows + d[None, :], mask=ok[:, None] & (d < D)[None, :], other=0.0)


@triton.jit
def _exp2(x):
    """2^x in fp32. Compiled: PTX ex2.approx.ftz, one MUFU instruction (tl.exp2's ex2.approx without .ftz costs
    four more per score: ptxas guards subnormal results, which a softmax weight below 2^-126 does not need)."""
    if FAST_EXP2:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)  # fmt: skip
    else:
        return tl.exp2(x)


@triton.jit
def _skew(T, BM: tl.constexpr, BN: tl.constexpr):
    """S[a, c] = T[a, c - a + BM - 1]: the band product [BM, BM+BN] -> the tile's position scores [BM, BN]."""
    a = tl.arange(0, BM)[:, None]
    c = tl.arange(0, BN)[None, :]
    return tl.gather(T, c - a + BM - 1, 1)


@triton.jit
def _band_scores(qr, kr_ptr, g, h, H, R, L, D: tl.constexpr, i0, j0, BM: tl.constexpr, BN: tl.constexpr,
                 BD: tl.constexpr):  # fmt: skip
    """Content rows i0 .. i0+BM-1 (pos_i = i) against keys j0 .. j0+BN-1 (BN = BM): their position scores
    qr_i·kr[L - i + j] [BM, BN] (fp32), from the band of kr rows L - i0 - (BM-1) + j0 ... (BM + BN of them),
    multiplied once and skewed."""
    band = _load_rows(kr_ptr + (g * H + h) * R * D, L - i0 - (BM - 1) + j0, R, D, BM + BN, BD)
    return _skew(tl.dot(qr, tl.trans(band), input_precision="ieee"), BM, BN)


@triton.jit
def _unskew(ds, BM: tl.constexpr, BN: tl.constexpr):
    """The inverse of _skew: [BM, BN] -> [BM, BM+BN], t[a, c] = ds[a, c + a - BM + 1] inside the tile, else 0."""
    a = tl.arange(0, BM)[:, None]
    j = tl.arange(0, BM + BN)[None, :] + a - BM + 1
    inside = (j >= 0) & (j < BN)
    return tl.where(inside, tl.gather(ds, tl.minimum(tl.maximum(j, 0), BN - 1), 1), 0.0)


@triton.jit
def _hash(x):
    """lowbias32 (C. Wellons' hash prospector): a bijection of uint32 with full avalanche, two multiply-xorshift
    rounds. hash_keep_mask below is the same function in torch."""
    x ^= x >> 16
    x *= 0x7FEB352D
    x ^= x >> 15
    x *= 0x846CA68B
    x ^= x >> 16
    return x


@triton.jit
def _row_key(seed, bh, N, ri):
    """Dropout's per-row key of rows ri (any shape): hash(hash(bh·N + i) ^ seed)."""
    return _hash(_hash((bh * N + ri).to(tl.uint32)) ^ seed.to(tl.uint32))


@triton.jit
def _keep(row_key, kj, drop_thr):
    """Dropout's keep bits at (row, key): hash(row_key + j) >= drop_thr·2^8 (a 24-bit threshold: p rounded to a
    multiple of 2^-24). row_key and kj broadcast to the tile; every kernel recomputes the bits it needs (about ten
    integer instructions per score, no memory); the row keys are the forward's (stored with the stats)."""
    return _hash(row_key + kj.to(tl.uint32)) >= (drop_thr.to(tl.uint32) << 8)


@triton.jit
def _bias(tab, b, bh, ri, kj, ok, ef_ptr, flags_ptr, N, K, scale, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr):
    """What a tile's scores add to the scaled content product qw·k^T · scale: (tab (the position term, or 0) + the
    segment term) · scale (the callers pass log2(e) / sqrt(D)), NEG_INF where masked, -inf outside (not ok: no
    weight at all). Rows ri and keys kj
    are 2-D and broadcast to the tile ([BM, 1] and [1, BN]; the transposed tile: [1, BM] and [BN, 1]; any keys
    [BM, BN]). Returns it and the flags tile. Every term comes from memory: one fp32 tile meets the product. Adding
    NEG_INF = -1e30 to a score of normal size gives -1e30 exactly in fp32, as replacing it does."""
    if HAS_SEG or HAS_MASK:  # bit 0: masked, bit 1: same segment
        fl = tl.load(flags_ptr + (b * N + ri) * K + kj, mask=ok, other=0)
    else:
        fl = tl.zeros(tab.shape, tl.uint8)
    if HAS_SEG:
        ef0 = tl.load(ef_ptr + (bh * N + ri) * 2, mask=ri < N, other=0.0)
        ef1 = tl.load(ef_ptr + (bh * N + ri) * 2 + 1, mask=ri < N, other=0.0)
        tab += tl.where((fl & 2) != 0, ef0, ef1)
    tab = tab * scale
    if HAS_MASK:
        tab = tl.where((fl & 1) != 0, NEG_INF, tab)
    return tl.where(ok, tab, float("-inf")), fl


@triton.jit
def _scores(
    qw, qr, k, i, i0, j0, b, h, g, kr_ptr, bias_ptr, ef_ptr, flags_ptr,
    H, N, K, R, L, D: tl.constexpr, P, row0, scale,
    QUERY: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr, FLAGS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """The scores of rows i (tile start i0) against keys j0 .. j0+BN-1 (k: their [BN, BD] tile) in log2 units
    (scale = log2(e) / sqrt(D)): [BM, BN], and the flags tile (band rows: _bias's; table rows: read when FLAGS, else
    zeros)."""
    j = j0 + tl.arange(0, BN)
    ok = (i < N)[:, None] & (j < K)[None, :]
    s = tl.dot(qw, tl.trans(k), input_precision="ieee")
    if QUERY:  # the table rows' bias [B,H,P,K], made once per call (_bias_kernel): one contiguous tile
        bias = tl.load(bias_ptr + ((b * H + h) * P + (i - row0)[:, None]) * K + j[None, :], mask=ok,
                       other=float("-inf")).to(tl.float32)  # fmt: skip
        if FLAGS:
            fl = tl.load(flags_ptr + (b * N + i[:, None]) * K + j[None, :], mask=ok, other=0)
        else:
            fl = tl.zeros([BM, BN], tl.uint8)
    else:  # content rows: the band of kr rows, multiplied once and skewed
        s += _band_scores(qr, kr_ptr, g, h, H, R, L, D, i0, j0, BM, BN, BD)
        bias, fl = _bias(tl.zeros([BM, BN], tl.float32), b, b * H + h, i[:, None], j[None, :], ok, ef_ptr, flags_ptr,
                         N, K, scale, HAS_SEG, HAS_MASK)  # fmt: skip
    return s * scale + bias, fl


@triton.jit
def _row_tile(
    qw_ptr, qr_ptr, b, h, H, N, D: tl.constexpr, i0, row_end, BM: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """Rows i0 .. i0+BM-1 (those < row_end): their indices, qw and qr tiles."""
    i = i0 + tl.arange(0, BM)
    i = tl.where(i < row_end, i, N)  # rows past the range read as row N: out of bounds, masked everywhere
    base = (b * H + h) * N * D
    qw = _load_rows(qw_ptr + base, i0, row_end, D, BM, BD)
    qr = _load_rows(qr_ptr + base, i0, row_end, D, BM, BD)
    return i, qw, qr


@triton.jit
def _bias_kernel(
    bdq_ptr, qr_ptr, kr_ptr, ef_ptr, flags_ptr, rows_ptr, bias_ptr, H, N, K, R, L, D: tl.constexpr, P, GB, row0,
    start, end, tab0, scale,
    BAND: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """The bias [B,H,P,K] of the stacked rows row0 .. N-1 (bias row i - row0), for the rows start .. end-1 of this
    launch: (the position term + the segment term) · scale (log2(e) / sqrt(D): the kernels' log2 units), NEG_INF
    where masked; the segment choice and the mask are done once per call, so that the attention kernels read one
    contiguous tile per step. The position term: BAND (content rows, pos_i = i; BN = BM): the band product,
    _band_scores; else read from the table bdq at column L - pos + j (Transformer-XL's rel-shift), bdq laid out as
    _table's product for the rows tab0 .. N-1, [G, H, B/G·(N - tab0), R]."""
    bh = tl.program_id(2)
    b, h = bh // H, bh % H
    i = start + tl.program_id(0) * BM + tl.arange(0, BM)
    j = tl.program_id(1) * BN + tl.arange(0, BN)
    ok = (i < end)[:, None] & (j < K)[None, :]
    if BAND:
        i0 = start + tl.program_id(0) * BM
        qr = _load_rows(qr_ptr + bh * N * D, i0, end, D, BM, BD)
        tab = _band_scores(qr, kr_ptr, b // GB, h, H, R, L, D, i0, tl.program_id(1) * BN, BM, BN, BD)
    else:
        pos = tl.load(rows_ptr + b * N + i, mask=i < end, other=0)
        t0 = (((b // GB) * H + h) * GB + b % GB) * (N - tab0) - tab0
        tab = tl.load(bdq_ptr + (t0 + i[:, None]) * R + L - pos[:, None] + j[None, :], mask=ok, other=0.0)
    bias, _ = _bias(tab.to(tl.float32), b, bh, i[:, None], j[None, :], ok, ef_ptr, flags_ptr, N, K, scale * LOG2E,
                    HAS_SEG, HAS_MASK)  # fmt: skip
    tl.store(bias_ptr + (bh * P + (i - row0)[:, None]) * K + j[None, :], bias.to(bias_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------------------------------------------
# Forward


@triton.jit
def _fwd_kernel(
    qw_ptr, qr_ptr, k_ptr, v_ptr, kr_ptr, bias_ptr, ef_ptr, flags_ptr, out_ptr, stats_ptr,
    H, N, K, R, L, D: tl.constexpr, P, GB, row0, row_end, scale, seed_ptr, drop_thr, keep_scale,
    kv_b, kv_h, kv_r,
    QUERY: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr, DROP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """One tile of BM rows of one (batch, head): online softmax over the key tiles, out = sum_j p_ij keep_ij v_j /
    (1 - p_drop) (keep_scale); the row's softmax statistics (m_i in log2 units, 1 / l_i). scale = 1/sqrt(D).
    The dropout seed is read from the device (seed_ptr: one int32, drawn there each call), so a captured CUDA graph
    draws new bits at every replay."""
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    g = b // GB
    i0 = row0 + tl.program_id(0) * BM
    i, qw, qr = _row_tile(qw_ptr, qr_ptr, b, h, H, N, D, i0, row_end, BM, BD)
    # m and den as [BM, 1] columns: kept in the products' layout (as [BM] vectors, Triton carried them in the
    # loads' layout and computed the softmax in both)
    m = tl.full([BM, 1], -3.0e38, tl.float32)  # finite: rows past the range (all -inf) give no inf - inf
    den = tl.zeros([BM, 1], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    scale2 = scale * LOG2E
    for j0 in range(0, K, BN):  # k and v share their strides (_kv_strides)
        k = _load_rows(k_ptr + b * kv_b + h * kv_h, j0, K, D, BN, BD, kv_r)
        s, _ = _scores(qw, qr, k, i, i0, j0, b, h, g, kr_ptr, bias_ptr, ef_ptr, flags_ptr,
                       H, N, K, R, L, D, P, row0, scale2, QUERY, HAS_SEG, HAS_MASK, False, BM, BN, BD)  # fmt: skip
        m_new = tl.maximum(m, tl.max(s, 1, keep_dims=True))
        alpha = _exp2(m - m_new)
        p = _exp2(s - m_new)
        den = den * alpha + tl.sum(p, 1, keep_dims=True)
        if DROP:  # the row keys from the seed each tile (held through the loop, the band forward spilled)
            row_key = _row_key(tl.load(seed_ptr), bh, N, i[:, None])
            p = tl.where(_keep(row_key, j0 + tl.arange(0, BN)[None, :], drop_thr), p, 0.0)
        v = _load_rows(v_ptr + b * kv_b + h * kv_h, j0, K, D, BN, BD, kv_r)
        acc = acc * alpha + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new
    if DROP:
        acc = acc * keep_scale
    rden = 1.0 / tl.where(den > 0, den, 1.0)
    out = acc * rden
    d = tl.arange(0, BD)
    ok = (i < N)[:, None] & (d < D)[None, :]
    tl.store(out_ptr + (bh * N + i[:, None]) * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(stats_ptr + (bh * N + i[:, None]) * 3, m, mask=(i < N)[:, None])
    tl.store(stats_ptr + (bh * N + i[:, None]) * 3 + 1, rden, mask=(i < N)[:, None])
    row_key = _row_key(tl.load(seed_ptr) if DROP else tl.zeros([], tl.int32), bh, N, i[:, None])
    tl.store(stats_ptr + (bh * N + i[:, None]) * 3 + 2, row_key.to(tl.float32, bitcast=True), mask=(i < N)[:, None])


# ----------------------------------------------------------------------------------------------------------------
# Backward: ds = p (dp - delta) / sqrt(D) is the gradient of every (unscaled) term of the score


@triton.jit
def _row_grads_in(
    do_ptr, do_r, stats_ptr, delta_ptr, bh, N, D: tl.constexpr, i, i0, row_end, BM: tl.constexpr,
    BD: tl.constexpr, DELTA: tl.constexpr = True,
):  # fmt: skip
    """What backward reads per row tile: do [BM, BD] (do_ptr: its (batch, head) matrix, rows do_r apart), the
    softmax's row max m (log2 units) and 1 / sum, delta' [BM] (_dq_kernel computes and stores it: DELTA False gives
    zeros), the dropout row keys the forward stored (_row_key)."""
    do = _load_rows(do_ptr, i0, row_end, D, BM, BD, do_r)
    m = tl.load(stats_ptr + (bh * N + i) * 3, mask=i < N, other=0.0)
    rden = tl.load(stats_ptr + (bh * N + i) * 3 + 1, mask=i < N, other=1.0)
    row_key = tl.load(stats_ptr + (bh * N + i) * 3 + 2, mask=i < N, other=0.0).to(tl.uint32, bitcast=True)
    delta = tl.load(delta_ptr + bh * N + i, mask=i < N, other=0.0) if DELTA else tl.zeros([BM], tl.float32)
    return do, m, rden, delta, row_key


@triton.jit
def _dt_rows(rows_ptr, b, h, H, N, R, L, P, GB, i, row0):
    """Where stacked rows i (table rows from row0) put their gradient in the table's [G, H, B/G·P, R] layout: the
    offset of their entry for key 0, (t0 + i - row0)·R + L - pos_i, and that shift L - pos_i."""
    shift = L - tl.load(rows_ptr + b * N + i, mask=i < N, other=0)
    t0 = (((b // GB) * H + h) * GB + b % GB) * P
    return (t0 + i - row0) * R + shift, shift


@triton.jit
def _dq_kernel(
    qw_ptr, qr_ptr, k_ptr, v_ptr, kr_ptr, bias_ptr, ef_ptr, flags_ptr,
    do_ptr, out_ptr, stats_ptr, delta_ptr, dqw_ptr, dqr_ptr, dt_ptr, def_ptr, rows_ptr,
    H, N, K, R, L, D: tl.constexpr, P, GB, row0, row_end, scale, drop_thr, keep_scale,
    kv_b, kv_h, kv_r, do_b, do_h, do_r,
    QUERY: tl.constexpr, HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr, DROP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """Per row tile: dqw_i = sum_j ds_ij k_j; dqr_i = sum_j ds_ij kr[L - i + j] (content rows, through the band) or
    the table's gradient (table rows: dt[i, L - pos_i + j] = ds_ij, the transpose of _bias_kernel's rel-shift, and 0
    in the row's L columns that no key reads, so that every entry is written once; laid out as _table's product,
    [G, H, B/G·P, R]: the launcher's two products take it to qr and kr); the two segment scalars' gradients sum_j
    ds_ij [same_ij] and sum_j ds_ij [not same_ij]. First delta_i = do_i·out_i (= sum_j p_ij dp_ij), stored as delta'
    = delta / keep_scale for the dk/dv and dkr kernels, which run after."""
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    g = b // GB
    i0 = row0 + tl.program_id(0) * BM
    i, qw, qr = _row_tile(qw_ptr, qr_ptr, b, h, H, N, D, i0, row_end, BM, BD)
    do, m, rden, _, row_key = _row_grads_in(do_ptr + b * do_b + h * do_h, do_r, stats_ptr, delta_ptr, bh, N, D, i, i0,
                                            row_end, BM, BD, False)  # fmt: skip
    out = _load_rows(out_ptr + bh * N * D, i0, row_end, D, BM, BD)
    delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1) / keep_scale
    tl.store(delta_ptr + bh * N + i, delta, mask=i < N)
    row_key = row_key[:, None]
    dqw = tl.zeros([BM, BD], tl.float32)
    dqr = tl.zeros([BM, BD], tl.float32)
    de0 = tl.zeros([BM, 1], tl.float32)  # [BM, 1]: carried in the products' layout (see _fwd_kernel)
    de1 = tl.zeros([BM, 1], tl.float32)
    # ds = p (keep dp / (1 - p_drop) - delta) / sqrt(D) = p' (keep dp - delta') with p' = p keep_scale / sqrt(D) and
    # delta' = delta / keep_scale: the per-score factors folded into per-row ones
    m, r, delta, scale2 = m[:, None], (scale * keep_scale) * rden[:, None], delta[:, None], scale * LOG2E
    dt_at = _dt_rows(rows_ptr, b, h, H, N, R, L, P, GB, i, row0)[0] if QUERY else i
    for j0 in range(0, K, BN):
        j = j0 + tl.arange(0, BN)
        ok = (i < N)[:, None] & (j < K)[None, :]
        k = _load_rows(k_ptr + b * kv_b + h * kv_h, j0, K, D, BN, BD, kv_r)
        v = _load_rows(v_ptr + b * kv_b + h * kv_h, j0, K, D, BN, BD, kv_r)
        s, fl = _scores(qw, qr, k, i, i0, j0, b, h, g, kr_ptr, bias_ptr, ef_ptr, flags_ptr,
                        H, N, K, R, L, D, P, row0, scale2, QUERY, HAS_SEG, HAS_MASK, HAS_SEG, BM, BN, BD)  # fmt: skip
        p = _exp2(s - m) * r
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        if DROP:  # noqa: SIM108 - ds = p' (keep dp - delta') = (keep p') dp - p' delta': the keep bits used once
            ds = tl.where(_keep(row_key, j[None, :], drop_thr), p, 0.0) * dp - p * delta
        else:
            ds = p * (dp - delta)
        dqw += tl.dot(ds.to(k.dtype), k, input_precision="ieee")
        if QUERY:  # row i's entry for key j: dt[t0 + i - row0, L - pos_i + j] (_dt_rows)
            tl.store(dt_ptr + dt_at[:, None] + j[None, :], ds.to(dt_ptr.dtype.element_ty), mask=ok)
        else:
            band = _load_rows(kr_ptr + (g * H + h) * R * D, L - i0 - (BM - 1) + j0, R, D, BM + BN, BD)
            dqr += tl.dot(_unskew(ds, BM, BN).to(band.dtype), band, input_precision="ieee")
        if HAS_SEG:
            same = (fl & 2) != 0
            de0 += tl.sum(tl.where(same, ds, 0.0), 1, keep_dims=True)
            de1 += tl.sum(tl.where(same, 0.0, ds), 1, keep_dims=True)
    d = tl.arange(0, BD)
    ok = (i < N)[:, None] & (d < D)[None, :]
    tl.store(dqw_ptr + (bh * N + i[:, None]) * D + d[None, :], dqw.to(dqw_ptr.dtype.element_ty), mask=ok)
    if not QUERY:  # table rows: the launcher writes their dqr (from the table's gradient)
        tl.store(dqr_ptr + (bh * N + i[:, None]) * D + d[None, :], dqr.to(dqr_ptr.dtype.element_ty), mask=ok)
    if HAS_SEG:
        tl.store(def_ptr + (bh * N + i[:, None]) * 2, de0, mask=(i < N)[:, None])
        tl.store(def_ptr + (bh * N + i[:, None]) * 2 + 1, de1, mask=(i < N)[:, None])
    # last (the accumulators stored): the rows' other L columns, [0, shift) and [shift + K, R): t -> t, or t + K past
    # the shift
    if QUERY:
        dt_at, shift = _dt_rows(rows_ptr, b, h, H, N, R, L, P, GB, i, row0)
        row_start = (dt_at - shift)[:, None]
        for c0 in range(0, L, BN):
            t = c0 + tl.arange(0, BN)[None, :]
            tl.store(dt_ptr + row_start + tl.where(t < shift[:, None], t, t + K),
                     tl.zeros([BM, BN], dt_ptr.dtype.element_ty), mask=(i < N)[:, None] & (t < L))  # fmt: skip


@triton.jit
def _dkdv_step(
    dk, dv, k, v, i0, j0, row_end, b, h, g,
    qw_ptr, qr_ptr, kr_ptr, ef_ptr, flags_ptr, do_ptr, do_r, stats_ptr, delta_ptr,
    H, N, K, R, L, D: tl.constexpr, scale, drop_thr, keep_scale,
    HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr, DROP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """One band row tile's share of a key tile's gradients: dv_j += sum_i p'_ij keep_ij do_i (p' carries 1/sqrt(D);
    the kernel takes it out at the end), dk_j += sum_i ds_ij qw_i; p' and delta' as in _dq_kernel."""
    bh = b * H + h
    i, qw, qr = _row_tile(qw_ptr, qr_ptr, b, h, H, N, D, i0, row_end, BM, BD)
    do, m, rden, delta, row_key = _row_grads_in(do_ptr, do_r, stats_ptr, delta_ptr, bh, N, D, i, i0, row_end, BM, BD)
    s, _ = _scores(qw, qr, k, i, i0, j0, b, h, g, kr_ptr, qw_ptr, ef_ptr, flags_ptr,
                   H, N, K, R, L, D, 0, 0, scale * LOG2E, False, HAS_SEG, HAS_MASK, False, BM, BN, BD)  # fmt: skip
    p = _exp2(s - m[:, None]) * ((scale * keep_scale) * rden[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision="ieee")
    if DROP:  # as in _dq_kernel: the keep bits used once
        pd = tl.where(_keep(row_key[:, None], j0 + tl.arange(0, BN)[None, :], drop_thr), p, 0.0)
        ds = pd * dp - p * delta[:, None]
    else:
        pd = p
        ds = p * (dp - delta[:, None])
    dv += tl.dot(tl.trans(pd).to(do.dtype), do, input_precision="ieee")
    dk += tl.dot(tl.trans(ds).to(qw.dtype), qw, input_precision="ieee")
    return dk, dv


@triton.jit
def _dkdv_step_t(
    dk, dv, k, v, i0, j0, row0, b, h,
    qw_ptr, bias_ptr, do_ptr, do_r, stats_ptr, delta_ptr,
    H, N, K, D: tl.constexpr, P, scale, drop_thr, keep_scale,
    DROP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """The same for table rows, on the transposed tile (keys down, rows across: s^T = k·qw^T [BN, BM]), so that
    dv += (p keep)^T do and dk += ds^T qw take their left factor as it is, with no transpose of a register tile."""
    bh = b * H + h
    i = i0 + tl.arange(0, BM)
    i = tl.where(i < N, i, N)
    j = j0 + tl.arange(0, BN)
    ok = (j < K)[:, None] & (i < N)[None, :]
    qw = _load_rows(qw_ptr + bh * N * D, i0, N, D, BM, BD)
    do, m, rden, delta, row_key = _row_grads_in(do_ptr, do_r, stats_ptr, delta_ptr, bh, N, D, i, i0, N, BM, BD)
    bias = tl.load(bias_ptr + (bh * P + (i - row0)[None, :]) * K + j[:, None], mask=ok, other=float("-inf"))
    s = tl.dot(k, tl.trans(qw), input_precision="ieee") * (scale * LOG2E) + bias.to(tl.float32)
    p = _exp2(s - m[None, :]) * ((scale * keep_scale) * rden)[None, :]  # p' (as in _dkdv_step)
    dp = tl.dot(v, tl.trans(do), input_precision="ieee")
    if DROP:  # as in _dq_kernel: the keep bits used once
        pd = tl.where(_keep(row_key[None, :], j[:, None], drop_thr), p, 0.0)
        ds = pd * dp - p * delta[None, :]
    else:
        pd = p
        ds = p * (dp - delta[None, :])
    dv += tl.dot(pd.to(do.dtype), do, input_precision="ieee")
    dk += tl.dot(ds.to(qw.dtype), qw, input_precision="ieee")
    return dk, dv


@triton.jit
def _dkdv_kernel(
    qw_ptr, qr_ptr, k_ptr, v_ptr, kr_ptr, bias_ptr, ef_ptr, flags_ptr,
    do_ptr, stats_ptr, delta_ptr, dk_ptr, dv_ptr,
    H, N, K, R, L, D: tl.constexpr, P, GB, n_content, scale, drop_thr, keep_scale,
    kv_b, kv_h, kv_r, do_b, do_h, do_r,
    HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr, DROP: tl.constexpr, HAS_BAND: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """Per key tile: walk the band rows' tiles (HAS_BAND: n_content > 0, then BM == BN), then the table rows'."""
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    g = b // GB
    j0 = tl.program_id(0) * BN
    k = _load_rows(k_ptr + b * kv_b + h * kv_h, j0, K, D, BN, BD, kv_r)
    v = _load_rows(v_ptr + b * kv_b + h * kv_h, j0, K, D, BN, BD, kv_r)
    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BD], tl.float32)
    if HAS_BAND:
        for i0 in range(0, n_content, BM):
            dk, dv = _dkdv_step(dk, dv, k, v, i0, j0, n_content, b, h, g,
                                qw_ptr, qr_ptr, kr_ptr, ef_ptr, flags_ptr, do_ptr + b * do_b + h * do_h, do_r,
                                stats_ptr, delta_ptr, H, N, K, R, L, D, scale, drop_thr, keep_scale,
                                HAS_SEG, HAS_MASK, DROP, BM, BN, BD)  # fmt: skip
    for i0 in range(n_content, N, BM):
        dk, dv = _dkdv_step_t(dk, dv, k, v, i0, j0, n_content, b, h, qw_ptr, bias_ptr, do_ptr + b * do_b + h * do_h,
                              do_r, stats_ptr, delta_ptr, H, N, K, D, P, scale, drop_thr, keep_scale, DROP, BM, BN,
                              BD)  # fmt: skip
    j = j0 + tl.arange(0, BN)
    d = tl.arange(0, BD)
    ok = (j < K)[:, None] & (d < D)[None, :]
    tl.store(dk_ptr + (bh * K + j[:, None]) * D + d[None, :], dk.to(dk_ptr.dtype.element_ty), mask=ok)
    dv = (dv / scale).to(dv_ptr.dtype.element_ty)  # the steps' p' carries 1/sqrt(D)
    tl.store(dv_ptr + (bh * K + j[:, None]) * D + d[None, :], dv, mask=ok)


@triton.jit
def _diag(T, BM: tl.constexpr, BR: tl.constexpr):
    """S[a, c] = T[a, a + c]: a band product [BM, BM+BR] over keys jb .. -> (row a, relative position r0 + c)."""
    a = tl.arange(0, BM)[:, None]
    return tl.gather(T, a + tl.arange(0, BR)[None, :], 1)


@triton.jit
def _dkr_kernel(
    qw_ptr, qr_ptr, k_ptr, v_ptr, kr_ptr, ef_ptr, flags_ptr,
    do_ptr, stats_ptr, delta_ptr, dkr_ptr,
    H, N, K, R, L, D: tl.constexpr, GB, n_content, scale, drop_thr, keep_scale,
    kv_b, kv_h, kv_r, do_b, do_h, do_r,
    HAS_SEG: tl.constexpr, HAS_MASK: tl.constexpr, DROP: tl.constexpr,
    BM: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    """Per tile of BR relative positions of table g, head h: dkr_r = sum over the half's batch rows b and content rows
    i of ds_ij qr_i at key j = i + r - L. In (i, r) space the position product is a plain tile product and the
    content and value products are band products (keys i0 + r0 - L ...) taken on the diagonal."""
    gh = tl.program_id(1)
    g, h = gh // H, gh % H
    r0 = tl.program_id(0) * BR
    r = r0 + tl.arange(0, BR)
    kr = _load_rows(kr_ptr + gh * R * D, r0, R, D, BR, BD)
    dkr = tl.zeros([BR, BD], tl.float32)
    for bb in range(GB):
        b = g * GB + bb
        bh = b * H + h
        for i0 in range(0, n_content, BM):
            i, qw, qr = _row_tile(qw_ptr, qr_ptr, b, h, H, N, D, i0, n_content, BM, BD)
            do_bh = do_ptr + b * do_b + h * do_h
            do, m, rden, delta, rk = _row_grads_in(do_bh, do_r, stats_ptr, delta_ptr, bh, N, D, i, i0, n_content, BM,
                                                   BD)  # fmt: skip
            j = i[:, None] + r[None, :] - L
            ok = (i < N)[:, None] & (j >= 0) & (j < K) & (r < R)[None, :]
            j = tl.where(ok, j, 0)
            kb = _load_rows(k_ptr + b * kv_b + h * kv_h, i0 + r0 - L, K, D, BM + BR, BD, kv_r)
            s = _diag(tl.dot(qw, tl.trans(kb), input_precision="ieee"), BM, BR)
            s += tl.dot(qr, tl.trans(kr), input_precision="ieee")
            bias, _ = _bias(tl.zeros([BM, BR], tl.float32), b, bh, i[:, None], j, ok, ef_ptr, flags_ptr, N, K,
                            scale * LOG2E, HAS_SEG, HAS_MASK)  # fmt: skip
            s = s * (scale * LOG2E) + bias
            p = _exp2(s - m[:, None]) * ((scale * keep_scale) * rden[:, None])  # p' (as in _dq_kernel)
            vb = _load_rows(v_ptr + b * kv_b + h * kv_h, i0 + r0 - L, K, D, BM + BR, BD, kv_r)
            dp = _diag(tl.dot(do, tl.trans(vb), input_precision="ieee"), BM, BR)
            if DROP:  # as in _dq_kernel
                ds = tl.where(_keep(rk[:, None], j, drop_thr), p, 0.0) * dp - p * delta[:, None]
            else:
                ds = p * (dp - delta[:, None])
            dkr += tl.dot(tl.trans(ds).to(qr.dtype), qr, input_precision="ieee")
    d = tl.arange(0, BD)
    tl.store(dkr_ptr + (gh * R + r[:, None]) * D + d[None, :], dkr, mask=(r < R)[:, None] & (d < D)[None, :])


# ----------------------------------------------------------------------------------------------------------------
# Launchers and the custom op


# Per kernel on a GPU: (BM rows and BN keys of a tile; warps; software-pipelining stages of the loop, 3 = Triton's
# default on NVIDIA). Band rows take BN = BM (BM + BN, the band's rows, must be a power of two; dkr: BR = BM).
# Measured on an H200 (benchmarks/gpu_attention.py, Base shapes, per kernel its fastest of 7 tiles, BENCHMARKS.md
# run 4): forward 64 x 64 x 4 warps (wgmma), dq 64 x 64 x 4, dk/dv (the transposed tile) 32 x 64 x 4. dq now runs
# 64 x 32 (0.264 ms against 0.254 on the H200, 0.288 both on an H100, before it wrote the table's gradient itself):
# its rel-shifted store takes a 64-bit address per entry, and at 64 x 64 the kernel spilled (triton_resources.py).
GPU_TILES = {
    "bias": (32, 128, 4, 1),  # _bias_kernel on table rows: a streaming pass, no loop
    "bias band": (64, 64, 4, 1),  # _bias_kernel on content rows: one band product and skew per tile (BN = BM)
    "fwd": (64, 64, 4, 3),
    "dq": (64, 32, 4, 3),
    "dkdv": (32, 64, 4, 3),
    "band": (32, 32, 4, 3),  # every launch with band rows (CONTENT_POSITIONS "band"; BN = BM): 64 rows spill
    "dkr": (32, 32, 8, 3),
}
# Where the content rows' position scores come from: "table" (the bias tensor, like the query rows': made by the
# band product inside _bias_kernel, its gradient through the table qr·kr^T) or "band" (the kr band multiplied and
# skewed inside each tile: no [N, R] or [N, K] tensor, but two extra tile products, a gather and a dkr kernel). On
# an H200 at Base shapes the table was faster (forward + backward 3.2 ms against 7.2, BENCHMARKS.md, when the content
# rows' forward read the table too) for 0.8 GiB more memory per layer call (less now: that forward table is gone).
CONTENT_POSITIONS = "table"
# With "table": where the forward takes the content rows' position term for their bias: "band" (a band product inside
# _bias_kernel) or "table" (read from the forward table qr·kr^T, which then covers them: [B,H,L,R] more written and
# read; what ran before, kept so that a GPU benchmark times both in the same call).
CONTENT_BIAS = "band"


INTERPRETER_TILE = (16, 16)  # (BM, BN) under the interpreter, whose cost grows with the tile


def _blocks(device: torch.device, D: int, kernel: str) -> tuple[int, int, int, dict]:
    """(BM, BN, BD, launch options) of ``kernel`` ("band" and "bias band": BN = BM)."""
    bm, bn, warps, stages = GPU_TILES[kernel] if device.type == "cuda" else (*INTERPRETER_TILE, 1, 1)
    bn = bm if kernel in ("band", "bias band") else bn
    return bm, bn, max(16, 1 << (D - 1).bit_length()), dict(num_warps=warps, num_stages=stages)


# The launchers' host code runs once per layer and direction, every step: plain integer maths (triton.cdiv and
# next_power_of_2 are constexpr functions, microseconds a call from Python), and an absent input's pointer is that of
# a present tensor of the same dtype, never read (its kernel is compiled without the branch that would): no
# allocation, nothing kept between calls, so a CUDA graph can capture the call.
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _or_dummy(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return like if t is None else t


def _shapes(qw, k, kr, n_content: int):
    B, H, N, D = qw.shape
    G, _, R, _ = kr.shape
    return B, H, N, D, k.shape[2], G, R, N - n_content


def _rows_per_table(qr: torch.Tensor, G: int, n_before: int) -> torch.Tensor:
    """The rows of qr from ``n_before`` on laid out per (table, head): [G, H, B/G·P, D], one matrix per factor of a
    batched product with kr [G, H, R, D] (table g serves the g-th B/G of the batch)."""
    B, H, N, D = qr.shape
    P = N - n_before
    return qr[:, :, n_before:].reshape(G, B // G, H, P, D).transpose(1, 2).reshape(G, H, B // G * P, D)


def _table(qr: torch.Tensor, kr: torch.Tensor, n_before: int) -> torch.Tensor | None:
    """The position scores of the rows from ``n_before`` on, qr·kr^T [G, H, B/G·P, R] in qr's dtype
    (_rows_per_table's layout: one strided batched product, kr never broadcast over the batch); None when there are
    none."""
    if qr.shape[2] == n_before:
        return None
    return torch.matmul(_rows_per_table(qr, kr.shape[0], n_before), kr.transpose(-1, -2))


def _kv_strides(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as the kernels read them: rows of D contiguous elements, both with the same strides (the layer's
    views of one [B,K,2,H,D] projection are; anything else is copied to [B,H,K,D])."""
    if k.stride() == v.stride() and k.stride(-1) == 1:
        return k, v
    return k.contiguous(), v.contiguous()


def _strides(*ts: torch.Tensor) -> tuple[int, ...]:
    """The (batch, head, row) strides of each of ``ts`` [B,H,rows,D] (k's stand for v's: the same), as the kernels
    take them."""
    return tuple(n for t in ts for n in t.stride()[:3])


def _forward(qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content, n_table, p_drop, seed):
    k, v = _kv_strides(k, v)  # read in place when they allow it (the layer's views do), else copied
    B, H, N, D, K, G, R, P = _shapes(qw, k, kr, n_content)
    bias = _table_bias(qr, kr, ef, rows, flags, has_mask, L, n_content, n_table, K)
    out = torch.empty_like(qw)
    stats = torch.empty(B, H, N, 3, dtype=torch.float32, device=qw.device)
    thr, keep_scale = dropout_threshold(p_drop)
    ins = (qw, qr, k, v, kr, _or_dummy(bias, qw), _or_dummy(ef, qw), _or_dummy(flags, rows))
    for query, row0, row_end in ((False, 0, n_content), (True, n_content, N)):
        BM, BN, BD, launch = _blocks(qw.device, D, "fwd" if query else "band")
        if row_end > row0:
            _fwd_kernel[(_cdiv(row_end - row0, BM), B * H)](
                *ins, out, stats, H, N, K, R, L, D, P, B // G, row0, row_end, 1.0 / math.sqrt(D), seed, thr,
                keep_scale, *_strides(k), QUERY=query, HAS_SEG=ef is not None, HAS_MASK=has_mask, DROP=thr > 0,
                BM=BM, BN=BN, BD=BD, **launch,
            )  # fmt: skip
    return out, stats, qw.new_zeros(1) if bias is None else bias  # an output: its own tensor


def _backward(do, out, stats, bias, qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content, p_drop):
    k, v = _kv_strides(k, v)
    B, H, N, D, K, G, R, P = _shapes(qw, k, kr, n_content)
    f32 = dict(dtype=torch.float32, device=qw.device)
    thr, keep_scale = dropout_threshold(p_drop)
    delta = torch.empty(B, H, N, **f32)  # delta' per row: _dq_kernel writes it, the others read it
    # every gradient in its input's dtype: the kernels accumulate in fp32 and round once, to nearest even on a GPU as a
    # cast after would (Triton's CPU interpreter truncates instead)
    new = lambda t: torch.empty(t.shape, dtype=t.dtype, device=t.device)  # noqa: E731 - [B,H,rows,D] row-major
    dqw, dqr = new(qw), new(qr)
    GB = B // G
    dt = torch.empty(G, H, GB * P, R, dtype=qw.dtype, device=qw.device) if P else None  # dq writes every entry
    def_ = torch.empty(B, H, N, 2, **f32) if ef is not None else None
    dk, dv = new(k), new(v)  # row-major whatever k's and v's layout
    dkr = torch.empty(G, H, R, D, **f32) if n_content else None  # every entry: _dkr_kernel, else the table's product
    d_flags = _or_dummy(flags, rows)
    ins = (qw, qr, k, v, kr, bias, _or_dummy(ef, qw), d_flags)
    opts = dict(HAS_SEG=ef is not None, HAS_MASK=has_mask, DROP=thr > 0)
    drop = (thr, keep_scale)
    scale = 1.0 / math.sqrt(D)
    for query, row0, row_end in ((False, 0, n_content), (True, n_content, N)):
        BM, BN, BD, launch = _blocks(qw.device, D, "dq" if query else "band")
        if row_end > row0:
            _dq_kernel[(_cdiv(row_end - row0, BM), B * H)](
                *ins, do, out, stats, delta, dqw, dqr, _or_dummy(dt, qw), _or_dummy(def_, qw), rows,
                H, N, K, R, L, D, P, GB, row0, row_end, scale, *drop, *_strides(k, do), QUERY=query, **opts,
                BM=BM, BN=BN, BD=BD, **launch,
            )  # fmt: skip
    BM, BN, BD, launch = _blocks(qw.device, D, "band" if n_content else "dkdv")
    _dkdv_kernel[(_cdiv(K, BN), B * H)](
        *ins, do, stats, delta, dk, dv, H, N, K, R, L, D, P, B // G, n_content, scale, *drop, *_strides(k, do), **opts,
        HAS_BAND=n_content > 0, BM=BM, BN=BN, BD=BD, **launch,
    )  # fmt: skip
    if n_content:
        BM, _, BD, launch = _blocks(qw.device, D, "dkr")
        _dkr_kernel[(_cdiv(R, BM), G * H)](
            qw, qr, k, v, kr, _or_dummy(ef, qw), d_flags, do, stats, delta, dkr,
            H, N, K, R, L, D, B // G, n_content, scale, *drop, *_strides(k, do), **opts,
            BM=BM, BR=BM, BD=BD, **launch,
        )  # fmt: skip
    if dt is not None:  # the table's gradient (dq wrote it) to its two factors
        # one strided copy from the product's [G, H, B/G, P, D] into dqr's table rows (a reshape first would copy twice)
        dqr[:, :, n_content:].view(G, GB, H, P, D).copy_(torch.matmul(dt, kr).view(G, H, GB, P, D).transpose(1, 2))
        dkr_t = torch.matmul(dt.transpose(-1, -2), _rows_per_table(qr, G, n_content))
        dkr = dkr_t if dkr is None else dkr.add_(dkr_t)  # band rows' fp32 sum, then the table's
    return dqw, dqr, dk, dv, None if dkr is None else dkr.to(kr.dtype), def_


def _table_bias(qr, kr, ef, rows, flags, has_mask: bool, L: int, n_band: int, n_table: int, K: int):
    """The bias [B,H,N - n_band,K] of the rows after the band rows (_bias_kernel, _bias_dtype; None when every row
    takes the band): the position term, the segment term, / sqrt(D), NEG_INF where masked. The position term of
    the content rows before ``n_table`` comes from the band product inside the kernel; that of the rows from
    ``n_table`` on (the query stream) from the table qr·kr^T at column L - pos + j, so that no [B,H,L,R] table is
    written for the content rows."""
    B, H, N, D = qr.shape
    if n_band == N:
        return None
    G, R, P = kr.shape[0], kr.shape[2], N - n_band
    bias = torch.empty(B, H, P, K, dtype=_bias_dtype(qr.dtype), device=qr.device)
    bdq = _table(qr, kr, n_table)
    for band, start, end in ((True, n_band, n_table), (False, n_table, N)):
        BM, BN, BD, launch = _blocks(qr.device, D, "bias band" if band else "bias")
        if end > start:
            _bias_kernel[(_cdiv(end - start, BM), _cdiv(K, BN), B * H)](
                _or_dummy(bdq, qr), qr, kr, _or_dummy(ef, qr), _or_dummy(flags, rows), rows, bias, H, N, K, R, L, D,
                P, B // G, n_band, start, end, n_table, 1.0 / math.sqrt(D), BAND=band, HAS_SEG=ef is not None,
                HAS_MASK=has_mask, BM=BM, BN=BN, BD=BD, **launch,
            )  # fmt: skip
    return bias


def _bias_dtype(dtype: torch.dtype) -> torch.dtype:
    """The bias's dtype: bf16 for bf16 inputs, else fp32 (fp16 cannot hold NEG_INF = -1e30)."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def dropout_threshold(p: float) -> tuple[int, float]:
    """Attention dropout's 24-bit threshold t = round(p·2^24) (a key is kept when its 32-bit hash >= t·2^8) and the
    matching scale 1 / (1 - t/2^24); (0, 1.0) without dropout."""
    t = min(round(p * 2**24), 2**24 - 1)
    return t, 1.0 / (1.0 - t / 2**24)


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x · c) mod 2^32 for uint32 values held in int64, in two 16-bit halves of c (no int64 overflow)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _hash_torch(x: torch.Tensor) -> torch.Tensor:
    """_hash (lowbias32) on int64 tensors holding uint32 values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_keep_mask(seed: int, shape: tuple[int, int, int, int], p: float, device) -> torch.Tensor:
    """The kernels' dropout keep mask [B,H,N,K] (bool), computed by torch: for tests and debug_keep."""
    B, H, N, K = shape
    thr, _ = dropout_threshold(p)
    row = _hash_torch(_hash_torch(torch.arange(B * H * N, device=device) & _M32) ^ seed)
    h = _hash_torch((row[:, None] + torch.arange(K, device=device)) & _M32)
    return (h >= thr << 8).view(B, H, N, K)


# The ops' names carry their schema's version: inductor's on-disk cache keys a compiled graph on the ops' names, so a
# changed signature under the same name replays graphs written for the old one. Bump both when the schema changes.
@torch.library.custom_op("xlnet::rel_attn_v3", mutates_args=())
def rel_attn(
    qw: torch.Tensor,
    qr: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kr: torch.Tensor,
    ef: torch.Tensor | None,
    rows: torch.Tensor,
    flags: torch.Tensor | None,
    has_mask: bool,
    L: int,
    n_content: int,
    n_table: int,
    p_drop: float,
    seed: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused core on prepared inputs (see triton_rel_attention): (out [B,H,N,D], stats [B,H,N,3] fp32 (the
    softmax's row max in log2 units, 1 / its sum, the row's dropout key as bits), the table rows' bias [B,H,P,K]
    (_bias_dtype; [1] without table rows): made once here and read again by backward)."""
    return _forward(qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content, n_table, p_drop, seed)


@rel_attn.register_fake
def _(qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content, n_table, p_drop, seed):
    B, H, N, _ = qw.shape
    P = N - n_content
    return (
        torch.empty_like(qw),
        qw.new_empty(B, H, N, 3, dtype=torch.float32),
        qw.new_empty((B, H, P, k.shape[2]) if P else (1,), dtype=_bias_dtype(qw.dtype) if P else qw.dtype),
    )


@torch.library.custom_op("xlnet::rel_attn_v3_backward", mutates_args=())
def rel_attn_backward(
    do: torch.Tensor,
    out: torch.Tensor,
    stats: torch.Tensor,
    bias: torch.Tensor,
    qw: torch.Tensor,
    qr: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kr: torch.Tensor,
    ef: torch.Tensor | None,
    rows: torch.Tensor,
    flags: torch.Tensor | None,
    has_mask: bool,
    L: int,
    n_content: int,
    p_drop: float,
) -> list[torch.Tensor]:
    """Gradients of qw, qr, k, v, kr, ef, each in its input's dtype (ef's [0] fp32 when absent)."""
    do = do if do.stride(-1) == 1 else do.contiguous()  # read in place: the o projection's gradient, viewed per head
    grads = _backward(do, out, stats, bias, qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content, p_drop)
    return [qw.new_zeros(0, dtype=torch.float32) if g is None else g for g in grads]


@rel_attn_backward.register_fake
def _(do, out, stats, bias, qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content, p_drop):
    f = lambda t: qw.new_empty((0,), dtype=torch.float32) if t is None else t.new_empty(t.shape)  # noqa: E731
    return [f(t) for t in (qw, qr, k, v, kr, ef)]


def _setup_context(ctx, inputs, output):
    qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content, _, p_drop, _ = inputs
    out, stats, bias = output
    ctx.save_for_backward(out, stats, bias, qw, qr, k, v, kr, ef, rows, flags)
    ctx.args = (has_mask, L, n_content, p_drop)


def _rel_attn_grad(ctx, dout, _dstats, _dbias):
    out, stats, bias, qw, qr, k, v, kr, ef, rows, flags = ctx.saved_tensors
    has_mask, L, n_content, p_drop = ctx.args
    grads = rel_attn_backward(dout, out, stats, bias, qw, qr, k, v, kr, ef, rows, flags, has_mask, L, n_content,
                              p_drop)  # fmt: skip
    ins = (qw, qr, k, v, kr, ef)
    dqw, dqr, dk, dv, dkr, def_ = (None if t is None else g for g, t in zip(grads, ins, strict=True))
    return dqw, dqr, dk, dv, dkr, def_, None, None, None, None, None, None, None, None


rel_attn.register_autograd(_rel_attn_grad, setup_context=_setup_context)


def triton_rel_attention(
    q, k, v, kr, biases, seg_embed, rows, L: int, content: bool, flags, has_mask: bool, p_drop: float, debug_keep=False
):
    """kernels.relative_attention's arguments -> (out [B,H,N,D], keep mask [B,H,N,K] bool or None (debug_keep)).

    Torch ops add the biases (qw = q + r_w, qr = q + r_r) and compute the two segment scalars per row ef =
    (q + r_s)·seg_embed [B,H,N,2]; autograd carries the op's gradients of these back to q, the biases and seg_embed.
    ``content``: the first L rows are the content stream (positions 0..L-1); the rest are query rows at ``rows``.
    ``flags`` [B,1,N,K] uint8: kernels.mask_flags of the mask (``has_mask``) and the same-segment bits (used when
    ``seg_embed`` is given). The content rows take their position scores from the bias (made from a band product
    in _bias_kernel; their gradient goes through the table), or from the band inside the attention kernels with
    CONTENT_POSITIONS "band"."""
    r_w, r_r, r_s = biases
    n_band = L if content and CONTENT_POSITIONS == "band" else 0
    n_table = L if content and (n_band or CONTENT_BIAS == "band") else 0  # rows before: no forward table
    ct = torch.get_autocast_dtype(q.device.type) if torch.is_autocast_enabled(q.device.type) else q.dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, kr, r_w, r_r = (t.to(ct) for t in (q, k, v, kr, r_w, r_r))
        qw, qr = (q + r_w[:, None]).contiguous(), (q + r_r[:, None]).contiguous()
        ef = None
        if seg_embed is not None:
            ef = torch.matmul(q + r_s.to(ct)[:, None], seg_embed.to(ct).permute(1, 2, 0)).float().contiguous()
        flags = None if flags is None else flags[:, 0].contiguous()  # [B,N,K], shared by the heads
        # drawn on the device (no host value: a CUDA graph replays the draw); without dropout never read
        i32 = dict(dtype=torch.int32, device=q.device)
        seed = torch.randint(0, 2**31 - 1, (), **i32) if p_drop > 0 else torch.zeros((), **i32)
        out, _, _ = rel_attn(
            qw, qr, k, v, kr.contiguous(), ef, rows.to(torch.int32).contiguous(),
            flags, has_mask, L, n_band, n_table, float(p_drop), seed,
        )  # fmt: skip
    if not (debug_keep and p_drop > 0):
        return out, None
    return out, hash_keep_mask(int(seed), (*q.shape[:3], k.shape[2]), p_drop, q.device)
