"""Length-aware batches: a micro-batch is padded only to its longest example (labelled.Encoded.batch). The columns cut
hold no real token of any row, and a task model's outputs (every task kind) and the probe's features are those of the
batch padded to max_seq_length, up to float rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from finetunetools import MODEL_SETS, ft_cfg

from xlnetcli.data import labelled
from xlnetcli.data.labelled.encode import _add_window
from xlnetcli.data.special import CLS_ID, SEP_ID
from xlnetcli.evaluate.finetuned import TaskData, build_finetune_model, make_batch, predict
from xlnetcli.evaluate.probe import extract_features

L = 64
CPU = torch.device("cpu")


class _WordIds:
    """A stand-in tokenizer: one id per word (encode_texts and encode_choices read encode_ids only)."""

    def encode_ids(self, text: str) -> list[int]:
        return [10 + sum(map(ord, w)) % 1900 for w in text.split()]


def _text(rng: np.random.Generator, lo: int, hi: int) -> str:
    return " ".join(f"w{int(i)}" for i in rng.integers(0, 500, int(rng.integers(lo, hi))))


def _texts(n: int = 12) -> labelled.Encoded:
    rng = np.random.default_rng(0)
    rows = [labelled.TextExample(_text(rng, 2, 12), _text(rng, 1, 9) if i % 2 else None, "a") for i in range(n)]
    return labelled.encode_texts(_WordIds(), rows, L, "classification", ["a", "b"])


def _model(task: str, *sets: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_finetune_model(ft_cfg(*MODEL_SETS, *sets), task, 3).eval()


def _full(enc: labelled.Encoded, idx: np.ndarray, keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(enc.arrays[k][idx]) for k in keys}


def test_a_batch_keeps_only_the_columns_some_row_uses():
    enc = _texts()
    idx = np.arange(4, 9)
    got = enc.batch(idx, ("input_ids", "attention_mask", "labels"))
    longest = int(enc.arrays["attention_mask"][idx].sum(-1).max())
    assert got["input_ids"].shape == (5, longest) < (5, L)
    assert got["input_ids"].flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(got["input_ids"], enc.arrays["input_ids"][idx][:, L - longest :])
    assert (got["input_ids"][:, -1] == CLS_ID).all()  # left padding: <cls> stays last
    np.testing.assert_array_equal(got["labels"], enc.arrays["labels"][idx])
    # the same rows give the same batch: a function of the rows alone (exact resume is unaffected)
    assert all((enc.batch(idx, ("input_ids",))["input_ids"] == got["input_ids"]).all() for _ in range(2))


@pytest.mark.parametrize("summary", ["last", "mean"])
def test_classification_and_regression_outputs_do_not_see_the_cut(summary):
    enc = _texts()
    keys = ("input_ids", "token_type_ids", "attention_mask")
    for task in ("classification", "regression"):
        model, idx = _model(task, f"finetune.summary_type={summary}"), np.arange(len(enc))
        with torch.no_grad():
            full = model(_full(enc, idx, keys))["logits"]
            cut = make_batch(enc, idx, keys, CPU)
            assert cut["input_ids"].shape[-1] < L
            torch.testing.assert_close(model(cut)["logits"], full, atol=1e-5, rtol=1e-5)


def test_multiple_choice_outputs_do_not_see_the_cut():
    rng = np.random.default_rng(1)
    rows = [
        labelled.ChoiceExample(
            str(i), _text(rng, 3, 10), _text(rng, 1, 4), [_text(rng, 1, 6) for _ in range(3 if i % 2 else 2)], 0
        )
        for i in range(6)
    ]
    enc = labelled.encode_choices(_WordIds(), rows, L)
    keys, idx = ("input_ids", "token_type_ids", "attention_mask", "option_mask"), np.arange(len(rows))
    model = _model("multiple-choice")
    with torch.no_grad():
        cut = make_batch(enc, idx, keys, CPU)
        assert cut["input_ids"].shape[:2] == enc.arrays["input_ids"].shape[:2] and cut["input_ids"].shape[-1] < L
        torch.testing.assert_close(model(cut)["logits"], model(_full(enc, idx, keys))["logits"], atol=1e-5, rtol=1e-5)


def test_squad_windows_are_cut_at_the_end_and_their_positions_stay():
    rng = np.random.default_rng(2)
    feats: dict[str, list] = {k: [] for k in labelled.SQUAD_FEATURES}
    for i in range(5):
        doc = [int(t) for t in rng.integers(10, 1900, int(rng.integers(8, 30)))]
        question = [int(t) for t in rng.integers(10, 1900, 5)]
        _add_window(feats, doc, question, L, (2, 4) if i % 2 else None, 0)
    arrays = {
        k: np.asarray(v, np.float32 if k in ("attention_mask", "p_mask", "is_impossible") else np.int64)
        for k, v in feats.items()
    }
    enc = labelled.Encoded(arrays)
    idx, keys = np.arange(5), labelled.SQUAD_INPUTS
    cut = make_batch(enc, idx, keys, CPU)
    longest = int(arrays["attention_mask"].sum(-1).max())
    assert cut["input_ids"].shape == (5, longest)
    np.testing.assert_array_equal(cut["cls_index"].numpy(), arrays["cls_index"])  # right padding: no position moves
    assert (cut["input_ids"][torch.arange(5), cut["cls_index"]] == CLS_ID).all()
    assert (cut["input_ids"] == SEP_ID).sum() == 10
    model = _model("squad")
    with torch.no_grad():
        got, want = model(cut), model(_full(enc, idx, keys))
    for k in ("start_top_index", "end_top_index"):
        torch.testing.assert_close(got[k], want[k])
    for k in ("start_top_log_probs", "end_top_log_probs", "cls_logits"):
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)


def test_probe_features_do_not_see_the_cut():
    enc = _texts()
    model = _model("classification")
    got = extract_features(model, enc, batch_size=5)
    with torch.no_grad():
        a = {k: torch.from_numpy(v) for k, v in enc.arrays.items()}
        hidden = model.transformer(
            a["input_ids"],
            token_type_ids=a["token_type_ids"],
            attention_mask=a["attention_mask"],
            mems=None,
            return_mems=False,
            bi_data=False,
        ).hidden.double()
    m = a["attention_mask"].double()[:, :, None]
    np.testing.assert_allclose(got["mean"], ((hidden * m).sum(1) / m.sum(1)).numpy(), atol=1e-5)
    np.testing.assert_allclose(got["cls"], hidden[:, -1].numpy(), atol=1e-5)


def test_predict_runs_similar_lengths_together_and_answers_in_row_order():
    """Inference batches rows of similar length (Encoded.by_length, a stable sort): fewer padded columns per batch,
    and predict's outputs still come back in the file's row order."""
    enc = _texts(30)
    batches = enc.by_length(4)
    lengths = enc.arrays["attention_mask"].sum(-1)
    assert sorted(np.concatenate(batches)) == list(range(30))
    assert list(lengths[np.concatenate(batches)]) == sorted(lengths)  # shortest first
    model = _model("classification")
    data = TaskData("classification", "rows", [None] * 30, enc)
    got = predict(model, data, 4, CPU)["logits"]
    keys = ("input_ids", "token_type_ids", "attention_mask")
    with torch.no_grad():
        want = model(_full(enc, np.arange(30), keys))["logits"].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
