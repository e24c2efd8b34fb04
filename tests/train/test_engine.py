"""The engine on its own: a toy workload (fixed batches for a two-layer linear model) through Engine, in process.

Gradient accumulation, clipping, the lr schedule, exact resume and preemption, as the engine applies them; the
optimizer's step is wrapped to see the gradients and learning rates it is given.
"""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from xlnetcli.config import Config, TrainConfig
from xlnetcli.core.dist import DistEnv
from xlnetcli.core.errors import Preempted, XLNetError
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train import engine as engine_module  # its fused_adamw, deferred_check: patched to take either path
from xlnetcli.train.checkpointer import load_train_state
from xlnetcli.train.engine import Engine
from xlnetcli.train.optim import lr_factor
from xlnetcli.train.plan import TrainPlan
from xlnetcli.train.rng import seed_everything
from xlnetcli.train.step_figures import clip_and_norms
from xlnetcli.train.workload import Evaluation, Hints

N_EXAMPLES, D_IN, D_OUT = 64, 4, 2
_gen = torch.Generator().manual_seed(0)
X = torch.randn(N_EXAMPLES, D_IN, generator=_gen)
Y = 10 * torch.randn(N_EXAMPLES, D_OUT, generator=_gen)  # large targets: gradient norms well above 1
TIMING = ("time", "tokens_per_s", "peak_mem_gib")


class ToyWorkload:
    """Micro-batch ``micro`` of step ``step`` is rows [(step * accum + micro) * size, ... + size) of X, Y (wrapping):
    the same rows however a step's batch is split, and a function of the step alone, so no state to checkpoint."""

    name = "toy"
    loss_name = "toy loss"
    keep_last = 1
    elastic = False
    hints = Hints(lengths="toy.width (4)", warmup="more toy.warmup")

    def __init__(
        self,
        size: int,
        accum: int,
        sigterm_at: int | None = None,
        nan_at: int | None = None,
        eval_every: int = 0,
        stop_at: int | None = None,
    ) -> None:
        self.size, self.accum = size, accum
        self.sigterm_at, self.nan_at = sigterm_at, nan_at  # step (0-based) to send SIGTERM at / return nan at
        self.eval_every, self.stop_at = eval_every, stop_at
        self.step = 0

    def next_batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.step = step
        if step == self.sigterm_at and micro == 0:
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends before it kills
        idx = torch.arange((step * self.accum + micro) * self.size, (step * self.accum + micro + 1) * self.size)
        return X[idx % N_EXAMPLES], Y[idx % N_EXAMPLES]

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], micro: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(model(x), y)
        return loss * math.nan if self.step == self.nan_at else loss

    def step_tokens(self) -> None:
        return None

    def eval_due(self, step: int) -> bool:
        return bool(self.eval_every) and step % self.eval_every == 0

    def evaluate(self, model: nn.Module, step: int, log) -> Evaluation:
        log(step, "eval", step_seen=step)
        return Evaluation(metrics={"step_seen": step}, stop=step == self.stop_at)

    def log_extras(self, step: int) -> dict:
        return {}

    def step_meta(self, step: int) -> dict:
        return {"kind": "toy"}

    def states(self) -> dict:
        return {}

    def rank_states(self) -> dict:
        return {}

    def pinned_steps(self, with_state: bool) -> set[int]:
        return set()


def make_engine(
    run_dir: Path,
    workload: ToyWorkload | None = None,
    *,
    size: int = 4,
    accum: int = 1,
    max_steps: int = 6,
    lr: float = 0.01,
    warmup: int = 0,
    schedule: str = "linear",
    min_lr_ratio: float = 0.0,
    clip_norm: float = 0.0,
    save_every: int = 0,
    dropout: float = 0.0,
    resume_from: Path | None = None,
    log_every: int = 1,
    env: DistEnv | None = None,
    unused: bool = False,
) -> Engine:
    seed_everything(0)
    model = nn.Sequential(nn.Linear(D_IN, 8), nn.Dropout(dropout), nn.Linear(8, D_OUT))
    if unused:  # a trainable parameter no loss reaches (first in order): it never has a gradient
        model.register_parameter("a_unused", nn.Parameter(torch.zeros(3)))
    plan = TrainPlan(
        section="toy",
        max_steps=max_steps,
        lr=lr,
        warmup_steps=warmup,
        clip_norm=clip_norm,
        precision="fp32",
        micro_batch_size=size,
        global_batch_size=size * accum,
        accumulation=accum,
        seq_len=1,
        tokens_per_step=size * accum,
        log_every=log_every,
        save_every=save_every,
        weight_decay=0.01,
        adam_eps=1e-8,
        schedule=schedule,
        min_lr_ratio=min_lr_ratio,
    )
    engine = Engine(model, workload or ToyWorkload(size, accum), plan, env or DistEnv(), run_dir, Config(), quiet=True)
    return engine.setup(resume_from=resume_from)


def record_steps(engine: Engine) -> list[dict]:
    """What each optimizer step is given: the gradients (after clipping) and the groups' learning rates."""
    seen: list[dict] = []
    step = engine.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append(
            {"grads": [p.grad.clone() for p in engine.params], "lrs": [g["lr"] for g in engine.optimizer.param_groups]}
        )
        return step(*args, **kwargs)

    engine.optimizer.step = recording_step
    return seen


def params(engine: Engine) -> list[torch.Tensor]:
    return [p.detach().clone() for p in engine.model.parameters()]


def rows(run_dir: Path, split: str = "train") -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run_dir) if r["split"] == split]


def total_norm(grads: list[torch.Tensor]) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def test_accumulated_micro_batches_equal_one_batch_of_them_all(tmp_path):
    """4 micro-batches of 2 = one batch of 8: the same gradients, the same parameters after each step."""
    accumulated = make_engine(tmp_path / "a", size=2, accum=4, max_steps=3)
    one_batch = make_engine(tmp_path / "b", size=8, accum=1, max_steps=3)
    seen_a, seen_b = record_steps(accumulated), record_steps(one_batch)
    accumulated.fit()
    one_batch.fit()
    assert len(seen_a) == len(seen_b) == 3
    for a, b in zip(seen_a, seen_b, strict=True):
        for ga, gb in zip(a["grads"], b["grads"], strict=True):
            torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-6)
    for pa, pb in zip(params(accumulated), params(one_batch), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-6)
    for ra, rb in zip(rows(tmp_path / "a"), rows(tmp_path / "b"), strict=True):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-6)
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-6)


def test_clipping_bounds_the_applied_gradient_and_the_log_keeps_the_norm_before_it(tmp_path):
    clip = 0.5
    engine = make_engine(tmp_path / "run", size=2, accum=2, max_steps=2, clip_norm=clip)
    # the gradient of the first step without the engine: the same weights, the same 2 micro-batches, mean loss
    probe = make_engine(tmp_path / "probe", size=2, accum=2).model
    workload = ToyWorkload(2, 2)
    loss = sum(workload.loss(probe, workload.next_batch(0, a), a) for a in range(2)) / 2
    loss.backward()
    unclipped = total_norm([p.grad for p in probe.parameters()])
    seen = record_steps(engine)
    engine.fit()
    logged = rows(tmp_path / "run")
    assert unclipped > 10 * clip
    assert logged[0]["grad_norm"] == pytest.approx(unclipped, rel=1e-6)  # the log: the norm before clipping
    for s in seen:
        assert total_norm(s["grads"]) <= clip * (1 + 1e-5)  # what the optimizer is given: clipped
    assert total_norm(seen[0]["grads"]) == pytest.approx(clip, rel=1e-5)


@pytest.mark.parametrize(
    "schedule, min_lr_ratio, by_hand",
    [
        ("linear", 0.0, [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]),
        (
            "cosine",
            0.1,
            [0.5, 1.0, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55, 0.1 + 0.45 * (1 - math.cos(math.pi / 4))],
        ),
    ],
)
def test_lr_warms_up_then_decays_as_the_schedule_says(tmp_path, schedule, min_lr_ratio, by_hand):
    """Warmup 2 of 6 steps: step i (0-based) is trained at lr * lr_factor(i); every parameter group gets it."""
    lr = 0.01
    engine = make_engine(tmp_path / "run", max_steps=6, lr=lr, warmup=2, schedule=schedule, min_lr_ratio=min_lr_ratio)
    seen = record_steps(engine)
    engine.fit()
    applied = [s["lrs"] for s in seen]
    assert all(len(set(group_lrs)) == 1 for group_lrs in applied)  # no layer decay: one lr for every group
    assert [g[0] for g in applied] == pytest.approx([lr * f for f in by_hand], rel=1e-12)
    assert [g[0] for g in applied] == pytest.approx(
        [lr * lr_factor(i, 2, 6, schedule, min_lr_ratio) for i in range(6)], rel=1e-12
    )
    assert [r["lr"] for r in rows(tmp_path / "run")] == [g[0] for g in applied]


def test_resume_continues_bit_identically(tmp_path):
    """Fit 3 steps, save, a new engine loads the step folder and fits to 6: the parameters and the logged losses are
    those of an uninterrupted run of 6 (dropout on: the RNG state resumes too; AdamW's moments too)."""
    straight = make_engine(tmp_path / "straight", dropout=0.5)
    straight.fit()
    first = make_engine(tmp_path / "run", dropout=0.5)
    first.fit(stop_after=3)
    assert first.step == 3 and not first.result["complete"]
    folder = first.save(3)
    assert load_train_state(folder)["step"] == 3
    resumed = make_engine(tmp_path / "run", dropout=0.5, resume_from=folder)
    assert resumed.step == 3
    summary = resumed.fit()
    assert summary["step"] == 6 and summary["complete"]
    for a, b in zip(params(resumed), params(straight), strict=True):
        assert torch.equal(a, b)
    assert rows(tmp_path / "run") == rows(tmp_path / "straight")


def test_sigterm_finishes_the_step_saves_and_raises_preempted(tmp_path):
    """SIGTERM during step 4 (of 8): the step completes, a resumable checkpoint of step 4 is written, Preempted (exit
    code 75) says how to continue, the previous SIGTERM handler is back; resuming gives the uninterrupted result."""
    straight = make_engine(tmp_path / "straight", max_steps=8, dropout=0.5)
    straight.fit()
    outer_calls: list = []

    def outer(*args):
        outer_calls.append(args)

    previous = signal.signal(signal.SIGTERM, outer)
    try:
        engine = make_engine(tmp_path / "run", ToyWorkload(4, 1, sigterm_at=3), max_steps=8, dropout=0.5)
        with pytest.raises(Preempted) as e:
            engine.fit()
        restored = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert restored is outer and not outer_calls  # the engine's handler took the signal, then gave SIGTERM back
    folder = tmp_path / "run" / "step_0000004"
    assert str(e.value) == (
        f"stopped on SIGTERM after step 4 of 8: checkpoint {folder} written; continue with --resume 4"
    )
    assert e.value.exit_code == 75
    assert load_train_state(folder)["step"] == 4
    assert json.loads((folder / "meta.json").read_text())["kind"] == "toy"
    resumed = make_engine(tmp_path / "run", max_steps=8, dropout=0.5, resume_from=folder)
    resumed.fit()
    for a, b in zip(params(resumed), params(straight), strict=True):
        assert torch.equal(a, b)


def test_an_early_stop_is_the_end_of_the_run(tmp_path):
    """An evaluation that says stop: a resumable checkpoint of that step, and the run is complete."""
    engine = make_engine(tmp_path / "run", ToyWorkload(4, 1, eval_every=2, stop_at=4), max_steps=8)
    summary = engine.fit()
    assert summary["step"] == 4 and summary["stopped_early"] and summary["complete"]
    assert summary["eval"] == {"step_seen": 4}
    assert [r["step"] for r in rows(tmp_path / "run", "eval")] == [0, 2, 4]  # step 0: the initial weights
    assert load_train_state(tmp_path / "run" / "step_0000004")["step"] == 4


def test_tokens_per_s_and_eta_leave_evaluations_and_checkpoints_out(tmp_path, monkeypatch):
    """On a fake clock a micro-batch takes 1/64 s, an evaluation (the initial weights' before the first step too)
    100 s and a checkpoint 50 s: every logged tokens/s and ETA, and the summary's time, are the steps' alone."""
    from types import SimpleNamespace

    from xlnetcli.train import progress

    now = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    class SlowEvaluation(ToyWorkload):
        def next_batch(self, step: int, micro: int):
            now[0] += 1 / 64
            return super().next_batch(step, micro)

        def evaluate(self, model: nn.Module, step: int, log) -> Evaluation:
            now[0] += 100
            return super().evaluate(model, step, log)

    engine = make_engine(tmp_path / "run", SlowEvaluation(4, 2, eval_every=2), accum=2, max_steps=6, save_every=3)
    save, logged = engine.save, []

    def slow_save(*args, **kwargs):
        now[0] += 50
        return save(*args, **kwargs)

    def log(step, gnorm_v, lr, tps, eta, live):
        logged.append((tps, eta))
        return log_row(step, gnorm_v, lr, tps, eta, live)

    engine.save, log_row, engine._log = slow_save, engine._log, log
    summary = engine.fit()
    assert [r["step"] for r in rows(tmp_path / "run", "eval")] == [0, 2, 4, 6]
    step_s = 2 / 64  # 8 tokens a step
    assert logged == [(8 / step_s, (6 - s) * step_s) for s in range(1, 7)]
    assert summary["elapsed_s"] == 6 * step_s and summary["tokens_per_s"] == 8 / step_s


def test_out_of_memory_and_divergence_give_the_workloads_advice(tmp_path):
    def oom(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    workload = ToyWorkload(4, 2)
    workload.loss = oom
    with pytest.raises(XLNetError) as e:
        make_engine(tmp_path / "oom", workload, accum=2).fit()
    assert str(e.value) == (
        "out of memory on cpu during training step 1 with micro-batch 4 x seq 1 (accumulation 2, "
        "1 process(es)); try --set toy.micro_batch_size=2 (accumulation becomes 4, same global "
        "batch), or lower toy.width (4)"
    )
    with pytest.raises(XLNetError) as e:
        make_engine(tmp_path / "nan", ToyWorkload(4, 1, nan_at=1), lr=0.1).fit()
    assert str(e.value) == (
        "training diverged at step 2: toy loss is nan on micro-batch 0 of rank 0; the update was "
        "not applied; no checkpoint saved yet; try a lower toy.lr (now 0.1, e.g. --set toy.lr=0.05), more "
        "toy.warmup or toy.precision=fp32 (a resume may change them: docs/operations.md)"
    )


def test_one_plan_for_both_sections():
    """Keys a section lacks keep the plan's defaults; the rest come from the section."""
    cfg = Config()
    common = dict(max_steps=10, warmup_steps=1, accumulation=2, flops_per_token=None)
    pre = TrainPlan.from_config(cfg, "train", batch_shape=(8, 16), **common)
    ft = TrainPlan.from_config(cfg, "finetune", batch_shape=(8, 4, 16), **common)  # 4 options
    assert (pre.section, pre.lr, pre.schedule, pre.adam_betas) == (
        "train",
        cfg.train.lr,
        cfg.train.schedule,
        cfg.train.adam_betas,
    )
    assert pre.activation_checkpointing is False and pre.layer_decay == 1.0 and pre.micro_multiple == 2  # bi_data
    assert (ft.section, ft.lr, ft.layer_decay, ft.precision) == (
        "finetune",
        cfg.finetune.lr,
        cfg.finetune.layer_decay,
        cfg.finetune.precision,
    )
    assert ft.schedule == "linear" and ft.activation_checkpointing is None and not ft.compile
    assert (pre.tokens_per_step, ft.tokens_per_step) == (8 * 16, 8 * 4 * 16)
    assert (ft.global_batch_size, ft.seq_len, pre.report_to, ft.report_to) == (8, 16, "auto", "auto")
    # save_every's words mean the same in both sections: eval (finetune's default) = at every evaluation, end = none
    assert (ft.save_every, ft.save_on_eval, pre.save_every, pre.save_on_eval) == (0, True, 10_000, False)
    for word, on_eval in (("end", False), ("eval", True)):
        plan = TrainPlan.from_config(Config(train=TrainConfig(save_every=word)), "train", batch_shape=(8, 16), **common)
        assert (plan.save_every, plan.save_on_eval) == (0, on_eval)


# ---- the deferred check: fused AdamW skips a non-finite step on the device, the host reads the figures a step later --


class NanGrad(torch.autograd.Function):
    """Identity forward; a NaN gradient backward: a finite loss whose gradients are not."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * math.nan


class NanGradWorkload(ToyWorkload):
    def __init__(self, *args, nan_grad_at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nan_grad_at = nan_grad_at

    def loss(self, model: nn.Module, batch, micro: int) -> torch.Tensor:
        x, y = batch
        h = model[0](x)
        if self.step == self.nan_grad_at:
            h = NanGrad.apply(h)
        return nn.functional.mse_loss(model[2](model[1](h)), y)


@pytest.fixture
def fused(monkeypatch):
    """The CUDA path on the CPU: AdamW's fused kernel (it honours found_inf here too); returns a switch that turns the
    deferred check off, for the same optimizer checked before each update."""
    monkeypatch.setattr(engine_module, "fused_adamw", lambda device: True)

    def synchronous() -> None:
        monkeypatch.setattr(engine_module, "deferred_check", lambda *a: False)

    return synchronous


def reads(engine: Engine) -> list[tuple[int, list[int]]]:
    """(steps done, the steps whose figures are read) at each device read of ``settle``."""
    seen: list[tuple[int, list[int]]] = []
    settle = engine.settle

    def recording(keep: int = 0) -> None:
        ready = [f.step for f in engine.pending[: len(engine.pending) - keep]]
        if ready:
            seen.append((engine.step, ready))
        settle(keep)

    engine.settle = recording
    return seen


def test_a_deferred_check_trains_the_same_bits_and_reads_a_step_late(tmp_path, fused):
    kw = dict(size=2, accum=2, max_steps=7, clip_norm=0.5, log_every=3, save_every=7)
    deferred = make_engine(tmp_path / "deferred", **kw)
    read_deferred = reads(deferred)
    deferred.fit()
    fused()
    synced = make_engine(tmp_path / "synced", **kw)
    read_synced = reads(synced)
    synced.fit()
    assert deferred.deferred and not synced.deferred
    # before each update, step N's figures are read with N - 1 steps done; deferred, after it: with N done, while the
    # host prepares step N + 1 (a train row's step is read at once, its row needs it)
    assert read_synced == [(n - 1, [n]) for n in range(1, 8)]
    assert read_deferred == [(n, [n]) for n in range(1, 8)]
    for a, b in zip(params(deferred), params(synced), strict=True):
        assert torch.equal(a, b)
    assert rows(tmp_path / "deferred") == rows(tmp_path / "synced")  # losses and gradient norms, bit for bit
    sa, sb = (load_train_state(tmp_path / r / "step_0000007") for r in ("deferred", "synced"))
    assert sa["log_window"] == sb["log_window"]
    for a, b in zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


@pytest.mark.parametrize("kind", ["loss", "gradient"])
def test_a_deferred_nonfinite_step_is_skipped_on_the_device_and_diagnosed_alike(tmp_path, fused, kind):
    def workload():
        return ToyWorkload(4, 1, nan_at=1) if kind == "loss" else NanGradWorkload(4, 1, nan_grad_at=1)

    # a parameter without a gradient ahead of the others: the diagnosis still names the right one
    deferred = make_engine(tmp_path / "deferred", workload(), log_every=100, unused=True)
    with pytest.raises(XLNetError) as late:
        deferred.fit()
    # step 2 went non-finite; the host learnt it while launching step 3, whose update was applied: AdamW counts 2
    # updates of 3 (checked before the update, 1 of 2), and nothing of the bad step reached a weight or a moment
    state = deferred.optimizer.state.values()
    assert {int(s["step"]) for s in state} == {2}
    assert all(torch.isfinite(t).all() for s in state for t in (s["exp_avg"], s["exp_avg_sq"]))
    assert all(torch.isfinite(p).all() for p in params(deferred))
    assert deferred.confirmed_step == 1
    with pytest.raises(XLNetError) as again:  # the engine refuses to go on: step 3's update is past the bad step
        deferred.save(3)
    assert str(again.value) == str(late.value) and not list((tmp_path / "deferred").glob("step_*"))
    fused()
    synced = make_engine(tmp_path / "synced", workload(), log_every=100, unused=True)
    with pytest.raises(XLNetError) as refused:
        synced.fit()
    assert {int(s["step"]) for s in synced.optimizer.state.values()} == {1}
    assert str(late.value) == str(refused.value)
    what = (
        "toy loss is nan on micro-batch 0 of rank 0"
        if kind == "loss"
        else "gradient norm is nan (first non-finite gradient: 0.weight; loss "
    )
    assert str(late.value).startswith(f"training diverged at step 2: {what}")


def test_no_checkpoint_follows_a_deferred_nonfinite_step(tmp_path, fused):
    engine = make_engine(tmp_path / "run", ToyWorkload(4, 1, nan_at=2), log_every=100, save_every=1)
    with pytest.raises(XLNetError, match="training diverged at step 3") as e:
        engine.fit()
    assert [p.name for p in (tmp_path / "run").glob("step_*")] == ["step_0000002"]  # keep_last 1
    assert "step_0000002" in str(e.value)


@pytest.mark.slow
def test_under_ddp_the_deferred_check_trains_the_same_bits_and_agrees_on_sigterm_a_step_late(tmp_path):
    """Two processes (torchrun, gloo), the fused AdamW: every rank holds the same all-reduced gradients, so the deferred
    check skips alike everywhere and trains the same bits as the check before each update; the ranks' agreement on a
    SIGTERM (sent to rank 1 alone during step 3) comes a step late, on both ranks at the same step."""
    import subprocess

    from clitools import BIN, child_env

    worker = Path(__file__).with_name("ddp_deferred_worker.py")
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(worker), str(tmp_path)]
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["deferred"] and not r["synced_deferred"]
        assert r["same_bits"], r
        assert r["stopped"] == {"synced": 3, "deferred": 4}, r
    where = {0: "toy loss is nan on another rank", 1: "toy loss is nan on micro-batch 0 of rank 1"}
    for r in ranks:  # the NaN on rank 1: both ranks skip its update (2 of 3 applied) and stop at the same step
        assert r["nan"] == [f"training diverged at step 2: {where[r['rank']]}", [2], True], r


@pytest.mark.parametrize("max_norm", [0.0, 0.5, 1e6])
def test_clip_and_norms_is_torchs_clipping_bit_for_bit(max_norm):
    """The engine clips plain gradients itself to keep the per-parameter norms: the same bits as clip_grad_norm_ (or
    get_total_norm without clipping), and the norms are each gradient's."""
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(s, generator=gen) * 10 for s in ((8, 4), (8,), (2, 8), (2,))]
    ours = [g.clone() for g in grads]
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    total, norms = clip_and_norms(ours, max_norm, torch.device("cpu"))
    if max_norm > 0:
        ref = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:
        ref = torch.nn.utils.get_total_norm([p.grad for p in params])
    assert torch.equal(total, ref)
    assert all(torch.equal(a, p.grad) for a, p in zip(ours, params, strict=True))
    assert torch.equal(norms, torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    unchanged = all(torch.equal(a, g) for a, g in zip(ours, grads, strict=True))
    assert unchanged == (max_norm != 0.5)  # clipped only below the norm; 0 = no clipping
