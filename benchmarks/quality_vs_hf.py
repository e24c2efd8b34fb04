"""Time-to-quality on this CPU: `xlnet pretrain` against transformers' recipe (what run_plm does), same corpus,
tokenizer, architecture and wall-clock budget, both judged by the same probe and the same finetuning.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality_vs_hf.py --budget-s 600 --finetune-epochs 3 \
        --set model.n_layer=2                                                          # what BENCHMARKS.md shows
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality_vs_hf.py --quick           # smoke run (a 40 s budget)

Both sides (the tiny preset: 4 layers, d_model 128, 4 heads x 32, d_inner 512, dropout 0.1, vocab 8000; `--set`
overrides model.* and train.* keys on both sides, e.g. the demo's depth 2; finetuning uses the demo's mean summary
unless `--finetune-set` says otherwise):
- the tokenizer is ours, trained on --corpus (`xlnet tokenize train --config tiny`); transformers loads the same folder
  with AutoTokenizer (its tokenizer.json gives our ids);
- ours: `xlnet tokenize/shard/preprocess/pretrain --config tiny` (seq 128, reuse 64, memory 96, bi_data, 21 targets,
  batch 16 = 2 x 8); data preparation is done before the clock starts;
- transformers: XLNetLMHeadModel (the same config through our `to_hf_config`: no memory, no bi_data, as run_plm's
  Trainer runs it), the corpus tokenised as run_plm does without --line_by_line (every non-empty line encoded with
  its <sep> <cls>, concatenated, cut into 128-token blocks; done before the clock starts),
  DataCollatorForPermutationLanguageModeling with its defaults (plm_probability 1/6, max_span_length 5), shuffled
  batches of 16, AdamW with Trainer's parameter groups (no decay on biases and LayerNorm) and
  get_linear_schedule_with_warmup; the loop is written out here in plain torch, as Trainer runs it (one process,
  dataloader in the main thread, clip_grad_norm 1.0).
- the same optimizer settings on both sides, ours (configs/tiny.yaml): lr 1e-3, 10% linear warmup then linear decay
  to 0, weight decay 0.01, eps 1e-6 (Trainer's own defaults would be no warmup, no weight decay, eps 1e-8).

The time axis: the two trainings run AT THE SAME TIME, one process each with OMP_NUM_THREADS=1, so load from other jobs
on the shared machine hits both alike. The step counts come from a calibration run the same way (both at once, 20
steps each): steps = budget / median step time (intervals while both were running). Every checkpoint's time is the
measured wall time from the process start (imports and model building included, data preparation not) to the end of
that step; the CPU seconds of each training process (os.wait4) are reported next to it.

Checkpoints at 1/4, 1/2 and all of each side's steps. The transformers ones are saved with save_pretrained and turned
into our checkpoints by `xlnet import --from-hf`; every checkpoint then gets the same `xlnet probe` (linear probe on
frozen mean-pooled and <cls> features) and `xlnet finetune --config tiny --init` (--finetune-epochs, best validation
epoch), on --train/--valid (finetuning at 1/2 and all of the budget). Once per seed, `xlnet probe --baseline random`
and `xlnet finetune --from-scratch` give the random-init reference. Results: a table on stdout and JSON (--output).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

from runner import ROOT, XLNET, add_override_args, overrides, say, sets_args, xlnet

from xlnetcli.config import load_config

TINY = load_config("tiny")  # sequence length of both sides' blocks; the probe's task length (an imported
# transformers checkpoint has no finetune settings of ours, so every probe is given the preset's)

FRACTIONS = (0.25, 0.5, 1.0)
CAL_STEPS = 20
FINETUNE_FRACTIONS = (0.5, 1.0)  # finetuning is the expensive part: at half and all of the budget


# ---- transformers' side (run in a child process) ----------------------------------------------------------------


def hf_blocks(tok_dir: Path, corpus: Path, out: Path) -> int:
    """run_plm's grouping: every non-empty line tokenised with special tokens, concatenated, cut into blocks."""
    import torch
    from transformers import AutoTokenizer

    seq_len = TINY.data.seq_len
    tok = AutoTokenizer.from_pretrained(tok_dir)
    lines = [s for s in corpus.read_text(encoding="utf-8").splitlines() if s.strip()]
    ids = [i for enc in tok(lines)["input_ids"] for i in enc]
    n = len(ids) // seq_len
    torch.save(torch.tensor(ids[: n * seq_len]).view(n, seq_len), out)
    return n


def hf_train(spec: dict) -> None:
    """XLNetLMHeadModel + DataCollatorForPermutationLanguageModeling + AdamW + linear schedule, as Trainer runs
    run_plm; one JSON line per step (its end time), save_pretrained + tokenizer files at spec["save"] steps."""
    import torch
    from transformers import (
        AutoTokenizer,
        DataCollatorForPermutationLanguageModeling,
        XLNetConfig,
        XLNetLMHeadModel,
        get_linear_schedule_with_warmup,
    )

    from xlnetcli.model.state_dict_adapter import to_hf_config

    torch.manual_seed(spec["seed"])
    cfg = load_config("tiny", spec["sets"])  # both sides' configuration: the preset and this run's --set
    BATCH, t = cfg.train.global_batch_size, cfg.train
    tok = AutoTokenizer.from_pretrained(spec["tokenizer"])
    blocks = torch.load(spec["blocks"])
    model = XLNetLMHeadModel(XLNetConfig(**to_hf_config(cfg.model))).train()
    no_decay = [n for n, p in model.named_parameters() if n.endswith("bias") or "layer_norm" in n]
    groups = [
        {"params": [p for n, p in model.named_parameters() if n not in no_decay], "weight_decay": t.weight_decay},
        {"params": [p for n, p in model.named_parameters() if n in no_decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=t.lr, eps=t.adam_eps)
    steps = spec["steps"]
    sched = get_linear_schedule_with_warmup(opt, steps // 10, steps)
    collator = DataCollatorForPermutationLanguageModeling(tokenizer=tok)  # plm_probability 1/6, max_span_length 5
    gen = torch.Generator().manual_seed(spec["seed"])
    order: list[int] = []
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "steps.jsonl", "w") as f:
        for step in range(1, steps + 1):
            if len(order) < BATCH:  # a new epoch (RandomSampler), drop_last
                order = torch.randperm(len(blocks), generator=gen).tolist()
            idx, order = order[:BATCH], order[BATCH:]
            batch = collator([blocks[i] for i in idx])
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            f.write(json.dumps({"step": step, "time": time.time(), "loss": loss.item()}) + "\n")
            f.flush()
            if step in spec["save"]:
                d = out / f"hf_{step:07d}"
                model.save_pretrained(d)
                for name in ("spiece.model", "tokenizer.json", "tokenizer_config.json", "xlnet_tokenizer.json"):
                    shutil.copy(Path(spec["tokenizer"]) / name, d / name)


# ---- the runs ------------------------------------------------------------------------------------------------


def prepare(work: Path, corpus: Path) -> None:
    if (work / "records" / "meta.json").is_file() and (work / "hf_blocks.pt").is_file():
        return
    xlnet("tokenize", "train", str(corpus), "--out", str(work / "tok"), "--config", "tiny", "--quiet")
    xlnet(
        "shard",
        str(corpus),
        "--tokenizer",
        str(work / "tok"),
        "--out",
        str(work / "shards"),
        "--config",
        "tiny",
        "--shards",
        "2",
        "--workers",
        "1",
    )
    xlnet("preprocess", "--shards", str(work / "shards"), "--out", str(work / "records"), "--config", "tiny")
    n = hf_blocks(work / "tok", corpus, work / "hf_blocks.pt")
    say(f"transformers' data: {n} blocks of {TINY.data.seq_len} tokens")


def ours_cmd(work: Path, out: Path, steps: int, seed: int, save_every: int | str, sets: list[str]) -> list[str]:
    run_sets = {
        "train.max_steps": steps,
        "train.warmup_steps": steps // 10,
        "train.save_every": save_every,
        "train.keep_last": 8,
        "train.eval_every": "never",
        "train.log_every": 1,
        "train.seed": seed,
    }
    return [
        XLNET,
        "pretrain",
        "--config",
        "tiny",
        "--data",
        str(work / "records"),
        "--out",
        str(out),
        "--quiet",
        *sets_args(sets),
        *sets_args(f"{k}={v}" for k, v in run_sets.items()),
    ]


def run_both(
    work: Path, name: str, steps: dict[str, int], seed: int, save: dict[str, list[int]], sets: list[str]
) -> dict:
    """Start ours and transformers' training together; wait for both. Returns per side: start time, step end times,
    CPU seconds."""
    out = work / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    spec = {
        "tokenizer": str(work / "tok"),
        "blocks": str(work / "hf_blocks.pt"),
        "out": str(out / "hf"),
        "steps": steps["hf"],
        "seed": seed,
        "save": save["hf"],
        "sets": sets,
    }
    save_every = save["ours"][0] if save["ours"] else "end"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmds = {
        "ours": ours_cmd(work, out / "ours", steps["ours"], seed, save_every, sets),
        "hf": [sys.executable, __file__, "--hf-train", json.dumps(spec)],
    }
    start, procs, cpu = {}, {}, {}
    for side, cmd in cmds.items():
        start[side] = time.time()
        with open(out / f"{side}.err", "w") as err:  # the child writes to its own copy of the descriptor
            procs[side] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    say(f"{name}: training ours ({steps['ours']} steps) and transformers ({steps['hf']} steps) at the same time")
    left = {p.pid: side for side, p in procs.items()}
    while left:
        pid, status, usage = os.wait4(-1, 0)
        if pid not in left:
            continue
        side = left.pop(pid)
        cpu[side] = usage.ru_utime + usage.ru_stime
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit(f"quality_vs_hf: {side} training failed: {(out / f'{side}.err').read_text()[-800:]}")
    rows = {
        "ours": [
            r
            for r in map(json.loads, (out / "ours" / "metrics.jsonl").read_text().splitlines())
            if r.get("split") == "train"
        ],
        "hf": [json.loads(s) for s in (out / "hf" / "steps.jsonl").read_text().splitlines()],
    }
    return {
        side: {
            "start": start[side],
            "times": {r["step"]: r["time"] for r in rows[side]},
            "loss": {r["step"]: r["loss"] for r in rows[side]},
            "cpu_s": cpu[side],
        }
        for side in cmds
    }


def calibrate(work: Path, sets: list[str]) -> dict[str, float]:
    """Median step time of each side while both were running (both started together, CAL_STEPS each)."""
    res = run_both(work, "calibration", {"ours": CAL_STEPS, "hf": CAL_STEPS}, 0, {"ours": [], "hf": []}, sets)
    lo = max(min(r["times"].values()) for r in res.values())
    hi = min(max(r["times"].values()) for r in res.values())
    out = {}
    for side, r in res.items():
        t = [r["times"][s] for s in sorted(r["times"])][3:]  # the first steps warm up
        gaps = [b - a for a, b in pairwise(t) if a >= lo and b <= hi]
        if len(gaps) < 3:
            gaps = [b - a for a, b in pairwise(t)]
        out[side] = statistics.median(gaps)
        say(f"calibration: {side} {out[side]:.3f} s/step (median of {len(gaps)} steps while both ran)")
    return out


def checkpoints(work: Path, run: str, res: dict, save: dict[str, list[int]]) -> list[dict]:
    """Each saved checkpoint as our checkpoint folder (transformers' ones imported) with its elapsed wall time."""
    out = []
    for side in ("ours", "hf"):
        r = res[side]
        for frac, step in zip(FRACTIONS, save[side], strict=True):
            if side == "ours":
                ck = work / run / "ours" / f"step_{step:07d}"
            else:
                ck = work / run / "hf" / f"ck_{step:07d}"
                xlnet("import", "--from-hf", str(work / run / "hf" / f"hf_{step:07d}"), "--out", str(ck))
            out.append(
                {
                    "side": side,
                    "step": step,
                    "fraction": frac,
                    "ckpt": str(ck),
                    "wall_s": r["times"][step] - r["start"],
                    "loss": r["loss"][step],
                }
            )
    return out


def evaluate(jobs: list[list[str]], parallel: int = 2) -> None:
    """Run xlnet evaluation commands, ``parallel`` at a time (one thread each)."""
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(lambda args: xlnet(*args, threads=1, echo=True), jobs))


def probe_args(ck: str, train: str, valid: str, out: Path, baseline: bool = False) -> list[str]:
    return [
        "probe",
        ck,
        "--train",
        train,
        "--valid",
        valid,
        "--max-seq-length",
        str(TINY.finetune.max_seq_length),
        "--output",
        str(out),
        *(["--baseline", "random"] if baseline else []),
    ]


def finetune_args(ck: str, train: str, valid: str, out: Path, sets: list[str], scratch: bool = False) -> list[str]:
    return [
        "finetune",
        "--task",
        "classification",
        "--train",
        train,
        "--valid",
        valid,
        "--config",
        "tiny",
        "--init",
        ck,
        "--out",
        str(out),
        *(["--from-scratch"] if scratch else []),
        *sets_args(sets),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=900.0, help="training wall-clock budget per side (seconds)")
    ap.add_argument("--seeds", type=int, default=1, help="pretraining seeds (each: both sides, all checkpoints)")
    ap.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seeds run are FIRST .. FIRST+SEEDS-1 (train.seed 1234 + seed on both sides)",
    )
    ap.add_argument("--corpus", default="data/pydocs/corpus.txt")
    ap.add_argument("--train", default="data/pydocs/order_train.tsv", help="labelled file for probe and finetuning")
    ap.add_argument("--valid", default="data/pydocs/order_valid.tsv")
    ap.add_argument("--work", default="runs/quality_vs_hf", help="working folder (replaced runs, kept data)")
    ap.add_argument("--output", default=None, help="JSON results (default: WORK/results.json)")
    ap.add_argument("--finetune-epochs", type=float, default=1.0, help="finetune.epochs for every finetuning")
    add_override_args(ap, "both sides' pretraining")
    ap.add_argument("--quick", action="store_true", help="smoke run: 40 s budget")
    ap.add_argument("--hf-train", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hf_train:
        return hf_train(json.loads(a.hf_train))
    budget = 40.0 if a.quick else a.budget_s
    sets, ft = overrides(a)
    ft_sets = [f"finetune.epochs={a.finetune_epochs:g}", *ft]
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    train, valid = str(Path(a.train).resolve()), str(Path(a.valid).resolve())
    t_all = time.time()
    say(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    prepare(work, Path(a.corpus).resolve())
    step_s = calibrate(work, list(sets))
    steps = {side: max(8, round(budget / t / 4) * 4) for side, t in step_s.items()}
    save = {side: [round(n * f) for f in FRACTIONS] for side, n in steps.items()}
    say(f"budget {budget:.0f} s: ours {steps['ours']} steps, transformers {steps['hf']} steps")

    rows, baselines, runs = [], [], []
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        name = f"seed{seed}"
        res = run_both(work, name, steps, 1234 + seed, save, list(sets))
        runs.append(
            {
                "seed": seed,
                **{
                    side: {"cpu_s": r["cpu_s"], "wall_s": max(r["times"].values()) - r["start"]}
                    for side, r in res.items()
                },
            }
        )
        cks = checkpoints(work, name, res, save)
        ev = work / name / "eval"
        ev.mkdir()
        jobs = []
        for c in cks:
            tag = f"{c['side']}_{c['step']}"
            c["probe_json"], c["finetune_dir"] = ev / f"probe_{tag}.json", ev / f"ft_{tag}"
            jobs.append(probe_args(c["ckpt"], train, valid, c["probe_json"]))
            if c["fraction"] in FINETUNE_FRACTIONS:
                jobs.append(finetune_args(c["ckpt"], train, valid, c["finetune_dir"], ft_sets))
        final = next(c["ckpt"] for c in cks if c["side"] == "ours" and c["fraction"] == 1.0)
        jobs.append(probe_args(final, train, valid, ev / "probe_random.json", baseline=True))
        jobs.append(finetune_args(final, train, valid, ev / "ft_scratch", ft_sets, True))
        evaluate(jobs)
        for c in cks:
            p = json.loads(Path(c["probe_json"]).read_text())["results"]["pretrained"]
            ft_file = Path(c["finetune_dir"]) / "results.json"
            ft = json.loads(ft_file.read_text()) if ft_file.is_file() else {"value": None}
            rows.append(
                {
                    "seed": seed,
                    "side": c["side"],
                    "step": c["step"],
                    "fraction": c["fraction"],
                    "wall_s": round(c["wall_s"], 1),
                    "train_loss": round(c["loss"], 3),
                    "probe_mean": p["mean"]["accuracy"],
                    "probe_cls": p["cls"]["accuracy"],
                    "finetune": ft["value"],
                }
            )
        pr = json.loads((ev / "probe_random.json").read_text())["results"]["random"]
        fs = json.loads((ev / "ft_scratch" / "results.json").read_text())
        baselines.append(
            {
                "seed": seed,
                "probe_mean": pr["mean"]["accuracy"],
                "probe_cls": pr["cls"]["accuracy"],
                "finetune": fs["value"],
            }
        )

    summary = goals(rows, baselines)
    result = {
        "budget_s": budget,
        "calibration_s_per_step": step_s,
        "steps": steps,
        "seeds": list(range(a.first_seed, a.first_seed + a.seeds)),
        "sets": list(sets),
        "finetune_sets": ft_sets,
        "corpus": a.corpus,
        "train": a.train,
        "valid": a.valid,
        "rows": rows,
        "random_init": baselines,
        "runs": runs,
        "goals": summary,
        "minutes": round((time.time() - t_all) / 60, 1),
        "load_average_end": os.getloadavg(),
    }
    out = Path(a.output) if a.output else work / "results.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"\nresults: {out}")


def goals(rows: list[dict], random_init: list[dict]) -> dict:
    """Per measure, medians over seeds: (1) the earliest time ours reaches transformers' final quality, as a fraction
    of transformers' time (undefined while that quality is not above random init: reaching chance says nothing);
    (2) ours minus transformers at the end of the budget, in points."""
    out = {}
    for m in ("probe_mean", "probe_cls", "finetune"):
        rand = statistics.median(b[m] for b in random_init)
        med = {}
        for side in ("ours", "hf"):
            for f in FRACTIONS:
                sel = [r for r in rows if r["side"] == side and r["fraction"] == f]
                q = [r[m] for r in sel if r[m] is not None]
                med[side, f] = (statistics.median(q) if q else None, statistics.median(r["wall_s"] for r in sel))
        hf_q, hf_t = med["hf", 1.0]
        reach = next(
            (
                med["ours", f][1] / hf_t
                for f in FRACTIONS
                if med["ours", f][0] is not None and med["ours", f][0] >= hf_q
            ),
            None,
        )
        if hf_q <= rand:
            reach = None
        out[m] = {
            "hf_final": hf_q,
            "ours_final": med["ours", 1.0][0],
            "random_init": rand,
            "hf_final_above_random_init": hf_q > rand,
            "gain_at_equal_time_pts": round(100 * (med["ours", 1.0][0] - hf_q), 1),
            "ours_time_to_hf_final_quality": None if reach is None else round(reach, 2),
        }
    return out


def print_table(r: dict) -> None:
    print(
        f"\nbudget {r['budget_s']:.0f} s per side; calibration s/step: ours {r['calibration_s_per_step']['ours']:.3f},"
        f" transformers {r['calibration_s_per_step']['hf']:.3f}; steps: ours {r['steps']['ours']}, "
        f"transformers {r['steps']['hf']}"
    )
    print("| seed | recipe | step | wall s | train loss | probe mean | probe cls | finetuned |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for x in r["rows"]:
        print(
            f"| {x['seed']} | {'ours' if x['side'] == 'ours' else 'transformers'} | {x['step']} | {x['wall_s']:.0f} "
            f"| {x['train_loss']:.2f} | {x['probe_mean']:.3f} | {x['probe_cls']:.3f} | "
            + ("" if x["finetune"] is None else f"{x['finetune']:.3f}")
            + " |"
        )
    for b in r["random_init"]:
        print(
            f"| {b['seed']} | random init | 0 | | | {b['probe_mean']:.3f} | {b['probe_cls']:.3f} | "
            f"{b['finetune']:.3f} |"
        )
    for run in r["runs"]:
        print(
            f"seed {run['seed']}: ours {run['ours']['wall_s']:.0f} s wall / {run['ours']['cpu_s']:.0f} CPU s, "
            f"transformers {run['hf']['wall_s']:.0f} s wall / {run['hf']['cpu_s']:.0f} CPU s"
        )
    for m, g in r["goals"].items():
        reach = g["ours_time_to_hf_final_quality"]
        print(
            f"{m}: transformers final {g['hf_final']:.3f}, ours final {g['ours_final']:.3f} "
            f"({g['gain_at_equal_time_pts']:+.1f} pts at equal time), random init {g['random_init']:.3f}; "
            + (
                "transformers' final quality is not above random init: no time-to-quality"
                if not g["hf_final_above_random_init"]
                else "ours reaches transformers' final quality at "
                + ("no checkpoint" if reach is None else f"{reach:.2f}x its time")
            )
        )


if __name__ == "__main__":
    main()
