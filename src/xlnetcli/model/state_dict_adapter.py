"""The Hugging Face adapter beside the model (as torchtitan keeps ``state_dict_adapter.py``): our state dict, memories
and model config <-> transformers' XLNet (docs/xlnet.md §7). Pure mappings: reading and writing HF directories is
checkpoint/hf_dir.py and interop/huggingface.py.

Our names are HF's names except: ``transformer.mask_emb`` is [d] (HF [1,1,d]); the LM bias is ``lm_bias`` (HF
``lm_loss.bias``; ``lm_loss.weight`` is tied to the embedding and not stored); with ``untie_r=false`` the shared
``transformer.r_{w,r,s}_bias`` become per-layer copies in HF (HF has no shared biases), so such a model imports back
as ``untie_r=true`` with identical values. Tensors are copied unchanged: the round trip is bit-exact.
HF memories are time-major [M,B,d]; ours are batch-first [B,M,d] (`mems_to_hf`, `mems_from_hf`).
"""

from __future__ import annotations

from typing import Any

import torch

from xlnetcli.config import ModelConfig
from xlnetcli.core.errors import CheckpointError

BIASES = ("r_w_bias", "r_r_bias", "r_s_bias")


# ---- state dicts ------------------------------------------------------------------------------------------------


def to_hf_state(state: dict[str, torch.Tensor], mcfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict -> HF XLNetLMHeadModel names (without the tied lm_loss.weight)."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k == "transformer.mask_emb":
            out[k] = v.reshape(1, 1, -1)
        elif k == "lm_bias":
            out["lm_loss.bias"] = v
        elif k.startswith("transformer.r_") and k.split(".")[-1] in BIASES:
            for i in range(mcfg.n_layer):
                out[f"transformer.layer.{i}.rel_attn.{k.split('.')[-1]}"] = v
        else:
            out[k] = v
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def from_hf_state(hf: dict[str, torch.Tensor], mcfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF XLNetLMHeadModel / XLNetModel state dict -> ours (for an untie_r=true ModelConfig)."""
    if not any(k.startswith("transformer.") for k in hf):
        hf = {f"transformer.{k}": v for k, v in hf.items()}  # a bare XLNetModel
    out: dict[str, torch.Tensor] = {}
    for k, v in hf.items():
        if k == "lm_loss.weight":
            continue  # tied to the word embedding
        if k == "lm_loss.bias":
            out["lm_bias"] = v
        elif k == "transformer.mask_emb":
            out[k] = v.reshape(-1)
        elif k.startswith("transformer."):
            out[k] = v
        # other heads (sequence_summary, logits_proj, ...) are not part of the LM model: dropped
    if "lm_bias" not in out:
        out["lm_bias"] = torch.zeros(mcfg.vocab_size)
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def mems_to_hf(mems: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """Our memories (per layer [B, M, d]) -> transformers' ([M, B, d])."""
    return None if mems is None else [m.transpose(0, 1).contiguous() for m in mems]


def mems_from_hf(mems: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
    """transformers' memories (per layer [M, B, d]) -> ours ([B, M, d])."""
    return None if mems is None else [m.transpose(0, 1).contiguous() for m in mems]


# ---- configs ------------------------------------------------------------------------------------------------


def to_hf_config(mcfg: ModelConfig, pretraining_layout: bool = False) -> dict[str, Any]:
    """transformers' XLNetConfig values for our model config. Default: inference-safe (as released configs: no
    memory or reuse length, bi_data off); ``pretraining_layout=True`` copies mem_len, reuse_len and bi_data (for
    running transformers' model on our pretraining batches, as the parity tests and benchmarks do)."""
    if mcfg.n_head * mcfg.d_head != mcfg.d_model:
        raise CheckpointError(
            f"HF XLNet needs n_head*d_head == d_model, got {mcfg.n_head}*{mcfg.d_head} != {mcfg.d_model}"
        )
    if mcfg.ff_activation not in ("gelu", "gelu_new", "relu"):
        raise CheckpointError(f"ff_activation {mcfg.ff_activation!r} has no HF equivalent")
    return {
        "architectures": ["XLNetLMHeadModel"],
        "model_type": "xlnet",
        "vocab_size": mcfg.vocab_size,
        "d_model": mcfg.d_model,
        "n_layer": mcfg.n_layer,
        "n_head": mcfg.n_head,
        "d_head": mcfg.d_head,
        "d_inner": mcfg.d_inner,
        "ff_activation": mcfg.ff_activation,
        "untie_r": True,
        "attn_type": "bi",
        "initializer_range": mcfg.initializer_range,
        "layer_norm_eps": mcfg.layer_norm_eps,
        "dropout": mcfg.dropout,  # HF uses it for attention probabilities too (no dropatt)
        "mem_len": (mcfg.mem_len or None) if pretraining_layout else None,
        "reuse_len": (mcfg.reuse_len or None) if pretraining_layout else None,
        "bi_data": mcfg.bi_data if pretraining_layout else False,
        "clamp_len": mcfg.clamp_len,
        "same_length": mcfg.same_length,
        "summary_type": "last",
        "summary_use_proj": True,
        "summary_activation": "tanh",
        "summary_last_dropout": 0.1,
        "start_n_top": 5,
        "end_n_top": 5,
        "pad_token_id": 5,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": True,
    }


def from_hf_config(hc: dict[str, Any]) -> ModelConfig:
    """Our model config for transformers' XLNetConfig values (untie_r on: HF has no shared biases)."""
    try:
        d_model, n_head = int(hc["d_model"]), int(hc["n_head"])
        return ModelConfig(
            vocab_size=int(hc["vocab_size"]),
            d_model=d_model,
            n_layer=int(hc["n_layer"]),
            n_head=n_head,
            d_head=int(hc.get("d_head") or d_model // n_head),
            d_inner=int(hc["d_inner"]),
            ff_activation=hc.get("ff_activation", "gelu"),
            untie_r=True,
            dropout=float(hc.get("dropout", 0.1)),
            dropatt=float(hc.get("dropout", 0.1)),
            layer_norm_eps=float(hc.get("layer_norm_eps", 1e-12)),
            initializer_range=float(hc.get("initializer_range", 0.02)),
            mem_len=int(hc.get("mem_len") or 0),
            reuse_len=int(hc.get("reuse_len") or 0),
            bi_data=bool(hc.get("bi_data", False)),
            clamp_len=int(hc.get("clamp_len", -1)),
            same_length=bool(hc.get("same_length", False)),
            attn_impl="auto",
        )
    except KeyError as e:
        raise CheckpointError(f"HF config.json lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"HF config.json has an invalid value ({e})") from None
