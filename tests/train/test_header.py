"""The pretraining header reads as prose: the objective named with its settings, counts with thousands separators
and the right number ("1 thread"), no Python True/False."""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch
from clitools import TINY

from xlnetcli.config import load_config
from xlnetcli.train.header import say_header


def _engine(cfg, say, **plan):
    env = SimpleNamespace(device=torch.device("cpu"), backend=None, distributed=False, world_size=1)
    fields = {"accumulation": 1, "tokens_per_step": 4096, "precision": "fp32", "distributed": "ddp", "compile": False}
    fields |= {"cuda_graphs": False, "activation_checkpointing": False, **plan}
    scaler = SimpleNamespace(is_enabled=lambda: False)
    return SimpleNamespace(
        env=env,
        plan=SimpleNamespace(**fields),
        step=0,
        relayout=None,
        changes_text=lambda: None,  # nothing changed on a resume
        fused=False,
        scaler=scaler,
        cfg=cfg,
        say=say,
        run_dir="runs/tiny",
    )


def _header(cfg, meta=None, **plan):
    lines: list[str] = []
    say_header(_engine(cfg, lines.append, **plan), (1_234_567, 234_567), meta or {}, "runs/records")
    return "\n".join(lines)


def test_header_names_the_objective_and_formats_numbers(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    cfg = load_config(TINY, ["train.max_steps=20000", "train.eval_every=never"])
    meta = {"splits": {"train": {"steps_per_pass": 1500}}, "passes": 1}
    text = _header(cfg, meta)
    assert "permutation language modelling" in text
    assert f"{cfg.data.num_predict} of {cfg.data.seq_len} tokens predicted" in text
    assert "cpu with 1 thread " in text and "1 threads" not in text
    assert "20,000 steps" in text and "after step 1,500" in text and "1 pass" in text
    assert "evaluation never" in text
    assert not re.search(r"\b(True|False|None)\b", text), text


def test_header_other_objectives_and_plurals(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    cfg = load_config(TINY, ["model.objective=clm", "model.mem_len=0", "model.bi_data=false"])
    text = _header(cfg, accumulation=2, compile=True)
    assert "left-to-right language modelling" in text and "no memory" in text and "bidirectional" not in text
    assert "4 threads" in text and "2 accumulation steps" in text and "torch.compile" in text
    assert not re.search(r"\b(True|False|None)\b", text), text
