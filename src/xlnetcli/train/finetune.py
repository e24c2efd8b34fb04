"""`xlnet finetune`: classification, regression, multiple choice and SQuAD span extraction.

    finetune(cfg, "classification", "train.tsv", "valid.tsv", init="runs/pre", out="runs/sst2")
    finetune(cfg, "classification", "train.tsv", "valid.tsv", init="runs/pre", out="runs/sst2", resume=True)

The loop, precision, checkpoints and resume are the engine's (train/engine.py); this module supplies the finetuning
recipe (the shuffled example order, the head's loss, validation with the task metric, the best checkpoint) and the run
folder. AdamW (no decay on LayerNorm/bias), linear warmup then linear decay, layer-wise lr decay as parameter groups,
dropout/dropatt from cfg.finetune, evaluation every epoch or every N steps, optional early stopping, gradient
accumulation, DDP under torchrun.

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
finished by ``--resume``.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from xlnetcli.checkpoint.folders import step_dir_name, step_folders, tokenizer_dir_of
from xlnetcli.checkpoint.load import load_model_dir, resolve_checkpoint
from xlnetcli.config import Config, check_config, config_from_dict, config_to_dict
from xlnetcli.core import dist
from xlnetcli.core.errors import CheckpointError, ConfigError, DataError, XLNetError
from xlnetcli.core.files import (
    atomic_write_json,
    check_output_dir,
    check_output_not_input,
    commit_dir,
    output_lock,
    sha256_file,
)
from xlnetcli.data import labelled
from xlnetcli.data.tokenizer import Tokenizer
from xlnetcli.evaluate.finetuned import (
    TRAIN_KEYS,
    TaskData,
    build_finetune_model,
    load_pretrained_into,
    load_task_data,
    make_batch,
    predict,
    primary_metric,
    score,
)
from xlnetcli.model.flops import forward_flops
from xlnetcli.model.heads import carry_head
from xlnetcli.report.trackers import require_trackers
from xlnetcli.train.checkpointer import TRAIN_STATE, resumable_steps
from xlnetcli.train.engine import Engine, Evaluation, Hints, TrainPlan, printer, resume_point

# finetune.* keys that may change when resuming (how often metric lines and resumable checkpoints are written, where
# metrics go, the device peak behind the logged MFU: nothing that changes what is computed)
RESUME_MUTABLE = {"finetune.save_every", "finetune.report_to", "finetune.log_every", "finetune.peak_tflops"}


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
# The finetuning recipe


class ExampleOrder:
    """The examples of each optimizer step: the next ``batch_size`` of a shuffled order, a new permutation per epoch,
    the same on every rank (each takes its share). Its state: the generator, the permutation and the cursor in it."""

    def __init__(self, n_examples: int, batch_size: int, seed: int) -> None:
        self.n_examples, self.batch_size = n_examples, batch_size
        self.rng = np.random.default_rng(seed)
        self.order: np.ndarray = np.empty(0, dtype=np.int64)
        self.cursor = 0
        self.steps = 0  # optimizer steps whose examples were drawn

    def draw(self) -> np.ndarray:
        need, picked = self.batch_size, []
        while need:
            if self.cursor >= len(self.order):
                self.order, self.cursor = self.rng.permutation(self.n_examples), 0
            take = self.order[self.cursor : self.cursor + need]
            picked.append(take)
            self.cursor += len(take)
            need -= len(take)
        self.steps += 1
        return np.concatenate(picked)

    def state_dict(self) -> dict:
        return {
            "step": self.steps,
            "rng": self.rng.bit_generator.state,
            "order": torch.from_numpy(self.order.copy()),
            "cursor": self.cursor,
        }

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.order, self.cursor = state["order"].numpy().copy(), int(state["cursor"])
        self.steps = int(state["step"])


def _rank(value: float | None) -> float:
    """A metric for comparison: NaN, None (a NaN written as null) and infinities rank lowest."""
    return value if value is not None and math.isfinite(value) else -math.inf


class BestSoFar:
    """The best validation result so far (the checkpoint kept) and early stopping: evaluations since it improved."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best: dict[str, Any] = {"step": None, "value": -math.inf, "metric": None, "metrics": None}
        self.bad_evals = 0
        self.stopped_early = False

    def update(self, step: int, metric: str, value: float, metrics: dict) -> bool:
        """Record an evaluation; True if it is a new best. A NaN metric (a diverged model, a constant prediction's
        correlation) ranks below every number: kept only until any finite value comes."""
        improved = _rank(value) > _rank(self.best["value"]) or self.best["step"] is None
        if improved:
            self.best.update(step=step, value=value, metric=metric, metrics=metrics)
            self.bad_evals = 0
        else:
            self.bad_evals += 1
        return improved

    def patience_spent(self) -> bool:
        return bool(self.patience) and self.bad_evals >= self.patience

    def state_dict(self) -> dict:
        return {"best": dict(self.best), "bad_evals": self.bad_evals, "stopped_early": self.stopped_early}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.bad_evals = dict(state["best"]), int(state["bad_evals"])
        self.stopped_early = bool(state["stopped_early"])


class FinetuneRecipe:
    """The engine's recipe for finetuning: each step takes the examples ``ExampleOrder`` draws, the head's loss,
    validation with the task metric on rank 0, early stopping (``BestSoFar``), and which step folders stay (the best
    and the latest resumable one). Its checkpointed state (the train state's "task" entry, the same on every rank) is
    the run's identity (task, labels, file digests), the example order and the best so far."""

    loss_name = "loss"
    keep_last = 1  # the latest resumable step folder; pinned_steps adds the best ones
    elastic = False  # each rank draws its share of the examples: resume with the same number of processes

    def __init__(
        self,
        task: str,
        run_cfg: Config,
        train: TaskData,
        valid: TaskData | None,
        label_list: list[str] | None,
        env: dist.DistEnv,
        total: int,
        steps_per_epoch: int,
        meta_base: dict,
        files: dict[str, str],
        say: Any,
    ) -> None:
        ft = run_cfg.finetune
        self.name = f"finetune {task}"
        self.hints = Hints(
            lengths=f"finetune.max_seq_length ({ft.max_seq_length})",
            warmup="a larger finetune.warmup_ratio",
            resume="--resume",
        )
        self.task, self.cfg, self.train, self.valid, self.labels = task, run_cfg, train, valid, label_list
        self.env, self.total, self.steps_per_epoch, self.meta_base, self.files, self.say = (
            env,
            total,
            steps_per_epoch,
            meta_base,
            files,
            say,
        )
        self.keys = TRAIN_KEYS[task]
        self.examples = ExampleOrder(len(train), ft.batch_size, ft.seed)
        self._mine: np.ndarray = self.examples.order
        self.eval_steps = (
            set(range(ft.eval_every, total + 1, ft.eval_every))
            if isinstance(ft.eval_every, int)
            else {min(total, e * steps_per_epoch) for e in range(1, math.ceil(total / steps_per_epoch) + 1)}
            if ft.eval_every == "epoch"
            else set()
        )
        self.eval_steps.add(total)  # the last step always: with eval_every=never, where the last model is kept
        self.tracker = BestSoFar(ft.early_stopping_patience)
        self.saved_best: int | None = None  # the best step the latest resumable step folder records

    # ---- batches and loss ----------------------------------------------------------------------------------------

    def next_batch(self, step: int, micro: int) -> dict:
        mb = self.cfg.finetune.micro_batch_size
        if micro == 0:
            self._mine = self.examples.draw()[self.env.rank :: self.env.world_size]
        return make_batch(self.train.enc, self._mine[micro * mb : (micro + 1) * mb], self.keys, self.env.device)

    def loss(self, model: torch.nn.Module, batch: dict, micro: int) -> torch.Tensor:
        return model(batch)["loss"]

    # ---- validation and what to keep ---------------------------------------------------------------------------

    def eval_due(self, step: int) -> bool:
        return step in self.eval_steps

    def evaluate(self, model: torch.nn.Module, step: int, log: Any) -> Evaluation | None:
        ev = self._evaluate(model, step, log) if self.env.is_main else None
        ev = dist.broadcast_object(ev)
        if ev is not None and ev.stop:
            self.tracker.stopped_early = True
            self.say(
                f"  early stop at step {step}: {self.cfg.finetune.early_stopping_patience} evaluations "
                "without improvement"
            )
        return ev

    def _evaluate(self, model: torch.nn.Module, step: int, log: Any) -> Evaluation | None:
        """Validation metrics; a new best is kept. Without a validation file the last model is kept."""
        ft, best = self.cfg.finetune, self.tracker.best
        if self.valid is None or ft.eval_every == "never":
            if step != self.total:
                return None
            best.update(step=step)
            return Evaluation(keep_model=True)
        outputs = predict(model, self.valid, ft.micro_batch_size * 2, self.env.device, ft.precision)
        metrics, _ = score(self.valid, outputs, self.labels, self.cfg)
        name, value = primary_metric(self.task, metrics)
        log(step, "eval", metric=value, metric_name=name, **metrics)
        improved = self.tracker.update(step, name, value, metrics)
        stop = self.tracker.patience_spent() and step < self.total
        best = self.tracker.best
        self.say(
            f"  step {step}: {name} {value:.4f}"
            + (" (best so far, saved)" if improved else f" (best {best['value']:.4f} at step {best['step']})")
        )
        return Evaluation(metrics=metrics, keep_model=improved, stop=stop)

    def log_extras(self, step: int) -> dict:
        return {"epoch": round(step / self.steps_per_epoch, 3)}

    def step_meta(self, step: int) -> dict:
        meta = dict(self.meta_base)
        best = self.tracker.best
        if step == best["step"] and best["metrics"] is not None:
            meta.update(metric=best["metric"], value=best["value"], metrics=best["metrics"])
            if self.task == "squad" and "best_f1_thresh" in best["metrics"]:
                meta["null_odds_threshold"] = best["metrics"]["best_f1_thresh"]
        return meta

    def pinned_steps(self, with_state: bool) -> set[int]:
        """Besides the latest resumable step folder: the best one, and the best that folder records (a resume from it
        needs it)."""
        if with_state:
            self.saved_best = self.tracker.best["step"]
        return {s for s in (self.saved_best, self.tracker.best["step"]) if s is not None}

    # ---- checkpointed state (the same on every rank) ---------------------------------------------------------------

    def states(self) -> dict:
        return {"task": self}  # the entry's name in train_state.safetensors

    def rank_states(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {
            "task": self.task,
            "labels": self.labels,
            "files": self.files,
            **self.examples.state_dict(),
            **self.tracker.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("task") != self.task or state.get("labels") != self.labels:
            raise CheckpointError(
                f"the run being resumed finetunes {state.get('task')} with labels "
                f"{state.get('labels')}, not {self.task} with {self.labels}; start again with "
                "--overwrite"
            )
        for split, digest in self.files.items():
            if state["files"].get(split) != digest:
                raise DataError(
                    f"the {split} file differs from the one the run started with (sha256); resume with "
                    "the same files, or start again with --overwrite"
                )
        self.examples.load_state_dict(state)
        self.tracker.load_state_dict(state)
        self.saved_best = self.tracker.best["step"]


def finetune_plan(run_cfg: Config, train: TaskData, accum: int, total: int, warmup: int) -> TrainPlan:
    ft, m = run_cfg.finetune, run_cfg.model
    shape = train.enc.arrays["input_ids"].shape  # [N, L] or [N, options, L]
    rows, L = int(np.prod(shape[1:-1], dtype=np.int64)), int(shape[-1])
    mb_rows = ft.micro_batch_size * rows
    return TrainPlan.from_config(
        run_cfg,
        "finetune",
        max_steps=total,
        warmup_steps=warmup,
        global_batch_size=ft.batch_size,
        accumulation=accum,
        seq_len=L,
        rows=rows,
        # the content stream over every position, no memory, no LM head (model/flops.py), for the logged MFU
        flops_per_token=3.0 * forward_flops(m, mb_rows, L, 0, 0, last_layer_query_only=False) / (mb_rows * L),
    )


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


def finetune(
    cfg: Config,
    task: str,
    train: str | Path,
    valid: str | Path | None,
    init: str | Path,
    out: str | Path,
    columns: labelled.Columns | None = None,
    header: bool = True,
    overwrite: bool = False,
    device: str | None = "auto",
    quiet: bool = False,
    from_scratch: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Finetune ``init`` (a pretraining run/step folder, a finetuned checkpoint or an HF directory) on ``train``;
    evaluate on ``valid``; keep the best checkpoint in ``out``. Returns the results dict (also out/results.json).
    ``from_scratch`` takes only the architecture and tokenizer from ``init`` (random weights: a baseline).
    ``resume`` continues an interrupted run into ``out`` exactly (a completed one is reported, not redone).
    On SIGTERM the run stops after the current step with a checkpoint and raises errors.Preempted (exit code 75)."""
    if task not in labelled.TASKS:
        raise ConfigError(f"unknown task {task!r} (choose from {', '.join(labelled.TASKS)})")
    env = dist.init_distributed(device)
    try:
        out = Path(out)
        check_output_not_input(out, [init, train, valid])
        # one writer per output (rank 0 holds the lock for all ranks; the .partial folder is covered by it)
        with output_lock(out) if env.rank == 0 else contextlib.nullcontext():
            return _finetune(
                cfg,
                task,
                Path(train),
                Path(valid) if valid else None,
                Path(init),
                out,
                columns,
                header,
                overwrite,
                env,
                quiet,
                from_scratch,
                resume,
            )
    finally:
        dist.cleanup()


@dataclass
class InitCheckpoint:
    """What ``--init`` gives the run: its folder, config, weights, meta.json and tokenizer."""

    path: Path
    cfg: Config
    state: dict[str, torch.Tensor]
    meta: dict
    tokenizer_dir: Path
    tokenizer: Tokenizer


class StepCounts(NamedTuple):
    """The batch maths of a run: micro-batches per step and rank, steps per epoch, steps, warmup steps."""

    accumulation: int
    per_epoch: int
    total: int
    warmup: int


def _finetune(
    cfg: Config,
    task: str,
    train: Path,
    valid: Path | None,
    init: Path,
    out: Path,
    columns: labelled.Columns | None,
    header: bool,
    overwrite: bool,
    env: dist.DistEnv,
    quiet: bool,
    from_scratch: bool,
    resume: bool,
) -> dict[str, Any]:
    """The steps of one finetuning call: the run folder's state, the init checkpoint, the data, the batch maths, the
    resume point, the model, the training and the commit."""
    say = printer(env.is_main and not quiet)
    require_trackers(cfg.finetune.report_to)
    partial = partial_dir(out)
    mode = dist.broadcast_object(_run_mode(out, partial, resume, overwrite))
    if mode in ("complete", "finish"):
        return _report_finished(mode, out, partial, env, say)

    init_ckpt = _load_init(init)
    run_cfg = run_config(init_ckpt.cfg, cfg)
    _check_vocab(init_ckpt, run_cfg)
    train_data, valid_data = _load_data(task, train, valid, init_ckpt.tokenizer, run_cfg, columns, header)
    check_config(run_cfg, env.world_size, stage="finetune", device=env.device)
    steps = _step_counts(run_cfg, len(train_data), env.world_size)
    start = _resume_point(run_cfg, partial) if mode == "resume" else None
    model = _build_model(run_cfg, task, train_data.label_list, init_ckpt, from_scratch, start is None, say)
    model.to(env.device).train()

    recipe = _make_recipe(task, run_cfg, train_data, valid_data, init_ckpt, from_scratch, train, valid, env, steps, say)
    plan = finetune_plan(run_cfg, train_data, steps.accumulation, steps.total, steps.warmup)
    if env.is_main and mode == "fresh" and partial.exists():
        shutil.rmtree(partial)  # --overwrite: an interrupted earlier run is discarded
    dist.barrier()
    engine = Engine(
        model,
        recipe,
        plan,
        env,
        partial,
        run_cfg,
        init_ckpt.tokenizer_dir,
        quiet,
        resume_from=start[1] if start is not None else None,
        report_to=run_cfg.finetune.report_to,
    )
    with _removed_on_failure(partial, env.is_main):
        engine.setup()
        _say_header(say, engine, task, init_ckpt.path, out, train_data, valid_data, steps)
        result = engine.fit()
    return _commit_results(recipe, result, out, partial, train_data, valid_data, say)


def _check_vocab(init_ckpt: InitCheckpoint, run_cfg: Config) -> None:
    """The init checkpoint's tokenizer must have exactly as many pieces as the run's model has embeddings."""
    if init_ckpt.tokenizer.vocab_size != run_cfg.model.vocab_size:
        raise CheckpointError(
            f"tokenizer in {init_ckpt.tokenizer_dir} has {init_ckpt.tokenizer.vocab_size} pieces "
            f"but the model's vocab_size is {run_cfg.model.vocab_size}"
        )


def _make_recipe(
    task: str,
    run_cfg: Config,
    train_data: TaskData,
    valid_data: TaskData | None,
    init_ckpt: InitCheckpoint,
    from_scratch: bool,
    train: Path,
    valid: Path | None,
    env: dist.DistEnv,
    steps: StepCounts,
    say: Any,
) -> FinetuneRecipe:
    """The engine's recipe, with the meta.json fields every step folder shares and the data files' hashes."""
    meta_base = {
        "kind": "finetune",
        "task": task,
        "labels": train_data.label_list,
        "init": str(init_ckpt.path),
        "from_scratch": from_scratch,
        "squad_v2": bool(valid_data.squad_v2) if valid_data and task == "squad" else None,
    }
    files = {"train": sha256_file(train), **({"valid": sha256_file(valid)} if valid is not None else {})}
    return FinetuneRecipe(
        task,
        run_cfg,
        train_data,
        valid_data,
        train_data.label_list,
        env,
        steps.total,
        steps.per_epoch,
        meta_base,
        files,
        say,
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


def _load_init(init: Path) -> InitCheckpoint:
    path = resolve_checkpoint(init)
    init_cfg, state, meta = load_model_dir(path)
    tok_dir = tokenizer_dir_of(path)
    return InitCheckpoint(path, init_cfg, state, meta, tok_dir, Tokenizer.load(tok_dir))


def _load_data(
    task: str,
    train: Path,
    valid: Path | None,
    tok: Tokenizer,
    run_cfg: Config,
    columns: labelled.Columns | None,
    header: bool,
) -> tuple[TaskData, TaskData | None]:
    """The training and validation examples, encoded (validation labels must be among the training ones)."""
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
    )
    return dist.broadcast_object(start)


def _step_counts(run_cfg: Config, n_train: int, world: int) -> StepCounts:
    ft = run_cfg.finetune
    per_epoch = max(1, math.ceil(n_train / ft.batch_size))
    total = ft.max_steps if ft.max_steps is not None else max(1, math.ceil(ft.epochs * per_epoch))
    return StepCounts(ft.batch_size // (ft.micro_batch_size * world), per_epoch, total, round(ft.warmup_ratio * total))


def _build_model(
    run_cfg: Config,
    task: str,
    label_list: list[str] | None,
    init_ckpt: InitCheckpoint,
    from_scratch: bool,
    load_init: bool,
    say: Any,
) -> torch.nn.Module:
    """The task model: random weights with ``from_scratch``; else the init checkpoint's (and its head when it fits)
    unless ``load_init`` is False (a resume loads its own). Frees the init weights."""
    torch.manual_seed(run_cfg.finetune.seed)
    model = build_finetune_model(run_cfg, task, len(label_list) if label_list else 1)
    ckpt = init_ckpt.path
    if from_scratch:
        say(f"  init       random weights (architecture and tokenizer of {ckpt}; --from-scratch baseline)")
    elif load_init:
        load_pretrained_into(model, init_ckpt.state, f"checkpoint {ckpt}")
        head_note = carry_head(
            model, init_ckpt.state, init_ckpt.cfg.finetune, init_ckpt.meta, task, label_list, run_cfg.finetune, ckpt
        )
        if head_note:
            say(f"  head       {head_note}")
    init_ckpt.state = {}
    # the query stream is not used in finetuning: freeze its start vector (DDP rejects parameters without gradients)
    model.transformer.mask_emb.requires_grad_(False)
    return model


def _say_header(
    say: Any,
    engine: Engine,
    task: str,
    ckpt: Path,
    out: Path,
    train_data: TaskData,
    valid_data: TaskData | None,
    steps: StepCounts,
) -> None:
    """The run's header: data (and its notes), batch, optimizer and device lines."""
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
        f"warmup {steps.warmup}"
    )
    say(
        f"  optimizer  AdamW lr {ft.lr:g}, layer decay {ft.layer_decay:g}, wd {ft.weight_decay:g}, "
        f"dropout {ft.dropout:g}/{ft.dropatt:g}; device {engine.describe()}"
    )


@contextlib.contextmanager
def _removed_on_failure(partial: Path, main: bool) -> Iterator[None]:
    """A failure (or SIGTERM) before the first resumable checkpoint leaves nothing behind: nothing to resume from."""
    try:
        yield
    except BaseException:
        if main and not resumable_steps(partial):
            shutil.rmtree(partial, ignore_errors=True)
        raise


def _commit_results(
    recipe: FinetuneRecipe,
    result: dict,
    out: Path,
    partial: Path,
    train_data: TaskData,
    valid_data: TaskData | None,
    say: Any,
) -> dict[str, Any]:
    """results.json into the partial folder, then the commit (prune, rename); the closing line."""
    best = recipe.tracker.best
    results = {
        "task": recipe.task,
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
        "stopped_early": recipe.tracker.stopped_early,
        "notes": (train_data.notes + (valid_data.notes if valid_data else [])),
        "final_train_loss": result["loss"],
    }
    if recipe.env.is_main:
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
