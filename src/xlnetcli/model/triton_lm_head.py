"""The LM head's cross entropy as two Triton kernels (lm_head._LMHeadLoss uses them where the attention core is
``triton``): each reads the [n, V] logits once, in their own dtype, and does every element-wise step of the loss in
registers.

- ``lse_and_label``: per row, an online log-sum-exp over the vocabulary (running max and rescaled sum, in fp32, as
  FlashAttention's softmax) and the logit of the row's label: forward's only pass over the logits.
- ``ce_grad``: g = (softmax - onehot(label)) · coef (+ the logits' own gradient, when they are used) in the logits'
  dtype, and the bias's gradient sum_i g_ij in fp32. One program per tile of vocabulary columns walks every row in
  a fixed order: no atomics, the same bits at every run. dx = g W and dW = g^T x are then two cuBLAS products.

What they replace (lm_head._LMHeadLoss's torch path, which runs wherever the attention core is not triton, and for
fp64): per block of 4096 columns a recomputed logits block, then a cast, a subtraction, an exponential, a one-hot
update, a scaling and a column sum, each a pass over the block in fp32 in its own kernel. Here the logits are kept
from forward instead of recomputed (they are an output anyway: [n, V] in the compute dtype, 87 MB at Base micro 16
with V = 32000).

The kernels run on CUDA, or on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, read when this module is
imported; tests)."""

import torch
import triton
import triton.language as tl

FLOAT_MIN = tl.constexpr(-3.0e38)  # the running max's start: finite, so that exp(m - m_new) is never exp(nan)
LSE_COLS = 2048  # vocabulary columns per step of lse_and_label's row loop
GRAD_TILE = (32, 128)  # ce_grad's (rows per step, vocabulary columns per program)
LAUNCH = dict(num_warps=4, num_stages=3)  # both kernels (Triton's defaults on CUDA, stated for triton_resources.py)


@triton.jit
def _lse_kernel(logits_ptr, lab_ptr, lse_ptr, picked_ptr, V, stride, BV: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    m = FLOAT_MIN  # the running max and the sum of exp(x - m) so far
    s = 0.0
    for c0 in range(0, V, BV):
        cols = c0 + tl.arange(0, BV)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    tl.store(lse_ptr + row, m + tl.log(s))
    tl.store(picked_ptr + row, tl.load(base + tl.load(lab_ptr + row)).to(tl.float32))


@triton.jit
def _grad_kernel(
    logits_ptr, lse_ptr, lab_ptr, coef_ptr, glog_ptr, g_ptr, db_ptr, n, V, stride,
    HAS_GLOG: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    cm = cols < V
    db = tl.zeros([BN], tl.float32)
    for r0 in range(0, n, BM):
        rows = r0 + tl.arange(0, BM)
        rm = rows < n
        lse = tl.load(lse_ptr + rows, mask=rm, other=0.0)
        lab = tl.load(lab_ptr + rows, mask=rm, other=-1)
        coef = tl.load(coef_ptr + rows, mask=rm, other=0.0)
        ok = rm[:, None] & cm[None, :]
        offs = rows[:, None].to(tl.int64) * stride + cols[None, :]
        x = tl.load(logits_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        onehot = tl.where(cols[None, :] == lab[:, None], 1.0, 0.0)
        g = (tl.exp(x - lse[:, None]) - onehot) * coef[:, None]
        if HAS_GLOG:
            g += tl.load(glog_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        g = tl.where(ok, g, 0.0)
        tl.store(g_ptr + offs, g.to(g_ptr.dtype.element_ty), mask=ok)
        db += tl.sum(g, 0)
    tl.store(db_ptr + cols, db, mask=cm)


def lse_and_label(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-sum-exp of each row of ``logits`` [n, V], the logit at each row's label [n]), both fp32. ``labels`` [n]
    int64 in [0, V) (an ignored row's label clamped to 0 by the caller; not checked here: the records' token ids
    are, when preprocess writes them)."""
    n, V = logits.shape
    logits = logits.contiguous()
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    picked = torch.empty_like(lse)
    if n:
        bv = min(LSE_COLS, triton.next_power_of_2(V))
        _lse_kernel[(n,)](logits, labels, lse, picked, V, logits.stride(0), BV=bv, **LAUNCH)
    return lse, picked


def ce_grad(
    logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, coef: torch.Tensor, g_logits: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g = (softmax(logits) - onehot(labels)) · coef[:, None] (+ g_logits) [n, V] in the logits' dtype, the bias's
    gradient g.sum(0) in fp32, summed before g is rounded). ``coef`` [n] fp32: each row's weight times the loss's
    gradient (0 for an ignored row)."""
    n, V = logits.shape
    logits = logits.contiguous()
    g = torch.empty_like(logits)
    db = torch.empty(V, dtype=torch.float32, device=logits.device)
    glog = logits if g_logits is None else g_logits.contiguous()  # never read without HAS_GLOG
    BM, BN = GRAD_TILE
    _grad_kernel[(triton.cdiv(V, BN),)](
        logits, lse, labels, coef, glog, g, db, n, V, logits.stride(0), HAS_GLOG=g_logits is not None, BM=BM, BN=BN,
        **LAUNCH,
    )  # fmt: skip
    return g, db
