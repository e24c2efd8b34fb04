"""Model-test helpers shared by tests/model/ and test_gpu.py: a tiny config, a pretraining-style batch built
independently of the data pipeline (docs/xlnet.md §5), and a pair of identical models."""

from __future__ import annotations

import numpy as np
import torch

from xlnetcli.model import XLNetLMHeadModel, named_config

TOL = 1e-5  # max abs difference allowed in float32 parity checks
V, L, R = 60, 16, 8  # vocab, seq_len, reuse_len


def tiny_cfg(**kw):
    base = dict(
        vocab_size=V,
        d_model=32,
        n_layer=2,
        n_head=4,
        d_head=8,
        d_inner=64,
        dropout=0.0,
        dropatt=0.0,
        mem_len=12,
        reuse_len=R,
        bi_data=False,
        clamp_len=-1,
        attn_impl="einsum",
    )
    base.update(kw)
    return named_config("tiny", **base)


def local_perm(tokens, is_masked, is_func, rng):
    """The factorisation-order mask of one part (the original _local_perm), written independently of
    data/records/stream.py."""
    n = len(tokens)
    rank = np.empty(n, dtype=np.int64)
    rank[rng.permutation(n)] = np.arange(n)
    nonmask = ~is_masked & ~is_func
    mof = is_masked | is_func
    rev = np.where(nonmask, -1, rank)
    tgt = is_masked & ~is_func
    self_rev = np.where(tgt, rev, rev + 1)
    return (self_rev[:, None] <= rev[None, :]) & mof[None, :]


def plm_batch(B, P, rng, seg=True, pad=True):
    """A pretraining-style batch: [reuse | A <sep> B <sep> <cls>] with perm_mask and target_mapping (padded rows)."""
    ids = rng.integers(9, V, size=(B, L))
    ids[:, -1], ids[:, -2] = 3, 4  # <cls>, <sep>
    ids[:, 12] = 4
    tt = np.zeros((B, L), dtype=np.int64)
    tt[:, 13:15] = 1
    tt[:, -1] = 2
    perm = np.zeros((B, L, L), dtype=np.float32)
    tmap = np.zeros((B, P, L), dtype=np.float32)
    for b in range(B):
        func = (ids[b] == 3) | (ids[b] == 4)
        masked = np.zeros(L, dtype=bool)
        cand = [i for i in range(L) if not func[i]]
        n_t = P - (b % 2 if pad else 0)  # odd rows leave one zero padding row in target_mapping
        masked[rng.choice(cand, n_t, replace=False)] = True
        pm = np.ones((L, L), dtype=bool)
        pm[:R, :R] = local_perm(ids[b, :R], masked[:R], func[:R], rng)
        pm[R:, R:] = local_perm(ids[b, R:], masked[R:], func[R:], rng)
        pm[R:, :R] = False  # the second part sees the whole reuse part
        perm[b] = pm
        for k, pos in enumerate(np.flatnonzero(masked)):
            tmap[b, k, pos] = 1.0
    t = lambda x, dt=torch.float32: torch.tensor(x, dtype=dt)  # noqa: E731
    return t(ids, torch.long), (t(tt, torch.long) if seg else None), t(perm), t(tmap)


def maxdiff(a, b):
    return (a - b).abs().max().item()


def twins(c):
    """Two identical models of config ``c`` in train mode."""
    torch.manual_seed(0)
    a = XLNetLMHeadModel(c).train()
    b = XLNetLMHeadModel(c).train()
    b.load_state_dict(a.state_dict())
    return a, b
