"""Hugging Face interop: state-dict and config adapters, `export_hf` and `import_hf` (docs/xlnet.md §7).

Our names are HF's names except: ``transformer.mask_emb`` is [d] (HF [1,1,d]); the LM bias is ``lm_bias`` (HF
``lm_loss.bias``; ``lm_loss.weight`` is tied to the embedding and not stored); with ``untie_r=false`` the shared
``transformer.r_{w,r,s}_bias`` become per-layer copies in HF (HF has no shared biases), so such a model imports back
as ``untie_r=true`` with identical values. Tensors are copied unchanged: the round trip is bit-exact.
HF memories are time-major [M,B,d]; ours are batch-first [B,M,d] (`mems_to_hf`, `mems_from_hf`).

An export's config.json carries what released XLNet configs carry for inference: no memory length, no reuse length,
no bi_data (in transformers those are properties of a pretraining batch, and with bi_data on a model splits every
batch into forward and backward halves, which is wrong for inference). The values the model was pretrained with sit
beside it in ``xlnet_pretraining.json`` (PRETRAINING_FILE), which transformers ignores and `xlnet import` restores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .config import Config, ModelConfig, config_from_dict
from .errors import CheckpointError

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


def mems_to_hf(mems):
    return None if mems is None else [m.transpose(0, 1).contiguous() for m in mems]


def mems_from_hf(mems):
    return None if mems is None else [m.transpose(0, 1).contiguous() for m in mems]


# ---- configs ------------------------------------------------------------------------------------------------


PRETRAINING_FILE = "xlnet_pretraining.json"
# model keys that describe how a model was pretrained (batch layout, memory), not what it computes on one input
PRETRAINING_KEYS = ("mem_len", "reuse_len", "bi_data", "dropatt", "clamp_len", "same_length")


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


def _with_pretraining_values(mcfg: ModelConfig, path: Path) -> ModelConfig:
    """The pretraining layout written by our export (memory, reuse, bi_data, dropatt), when the folder has it."""
    import dataclasses

    if not path.is_file():
        return mcfg
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["model"]
        return dataclasses.replace(mcfg, **{k: saved[k] for k in PRETRAINING_KEYS if k in saved})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not a valid pretraining record ({type(e).__name__}); remove it to import "
                              "with inference settings") from None


def _full_config(mcfg: ModelConfig, tok: dict[str, Any] | None = None) -> Config:
    import dataclasses

    raw = {
        "tokenizer": {"vocab_size": mcfg.vocab_size},
        "model": dataclasses.asdict(mcfg),
        "data": {"perm_size": None if mcfg.reuse_len else 512},
        "train": {"micro_batch_size": 16},
    }
    if tok:
        raw["tokenizer"].update(tok)
    return config_from_dict(raw)


# ---- directories ------------------------------------------------------------------------------------------------


def load_hf_dir(path: str | Path) -> tuple[Config, dict[str, torch.Tensor], dict[str, Any]]:
    """(Config, our state dict, meta) from an HF XLNet directory (config.json + weights [+ spiece.model])."""
    p = Path(path)
    try:
        hc = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"{p / 'config.json'}: missing or not valid JSON") from None
    if hc.get("model_type", "xlnet") != "xlnet":
        raise CheckpointError(f"{p} is a {hc.get('model_type')!r} model, not XLNet")
    mcfg = from_hf_config(hc)
    mcfg = _with_pretraining_values(mcfg, p / PRETRAINING_FILE)
    if (p / "model.safetensors").is_file():
        from safetensors.torch import load_file

        try:
            hf = load_file(str(p / "model.safetensors"))
        except Exception as e:  # noqa: BLE001 - safetensors raises several types
            raise CheckpointError(f"{p / 'model.safetensors'}: corrupt ({str(e).splitlines()[0][:100]})") from None
    elif (p / "pytorch_model.bin").is_file():
        try:
            hf = torch.load(p / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{p / 'pytorch_model.bin'}: unreadable ({str(e).splitlines()[0][:100]})") from None
    else:
        raise CheckpointError(f"{p} has config.json but no model.safetensors or pytorch_model.bin")
    tok = {}
    tc = p / "tokenizer_config.json"
    if tc.is_file():
        try:
            t = json.loads(tc.read_text(encoding="utf-8"))
            tok = {"uncased": bool(t.get("do_lower_case", False)), "keep_accents": bool(t.get("keep_accents", False))}
        except (OSError, json.JSONDecodeError):
            pass
    return _full_config(mcfg, tok), from_hf_state(hf, mcfg), {"kind": "hf", "path": str(p)}


def export_hf(ckpt: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """Write config.json, model.safetensors and the tokenizer folder's files (spiece.model, tokenizer.json, ...)
    loadable by transformers."""
    from safetensors.torch import save_file

    from .checkpoint import load_model_dir, resolve_checkpoint
    from .io import atomic_output_dir, atomic_write_json
    from .tokenizer import copy_tokenizer

    src = resolve_checkpoint(ckpt)
    cfg, state, _meta = load_model_dir(src)
    hc = to_hf_config(cfg.model)
    hf_state = to_hf_state(state, cfg.model)
    tok_src = src / "tokenizer" if (src / "tokenizer" / "spiece.model").is_file() else src / "spiece.model"
    pretraining = {
        "comment": "How this model was pretrained with xlnet (transformers ignores this file; `xlnet import` "
                   "restores it). config.json holds inference settings: no memory, no bi_data.",
        "model": {k: getattr(cfg.model, k) for k in PRETRAINING_KEYS},
        "data": {"seq_len": cfg.data.seq_len, "num_predict": cfg.data.num_predict, "perm_size": cfg.data.perm_size},
    }
    with atomic_output_dir(out, overwrite=overwrite, what="an exported model") as tmp:
        atomic_write_json(tmp / "config.json", hc)
        atomic_write_json(tmp / PRETRAINING_FILE, pretraining)
        save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tok_src.exists():  # spiece.model, xlnet_tokenizer.json, tokenizer.json, tokenizer_config.json
            copy_tokenizer(tok_src, tmp)
    return Path(out)


def import_hf(hf_dir: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """An HF XLNet directory -> our checkpoint folder (model.safetensors, config.yaml, tokenizer/, meta.json)."""
    import tempfile

    from .checkpoint import save_model_dir
    from .model import XLNetLMHeadModel
    from .tokenizer import copy_tokenizer

    p = Path(hf_dir)
    if not (p / "config.json").is_file():
        raise CheckpointError(f"{p} is not an HF model directory (no config.json)")
    cfg, state, _ = load_hf_dir(p)
    model = XLNetLMHeadModel(cfg.model)
    from .checkpoint import load_state

    load_state(model, state, where=f"HF model {p}")
    meta = {"kind": "import", "step": 0, "source": str(p.resolve())}
    with tempfile.TemporaryDirectory() as td:
        tok_dir = None
        if (p / "spiece.model").is_file():  # with its options (ours, or tokenizer_config.json's; Tokenizer.load)
            tok_dir = copy_tokenizer(p / "spiece.model", Path(td) / "tokenizer")
        save_model_dir(out, model, cfg, tokenizer_dir=tok_dir, meta=meta, overwrite=overwrite)
    return Path(out)
