"""The order of finetuning examples (finetune_workload.ExampleOrder): each step's examples sorted by length across its
micro-batches and ranks (the same gradient: the mean over the same examples), optional length buckets
(finetune.length_buckets: steps of similar lengths, deterministic, every example once per epoch, exactly resumable),
and the logged tokens counting real tokens only."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from clitools import TRAIN_TSV, VALID_TSV
from finetunetools import MODEL_SETS, ft_cfg, pydocs_rows, random_init_checkpoint

from xlnetcli.core.dist import DistEnv
from xlnetcli.core.errors import Preempted
from xlnetcli.data import labelled
from xlnetcli.data.labelled.encode import _add_window
from xlnetcli.evaluate.finetuned import TaskData, build_finetune_model
from xlnetcli.train.engine import Engine
from xlnetcli.train.finetune import run_config
from xlnetcli.train.finetune_workload import ExampleOrder, FinetuneArgs, FinetuneWorkload, StepCounts, finetune_plan

L = 64


class _WordIds:
    """A stand-in tokenizer: one id per word."""

    def encode_ids(self, text: str) -> list[int]:
        return [10 + sum(map(ord, w)) % 1900 for w in text.split()]


def _text(rng: np.random.Generator, lo: int, hi: int) -> str:
    return " ".join(f"w{int(i)}" for i in rng.integers(0, 500, int(rng.integers(lo, hi))))


def _task_data(task: str, n: int = 48) -> TaskData:
    """``n`` rows of ``task`` with lengths from a few tokens to most of L."""
    rng = np.random.default_rng(0)
    if task in ("classification", "regression"):
        labels = ["a", "b", "c"] if task == "classification" else None
        rows = [
            labelled.TextExample(
                _text(rng, 1, 40), _text(rng, 1, 20) if i % 2 else None, "abc"[i % 3] if labels else i % 5 / 2
            )
            for i in range(n)
        ]
        return TaskData(task, "rows", rows, labelled.encode_texts(_WordIds(), rows, L, task, labels), label_list=labels)
    if task == "multiple-choice":
        choices = [
            labelled.ChoiceExample(
                str(i), _text(rng, 1, 30), _text(rng, 1, 4), [_text(rng, 1, 12) for _ in range(2 + i % 2)], i % 2
            )
            for i in range(n)
        ]
        return TaskData(task, "rows", choices, labelled.encode_choices(_WordIds(), choices, L))
    feats: dict[str, list] = {k: [] for k in labelled.SQUAD_FEATURES}
    for i in range(n):
        doc = [int(t) for t in rng.integers(10, 1900, int(rng.integers(4, 50)))]
        _add_window(feats, doc, [int(t) for t in rng.integers(10, 1900, 5)], L, (1, 3) if i % 3 else None, 0)
    float_keys = ("attention_mask", "p_mask", "is_impossible")
    arrays = {k: np.asarray(v, np.float32 if k in float_keys else np.int64) for k, v in feats.items()}
    return TaskData(task, "rows", [], labelled.Encoded(arrays))


def _train(
    tmp: Path, task: str, data: TaskData, *, ordered: bool = True, world: int = 1, rank: int = 0, steps: int = 3
):
    """``steps`` optimizer steps of 16 examples in micro-batches of 4 through the engine, dropout off, no clipping.
    ``ordered=False``: each step's examples in the order drawn. ``world`` > 1: this rank's share alone (no process
    group), the gradient being this rank's. Returns the gradients each optimizer step is given, the weights after, the
    tokens the engine counted, and the real tokens and the columns (rows x width) of the micro-batches run."""
    cfg = ft_cfg(  # the run's config as finetune.py makes it: the model's dropout is finetune's
        *MODEL_SETS,
        f"finetune.max_seq_length={L}",
        "finetune.batch_size=16",
        "finetune.micro_batch_size=4",
        "finetune.length_buckets=0",  # steps drawn at random: of mixed lengths
        "finetune.dropout=0.0",
        "finetune.clip_norm=0",
        "finetune.eval_every=never",
        "finetune.report_to=none",
        "finetune.warmup_ratio=0",
    )
    cfg = run_config(cfg, cfg)
    tmp.mkdir()
    (tmp / "train.txt").write_text("rows\n")
    args = FinetuneArgs(task, tmp / "train.txt", None, tmp, tmp / "out")
    counts = StepCounts(16 // (4 * world), len(data) // 16, steps, 0)
    env = DistEnv(rank=rank, world_size=world)
    workload = FinetuneWorkload(args, cfg, (data, None), env, counts, tmp, lambda *a: None)
    assert workload.sort_steps
    workload.sort_steps = ordered
    real, columns = [], []
    draw_batch = workload.next_batch

    def next_batch(step: int, micro: int) -> dict:
        batch = draw_batch(step, micro)
        real.append(int(batch["attention_mask"].sum()))
        columns.append(batch["attention_mask"].numel())
        return batch

    workload.next_batch = next_batch  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = build_finetune_model(cfg, task, len(data.label_list or []) or 1)
    model.transformer.mask_emb.requires_grad_(False)  # as finetune.py: the query stream is not used
    engine = Engine(model, workload, finetune_plan(cfg, data, counts), env, tmp / "run", cfg, quiet=True).setup()
    grads: list[list[torch.Tensor]] = []
    optimizer_step = engine.optimizer.step

    def recording_step(*a, **k):
        grads.append([p.grad.clone() for p in engine.params])
        return optimizer_step(*a, **k)

    engine.optimizer.step = recording_step  # type: ignore[method-assign]
    engine.fit()
    weights = [p.detach().clone() for p in engine.params]
    return SimpleNamespace(
        grads=grads, weights=weights, counted=engine.progress.tokens_seen, real=sum(real), columns=sum(columns)
    )


TASKS = ("classification", "regression", "multiple-choice", "squad")


@pytest.mark.parametrize("task", TASKS)
def test_sorting_a_step_by_length_keeps_its_gradient_and_pads_less(task, tmp_path):
    """A step's examples sorted by length across its micro-batches (and ranks) give the gradients and weights of the
    same examples in the order drawn, up to float rounding, in micro-batches padded to fewer columns; the tokens
    counted are the real ones; and each rank's share of a 2-process step averages to the one-process gradient (what
    DDP's all-reduce makes of it)."""
    data = _task_data(task)
    drawn, ordered = (_train(tmp_path / f"ordered_{o}", task, data, ordered=o) for o in (False, True))
    assert len(drawn.grads) == len(ordered.grads) == 3
    for a, b in zip(drawn.grads, ordered.grads, strict=True):
        for ga, gb in zip(a, b, strict=True):
            torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-6)
    for wa, wb, *steps in zip(drawn.weights, ordered.weights, *drawn.grads, strict=True):
        if max(float(g.abs().max()) for g in steps) > 1e-6:  # AdamW moves a weight whose gradient is 0 up to
            torch.testing.assert_close(wb, wa, rtol=1e-4, atol=1e-6)  # rounding (a bias softmax cancels) by its sign
    assert drawn.counted == drawn.real == ordered.counted == ordered.real
    assert ordered.columns < drawn.columns
    shares = [_train(tmp_path / f"rank{r}", task, data, world=2, rank=r, steps=1).grads[0] for r in range(2)]
    for whole, g0, g1 in zip(ordered.grads[0], *shares, strict=True):
        torch.testing.assert_close((g0 + g1) / 2, whole, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Length buckets


def _lengths(n: int = 1003) -> np.ndarray:
    """Skewed lengths, as in text: most short, a long tail."""
    rng = np.random.default_rng(5)
    return np.clip(rng.lognormal(3.0, 0.6, n).astype(np.int64), 3, 128)


def _steps(order: ExampleOrder, n: int) -> list[np.ndarray]:
    return [order.draw() for _ in range(n)]


def test_buckets_are_a_function_of_the_seed():
    lengths = _lengths()
    first, again, other = (_steps(ExampleOrder(lengths, 32, seed, buckets=8), 100) for seed in (7, 7, 8))
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(first, other, strict=True))


@pytest.mark.parametrize("buckets", [0, 1, 3, 8, 1000])
def test_every_example_once_per_epoch_and_a_step_is_the_next_of_the_epochs_order(buckets):
    """1003 examples, steps of 32 (a step spans two epochs every epoch): each epoch's order is a permutation, and each
    step is the next 32 of the epochs' orders."""
    order = ExampleOrder(_lengths(), 32, 3, buckets=buckets)
    epochs: list[np.ndarray] = []
    steps = []
    for _ in range(130):  # about four epochs
        steps.append(order.draw())
        if not epochs or epochs[-1] is not order.order:  # a new epoch began in this draw
            epochs.append(order.order)
    assert len(epochs) >= 4
    for e in epochs:
        assert sorted(e.tolist()) == list(range(1003))
    np.testing.assert_array_equal(np.concatenate(steps), np.concatenate(epochs)[: 130 * 32])


def test_buckets_pad_less():
    """The columns of a run's micro-batches, each padded to its longest example: sorting a step helps once a step has
    several micro-batches; buckets make each step's examples alike, one micro-batch or several."""
    lengths = _lengths()

    def padded(buckets: int, micro: int, sort: bool = True) -> int:
        order, columns = ExampleOrder(lengths, 32, 1, buckets), 0
        for s in _steps(order, 150):
            s = s[np.argsort(lengths[s], kind="stable")] if sort else s
            columns += sum(int(lengths[s[m : m + micro]].max()) * micro for m in range(0, 32, micro))
        return columns

    assert padded(16, 8) < padded(0, 8) < padded(0, 8, sort=False)
    assert padded(16, 8) < 0.7 * padded(0, 8, sort=False)
    assert padded(16, 32, sort=False) < 0.75 * padded(0, 32, sort=False)


@pytest.fixture(scope="module")
def work(builds, tmp_path_factory):
    return random_init_checkpoint(builds, tmp_path_factory.mktemp("order"))


@pytest.mark.slow
def test_resume_with_buckets_is_exact(work, tmp_path, monkeypatch):
    """finetune.length_buckets on, dropout on: stopped by SIGTERM mid-epoch and resumed, the run ends with the metric
    rows, results and best weights of an uninterrupted run, bit for bit (the bucketed order is the checkpointed
    permutation)."""
    from safetensors.torch import load_file

    from xlnetcli.train.finetune import finetune

    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    train, valid = tmp_path / "train.tsv", tmp_path / "valid.tsv"
    train.write_text("\n".join(["text\tlabel"] + [f"{t}\t{lab}" for t, lab in pydocs_rows(TRAIN_TSV, 150)]) + "\n")
    valid.write_text("\n".join(["text\tlabel"] + [f"{t}\t{lab}" for t, lab in pydocs_rows(VALID_TSV, 40)]) + "\n")
    cfg = ft_cfg(
        "finetune.batch_size=16",
        "finetune.micro_batch_size=8",
        "finetune.max_steps=24",
        "finetune.eval_every=8",
        "finetune.save_every=2",
        "finetune.max_seq_length=48",
        "finetune.length_buckets=3",
        "finetune.report_to=none",
    )

    def run(out: Path, resume: bool = False) -> dict:
        return finetune(
            cfg, FinetuneArgs("classification", train, valid, work / "init", out, quiet=True, resume=resume)
        )

    def comparable(out: Path, res: dict) -> tuple:
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        weights = load_file(str(Path(res["checkpoint"]) / "model.safetensors"))
        keys = ("steps", "best_step", "value", "valid", "final_train_loss")
        return {k: res[k] for k in keys}, [(r["step"], r["split"], r.get("loss")) for r in rows], weights

    with torch.random.fork_rng():
        a = comparable(tmp_path / "a", run(tmp_path / "a"))
    real_loss = FinetuneWorkload.loss

    def sigterm_at_step_13(self, model, batch, micro):  # step 13 of 24: in the second epoch (10 steps each)
        if self.examples.steps == 13 and micro == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(self, model, batch, micro)

    monkeypatch.setattr(FinetuneWorkload, "loss", sigterm_at_step_13)
    with torch.random.fork_rng(), pytest.raises(Preempted):
        run(tmp_path / "b")
    monkeypatch.setattr(FinetuneWorkload, "loss", real_loss)
    b = comparable(tmp_path / "b", run(tmp_path / "b", resume=True))
    assert a[:2] == b[:2]
    assert a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2])
