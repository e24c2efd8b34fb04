"""The training engine shared by pretraining and finetuning.

    engine = Engine(model, recipe, plan, env, run_dir, cfg, tokenizer_dir, resume_from=step_folder)
    engine.setup()          # resume weights and train state, distributed wrapping, optimizer, run folder
    summary = engine.fit()  # train_step -> log -> evaluate -> save, until max_steps, an early stop or SIGTERM

Shaped after torchtitan's ``Trainer.train()`` (a short loop of train_step, validator, checkpointer) and litgpt's
setup -> fit -> validate. The engine owns what both trainings share: gradient accumulation (DDP's ``no_sync`` on all
but the last micro-batch), mixed precision (autocast, and a ``GradScaler`` that is a pass-through unless fp16 on CUDA),
global-norm clipping, the AdamW step and the lr schedule (train/optim.py), the cadence of logging, evaluation and
checkpoints, out-of-memory and non-finite diagnosis, throughput / MFU / peak memory, the progress bar (or one plain
line per interval when stderr is not a terminal), distributed wrapping (model/parallel.py), preemption and exact resume.
A step's loss and gradient norm stay on the device (``StepFigures``) until ``settle`` reads them. With a fused AdamW
(CUDA), no grad scaler and no FSDP, a non-finite step is skipped on the device (the optimizer's ``found_inf``) and
checked one step later, as is the ranks' agreement on SIGTERM: the host launches step N+1 while the device finishes
step N, and waits only for the rows it logs, evaluations and checkpoints (issue 23: no host sync inside the step).
Otherwise (CPU, fp16 with its scaler, FSDP) the figures are read once per optimizer step, before the update; never
per micro-batch.

A recipe (``pretrain.PretrainRecipe``, ``finetune.FinetuneRecipe``) is what a training run plugs into the engine:

    name, loss_name                    progress-bar label; what the loss is called in messages ("PLM loss")
    hints                              ``Hints``: the advice of out-of-memory, divergence and preemption messages
    next_batch(step, micro)            micro-batch ``micro`` of optimizer step ``step``, on the device
    loss(model, batch, micro)          the scalar loss of one micro-batch (called under autocast)
    eval_due(step), evaluate(model, step, log) -> Evaluation | None
    log_extras(step)                   extra fields of a train row (finetuning: epoch)
    step_meta(step)                    meta.json of a step folder
    states(), rank_states()            its stateful objects, shared by the ranks (finetuning: "task", the example
                                       order and the best so far) and of one rank (pretraining: "data", the records
                                       cursor, and "mems", the Transformer-XL memories)
    elastic                            True: a checkpoint of another layout (processes, micro-batch size) resumes, its
                                       rank states re-assigned (checkpointer.Reassignable) and dropout re-seeded
    keep_last, pinned_steps(with_state)  which step folders stay after a save (rotation, the best checkpoint)

Everything kept across steps is one collection of stateful objects (``state_dict()`` / ``load_state_dict()``), saved
and loaded by ``train.checkpointer.Checkpointer``: {model, train (step, tokens seen, loss window), optimizer, scaler,
**recipe.states()} once, and {rng, **recipe.rank_states()} of every rank. A resumable step folder (written to a
temporary folder and renamed) holds model.safetensors, config.yaml, tokenizer/, meta.json and
train_state.safetensors; the lr schedule is a function of the step (optim.lr_factor).

SIGTERM (what schedulers send before they kill) finishes the current optimizer step (its evaluation included), writes a
checkpoint and raises ``Preempted`` (exit code 75); ``--resume`` then continues exactly.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from xlnetcli.checkpoint.folders import step_folders
from xlnetcli.config import Config, config_to_dict, load_config, save_config
from xlnetcli.core import dist
from xlnetcli.core.console import console, duration, progress_is_live, step_progress
from xlnetcli.core.dist import autocast_ctx
from xlnetcli.core.errors import CheckpointError, ConfigError, Preempted, XLNetError
from xlnetcli.core.files import atomic_write_text
from xlnetcli.core.shapes import dumps_strict
from xlnetcli.model import parallelize
from xlnetcli.model.flops import device_peak_tflops
from xlnetcli.report.metrics_log import MetricsLogger, NullLogger, read_metrics
from xlnetcli.train.checkpointer import (
    MODEL,
    PROGRESS,
    TRAIN_STATE,
    Checkpointer,
    ModelState,
    OptimizerState,
    Stateful,
    resumable_steps,
)
from xlnetcli.train.optim import build_optimizer, lr_factor, set_lr


@dataclass
class TrainPlan:
    """What the engine needs from a config section (``train`` for pretraining, ``finetune`` for finetuning); built by
    ``TrainPlan.from_config``."""

    section: str  # the config section; messages name its keys
    max_steps: int
    lr: float
    warmup_steps: int
    clip_norm: float
    precision: str
    micro_batch_size: int
    global_batch_size: int
    accumulation: int
    seq_len: int
    tokens_per_step: int
    log_every: int
    save_every: int  # steps between resumable checkpoints (0: only at the end, or at evaluations with save_on_eval)
    weight_decay: float
    adam_eps: float
    adam_betas: tuple[float, float] = (0.9, 0.999)
    schedule: str = "linear"
    min_lr_ratio: float = 0.0
    layer_decay: float = 1.0
    n_layer: int | None = None
    micro_multiple: int = 1  # micro-batch sizes must be multiples of this (2 with bi_data)
    activation_checkpointing: bool | None = None  # None: the section has no such key
    save_on_eval: bool = False  # also write a resumable checkpoint at every evaluation step
    compile: bool = False
    cuda_graphs: bool = False  # each compiled layer replayed as a CUDA graph (needs compile)
    distributed: str = "ddp"
    flops_per_token: float | None = None  # model FLOPs of a training step per token (model/flops.py), for MFU
    peak_tflops: float = 0.0  # configured device peak (0: from the GPU's name)

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        section: str,
        *,
        max_steps: int,
        warmup_steps: int,
        global_batch_size: int,
        accumulation: int,
        seq_len: int,
        flops_per_token: float | None,
        rows: int = 1,
    ) -> TrainPlan:
        """The plan of ``cfg``'s ``section``; the arguments are what the two trainings derive differently. ``rows``:
        sequences per example (the options of a multiple-choice example). Keys the section lacks (finetune has no
        schedule, adam_betas, compile, ...; train no layer_decay) keep the defaults above. save_every's words: "end"
        saves only at the end, "eval" at every evaluation (save_on_eval)."""
        sec = getattr(cfg, section)
        optional = (
            "adam_betas",
            "schedule",
            "min_lr_ratio",
            "layer_decay",
            "activation_checkpointing",
            "compile",
            "cuda_graphs",
            "distributed",
        )
        return cls(
            section=section,
            max_steps=max_steps,
            lr=sec.lr,
            warmup_steps=warmup_steps,
            clip_norm=sec.clip_norm,
            precision=sec.precision,
            micro_batch_size=sec.micro_batch_size,
            global_batch_size=global_batch_size,
            accumulation=accumulation,
            seq_len=seq_len,
            tokens_per_step=global_batch_size * rows * seq_len,
            log_every=sec.log_every,
            save_every=sec.save_every if isinstance(sec.save_every, int) else 0,  # "end" or "eval": none by count
            save_on_eval=sec.save_every == "eval",
            weight_decay=sec.weight_decay,
            adam_eps=sec.adam_eps,
            n_layer=cfg.model.n_layer,
            micro_multiple=2 if cfg.model.bi_data else 1,
            flops_per_token=flops_per_token,
            peak_tflops=sec.peak_tflops,
            **{key: getattr(sec, key) for key in optional if hasattr(sec, key)},
        )


@dataclass(frozen=True)
class Hints:
    """A recipe's advice in the engine's messages, naming its own config keys."""

    lengths: str  # out of memory: the length keys to lower, with their values
    warmup: str  # divergence: how to warm up longer
    resume: str = "--resume {step}"  # how to continue from a checkpoint of step {step}


@dataclass
class Evaluation:
    """What a recipe's evaluation tells the engine: its metrics, whether to keep the model of this step (a new best),
    and whether to stop (early stopping)."""

    metrics: dict | None = None
    keep_model: bool = False
    stop: bool = False


class Recipe(Protocol):
    """What a training run plugs into the engine (see the module docstring)."""

    name: str
    loss_name: str
    hints: Hints
    keep_last: int
    elastic: bool

    def next_batch(self, step: int, micro: int) -> Any: ...
    def loss(self, model: torch.nn.Module, batch: Any, micro: int) -> torch.Tensor: ...
    def eval_due(self, step: int) -> bool: ...
    def evaluate(self, model: torch.nn.Module, step: int, log: Callable[..., None]) -> Evaluation | None: ...
    def log_extras(self, step: int) -> dict: ...
    def step_meta(self, step: int) -> dict: ...
    def states(self) -> dict[str, Stateful]: ...
    def rank_states(self) -> dict[str, Stateful]: ...
    def pinned_steps(self, with_state: bool) -> set[int]: ...


# ----------------------------------------------------------------------------------------------------------------
# RNG state (tensors and plain values only: save_tree stores nothing else)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    legacy = np.random.get_state()  # the global RandomState is MT19937: its legacy tuple (the stub also allows a dict)
    assert isinstance(legacy, tuple)
    name, keys, pos, has_gauss, cached = legacy
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.set_rng_state_all(state["cuda"])


class RandomState:
    """This process's random number generators (python, numpy, torch, CUDA): dropout masks and sampling continue
    after a resume as they would have. A process's generators have no counterpart in another layout: a resume with
    another number of processes or micro-batch size calls ``reseed`` instead (``load_state_dicts``)."""

    def __init__(self, reseed: Callable[[], None] | None = None) -> None:
        self.reseed = reseed

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state)

    def load_state_dicts(self, states: list[dict]) -> None:
        assert self.reseed is not None  # only elastic runs re-assign their rank states
        self.reseed()


def layout_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank ``rank``'s generators after a resume at ``step`` with another layout: deterministic, so two
    such resumes give the same run, but its dropout masks are not the uninterrupted run's."""
    return int(np.random.SeedSequence([seed, step, rank, 0x1A7]).generate_state(1)[0])


@dataclass
class TrainProgress:
    """The engine's counters (torchtitan's train_state): optimizer steps done, tokens trained on, the losses of the
    steps since the last train row (their mean is logged), and the batch layout they were counted under."""

    world_size: int
    accumulation: int
    step: int = 0
    tokens_seen: int = 0
    log_window: list[float] = field(default_factory=list)

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "world_size": self.world_size,
            "accumulation": self.accumulation,
            "log_window": list(self.log_window),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.log_window = [float(v) for v in state.get("log_window", [])]


# ----------------------------------------------------------------------------------------------------------------
# Run folders: which checkpoint to resume from, rotation, clean-up


def run_config_file(run_dir: str | Path) -> Path | None:
    """The run's config.yaml or, when it was removed, the latest checkpoint's copy (every step folder has one)."""
    run_cfg = Path(run_dir) / "config.yaml"
    if run_cfg.is_file():
        return run_cfg
    return next((p / "config.yaml" for _, p in reversed(step_folders(run_dir)) if (p / "config.yaml").is_file()), None)


def config_diff(a: dict, b: dict, ignore: set[str] | frozenset[str] = frozenset()) -> list[tuple[str, Any, Any]]:
    out = []
    for section in a:
        for key in a[section]:
            dotted = f"{section}.{key}"
            if dotted in ignore:
                continue
            va, vb = a[section].get(key), b.get(section, {}).get(key)
            if va != vb:
                out.append((dotted, va, vb))
    return out


def resume_point(
    cfg: Config,
    run_dir: Path,
    resume: str | None,
    what: str,
    sections: tuple[str, ...],
    mutable: set[str],
    same_config: str,
) -> tuple[int, Path] | None:
    """Refuse to mix runs; return the checkpoint to resume from (step, folder), or None to start afresh.

    ``what`` names the run ("pretraining run"); ``sections`` are the config sections that must agree on resume except
    the ``mutable`` keys; ``same_config`` tells the user how to resume with the run's own config."""
    if run_dir.exists() and not run_dir.is_dir():
        raise XLNetError(f"output path {run_dir} exists and is not a folder")
    run_cfg = run_config_file(run_dir)
    ckpts = resumable_steps(run_dir)
    if run_cfg is None:
        junk = [p for p in run_dir.iterdir() if not p.name.startswith(".")] if run_dir.is_dir() else []
        if junk:
            raise XLNetError(f"output folder {run_dir} is not empty and holds no {what}; choose another --out")
        if resume not in (None, "latest"):
            raise CheckpointError(f"nothing to resume: {run_dir} holds no {what}")
        return None
    if resume is None and not step_folders(run_dir) and (run_dir / "metrics.jsonl").is_file():
        return None  # a run killed before its first checkpoint (it logged, so it is ours): nothing to lose, start again
    try:
        old = load_config(run_cfg, upgrade=True)
    except ConfigError as e:
        raise CheckpointError(f"{run_cfg} is not a valid config ({e}); choose another --out") from None
    if resume is None:
        last = f" (last checkpoint step {ckpts[-1][0]})" if ckpts else ""
        raise XLNetError(
            f"output folder {run_dir} already holds a {what}{last}; pass --resume to continue it "
            "or choose another --out"
        )
    _check_same_config(old, cfg, sections, mutable, run_dir, same_config)
    return _pick_checkpoint(ckpts, resume, run_dir)


def _check_same_config(
    old: Config, cfg: Config, sections: tuple[str, ...], mutable: set[str], run_dir: Path, same_config: str
) -> None:
    """Refuse to resume the run in ``run_dir`` (config ``old``) with a config differing in ``sections`` outside the
    ``mutable`` keys; the error names the first difference."""
    have = {k: v for k, v in config_to_dict(old).items() if k in sections}
    diff = config_diff(have, config_to_dict(cfg), mutable)
    if diff:
        key, was, now = diff[0]
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        raise XLNetError(
            f"output folder {run_dir} holds a run with {key}={was!r} but this config has "
            f"{key}={now!r}{more}; {same_config}"
        )


def _pick_checkpoint(ckpts: list[tuple[int, Path]], resume: str, run_dir: Path) -> tuple[int, Path] | None:
    """The checkpoint ``resume`` ("latest" or a step number) names among the run's resumable ``ckpts`` (None:
    "latest" of a run killed before its first checkpoint)."""
    if not ckpts:
        weights_only = step_folders(run_dir)
        if weights_only:
            raise CheckpointError(
                f"{weights_only[-1][1]} has weights but no {TRAIN_STATE}, so the run cannot continue exactly "
                "(restore the file, or use those weights elsewhere and train in another --out)"
            )
        if resume == "latest":
            return None  # killed before the first checkpoint: start again in the same folder
        raise CheckpointError(f"no checkpoint step {resume} in {run_dir}: it holds no checkpoint yet")
    if resume == "latest":
        return ckpts[-1]
    try:
        want = int(resume)
    except ValueError:
        raise XLNetError(f"--resume takes 'latest' or a step number, got {resume!r}") from None
    for step, path in ckpts:
        if step == want:
            return step, path
    have_steps = ", ".join(str(s) for s, _ in ckpts)
    raise CheckpointError(f"no checkpoint step {want} in {run_dir} (have: {have_steps})")


def truncate_metrics(run_dir: Path, step: int) -> None:
    """On resume drop the metric rows logged after the checkpoint (they will be logged again, identically)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(dumps_strict(r) + "\n" for r in rows))


def printer(enabled: bool) -> Callable[..., None]:
    """console.print, one unwrapped line per message (rank 0, not quiet); a no-op otherwise."""
    if not enabled:
        return lambda *a, **k: None
    return lambda *a, **k: console.print(*a, soft_wrap=True, **k)


# ----------------------------------------------------------------------------------------------------------------
# Diagnosis messages


def oom_message(plan: TrainPlan, lengths: str, world: int, device: torch.device, where: str) -> str:
    """Out of memory: the settings to lower, naming the section's keys; ``lengths`` are the recipe's (``Hints``)."""
    mb, multiple, s = plan.micro_batch_size, plan.micro_multiple, plan.section
    smaller = max(multiple, (mb // 2) // multiple * multiple)
    tips = []
    if smaller < mb:
        tips.append(
            f"--set {s}.micro_batch_size={smaller} (accumulation becomes "
            f"{plan.global_batch_size // (smaller * world)}, same global batch)"
        )
    if plan.activation_checkpointing is False:
        tips.append(f"--set {s}.activation_checkpointing=true")
    if plan.precision == "fp32" and device.type == "cuda":
        tips.append(f"--set {s}.precision=bf16")
    tips.append(f"or lower {lengths}")
    return (
        f"out of memory on {device} during {where} with micro-batch {mb} x seq {plan.seq_len} "
        f"(accumulation {plan.accumulation}, {world} process(es)); try " + ", ".join(tips)
    )


class HostCopy:
    """A small device tensor copied to pinned host memory behind the work that made it: ``read()`` waits for that work
    alone, not for the kernels queued after it (a plain read of a device tensor waits for the whole queue).
    ``later=False``: it is read at once, so it stays where it is (the read is the sync)."""

    def __init__(self, t: torch.Tensor, later: bool = True) -> None:
        self.copied: Any = None
        if later and t.device.type == "cuda":
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()
            t = host
        self.t = t

    def read(self) -> list:
        if self.copied is not None:
            self.copied.synchronize()
        return self.t.tolist()


@dataclass
class StepFigures:
    """One optimizer step's figures, until ``Engine.settle`` reads them."""

    step: int  # the step they belong to (1-based, as logged)
    values: HostCopy  # [2]: the mean loss over micro-batches and ranks, the gradient norm before clipping
    losses: torch.Tensor  # this rank's micro-batch losses (to name the micro-batch that went non-finite)
    # a deferred check's per-parameter gradient norms and their parameters' names (the gradients are freed by then)
    param_norms: torch.Tensor | None = None
    param_names: list[str] | None = None


def fused_adamw(device: torch.device) -> bool:
    """AdamW's fused kernels on CUDA (one launch per parameter group, and ``found_inf``); the CPU keeps foreach."""
    return device.type == "cuda"


def deferred_check(fused: bool, scaler_enabled: bool, sharded: bool) -> bool:
    """Whether a step's non-finite check may come after its update: fused AdamW skips a flagged update on the device
    (``found_inf``), which fp16's grad scaler claims for its own inf check. Under DDP every rank holds the same
    all-reduced gradients, so every rank skips alike; FSDP's sharded gradients keep the check before the update."""
    return fused and not scaler_enabled and not sharded


def clip_and_norms(
    grads: list[torch.Tensor], max_norm: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(global norm, per-gradient norms [n]) of plain tensors on ``device``, clipping them to ``max_norm`` when > 0:
    the arithmetic of torch.nn.utils.clip_grad_norm_, keeping the per-gradient norms it computes on the way."""
    norms = torch.stack(torch._foreach_norm(grads, 2.0)) if grads else torch.zeros(0, device=device)
    total = torch.linalg.vector_norm(norms, 2.0)
    if max_norm > 0 and grads:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        torch._foreach_mul_(grads, coef.to(grads[0].device))
    return total, norms


def _nonfinite_grad_name(model: torch.nn.Module) -> str | None:
    for name, p in dist.unwrap(model).named_parameters():
        g = p.grad
        if g is None:
            continue
        if hasattr(g, "to_local"):
            g = g.to_local()
        if not torch.isfinite(g).all():
            return name
    return None


# ----------------------------------------------------------------------------------------------------------------
# The loop's components: preemption, the clock, the progress bar


class PreemptionGuard:
    """Turns SIGTERM into a request to stop after the current optimizer step (on every rank once any rank got it)."""

    def __init__(self) -> None:
        self.flag = False
        self._old: Any = None
        self._posted: HostCopy | None = None  # requested_late: the last step's reduced flags, on their way

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum: int, frame: Any) -> None:
        self.flag = True

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            # after a stop was requested the process leaves with its checkpoint (exit 75): a further SIGTERM (schedulers
            # and users repeat theirs) is the same request, and must not kill it with 143 on the way out (a handler
            # of the caller's own is given back)
            kill = self._old in (signal.SIG_DFL, None)
            signal.signal(signal.SIGTERM, signal.SIG_IGN if self.flag and kill else self._old)

    def requested(self, device: torch.device) -> bool:
        """Whether any rank got SIGTERM, agreed now (one collective and a read per step when distributed)."""
        return dist.any_rank(self.flag, device)

    def requested_late(self, device: torch.device) -> bool:
        """The same agreement a step late (the engine's deferred check): this step's flags are reduced on the device
        and read at the next call, so no step waits for one; every rank reads the same step's answer."""
        if not dist.in_group():
            return self.flag
        agreed = dist.all_reduce_max(torch.full((1,), float(self.flag), device=device))
        previous, self._posted = self._posted, HostCopy(agreed)
        return previous is not None and previous.read()[0] > 0


class StepClock:
    """Wall time of a fit without its pauses (evaluation, checkpoint writing): the logged throughput counts data and
    step time only, the ETA extrapolates it, and it is the summary's elapsed_s."""

    def __init__(self) -> None:
        self.start = self.interval_start = time.perf_counter()
        self.paused_s = 0.0
        self.steps = 0  # steps of this fit
        self.steps_in_interval = 0  # steps since the last train row

    def tick(self) -> None:
        self.steps += 1
        self.steps_in_interval += 1

    def interval(self, tokens_per_step: int, steps_left: int) -> tuple[float, float]:
        """(tokens/s over the steps since the last call, seconds left); the next interval starts now."""
        now = time.perf_counter()
        tps = tokens_per_step * self.steps_in_interval / max(now - self.interval_start, 1e-9)
        eta = steps_left * (now - self.start - self.paused_s) / max(self.steps, 1)
        self.interval_start, self.steps_in_interval = now, 0
        return tps, eta

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        t = time.perf_counter()
        yield
        paused = time.perf_counter() - t
        self.interval_start += paused
        self.paused_s += paused

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused_s


class StepBar:
    """The progress bar over optimizer steps (nothing when quiet or not rank 0). ``live``: it is drawn (stderr is a
    terminal); when it is not, each train row is also printed as one plain line."""

    def __init__(self, label: str, total: int, done: int, quiet: bool) -> None:
        self.live = progress_is_live(quiet)
        self._progress = step_progress(quiet=quiet)
        self._label, self._total, self._done = label, total, done
        self._bar: Any = None

    def __enter__(self) -> StepBar:
        self._progress.__enter__()
        self._bar = self._progress.add_task(self._label, total=self._total, completed=self._done, info="")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    def update(self, step: int, info: str | None = None) -> None:
        if info is None:
            self._progress.update(self._bar, completed=step)
        else:
            self._progress.update(self._bar, completed=step, info=info)


# ----------------------------------------------------------------------------------------------------------------
# The engine


class Engine:
    def __init__(
        self,
        model: torch.nn.Module,
        recipe: Recipe,
        plan: TrainPlan,
        env: dist.DistEnv,
        run_dir: Path,
        cfg: Config,
        tokenizer_dir: Path | None = None,
        quiet: bool = False,
        resume_from: Path | None = None,
        report_to: str | list[str] = "auto",
    ) -> None:
        self.model, self.recipe, self.plan, self.env = model, recipe, plan, env
        self.report_to = report_to  # trackers besides metrics.jsonl (report/metrics_log.py)
        self.run_dir, self.cfg, self.tokenizer_dir = run_dir, cfg, tokenizer_dir
        self.quiet, self.resume_from = quiet, resume_from
        self.main = env.is_main
        self.say = printer(self.main and not quiet)
        self.progress = TrainProgress(env.world_size, plan.accumulation)
        self.last_loss = float("nan")
        self.result: dict[str, Any] = {"out": str(run_dir), "eval": None}
        self.relayout: str | None = None  # set by a resume with another layout (``_relayout_text``)
        self.confirmed_step = 0  # the last step whose figures were read and found finite (or the resumed step)

    @property
    def step(self) -> int:
        """Optimizer steps done."""
        return self.progress.step

    # ---- setup: wrap, optimizer, the checkpointed collection, resume, run folder ---------------------------------

    def setup(self) -> Engine:
        plan, env, dev = self.plan, self.env, self.env.device
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")  # no in-place use
        ac = bool(plan.activation_checkpointing)
        self.model = parallelize(self.model, env, ac, plan.compile, plan.distributed, plan.cuda_graphs)
        self.ddp = self.model if isinstance(self.model, torch.nn.parallel.DistributedDataParallel) else None
        self.fused = fused_adamw(dev)
        self.optimizer = build_optimizer(
            self.model,
            plan.lr,
            plan.weight_decay,
            plan.adam_betas,
            plan.adam_eps,
            plan.layer_decay,
            plan.n_layer,
            fused=self.fused,
        )
        self.scaler = torch.amp.GradScaler(dev.type, enabled=plan.precision == "fp16" and dev.type == "cuda")
        self.sharded = env.distributed and plan.distributed == "fsdp"  # gradients are DTensor shards
        self.deferred = deferred_check(self.fused, self.scaler.is_enabled(), self.sharded)
        self.pending: list[StepFigures] = []  # steps whose figures the host has not read yet (settle)
        self.diverged: str | None = None  # the message of a non-finite step found by settle
        self.last_grad_norm = float("nan")
        named = [(n, p) for n, p in dist.unwrap(self.model).named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.param_names = [n for n, _ in named]
        if plan.cuda_graphs:  # backward adds into gradients kept outside the graphs' pool (zeroed, never freed): a
            for p in self.params:  # graph's output is overwritten by the next micro-batch's replay
                p.grad = torch.zeros_like(p)
        self.device_peak = device_peak_tflops(dev, plan.peak_tflops)  # for the logged MFU (None on CPU)
        self.checkpointer = Checkpointer(
            self.run_dir,
            {
                MODEL: ModelState(self.model),
                PROGRESS: self.progress,
                "optimizer": OptimizerState(self.model, self.optimizer),
                "scaler": self.scaler,
                **self.recipe.states(),
            },
            {"rng": RandomState(self._reseed if self.recipe.elastic else None), **self.recipe.rank_states()},
            self.cfg,
            env,
            self.tokenizer_dir,
            self.recipe.keep_last,
            self.recipe.hints.resume,
            plan.accumulation,
            self.recipe.elastic,
        )
        if self.resume_from is not None:
            self.checkpointer.load(self.resume_from)
            self.relayout = self._relayout_text()
            self.confirmed_step = self.step
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.checkpointer.remove_stale_temp()
            if self.resume_from is None:
                (self.run_dir / "metrics.jsonl").unlink(missing_ok=True)
            else:
                truncate_metrics(self.run_dir, self.step)
            save_config(self.cfg, self.run_dir)
        dist.barrier()
        self.logger = MetricsLogger(self.run_dir, self.report_to, self.cfg) if self.main else NullLogger()
        return self

    def _reseed(self) -> None:
        seed_everything(layout_seed(getattr(self.cfg, self.plan.section).seed, self.step, self.env.rank))

    def _relayout_text(self) -> str | None:
        """The header line of a resume with another layout (None when the layout is the checkpoint's)."""
        if self.checkpointer.resumed_layout is None:
            return None
        (world, accum), plan = self.checkpointer.resumed_layout, self.plan
        g = plan.global_batch_size
        return (
            f"checkpoint of {world} process(es) x micro {g // (world * accum)} x accumulation {accum} continued on "
            f"{self.env.world_size} x micro {plan.micro_batch_size} x accumulation {plan.accumulation}: memories and "
            "data cursors re-assigned by row; dropout re-seeded (its masks differ from an uninterrupted run's)"
        )

    def describe(self) -> str:
        """The device line of a run's header."""
        env, dev, plan = self.env, self.env.device, self.plan
        threads = f", {torch.get_num_threads()} threads" if dev.type == "cpu" else ""
        precision = plan.precision + (" + grad scaler" if self.scaler.is_enabled() else "")
        wrapper = f", {plan.distributed}" if env.distributed else ""
        return (
            f"{dev}{threads} ({env.backend or 'single process'}{wrapper})"
            f", precision {precision}, fused AdamW {self.fused}, compile {plan.compile}"
            f"{' (CUDA graphs)' if plan.cuda_graphs else ''}, activation checkpointing "
            f"{bool(plan.activation_checkpointing)}"
        )

    # ---- the loop --------------------------------------------------------------------------------------------------

    def fit(self, stop_after: int | None = None) -> dict:
        """Train until max_steps (or an early stop); ``stop_after``: return after this many steps of this call (the run
        is then not finished). Returns {"step", "loss", "eval", "tokens_per_s", "elapsed_s", "complete", ...}.

        Each step, as in torchtitan's ``Trainer.train()``: train_step, a train row when due, then (paused on the clock)
        the evaluation and the checkpoint when due, and the preemption check."""
        if self.step >= self.plan.max_steps:
            return self._already_complete()
        first_step, stopped_early = self.step, False
        quiet = self.quiet or not self.main
        self.clock = StepClock()
        self.model.train()
        with PreemptionGuard() as guard:
            self._evaluate_initial_weights()
            with StepBar(self.recipe.name, self.plan.max_steps, self.step, quiet) as bar:
                while self.step < self.plan.max_steps and (stop_after is None or self.step - first_step < stop_after):
                    lr = self.train_step()
                    self._count_step()
                    self._log_step(bar, lr)
                    with self.clock.paused():
                        evaluated = self.recipe.eval_due(self.step)
                        ev = self.evaluate(self.step) if evaluated else None
                        dev = self.env.device
                        preempted = guard.requested_late(dev) if self.deferred else guard.requested(dev)
                        self._save_if_due(evaluated, ev, preempted)
                    stop = ev is not None and ev.stop
                    if preempted and not stop and self.step < self.plan.max_steps:
                        raise self._preempted()
                    if stop:
                        stopped_early = True
                        break
        return self._summary(first_step, stopped_early)

    # ---- one optimizer step --------------------------------------------------------------------------------------

    def train_step(self) -> float:
        """Accumulate the step's micro-batches, clip, step; returns the lr. The step's figures join ``pending``: read
        and checked here before the update, or (``deferred``) after it, by ``settle``, with the update skipped on the
        device when they are not finite."""
        plan, recipe, dev = self.plan, self.recipe, self.env.device
        accum = plan.accumulation
        factor = lr_factor(self.step, plan.warmup_steps, plan.max_steps, plan.schedule, plan.min_lr_ratio)
        lr = set_lr(self.optimizer, plan.lr, factor)
        losses = []
        try:
            for a in range(accum):
                batch = recipe.next_batch(self.step, a)
                sync = self.ddp.no_sync() if (self.ddp is not None and a != accum - 1) else contextlib.nullcontext()
                with sync:
                    with autocast_ctx(dev, plan.precision):
                        loss = recipe.loss(self.model, batch, a)
                    self.scaler.scale(loss / accum).backward()
                losses.append(loss.detach().float())
            self.scaler.unscale_(self.optimizer)
            gnorm, param_norms, names = self._clip()
            step_losses = torch.stack(losses)
            mean_loss = dist.all_reduce_mean(step_losses.mean().clone())
            figures = torch.stack([mean_loss.float(), gnorm.float()])
            values = HostCopy(figures, later=self.deferred)
            self.pending.append(StepFigures(self.step + 1, values, step_losses, param_norms, names))
            if self.deferred:
                self._step_unless_nonfinite(figures)
                self.settle(keep=1)  # the step before this one: done on the device by now, or nearly
            else:
                self.settle()  # the one device sync of a step; raises before a non-finite update
                self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=not plan.cuda_graphs)
        except torch.OutOfMemoryError:
            raise XLNetError(self._oom_message(f"training step {self.step + 1}")) from None
        return lr

    def _clip(self) -> tuple[torch.Tensor, torch.Tensor | None, list[str] | None]:
        """The global gradient norm before clipping (the gradients clipped to plan.clip_norm when > 0) and, for plain
        tensors, the per-parameter norms with their parameters' names: they name a non-finite gradient after the
        gradients are freed. FSDP's sharded gradients (DTensors) take torch's clip_grad_norm_ and no names."""
        plan = self.plan
        if self.sharded:
            if plan.clip_norm > 0:
                gnorm = torch.nn.utils.clip_grad_norm_(self.params, plan.clip_norm, foreach=True)
            else:
                gnorm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
            return gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm, None, None
        with_grad = [(n, p.grad) for n, p in zip(self.param_names, self.params, strict=True) if p.grad is not None]
        gnorm, norms = clip_and_norms([g for _, g in with_grad], plan.clip_norm, self.env.device)
        return gnorm, norms, [n for n, _ in with_grad]

    def _step_unless_nonfinite(self, figures: torch.Tensor) -> None:
        """The fused AdamW step, skipped on the device (no moment, weight or step-count change) when the step's loss
        or gradient norm (``figures``) is not finite."""
        self.optimizer.found_inf = (~torch.isfinite(figures).all()).float()  # type: ignore[attr-defined]
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf  # type: ignore[attr-defined]

    def settle(self, keep: int = 0) -> None:
        """Read the figures of the pending steps but the newest ``keep``, check them in order and count their losses
        into the log window. A non-finite step raises: its update was not applied; the engine then refuses to go on
        (a deferred check found it after the next step's update: nothing of it is saved or evaluated)."""
        if self.diverged is not None:
            raise XLNetError(self.diverged)
        ready = self.pending[: len(self.pending) - keep]
        if not ready:
            return
        del self.pending[: len(ready)]
        for f in ready:
            loss_v, gnorm_v = f.values.read()
            if not math.isfinite(loss_v) or (not math.isfinite(gnorm_v) and not self.scaler.is_enabled()):
                self.pending.clear()
                self.diverged = self._nonfinite_message(f, loss_v, gnorm_v)
                raise XLNetError(self.diverged)
            self.progress.log_window.append(loss_v)
            self.last_grad_norm = gnorm_v
            self.confirmed_step = f.step

    def _count_step(self) -> None:
        self.progress.step += 1
        self.progress.tokens_seen += self.plan.tokens_per_step
        self.clock.tick()

    def _oom_message(self, where: str) -> str:
        return oom_message(self.plan, self.recipe.hints.lengths, self.env.world_size, self.env.device, where)

    def _nonfinite_message(self, f: StepFigures, loss_v: float, gnorm_v: float) -> str:
        plan, name = self.plan, self.recipe.loss_name
        if not math.isfinite(loss_v):
            step_losses = f.losses.tolist()
            bad = [i for i, v in enumerate(step_losses) if not math.isfinite(v)]
            if bad:
                what = f"{name} is {step_losses[bad[0]]} on micro-batch {bad[0]} of rank {self.env.rank}"
            else:
                what = f"{name} is {loss_v} on another rank"
        else:
            if f.param_norms is not None and f.param_names is not None:
                finite = torch.isfinite(f.param_norms).tolist()
                where = next((n for n, ok in zip(f.param_names, finite, strict=True) if not ok), None)
            else:
                where = _nonfinite_grad_name(self.model)  # FSDP: checked before the update, the gradients still there
            what = (
                f"gradient norm is {gnorm_v} (first non-finite gradient: {where or 'on another rank'}; "
                f"loss {loss_v:.4f})"
            )
        return (
            f"training diverged at step {f.step}: {what}; the update was not applied; "
            f"{self.checkpointer.last_good_text()}; try a lower {plan.section}.lr (now {plan.lr:g}), "
            f"{self.recipe.hints.warmup} or {plan.section}.precision=fp32"
        )

    # ---- logging -------------------------------------------------------------------------------------------------

    def _log_step(self, bar: StepBar, lr: float) -> None:
        """Every log_every steps and at the last: a train row, and the bar's figures."""
        step, plan = self.step, self.plan
        if step % plan.log_every == 0 or step == plan.max_steps:
            self.settle()  # the row's losses, and the clock's interval ends with the device's work
            tps, eta = self.clock.interval(plan.tokens_per_step, plan.max_steps - step)
            bar.update(step, self._log(step, self.last_grad_norm, lr, tps, eta, bar.live))
        else:
            bar.update(step)

    def _log(self, step: int, gnorm_v: float, lr: float, tps: float, eta: float, live: bool) -> str:
        """A train row (loss: the mean over the steps since the last row); a plain line when there is no bar."""
        plan, dev = self.plan, self.env.device
        window = self.progress.log_window
        loss = sum(window) / len(window)
        window.clear()
        self.last_loss = loss
        mfu = None
        if self.device_peak and plan.flops_per_token:
            mfu = tps * plan.flops_per_token / (self.env.world_size * self.device_peak * 1e12)
        mem = dist.peak_memory_gib(dev)
        extras = self.recipe.log_extras(step)
        self.logger.log(
            step,
            "train",
            loss=loss,
            lr=lr,
            grad_norm=gnorm_v,
            tokens_per_s=round(tps, 1),
            tokens=self.progress.tokens_seen,
            peak_mem_gib=round(mem, 3),
            **({"mfu": round(mfu, 4)} if mfu is not None else {}),
            **extras,
        )
        if not live:  # a log file: one plain line per interval (the terminal has the progress bar)
            self.say(
                f"step {step}/{plan.max_steps} loss {loss:.4f} lr {lr:.2e} grad_norm {gnorm_v:.3f} "
                f"{tps:,.0f} tokens/s"
                + (f" MFU {100 * mfu:.1f}%" if mfu is not None else "")
                + f" peak {mem:.2f} GiB ETA {duration(eta)}"
                + "".join(f" {k} {v}" for k, v in extras.items())
            )
        return f"loss {loss:.4f} lr {lr:.2e} {tps:,.0f} tok/s"

    # ---- evaluation and checkpoints ------------------------------------------------------------------------------

    def evaluate(self, step: int) -> Evaluation | None:
        """The recipe's evaluation of the model at ``step``; its metrics go into the summary."""
        self.settle()  # a model whose last update went non-finite is not evaluated
        try:
            ev = self.recipe.evaluate(self.model, step, self.logger.log)
        except torch.OutOfMemoryError:
            raise XLNetError(self._oom_message("evaluation")) from None
        if ev is not None and ev.metrics is not None:
            self.result["eval_start" if step == 0 else "eval"] = ev.metrics
        return ev

    def _evaluate_initial_weights(self) -> None:
        """The baseline before the first step, logged as step 0 (a fresh run whose recipe evaluates at step 0)."""
        if self.step == 0 and self.recipe.eval_due(0):
            self.evaluate(0)
            self.model.train()

    def _save_if_due(self, evaluated: bool, ev: Evaluation | None, preempted: bool) -> None:
        """A resumable step folder every save_every steps, at the end (max_steps or an early stop), on preemption and,
        with save_on_eval, at every evaluation; between them the weights alone when the evaluation keeps the model."""
        step, plan = self.step, self.plan
        final = step >= plan.max_steps or (ev is not None and ev.stop)
        with_state = (
            bool(plan.save_every and step % plan.save_every == 0)
            or final
            or preempted
            or (plan.save_on_eval and evaluated)
        )
        if with_state or (ev is not None and ev.keep_model):
            self.save(step, with_state)

    def save(self, step: int, with_state: bool = True) -> Path:
        """Write step folder ``step`` (with train_state.safetensors when ``with_state``); the recipe's rotation and
        pinned steps decide which folders stay. A full disk is a one-line error naming the last good checkpoint."""
        self.settle()  # nothing is saved after a non-finite step; the loss window saved is complete
        meta = {**self.recipe.step_meta(step), "step": step, "tokens_seen": self.progress.tokens_seen}
        return self.checkpointer.save(step, with_state, meta, self.recipe.pinned_steps(with_state))

    # ---- the end of a fit ------------------------------------------------------------------------------------------

    def _preempted(self) -> Preempted:
        """SIGTERM: the checkpoint of this step is written; the error that says how to continue."""
        self.logger.close()
        return Preempted(
            f"stopped on SIGTERM after step {self.step} of {self.plan.max_steps}: checkpoint "
            f"{self.checkpointer.last_good} written; continue with "
            f"{self.recipe.hints.resume.format(step=self.step)}"
        )

    def _summary(self, first_step: int, stopped_early: bool) -> dict:
        self.settle()
        elapsed = self.clock.elapsed()
        self.logger.close()
        done = self.step - first_step
        self.result.update(
            step=self.step,
            loss=self._recent_loss(),
            elapsed_s=elapsed,
            stopped_early=stopped_early,
            complete=self.step >= self.plan.max_steps or stopped_early,
            already_complete=False,
            tokens_per_s=self.plan.tokens_per_step * done / elapsed if elapsed > 0 and done else 0.0,
        )
        return self.result

    def _recent_loss(self) -> float:
        """The training loss to report at the end: the last row's mean, or the mean of the steps after it."""
        if window := self.progress.log_window:
            return sum(window) / len(window)
        return self.last_loss

    def _already_complete(self) -> dict:
        """Resuming a run that has reached max_steps: nothing to train; report its last logged figures."""
        self.logger.close()
        rows = read_metrics(self.run_dir) if self.main else []
        train = [r for r in rows if r.get("split") == "train"]
        evals = [r for r in rows if r.get("split") == "eval"]
        drop = ("step", "split", "time")
        self.result.update(
            step=self.step,
            loss=train[-1]["loss"] if train else float("nan"),
            eval={k: v for k, v in evals[-1].items() if k not in drop} if evals else None,
            elapsed_s=0.0,
            tokens_per_s=0.0,
            complete=True,
            already_complete=True,
            stopped_early=False,
            checkpoint=str(self.resume_from),
        )
        return self.result
