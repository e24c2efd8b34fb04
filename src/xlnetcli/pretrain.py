"""Pretraining: permutation language modelling on preprocessed records, with memory carried across steps.

    from xlnetcli.config import load_config
    from xlnetcli.pretrain import pretrain
    summary = pretrain(load_config("configs/tiny.yaml"), "records/", "runs/tiny", resume=None)

Batch maths: ``train.global_batch_size`` rows (parallel text streams, fixed for the run) per optimizer step;
each of W processes runs A = global / (micro * W) micro-batches and accumulates gradients. Micro-batch a of rank r
reads rows [(r*A + a)*micro, (r*A + a + 1)*micro), so memory is kept per micro-batch index a (``mems[a]``) and always
continues the same rows' text. The loss is the PLM cross entropy of the query stream on the predicted tokens.

Run folder::

    out/
      config.yaml            resolved config of the run (a different config is refused unless resuming this run)
      metrics.jsonl          one JSON object per log line (split train / eval); TensorBoard in tensorboard/ if installed
      step_0000200/          a checkpoint (written to a temporary folder, fsynced, renamed; the last K are kept)
        model.safetensors config.yaml tokenizer/ meta.json
        train_state.safetensors  optimizer, grad scaler, step, RNG states, data cursors and memories of every rank

``resume="latest"`` (or a step number) continues exactly: same data, same dropout masks, same memories.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import dist
from .checkpoint import TRAIN_STATE, has_train_state, load_train_state, save_tree, step_dir_name, step_folders
from .config import Config, config_to_dict, load_config, save_config
from .dist import autocast_ctx
from .errors import CheckpointError, ConfigError, DataError, XLNetError
from .io import atomic_write_text, check_output_not_input, output_lock
from .flops import device_peak_tflops, train_flops
from .log import console, duration, progress_is_live, step_progress
from .optim import build_optimizer, lr_factor, set_lr
from .parallel import parallelize
from .runlog import MetricsLogger, NullLogger, read_metrics


# train.* keys that may change when resuming a run (they do not change what is computed, only how often we
# log/evaluate/save, how long we train, or how the same maths is executed).
RESUME_MUTABLE = {
    "train.max_steps", "train.eval_every", "train.eval_batches", "train.save_every", "train.keep_last",
    "train.log_every", "train.compile", "train.activation_checkpointing", "train.distributed", "train.deterministic",
    "train.peak_tflops",
}

# records meta key -> config key it must agree with
RECORD_KEYS = {
    "seq_len": "data.seq_len",
    "reuse_len": "model.reuse_len",
    "bi_data": "model.bi_data",
    "num_predict": "data.num_predict",
    "mask_alpha": "data.mask_alpha",
    "mask_beta": "data.mask_beta",
    "mask_mode": "data.mask_mode",
    "perm_size": "data.perm_size",
    "global_batch_size": "train.global_batch_size",
    "micro_batch_size": "train.micro_batch_size",
}


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Resumable step folders of a run (with a train state), oldest first."""
    return [(s, p) for s, p in step_folders(out_dir) if has_train_state(p)]


def _get(cfg_dict: dict, dotted: str) -> Any:
    section, key = dotted.split(".")
    return cfg_dict[section][key]


# ----------------------------------------------------------------------------------------------------------------
# Config resolution and input checks


def pretrain_config_path(config_path: str | Path | None, data_dir: str | Path, out_dir: str | Path,
                         resume: str | None) -> Path | None:
    """Which YAML to load when the user gave no --config: the run's own config when resuming, else the records'."""
    if config_path is not None:
        return Path(config_path)
    if resume is not None and (Path(out_dir) / "config.yaml").is_file():
        return Path(out_dir) / "config.yaml"
    if (Path(data_dir) / "config.yaml").is_file():
        return Path(data_dir) / "config.yaml"
    return None


def read_records_meta(data_dir: str | Path) -> dict:
    from .preprocess import read_meta

    if not Path(data_dir).is_dir():
        raise DataError(f"records folder {data_dir} does not exist; create it with xlnet preprocess")
    return read_meta(data_dir)


def check_records(cfg: Config, meta: dict, data_dir: str | Path) -> None:
    """The records must have been made with the settings this config trains with (docs/xlnet.md §10)."""
    want = config_to_dict(cfg)
    want["data"]["perm_size"] = cfg.perm_size
    for rkey, ckey in RECORD_KEYS.items():
        if rkey not in meta:
            continue
        if rkey == "micro_batch_size" and not cfg.model.bi_data:
            continue  # without bi_data any micro-batch works: rows are independent streams
        have, need = meta[rkey], _get(want, ckey)
        if have != need:
            raise DataError(
                f"records in {data_dir} were preprocessed with {rkey}={have!r} but the config has {ckey}={need!r}; "
                f"re-run xlnet preprocess with this config, or pass --set {ckey}={have}"
            )
    vocab = meta.get("vocab_size")
    if vocab is not None and vocab != cfg.model.vocab_size:
        raise DataError(
            f"records in {data_dir} use a tokenizer with vocab_size={vocab} but the config has "
            f"model.vocab_size={cfg.model.vocab_size}; pass --set model.vocab_size={vocab} --set tokenizer.vocab_size={vocab}"
        )


def batch_maths(cfg: Config, world: int) -> int:
    """Accumulation steps A with global = micro * A * world, or a one-line error."""
    g, mb = cfg.train.global_batch_size, cfg.train.micro_batch_size
    if g % (mb * world):
        options = [m for m in range(1, mb + 1) if g % (m * world) == 0 and (not cfg.model.bi_data or m % 2 == 0)]
        hint = f"e.g. --set train.micro_batch_size={options[-1]}" if options else "change train.global_batch_size"
        raise ConfigError(
            f"impossible batch maths: train.global_batch_size={g} is not a multiple of "
            f"train.micro_batch_size={mb} x {world} process(es); {hint}"
        )
    return g // (mb * world)


def config_diff(a: dict, b: dict, ignore: set[str] = frozenset()) -> list[tuple[str, Any, Any]]:
    out = []
    for section in a:
        for key in a[section]:
            dotted = f"{section}.{key}"
            if dotted in ignore:
                continue
            va, vb = a[section].get(key), b.get(section, {}).get(key)
            if va != vb:
                out.append((dotted, va, vb))
    return out


def _pretrain_relevant(d: dict) -> dict:
    return {k: v for k, v in d.items() if k in ("tokenizer", "model", "data", "train")}


def check_run_dir(cfg: Config, out_dir: Path, resume: str | None) -> tuple[int, Path] | None:
    """Refuse to mix runs; return the checkpoint to resume from (step, folder) or None for a fresh start."""
    if out_dir.exists() and not out_dir.is_dir():
        raise XLNetError(f"output path {out_dir} exists and is not a folder")
    run_cfg = out_dir / "config.yaml"
    ckpts = list_checkpoints(out_dir)
    if not run_cfg.is_file():
        junk = [p for p in out_dir.iterdir() if not p.name.startswith(".")] if out_dir.is_dir() else []
        if junk:
            raise XLNetError(f"output folder {out_dir} is not empty and holds no pretraining run; choose another --out")
        if resume not in (None, "latest"):
            raise CheckpointError(f"nothing to resume: {out_dir} holds no pretraining run")
        return None
    try:
        old = load_config(run_cfg)
    except ConfigError as e:
        raise CheckpointError(f"{run_cfg} is not a valid config ({e}); choose another --out") from None
    if resume is None:
        last = f" (last checkpoint step {ckpts[-1][0]})" if ckpts else ""
        raise XLNetError(
            f"output folder {out_dir} already holds a pretraining run{last}; pass --resume to continue it "
            "or choose another --out"
        )
    diff = config_diff(_pretrain_relevant(config_to_dict(old)), config_to_dict(cfg), RESUME_MUTABLE)
    if diff:
        key, was, now = diff[0]
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        raise XLNetError(
            f"output folder {out_dir} holds a run with {key}={was!r} but this config has {key}={now!r}{more}; "
            "resume with the run's config (omit --config) or choose another --out"
        )
    if not ckpts:
        weights_only = step_folders(out_dir)
        if weights_only:
            raise CheckpointError(
                f"{weights_only[-1][1]} has weights but no {TRAIN_STATE}, so the run cannot continue exactly "
                "(restore the file, or use those weights for finetune/eval/export and pretrain in another --out)")
        if resume == "latest":
            return None  # killed before the first checkpoint: start again in the same folder
        raise CheckpointError(f"no checkpoint step {resume} in {out_dir}: it holds no checkpoint yet")
    if resume == "latest":
        return ckpts[-1]
    try:
        want = int(resume)
    except ValueError:
        raise XLNetError(f"--resume takes 'latest' or a step number, got {resume!r}") from None
    for step, path in ckpts:
        if step == want:
            return step, path
    have = ", ".join(str(s) for s, _ in ckpts)
    raise CheckpointError(f"no checkpoint step {want} in {out_dir} (have: {have})")


# ----------------------------------------------------------------------------------------------------------------
# RNG and training-state helpers


def rng_state() -> dict:
    """Every RNG's state as tensors and plain values only (the train state is loaded with weights_only=True)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _to_cpu(mems: list | None) -> list | None:
    return None if mems is None else [m.detach().to("cpu") for m in mems]


def _to_dev(mems: list | None, device: torch.device) -> list | None:
    return None if mems is None else [m.to(device) for m in mems]


def rotate_checkpoints(out_dir: Path, keep_last: int) -> None:
    ckpts = list_checkpoints(out_dir)
    for _, path in ckpts[: max(0, len(ckpts) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_temp(out_dir: Path) -> None:
    """Temporary folders of a save that was killed half-way."""
    for p in [*out_dir.glob(".step_*"), *out_dir.glob(".train_state.*")]:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def truncate_metrics(out_dir: Path, step: int) -> None:
    """On resume drop the metric rows logged after the checkpoint (they will be logged again, identically)."""
    path = out_dir / "metrics.jsonl"
    if not path.exists():
        return
    rows = [r for r in read_metrics(out_dir) if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


# ----------------------------------------------------------------------------------------------------------------
# Model glue (kept in one place: the model module is written separately)


def build_lm_model(cfg: Config) -> torch.nn.Module:
    from .model import XLNetLMHeadModel

    return XLNetLMHeadModel(cfg.model)


MODEL_INPUTS = ("input_ids", "token_type_ids", "perm_mask", "target_index", "labels", "label_mask")


def _model_inputs(batch: dict, device: torch.device) -> dict:
    """Move a stream micro-batch to ``device``. A compact batch (dense=False) carries the factorisation order as two
    [B, L] rank vectors; the [B, L, L] perm_mask is built on the device (data.perm_mask_from_ranks)."""
    out = {k: batch[k].to(device, non_blocking=True) for k in MODEL_INPUTS if k in batch}
    if "perm_mask" not in out and "perm_q_rank" in batch:
        q = batch["perm_q_rank"].to(device, non_blocking=True)
        k = batch["perm_k_rank"].to(device, non_blocking=True)
        out["perm_mask"] = q[:, :, None] <= k[:, None, :]
    if "target_index" not in out and "target_mapping" in batch:
        out["target_mapping"] = batch["target_mapping"].to(device, non_blocking=True)
    return out


def _forward(model: torch.nn.Module, inputs: dict, mems: list | None) -> Any:
    # The PLM loss reads only the query stream: the last layer's content stream is skipped.
    return model(**inputs, mems=mems, need_hidden=False)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate_plm(model: torch.nn.Module, stream: Any, n_batches: int, precision: str = "fp32",
                 device: torch.device | str | None = None) -> dict:
    """PLM loss, perplexity and target accuracy over the first ``n_batches`` micro-batches of ``stream``.

    Memory is carried across the stream's batches per micro-batch index, as in training. Counts are summed over all
    ranks (each rank reads its own rows). Returns {"loss", "ppl", "acc", "targets", "batches"}.
    """
    net = dist.unwrap(model)
    was_training = net.training
    net.eval()
    if device is None:
        device = next(net.parameters()).device
    device = torch.device(device)
    mems: dict[int, list | None] = {}
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss*targets, correct, targets, batches
    try:
        it = iter(stream)
        for _ in range(n_batches):
            try:
                batch = next(it)
            except StopIteration:
                break
            a = int(batch.get("micro_index", 0))
            inputs = _model_inputs(batch, device)
            labels, label_mask = inputs.pop("labels"), inputs.pop("label_mask")
            with autocast_ctx(device, precision):
                out = _forward(net, inputs, mems.get(a))
            mems[a] = out.mems
            logits = out.logits.float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            w = label_mask.float()
            totals[0] += (nll * w).sum().double()
            totals[1] += ((logits.argmax(-1) == labels).float() * w).sum().double()
            totals[2] += w.sum().double()
            totals[3] += 1
    finally:
        if was_training:
            net.train()
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    dist.all_reduce_sum(totals)
    loss_sum, correct, n, batches = totals.tolist()
    loss = loss_sum / n if n else float("nan")
    return {
        "loss": loss,
        "ppl": math.exp(min(loss, 50.0)) if n else float("nan"),
        "acc": correct / n if n else float("nan"),
        "targets": int(n),
        "batches": int(batches),
    }


# ----------------------------------------------------------------------------------------------------------------
# The training loop


def _nonfinite_grad_name(model: torch.nn.Module) -> str | None:
    for name, p in dist.unwrap(model).named_parameters():
        g = p.grad
        if g is None:
            continue
        if hasattr(g, "to_local"):
            g = g.to_local()
        if not torch.isfinite(g).all():
            return name
    return None


def _oom_message(cfg: Config, accum: int, world: int, device: torch.device, where: str) -> str:
    mb = cfg.train.micro_batch_size
    step = 2 if cfg.model.bi_data else 1
    smaller = max(step, (mb // 2) // step * step)
    tips = []
    if smaller < mb:
        tips.append(f"--set train.micro_batch_size={smaller} (accumulation becomes "
                    f"{cfg.train.global_batch_size // (smaller * world)}, same global batch)")
    if not cfg.train.activation_checkpointing:
        tips.append("--set train.activation_checkpointing=true")
    if cfg.train.precision == "fp32" and device.type == "cuda":
        tips.append("--set train.precision=bf16")
    tips.append(f"or lower data.seq_len / model.mem_len ({cfg.data.seq_len}/{cfg.model.mem_len})")
    return (f"out of memory on {device} during {where} with micro-batch {mb} x seq {cfg.data.seq_len} "
            f"(accumulation {accum}, {world} process(es)); try " + ", ".join(tips))


def _count_params(model: torch.nn.Module) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for n, p in model.named_parameters() if "word_embedding" in n)
    return total, total - emb


def pretrain(cfg: Config, data_dir: str | Path, out_dir: str | Path, resume: str | None = None,
             device: str | None = "auto", quiet: bool = False, stop_after: int | None = None) -> dict:
    """Pretrain (or resume) a run; returns {"step", "loss", "eval", "tokens_per_s", "out"}.

    ``stop_after``: return after this many optimizer steps of this call (tests, benchmarks); the run is not finished.
    """
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    env = dist.init_distributed(device)
    created_group = env.distributed
    try:
        check_output_not_input(out_dir, [data_dir])
        # one writer per run folder (rank 0 holds the lock for all ranks of a torchrun job)
        with output_lock(out_dir) if env.rank == 0 else contextlib.nullcontext():
            return _pretrain(cfg, data_dir, out_dir, resume, env, quiet, stop_after)
    finally:
        if created_group:
            dist.cleanup()


def _pretrain(cfg: Config, data_dir: Path, out_dir: Path, resume: str | None, env: dist.DistEnv, quiet: bool,
              stop_after: int | None) -> dict:
    from .data import PretrainStream

    t = cfg.train
    main = env.is_main
    dev = env.device
    say = (lambda *a, **k: console.print(*a, soft_wrap=True, **k)) if (main and not quiet) else (lambda *a, **k: None)

    # ---- checks before any work ---------------------------------------------------------------------------
    meta = read_records_meta(data_dir)
    check_records(cfg, meta, data_dir)
    accum = batch_maths(cfg, env.world_size)
    if t.precision == "fp16" and dev.type == "cpu":
        raise ConfigError("train.precision=fp16 needs a CUDA device (use bf16 or fp32 on CPU)")
    start = check_run_dir(cfg, out_dir, resume)
    start = dist.broadcast_object(start)
    tokenizer_dir = data_dir / "tokenizer"

    # ---- model, optimizer ----------------------------------------------------------------------------------
    dist.set_deterministic(t.deterministic)
    seed_everything(t.seed)
    model = build_lm_model(cfg).to(dev)
    n_params, n_nonemb = _count_params(model)
    # same init on every rank (above); from here on each rank draws its own dropout masks
    seed_everything(t.seed + 7919 * env.rank)
    state: dict | None = None
    if start is not None:
        from .checkpoint import load_model_dir, load_state

        _, sd, _ = load_model_dir(start[1])
        load_state(model, sd, where=f"checkpoint {start[1]}")
        state = load_train_state(start[1])
        if state.get("world_size") != env.world_size:
            raise CheckpointError(
                f"checkpoint {start[1].name} was written by {state.get('world_size')} process(es); resume with the "
                f"same number (torchrun --nproc-per-node {state.get('world_size')}) for an exact continuation"
            )
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")  # no in-place use
    model = parallelize(model, env, t.activation_checkpointing, t.compile, t.distributed)
    fsdp = env.distributed and dist.is_fsdp(model)
    fused = dev.type == "cuda"
    optimizer = build_optimizer(model, t.lr, t.weight_decay, t.adam_betas, t.adam_eps, fused=fused)
    scaler = torch.amp.GradScaler(dev.type) if t.precision == "fp16" else None

    # ---- data ---------------------------------------------------------------------------------------------
    stream = PretrainStream(data_dir, "train", env.rank, env.world_size, t.micro_batch_size, cfg.data.seed,
                            dense=False, objective=cfg.model.objective)
    mems: list[list | None] = [None] * accum
    step = 0
    tokens_seen = 0
    if state is not None:
        step = state["step"]
        tokens_seen = state.get("tokens_seen", 0)
        if fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(model, optimizer, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        mine = state["ranks"][env.rank]
        stream.load_state_dict(mine["data"])
        for a in range(accum):
            mems[a] = _to_dev(mine["mems"].get(env.rank * accum + a), dev)
        set_rng_state(mine["rng"])

    # ---- run folder ---------------------------------------------------------------------------------------
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temp(out_dir)
        if start is None:
            (out_dir / "metrics.jsonl").unlink(missing_ok=True)
        else:
            truncate_metrics(out_dir, step)
        save_config(cfg, out_dir)
    dist.barrier()
    logger = MetricsLogger(out_dir) if main else NullLogger()

    tokens_per_step = t.global_batch_size * cfg.data.seq_len
    # model FLOPs per token at full memory (flops.py) and the device's peak, for the logged MFU
    L = cfg.data.seq_len
    flops_per_token = train_flops(cfg.model, t.micro_batch_size, L, cfg.model.mem_len, cfg.data.num_predict) / (
        t.micro_batch_size * L)
    peak = device_peak_tflops(dev, t.peak_tflops)
    live = progress_is_live(quiet or not main)
    precision = t.precision + (" + grad scaler" if scaler is not None else "")
    say(f"[bold]xlnet pretrain[/bold] {'resuming at step ' + str(step) if step else 'from scratch'} -> {out_dir}")
    say(f"  model      {n_params / 1e6:.2f}M parameters ({n_nonemb / 1e6:.2f}M without embeddings), "
        f"{cfg.model.n_layer} layers, d_model {cfg.model.d_model}, seq {cfg.data.seq_len} "
        f"(reuse {cfg.model.reuse_len}, mem {cfg.model.mem_len}), {cfg.data.num_predict} targets, "
        f"bi_data {cfg.model.bi_data}")
    say(f"  batch      global {t.global_batch_size} = micro {t.micro_batch_size} x accumulation {accum} x "
        f"{env.world_size} process(es); {tokens_per_step:,} tokens per step, {t.max_steps:,} steps")
    threads = f", {torch.get_num_threads()} threads" if dev.type == "cpu" else ""
    say(f"  device     {dev}{threads} ({env.backend or 'single process'}"
        f"{', ' + t.distributed if env.distributed else ''}), precision {precision}, fused AdamW {fused}, "
        f"compile {t.compile}, activation checkpointing {t.activation_checkpointing}, "
        f"deterministic {t.deterministic}")
    spp = meta.get("splits", {}).get("train", {}).get("steps_per_pass")
    if spp:
        passes = meta.get("passes", 1)
        say(f"  data       {data_dir}: {spp:,} steps per pass x {passes} pass(es)"
            + (f"; passes repeat (new factorisation orders) after step {spp * passes:,}"
               if spp * passes < t.max_steps else ""))
    say(f"  optimizer  AdamW lr {t.lr:g}, warmup {t.warmup_steps}, {t.schedule} decay to x{t.min_lr_ratio:g}, "
        f"wd {t.weight_decay:g}, clip {t.clip_norm:g}; eval every {t.eval_every}, save every {t.save_every}")

    last_good = start[1] if start is not None else None
    params = [p for p in model.parameters() if p.requires_grad]
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)

    def run_eval(at: int) -> dict | None:
        if "valid" not in meta.get("splits", {"valid": None}):
            return None
        vstream = PretrainStream(data_dir, "valid", env.rank, env.world_size, t.micro_batch_size, cfg.data.seed,
                                 dense=False, loop=False, objective=cfg.model.objective)
        try:
            res = evaluate_plm(model, vstream, t.eval_batches * accum, t.precision, dev)
        except torch.OutOfMemoryError:
            raise XLNetError(_oom_message(cfg, accum, env.world_size, dev, "evaluation")) from None
        if res["targets"] == 0:
            return None
        logger.log(at, "eval", loss=res["loss"], ppl=res["ppl"], acc=res["acc"], targets=res["targets"])
        return res

    def save(at: int) -> Path:
        nonlocal last_good
        per_rank = {
            "data": stream.state_dict(),
            "rng": rng_state(),
            "mems": {env.rank * accum + a: _to_cpu(mems[a]) for a in range(accum)},
        }
        ranks = dist.all_gather_object(per_rank)
        if fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
                get_optimizer_state_dict,
            )

            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model_sd = get_model_state_dict(model, options=opts)
            opt_sd = get_optimizer_state_dict(model, optimizer, options=opts)
        else:
            model_sd = None
            opt_sd = optimizer.state_dict()
        path = out_dir / step_dir_name(at)
        if main:
            train_state = {
                "format_version": 1, "step": at, "tokens_seen": tokens_seen, "world_size": env.world_size,
                "accumulation": accum, "optimizer": opt_sd,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "ranks": [{"data": r["data"], "rng": r["rng"], "mems": {}} for r in ranks],
            }
            for i, r in enumerate(ranks):
                train_state["ranks"][i]["mems"] = r["mems"]
            _write_checkpoint(path, dist.unwrap(model), model_sd, cfg, tokenizer_dir, at, train_state)
            rotate_checkpoints(out_dir, t.keep_last)
        dist.barrier()
        last_good = path
        return path

    progress = step_progress(quiet=quiet or not main)
    it = iter(stream)
    result: dict[str, Any] = {"out": str(out_dir), "eval": None}
    last_loss = float("nan")
    t0 = time.perf_counter()
    t_log = t0
    steps_since_log = 0
    steps_this_call = 0
    t_excluded = 0.0
    first_step = step
    model.train()
    if step == 0 and t.eval_every:
        # Baseline: held-out PLM loss of the initial weights (logged as step 0).
        res = run_eval(0)
        if res is not None:
            result["eval_start"] = res
            say(f"  step 0: eval loss {res['loss']:.4f} ppl {res['ppl']:.2f} acc {res['acc']:.3f} (initial weights)")
        model.train()
    with progress:
        task = progress.add_task("pretrain", total=t.max_steps, completed=step, info="")
        while step < t.max_steps:
            if stop_after is not None and steps_this_call >= stop_after:
                break
            factor = lr_factor(step, t.warmup_steps, t.max_steps, t.schedule, t.min_lr_ratio)
            lr = set_lr(optimizer, t.lr, factor)
            losses = []
            try:
                for a in range(accum):
                    try:
                        batch = next(it)
                    except StopIteration:
                        raise DataError(
                            f"records in {data_dir} ran out at step {step} of {t.max_steps}; preprocess with more "
                            "data.passes or lower train.max_steps"
                        ) from None
                    inputs = _model_inputs(batch, dev)
                    sync = contextlib.nullcontext() if (not ddp or a == accum - 1) else model.no_sync()
                    with sync:
                        with autocast_ctx(dev, t.precision):
                            out = _forward(model, inputs, mems[a])
                        loss = out.loss
                        scaled = loss / accum
                        (scaler.scale(scaled) if scaler is not None else scaled).backward()
                    mems[a] = [m.detach() for m in out.mems] if out.mems is not None else None
                    losses.append(loss.detach().float())
                if scaler is not None:
                    scaler.unscale_(optimizer)
                if t.clip_norm > 0:
                    gnorm = torch.nn.utils.clip_grad_norm_(params, t.clip_norm, foreach=True)
                else:
                    gnorm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
                if hasattr(gnorm, "full_tensor"):
                    gnorm = gnorm.full_tensor()
                step_losses = torch.stack(losses)
                mean_loss = dist.all_reduce_mean(step_losses.mean().clone())
                loss_v, gnorm_v = float(mean_loss), float(gnorm)
                if not math.isfinite(loss_v) or (not math.isfinite(gnorm_v) and scaler is None):
                    _raise_nonfinite(step + 1, loss_v, gnorm_v, step_losses, model, last_good, env, cfg)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            except torch.OutOfMemoryError:
                raise XLNetError(_oom_message(cfg, accum, env.world_size, dev, f"training step {step + 1}")) from None
            step += 1
            steps_this_call += 1
            steps_since_log += 1
            tokens_seen += tokens_per_step
            last_loss = loss_v
            now = time.perf_counter()
            if step % t.log_every == 0 or step == t.max_steps:
                tps = tokens_per_step * steps_since_log / max(now - t_log, 1e-9)
                mfu = tps * flops_per_token / (env.world_size * peak * 1e12) if peak else None
                mem = dist.peak_memory_gib(dev)
                logger.log(step, "train", loss=loss_v, lr=lr, grad_norm=gnorm_v, tokens_per_s=round(tps, 1),
                           tokens=tokens_seen, peak_mem_gib=round(mem, 3),
                           **({"mfu": round(mfu, 4)} if mfu is not None else {}))
                if not live:  # a log file: one plain line per interval (the terminal has the progress bar)
                    eta = (t.max_steps - step) * (now - t0 - t_excluded) / max(steps_this_call, 1)
                    say(f"step {step}/{t.max_steps} loss {loss_v:.4f} lr {lr:.2e} grad_norm {gnorm_v:.3f} "
                        f"{tps:,.0f} tokens/s" + (f" MFU {100 * mfu:.1f}%" if mfu is not None else "")
                        + f" peak {mem:.2f} GiB ETA {duration(eta)}")
                progress.update(task, completed=step,
                                info=f"loss {loss_v:.4f} lr {lr:.2e} {tps:,.0f} tok/s")
                t_log, steps_since_log = now, 0
            else:
                progress.update(task, completed=step)
            t_pause = time.perf_counter()
            if t.eval_every and (step % t.eval_every == 0 or step == t.max_steps):
                res = run_eval(step)
                if res is not None:
                    result["eval"] = res
                    say(f"  step {step}: eval loss {res['loss']:.4f} ppl {res['ppl']:.2f} acc {res['acc']:.3f}")
            if (t.save_every and step % t.save_every == 0) or step == t.max_steps:
                save(step)
            paused = time.perf_counter() - t_pause
            t_log += paused  # throughput counts data + step time only, not evaluation or checkpoint writing
            t_excluded += paused
    elapsed = time.perf_counter() - t0 - t_excluded
    logger.close()
    done = step - first_step
    result.update(step=step, loss=last_loss, elapsed_s=elapsed,
                  tokens_per_s=tokens_per_step * done / elapsed if elapsed > 0 and done else 0.0)
    if main and step >= t.max_steps:
        from .plot import maybe_plot

        result["plot"] = str(maybe_plot(out_dir) or "")
    if main and not quiet and step >= t.max_steps:
        say(f"done: {step} steps, last loss {last_loss:.4f}, {result['tokens_per_s']:,.0f} tokens/s; "
            f"checkpoints in {out_dir}")
    return result


def _raise_nonfinite(step: int, loss_v: float, gnorm_v: float, step_losses: torch.Tensor, model: torch.nn.Module,
                     last_good: Path | None, env: dist.DistEnv, cfg: Config) -> None:
    if not math.isfinite(loss_v):
        bad = [i for i, v in enumerate(step_losses.tolist()) if not math.isfinite(v)]
        if bad:
            what = f"PLM loss is {step_losses[bad[0]].item()} on micro-batch {bad[0]} of rank {env.rank}"
        else:
            what = f"PLM loss is {loss_v} on another rank"
    else:
        name = _nonfinite_grad_name(model)
        what = f"gradient norm is {gnorm_v} (first non-finite gradient: {name or 'on another rank'}; loss {loss_v:.4f})"
    good = (f"last good checkpoint {last_good} (resume with --resume {int(last_good.name.split('_')[1])})"
            if last_good is not None else "no checkpoint saved yet")
    raise XLNetError(
        f"training diverged at step {step}: {what}; the update was not applied; {good}; "
        f"try a lower train.lr (now {cfg.train.lr:g}), more train.warmup_steps or train.precision=fp32"
    )


def _write_checkpoint(path: Path, model: torch.nn.Module, model_sd: dict | None, cfg: Config, tokenizer_dir: Path,
                      step: int, train_state: dict) -> None:
    """A complete step folder, atomically: temporary folder, fsync, rename (checkpoint.save_model_dir)."""
    from .checkpoint import save_model_dir

    class _Full(torch.nn.Module):  # a gathered FSDP state dict seen as a module by save_model_dir
        def state_dict(self, *args: Any, **kwargs: Any) -> dict:
            return model_sd

    save_model_dir(path, model if model_sd is None else _Full(), cfg,
                   tokenizer_dir=tokenizer_dir if (tokenizer_dir / "spiece.model").is_file() else None,
                   meta={"kind": "pretrain", "step": step, "tokens_seen": train_state["tokens_seen"]},
                   extra_files={TRAIN_STATE: lambda p: save_tree(train_state, p)})
