"""The Hugging Face handoff: `xlnet export` (our checkpoint -> a directory transformers loads, with its task head
and tokenizer) and `xlnet import` (an HF XLNet directory -> our checkpoint). The mappings themselves are below:
state dict and config in model/state_dict_adapter.py, heads and reading HF directories in checkpoint/hf_dir.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.checkpoint.hf_dir import FINETUNE_FILE, PRETRAINING_FILE, PRETRAINING_KEYS, load_hf_dir, model_for_hf
from xlnetcli.checkpoint.load import checkpoint_inputs, load_model_dir, load_state, resolve_checkpoint
from xlnetcli.config import CONFIG_VERSION, Config, config_to_dict
from xlnetcli.core.errors import CheckpointError
from xlnetcli.core.files import (
    atomic_output_dir,
    atomic_write_json,
    check_output_not_input,
    output_lock,
    save_safetensors,
)
from xlnetcli.data.tokenizer import copy_tokenizer
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.heads import FinetuneModel


def _model_for_import(
    cfg: Config, state: dict[str, torch.Tensor], hf_meta: dict[str, Any], p: Path
) -> tuple[torch.nn.Module, dict[str, Any]]:
    src = str(p.resolve())
    if hf_meta.get("kind") == "finetune":
        task, labels = hf_meta["task"], hf_meta.get("labels")
        model: torch.nn.Module = FinetuneModel(cfg.model, cfg.finetune, task, len(labels or []) or 1)
        meta: dict[str, Any] = {
            "kind": "finetune",
            "task": task,
            "labels": labels,
            "step": hf_meta.get("step", 0),
            "source": src,
            **{
                k: hf_meta[k]
                for k in ("hf_class", "metric", "value", "null_odds_threshold", "squad_v2")
                if k in hf_meta
            },
        }
    else:
        model = XLNetLMHeadModel(cfg.model)
        meta = {"kind": "import", "step": 0, "source": src}
        if "dropped_head" in hf_meta:
            meta["dropped_head"] = hf_meta["dropped_head"]
    load_state(model, state, where=f"HF model {p}")
    return model, meta


def export_hf(ckpt: str | Path, out: str | Path, overwrite: bool = False, backbone_only: bool = False) -> Path:
    """Write config.json, model.safetensors and the tokenizer folder's files (spiece.model, tokenizer.json, ...)
    loadable by transformers: a pretrained checkpoint as XLNetLMHeadModel, a finetuned one as its task's class with
    its head (`model_for_hf`), either as XLNetModel (the transformer alone) with ``backbone_only``."""
    src = resolve_checkpoint(ckpt)
    cfg, state, meta = load_model_dir(src)
    hc, hf_state, finetune_record = model_for_hf(cfg, state, meta, backbone_only, where=str(src))
    tok_src = src / "tokenizer" if (src / "tokenizer" / "spiece.model").is_file() else src / "spiece.model"
    pretraining = {
        "comment": "How this model was pretrained with xlnet (transformers ignores this file; `xlnet import` "
        "restores it). config.json holds inference settings: no memory, no bi_data. 'config': the run's own "
        "config (its tokenizer, data, train and finetune sections are restored on import).",
        "model": {k: getattr(cfg.model, k) for k in PRETRAINING_KEYS},
        "data": {"seq_len": cfg.data.seq_len, "num_predict": cfg.data.num_predict, "perm_size": cfg.data.perm_size},
        "config": {"config_version": CONFIG_VERSION, **config_to_dict(cfg)},
    }
    inputs = [*checkpoint_inputs(ckpt), ckpt]  # a run given whole: nothing written inside it
    with atomic_output_dir(out, overwrite=overwrite, what="an exported model", inputs=inputs) as tmp:
        atomic_write_json(tmp / "config.json", hc)
        atomic_write_json(tmp / PRETRAINING_FILE, pretraining)
        if finetune_record is not None:
            atomic_write_json(tmp / FINETUNE_FILE, finetune_record)
        save_safetensors(hf_state, tmp / "model.safetensors", metadata={"format": "pt"})
        if tok_src.exists():  # spiece.model, xlnet_tokenizer.json, tokenizer.json, tokenizer_config.json
            copy_tokenizer(tok_src, tmp)
    return Path(out)


def import_hf(hf_dir: str | Path, out: str | Path, overwrite: bool = False) -> Path:
    """An HF XLNet directory -> our checkpoint folder (model.safetensors, config.yaml, tokenizer/, meta.json): a
    finetuned checkpoint (task, labels, head) when its head carries over (`read_hf_head`), else the pretrained model
    (a head that does not carry over is dropped: `import_summary` says which)."""
    p = Path(hf_dir)
    if not (p / "config.json").is_file():
        raise CheckpointError(f"{p} is not an HF model directory (no config.json)")
    cfg, state, hf_meta = load_hf_dir(p)
    model, meta = _model_for_import(cfg, state, hf_meta, p)
    with tempfile.TemporaryDirectory() as td:
        tok_dir = None
        if (p / "spiece.model").is_file():  # with its options (ours, or tokenizer_config.json's; Tokenizer.load)
            tok_dir = copy_tokenizer(p / "spiece.model", Path(td) / "tokenizer")
        check_output_not_input(out, [p])
        with output_lock(out):
            save_model_dir(out, model, cfg, tokenizer_dir=tok_dir, meta=meta, overwrite=overwrite)
    return Path(out)
