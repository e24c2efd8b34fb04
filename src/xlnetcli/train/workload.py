"""What a training run plugs into the engine: a workload (``pretrain.PretrainWorkload``,
``finetune.FinetuneWorkload``), and what the engine asks of it.

    name, loss_name                    progress-bar label; what the loss is called in messages ("PLM loss")
    hints                              ``Hints``: the advice of out-of-memory, divergence and preemption messages
    next_batch(step, micro)            micro-batch ``micro`` of optimizer step ``step``, on the device
    loss(model, batch, micro)          the scalar loss of one micro-batch (called under autocast)
    step_tokens()                      the real tokens of the step just drawn, every rank's, for tokens/s (None: every
                                       token of the plan's batch is real, as in pretraining)
    eval_due(step), evaluate(model, step, log) -> Evaluation | None
    log_extras(step)                   extra fields of a train row (finetuning: epoch)
    step_meta(step)                    meta.json of a step folder
    states(), rank_states()            its stateful objects, shared by the ranks (finetuning: "task", the example
                                       order and the best so far) and of one rank (pretraining: "data", the records
                                       cursor, and "mems", the Transformer-XL memories)
    elastic                            True: a checkpoint of another layout (processes, micro-batch size) resumes, its
                                       rank states re-assigned (checkpointer.Reassignable) and dropout re-seeded
    keep_last, pinned_steps(with_state)  which step folders stay after a save (rotation, the best checkpoint)

(A *recipe*, in this project, is a set of hyperparameters: a preset, the demo's settings.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from xlnetcli.train.checkpointer import Stateful


@dataclass(frozen=True)
class Hints:
    """A workload's advice in the engine's messages, naming its own config keys."""

    lengths: str  # out of memory: the length keys to lower, with their values
    warmup: str  # divergence: how to warm up longer
    resume: str = "--resume {step}"  # how to continue from a checkpoint of step {step}
    relayout: str = "memories and data cursors re-assigned by row"  # what follows a resume on another layout


@dataclass
class Evaluation:
    """What a workload's evaluation tells the engine: its metrics, whether to keep the model of this step (a new best),
    and whether to stop (early stopping)."""

    metrics: dict | None = None
    keep_model: bool = False
    stop: bool = False


class Workload(Protocol):
    """What a training run plugs into the engine (see the module docstring)."""

    name: str
    loss_name: str
    hints: Hints
    keep_last: int
    elastic: bool

    def next_batch(self, step: int, micro: int) -> Any: ...
    def loss(self, model: torch.nn.Module, batch: Any, micro: int) -> torch.Tensor: ...
    def step_tokens(self) -> int | None: ...
    def eval_due(self, step: int) -> bool: ...
    def evaluate(self, model: torch.nn.Module, step: int, log: Callable[..., None]) -> Evaluation | None: ...
    def log_extras(self, step: int) -> dict: ...
    def step_meta(self, step: int) -> dict: ...
    def states(self) -> dict[str, Stateful]: ...
    def rank_states(self) -> dict[str, Stateful]: ...
    def pinned_steps(self, with_state: bool) -> set[int]: ...
