"""Issue 34: reading a document longer than one window (model/documents.py, labelled.Reading).

- with memory covering the whole past and dropout off, reading window by window gives what the same model gives the
  whole document at once under a block-causal factorisation mask (each window sees itself and the earlier ones);
- gradients through the last k windows equal autograd over the whole unrolled graph with the memory cut before them;
- a batch of documents of different lengths gives what each document alone gives (memory and window-mean);
- the row layouts: windows counted from the end, <cls> closing every window-mean window, what is cut.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from finetunetools import ft_cfg

from xlnetcli.core.errors import ConfigError
from xlnetcli.data import labelled
from xlnetcli.data.special import CLS_ID, PAD_ID, SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD, SEP_ID
from xlnetcli.model.documents import document_features, read_with_memory
from xlnetcli.model.heads import FinetuneModel
from xlnetcli.model.xlnet import XLNetModel, named_config

W = 8  # a small window: documents of several windows stay cheap


def _model(**over) -> XLNetModel:
    torch.manual_seed(0)
    return XLNetModel(named_config("tiny", dropout=0.0, dropatt=0.0, **over)).eval()


def _documents(lengths: list[int], width: int, seed: int = 0):
    """Left-padded rows of ``width`` columns: random text, then <sep> <cls> (as labelled.Reading lays them out)."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    ids = torch.full((B, width), PAD_ID)
    seg = torch.full((B, width), SEG_ID_PAD)
    mask = torch.zeros(B, width)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(10, 200, (n,), generator=g)
        ids[i, -2:] = torch.tensor([SEP_ID, CLS_ID])
        seg[i, width - n :] = SEG_ID_A
        seg[i, -1] = SEG_ID_CLS
        mask[i, width - n :] = 1
    return ids, seg, mask


def _block_causal(T: int, B: int) -> torch.Tensor:
    """perm_mask [B,T,T] (1 = may not see): token i sees the tokens of its own window and of the earlier ones."""
    win = (torch.arange(T) - T) // W  # windows counted from the end, as the reader counts them
    return (win[None, :] > win[:, None]).float().expand(B, T, T)


@pytest.mark.parametrize("lengths", [[32, 32], [32, 21], [29, 5]])
def test_memory_over_the_whole_past_equals_the_whole_document_block_causal(lengths):
    model = _model()
    T = 32
    ids, seg, mask = _documents(lengths, T)
    with torch.no_grad():
        states = read_with_memory(model, ids, seg, mask, W, mem_len=T)
        whole = model(ids, seg, mask, perm_mask=_block_causal(T, len(lengths)), return_mems=False, bi_data=False)
    assert whole.hidden is not None
    torch.testing.assert_close(states.hidden, whole.hidden[:, -W:], atol=2e-5, rtol=1e-4)
    m = mask[:, :, None]
    torch.testing.assert_close(states.sums, (whole.hidden * m).sum(1), atol=1e-4, rtol=1e-4)
    assert states.count.tolist() == [float(n) for n in lengths]


def test_a_short_memory_differs_and_memory_is_what_carries_the_past():
    """mem_len of one window is not the whole past (the result moves), and without memory the last window alone is
    read: the first windows' tokens change nothing."""
    model = _model()
    ids, seg, mask = _documents([32], 32)
    other = ids.clone()
    other[0, :8] = torch.randint(10, 200, (8,), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = read_with_memory(model, ids, seg, mask, W, mem_len=32).hidden
        short = read_with_memory(model, ids, seg, mask, W, mem_len=W).hidden
        moved = read_with_memory(model, other, seg, mask, W, mem_len=32).hidden
    assert not torch.allclose(full, short, atol=1e-4)
    assert not torch.allclose(full, moved, atol=1e-4)  # the first window reaches the last through memory


def _unrolled_reference(model: XLNetModel, ids, seg, mask, mem_len: int, k: int) -> torch.Tensor:
    """Every window with autograd on, the memory detached only where the k last windows begin."""
    n = ids.shape[1] // W
    mems, pad = None, None
    for w in range(n):
        sl = slice(w * W, (w + 1) * W)
        if w == n - k and mems is not None:
            mems = [m.detach() for m in mems]
        out = model(ids[:, sl], seg[:, sl], mask[:, sl], mems=mems, mem_pad=pad, bi_data=False, mem_len=mem_len,
                    detach_mems=False)  # fmt: skip
        mems = out.mems
        p = mask[:, sl] == 0
        pad = p if pad is None else torch.cat([pad, p], 1)[:, -mem_len:]
    assert out.hidden is not None
    return out.hidden


@pytest.mark.parametrize("k", [1, 2, 4])
def test_gradients_through_k_windows_equal_the_unrolled_graph(k):
    model = _model()
    ids, seg, mask = _documents([32, 27], 32)
    probe = torch.randn(2, W, model.config.d_model, generator=torch.Generator().manual_seed(1))

    def grads(hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad()
        (hidden * probe).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ours = grads(read_with_memory(model, ids, seg, mask, W, mem_len=16, grad_windows=k).hidden)
    ref = grads(_unrolled_reference(model, ids, seg, mask, 16, k))
    assert ours.keys() == ref.keys() and len(ours) > 10
    for name in ours:
        torch.testing.assert_close(ours[name], ref[name], atol=1e-5, rtol=1e-4, msg=name)
    if k == 4:  # every window: the gradient of the whole document read at once, block-causal
        model.zero_grad()
        whole = model(ids, seg, mask, perm_mask=_block_causal(32, 2), return_mems=False, bi_data=False).hidden
        full_memory = grads(read_with_memory(model, ids, seg, mask, W, mem_len=32, grad_windows=4).hidden)
        assert whole is not None
        ref_whole = grads(whole[:, -W:])
        for name in full_memory:
            torch.testing.assert_close(full_memory[name], ref_whole[name], atol=1e-5, rtol=1e-4, msg=name)


def test_no_gradient_reaches_windows_before_the_last_k():
    """grad_windows=1: the word embeddings of tokens only in the first windows get no gradient."""
    model = _model()
    ids, seg, mask = _documents([32], 32)
    ids[0, :24] = 300  # a token only in the first three windows
    read_with_memory(model, ids, seg, mask, W, mem_len=32, grad_windows=1).hidden.sum().backward()
    grad = model.word_embedding.weight.grad
    assert grad is not None and grad[300].abs().sum() == 0 and grad[ids[0, -1]].abs().sum() > 0


@pytest.mark.parametrize("document", ["memory", "window-mean"])
@pytest.mark.parametrize("summary", ["last", "mean"])
def test_a_batch_of_unequal_documents_equals_one_at_a_time(document, summary):
    cfg = ft_cfg(
        f"finetune.max_seq_length={W}",
        f"finetune.document={document}",
        "finetune.max_windows=5",
        f"finetune.summary_type={summary}",
        "finetune.mem_len=16",
    )
    torch.manual_seed(0)
    tiny = named_config("tiny", dropout=0.0, dropatt=0.0, bi_data=False)  # as finetune.run_config sets it
    model = FinetuneModel(tiny, cfg.finetune, "classification", 3).eval()
    rng = np.random.default_rng(0)
    rows = [
        labelled.TextExample(" ".join(f"w{i}" for i in rng.integers(0, 300, n)), None, "a") for n in (3, 30, 11, 38)
    ]
    enc = labelled.encode_texts(_Words(), rows, labelled.Reading.of(cfg.finetune), "classification", ["a"])
    keys = ("input_ids", "token_type_ids", "attention_mask")
    with torch.no_grad():
        together = model({k: torch.from_numpy(v) for k, v in enc.batch(np.arange(4), keys).items()})["logits"]
        for i in range(4):
            alone = model({k: torch.from_numpy(v) for k, v in enc.batch(np.array([i]), keys).items()})["logits"]
            torch.testing.assert_close(alone[0], together[i], atol=2e-5, rtol=1e-4)


class _Words:
    """A stand-in tokenizer: one id per word."""

    def encode_ids(self, text: str) -> list[int]:
        return [10 + sum(map(ord, w)) % 500 for w in text.split()]


def _row(enc: labelled.Encoded, i: int = 0) -> tuple[list[int], list[int]]:
    m = enc.arrays["attention_mask"][i] != 0
    return enc.arrays["input_ids"][i][m].tolist(), enc.arrays["token_type_ids"][i][m].tolist()


def test_memory_layout_is_one_sequence_over_windows_counted_from_the_end():
    text = " ".join(f"w{i}" for i in range(20))
    enc = labelled.encode_texts(_Words(), [labelled.TextExample(text, "b1 b2", None)], labelled.Reading(W, "memory", 4),
                                "classification", ["x"])  # fmt: skip
    assert enc.arrays["input_ids"].shape == (1, 4 * W) and enc.n_truncated == 0
    ids, seg = _row(enc)
    words = _Words().encode_ids(text)
    assert ids == [*words, SEP_ID, *_Words().encode_ids("b1 b2"), SEP_ID, CLS_ID]
    assert seg == [SEG_ID_A] * 21 + [SEG_ID_B] * 3 + [SEG_ID_CLS]
    rows = [labelled.TextExample(" ".join([text] * 3), None, None)]
    long = labelled.encode_texts(_Words(), rows, labelled.Reading(W, "memory", 4), "classification", ["x"])
    assert long.n_truncated == 1 and int(long.arrays["attention_mask"].sum()) == 4 * W
    assert _row(long)[0][:3] == words[:3]  # the start is kept, as in one window


def test_window_mean_layout_closes_every_window_with_its_own_cls():
    text = " ".join(f"w{i}" for i in range(23))
    reading = labelled.Reading(W, "window-mean", 6)
    enc = labelled.encode_texts(_Words(), [labelled.TextExample(text, "q1", None)], reading, "classification", ["x"])
    ids = enc.arrays["input_ids"][0].reshape(-1, W)
    mask = enc.arrays["attention_mask"][0].reshape(-1, W)
    real = mask.any(-1)
    assert real.all() and enc.n_truncated == 0  # 23 words in chunks of 8 - 3 - 1 = 4: 6 windows, the first of 3
    for row in ids[real]:
        assert row[-1] == CLS_ID and row[-2] == SEP_ID and row[-3] == _Words().encode_ids("q1")[0]
    kept = [t for row, m in zip(ids[real], mask[real], strict=True) for t in row[m != 0][:-4].tolist()]
    assert kept == _Words().encode_ids(text)  # every word once, in order; the first window takes the remainder
    assert (mask[real][1:] != 0).all()  # only the first real window holds padding


@pytest.mark.parametrize("document", ["memory", "window-mean"])
def test_empty_and_one_token_documents_read(document):
    reading = labelled.Reading(W, document, 4)
    rows = [labelled.TextExample("", None, None), labelled.TextExample("x", None, None)]
    enc = labelled.encode_texts(_Words(), rows, reading, "classification", ["a"])
    assert enc.extra["blank"] == 1
    model = _model()
    a = {
        k: torch.from_numpy(v)
        for k, v in enc.batch(np.arange(2), ("input_ids", "token_type_ids", "attention_mask")).items()
    }
    with torch.no_grad():
        mean, cls = document_features(model, a["input_ids"], a["token_type_ids"], a["attention_mask"], document, W, W)
    assert torch.isfinite(mean).all() and torch.isfinite(cls).all()


def test_settings_that_cannot_work_are_refused():
    with pytest.raises(ConfigError, match="grad_windows"):
        ft_cfg("finetune.document=memory", "finetune.max_windows=2", "finetune.grad_windows=3")
    with pytest.raises(ConfigError, match="summary_type=first"):
        ft_cfg("finetune.document=memory", "finetune.summary_type=first")
    with pytest.raises(ConfigError, match="mem_len"):
        ft_cfg("finetune.mem_len=0")
