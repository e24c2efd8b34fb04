"""The finetuning workload the engine runs (train/workload.py): the shuffled example order, the head's loss, validation
with the task metric, the best checkpoint and early stopping; the run's arguments (``FinetuneArgs``) and batch maths
(``StepCounts``), and its ``TrainPlan``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from xlnetcli.config import Config
from xlnetcli.core import dist
from xlnetcli.core.errors import CheckpointError, DataError
from xlnetcli.core.files import sha256_file
from xlnetcli.data import labelled
from xlnetcli.evaluate.finetuned import TRAIN_KEYS, TaskData, make_batch, predict, primary_metric, score
from xlnetcli.model.flops import forward_flops
from xlnetcli.train.plan import TrainPlan
from xlnetcli.train.workload import Evaluation, Hints


@dataclass(frozen=True)
class FinetuneArgs:
    """What one finetuning call is asked, besides its config (``finetune(cfg, args)``; the CLI builds it from its
    options): built once and passed down."""

    task: str
    """classification, regression, multiple-choice or squad (``labelled.TASKS``)."""
    train: Path
    """The training file: TSV/CSV/JSONL, or SQuAD JSON."""
    valid: Path | None
    """The validation file, evaluated as ``finetune.eval_every`` says; None: no validation, the last model is kept."""
    init: Path
    """The starting checkpoint: a pretraining run or step folder, a finetuned checkpoint, or an HF XLNet directory."""
    out: Path
    """The run folder (built in a hidden ``.OUT.partial/`` sibling and renamed when complete)."""
    columns: labelled.Columns | None = None
    """Which columns hold the texts and the label (None: the usual names)."""
    header: bool = True
    """Whether a TSV/CSV file starts with a header row."""
    overwrite: bool = False
    """Replace a finished run in ``out`` (or discard an interrupted one)."""
    device: str | None = "auto"
    """auto, cpu, cuda or cuda:N (under torchrun: cuda:LOCAL_RANK)."""
    quiet: bool = False
    """No progress bar or header."""
    from_scratch: bool = False
    """Take only the architecture and tokenizer from ``init``: random weights (a baseline)."""
    resume: bool = False
    """Continue an interrupted run into ``out`` exactly (a completed one is reported, not redone)."""

    def __post_init__(self) -> None:  # paths given as strings (the Python API) are read as paths
        for name in ("train", "valid", "init", "out"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))


class StepCounts(NamedTuple):
    """The batch maths of a run: micro-batches per step and rank, steps per epoch, steps, warmup steps."""

    accumulation: int
    per_epoch: int
    total: int
    warmup: int


class ExampleOrder:
    """The examples of each optimizer step: the next ``batch_size`` of a shuffled order, a new permutation per epoch,
    the same on every rank (each takes its share). With ``buckets`` N > 0 an epoch's permutation is sorted by length
    (``lengths``) within windows of N steps' worth of examples, cut into steps and the steps of each window shuffled:
    each step then holds examples of similar length, padded less (transformers' group_by_length, with windows of
    steps). Its state: the generator, the permutation (bucketed or not: the epoch's order) and the cursor in it."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, buckets: int = 0) -> None:
        self.lengths, self.batch_size, self.buckets = lengths, batch_size, buckets
        self.rng = np.random.default_rng(seed)
        self.order: np.ndarray = np.empty(0, dtype=np.int64)
        self.cursor = 0
        self.steps = 0  # optimizer steps whose examples were drawn

    def draw(self) -> np.ndarray:
        need, picked = self.batch_size, []
        while need:
            if self.cursor >= len(self.order):
                self.order, self.cursor = self._epoch(need % self.batch_size), 0
            take = self.order[self.cursor : self.cursor + need]
            picked.append(take)
            self.cursor += len(take)
            need -= len(take)
        self.steps += 1
        return np.concatenate(picked)

    def _epoch(self, head: int) -> np.ndarray:
        """A new epoch's order. Its first ``head`` examples complete a step begun in the previous epoch; with buckets,
        the windows start after them, so that every later step is one of a window's."""
        order = self.rng.permutation(len(self.lengths))
        if not self.buckets:
            return order
        n, bs = len(order), self.batch_size
        end = head + max(n - head, 0) // bs * bs  # the rest, a partial step, continues into the next epoch
        parts = [order[:head]]
        for start in range(head, end, self.buckets * bs):
            window = order[start : min(start + self.buckets * bs, end)]
            steps = window[np.argsort(self.lengths[window], kind="stable")].reshape(-1, bs)
            parts.append(steps[self.rng.permutation(len(steps))].ravel())
        parts.append(order[end:])
        return np.concatenate(parts)

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


class FinetuneWorkload:
    """What finetuning plugs into the engine: each step takes the examples ``ExampleOrder`` draws, the head's loss,
    validation with the task metric (each rank predicts its share of the batches, rank 0 scores), early stopping
    (``BestSoFar``), and which step folders stay (the best and the latest resumable one). Its checkpointed state (the
    train state's "task" entry, the same on every rank) is the run's identity (task, labels, file digests), the
    example order and the best so far."""

    loss_name = "loss"
    keep_last = 1  # the latest resumable step folder; pinned_steps adds the best ones
    # the example order is global (each rank takes [rank::world] of a step's examples): a checkpoint resumes on
    # any number of processes and micro-batch size for the same batch_size; only dropout is re-seeded
    elastic = True

    def __init__(
        self,
        args: FinetuneArgs,
        run_cfg: Config,
        data: tuple[TaskData, TaskData | None],
        env: dist.DistEnv,
        steps: StepCounts,
        init_path: Path,
        say: Any,
    ) -> None:
        ft, task = run_cfg.finetune, args.task
        self.name = f"finetune {task}"
        self.hints = Hints(
            lengths=f"finetune.max_seq_length ({ft.max_seq_length})",
            warmup="a larger finetune.warmup_ratio",
            resume="--resume",
            relayout="the same examples each step (the example order is global)",
        )
        self.task, self.cfg, (self.train, self.valid), self.labels = task, run_cfg, data, data[0].label_list
        self.env, self.total, self.steps_per_epoch, self.say = env, steps.total, steps.per_epoch, say
        # what every step folder's meta.json shares, and the data files' digests (a resume must see the same files)
        self.meta_base = {
            "kind": "finetune",
            "task": task,
            "labels": self.labels,
            "init": str(init_path),
            "from_scratch": args.from_scratch,
            "squad_v2": bool(self.valid.squad_v2) if self.valid and task == "squad" else None,
        }
        self.files = {
            "train": sha256_file(args.train),
            **({"valid": sha256_file(args.valid)} if args.valid is not None else {}),
        }
        self.keys = TRAIN_KEYS[task]
        self.lengths, self.real_tokens = self.train.enc.lengths(), self.train.enc.real_tokens()
        self.examples = ExampleOrder(self.lengths, ft.batch_size, ft.seed, ft.length_buckets)
        # a step of several micro-batches is sorted by length before it is split (ranks take every world_size-th):
        # each micro-batch is then padded to little more than its own examples, and the step's gradient is the mean
        # over the same examples. One micro-batch gains nothing, and stays as drawn (dropout's masks on the same rows)
        self.sort_steps = steps.accumulation * env.world_size > 1
        self._mine: np.ndarray = self.examples.order
        self._step_tokens = 0
        self.eval_steps = _eval_steps(ft.eval_every, steps)
        self.tracker = BestSoFar(ft.early_stopping_patience)
        self.saved_best: int | None = None  # the best step the latest resumable step folder records

    # ---- batches and loss ----------------------------------------------------------------------------------------

    def next_batch(self, step: int, micro: int) -> dict:
        mb = self.cfg.finetune.micro_batch_size
        if micro == 0:
            drawn = self.examples.draw()
            if self.sort_steps:
                drawn = drawn[np.argsort(self.lengths[drawn], kind="stable")]
            self._step_tokens = int(self.real_tokens[drawn].sum())
            self._mine = drawn[self.env.rank :: self.env.world_size]
        return make_batch(self.train.enc, self._mine[micro * mb : (micro + 1) * mb], self.keys, self.env.device)

    def step_tokens(self) -> int:
        """The real tokens of the step last drawn, every rank's (padding left out)."""
        return self._step_tokens

    def loss(self, model: torch.nn.Module, batch: dict, micro: int) -> torch.Tensor:
        return model(batch)["loss"]

    # ---- validation and what to keep ---------------------------------------------------------------------------

    def eval_due(self, step: int) -> bool:
        return step in self.eval_steps

    def evaluate(self, model: torch.nn.Module, step: int, log: Any) -> Evaluation | None:
        ft, outputs = self.cfg.finetune, None
        if self.valid is not None and ft.eval_every != "never":  # every rank runs its share of the batches
            outputs = predict(model, self.valid, ft.micro_batch_size * 2, self.env.device, ft.precision)
        ev = self._evaluate(outputs, step, log) if self.env.is_main else None
        ev = dist.broadcast_object(ev)
        if ev is not None and ev.stop:
            self.tracker.stopped_early = True
            self.say(
                f"  early stop at step {step}: {self.cfg.finetune.early_stopping_patience} evaluations "
                "without improvement"
            )
        return ev

    def _evaluate(self, outputs: dict | None, step: int, log: Any) -> Evaluation | None:
        """Validation metrics of the model's ``outputs``; a new best is kept. Without a validation file (no outputs)
        the last model is kept."""
        best = self.tracker.best
        if outputs is None or self.valid is None:
            if step != self.total:
                return None
            best.update(step=step)
            return Evaluation(keep_model=True)
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


def _eval_steps(eval_every: int | str, steps: StepCounts) -> set[int]:
    """The steps finetune.eval_every names, and the last always (with never, where the last model is kept)."""
    if isinstance(eval_every, int):
        due = set(range(eval_every, steps.total + 1, eval_every))
    elif eval_every == "epoch":
        due = {min(steps.total, e * steps.per_epoch) for e in range(1, math.ceil(steps.total / steps.per_epoch) + 1)}
    else:
        due = set()
    return due | {steps.total}


def finetune_plan(run_cfg: Config, train: TaskData, steps: StepCounts) -> TrainPlan:
    """The engine's plan of a finetuning run: the finetune section, the batch maths, the FLOPs per real token for
    MFU."""
    ft, m = run_cfg.finetune, run_cfg.model
    shape = train.enc.arrays["input_ids"].shape  # [N, L] or [N, options, L]
    mb_rows = ft.micro_batch_size * int(np.prod(shape[1:-1], dtype=np.int64))
    # the logged tokens/s counts real tokens (FinetuneWorkload.step_tokens): a sequence of l of them costs a*l + b*l^2
    # (attention), so the FLOPs per real token are those at the token-weighted mean length sum(l^2) / sum(l)
    seqs = train.enc.sequence_lengths().ravel().astype(np.int64)
    L = max(1, round(float((seqs**2).sum() / max(int(seqs.sum()), 1))))
    M, passes = 0, 3.0  # forward + backward (twice the forward)
    if ft.document != "first":  # documents: windows of max_seq_length; with memory, keys over the memory too and the
        # windows before the last grad_windows forward only (model/documents.py)
        L = min(L, ft.max_seq_length)
        windows = max(1.0, float(np.mean(np.ceil(seqs / ft.max_seq_length))))
        if ft.document == "memory":
            M, passes = ft.memory_length, 1.0 + 2.0 * min(ft.grad_windows, windows) / windows
    return TrainPlan.from_config(
        run_cfg,
        "finetune",
        max_steps=steps.total,
        warmup_steps=steps.warmup,
        batch_shape=(ft.batch_size, *(int(n) for n in shape[1:])),
        accumulation=steps.accumulation,
        # the content stream over every real position, no LM head (model/flops.py), for the logged MFU
        flops_per_token=passes * forward_flops(m, mb_rows, L, M, 0, last_layer_query_only=False) / (mb_rows * L),
    )
