"""The training engine shared by pretraining and finetuning.

    engine = Engine(model, workload, plan, env, run_dir, cfg, tokenizer_dir)
    engine.setup(resume_from=step_folder)  # resume weights and train state, distributed wrapping, optimizer, run folder
    summary = engine.fit()  # train_step -> log -> evaluate -> save, until max_steps, an early stop or SIGTERM

Shaped after torchtitan's ``Trainer.train()`` (a short loop over components, each in its own file) and litgpt's
setup -> fit -> validate. A workload (train/workload.py: ``pretrain.PretrainWorkload``, ``finetune.FinetuneWorkload``)
supplies the batches, the loss, the evaluation and its stateful objects; a ``TrainPlan`` (train/plan.py) the settings.
The engine owns what both trainings share: gradient accumulation (DDP's ``no_sync`` on all but the last micro-batch),
mixed precision (autocast, and a ``GradScaler`` that is a pass-through unless fp16 on CUDA), global-norm clipping, the
AdamW step and the lr schedule (train/optim.py), the cadence of logging, evaluation and checkpoints, out-of-memory and
non-finite diagnosis (train/diagnosis.py), throughput (real tokens per second of step time) / MFU / peak memory,
distributed wrapping (model/parallel.py). Its components: the clock and counters (train/progress.py), the progress
bar (train/display.py), preemption (train/preemption.py), the step's figures (train/step_figures.py), RNG state
(train/rng.py), the checkpointer (train/checkpointer.py) and which checkpoint to resume from (train/resume.py).

A step's loss and gradient norm stay on the device (``StepFigures``) until ``settle`` reads them. With a fused AdamW
(CUDA), no grad scaler and no FSDP, a non-finite step is skipped on the device (the optimizer's ``found_inf``) and
checked one step later, as is the ranks' agreement on SIGTERM: the host launches step N+1 while the device finishes
step N, and waits only for the rows it logs, evaluations and checkpoints (issue 23: no host sync inside the step).
Otherwise (CPU, fp16 with its scaler, FSDP) the figures are read once per optimizer step, before the update; never
per micro-batch.

Everything kept across steps is one collection of stateful objects (``state_dict()`` / ``load_state_dict()``), saved
and loaded by ``train.checkpointer.Checkpointer``: {model, train (step, tokens seen, loss window), optimizer, scaler,
**workload.states()} once, and {rng, **workload.rank_states()} of every rank. A resumable step folder (written to a
temporary folder and renamed) holds model.safetensors, config.yaml, tokenizer/, meta.json and
train_state.safetensors; the lr schedule is a function of the step (optim.lr_factor).

SIGTERM (what schedulers send before they kill) finishes the current optimizer step (its evaluation included), writes a
checkpoint and raises ``Preempted`` (exit code 75); ``--resume`` then continues exactly.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from pathlib import Path
from typing import Any

import torch

from xlnetcli.config import Config, save_config
from xlnetcli.core import dist
from xlnetcli.core.console import duration
from xlnetcli.core.dist import autocast_ctx
from xlnetcli.core.errors import Preempted, XLNetError
from xlnetcli.model import parallelize
from xlnetcli.model.flops import device_peak_tflops
from xlnetcli.report.metrics_log import MetricsLogger, NullLogger, read_metrics
from xlnetcli.train.checkpointer import MODEL, PROGRESS, Checkpointer, ModelState, OptimizerState, ResumePolicy
from xlnetcli.train.diagnosis import nonfinite_what, oom_message
from xlnetcli.train.display import StepBar, printer
from xlnetcli.train.optim import build_optimizer, fused_adamw, lr_factor, set_lr
from xlnetcli.train.plan import TrainPlan
from xlnetcli.train.preemption import PreemptionGuard
from xlnetcli.train.progress import StepClock, TrainProgress
from xlnetcli.train.resume import changes_text, truncate_metrics
from xlnetcli.train.rng import RandomState, layout_seed, seed_everything
from xlnetcli.train.step_figures import HostCopy, StepFigures, clip_and_norms, deferred_check
from xlnetcli.train.workload import Evaluation, Workload


class _ScalerState:
    """The grad scaler in the checkpointed collection. A resume that switches to fp16 (``--set train.precision=fp16``)
    finds the empty state of a disabled scaler: it keeps its fresh scale (torch would refuse the empty state)."""

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.scaler.load_state_dict(state)


class Engine:
    """The one training loop (see the module docstring): ``setup`` once, then ``fit``."""

    def __init__(
        self,
        model: torch.nn.Module,
        workload: Workload,
        plan: TrainPlan,
        env: dist.DistEnv,
        run_dir: Path,
        cfg: Config,
        tokenizer_dir: Path | None = None,
        quiet: bool = False,
    ) -> None:
        self.model, self.workload, self.plan, self.env = model, workload, plan, env
        self.run_dir, self.cfg, self.tokenizer_dir, self.quiet = run_dir, cfg, tokenizer_dir, quiet
        self.resume_from: Path | None = None  # the step folder setup resumed from
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

    def setup(self, resume_from: Path | None = None, changes: list[tuple[str, Any, Any]] | None = None) -> Engine:
        """Wrap the model, build the optimizer and the checkpointed collection, load ``resume_from`` (a step folder)
        when given, and prepare the run folder (config.yaml, metrics.jsonl). ``changes``: the settings this resume
        changes against the checkpoint, (key, was, now) (resume.resume_changes): each gets a "change" row of
        metrics.jsonl at the resumed step, and ``changes_text`` the header's line."""
        plan, env, dev = self.plan, self.env, self.env.device
        self.resume_from = resume_from
        self.changes = list(changes or []) if resume_from is not None else []
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
                "scaler": _ScalerState(self.scaler),
                **self.workload.states(),
            },
            {"rng": RandomState(self._reseed if self.workload.elastic else None), **self.workload.rank_states()},
            self.cfg,
            env,
            self.tokenizer_dir,
            plan.accumulation,
            ResumePolicy(self.workload.keep_last, self.workload.hints.resume, self.workload.elastic),
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
        self.logger = MetricsLogger(self.run_dir, plan.report_to, self.cfg) if self.main else NullLogger()
        for key, was, now in self.changes:
            self.logger.note(self.step, "change", key=key, was=was, now=now)
        return self

    def changes_text(self) -> str | None:
        """The header's line on the settings this resume changed (None for an exact resume): what changed at which
        step and, when it moves the lr, the lr of the next step under the old and the new settings. The rule: from the
        resumed step on, the schedule is the new settings' own (warmup, decay over the new max_steps), as if the run
        had been planned with them; the steps before it keep what they had."""
        if not self.changes:
            return None
        plan, s = self.plan, self.step
        sec = plan.section
        text = changes_text(s, self.changes)
        old = {k: was for k, was, _ in self.changes}
        if not any(k in old for k in (f"{sec}.lr", f"{sec}.warmup_steps", f"{sec}.warmup_ratio", f"{sec}.max_steps")):
            return text
        was_warmup = old.get(f"{sec}.warmup_steps", plan.warmup_steps)
        if f"{sec}.warmup_ratio" in old:  # finetuning: the warmup is a fraction of the steps
            was_warmup = round(old[f"{sec}.warmup_ratio"] * plan.max_steps)
        was_lr = old.get(f"{sec}.lr", plan.lr) * lr_factor(
            s,
            was_warmup,
            old.get(f"{sec}.max_steps", plan.max_steps),
            plan.schedule,
            plan.min_lr_ratio,
        )
        now_lr = plan.lr * lr_factor(s, plan.warmup_steps, plan.max_steps, plan.schedule, plan.min_lr_ratio)
        return (
            f"{text}; lr schedule recomputed for the new settings ({plan.schedule}, warmup {plan.warmup_steps}, "
            f"{plan.max_steps} steps): lr of step {s + 1} {now_lr:.3g} (was {was_lr:.3g})"
        )

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
            f"{self.env.world_size} x micro {plan.micro_batch_size} x accumulation {plan.accumulation}: "
            f"{self.workload.hints.relayout}; dropout re-seeded (its masks differ from an uninterrupted run's)"
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
            with self.clock.paused():  # the baseline evaluation is no part of the training's time
                self._evaluate_initial_weights()
            with StepBar(self.workload.name, self.plan.max_steps, self.step, quiet) as bar:
                while self.step < self.plan.max_steps and (stop_after is None or self.step - first_step < stop_after):
                    lr = self.train_step()
                    self._count_step()
                    self._log_step(bar, lr)
                    with self.clock.paused():
                        evaluated = self.workload.eval_due(self.step)
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
        return self._summary(stopped_early)

    # ---- one optimizer step --------------------------------------------------------------------------------------

    def train_step(self) -> float:
        """Accumulate the step's micro-batches, clip, step; returns the lr. The step's figures join ``pending``: read
        and checked here before the update, or (``deferred``) after it, by ``settle``, with the update skipped on the
        device when they are not finite."""
        plan, workload, dev = self.plan, self.workload, self.env.device
        accum = plan.accumulation
        factor = lr_factor(self.step, plan.warmup_steps, plan.max_steps, plan.schedule, plan.min_lr_ratio)
        lr = set_lr(self.optimizer, plan.lr, factor)
        losses = []
        try:
            for a in range(accum):
                batch = workload.next_batch(self.step, a)
                sync = self.ddp.no_sync() if (self.ddp is not None and a != accum - 1) else contextlib.nullcontext()
                with sync:
                    with autocast_ctx(dev, plan.precision):
                        loss = workload.loss(self.model, batch, a)
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
        """One more step, and its tokens: the real ones (padding left out) when the workload counts them."""
        tokens = self.workload.step_tokens()
        tokens = self.plan.tokens_per_step if tokens is None else tokens
        self.progress.step += 1
        self.progress.tokens_seen += tokens
        self.clock.tick(tokens)

    def _oom_message(self, where: str) -> str:
        return oom_message(self.plan, self.workload.hints.lengths, self.env.world_size, self.env.device, where)

    def _nonfinite_message(self, f: StepFigures, loss_v: float, gnorm_v: float) -> str:
        plan = self.plan
        what = nonfinite_what(f, loss_v, gnorm_v, self.workload.loss_name, self.env.rank, self.model)
        return (
            f"training diverged at step {f.step}: {what}; the update was not applied; "
            f"{self.checkpointer.last_good_text()}; try a lower {plan.section}.lr (now {plan.lr:g}, e.g. "
            f"--set {plan.section}.lr={plan.lr / 2:g}), {self.workload.hints.warmup} or "
            f"{plan.section}.precision=fp32 (a resume may change them: docs/operations.md)"
        )

    # ---- logging -------------------------------------------------------------------------------------------------

    def _log_step(self, bar: StepBar, lr: float) -> None:
        """Every log_every steps and at the last: a train row, and the bar's figures."""
        step, plan = self.step, self.plan
        if step % plan.log_every == 0 or step == plan.max_steps:
            self.settle()  # the row's losses, and the clock's interval ends with the device's work
            tps, eta = self.clock.interval(plan.max_steps - step)
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
        extras = self.workload.log_extras(step)
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
        """The workload's evaluation of the model at ``step``; its metrics go into the summary."""
        self.settle()  # a model whose last update went non-finite is not evaluated
        try:
            ev = self.workload.evaluate(self.model, step, self.logger.log)
        except torch.OutOfMemoryError:
            raise XLNetError(self._oom_message("evaluation")) from None
        if ev is not None and ev.metrics is not None:
            self.result["eval_start" if step == 0 else "eval"] = ev.metrics
        return ev

    def _evaluate_initial_weights(self) -> None:
        """The baseline before the first step, logged as step 0 (a fresh run whose workload evaluates at step 0)."""
        if self.step == 0 and self.workload.eval_due(0):
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
        """Write step folder ``step`` (with train_state.safetensors when ``with_state``); the workload's rotation and
        pinned steps decide which folders stay. A full disk is a one-line error naming the last good checkpoint."""
        self.settle()  # nothing is saved after a non-finite step; the loss window saved is complete
        meta = {**self.workload.step_meta(step), "step": step, "tokens_seen": self.progress.tokens_seen}
        return self.checkpointer.save(step, with_state, meta, self.workload.pinned_steps(with_state))

    # ---- the end of a fit ------------------------------------------------------------------------------------------

    def _preempted(self) -> Preempted:
        """SIGTERM: the checkpoint of this step is written; the error that says how to continue."""
        self.logger.close()
        return Preempted(
            f"stopped on SIGTERM after step {self.step} of {self.plan.max_steps}: checkpoint "
            f"{self.checkpointer.last_good} written; continue with "
            f"{self.workload.hints.resume.format(step=self.step)}"
        )

    def _summary(self, stopped_early: bool) -> dict:
        self.settle()
        elapsed = self.clock.elapsed()
        self.logger.close()
        self.result.update(
            step=self.step,
            loss=self._recent_loss(),
            elapsed_s=elapsed,
            stopped_early=stopped_early,
            complete=self.step >= self.plan.max_steps or stopped_early,
            already_complete=False,
            tokens_per_s=self.clock.tokens / elapsed if elapsed > 0 else 0.0,
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
