"""Loading a checkpoint: `resolve_checkpoint` accepts a run directory (-> its latest step folder), a step folder, or a
Hugging Face XLNet directory (config.json + model.safetensors / pytorch_model.bin), which `load_model_dir` converts
on the fly (hf_dir.py); weights are checked (checksum, finite values, keys and shapes) before a model sees them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file

from xlnetcli.checkpoint.folders import MODEL_FILE, read_meta, step_folders, verify_files
from xlnetcli.checkpoint.hf_dir import load_hf_dir
from xlnetcli.config import Config, ModelConfig, config_from_dict, replace, yaml_load
from xlnetcli.core.errors import CheckpointError, ConfigError
from xlnetcli.model import XLNetLMHeadModel

# Keys that define the architecture (a checkpoint cannot be loaded into a model that disagrees on these).
ARCH_KEYS = ("vocab_size", "d_model", "n_layer", "n_head", "d_head", "d_inner", "untie_r", "ff_activation")


def is_hf_dir(path: Path) -> bool:
    """A Hugging Face model directory (config.json, no config.yaml), not one of our step folders."""
    return path.is_dir() and (path / "config.json").is_file() and not (path / "config.yaml").is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory -> its latest step folder; a step folder or an HF directory -> itself."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {p}")
    if p.is_file():
        if p.name == MODEL_FILE:
            return resolve_checkpoint(p.parent)
        raise CheckpointError(f"{p} is a file; pass a checkpoint folder (step_NNNNNNN) or a run directory")
    if (p / MODEL_FILE).is_file() and (p / "config.yaml").is_file():
        return p
    if is_hf_dir(p):
        return p
    steps = step_folders(p)
    if not steps:
        raise CheckpointError(f"{p} holds no checkpoint (no model.safetensors + config.yaml, no step_* folders)")
    return steps[-1][1]


def load_model_dir(path: str | Path) -> tuple[Config, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, state dict in our names, meta) from a step folder, run directory or HF directory."""
    p = resolve_checkpoint(path)
    if is_hf_dir(p):
        return load_hf_dir(p)
    try:
        raw = yaml_load((p / "config.yaml").read_text(encoding="utf-8"))  # no aliases: a bomb cannot expand
        cfg = config_from_dict(raw)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{p / 'config.yaml'}: unreadable ({e.__class__.__name__})") from None
    except ConfigError as e:
        raise CheckpointError(f"{p / 'config.yaml'}: {e}") from None
    meta = read_meta(p)
    verify_files(p, [MODEL_FILE], meta)
    try:
        state = load_file(str(p / MODEL_FILE))
    except (OSError, SafetensorError, ValueError) as e:
        raise CheckpointError(f"{p / MODEL_FILE}: corrupt or unreadable ({str(e).splitlines()[0][:120]})") from None
    check_finite(state, p / MODEL_FILE)
    meta.setdefault("path", str(p))
    return cfg, state, meta


def check_finite(state: dict[str, torch.Tensor], where: Path | str) -> None:
    """Refuse weights holding NaN/inf (saved from a diverged run): every later number would be garbage."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"{where}: non-finite values (NaN/inf) in {key}; the run diverged before this save: "
                "use an earlier step folder"
            )


def check_model_config(found: ModelConfig, expected: ModelConfig, where: str = "checkpoint") -> None:
    """CheckpointError naming both values if the architecture keys disagree."""
    for key in ARCH_KEYS:
        a, b = getattr(found, key), getattr(expected, key)
        if a != b:
            raise CheckpointError(f"{where} has model.{key}={a!r} but the requested config has model.{key}={b!r}")


def load_state(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
    """Load a state dict strictly, with a one-line error naming the first missing/unexpected/mis-shaped key."""
    check_state_keys(model, state, where)
    model.load_state_dict(state, strict=True)


def check_state_keys(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
    """CheckpointError naming the first key of ``state`` the model lacks, expects, or shapes differently."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise CheckpointError(
            f"{where} does not match the model ({len(missing)} missing, {len(unexpected)} unexpected keys; {what})"
        )
    for k, v in state.items():
        if own[k].shape != v.shape:
            raise CheckpointError(f"{where}: {k} has shape {list(v.shape)}, the model expects {list(own[k].shape)}")


def load_lm_model(
    path: str | Path,
    device: str | torch.device = "cpu",
    expect: ModelConfig | None = None,
    overrides: dict[str, Any] | None = None,
) -> tuple[XLNetLMHeadModel, Config, dict[str, Any]]:
    """(XLNetLMHeadModel in eval mode, Config, meta) from a checkpoint / run dir / HF dir.

    ``expect``: the requested model config; architecture keys must match (CheckpointError names both values).
    ``overrides``: non-architecture model keys to change (dropout, dropatt, mem_len, reuse_len, bi_data, ...)."""
    cfg, state, meta = load_model_dir(path)
    if expect is not None:
        check_model_config(cfg.model, expect, where=f"checkpoint {meta.get('path', path)}")
    if overrides:
        bad = [k for k in overrides if k in ARCH_KEYS]
        if bad:
            raise CheckpointError(f"cannot override architecture key model.{bad[0]} when loading a checkpoint")
        cfg = replace(cfg, model=dict(overrides))
    model = XLNetLMHeadModel(dataclasses.replace(cfg.model))
    if meta.get("kind") == "finetune":  # a finetuned encoder under the tied LM head, bias zero (as transformers does)
        state = {k: v for k, v in state.items() if k.startswith("transformer.")}
        state["lm_bias"] = torch.zeros(cfg.model.vocab_size)
    load_state(model, state, where=f"checkpoint {meta.get('path', path)}")
    model.to(device).eval()
    return model, cfg, meta
