"""The XLNet model: ``xlnet.py`` (the maths, in the paper's order), ``kernels.py`` (how the attention core, the
feed-forward block and the LM head run) and ``parallel.py`` (activation checkpointing, per-layer compile, DDP /
FSDP2)."""

from xlnetcli.model.parallel import apply_activation_checkpointing, compile_layers, parallelize, transformer_layers
from xlnetcli.model.xlnet import (
    SIZES,
    FeedForward,
    LMOutput,
    RelativeAttention,
    XLNetLayer,
    XLNetLMHeadModel,
    XLNetModel,
    XLNetOutput,
    build_model,
    named_config,
    num_params,
)

__all__ = [
    "SIZES",
    "FeedForward",
    "LMOutput",
    "RelativeAttention",
    "XLNetLMHeadModel",
    "XLNetLayer",
    "XLNetModel",
    "XLNetOutput",
    "apply_activation_checkpointing",
    "build_model",
    "compile_layers",
    "named_config",
    "num_params",
    "parallelize",
    "transformer_layers",
]
