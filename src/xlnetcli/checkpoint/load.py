"""Loading a checkpoint: `resolve_checkpoint` accepts a run directory (-> its latest step folder), a step folder, or a
Hugging Face XLNet directory (config.json + model.safetensors / pytorch_model.bin), which `load_model_dir` converts
on the fly (hf_dir.py). Every file of a step folder is checked against meta.json's sha256 (hashing a base model's
~500 MB of weights takes about a second), and the weights (finite values, keys and shapes) before a model sees them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file

from xlnetcli.checkpoint.folders import MODEL_FILE, find_tokenizer, step_folders, verify_checkpoint
from xlnetcli.checkpoint.hf_dir import first_non_finite, load_hf_dir
from xlnetcli.config import Config, ModelConfig, config_from_dict, replace, upgrade_config, yaml_load
from xlnetcli.config.sizes import check_weights_size
from xlnetcli.core.errors import CheckpointError, ConfigError, DataError
from xlnetcli.core.files import sha256_file
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.report.metrics_log import run_inputs

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


def checkpoint_inputs(path: str | Path) -> list[Path]:
    """What an output must stay apart from when the checkpoint ``path`` is read: the folder it resolves to, whole,
    and, when ``path`` is a run folder, that run's own files and subfolders (report.metrics_log.run_inputs)."""
    p = Path(path)
    resolved = resolve_checkpoint(p)
    if p.is_dir() and p.resolve() != resolved.resolve():
        return [resolved, *run_inputs(p)]
    return [resolved]


def load_model_dir(path: str | Path) -> tuple[Config, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, state dict in our names, meta) from a step folder, run directory or HF directory."""
    p = resolve_checkpoint(path)
    cfg, state, meta = load_hf_dir(p) if is_hf_dir(p) else load_step_folder(p)
    check_weights_size(cfg.model, sum(t.numel() for t in state.values()), p)
    return cfg, state, meta


def load_step_folder(p: Path) -> tuple[Config, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, weights, meta) of one of our step folders, every file checked against its meta.json (the engine's
    resume loads these into the model it built; load_model_dir also checks an LM's size before one is built)."""
    meta = verify_checkpoint(p)  # every file meta.json lists (config.yaml, tokenizer, weights, train state)
    try:
        raw = yaml_load((p / "config.yaml").read_text(encoding="utf-8"))  # no aliases: a bomb cannot expand
        if not isinstance(raw, dict):
            raise ConfigError(f"the config must be a mapping of sections, got {type(raw).__name__}")
        cfg = config_from_dict(upgrade_config(raw, str(p / "config.yaml")))  # an earlier version's: today's spelling
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{p / 'config.yaml'}: unreadable ({e.__class__.__name__})") from None
    except ConfigError as e:
        raise CheckpointError(f"{p / 'config.yaml'}: {e}") from None
    try:
        state = load_file(str(p / MODEL_FILE))
    except (OSError, SafetensorError, ValueError) as e:
        raise CheckpointError(f"{p / MODEL_FILE}: corrupt or unreadable ({str(e).splitlines()[0][:120]})") from None
    check_finite(state, p / MODEL_FILE)
    meta.setdefault("path", str(p))
    return cfg, state, meta


def check_finite(state: dict[str, torch.Tensor], where: Path | str) -> None:
    """Refuse weights holding NaN/inf (saved from a diverged run): every later number would be garbage."""
    key = first_non_finite(state)
    if key is not None:
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
    load_state(model, lm_state(state, meta, cfg.model.vocab_size), where=f"checkpoint {meta.get('path', path)}")
    model.to(device).eval()
    return model, cfg, meta


def lm_state(state: dict[str, torch.Tensor], meta: dict[str, Any], vocab_size: int) -> dict[str, torch.Tensor]:
    """A checkpoint's weights for XLNetLMHeadModel: a finetuned encoder goes under the tied LM head with a zero bias
    (as transformers does); its task head is left out."""
    if meta.get("kind") != "finetune":
        return state
    body = {k: v for k, v in state.items() if k.startswith("transformer.")}
    return {**body, "lm_bias": torch.zeros(vocab_size)}


# ---- continued pretraining: the checkpoint a run starts from --------------------------------------------------------

# model keys a continued run may set differently from its checkpoint: regularisation, the pretraining batch layout
# (memory, reuse, bi_data, objective) and how positions are clipped; the architecture (ARCH_KEYS) and the weights'
# numerics (layer_norm_eps) come from the checkpoint.
CONTINUE_MUTABLE = ("dropout", "dropatt", "mem_len", "reuse_len", "bi_data", "objective", "clamp_len", "attn_impl")


@dataclass
class StartingPoint:
    """The checkpoint a run starts from (`xlnet pretrain --init`, `xlnet finetune --init`): a run or step folder of
    ours (pretrained or finetuned) or a Hugging Face directory, its files checked and its weights loaded as stored."""

    path: Path  # the checkpoint folder (a run resolves to its latest step folder) or HF directory
    cfg: Config  # its config: model is the architecture; finetune the settings a finetuned checkpoint was trained with
    state: dict[str, torch.Tensor]  # its weights in our names (a finetuned checkpoint's task head included)
    meta: dict[str, Any]  # its meta.json (an HF directory's: what hf_dir read of it)
    tokenizer: Path | None  # its tokenizer for Tokenizer.load (None: an HF directory without a SentencePiece model)

    @property
    def model(self) -> ModelConfig:
        return self.cfg.model

    @property
    def hf(self) -> bool:
        return is_hf_dir(self.path)

    @property
    def source(self) -> str:
        """What it is, for the log: "pretrained checkpoint", "finetuned checkpoint (classification: ...)", ..."""
        kind = self.meta.get("kind")
        if self.hf:
            source = f"Hugging Face {self.meta['hf_class']}"
        else:
            source = "finetuned checkpoint" if kind == "finetune" else "pretrained checkpoint"
        if kind == "finetune":
            source += f" ({self.meta.get('task')}: its transformer, the task head left out)"
        return source

    @property
    def lm_bias(self) -> bool:
        """The LM bias comes from the checkpoint (else zeros: a finetuned checkpoint or a model without LM head)."""
        if self.meta.get("kind") == "finetune":
            return False
        return bool(self.meta["lm_bias"]) if self.hf else "lm_bias" in self.state

    def sha256(self) -> str:
        """Of its weights file, recorded in the run's meta.json (ours: from its checked meta.json)."""
        if self.hf:
            return sha256_file(self.path / self.meta.get("weights", MODEL_FILE))
        return (self.meta.get("sha256") or {}).get(MODEL_FILE) or sha256_file(self.path / MODEL_FILE)

    def lm_weights(self) -> dict[str, torch.Tensor]:
        """Its weights for XLNetLMHeadModel (continued pretraining), checked against the architecture's keys and
        shapes: a finetuned encoder under the tied LM head with a zero bias, its task head left out."""
        state = lm_state(self.state, self.meta, self.model.vocab_size)
        with torch.device("meta"):  # shapes only, nothing allocated
            check_state_keys(XLNetLMHeadModel(self.model), state, where=f"checkpoint {self.path}")
        return state

    def record(self) -> dict[str, Any]:
        """meta.json's ``init`` entry of every step folder of a run started from it."""
        return {"path": str(self.path), "sha256": self.sha256(), "source": self.source, "lm_bias": self.lm_bias}


def load_starting_point(path: str | Path) -> StartingPoint:
    """The config, weights, meta.json and tokenizer of ``path`` (a run, step folder, finetuned run or HF directory),
    checked (checksums, finite values; the keys and shapes where a model takes them)."""
    cfg, state, meta = load_model_dir(path)
    p = Path(meta["path"])
    try:
        tok: Path | None = find_tokenizer(p)
    except (CheckpointError, DataError):
        tok = None
    return StartingPoint(p, cfg, state, meta, tok)


def continued_model_config(start: ModelConfig, cfg: ModelConfig, where: str) -> tuple[ModelConfig, list[str]]:
    """The model config of a run continuing from a checkpoint with model config ``start``: its architecture, the
    run's ``CONTINUE_MUTABLE`` keys. CheckpointError naming both values when an architecture key of ``cfg``
    disagrees; also returns the changes against the checkpoint, for the log ("mem_len 0 -> 384")."""
    for key in ARCH_KEYS:
        have, want = getattr(start, key), getattr(cfg, key)
        if have != want:
            raise CheckpointError(
                f"{where} has model.{key}={have!r} but the config has model.{key}={want!r}; the architecture comes "
                f"from the checkpoint: use a config with its architecture (e.g. --config continue-base for "
                f"xlnet-base-cased) or --set model.{key}={have}"
            )
    merged = dataclasses.replace(start, **{k: getattr(cfg, k) for k in CONTINUE_MUTABLE})
    changes = [
        f"{k} {getattr(start, k)!r} -> {getattr(merged, k)!r}"
        for k in CONTINUE_MUTABLE
        if getattr(start, k) != getattr(merged, k) and k != "attn_impl"
    ]
    if cfg.layer_norm_eps != start.layer_norm_eps:
        changes.append(f"layer_norm_eps {cfg.layer_norm_eps!r} in the config, {start.layer_norm_eps!r} kept (weights)")
    return merged, changes
