"""`xlnet eval`: score a checkpoint.

    evaluate_plm_checkpoint("runs/pre", "records/")                 # PLM loss, perplexity, target accuracy
    evaluate_task("runs/sst2", "dev.tsv", predict="preds.jsonl")    # the task's metrics (+ predictions)

(a) a pretrained checkpoint on held-out preprocessed records -> {"loss", "ppl", "acc", "targets", "batches"};
(b) a finetuned checkpoint on a labelled file -> accuracy / macro_f1 / mcc (classification), pearson / spearman / mse
    (regression), accuracy (multiple choice), exact / f1 with HasAns / NoAns splits and the null-odds threshold
    search (SQuAD, official normalisation);
(c) ``predict``: one prediction per example as JSONL (or TSV: index/id and prediction) -- labels are then optional.
Results are returned and, with ``output``, written as JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from xlnetcli.checkpoint.folders import read_meta, tokenizer_dir_of
from xlnetcli.checkpoint.hf_dir import hf_dir_task
from xlnetcli.checkpoint.load import checkpoint_inputs, is_hf_dir, load_lm_model, resolve_checkpoint
from xlnetcli.core import dist
from xlnetcli.core.console import CountProgress, is_rank0, print0
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.files import atomic_write_json, atomic_write_text, check_file_outputs
from xlnetcli.core.shapes import dumps_strict
from xlnetcli.data import labelled
from xlnetcli.data.records.format import read_meta as records_meta
from xlnetcli.data.records.stream import PretrainStream
from xlnetcli.data.tokenizer import Tokenizer
from xlnetcli.evaluate.finetuned import load_finetuned, load_task_data, primary_metric, score
from xlnetcli.evaluate.finetuned import predict as run_predict
from xlnetcli.model.objective import evaluate_plm


@dataclass(frozen=True)
class TaskEvalSettings:
    """How a finetuned checkpoint scores a labelled file (`xlnet eval --file`'s options)."""

    columns: labelled.Columns | None = None  # which columns hold the texts and the label (None: the usual names)
    header: bool = True  # a TSV/CSV file starts with a header row
    device: str | None = "auto"  # auto, cpu, cuda or cuda:N
    batch_size: int | None = None  # examples per forward pass (None: 2 x the run's finetune.micro_batch_size)
    precision: str | None = None  # auto, fp32, bf16 or fp16 (None: the run's finetune.precision)
    null_odds_threshold: float | None = None  # SQuAD 2.0: no answer above it (None: the one found on validation)
    quiet: bool = False  # no progress bar (or plain progress lines)


PRECISION_FIX = "--precision auto or fp32"  # what the warning for bf16 on a CPU suggests
PLM_EVAL_KEYS = ("split", "batches", "device", "precision", "quiet")  # what `xlnet eval --data` reads of the options


def _is_finetuned(path: Path) -> bool:
    p = resolve_checkpoint(path)
    if is_hf_dir(p):  # an export with a task head (XLNetForSequenceClassification, ...)
        return hf_dir_task(p) is not None
    return read_meta(p).get("kind") == "finetune"  # no meta.json: {} (a pretrained folder)


def evaluate(
    checkpoint: str | Path,
    file: str | Path | None = None,
    data: str | Path | None = None,
    predict: str | Path | None = None,
    output: str | Path | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Dispatch: a finetuned checkpoint needs ``file`` (``kwargs``: TaskEvalSettings' fields); a pretrained one needs
    ``data`` (records; ``kwargs``: PLM_EVAL_KEYS). Options of the other kind are ignored. ``predict`` and ``output``
    are checked against every input before any work (core.files.check_file_outputs)."""
    ckpt = Path(checkpoint)
    if file is not None and data is not None:
        raise XLNetError(
            f"--file {file} and --data {data} cannot be combined: --file scores a finetuned checkpoint on a labelled "
            "file, --data a pretrained one on records; pass the one for this checkpoint"
        )
    check_file_outputs({"--predict": predict, "--output": output}, [*checkpoint_inputs(ckpt), file, data])
    if _is_finetuned(ckpt):
        if file is None:
            raise XLNetError(f"{ckpt} is a finetuned checkpoint: pass --file FILE (the labelled data to score)")
        names = {f.name for f in fields(TaskEvalSettings)}
        res = evaluate_task(ckpt, file, predict, TaskEvalSettings(**{k: v for k, v in kwargs.items() if k in names}))
    else:
        if data is None:
            raise XLNetError(f"{ckpt} is a pretrained checkpoint: pass --data RECORDS_DIR (from `xlnet preprocess`)")
        if predict is not None:
            raise XLNetError("--predict needs a finetuned checkpoint (from `xlnet finetune`)")
        res = evaluate_plm_checkpoint(ckpt, data, **{k: v for k, v in kwargs.items() if k in PLM_EVAL_KEYS})
    if output is not None and is_rank0():  # under torchrun every rank has the result; rank 0 writes it
        atomic_write_json(output, res)
    return res


def evaluate_plm_checkpoint(
    checkpoint: str | Path,
    records: str | Path,
    split: str = "valid",
    batches: int | None = None,
    device: str | None = "auto",
    precision: str | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """PLM loss / perplexity / target accuracy of a pretrained checkpoint on preprocessed records (``precision``
    None: auto, bf16 on a CUDA GPU with bf16, else fp32)."""
    dev = dist.resolve_device(device)
    prec = dist.checked_precision(precision or "auto", dev, "--precision", print0, PRECISION_FIX)
    meta = records_meta(records)
    model, cfg, _ = load_lm_model(
        checkpoint, dev, overrides={"bi_data": bool(meta.get("bi_data", False)), "dropout": 0.0, "dropatt": 0.0}
    )
    mb = int(meta.get("micro_batch_size", cfg.train.micro_batch_size))
    stream = PretrainStream(records, split, 0, 1, mb, cfg.data.seed, loop=False, objective=cfg.model.objective)
    total = stream.total_steps * stream.accumulation  # micro-batches in the split
    n = total if batches is None else min(batches, total)
    with CountProgress("eval", n * mb, "sequences", quiet) as bar:
        res = evaluate_plm(model, stream, n, prec, dev, on_rows=bar.advance)
    if res["targets"] == 0:
        raise DataError(f"{records}: the {split} split has no batches to evaluate")
    return {
        "kind": "plm",
        "checkpoint": str(resolve_checkpoint(checkpoint)),
        "records": str(records),
        "split": split,
        **res,
    }


def evaluate_task(
    checkpoint: str | Path,
    file: str | Path,
    predict: str | Path | None = None,
    settings: TaskEvalSettings = TaskEvalSettings(),
) -> dict[str, Any]:
    """The task metrics of a finetuned checkpoint on ``file``; with ``predict`` also write the predictions. Under
    torchrun each rank runs its share of the batches (finetuned.predict) and rank 0 writes."""
    env = dist.init_distributed(settings.device)
    try:
        return _evaluate_task(checkpoint, file, predict, settings, env)
    finally:
        dist.cleanup()


def _evaluate_task(
    checkpoint: str | Path, file: str | Path, predict: str | Path | None, s: TaskEvalSettings, env: dist.DistEnv
) -> dict[str, Any]:
    dev = env.device
    model, cfg, meta = load_finetuned(checkpoint, dev)
    task = meta["task"]
    ckpt = Path(meta["path"])
    tok = Tokenizer.load(tokenizer_dir_of(ckpt))
    labels = meta.get("labels")
    data = load_task_data(
        task,
        file,
        tok,
        cfg,
        labels,
        s.columns,
        s.header,
        training=False,
        require_label=predict is None,
    )
    if len(data) == 0:
        raise DataError(f"{file}: no examples")
    if predict is not None and Path(predict).suffix.lower() == ".tsv":
        _check_tsv_ids(data.examples, file, predict)
    thresh = s.null_odds_threshold
    if thresh is None:
        thresh = float(meta.get("null_odds_threshold", 0.0))
    bs = s.batch_size or cfg.finetune.micro_batch_size * 2
    # None: the run's precision, which its config.yaml records as trained (train.plan.run_precision)
    key = "--precision" if s.precision else "the run's finetune.precision"
    precision = dist.checked_precision(s.precision or cfg.finetune.precision, dev, key, print0, PRECISION_FIX)
    unit = "features" if task == "squad" else "examples"
    try:
        with CountProgress("eval", len(data), unit, s.quiet) as bar:
            outputs = run_predict(model, data, bs, dev, precision, on_rows=bar.advance)
    except torch.OutOfMemoryError:
        raise XLNetError(f"out of memory evaluating with batch {bs}; pass --batch-size smaller") from None
    metrics, rows = score(data, outputs, labels, cfg, thresh)
    res: dict[str, Any] = {
        "kind": task,
        "checkpoint": str(ckpt),
        "file": str(file),
        "examples": len(data.examples),
        "metrics": metrics,
        "notes": data.notes,
    }
    if metrics:
        res["metric"], res["value"] = primary_metric(task, metrics)
    if task == "squad" and data.squad_v2:
        res["null_odds_threshold"] = thresh
    if predict is not None:
        if env.is_main:
            write_predictions(predict, rows)
        res["predictions"] = str(predict)
    return res


# What splits a TSV cell: a tab, and every character str.splitlines breaks a line at
TSV_BREAKS = re.compile("[\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _check_tsv_ids(examples: list[Any], file: str | Path, predict: str | Path) -> None:
    """Refuse, before any prediction, an example id (multiple choice, SQuAD) that a TSV of predictions would split;
    JSONL keeps every id exactly."""
    for ex in examples:
        qid = getattr(ex, "qid", getattr(ex, "id", None))
        if isinstance(qid, str) and TSV_BREAKS.search(qid):
            at = f"{file}:{ex.line}" if getattr(ex, "line", 0) else str(file)
            raise DataError(
                f"{at}: id {qid!r} holds a tab or line break, which would split the TSV --predict {predict}; "
                "write the predictions as .jsonl (ids kept exactly) or fix the id"
            )


def write_predictions(path: str | Path, rows: list[dict]) -> None:
    """JSONL (one object per example), or TSV (index/id and prediction) when the name ends in .tsv: a tab or line
    break inside a predicted text is written as a space (an id holding one is refused first: ``_check_tsv_ids``)."""
    path = Path(path)
    if path.suffix.lower() == ".tsv":
        key = "id" if rows and "id" in rows[0] else "index"
        lines = [f"{key}\tprediction"]
        for r in rows:
            p = r["prediction"]
            p = TSV_BREAKS.sub(" ", p) if isinstance(p, str) else p
            lines.append(f"{r[key]}\t{p}")
        atomic_write_text(path, "\n".join(lines) + "\n")
    else:
        atomic_write_text(path, "".join(dumps_strict(r, ensure_ascii=False) + "\n" for r in rows))
