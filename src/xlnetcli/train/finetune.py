"""`xlnet finetune`: classification, regression, multiple choice and SQuAD span extraction.

    args = FinetuneArgs("classification", "train.tsv", "valid.tsv", init="runs/pre", out="runs/sst2")
    finetune(cfg, args)
    finetune(cfg, dataclasses.replace(args, resume=True))     # continue an interrupted run exactly

The loop, precision, checkpoints and resume are the engine's (train/engine.py); the finetuning workload (the shuffled
example order, the head's loss, validation with the task metric, the best checkpoint) is train/finetune_workload.py's;
this module builds the run (its arguments as one ``FinetuneArgs``) and keeps its folder. AdamW (no decay on
LayerNorm/bias), linear warmup then linear decay, layer-wise lr decay as parameter groups, dropout/dropatt from
cfg.finetune, evaluation every epoch or every N steps, optional early stopping, gradient accumulation, DDP under
torchrun.

Run folder. The run is built in a hidden sibling ``.OUT.partial/`` and renamed to OUT when it completes, so OUT is
either absent (or, with --overwrite, the previous result) or complete:

    out/config.yaml       the resolved config (model from --init, finetune section from --config / --set)
    out/metrics.jsonl     {"step", "split": "train"|"eval", ...} rows (train loss, lr, throughput; eval metrics)
    out/step_NNNNNNN/     the BEST checkpoint by the task metric (model.safetensors, config.yaml, tokenizer/,
                          meta.json {"kind": "finetune", "task", "labels", "metric", "value", "metrics", ...});
                          `xlnet eval out`, `xlnet export out` and `--init out` resolve to it
    out/results.json      best step, its validation metrics, data statistics

While it runs, ``.OUT.partial/`` also holds the latest resumable step folder (with train_state.safetensors: optimizer,
example order, RNG states, best so far), written as ``finetune.save_every`` says (by default ``eval``: at every
evaluation) and on SIGTERM; ``resume=True`` (``--resume``) continues from it exactly. results.json is written into
the partial folder before the resumable folders are pruned and the folder is renamed, so an interruption there is
finished by ``--resume``. The example order is global, so a run resumes on another number of processes (or
micro-batch size) too: the same examples per step, dropout re-seeded (the header's ``layout`` line says so).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from xlnetcli.checkpoint.folders import step_dir_name, step_folders, tokenizer_dir_of
from xlnetcli.checkpoint.load import StartingPoint, load_starting_point, resolve_checkpoint
from xlnetcli.config import Config, check_config, config_from_dict, config_to_dict
from xlnetcli.core import dist
from xlnetcli.core.errors import (
    STARTUP_SIGTERM,
    CheckpointError,
    ConfigError,
    DataError,
    XLNetError,
)
from xlnetcli.core.files import atomic_write_json, check_output_dir, check_output_not_input, commit_dir, output_lock
from xlnetcli.core.signals import sigterm_stops
from xlnetcli.data import labelled
from xlnetcli.data.tokenizer import Tokenizer
from xlnetcli.evaluate.finetuned import TaskData, build_finetune_model, load_pretrained_into, load_task_data
from xlnetcli.model.heads import carry_head
from xlnetcli.report.trackers import require_trackers
from xlnetcli.train.checkpointer import TRAIN_STATE, resumable_steps
from xlnetcli.train.display import printer
from xlnetcli.train.engine import Engine
from xlnetcli.train.finetune_workload import FinetuneArgs, FinetuneWorkload, StepCounts, finetune_plan
from xlnetcli.train.header import device_prose, document_prose
from xlnetcli.train.plan import run_precision
from xlnetcli.train.resume import resume_changes, resume_point
from xlnetcli.train.rng import seed_everything

# finetune.* keys that may change when resuming (how often metric lines and resumable checkpoints are written, where
# metrics go, the device peak behind the logged MFU, and the micro-batch size: the same examples per step, other
# micro-batches, as on another number of processes; nothing that changes what is computed beyond float rounding)
RESUME_MUTABLE = {
    "finetune.save_every",
    "finetune.report_to",
    "finetune.log_every",
    "finetune.peak_tflops",
    "finetune.micro_batch_size",
}

# The training settings a --resume may change (after a divergence: a lower finetune.lr, clipping, fp32), recorded as
# in pretraining (train/pretrain.py RESUME_CHANGEABLE), the lr schedule recomputed from the resumed step on; the step
# count (max_steps, epochs) stays the run's.
RESUME_CHANGEABLE = frozenset({"finetune.lr", "finetune.clip_norm", "finetune.precision", "finetune.warmup_ratio"})


# ---------------------------------------------------------------------------------------------------------------
# Config


def run_config(init_cfg: Config, cfg: Config) -> Config:
    """Architecture, tokenizer and data settings from the pretrained checkpoint; finetuning settings from ``cfg``;
    dropout/dropatt from cfg.finetune; no bi_data (finetuning reads every example forward)."""
    raw = config_to_dict(init_cfg)
    raw["finetune"] = config_to_dict(cfg)["finetune"]
    raw["model"].update(dropout=cfg.finetune.dropout, dropatt=cfg.finetune.dropatt, bi_data=False)
    return config_from_dict(raw)


def finetune_config_path(init: str | Path) -> Path | None:
    """Which YAML to load when the user gave no --config: the init checkpoint's config.yaml (None for an HF
    directory: the defaults). The model section is always taken from the checkpoint at training time."""
    path = resolve_checkpoint(init) / "config.yaml"
    return path if path.is_file() else None


# ---------------------------------------------------------------------------------------------------------------
# Run folder


def partial_dir(out: Path) -> Path:
    """Where a finetuning run into ``out`` is built: a hidden sibling, renamed to ``out`` when the run completes."""
    out = out.resolve()
    return out.parent / f".{out.name}.partial"


def _run_mode(out: Path, partial: Path, resume: bool, overwrite: bool) -> str:
    """fresh | resume | finish (the run in the partial folder completed; only the rename is left) | complete."""
    if partial.exists() and not partial.is_dir():
        raise XLNetError(f"{partial} exists and is not a folder; remove it")
    if partial.is_dir():
        if resume:
            check_output_dir(out, overwrite, "a finetuning run")
            return "finish" if (partial / "results.json").is_file() else "resume"
        if not overwrite:
            steps = resumable_steps(partial)
            last = f"last checkpoint step {steps[-1][0]}" if steps else "no checkpoint yet"
            raise XLNetError(
                f"an interrupted finetuning run into {out} is in {partial} ({last}); pass --resume to "
                "continue it or --overwrite to start again"
            )
    elif resume and (out / "results.json").is_file():
        return "complete"
    check_output_dir(out, overwrite, "a finetuning run")
    return "fresh"


def _commit(partial: Path, out: Path, best_step: int | None) -> None:
    """results.json is in ``partial``: drop the resumable step folders and the best folder's train state, rename."""
    for s, path in step_folders(partial):
        if s != best_step:
            shutil.rmtree(path, ignore_errors=True)
    if best_step is not None:
        (partial / step_dir_name(best_step) / TRAIN_STATE).unlink(missing_ok=True)
    commit_dir(partial, out)


def _say_complete(say: Any, out: Path, results: dict) -> None:
    value = results.get("value")
    best = (
        f"best {results['metric']} {'nan' if value is None else f'{value:.4f}'} at step {results['best_step']}"
        if results.get("metric") is not None
        else "no validation file"
    )
    say(
        f"finetuning run {out} is complete: {results['steps']} steps, {best}; checkpoint {results['checkpoint']}; "
        "nothing to resume"
    )


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def finetune(cfg: Config, args: FinetuneArgs) -> dict[str, Any]:
    """Finetune ``args.init`` (a pretraining run/step folder, a finetuned checkpoint or an HF directory) on
    ``args.train``; evaluate on ``args.valid``; keep the best checkpoint in ``args.out``. Returns the results dict
    (also out/results.json). On SIGTERM the run stops after the current step with a checkpoint and raises
    errors.Preempted (exit code 75)."""
    if args.task not in labelled.TASKS:
        raise ConfigError(f"unknown task {args.task!r} (choose from {', '.join(labelled.TASKS)})")
    env = dist.init_distributed(args.device)
    try:
        # SIGTERM while starting: unwound (the lock released), exit 75 (train/pretrain.py does the same)
        with sigterm_stops(STARTUP_SIGTERM):
            check_output_not_input(args.out, [args.init, args.train, args.valid])
            # one writer per output (rank 0 holds the lock for all ranks; the .partial folder is covered by it)
            with output_lock(args.out) if env.rank == 0 else contextlib.nullcontext():
                return _finetune(cfg, args, env)
    finally:
        dist.cleanup()


def _finetune(cfg: Config, args: FinetuneArgs, env: dist.DistEnv) -> dict[str, Any]:
    """The steps of one finetuning call: the run folder's state, the init checkpoint, the data, the batch maths, the
    resume point, the model, the training and the commit."""
    say = printer(env.is_main and not args.quiet)
    require_trackers(cfg.finetune.report_to)
    out, partial = args.out, partial_dir(args.out)
    mode = dist.broadcast_object(_run_mode(out, partial, args.resume, args.overwrite))
    if mode in ("complete", "finish"):
        return _report_finished(mode, out, partial, env, say)

    init = load_starting_point(args.init)
    tok_dir = tokenizer_dir_of(init.path)  # finetuning needs the checkpoint's own SentencePiece model
    tok = Tokenizer.load(tok_dir)
    run_cfg = run_precision(run_config(init.cfg, cfg), "finetune", env.device, say)  # config.yaml: the value used
    _check_vocab(tok, tok_dir, run_cfg)
    train_data, valid_data = _load_data(args, tok, run_cfg)
    check_config(run_cfg, env.world_size, stage="finetune", device=env.device)
    steps = _step_counts(run_cfg, len(train_data), env.world_size)
    start = _resume_point(run_cfg, partial) if mode == "resume" else None
    model = _build_model(run_cfg, args, train_data.label_list, init, start is None, say)
    model.to(env.device).train()
    if env.rank:  # each rank its own dropout masks (rank 0 goes on from the generator the model was built with)
        seed_everything(run_cfg.finetune.seed + 7919 * env.rank)

    workload = FinetuneWorkload(args, run_cfg, (train_data, valid_data), env, steps, init.path, say)
    plan = finetune_plan(run_cfg, train_data, steps)
    if env.is_main and mode == "fresh" and partial.exists():
        shutil.rmtree(partial)  # --overwrite: an interrupted earlier run is discarded
    dist.barrier()
    engine = Engine(model, workload, plan, env, partial, run_cfg, tok_dir, args.quiet)
    with _removed_on_failure(partial, env.is_main):
        changes = resume_changes(start[1], run_cfg, RESUME_CHANGEABLE) if start is not None else []
        engine.setup(resume_from=start[1] if start is not None else None, changes=changes)
        _say_header(say, engine, args, init.path, workload, steps)
        result = engine.fit()
    return _commit_results(workload, result, out, partial, say)


def _check_vocab(tok: Tokenizer, tok_dir: Path, run_cfg: Config) -> None:
    """The init checkpoint's tokenizer must have exactly as many pieces as the run's model has embeddings."""
    if tok.vocab_size != run_cfg.model.vocab_size:
        raise CheckpointError(
            f"tokenizer in {tok_dir} has {tok.vocab_size} pieces "
            f"but the model's vocab_size is {run_cfg.model.vocab_size}"
        )


def _report_finished(mode: str, out: Path, partial: Path, env: dist.DistEnv, say: Any) -> dict[str, Any]:
    """A run that has completed (``complete``) or whose only step left is the rename (``finish``): its results."""
    src = out if mode == "complete" else partial
    results = json.loads((src / "results.json").read_text(encoding="utf-8"))
    if env.is_main and mode == "finish":
        _commit(partial, out, results.get("best_step"))
    dist.barrier()
    _say_complete(say, out, results)
    return results


def _load_data(args: FinetuneArgs, tok: Tokenizer, run_cfg: Config) -> tuple[TaskData, TaskData | None]:
    """The training and validation examples, encoded (validation labels must be among the training ones)."""
    task, train, valid, columns, header = args.task, args.train, args.valid, args.columns, args.header
    train_data = load_task_data(task, train, tok, run_cfg, None, columns, header, training=True)
    label_list = train_data.label_list
    if task == "classification" and len(label_list or []) < 2:
        raise DataError(f"{train}: classification needs at least 2 distinct labels, found {label_list}")
    valid_data = None
    if valid is not None:
        valid_data = load_task_data(
            task, valid, tok, run_cfg, label_list, columns, header, training=False, train_path=train
        )
    if len(train_data) == 0:
        raise DataError(f"{train}: no usable training examples")
    return train_data, valid_data


def _resume_point(run_cfg: Config, partial: Path) -> tuple[int, Path] | None:
    """The latest resumable step folder of the interrupted run (None: killed before its first one)."""
    start = resume_point(
        run_cfg,
        partial,
        "latest",
        "finetuning run",
        ("tokenizer", "model", "finetune"),
        RESUME_MUTABLE,
        "resume with the run's --config and --set, or start again with --overwrite",
        RESUME_CHANGEABLE,
    )
    return dist.broadcast_object(start)


def _step_counts(run_cfg: Config, n_train: int, world: int) -> StepCounts:
    ft = run_cfg.finetune
    per_epoch = max(1, math.ceil(n_train / ft.batch_size))
    total = ft.max_steps if ft.max_steps is not None else max(1, math.ceil(ft.epochs * per_epoch))
    return StepCounts(ft.batch_size // (ft.micro_batch_size * world), per_epoch, total, round(ft.warmup_ratio * total))


def _build_model(
    run_cfg: Config,
    args: FinetuneArgs,
    label_list: list[str] | None,
    init: StartingPoint,
    load_init: bool,
    say: Any,
) -> torch.nn.Module:
    """The task model: random weights with ``args.from_scratch``; else the init checkpoint's (and its head when it
    fits) unless ``load_init`` is False (a resume loads its own). Frees the init weights."""
    task, from_scratch = args.task, args.from_scratch
    torch.manual_seed(run_cfg.finetune.seed)
    model = build_finetune_model(run_cfg, task, len(label_list) if label_list else 1)
    ckpt = init.path
    if from_scratch:
        say(f"  init       random weights (architecture and tokenizer of {ckpt}; --from-scratch baseline)")
    elif load_init:
        load_pretrained_into(model, init.state, f"checkpoint {ckpt}")
        head_note = carry_head(
            model, init.state, init.cfg.finetune, init.meta, task, label_list, run_cfg.finetune, ckpt
        )
        if head_note:
            say(f"  head       {head_note}")
    init.state = {}
    # the query stream is not used in finetuning: freeze its start vector (DDP rejects parameters without gradients)
    model.transformer.mask_emb.requires_grad_(False)
    return model


def _say_header(
    say: Any, engine: Engine, args: FinetuneArgs, ckpt: Path, workload: FinetuneWorkload, steps: StepCounts
) -> None:
    """The run's header: data (and its notes), batch, optimizer and device lines."""
    task, out, train_data, valid_data = args.task, args.out, workload.train, workload.valid
    ft, label_list = engine.cfg.finetune, train_data.label_list
    say(
        f"[bold]xlnet finetune[/bold] {task} from {ckpt} -> {out}"
        + (f" (resuming at step {engine.step})" if engine.step else "")
    )
    say(
        f"  data       train {len(train_data)} {'features' if task == 'squad' else 'examples'} ({train_data.path})"
        + (f", valid {len(valid_data)} ({valid_data.path})" if valid_data else ", no validation file")
        + (f", {len(label_list)} labels: {', '.join(label_list)}" if label_list else "")
    )
    for d in (train_data, valid_data):
        if d is not None:
            for note in d.notes:
                say(f"[yellow]warning:[/yellow] {Path(d.path).name}: {note}")
    say(
        f"  batch      {ft.batch_size} = micro {ft.micro_batch_size} x accumulation {steps.accumulation} x "
        f"{engine.env.world_size} process(es); {steps.total} steps ({steps.per_epoch} per epoch), "
        f"warmup {steps.warmup}" + (f"; length buckets of {ft.length_buckets} steps" if ft.length_buckets else "")
    )
    if ft.document != "first":
        say(f"  documents  {document_prose(ft)}")
        reach, clamp = ft.memory_length + ft.max_seq_length, engine.cfg.model.clamp_len
        if ft.document == "memory" and 0 < clamp < reach:
            say(
                f"[yellow]warning:[/yellow] the checkpoint's model.clamp_len ({clamp}) is below memory + window "
                f"({reach}): farther keys all read as {clamp} tokens away (a smaller finetune.mem_len avoids it)"
            )
    say(
        f"  optimizer  AdamW lr {ft.lr:g}, layer decay {ft.layer_decay:g}, wd {ft.weight_decay:g}, "
        f"dropout {ft.dropout:g}/{ft.dropatt:g}; device {device_prose(engine)}"
    )
    if engine.relayout:
        say(f"  layout     {engine.relayout}")
    if (changed := engine.changes_text()) is not None:
        say(f"  changed    {changed}")


@contextlib.contextmanager
def _removed_on_failure(partial: Path, main: bool) -> Iterator[None]:
    """A failure (or SIGTERM) before the first resumable checkpoint leaves nothing behind: nothing to resume from."""
    try:
        yield
    except BaseException:
        if main and not resumable_steps(partial):
            shutil.rmtree(partial, ignore_errors=True)
        raise


def _commit_results(workload: FinetuneWorkload, result: dict, out: Path, partial: Path, say: Any) -> dict[str, Any]:
    """results.json into the partial folder, then the commit (prune, rename); the closing line."""
    best, train_data, valid_data = workload.tracker.best, workload.train, workload.valid
    results = {
        "task": workload.task,
        "out": str(out),
        "steps": result["step"],
        "best_step": best["step"],
        "checkpoint": str(out / step_dir_name(best["step"])) if best["step"] is not None else None,
        "metric": best["metric"],
        "value": best["value"] if best["value"] is not None and math.isfinite(best["value"]) else None,
        "valid": best["metrics"],
        "train_examples": len(train_data.examples),
        "train_rows": len(train_data),
        "valid_examples": len(valid_data.examples) if valid_data else 0,
        "labels": train_data.label_list,
        "seconds": round(result["elapsed_s"], 2),
        "stopped_early": workload.tracker.stopped_early,
        "notes": (train_data.notes + (valid_data.notes if valid_data else [])),
        "final_train_loss": result["loss"],
    }
    if workload.env.is_main:
        atomic_write_json(partial / "results.json", results)
        _commit(partial, out, best["step"])
    dist.barrier()
    if result["already_complete"]:
        _say_complete(say, out, results)
    elif best["metrics"]:
        say(
            f"  best {best['metric']} {best['value']:.4f} at step {best['step']} -> {results['checkpoint']} "
            f"({result['elapsed_s']:.1f}s)"
        )
    return results
