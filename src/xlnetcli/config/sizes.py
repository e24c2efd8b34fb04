"""Sizes checked before allocating: the parameters and memory a config asks for, against the machine.

Every value that sizes memory (layers, width, heads, vocabulary, sequence and memory length, batch) goes into a
lower-bound estimate: the weights (fp32; training adds gradients and AdamW's two moments: 16 bytes a parameter) and
the activations one micro-batch keeps for the backward pass (content and query streams, memory, the feed-forward's
inner layer, the attention masks; attention scores are left out, as fused kernels do not keep them). A config whose
estimate exceeds the machine's memory (host RAM; the GPU's when the device is CUDA) is refused in one line naming
the estimate and the keys to lower, before anything is allocated: never a hang or a terabyte allocation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xlnetcli.core.errors import CheckpointError, ConfigError
from xlnetcli.core.machine import memory_bytes

if TYPE_CHECKING:
    from xlnetcli.config.schema import Config, ModelConfig

FP32 = 4
TRAIN_BYTES_PER_PARAM = 16  # fp32 weights + gradients + AdamW's two moments


def model_params(m: ModelConfig) -> int:
    """Parameters of XLNetLMHeadModel for ``m`` (embedding, per layer: q, k, v, o, r projections, biases, segment
    embedding, feed-forward, two LayerNorms; the LM bias). Pure arithmetic: any size, nothing allocated."""
    d, hd, f = m.d_model, m.n_head * m.d_head, m.d_inner
    layer = 5 * d * hd + 3 * hd + 2 * hd + 2 * d * f + f + d + 4 * d
    return m.vocab_size * d + m.n_layer * layer + d + m.vocab_size


def estimate(cfg: Config, stage: str) -> tuple[int, int, int]:
    """(parameters, bytes of weights and optimizer state, bytes of one micro-batch's activations) for ``stage``."""
    m, d = cfg.model, cfg.data
    if stage == "preprocess":  # no model: the rows of one batch (tokens, segment ids, targets) as int64
        return 0, 0, cfg.train.global_batch_size * d.seq_len * 8 * 3
    params = model_params(m)
    if stage == "finetune":
        batch, length, mem, targets = cfg.finetune.micro_batch_size, cfg.finetune.max_seq_length, 0, 1
        streams = 1
    else:
        batch, length, mem, targets = cfg.train.micro_batch_size, d.seq_len, m.mem_len, d.num_predict
        streams = 1 if m.objective == "mlm" else 2
    per_layer = length * (streams * m.d_model + m.d_inner) * FP32 + mem * m.d_model * FP32
    masks = length * (length + mem)  # one byte per attention-mask entry
    logits = targets * m.vocab_size * FP32
    acts = batch * (m.n_layer * per_layer + masks + logits)
    return params, params * TRAIN_BYTES_PER_PARAM, acts


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # pragma: no cover


def check_fits(cfg: Config, stage: str, device: Any = None) -> None:
    """Refuse, in one line, a config whose lower-bound memory estimate for ``stage`` exceeds the machine's memory
    (the GPU's for a CUDA ``device``, else host RAM; nothing is checked when the machine does not say)."""
    params, weights, acts = estimate(cfg, stage)
    have, where = memory_bytes(device)
    if have is None or weights + acts <= have:
        return
    what = f"~{params:.3g} parameters need {_size(weights)} for training state" if params else ""
    keys = (
        "data.seq_len / train.global_batch_size"
        if stage == "preprocess"
        else (
            "finetune.micro_batch_size / finetune.max_seq_length"
            if stage == "finetune"
            else "train.micro_batch_size / data.seq_len / model.mem_len"
        )
    )
    if params and weights > have:
        keys = "model.d_model / model.n_layer / model.d_inner / model.vocab_size"
    raise ConfigError(
        f"this config does not fit in memory: {what}{' plus ' if what else ''}{_size(acts)} of activations per "
        f"micro-batch (a lower bound), {where} has {_size(have)}; lower {keys}"
    )


def check_inference_fits(m: ModelConfig, batch: int, length: int, device: Any, keys: str) -> None:
    """Refuse, in one line naming ``keys`` (the options to lower), an inference pass (no gradients: one layer at a
    time) whose attention scores alone exceed the machine's memory, before any of it is allocated: per head and query
    the content scores (``length`` keys), the position scores before and after the shift (2 x ``length`` and
    ``length``) and the probabilities (``length``), in fp32. Measured on CPU: 5.4 to 6.6 times [batch, heads, length,
    length] floats at the peak, so 5 times is a lower bound."""
    need = batch * m.n_head * length * 5 * length * FP32
    have, where = memory_bytes(device)
    if have is not None and need > have:
        raise ConfigError(
            f"{batch} examples of {length} tokens need at least {_size(need)} for one layer's attention scores "
            f"({m.n_head} heads), {where} has {_size(have)}; lower {keys}"
        )


def check_weights_size(m: ModelConfig, have: int, where: Any) -> None:
    """Refuse a checkpoint's config that describes a model far larger than its ``have`` weights (an edited
    config.json: d_model=1000000) before a model of that size is built: a hang or a terabyte allocation otherwise."""
    want = model_params(m)
    if want > 2 * have + 1_000_000:
        raise CheckpointError(
            f"{where}: its config describes a model of ~{want:.3g} parameters (d_model {m.d_model}, n_layer "
            f"{m.n_layer}, vocab_size {m.vocab_size}) but the weights hold {have:.3g}; the config does not belong to "
            "these weights"
        )
