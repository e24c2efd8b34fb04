"""Finetuning-test helpers shared by train/test_finetune.py and interop/test_hf_heads.py: a tiny model (random
init, d_model 64, 2 layers), the finetune settings of a quick run, the bundled task's rows and labels."""

from __future__ import annotations

from pathlib import Path

import torch

from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.config import load_config
from xlnetcli.model import XLNetLMHeadModel

LABELS = ["concurrency", "gui", "internet", "testing"]  # the areas of data/pydocs/task_{train,valid}.tsv

MODEL_SETS = [
    "tokenizer.vocab_size=2000",
    "model.vocab_size=2000",
    "model.d_model=64",
    "model.n_layer=2",
    "model.n_head=2",
    "model.d_head=32",
    "model.d_inner=128",
    "model.mem_len=0",
    "model.reuse_len=0",
    "model.bi_data=false",
    "data.seq_len=64",
    "data.num_predict=10",
    "data.perm_size=16",
    "tokenizer.character_coverage=0.9999",
    "tokenizer.threads=1",
]


def ft_cfg(*sets: str):
    base = [
        "finetune.max_seq_length=64",
        "finetune.batch_size=32",
        "finetune.micro_batch_size=32",
        "finetune.lr=1e-3",
        "finetune.epochs=2",
        "finetune.dropout=0.1",
        "finetune.dropatt=0.0",
        "finetune.precision=fp32",
    ]
    return load_config(None, base + list(sets))


def pydocs_rows(path: Path, limit: int | None = None) -> list[tuple[str, str]]:
    rows = [tuple(line.split("\t")) for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    return rows[:limit] if limit else rows


def random_init_checkpoint(builds, root: Path) -> Path:
    """``root``/init: a random-init pretraining checkpoint of MODEL_SETS with its tokenizer (a shared build)."""
    cfg = load_config(None, MODEL_SETS)
    torch.manual_seed(0)
    save_model_dir(
        root / "init",
        XLNetLMHeadModel(cfg.model),
        cfg,
        builds.tokenizer(cfg.tokenizer),
        meta={"kind": "pretrain", "step": 0},
    )
    return root
