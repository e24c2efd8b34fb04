"""The engine's one-line diagnoses: out of memory (the settings to lower) and a non-finite step (what went
non-finite, and where)."""

from __future__ import annotations

import math

import torch

from xlnetcli.core import dist
from xlnetcli.train.plan import TrainPlan
from xlnetcli.train.step_figures import StepFigures


def oom_message(plan: TrainPlan, lengths: str, world: int, device: torch.device, where: str) -> str:
    """Out of memory: the settings to lower, naming the section's keys; ``lengths`` are the workload's (``Hints``)."""
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


def nonfinite_what(
    f: StepFigures, loss_v: float, gnorm_v: float, loss_name: str, rank: int, model: torch.nn.Module
) -> str:
    """What went non-finite in step ``f`` (read as ``loss_v``, ``gnorm_v``): the loss, on which micro-batch of this
    rank, or the gradient norm, naming the first parameter whose gradient is not finite."""
    if not math.isfinite(loss_v):
        step_losses = f.losses.tolist()
        bad = [i for i, v in enumerate(step_losses) if not math.isfinite(v)]
        if bad:
            return f"{loss_name} is {step_losses[bad[0]]} on micro-batch {bad[0]} of rank {rank}"
        return f"{loss_name} is {loss_v} on another rank"
    if f.param_norms is not None and f.param_names is not None:
        finite = torch.isfinite(f.param_norms).tolist()
        where = next((n for n, ok in zip(f.param_names, finite, strict=True) if not ok), None)
    else:
        where = nonfinite_grad_name(model)  # FSDP: checked before the update, the gradients still there
    return f"gradient norm is {gnorm_v} (first non-finite gradient: {where or 'on another rank'}; loss {loss_v:.4f})"


def nonfinite_grad_name(model: torch.nn.Module) -> str | None:
    """The first parameter whose gradient (this rank's shard of it, under FSDP) is not finite."""
    for name, p in dist.unwrap(model).named_parameters():
        g = p.grad
        if g is None:
            continue
        if hasattr(g, "to_local"):
            g = g.to_local()
        if not torch.isfinite(g).all():
            return name
    return None
