"""A step's loss and gradient norm on their way to the host: computed on the device, copied behind the step's work
and read by the engine's ``settle`` (before the update, or a step later when the update can be skipped on the
device)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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
