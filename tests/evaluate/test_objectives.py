"""model.objective: PLM (XLNet), MLM ("DAE + Transformer-XL") and CLM (Transformer-XL's left-to-right LM) on one
engine and one set of records: what each objective may see, and that each one learns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from clitools import BIN, FAST_PRETRAIN, TINY, child_env, step_weights, train_losses, write_config

from xlnetcli.config import load_config
from xlnetcli.core.errors import ConfigError
from xlnetcli.data.records.stream import PretrainStream, perm_mask_from_ranks, permutation_batch
from xlnetcli.data.special import CLS_ID, MASK_ID, SEP_ID
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.train.pretrain import pretrain

pytestmark = pytest.mark.slow  # every test here trains, runs subprocesses or builds large inputs

# 2 layers, d 64, seq 64 (reuse 32, memory 32), 10 targets, batch 8: a step takes a few milliseconds
OVER = [
    "tokenizer.vocab_size=1000",
    "model.vocab_size=1000",
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=2",
    "model.d_head=32",
    "model.d_inner=128",
    "data.seq_len=64",
    "model.reuse_len=32",
    "model.mem_len=32",
    "data.num_predict=10",
    "train.global_batch_size=8",
    "train.micro_batch_size=8",
    "data.valid_fraction=0.05",
    "model.dropout=0.0",
    "model.dropatt=0.0",
    "train.warmup_steps=5",
    "train.lr=3e-3",
    "train.eval_batches=4",
    "train.save_every=end",
    "train.log_every=10",
]
L, R = 64, 32


@pytest.fixture(scope="module")
def records(builds):
    """Shared (conftest.py): read only."""
    return builds.pipeline(OVER).records


def _cfg(objective: str, *extra: str):
    return load_config(TINY, [*OVER, f"model.objective={objective}", *extra])


def _batches(records, objective: str, n: int = 4) -> list[dict]:
    s = PretrainStream(records, "train", 0, 1, 8, seed=3, prefetch=0, objective=objective)
    return [b for _, b in zip(range(n), s, strict=False)]


def _model(objective: str, seed: int = 0) -> XLNetLMHeadModel:
    torch.manual_seed(seed)
    return XLNetLMHeadModel(_cfg(objective, "model.bi_data=false").model).eval()


def _run(model, b: dict, ids=None, mems=None):
    return model(
        b["input_ids"] if ids is None else ids,
        b["token_type_ids"],
        perm_mask=b["perm_mask"],
        target_index=b["target_index"],
        mems=mems,
    )


def test_objective_is_validated():
    assert load_config(TINY).model.objective == "plm"
    with pytest.raises(ConfigError, match=r"model\.objective: expected one of 'plm', 'mlm', 'clm', got 'dae'"):
        load_config(TINY, ["model.objective=dae"])
    with pytest.raises(ConfigError, match=r"model\.objective must be one of plm, mlm, clm"):
        dataclasses.replace(load_config(TINY).model, objective="bert")
    with pytest.raises(ConfigError, match="unknown objective 'bert'"):
        PretrainStream("nowhere", objective="bert")


# ---- MLM ---------------------------------------------------------------------------------------------------------


def test_mlm_input_has_no_target_token(records):
    """Same targets as PLM; every target position is <mask> in the input, nothing else is; the labels keep the
    original tokens; attention is full inside each part, and the reuse part (what memory keeps) is blind to the rest."""
    for plm, mlm in zip(_batches(records, "plm"), _batches(records, "mlm"), strict=True):
        for key in ("target_index", "labels", "label_mask", "is_target", "token_type_ids"):
            assert torch.equal(plm[key], mlm[key]), key
        tgt = mlm["is_target"]
        assert tgt.any(dim=1).all()
        assert (mlm["input_ids"][tgt] == MASK_ID).all()
        assert torch.equal(mlm["input_ids"][~tgt], plm["input_ids"][~tgt])
        assert not (mlm["input_ids"][~tgt] == MASK_ID).any()
        assert torch.equal(
            plm["input_ids"].gather(1, plm["target_index"])[plm["label_mask"] > 0], mlm["labels"][mlm["label_mask"] > 0]
        )
        pm = mlm["perm_mask"][0].bool()
        want = torch.zeros(L, L, dtype=torch.bool)
        want[:R, R:] = True
        assert torch.equal(pm, want)


def test_mlm_outputs_never_depend_on_the_original_target_tokens(records):
    """Rebuild two consecutive windows with every target's original token replaced by another one: logits, content
    stream and memories of both windows are bit-identical (the original token reaches nothing but the labels).
    And a change in the rest of a window never reaches its reuse part or its memory, which the next window reads."""
    from xlnetcli.data.records.format import open_records

    meta, passes = open_records(records, "train")
    p = passes[0]
    rows = np.arange(8)
    model = _model("mlm")
    outs = []
    for variant in range(2):
        mems, got = None, []
        for s in range(2):  # two consecutive windows of the same rows: memory runs from the first into the second
            ids, masked, alen = p.examples(rows, s)
            ids = ids.astype(np.int64)
            if variant:
                ids = np.where(masked & (ids != SEP_ID) & (ids != CLS_ID), (ids * 7 + 11) % 991 + 9, ids)
            b = permutation_batch(ids, masked, alen, rows, s, meta, 3, objective="mlm")
            out = _run(model, b, mems=mems)
            mems = out.mems
            got.append((out.logits, out.hidden, out.mems))
        outs.append(got)
    for (l1, h1, m1), (l2, h2, m2) in zip(*outs, strict=True):
        assert torch.equal(l1, l2) and torch.equal(h1, h2)
        assert all(torch.equal(a, b) for a, b in zip(m1, m2, strict=True))

    b = _batches(records, "mlm", 1)[0]
    ids = b["input_ids"].clone()
    j = R + 3 if not b["is_target"][0, R + 3] else R + 4
    ids[0, j] = 100 if ids[0, j] != 100 else 101
    one, two = _run(model, b), _run(model, b, ids)
    assert torch.equal(one.hidden[0, :R], two.hidden[0, :R])
    assert all(torch.equal(a, c) for a, c in zip(one.mems, two.mems, strict=True))
    assert not torch.equal(one.hidden[0, R:], two.hidden[0, R:])  # inside the rest attention is bidirectional
    assert not torch.equal(one.hidden[0, R:j], two.hidden[0, R:j])


def test_mlm_predicts_from_the_content_stream(records):
    """The logits at the targets are the LM head on the content stream there (no query stream); its start vector
    is frozen, as it is unused (DDP requires every trained parameter to receive a gradient)."""
    model = _model("mlm")
    b = _batches(records, "mlm", 1)[0]
    out = _run(model, b)
    full = model(b["input_ids"], b["token_type_ids"], perm_mask=b["perm_mask"])  # no targets: every position
    assert out.query is None
    assert torch.allclose(
        out.logits, full.logits.gather(1, b["target_index"][:, :, None].expand(-1, -1, 1000)), atol=1e-5
    )
    mapped = model(b["input_ids"], b["token_type_ids"], perm_mask=b["perm_mask"], target_mapping=b["target_mapping"])
    real = b["label_mask"] > 0
    assert torch.allclose(mapped.logits[real], out.logits[real], atol=1e-5)
    assert not model.transformer.mask_emb.requires_grad
    assert _model("plm").transformer.mask_emb.requires_grad


# ---- CLM ---------------------------------------------------------------------------------------------------------


def test_clm_attends_only_to_the_past(records):
    """Natural order: the content stream's mask is lower-triangular (position i sees j <= i), a target sees j < i,
    the input is untouched; changing token t changes nothing before t, nor the prediction of a target at t."""
    plm, clm = _batches(records, "plm", 1)[0], _batches(records, "clm", 1)[0]
    assert torch.equal(plm["input_ids"], clm["input_ids"]) and torch.equal(plm["labels"], clm["labels"])
    tgt = clm["is_target"]
    pm = perm_mask_from_ranks(clm["perm_q_rank"], clm["perm_k_rank"])
    j = torch.arange(L)
    for b in range(pm.shape[0]):
        for i in range(L):
            want = j >= i if tgt[b, i] else j > i
            assert torch.equal(pm[b, i], want), (b, i)

    model = _model("clm")
    base = _run(model, clm)
    for t in (5, R, R + 10, L - 3):
        ids = clm["input_ids"].clone()
        ids[:, t] = torch.where(ids[:, t] == 200, 201, 200)
        out = _run(model, clm, ids)
        assert torch.equal(base.hidden[:, :t], out.hidden[:, :t]), t
        assert not torch.equal(base.hidden[:, t], out.hidden[:, t])
        upto = clm["target_index"] <= t  # a target at t is predicted from the tokens before it
        assert torch.equal(base.logits[upto], out.logits[upto]), t
        later = (clm["target_index"] > t) & (clm["label_mask"] > 0)
        if later.any():
            assert not torch.equal(base.logits[later], out.logits[later])


# ---- model FLOPs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["plm", "mlm", "clm"])
def test_flop_count_matches_the_executed_matmuls(records, objective):
    """flops.forward_flops against torch's FlopCounterMode on a real forward of each objective's batch (the plain
    einsum kernel, bi_data on, with memory, the last layer on the query rows as pretraining runs it). The counter sees
    two things the model-FLOP count leaves out on purpose: the position scores of all R = K + L relative positions
    before the rel-shift keeps K of them, and the 2-column segment term. What rows each layer computes is what the
    objective changes (mlm: L content rows, no query stream; plm and clm: L + P, the last layer P)."""
    from torch.utils.flop_counter import FlopCounterMode

    from xlnetcli.model.flops import forward_flops

    cfg = _cfg(objective, "model.attn_impl=einsum", "model.bi_data=true")
    torch.manual_seed(0)
    model = XLNetLMHeadModel(cfg.model).eval()
    first, b = _batches(records, objective, 2)
    with torch.no_grad():
        mems = _run(model, first).mems
        B, P, M = b["input_ids"].shape[0], b["target_index"].shape[1], mems[0].shape[1]
        with FlopCounterMode(display=False) as counter:
            model(
                b["input_ids"],
                b["token_type_ids"],
                perm_mask=b["perm_mask"],
                target_index=b["target_index"],
                labels=b["labels"],
                mems=mems,
                need_hidden=False,
            )
    m = cfg.model
    hd = m.n_head * m.d_head
    rows = [L] * m.n_layer if objective == "mlm" else [L + P] * (m.n_layer - 1) + [P]
    uncounted = sum(B * n * (2 * L * hd + 2 * 2 * hd) for n in rows)  # positions beyond K, segment term
    assert M == 32 and P == 10
    assert counter.get_total_flops() == forward_flops(m, B, L, M, P) + uncounted


# ---- learning ------------------------------------------------------------------------------------------------------


def _unigram_loss(records, batches: int) -> float:
    """Cross entropy of the first held-out batches' targets under the training targets' unigram frequencies (add-one):
    what a model that ignores every context reaches."""
    counts = np.ones(1000)
    for b in PretrainStream(records, "train", 0, 1, 8, seed=0, prefetch=0, loop=False):
        np.add.at(counts, b["labels"][b["label_mask"] > 0].numpy(), 1)
    logp = np.log(counts / counts.sum())
    nll = [
        -logp[b["labels"][b["label_mask"] > 0].numpy()]
        for _, b in zip(
            range(batches), PretrainStream(records, "valid", 0, 1, 8, seed=0, prefetch=0, loop=False), strict=False
        )
    ]
    return float(np.concatenate(nll).mean())


@pytest.mark.parametrize("objective", ["plm", "mlm", "clm"])
def test_each_objective_learns(records, tmp_path, objective):
    """60 steps on the sample text (a few seconds): the held-out loss of each objective falls from ln(1000) = 6.9 by
    more than a nat, to the unigram level of these targets (5.3): 60 steps teach the marginal distribution, not yet
    the use of context (with this tiny model PLM passes the unigram level after about 400 steps). `xlnet eval` on the
    run's checkpoint reads the records with the run's objective: it reproduces the run's own last evaluation."""
    from xlnetcli.evaluate.checkpoint_eval import evaluate_plm_checkpoint

    cfg = _cfg(objective, "train.max_steps=60", "train.eval_every=60")
    res = pretrain(cfg, records, tmp_path / "run", quiet=True)
    start, end = res["eval_start"]["loss"], res["eval"]["loss"]
    unigram = _unigram_loss(records, cfg.train.eval_batches)
    print(
        f"{objective}: held-out loss {start:.3f} -> {end:.3f} (unigram {unigram:.3f}), "
        f"target accuracy {res['eval']['acc']:.3f}"
    )
    assert start > 6.5
    assert end < start - 1.0, (start, end)
    assert end < unigram + 0.15, (end, unigram)  # measured: 0.06 above (plm, clm) and 0.07 (mlm)
    again = evaluate_plm_checkpoint(tmp_path / "run", records, batches=cfg.train.eval_batches, device="cpu")
    assert again["loss"] == pytest.approx(end, rel=1e-5)


def test_mlm_trains_under_torchrun_ddp(builds, tmp_path):
    """DDP refuses a trainable parameter that gets no gradient; MLM has no query stream, so its start vector is
    frozen: 2 gloo processes train as one process does (the test_pretrain tolerance), and mask_emb stays at init."""
    import subprocess

    rec = builds.pipeline(FAST_PRETRAIN).records
    over = [
        *FAST_PRETRAIN,
        "model.objective=mlm",
        "train.max_steps=4",
        "train.save_every=4",
        "train.eval_every=never",
        "model.dropout=0.0",
        "model.dropatt=0.0",
    ]
    cfg_file = write_config(tmp_path / "cfg.yaml", over)
    pretrain(load_config(cfg_file), rec, tmp_path / "one", quiet=True)
    cmd = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "xlnetcli",
        "pretrain",
        "--config",
        str(cfg_file),
        "--data",
        str(rec),
        "--out",
        str(tmp_path / "two"),
        "--device",
        "cpu",
        "--quiet",
    ]
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    l1, l2 = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(l1) == len(l2) == 4 and [b for _, b in l2] == pytest.approx([a for _, a in l1], rel=1e-5)
    torch.manual_seed(load_config(cfg_file).train.seed)
    init = XLNetLMHeadModel(load_config(cfg_file).model).transformer.mask_emb
    assert torch.equal(step_weights(tmp_path / "two" / "step_0000004")["transformer.mask_emb"], init.detach())
