"""The header `xlnet pretrain` prints before its first step, as prose: the objective named with the settings that
make it (the paper's permutation LM, Yang et al. 2019 §2.2-2.3, or an ablation's), then the model, batch, device,
data and optimizer, numbers with thousands separators."""

from __future__ import annotations

from pathlib import Path

import torch

from xlnetcli.config import Config, FinetuneConfig
from xlnetcli.core.text import counted
from xlnetcli.data.labelled import Reading
from xlnetcli.train.engine import Engine

OBJECTIVE_PROSE = {  # model.objective -> what the header calls it
    "plm": "permutation language modelling (XLNet: each target predicted from a random factorisation order)",
    "mlm": "masked language modelling (<mask> at the targets: DAE + Transformer-XL)",
    "clm": "left-to-right language modelling (Transformer-XL's)",
}


def objective_prose(cfg: Config) -> str:
    """The objective named, with the settings that make it: targets, spans, factorisation blocks, memory, bi_data."""
    m, d = cfg.model, cfg.data
    unit = "word" if d.mask_mode == "word" else "piece"
    parts = [
        f"{d.num_predict:,} of {d.seq_len:,} tokens predicted per sequence, in spans of up to {d.max_gram} {unit}s"
    ]
    if m.objective == "plm":
        parts.append(f"orders drawn in blocks of {d.perm_size or m.reuse_len:,} tokens")
    if m.mem_len:
        parts.append(f"a memory of {m.mem_len:,} tokens ({m.reuse_len:,} reused per window)")
    else:
        parts.append("no memory")
    if m.bi_data:
        parts.append("bidirectional data (half of each batch reversed)")
    return f"{OBJECTIVE_PROSE[m.objective]}; {', '.join(parts)}"


def device_prose(engine: Engine, deterministic: bool | None = None) -> str:
    """Where the run goes, its precision and the speed-ups on or off (the device line of pretraining's and
    finetuning's headers); ``deterministic``: train.deterministic (None: not said)."""
    env, dev, plan = engine.env, engine.env.device, engine.plan
    where = f"{dev} with {counted(torch.get_num_threads(), 'thread')}" if dev.type == "cpu" else str(dev)
    procs = f"{env.backend}, {plan.distributed}" if env.distributed else env.backend or "a single process"
    precision = plan.precision + (" with a gradient scaler" if engine.scaler.is_enabled() else "")
    compiled = ("torch.compile with CUDA graphs" if plan.cuda_graphs else "torch.compile") if plan.compile else "eager"
    flags = [
        "fused AdamW" if engine.fused else "unfused AdamW",
        compiled,
        "activation checkpointing" if plan.activation_checkpointing else "no activation checkpointing",
    ]
    if deterministic is not None:
        flags.append("deterministic kernels" if deterministic else "nondeterministic kernels")
    return f"{where} ({procs}), precision {precision}, {', '.join(flags)}"


def say_header(engine: Engine, sizes: tuple[int, int], meta: dict, data_dir: Path) -> None:
    """The header: the run, its objective, model (``sizes``: parameters with and without the embedding), batch,
    device, data (``meta``: the records' meta.json) and optimizer lines."""
    say, cfg, out_dir = engine.say, engine.cfg, engine.run_dir
    t, m, d, plan, step = cfg.train, cfg.model, cfg.data, engine.plan, engine.step
    n_params, n_nonemb = sizes
    start = f"continuing from {t.init}" if t.init else "from scratch"
    say(f"[bold]xlnet pretrain[/bold] {f'resuming at step {step:,}' if step else start} -> {out_dir}")
    say(f"  objective  {objective_prose(cfg)}")
    say(
        f"  model      {n_params / 1e6:.2f}M parameters ({n_nonemb / 1e6:.2f}M without embeddings): "
        f"{counted(m.n_layer, 'layer')}, d_model {m.d_model:,}, {counted(m.n_head, 'head')} of {m.d_head}"
    )
    say(
        f"  batch      {counted(t.global_batch_size, 'sequence')} of {d.seq_len:,} tokens per step = "
        f"{t.micro_batch_size:,} per micro-batch x {counted(plan.accumulation, 'accumulation step')} x "
        f"{counted(engine.env.world_size, 'process', 'processes')} ({plan.tokens_per_step:,} tokens); "
        f"{counted(t.max_steps, 'step')}"
    )
    say(f"  device     {device_prose(engine, t.deterministic)}")
    if engine.relayout:
        say(f"  layout     {engine.relayout}")
    if (changed := engine.changes_text()) is not None:
        say(f"  changed    {changed}")
    spp = meta.get("splits", {}).get("train", {}).get("steps_per_pass")
    if spp:
        passes = meta.get("passes", 1)
        again = spp * passes < t.max_steps
        say(
            f"  data       {data_dir}: {counted(spp, 'step')} per pass x {counted(passes, 'pass', 'passes')}"
            + (f"; the passes repeat with new factorisation orders after step {spp * passes:,}" if again else "")
        )
    decay = "constant" if t.schedule == "constant" else f"{t.schedule} decay to {t.min_lr_ratio:g} x lr"
    clip = f"gradients clipped at norm {t.clip_norm:g}" if t.clip_norm else "no gradient clipping"
    evals = f"every {counted(t.eval_every, 'step')}" if isinstance(t.eval_every, int) else "never"
    words = {"end": "at the end only", "eval": "at every evaluation"}
    saves = words[t.save_every] if isinstance(t.save_every, str) else f"every {counted(t.save_every, 'step')}"
    say(
        f"  optimizer  AdamW, lr {t.lr:g} after {counted(t.warmup_steps, 'warmup step')}, then {decay}; weight decay "
        f"{t.weight_decay:g}, {clip}; evaluation {evals}, checkpoints {saves}"
    )


def document_prose(ft: FinetuneConfig) -> str:
    """How a finetuning run reads a text longer than one window (finetune.document), for its header."""
    prose = f"{ft.document}: {Reading.of(ft).describe(ft.memory_length)}"
    if ft.document != "memory":
        return prose
    return f"{prose}, gradient through the last {counted(ft.grad_windows, 'window')}; summary {ft.summary_type}"
