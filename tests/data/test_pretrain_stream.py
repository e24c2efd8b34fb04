"""Online factorisation order (original _local_perm) and the PretrainStream (docs/xlnet.md §5)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from clitools import preprocess_cfg
from hypothesis import given, settings
from hypothesis import strategies as st

from xlnetcli.core.errors import CheckpointError, ConfigError
from xlnetcli.data.records.format import row_source, stored_rows
from xlnetcli.data.records.stream import (
    PretrainStream,
    make_perm_mask,
    perm_mask_from_ranks,
    permutation_batch,
    ranks_from_order,
    sample_order,
    target_mapping,
    targets,
)
from xlnetcli.data.special import CLS_ID, SEP_ID


def dense_reference(ids, masked, rank, R):
    """perm_mask [L, L] written straight from the original formulas, part by part, then the block layout."""
    L = len(ids)

    def local(tok, sel, idx):
        n = len(tok)
        out = np.zeros((n, n), np.float32)
        for i in range(n):
            for j in range(n):
                func_j = tok[j] in (SEP_ID, CLS_ID)
                nonmask = [not sel[k] and tok[k] not in (SEP_ID, CLS_ID) for k in range(n)]
                rev = [-1 if nonmask[k] else idx[k] for k in range(n)]
                tgt_i = sel[i] and tok[i] not in (SEP_ID, CLS_ID)
                self_rev = rev[i] if tgt_i else rev[i] + 1
                mof_j = sel[j] or func_j
                out[i, j] = float(self_rev <= rev[j] and mof_j)
        return out

    pm = np.ones((L, L), np.float32)
    pm[:R, :R] = local(ids[:R], masked[:R], rank[:R])
    pm[R:, :R] = 0.0
    pm[R:, R:] = local(ids[R:], masked[R:], rank[R:])
    return pm


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([(8, 4, 2), (8, 4, 4), (12, 6, 3), (10, 4, 2)]), st.floats(0.0, 0.6))
def test_fast_perm_mask_matches_dense_reference(seed, lrp, p_sel):
    L, R, P = lrp
    rng = np.random.default_rng(seed)
    B = 3
    ids = rng.integers(9, 30, (B, L))
    ids[:, L - 1] = CLS_ID
    ids[:, rng.integers(0, L, B)] = SEP_ID
    masked = rng.random((B, L)) < p_sel
    rank = sample_order(seed, 7, np.arange(B), R, L, P)
    q, k, tgt = ranks_from_order(ids, masked, rank, R)
    fast = perm_mask_from_ranks(q, k)
    for b in range(B):
        ref = dense_reference(ids[b], masked[b], rank[b], R)
        assert (fast[b] == (ref > 0)).all()
    # invariants of the mask
    func = (ids == SEP_ID) | (ids == CLS_ID)
    ctx = ~masked & ~func
    for b in range(B):
        m = fast[b]
        part = np.arange(L) >= R
        same = part[:, None] == part[None, :]
        # context tokens see all context tokens of their part (themselves included), never a target or func token
        assert not m[np.ix_(ctx[b], ctx[b])][same[np.ix_(ctx[b], ctx[b])]].any()
        assert m[np.ix_(ctx[b], ~ctx[b])][same[np.ix_(ctx[b], ~ctx[b])]].all()
        # a target never sees itself (query stream); func tokens see themselves
        assert m[tgt[b], tgt[b]].all() and not m[func[b], func[b]].any()
        # the reuse part never sees the second part; the second part sees all of the reuse part
        assert m[:R, R:].all() and not m[R:, :R].any()
        # targets see exactly the selected/func tokens earlier in the order of their part
        for i in np.flatnonzero(tgt[b]):
            for j in np.flatnonzero(~ctx[b] & same[i]):
                assert m[i, j] == (rank[b, j] >= rank[b, i])


def test_order_is_blockwise_permutation_and_reproducible():
    rows = np.array([3, 5, 11])
    r = sample_order(42, 9, rows, 8, 24, 4)
    for b in range(3):
        assert sorted(r[b, :8]) == list(range(8)) and sorted(r[b, 8:]) == list(range(16))
        # blocks are ordered: block k holds ranks [k*P, (k+1)*P) with the same within-block order (original)
        assert (r[b, 8:12] // 4 == 0).all() and (r[b, 20:24] // 4 == 3).all()
        assert (r[b, 12:16] - 4 == r[b, 8:12]).all()
    # a pure function of (seed, step, row): independent of which other rows share the batch
    assert (sample_order(42, 9, np.array([5]), 8, 24, 4)[0] == r[1]).all()
    assert not (sample_order(42, 10, rows, 8, 24, 4) == r).all()
    assert not (sample_order(43, 9, rows, 8, 24, 4) == r).all()
    # uniform: position 0 of a part takes every rank about equally often
    many = sample_order(0, 0, np.arange(4000), 4, 8, 4)
    assert np.bincount(many[:, 0], minlength=4) / 4000 == pytest.approx([0.25] * 4, abs=0.03)


def test_targets_and_mapping():
    tgt = np.zeros((2, 10), bool)
    tgt[0, [7, 2, 5]] = True
    ids = np.arange(20).reshape(2, 10) + 10
    t = targets(tgt, ids, 4)
    assert t["target_index"][0].tolist() == [2, 5, 7, 0] and t["label_mask"][0].tolist() == [1, 1, 1, 0]
    assert t["labels"][0].tolist() == [12, 15, 17, 0] and not t["label_mask"][1].any()
    tm = target_mapping(torch.from_numpy(t["target_index"]), torch.from_numpy(t["label_mask"]), 10)
    assert tm[0, :3].argmax(-1).tolist() == [2, 5, 7] and tm[0, 3].sum() == 0 and tm[1].sum() == 0


def test_make_perm_mask_helper():
    ids = torch.randint(9, 100, (2, 16))
    sel = torch.zeros(2, 16, dtype=torch.bool)
    sel[:, [1, 4, 9, 13]] = True
    pm, tgt = make_perm_mask(ids, sel, reuse_len=8)
    assert pm.shape == (2, 16, 16) and pm.dtype == torch.float32 and (tgt == sel).all()
    assert pm[:, :8, 8:].eq(1).all() and pm[:, 8:, :8].eq(0).all() and pm[:, [1, 4], [1, 4]].eq(1).all()
    pm0, _ = make_perm_mask(ids, sel, reuse_len=0)
    assert pm0.diagonal(dim1=1, dim2=2)[sel].eq(1).all()


def test_stream_batches(records):
    s = PretrainStream(records, "train", 0, 1, 4, seed=5)
    assert s.accumulation == 2
    it = iter(s)
    b = next(it)
    B, L, P = 4, 64, 11
    assert b["input_ids"].shape == (B, L) and b["input_ids"].dtype == torch.long
    assert b["token_type_ids"].shape == (B, L) and b["perm_mask"].shape == (B, L, L)
    assert b["perm_mask"].dtype == torch.float32 and b["target_mapping"].shape == (B, P, L)
    assert b["target_index"].shape == (B, P) and b["labels"].shape == (B, P) and b["label_mask"].shape == (B, P)
    assert b["is_target"].shape == (B, L) and b["micro_index"] == 0
    # labels are the input tokens themselves at the targets (no <mask> replacement, no shifting)
    got = torch.gather(b["input_ids"], 1, b["target_index"])
    assert ((got == b["labels"]) | (b["label_mask"] == 0)).all()
    assert (b["target_mapping"].sum(-1) == b["label_mask"]).all()
    assert (b["label_mask"].sum(1) <= P).all() and b["label_mask"].sum(1).float().mean() > 0.9 * P
    assert (b["perm_mask"] == perm_mask_from_ranks(b["perm_q_rank"], b["perm_k_rank"]).float()).all()
    b2 = next(it)
    assert b2["micro_index"] == 1 and b2["step"] == 0 and next(it)["step"] == 1
    assert s.state_dict()["step"] == 1 and s.state_dict()["micro"] == 1


def test_stream_rank_world_slicing_resume_and_prefetch(records):
    one = PretrainStream(records, "train", 0, 1, 4, seed=5)
    r1 = PretrainStream(records, "train", 1, 2, 4, seed=5)
    a = one.batch(3, 1)
    b = r1.batch(3, 0)  # rank 1 of 2 reads the rows that micro-batch 1 reads on one process
    for key in ("input_ids", "perm_mask", "target_index", "labels"):
        assert torch.equal(a[key], b[key])
    # exact resume: 5 batches, save, 5 more == 10 uninterrupted (with and without prefetch)
    ref = [
        x["perm_q_rank"]
        for _, x in zip(range(10), PretrainStream(records, "train", 0, 1, 4, seed=5, prefetch=0), strict=False)
    ]
    s = PretrainStream(records, "train", 0, 1, 4, seed=5)
    first = [x["perm_q_rank"] for _, x in zip(range(5), s, strict=False)]
    state = s.state_dict()
    s2 = PretrainStream(records, "train", 0, 1, 4, seed=5)
    s2.load_state_dict(state)
    rest = [x["perm_q_rank"] for _, x in zip(range(5), s2, strict=False)]
    assert all(torch.equal(x, y) for x, y in zip(first + rest, ref, strict=True))
    # memory needs consecutive text: step s+1 of a forward row starts where step s's reuse part ended
    x0, x1 = one.batch(0, 0)["input_ids"], one.batch(1, 0)["input_ids"]
    R = 32
    tt = one.batch(0, 0)["token_type_ids"]
    alen = int((tt[0] == 0).sum()) - R - 1
    n = min(alen, R)
    assert torch.equal(x1[0, :n], x0[0, R : R + n])
    # the factorisation order is fresh every read: same records, a later pass over them, another order
    total = one.total_steps
    assert torch.equal(one.batch(0, 0)["input_ids"], one.batch(total, 0)["input_ids"])
    assert not torch.equal(one.batch(0, 0)["perm_q_rank"], one.batch(total, 0)["perm_q_rank"])


def _prefetch_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "xlnet-prefetch" and t.is_alive()]


def test_close_joins_the_prefetch_threads_of_open_iterators(records):
    # a daemon thread left inside torch at interpreter shutdown aborts the process: close() must end every one
    s = PretrainStream(records, "train", 0, 1, 4, seed=5)
    a, b = iter(s), iter(s)
    next(a), next(b)  # two open iterators, each with a producer running ahead (the train stream loops forever)
    assert len(_prefetch_threads()) >= 2
    s.close()
    assert _prefetch_threads() == []
    with pytest.raises(StopIteration):
        next(a)  # a closed iterator is finished
    assert next(iter(s))["input_ids"].shape[0] == 4  # the stream itself still reads
    s.close()
    assert _prefetch_threads() == []
    # a finite stream whose producer has run to its end while the consumer stopped early: its last hand-over (the
    # end marker, into a full queue) gives way to close() too, within the join's wait
    n = sum(1 for _ in PretrainStream(records, "valid", 0, 1, 2, seed=5, loop=False, prefetch=0))
    v = PretrainStream(records, "valid", 0, 1, 2, seed=5, loop=False, prefetch=1)
    it = iter(v)
    for _ in range(n - 1):  # the last batch waits in the queue; the end marker has no room
        next(it)
    time.sleep(0.5)
    t0 = time.perf_counter()
    v.close()
    assert _prefetch_threads() == [] and time.perf_counter() - t0 < 2


def test_stream_bad_input(records):
    with pytest.raises(ConfigError, match="even"):
        PretrainStream(records, "train", 0, 1, 3)
    with pytest.raises(ConfigError, match="micro_batch_size 4 x world 3 must divide it"):
        PretrainStream(records, "train", 0, 3, 4)
    s = PretrainStream(records, "train", 0, 1, 2)
    with pytest.raises(CheckpointError, match=r"inside step 5 \(micro-batch 1\); resume it with the layout"):
        s.load_state_dicts([{"step": 5, "micro": 1, "micro_batch_size": 4}])
    s.load_state_dicts([{"step": 5, "micro": 0}, {"step": 5, "micro": 0}])  # a step boundary: any layout continues
    assert (s.step, s.micro) == (5, 0)


# ---- elastic layout: one set of records, any micro-batch size and number of processes ---------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.sampled_from([2, 4, 6, 8, 12]), st.sampled_from([2, 4, 6, 8, 12]))
def test_stored_rows_inverts_row_source(blocks, mb, mb_rec):
    """A reader's row g' holds (forward row, reversed?) = row_source(g', mb) whatever the records' micro-batch size:
    stored_rows finds it, and the G rows are each read once."""
    G = blocks * mb * mb_rec  # divisible by both
    got = stored_rows(np.arange(G), True, mb, mb_rec)
    assert sorted(got.tolist()) == list(range(G))
    assert all(row_source(int(g), True, mb_rec) == row_source(r, True, mb) for r, g in enumerate(got))
    assert (stored_rows(np.arange(G), True, mb, mb) == np.arange(G)).all()
    assert (stored_rows(np.arange(G), False, mb, mb_rec) == np.arange(G)).all()


def test_records_layout_reads_todays_batches(records):
    """The records' own micro_batch_size: the mapping is the identity and each batch is the one the contiguous read
    gives (what the stream did before layouts were elastic), every key equal."""
    meta = json.loads((records / "meta.json").read_text())
    mb = meta["micro_batch_size"]
    for rank, world in ((0, 1), (1, 2)):
        s = PretrainStream(records, "train", rank, world, mb, seed=5, prefetch=0)
        for step, micro in ((0, 0), (3, s.accumulation - 1), (s.steps_per_pass + 1, 0)):
            g0 = (rank * s.accumulation + micro) * mb
            assert s.rows(micro).tolist() == list(range(g0, g0 + mb))
            p, st_ = s.passes[step // s.steps_per_pass], step % s.steps_per_pass
            ids, masked, alen = p.examples(np.arange(g0, g0 + mb), st_)
            want = permutation_batch(ids, masked, alen, np.arange(g0, g0 + mb), step, meta, 5)
            got = s.batch(step, micro)
            assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize(("mb", "world"), [(2, 1), (8, 1), (2, 2), (4, 2), (2, 4)])
def test_any_layout_reads_the_same_examples(records, mb, world):
    """Records laid out for micro-batches of 4: every layout reads each stored row once per step, each micro-batch
    [forward half ; the same rows reversed], and a row's example and factorisation order are the same in any layout."""
    ref = PretrainStream(records, "train", 0, 1, 4, seed=5, prefetch=0)
    G, step = ref.meta["global_batch_size"], 2
    by_row = {}
    for a in range(ref.accumulation):
        b = ref.batch(step, a)
        for i, g in enumerate(ref.rows(a).tolist()):
            by_row[g] = (b["input_ids"][i], b["perm_q_rank"][i], b["labels"][i], b["token_type_ids"][i])
    seen = []
    for rank in range(world):
        s = PretrainStream(records, "train", rank, world, mb, seed=5, prefetch=0)
        assert s.accumulation == G // (mb * world)
        for a in range(s.accumulation):
            rows, b = s.rows(a), s.batch(step, a)
            src = [row_source(int(g), True, 4) for g in rows]
            assert [f for f, _ in src[: mb // 2]] == [f for f, _ in src[mb // 2 :]]
            assert [r for _, r in src] == [False] * (mb // 2) + [True] * (mb // 2)
            for i, g in enumerate(rows.tolist()):
                want = by_row[g]
                got = (b["input_ids"][i], b["perm_q_rank"][i], b["labels"][i], b["token_type_ids"][i])
                assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
            seen += rows.tolist()
    assert sorted(seen) == list(range(G))


def test_stream_feeds_the_engine(records):
    model_mod = pytest.importorskip("xlnetcli.model")
    from xlnetcli.config import replace

    cfg = replace(
        preprocess_cfg(),
        model={
            "d_model": 32,
            "n_layer": 2,
            "n_head": 2,
            "d_head": 16,
            "d_inner": 64,
            "mem_len": 32,
            "dropout": 0.0,
            "dropatt": 0.0,
        },
    )
    model = model_mod.XLNetLMHeadModel(cfg.model)
    stream = PretrainStream(records, "train", 0, 1, 4, seed=1, dense=True)
    mems = None
    for b in (stream.batch(0, 0), stream.batch(1, 0)):  # consecutive steps of one micro-batch stream carry memory
        out = model(
            b["input_ids"],
            token_type_ids=b["token_type_ids"],
            perm_mask=b["perm_mask"],
            target_index=b["target_index"],
            mems=mems,
            labels=b["labels"],
            label_mask=b["label_mask"],
        )
        out.loss.backward()
        assert torch.isfinite(out.loss) and out.logits.shape[:2] == b["labels"].shape
        mems = out.mems
