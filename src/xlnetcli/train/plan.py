"""The engine's plan of a run: the settings it needs from a config section (``train`` for pretraining, ``finetune``
for finetuning) and the figures each training derives (steps, batch shape, FLOPs), in one dataclass."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from xlnetcli.config import Config
from xlnetcli.core.dist import checked_precision


@dataclass
class TrainPlan:
    """What the engine needs from a config section (``train`` for pretraining, ``finetune`` for finetuning); built by
    ``TrainPlan.from_config``."""

    section: str  # the config section; messages name its keys
    max_steps: int
    lr: float
    warmup_steps: int
    clip_norm: float
    precision: str  # resolved: fp32, bf16 or fp16 (run_precision)
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
    report_to: str = "none"  # experiment trackers besides metrics.jsonl (report/metrics_log.py)

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        section: str,
        *,
        max_steps: int,
        warmup_steps: int,
        batch_shape: tuple[int, ...],
        accumulation: int,
        flops_per_token: float | None,
    ) -> TrainPlan:
        """The plan of ``cfg``'s ``section``; the arguments are what the two trainings derive differently.
        ``batch_shape``: the token ids of one optimizer step, (examples, seq_len) or, with the options of a
        multiple-choice example, (examples, options, seq_len). Keys the section lacks (finetune has no schedule,
        adam_betas, compile, ...; train no layer_decay) keep the defaults above. save_every's words: "end" saves only
        at the end, "eval" at every evaluation (save_on_eval)."""
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
            global_batch_size=batch_shape[0],
            accumulation=accumulation,
            seq_len=batch_shape[-1],
            tokens_per_step=math.prod(batch_shape),
            log_every=sec.log_every,
            save_every=sec.save_every if isinstance(sec.save_every, int) else 0,  # "end" or "eval": none by count
            save_on_eval=sec.save_every == "eval",
            weight_decay=sec.weight_decay,
            adam_eps=sec.adam_eps,
            n_layer=cfg.model.n_layer,
            micro_multiple=2 if cfg.model.bi_data else 1,
            flops_per_token=flops_per_token,
            peak_tflops=sec.peak_tflops,
            report_to=sec.report_to,
            **{key: getattr(sec, key) for key in optional if hasattr(sec, key)},
        )


def run_precision(cfg: Config, section: str, device: torch.device, say: Callable[[str], None]) -> Config:
    """``cfg`` with ``{section}.precision`` as a run on ``device`` uses it (core.dist.checked_precision: auto
    resolved, fp16 on a CPU refused, bf16 there kept with one warning line), once at the start of a run and before the
    resume check: the run's config.yaml records the value used, so a resume and `xlnet eval` run as training did."""
    sec = getattr(cfg, section)
    precision = checked_precision(sec.precision, device, f"{section}.precision", say)
    return dataclasses.replace(cfg, **{section: dataclasses.replace(sec, precision=precision)})
