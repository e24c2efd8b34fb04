"""How a model is laid over time and devices, kept out of xlnet.py (torchtitan's "parallelize" step).

    model = parallelize(model, env, cfg.train)   # activation checkpointing -> torch.compile -> DDP or FSDP2

- Activation checkpointing (``train.activation_checkpointing``): each transformer layer keeps only its input and
  recomputes the rest in backward (non-reentrant: the RNG state is replayed, so dropout masks are identical).
- ``train.compile``: each layer is compiled on its own (``nn.Module.compile``): one graph per layer body, reused by
  every layer, no graph break from the model's input checks; parameter names and state dicts are unchanged.
- ``train.cuda_graphs``: the compiled layers are captured as CUDA graphs and replayed (``mode="reduce-overhead"``,
  torch's CUDA graph trees): the host launches one graph per layer and direction instead of its kernels. Static
  shapes (``train.static_shapes``) make one capture serve every step. Each forward of the model starts a new step of
  the trees, and the memories it returns are copied out of the graphs' buffers, which the next replay overwrites.
- DDP, or FSDP2 ``fully_shard`` per layer and then the root (embeddings, LM bias, shared biases): a layer reads only
  its own parameters (the position projection is inside the layer), so each layer's weights are gathered just
  before it runs and freed after.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

from xlnetcli.core import dist
from xlnetcli.core.errors import ConfigError
from xlnetcli.model.xlnet import XLNetLayer, XLNetModel


def xlnet_core(model: nn.Module) -> XLNetModel:
    """The XLNetModel inside an LM model, a finetuning model or a wrapper (or the model itself)."""
    for m in dist.unwrap(model).modules():
        if isinstance(m, XLNetModel):
            return m
    raise ConfigError("this model has no XLNet transformer layers to checkpoint, compile or shard")


def transformer_layers(model: nn.Module) -> nn.ModuleList:
    """The ModuleList of transformer layers inside an LM model, a finetuning model or a bare XLNetModel."""
    return xlnet_core(model).layer


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Wrap every layer so that backward recomputes it (state-dict keys are unchanged by the wrapper)."""
    layers = transformer_layers(model)
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def compile_layers(model: nn.Module, **kwargs) -> None:
    """``torch.compile`` each layer in place (kwargs go to torch.compile). Static shapes: a pretraining run sees a few
    (memory length 0, reuse_len, mem_len; the last layer's query rows), each compiled once."""
    import torch._dynamo  # noqa: PLC0415 - importing dynamo takes seconds, and only compiled runs need it

    kwargs.setdefault("dynamic", False)
    # one graph per (memory length, stream layout, train/eval): more than dynamo's default of 8 in a long run
    conf = torch._dynamo.config
    name = "recompile_limit" if hasattr(conf, "recompile_limit") else "cache_size_limit"  # renamed in torch 2.6
    setattr(conf, name, max(getattr(conf, name), 64))
    for layer in transformer_layers(model):
        layer.compile(**kwargs)


def replay_layers_as_graphs(model: nn.Module) -> None:
    """CUDA graphs of the compiled layers (train.cuda_graphs): ``compile_layers(model, mode="reduce-overhead")``, and
    on the XLNet model two hooks: each forward begins a new step of the graph trees (the outputs of the last one may
    be overwritten from here on), and the memories it returns (layer inputs, some of them a graph's output buffers)
    are copied out, so the next segment reads them after the graphs have run again."""
    core = xlnet_core(model)

    def begin_step(module: nn.Module, args: tuple) -> None:
        torch.compiler.cudagraph_mark_step_begin()

    def copy_out_mems(module: nn.Module, args: tuple, out) -> None:
        if out.mems is not None:
            out.mems = [x.clone() for x in out.mems]

    core.register_forward_pre_hook(begin_step)
    core.register_forward_hook(copy_out_mems)
    compile_layers(model, mode="reduce-overhead")


def parallelize(
    model: nn.Module,
    env: dist.DistEnv,
    activation_checkpointing: bool = False,
    compile: bool = False,
    strategy: str = "ddp",
    cuda_graphs: bool = False,
) -> nn.Module:
    """Apply, in this order, activation checkpointing, per-layer compile (``cuda_graphs``: replayed as CUDA graphs)
    and the distributed wrapper (a no-op in one process). Returns the module to train (DDP wraps; FSDP2 shards in
    place)."""
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    if cuda_graphs:
        replay_layers_as_graphs(model)
    elif compile:
        compile_layers(model)
    return dist.wrap_model(model, env, strategy, layer_types=(XLNetLayer,))
