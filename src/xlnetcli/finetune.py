"""`xlnet finetune`: classification, regression, multiple choice and SQuAD span extraction.

    finetune(cfg, "classification", "train.tsv", "valid.tsv", init="runs/pre", out="runs/sst2")

Run directory (same format as pretraining):
    out/config.yaml       the resolved config (model from --init, finetune section from --config / --set)
    out/metrics.jsonl     {"step", "split": "train"|"eval", ...} rows (train loss and lr; eval metrics)
    out/step_NNNNNNN/     the BEST checkpoint by the task metric (model.safetensors, config.yaml, tokenizer/,
                          meta.json {"kind": "finetune", "task", "labels", "metric", "value", "metrics", ...});
                          `xlnet eval --checkpoint out` resolves to it
    out/results.json      best step, its validation metrics, data statistics

AdamW (no decay on LayerNorm/bias), linear warmup then linear decay, layer-wise lr decay as parameter groups,
dropout/dropatt from cfg.finetune, evaluation every epoch or every N steps, optional early stopping, autocast
bf16/fp16 (fp16 with a grad scaler on CUDA), gradient accumulation, DDP under torchrun.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import dist, tasks
from .checkpoint import step_dir_name
from .config import Config, config_from_dict, config_to_dict, save_config
from .dist import autocast_ctx
from .errors import CheckpointError, ConfigError, DataError, XLNetError
from .io import atomic_write_json, check_output_dir
from .log import console, progress_is_live, step_progress
from .metrics import PRIMARY_METRIC, classification_metrics, regression_metrics, squad_evaluate
from .optim import build_optimizer, lr_factor, set_lr
from .runlog import MetricsLogger, NullLogger, require_trackers

# ---------------------------------------------------------------------------------------------------------------
# Data


@dataclass
class TaskData:
    """Examples of one file, encoded for the model."""

    task: str
    path: str
    examples: list
    enc: tasks.Encoded
    labels_present: bool = True
    squad_v2: bool = False
    notes: list[str] = field(default_factory=list)
    label_list: list[str] | None = None  # classification: the label of each class index

    def __len__(self) -> int:
        return len(self.enc)


def load_task_data(task: str, path: str | Path, tok: Any, cfg: Config, label_list: list[str] | None = None,
                   columns: tasks.Columns | None = None, header: bool = True, training: bool = False,
                   require_label: bool = True, train_path: str | Path | None = None) -> TaskData:
    """Read and encode a labelled (or, with ``require_label=False``, unlabelled) file for ``task``."""
    ft = cfg.finetune
    path = Path(path)
    notes: list[str] = []
    if task in ("classification", "regression"):
        examples = tasks.read_table(path, task, columns, header, require_label)
        if task == "classification" and label_list is None and training:
            label_list = tasks.build_label_list(examples)  # the training file defines the classes
        elif task == "classification" and label_list is not None:
            tasks.check_labels(examples, label_list, path, train_path)
        enc = tasks.encode_texts(tok, examples, ft.max_seq_length, task, label_list)
        present = all(ex.label is not None for ex in examples)
        data = TaskData(task, str(path), examples, enc, present, label_list=label_list)
    elif task == "multiple-choice":
        examples = tasks.read_choices(path, require_label)
        enc = tasks.encode_choices(tok, examples, ft.max_seq_length)
        data = TaskData(task, str(path), examples, enc, all(ex.label is not None for ex in examples))
    elif task == "squad":
        examples = tasks.read_squad(path)
        enc = tasks.encode_squad(tok, examples, ft.max_seq_length, ft.doc_stride, ft.max_query_length, training)
        data = TaskData(task, str(path), examples, enc, True, any(ex.is_impossible for ex in examples))
        if enc.n_skipped:
            notes.append(f"{enc.n_skipped} of {len(examples)} questions skipped: answer text not found in its "
                         "context")
        if enc.extra["windows_extra"]:
            notes.append(f"{enc.extra['windows_extra']} extra windows for paragraphs longer than "
                         f"{ft.max_seq_length} tokens (doc_stride {ft.doc_stride})")
        if enc.n_truncated:
            notes.append(f"{enc.n_truncated} questions cut to {ft.max_query_length} tokens (max_query_length)")
    else:
        raise ConfigError(f"unknown task {task!r} (choose from {', '.join(tasks.TASKS)})")
    if task != "squad" and enc.n_truncated:
        notes.append(f"{enc.n_truncated} of {enc.n_examples} examples truncated to {ft.max_seq_length} tokens "
                     "(finetune.max_seq_length); the longer text is cut first")
    data.notes = notes
    return data


# ---------------------------------------------------------------------------------------------------------------
# Model construction and loading


def tokenizer_dir_of(ckpt: Path) -> Path:
    """The tokenizer that belongs to a checkpoint folder (our tokenizer/ or an HF directory's spiece.model)."""
    if (ckpt / "tokenizer" / "spiece.model").is_file():
        return ckpt / "tokenizer"
    if (ckpt / "spiece.model").is_file():
        return ckpt
    raise CheckpointError(f"{ckpt} has no tokenizer (expected tokenizer/spiece.model or spiece.model)")


def run_config(init_cfg: Config, cfg: Config) -> Config:
    """Architecture, tokenizer and data settings from the pretrained checkpoint; finetuning settings from ``cfg``;
    dropout/dropatt from cfg.finetune; no bi_data (finetuning reads every example forward)."""
    raw = config_to_dict(init_cfg)
    raw["finetune"] = config_to_dict(cfg)["finetune"]
    raw["model"].update(dropout=cfg.finetune.dropout, dropatt=cfg.finetune.dropatt, bi_data=False)
    return config_from_dict(raw)


def build_finetune_model(run_cfg: Config, task: str, n_labels: int) -> torch.nn.Module:
    from .heads import FinetuneModel

    return FinetuneModel(run_cfg.model, run_cfg.finetune, task, n_labels)


def load_pretrained_into(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy the ``transformer.*`` weights of a pretrained (LM) or finetuned checkpoint into ``model.transformer``."""
    from .checkpoint import load_state

    sub = {k[len("transformer."):]: v for k, v in state.items() if k.startswith("transformer.")}
    if not sub:
        raise CheckpointError(f"{where} holds no transformer.* weights (not an XLNet checkpoint)")
    load_state(model.transformer, sub, where=where)


def load_finetuned(path: str | Path, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, Config, dict]:
    """(FinetuneModel in eval mode, Config, meta) from a finetuning run directory or its step folder."""
    from .checkpoint import load_model_dir, load_state

    cfg, state, meta = load_model_dir(path)
    if meta.get("kind") != "finetune" or meta.get("task") not in tasks.TASKS:
        raise CheckpointError(f"{meta.get('path', path)} is not a finetuned checkpoint (meta.json kind "
                              f"{meta.get('kind')!r}); pass a pretrained checkpoint with --data RECORDS instead")
    model = build_finetune_model(cfg, meta["task"], len(meta.get("labels") or []) or 1)
    load_state(model, state, where=f"checkpoint {meta.get('path', path)}")
    model.to(device).eval()
    return model, cfg, meta


# ---------------------------------------------------------------------------------------------------------------
# Batches, prediction, metrics

_TRAIN_KEYS = {
    "classification": ("input_ids", "token_type_ids", "attention_mask", "labels"),
    "regression": ("input_ids", "token_type_ids", "attention_mask", "labels"),
    "multiple-choice": ("input_ids", "token_type_ids", "attention_mask", "option_mask", "labels"),
    "squad": ("input_ids", "token_type_ids", "attention_mask", "p_mask", "cls_index", "start_positions",
              "end_positions", "is_impossible"),
}
_PREDICT_KEYS = {**_TRAIN_KEYS, "squad": ("input_ids", "token_type_ids", "attention_mask", "p_mask", "cls_index")}


def make_batch(enc: tasks.Encoded, idx: np.ndarray, keys: tuple[str, ...], device: torch.device) -> dict:
    return {k: torch.from_numpy(enc.arrays[k][idx]).to(device, non_blocking=True) for k in keys}


@torch.no_grad()
def predict(model: torch.nn.Module, data: TaskData, batch_size: int, device: torch.device,
            precision: str = "fp32") -> dict[str, np.ndarray]:
    """Raw outputs for every row of ``data`` (logits, or the SQuAD top-k starts/ends and answerability logits)."""
    net = dist.unwrap(model)
    was_training = net.training
    net.eval()
    keys = tuple(k for k in _PREDICT_KEYS[data.task] if k != "labels")
    chunks: dict[str, list[np.ndarray]] = {}
    try:
        for s in range(0, len(data), batch_size):
            idx = np.arange(s, min(s + batch_size, len(data)))
            with autocast_ctx(device, precision):
                out = net(make_batch(data.enc, idx, keys, device))
            for k, v in out.items():
                if isinstance(v, torch.Tensor) and k != "loss":
                    chunks.setdefault(k, []).append(v.float().cpu().numpy() if v.is_floating_point()
                                                    else v.cpu().numpy())
    finally:
        if was_training:
            net.train()
    return {k: np.concatenate(v) for k, v in chunks.items()}


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def score(data: TaskData, outputs: dict[str, np.ndarray], label_list: list[str] | None, cfg: Config,
          null_threshold: float = 0.0) -> tuple[dict[str, float], list[dict]]:
    """(metrics, one prediction row per example). Metrics are empty when the file has no labels."""
    task = data.task
    rows: list[dict] = []
    metrics: dict[str, float] = {}
    if task == "classification":
        assert label_list is not None
        probs = _softmax(outputs["logits"])
        pred = [label_list[i] for i in probs.argmax(-1)]
        for i, ex in enumerate(data.examples):
            rows.append({"index": i, "prediction": pred[i], "label": ex.label,
                         "probabilities": {lab: round(float(p), 6) for lab, p in zip(label_list, probs[i])}})
        if data.labels_present:
            metrics = classification_metrics(pred, [ex.label for ex in data.examples])
    elif task == "regression":
        pred = outputs["logits"][:, 0].astype(float).tolist()
        rows = [{"index": i, "prediction": p, "label": ex.label} for i, (p, ex) in enumerate(zip(pred, data.examples))]
        if data.labels_present:
            metrics = regression_metrics(pred, [float(ex.label) for ex in data.examples])
    elif task == "multiple-choice":
        probs = _softmax(outputs["logits"])
        pred = probs.argmax(-1).tolist()
        for i, ex in enumerate(data.examples):
            rows.append({"id": ex.id, "prediction": pred[i], "label": ex.label,
                         "probabilities": [round(float(p), 6) for p in probs[i][: len(ex.options)]]})
        if data.labels_present:
            metrics = {"accuracy": float(np.mean([p == ex.label for p, ex in zip(pred, data.examples)]))}
    else:
        best, odds = tasks.squad_predictions(data.examples, data.enc, outputs, cfg.finetune.max_answer_length)
        gold = {ex.qid: ex.answers for ex in data.examples}
        if data.squad_v2:
            metrics = squad_evaluate(gold, best, odds, null_threshold)
            final = {q: ("" if odds[q] > null_threshold else best[q]) for q in best}
        else:
            metrics = squad_evaluate(gold, best)
            final = best
        for ex in data.examples:
            rows.append({"id": ex.qid, "prediction": final[ex.qid], "best_non_null": best[ex.qid],
                         "null_odds": round(odds[ex.qid], 6), "answers": ex.answers})
    return metrics, rows


def primary_metric(task: str, metrics: dict[str, float]) -> tuple[str, float]:
    name = PRIMARY_METRIC[task]
    if task == "squad" and "best_f1" in metrics:
        name = "best_f1"
    return name, float(metrics.get(name, float("nan")))


# ---------------------------------------------------------------------------------------------------------------
# Training


def finetune_config(config_path: str | Path | None, init: str | Path, overrides: Any = ()) -> Config:
    """The finetuning config: --config if given, else the init checkpoint's config.yaml (defaults for an HF
    directory), then the overrides. The model section is always taken from the checkpoint at training time."""
    from .checkpoint import resolve_checkpoint
    from .config import load_config

    if config_path is None:
        ckpt = resolve_checkpoint(init)
        if (ckpt / "config.yaml").is_file():
            config_path = ckpt / "config.yaml"
    return load_config(config_path, tuple(overrides))



def finetune(
    cfg: Config,
    task: str,
    train: str | Path,
    valid: str | Path | None,
    init: str | Path,
    out: str | Path,
    columns: tasks.Columns | None = None,
    header: bool = True,
    overwrite: bool = False,
    device: str | None = "auto",
    quiet: bool = False,
    from_scratch: bool = False,
) -> dict[str, Any]:
    """Finetune ``init`` (a pretraining run/step folder, a finetuned checkpoint or an HF directory) on ``train``;
    evaluate on ``valid``; keep the best checkpoint in ``out``. Returns the results dict (also out/results.json).
    ``from_scratch`` takes only the architecture and tokenizer from ``init`` (random weights: a baseline)."""
    from .checkpoint import load_model_dir, resolve_checkpoint

    if task not in tasks.TASKS:
        raise ConfigError(f"unknown task {task!r} (choose from {', '.join(tasks.TASKS)})")
    env = dist.init_distributed(device)
    try:
        return _finetune(cfg, task, Path(train), Path(valid) if valid else None, Path(init), Path(out), columns,
                         header, overwrite, env, quiet, load_model_dir, resolve_checkpoint, from_scratch)
    finally:
        dist.cleanup()


def _finetune(cfg, task, train, valid, init, out, columns, header, overwrite, env, quiet, load_model_dir,
              resolve_checkpoint, from_scratch=False) -> dict[str, Any]:
    main = env.is_main
    dev = env.device
    ft = cfg.finetune
    say = console.print if main and not quiet else (lambda *a, **k: None)

    if main:
        check_output_dir(out, overwrite, "a finetuning run")
    require_trackers(ft.report_to)
    ckpt = resolve_checkpoint(init)
    init_cfg, state, init_meta = load_model_dir(ckpt)
    run_cfg = run_config(init_cfg, cfg)
    tok_dir = tokenizer_dir_of(ckpt)
    tok = tasks.load_tokenizer(tok_dir)
    if tok.vocab_size != run_cfg.model.vocab_size:
        raise CheckpointError(f"tokenizer in {tok_dir} has {tok.vocab_size} pieces but the model's vocab_size is "
                              f"{run_cfg.model.vocab_size}")

    # data
    train_data = load_task_data(task, train, tok, run_cfg, None, columns, header, training=True)
    label_list = train_data.label_list
    if task == "classification" and len(label_list) < 2:
        raise DataError(f"{train}: classification needs at least 2 distinct labels, found {label_list}")
    valid_data = None
    if valid is not None:
        valid_data = load_task_data(task, valid, tok, run_cfg, label_list, columns, header, training=False,
                                    train_path=train)
    if len(train_data) == 0:
        raise DataError(f"{train}: no usable training examples")

    # batch maths
    world = env.world_size
    if ft.batch_size % (ft.micro_batch_size * world):
        raise ConfigError(f"finetune.batch_size ({ft.batch_size}) must be a multiple of finetune.micro_batch_size "
                          f"({ft.micro_batch_size}) x processes ({world})")
    accum = ft.batch_size // (ft.micro_batch_size * world)
    n_train = len(train_data)
    steps_per_epoch = max(1, math.ceil(n_train / ft.batch_size))
    total = ft.max_steps or max(1, math.ceil(ft.epochs * steps_per_epoch))
    warmup = int(round(ft.warmup_ratio * total))

    # model
    torch.manual_seed(ft.seed)
    n_labels = len(label_list) if label_list else 1
    model = build_finetune_model(run_cfg, task, n_labels)
    if from_scratch:
        say(f"  init       random weights (architecture and tokenizer of {ckpt}; --from-scratch baseline)")
    else:
        from .heads import carry_head

        load_pretrained_into(model, state, f"checkpoint {ckpt}")
        head_note = carry_head(model, state, init_cfg.finetune, init_meta, task, label_list, run_cfg.finetune, ckpt)
        if head_note:
            say(f"  head       {head_note}")
    del state
    # the query stream is not used in finetuning: freeze its start vector (DDP rejects parameters without gradients)
    model.transformer.mask_emb.requires_grad_(False)
    model.to(dev).train()
    optimizer = build_optimizer(model, ft.lr, ft.weight_decay, eps=ft.adam_eps, layer_decay=ft.layer_decay,
                                n_layer=run_cfg.model.n_layer)
    scaler = torch.amp.GradScaler("cuda") if ft.precision == "fp16" and dev.type == "cuda" else None
    model = dist.wrap_model(model, env, "ddp")

    say(f"[bold]xlnet finetune[/bold] {task} from {ckpt} -> {out}")
    say(f"  data       train {n_train} {'features' if task == 'squad' else 'examples'} ({train})"
        + (f", valid {len(valid_data)} ({valid})" if valid_data else ", no validation file")
        + (f", {len(label_list)} labels: {', '.join(label_list)}" if label_list else ""))
    for d in (train_data, valid_data):
        for note in (d.notes if d else []):
            if main and not quiet:
                console.print(f"[yellow]warning:[/yellow] {Path(d.path).name}: {note}")
    say(f"  batch      {ft.batch_size} = micro {ft.micro_batch_size} x accumulation {accum} x {world} process(es); "
        f"{total} steps ({steps_per_epoch} per epoch), warmup {warmup}")
    say(f"  optimizer  AdamW lr {ft.lr:g}, layer decay {ft.layer_decay:g}, wd {ft.weight_decay:g}, "
        f"dropout {ft.dropout:g}/{ft.dropatt:g}, precision {ft.precision}, device {dev}")

    if main:
        if out.exists() and overwrite:
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        save_config(run_cfg, out)
    dist.barrier()
    logger = MetricsLogger(out, ft.report_to, run_cfg) if main else NullLogger()

    keys = _TRAIN_KEYS[task]
    rng = np.random.default_rng(ft.seed)
    eval_steps = set(range(ft.eval_every, total + 1, ft.eval_every)) if ft.eval_every else \
        {min(total, e * steps_per_epoch) for e in range(1, math.ceil(total / steps_per_epoch) + 1)}
    eval_steps.add(total)
    meta_base = {"kind": "finetune", "task": task, "labels": label_list, "init": str(ckpt), "from_scratch": from_scratch,
                 "squad_v2": bool(valid_data.squad_v2) if valid_data and task == "squad" else None}

    best: dict[str, Any] = {"step": None, "value": -math.inf, "metrics": None, "path": None}
    bad_evals = 0
    order: np.ndarray = np.empty(0, dtype=np.int64)
    cursor = 0
    log_every = max(1, run_cfg.train.log_every)
    t0 = time.perf_counter()
    losses: list[float] = []
    stopped_early = False
    progress = step_progress(quiet=quiet or not main)
    live = progress_is_live(quiet or not main)
    with progress:
        ptask = progress.add_task(f"finetune {task}", total=total, info="")
        for step in range(total):
            factor = lr_factor(step, warmup, total, "linear")
            lr = set_lr(optimizer, ft.lr, factor)
            # the examples of this step, the same on every rank; rank r takes its share
            need = ft.batch_size
            picked = []
            while need:
                if cursor >= len(order):
                    order, cursor = rng.permutation(n_train), 0
                take = order[cursor:cursor + need]
                picked.append(take)
                cursor += len(take)
                need -= len(take)
            idx_all = np.concatenate(picked)
            mine = idx_all[env.rank::world]
            step_loss = 0.0
            for a in range(accum):
                idx = mine[a * ft.micro_batch_size:(a + 1) * ft.micro_batch_size]
                sync = a == accum - 1 or not env.distributed
                ctx = contextlib.nullcontext() if sync else model.no_sync()
                with ctx, autocast_ctx(dev, ft.precision):
                    out_ = model(make_batch(train_data.enc, idx, keys, dev))
                    loss = out_["loss"] / accum
                if not torch.isfinite(loss):
                    raise XLNetError(f"loss became {loss.item()} at step {step + 1}; lower finetune.lr "
                                     f"(now {ft.lr:g}) or use finetune.precision=fp32")
                (scaler.scale(loss) if scaler else loss).backward()
                step_loss += loss.item()
            if scaler:
                scaler.unscale_(optimizer)
            if ft.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), ft.clip_norm)
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(step_loss)
            done = step + 1
            if done % log_every == 0 or done == total:
                mean_loss = float(np.mean(losses[-log_every:]))
                logger.log(done, "train", loss=mean_loss, lr=lr, epoch=round(done / steps_per_epoch, 3))
                if not live:  # a log file: one plain line per interval (the terminal has the progress bar)
                    say(f"step {done}/{total} loss {mean_loss:.4f} lr {lr:.2e} epoch {done / steps_per_epoch:.2f}")
                progress.update(ptask, completed=done, info=f"loss {mean_loss:.4f} lr {lr:.2e}")
            else:
                progress.update(ptask, completed=done)
            if done in eval_steps:
                stop = False
                if main:
                    res = _eval_and_keep(model, valid_data, label_list, run_cfg, dev, done, out, tok_dir, meta_base,
                                         best, logger, say)
                    if res is not None:
                        improved = res
                        bad_evals = 0 if improved else bad_evals + 1
                        if ft.early_stopping_patience and bad_evals >= ft.early_stopping_patience and done < total:
                            stop = True
                stop = bool(dist.broadcast_object(stop))
                dist.barrier()
                if stop:
                    stopped_early = True
                    say(f"  early stop at step {done}: {ft.early_stopping_patience} evaluations without improvement")
                    break

    elapsed = time.perf_counter() - t0
    if main and best["path"] is None:  # no validation file: keep the last model
        path = out / step_dir_name(done)
        from .checkpoint import save_model_dir

        save_model_dir(path, dist.unwrap(model), run_cfg, tok_dir, meta={**meta_base, "step": done})
        best.update(step=done, path=str(path))
    results = {
        "task": task, "out": str(out), "steps": done, "best_step": best["step"], "checkpoint": best["path"],
        "metric": best.get("metric"), "value": None if best["value"] == -math.inf else best["value"],
        "valid": best["metrics"], "train_examples": len(train_data.examples), "train_rows": n_train,
        "valid_examples": len(valid_data.examples) if valid_data else 0,
        "labels": label_list, "seconds": round(elapsed, 2), "stopped_early": stopped_early,
        "notes": (train_data.notes + (valid_data.notes if valid_data else [])),
        "final_train_loss": float(np.mean(losses[-log_every:])) if losses else None,
    }
    if main:
        atomic_write_json(out / "results.json", results)
        logger.close()
        if best["metrics"]:
            say(f"  best {best['metric']} {best['value']:.4f} at step {best['step']} -> {best['path']} "
                f"({elapsed:.1f}s)")
    dist.barrier()
    return results


def _eval_and_keep(model, valid_data, label_list, run_cfg, dev, step, out, tok_dir, meta_base, best,
                   logger, say) -> bool | None:
    """Evaluate on the validation data; save a checkpoint when the task metric improved. None without validation."""
    if valid_data is None:
        return None
    from .checkpoint import save_model_dir

    ft = run_cfg.finetune
    outputs = predict(model, valid_data, ft.micro_batch_size * 2, dev, ft.precision)
    metrics, _ = score(valid_data, outputs, label_list, run_cfg)
    name, value = primary_metric(valid_data.task, metrics)
    logger.log(step, "eval", metric=value, metric_name=name, **{k: v for k, v in metrics.items()})
    improved = value > best["value"] or best["path"] is None
    if improved:
        path = out / step_dir_name(step)
        meta = {**meta_base, "step": step, "metric": name, "value": value, "metrics": metrics}
        if valid_data.task == "squad" and "best_f1_thresh" in metrics:
            meta["null_odds_threshold"] = metrics["best_f1_thresh"]
        save_model_dir(path, dist.unwrap(model), run_cfg, tok_dir, meta=meta)
        if best["path"] and Path(best["path"]) != path:
            shutil.rmtree(best["path"], ignore_errors=True)
        best.update(step=step, value=value, metric=name, metrics=metrics, path=str(path))
    say(f"  step {step}: {name} {value:.4f}" + (" (best so far, saved)" if improved else
                                                f" (best {best['value']:.4f} at step {best['step']})"))
    return improved
