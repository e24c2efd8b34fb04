"""A finetuned model and its data, below finetune.py (training) and checkpoint_eval.py (`xlnet eval --file`).

data = load_task_data("classification", "dev.tsv", tok, cfg, label_list)   # read and encode a task file
model, cfg, meta = load_finetuned("runs/sst2")                               # a finetuned checkpoint
outputs = predict(model, data, batch_size, device)                          # raw head outputs per row
metrics, rows = score(data, outputs, label_list, cfg)                       # task metrics + one row per example
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xlnetcli.checkpoint.load import load_model_dir, load_state
from xlnetcli.config import Config
from xlnetcli.core import dist
from xlnetcli.core.dist import autocast_ctx
from xlnetcli.core.errors import CheckpointError, ConfigError
from xlnetcli.data import labelled
from xlnetcli.evaluate.metrics import PRIMARY_METRIC, classification_metrics, regression_metrics, squad_evaluate
from xlnetcli.model.heads import FinetuneModel


@dataclass
class TaskData:
    """Examples of one file, encoded for the model."""

    task: str
    path: str
    examples: list
    enc: labelled.Encoded
    labels_present: bool = True
    squad_v2: bool = False
    notes: list[str] = field(default_factory=list)
    label_list: list[str] | None = None  # classification: the label of each class index

    def __len__(self) -> int:
        return len(self.enc)


def load_task_data(
    task: str,
    path: str | Path,
    tok: Any,
    cfg: Config,
    label_list: list[str] | None = None,
    columns: labelled.Columns | None = None,
    header: bool = True,
    training: bool = False,
    require_label: bool = True,
    train_path: str | Path | None = None,
) -> TaskData:
    """Read and encode a labelled (or, with ``require_label=False``, unlabelled) file for ``task``."""
    ft = cfg.finetune
    path = Path(path)
    notes: list[str] = []
    reading = labelled.Reading.of(ft)
    if task == "squad" and ft.document != "first":
        raise ConfigError(
            f"finetune.document={ft.document} does not apply to squad: a long paragraph is already read in windows "
            "every finetune.doc_stride tokens, each answering from its own window (set finetune.document=first)"
        )
    if task in ("classification", "regression"):
        examples = labelled.read_table(path, task, columns, header, require_label)
        if task == "classification" and label_list is None and training:
            label_list = labelled.build_label_list(examples)  # the training file defines the classes
        elif task == "classification" and label_list is not None:
            labelled.check_labels(examples, label_list, path, train_path)
        enc = labelled.encode_texts(tok, examples, reading, task, label_list)
        present = all(ex.label is not None for ex in examples)
        data = TaskData(task, str(path), examples, enc, present, label_list=label_list)
        if enc.extra["blank"]:
            notes.append(f"{enc.extra['blank']} of {len(examples)} examples have no text (special tokens only); kept")
    elif task == "multiple-choice":
        choices = labelled.read_choices(path, require_label)
        enc = labelled.encode_choices(tok, choices, reading)
        data = TaskData(task, str(path), choices, enc, all(ex.label is not None for ex in choices))
    elif task == "squad":
        questions = labelled.read_squad(path)
        enc = labelled.encode_squad(
            tok, questions, ft.max_seq_length, ft.doc_stride, ft.max_query_length, training, where=str(path)
        )
        data = TaskData(task, str(path), questions, enc, True, any(ex.is_impossible for ex in questions))
        if enc.n_skipped:
            notes.append(f"{enc.n_skipped} of {len(questions)} questions skipped: answer text not found in its context")
        if enc.extra["windows_extra"]:
            notes.append(
                f"{enc.extra['windows_extra']} extra windows for paragraphs longer than "
                f"{ft.max_seq_length} tokens (doc_stride {ft.doc_stride})"
            )
        if enc.n_truncated:
            notes.append(f"{enc.n_truncated} questions cut to {ft.max_query_length} tokens (max_query_length)")
    else:
        raise ConfigError(f"unknown task {task!r} (choose from {', '.join(labelled.TASKS)})")
    if task != "squad" and enc.n_truncated:
        if ft.document == "first":
            notes.append(
                f"{enc.n_truncated} of {enc.n_examples} examples truncated to {ft.max_seq_length} tokens "
                "(finetune.max_seq_length); the longer text is cut first (finetune.document=memory reads more)"
            )
        else:
            notes.append(
                f"{enc.n_truncated} of {enc.n_examples} examples cut to {ft.max_windows} windows of "
                f"{ft.max_seq_length} tokens (finetune.max_windows); the longer text is cut first"
            )
    data.notes = notes
    return data


def build_finetune_model(run_cfg: Config, task: str, n_labels: int) -> FinetuneModel:
    return FinetuneModel(run_cfg.model, run_cfg.finetune, task, n_labels)


def load_pretrained_into(model: FinetuneModel, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy the ``transformer.*`` weights of a pretrained (LM) or finetuned checkpoint into ``model.transformer``."""
    sub = {k[len("transformer.") :]: v for k, v in state.items() if k.startswith("transformer.")}
    if not sub:
        raise CheckpointError(f"{where} holds no transformer.* weights (not an XLNet checkpoint)")
    load_state(model.transformer, sub, where=where)


def load_finetuned(path: str | Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, Config, dict]:
    """(FinetuneModel in eval mode, Config, meta) from a finetuning run directory or its step folder."""
    cfg, state, meta = load_model_dir(path)
    if meta.get("kind") != "finetune" or meta.get("task") not in labelled.TASKS:
        raise CheckpointError(
            f"{meta.get('path', path)} is not a finetuned checkpoint (meta.json kind "
            f"{meta.get('kind')!r}); pass a pretrained checkpoint with --data RECORDS instead"
        )
    model = build_finetune_model(cfg, meta["task"], len(meta.get("labels") or []) or 1)
    load_state(model, state, where=f"checkpoint {meta.get('path', path)}")
    model.to(device).eval()
    return model, cfg, meta


TRAIN_KEYS = {
    "classification": ("input_ids", "token_type_ids", "attention_mask", "labels"),
    "regression": ("input_ids", "token_type_ids", "attention_mask", "labels"),
    "multiple-choice": ("input_ids", "token_type_ids", "attention_mask", "option_mask", "labels"),
    "squad": labelled.SQUAD_FEATURES,
}
PREDICT_KEYS = {**TRAIN_KEYS, "squad": labelled.SQUAD_INPUTS}


def make_batch(enc: labelled.Encoded, idx: np.ndarray, keys: tuple[str, ...], device: torch.device) -> dict:
    """Rows ``idx`` on the device, padded only to their longest example (labelled.Encoded.batch)."""
    return {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in enc.batch(idx, keys).items()}


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    data: TaskData,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    on_rows: Callable[[int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Raw outputs for every row of ``data`` (logits, or the SQuAD top-k starts/ends and answerability logits), in
    row order; the rows run in batches of similar length (labelled.Encoded.by_length), each padded to its longest.
    Under torchrun every rank calls it: rank r runs batches r, r + W, ... and every rank gets all the outputs (the
    same batches as one process, so the same outputs). ``on_rows(n)`` after each batch (a progress bar:
    core.console.CountProgress.advance), counting the rows of all ranks (W batches of rank 0's size)."""
    net = dist.unwrap(model)
    was_training = net.training
    net.eval()
    keys = tuple(k for k in PREDICT_KEYS[data.task] if k != "labels")
    batches = data.enc.by_length(batch_size)
    world, rank = dist.world_and_rank()
    mine: list[dict[str, np.ndarray]] = []
    try:
        for idx in batches[rank::world]:
            with autocast_ctx(device, precision):
                out = net(make_batch(data.enc, idx, keys, device))
            mine.append(
                {
                    k: v.float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy()
                    for k, v in out.items()
                    if isinstance(v, torch.Tensor) and k != "loss"
                }
            )
            if on_rows is not None:
                on_rows(len(idx) * world)
    finally:
        if was_training:
            net.train()
    ranks = dist.all_gather_object(mine) if world > 1 else [mine]
    done = [ranks[b % world][b // world] for b in range(len(batches))]  # batch b ran on rank b % world
    return {k: labelled.in_row_order([d[k] for d in done], batches) for k in (done[0] if done else {})}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def score(
    data: TaskData,
    outputs: dict[str, np.ndarray],
    label_list: list[str] | None,
    cfg: Config,
    null_threshold: float = 0.0,
) -> tuple[dict[str, float], list[dict]]:
    """(metrics, one prediction row per example). Metrics are empty when the file has no labels."""
    task = data.task
    if task == "classification":
        assert label_list is not None
        return _score_classification(data, outputs, label_list)
    if task == "regression":
        return _score_regression(data, outputs)
    if task == "multiple-choice":
        return _score_multiple_choice(data, outputs)
    return _score_squad(data, outputs, cfg, null_threshold)


def _score_classification(
    data: TaskData, outputs: dict[str, np.ndarray], label_list: list[str]
) -> tuple[dict[str, float], list[dict]]:
    """``score`` for classification: the likeliest label and every label's probability."""
    rows: list[dict] = []
    metrics: dict[str, float] = {}
    probs = _softmax(outputs["logits"])
    pred = [label_list[i] for i in probs.argmax(-1)]
    for i, ex in enumerate(data.examples):
        rows.append(
            {
                "index": i,
                "prediction": pred[i],
                "label": ex.label,
                "probabilities": {lab: round(float(p), 6) for lab, p in zip(label_list, probs[i], strict=True)},
            }
        )
    if data.labels_present:
        metrics = classification_metrics(pred, [ex.label for ex in data.examples])
    return metrics, rows


def _score_regression(data: TaskData, outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], list[dict]]:
    """``score`` for regression: the predicted value."""
    metrics: dict[str, float] = {}
    pred = outputs["logits"][:, 0].astype(float).tolist()
    rows = [
        {"index": i, "prediction": p, "label": ex.label}
        for i, (p, ex) in enumerate(zip(pred, data.examples, strict=True))
    ]
    if data.labels_present:
        metrics = regression_metrics(pred, [float(ex.label) for ex in data.examples])
    return metrics, rows


def _score_multiple_choice(data: TaskData, outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], list[dict]]:
    """``score`` for multiple choice: the likeliest option and each option's probability."""
    rows: list[dict] = []
    metrics: dict[str, float] = {}
    probs = _softmax(outputs["logits"])
    pred = probs.argmax(-1).tolist()
    for i, ex in enumerate(data.examples):
        rows.append(
            {
                "id": ex.id,
                "prediction": pred[i],
                "label": ex.label,
                "probabilities": [round(float(p), 6) for p in probs[i][: len(ex.options)]],
            }
        )
    if data.labels_present:
        metrics = {"accuracy": float(np.mean([p == ex.label for p, ex in zip(pred, data.examples, strict=True)]))}
    return metrics, rows


def _score_squad(
    data: TaskData, outputs: dict[str, np.ndarray], cfg: Config, null_threshold: float
) -> tuple[dict[str, float], list[dict]]:
    """``score`` for SQuAD: the best span (empty under SQuAD 2.0 when the null odds pass ``null_threshold``)."""
    rows: list[dict] = []
    best, odds = labelled.squad_predictions(data.examples, data.enc, outputs, cfg.finetune.max_answer_length)
    gold = {ex.qid: ex.answers for ex in data.examples}
    if data.squad_v2:
        metrics = squad_evaluate(gold, best, odds, null_threshold)
        final = {q: ("" if odds[q] > null_threshold else best[q]) for q in best}
    else:
        metrics = squad_evaluate(gold, best)
        final = best
    for ex in data.examples:
        rows.append(
            {
                "id": ex.qid,
                "prediction": final[ex.qid],
                "best_non_null": best[ex.qid],
                "null_odds": round(odds[ex.qid], 6),
                "answers": ex.answers,
            }
        )
    return metrics, rows


def primary_metric(task: str, metrics: dict[str, float]) -> tuple[str, float]:
    name = PRIMARY_METRIC[task]
    if task == "squad" and "best_f1" in metrics:
        name = "best_f1"
    return name, float(metrics.get(name, float("nan")))
