"""Optimizer and learning-rate schedule shared by pretraining and finetuning (docs/xlnet.md §8).

AdamW with decoupled weight decay that skips LayerNorm weights and all biases; optional layer-wise lr decay
(layer l of n gets lr * rate^(n-1-l); embeddings get rate^n, heads rate^0) as per-parameter-group learning rates.
"""

from __future__ import annotations

import math
import re

import torch

_LAYER = re.compile(r"(?:^|\.)layer\.(\d+)\.")


def _no_decay(name: str, param: torch.Tensor) -> bool:
    return param.ndim < 2 or "layer_norm" in name or name.endswith(".bias") or "_bias" in name


def layer_depth(name: str, n_layer: int) -> int:
    """0 for embeddings, l + 1 for transformer layer l, n_layer + 1 for everything above (heads)."""
    m = _LAYER.search(name)
    if m:
        return int(m.group(1)) + 1
    if "word_embedding" in name or "mask_emb" in name:
        return 0
    return n_layer + 1


def param_groups(
    model: torch.nn.Module, lr: float, weight_decay: float, layer_decay: float = 1.0, n_layer: int | None = None
) -> list[dict]:
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        depth = layer_depth(name, n_layer) if (n_layer and layer_decay != 1.0) else 0
        scale = layer_decay ** ((n_layer + 1 - depth) if n_layer and layer_decay != 1.0 else 0)
        no_decay = _no_decay(name, param)
        key = (depth, no_decay)
        if key not in groups:
            groups[key] = {
                "params": [],
                "names": [],
                "weight_decay": 0.0 if no_decay else weight_decay,
                "lr": lr * scale,
                "lr_scale": scale,
            }
        groups[key]["params"].append(param)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]


def build_optimizer(
    model: torch.nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-6,
    layer_decay: float = 1.0,
    n_layer: int | None = None,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    groups = param_groups(model, lr, weight_decay, layer_decay, n_layer)
    for g in groups:
        g.pop("names")
    if fused is None:
        fused = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def fused_adamw(device: torch.device) -> bool:
    """AdamW's fused kernels on CUDA (one launch per parameter group, and ``found_inf``); the CPU keeps foreach."""
    return device.type == "cuda"


def lr_factor(
    step: int, warmup_steps: int, total_steps: int, schedule: str = "linear", min_lr_ratio: float = 0.0
) -> float:
    """Multiplier of the peak lr at ``step`` (0-based count of completed steps): linear warmup, then decay."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    frac = 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * frac


def set_lr(optimizer: torch.optim.Optimizer, peak_lr: float, factor: float) -> float:
    for g in optimizer.param_groups:
        g["lr"] = peak_lr * factor * g.get("lr_scale", 1.0)
    return peak_lr * factor
