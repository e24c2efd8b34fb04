"""The XLNet paper's ablation study (Table 6) in miniature: one engine, the tiny config, equal CPU time per row.

    python benchmarks/ablation.py [--quick] [--budget SECONDS | --steps N] [--seeds 1,2] [--jobs 2]
                                  [--set KEY=VALUE ...] [--finetune-set KEY=VALUE ...] [--finetune-epochs E]
                                  [--corpus FILE] [--train FILE] [--valid FILE] [--work DIR] [--calibration FILE]
    OMP_NUM_THREADS=1 python benchmarks/ablation.py --set model.n_layer=2 --budget 300 --finetune-epochs 3 \
        --work runs/ablation-d2                                              # BENCHMARKS.md's table (the demo's recipe)

`--set` applies to every row's pretraining (model.* / train.* keys that leave the records alone: the demo's depth 2);
finetuning reads the mean of the last layer (the demo's `finetune.summary_type=mean`) unless `--finetune-set` says
otherwise.

Rows, each one change against the full model (ROWS below): XLNet (permutation LM), "DAE + Transformer-XL" (MLM:
<mask> at the same span targets, content stream), Transformer-XL's left-to-right LM (CLM), - memory
(model.mem_len=0), - span-based prediction (data.max_gram=1: single-word targets), - bidirectional data
(model.bi_data=false). The paper's "+ next-sent pred" row has no switch here (XLNet drops that loss) and is left out.

Pipeline: tokenize and shard the corpus once; preprocess once per distinct record setting (span length, bi_data);
then per row and seed: pretrain, held-out loss (`xlnet eval` on the forward-only records, so every row is scored on
the same text and targets), `xlnet probe` (linear probe on frozen mean and <cls> features; the full model's run
adds the same architecture from random init), `xlnet finetune --init RUN` (valid accuracy after the last epoch: no
checkpoint selection on the validation file); per seed, `--from-scratch` finetuning gives the no-pretraining row.

Equal time on a shared, noisy machine: the wall time of a long run measures the neighbours as much as the row, so
rows get equal CPU time through step counts. Each row's CPU seconds per step are measured against the full model's
in a short calibration made in pairs (the row and the full model at the same time, so both see the same contention;
CPU time of a single-threaded process leaves out the time it waits for a core); the full model gets
N = budget / its CPU seconds per step, and a row with ratio r gets round(N / r) steps. The calibration is written to
WORK/calibration.json; passing it back with --calibration (and --steps N) gives the same step counts, so a table
is reproducible step for step. Seeds set train.seed (init, dropout, factorisation orders) and finetune.seed; the
records (data.seed) are shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runner import ROOT, add_override_args, overrides, say, sets_args, xlnet

CONFIG = "tiny"


@dataclass(frozen=True)
class Row:
    key: str  # folder name
    label: str  # the paper's row name
    sets: tuple[str, ...] = ()  # --set overrides against the tiny preset


ROWS = (
    Row("xlnet", "XLNet (PLM), full"),
    Row("dae", "DAE + Transformer-XL (MLM)", ("model.objective=mlm",)),
    Row("clm", "Transformer-XL LM (CLM, left to right)", ("model.objective=clm",)),
    Row("no-memory", "- memory", ("model.mem_len=0",)),
    Row("no-span", "- span-based prediction", ("data.max_gram=1",)),
    Row("no-bidata", "- bidirectional data", ("model.bi_data=false",)),
)
FULL = ROWS[0]
EVAL_SETS = ("model.bi_data=false",)  # held-out loss on forward-only records: a row trained without bi_data never
# saw reversed text, and every row reads the same held-out targets (the full model's span masking)


def record_sets(sets: tuple[str, ...]) -> tuple[str, ...]:
    """The overrides that change preprocessed records (the keys pretrain checks against them)."""
    from xlnetcli.train.pretrain import RECORD_KEYS

    keys = set(RECORD_KEYS.values())
    return tuple(s for s in sets if s.split("=", 1)[0] in keys)


def records_name(sets: tuple[str, ...]) -> str:
    return "rec" + "".join("_" + s.split(".", 1)[1].replace("=", "-") for s in sorted(sets))


def train_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("split") == "train"]


# ---------------------------------------------------------------------------------------------------------------


def calibrate(work: Path, records: dict[Row, Path], cal_steps: int, sets: tuple[str, ...]) -> dict:
    """Per row, CPU seconds per step against the full model's, from short runs made in pairs (the row and the full
    model at the same time, so both see the same cache and core contention). CPU time, not wall time: a
    single-threaded process's CPU time leaves out the time it waits for a core on a shared machine. Per step =
    (CPU of the run - CPU of a one-step run of the full model) / (steps - 1): the fixed start-up cost (imports,
    model, records, the final checkpoint) is the same for every row."""
    common = [
        "--set",
        "train.warmup_steps=0",
        "--set",
        "train.eval_every=never",
        "--set",
        "train.save_every=end",
        "--set",
        "train.log_every=2",
        "--set",
        "train.report_to=none",
        "--quiet",
    ]

    def run(row: Row, tag: str, steps: int) -> float:
        out = work / "calibration" / f"{row.key}-{tag}"
        shutil.rmtree(out, ignore_errors=True)
        return xlnet(
            "pretrain",
            "--config",
            CONFIG,
            "--data",
            str(records[row]),
            "--out",
            str(out),
            *common,
            "--set",
            f"train.max_steps={steps}",
            *sets_args(sets + row.sets),
        )[1]

    cpu, ratio, full_cpu, loads = {}, {FULL.key: 1.0}, [], []
    with ThreadPoolExecutor(max_workers=2) as pool:
        pairs = [(FULL, "startup", 1, FULL, "1-step", 1)] + [
            (FULL, f"with-{r.key}", cal_steps, r, "paired", cal_steps) for r in ROWS[1:]
        ]
        startup = []
        for a_row, a_tag, a_n, b_row, b_tag, b_n in pairs:
            loads.append(os.getloadavg()[0])
            a, b = pool.submit(run, a_row, a_tag, a_n), pool.submit(run, b_row, b_tag, b_n)
            ca, cb = a.result(), b.result()
            if b_tag == "1-step":  # two one-step runs: the start-up cost
                startup = [ca, cb]
                say(f"calibration: start-up + one step {ca:.1f} / {cb:.1f} CPU s")
                continue
            base = statistics.mean(startup)
            fs, rs = (ca - base) / (cal_steps - 1), (cb - base) / (cal_steps - 1)
            full_cpu.append(fs)
            cpu[b_row.key], ratio[b_row.key] = rs, rs / fs
            say(f"calibration {b_row.key}: {rs:.3f} CPU s/step against the full model's {fs:.3f} (ratio {rs / fs:.3f})")
    return {
        "cal_steps": cal_steps,
        "startup_cpu_s": startup,
        "full_step_cpu_s": statistics.median(full_cpu),
        "full_step_cpu_s_each": full_cpu,
        "row_step_cpu_s": cpu,
        "ratio": ratio,
        "load_1min": loads,
    }


def steps_per_row(cal: dict, budget_s: float | None, full_steps: int | None) -> dict[str, int]:
    n = full_steps if full_steps is not None else max(1, round(budget_s / cal["full_step_cpu_s"]))
    return {row.key: max(1, round(n / cal["ratio"][row.key])) for row in ROWS}


def unigram_loss(shards: Path, records: Path) -> float:
    """Cross entropy (nats) of the held-out targets under the training shards' token frequencies (add-0.5
    smoothing): what a model that uses no context scores on the same targets as `xlnet eval`."""
    import numpy as np

    from xlnetcli.data.records.format import open_records
    from xlnetcli.data.shards.format import open_shards

    meta, passes = open_records(records, "valid")
    counts = np.full(meta["vocab_size"], 0.5)
    for tokens, _ in open_shards(shards, "train"):
        counts += np.bincount(np.asarray(tokens, dtype=np.int64), minlength=len(counts))
    logp = np.log(counts / counts.sum())
    rows = np.arange(meta["global_batch_size"])
    examples = (p.examples(rows, s) for p in passes for s in range(p.alen.shape[1]))
    targets = np.concatenate([ids[masked] for ids, masked, _ in examples]).astype(np.int64)
    return float(-logp[targets].mean())


def last_eval_accuracy(ft: Path) -> float:
    rows = [json.loads(line) for line in (ft / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("split") == "eval"][-1]["accuracy"]


def run_row(
    row: Row,
    seed: int,
    steps: int,
    work: Path,
    records: Path,
    eval_records: Path,
    task: dict,
    ft_sets: tuple[str, ...],
    sets: tuple[str, ...],
) -> dict:
    """Pretrain one row with one seed, then its held-out loss, probe and finetuned accuracy (outputs kept in
    WORK/runs; a step whose output exists is not run again, so an interrupted table resumes)."""
    name = f"{row.key}-s{seed}-n{steps}"
    d = work / "runs" / name
    d.mkdir(parents=True, exist_ok=True)
    run, res = d / "pretrain", {"row": row.key, "seed": seed, "steps": steps}
    if not (d / "pretrain_s.json").exists():  # written once the run is complete
        shutil.rmtree(run, ignore_errors=True)
        say(f"{name}: pretraining {steps} steps")
        res["pretrain_s"], res["pretrain_cpu_s"] = xlnet(
            "pretrain",
            "--config",
            CONFIG,
            "--data",
            str(records),
            "--out",
            str(run),
            "--quiet",
            "--set",
            f"train.seed={seed}",
            "--set",
            f"train.max_steps={steps}",
            "--set",
            f"train.warmup_steps={steps // 10}",
            "--set",
            "train.eval_every=never",
            "--set",
            "train.save_every=end",
            "--set",
            "train.report_to=none",
            *sets_args(sets + row.sets),
        )
        (d / "pretrain_s.json").write_text(json.dumps([res["pretrain_s"], res["pretrain_cpu_s"]]))
    res["pretrain_s"], res["pretrain_cpu_s"] = json.loads((d / "pretrain_s.json").read_text())
    res["train_loss"] = statistics.mean(r["loss"] for r in train_rows(run)[-3:])  # last 3 logged windows
    if not (d / "eval.json").exists():
        xlnet("eval", str(run), "--data", str(eval_records), "--output", str(d / "eval.json"))
    res["heldout_loss"] = json.loads((d / "eval.json").read_text())["loss"]
    if not (d / "probe.json").exists():
        say(f"{name}: probe")
        base = ["--baseline", "random"] if row is FULL else []
        _, cpu_s = xlnet(
            "probe",
            str(run),
            "--train",
            task["train"],
            "--valid",
            task["valid"],
            "--output",
            str(d / "probe.json"),
            *base,
            *(["--max-seq-length", str(task["max_seq_length"])] if task["max_seq_length"] else []),
        )
        (d / "probe_cpu_s.json").write_text(json.dumps(cpu_s))
    res["probe_cpu_s"] = json.loads((d / "probe_cpu_s.json").read_text())
    probe = json.loads((d / "probe.json").read_text())["results"]
    res["probe"] = {m: {f: probe[m][f]["accuracy"] for f in ("mean", "cls")} for m in probe}
    fts = [("finetune", [])] + ([("scratch", ["--from-scratch"])] if row is FULL else [])
    for tag, extra in fts:
        ft = d / tag
        if not ft.exists():
            say(f"{name}: finetune{' from scratch' if extra else ''}")
            _, cpu_s = xlnet(
                "finetune",
                "--task",
                "classification",
                "--train",
                task["train"],
                "--valid",
                task["valid"],
                "--init",
                str(run),
                "--out",
                str(ft),
                "--config",
                CONFIG,
                "--quiet",
                *extra,
                "--set",
                f"finetune.seed={seed}",
                *sets_args(ft_sets),
            )
            (d / f"{tag}_cpu_s.json").write_text(json.dumps(cpu_s))
        res[f"{tag}_acc"] = last_eval_accuracy(ft)
        res[f"{tag}_cpu_s"] = json.loads((d / f"{tag}_cpu_s.json").read_text())
    say(f"{name}: done " + json.dumps({k: v for k, v in res.items() if k not in ("row", "seed", "steps")}))
    return res


# ---------------------------------------------------------------------------------------------------------------


def cell(values: list[float], digits: int = 3) -> str:
    """Median and range over seeds."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def table(results: list[dict], steps: dict[str, int], cal: dict, unigram: float) -> str:
    by_row = {row.key: [r for r in results if r["row"] == row.key] for row in ROWS}
    lines = [
        "| row | steps | step CPU / full | pretrain CPU s | held-out loss | probe mean | probe cls | finetuned |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in ROWS:
        rs = by_row[row.key]
        loss = cell([r["heldout_loss"] for r in rs])
        objective = next((s.split("=")[1] for s in row.sets if s.startswith("model.objective=")), None)
        if objective:
            loss += f" ({objective.upper()}, n/c)"
        lines.append(
            f"| {row.label} | {steps[row.key]} | {cal['ratio'][row.key]:.2f} | "
            f"{cell([r['pretrain_cpu_s'] for r in rs], 0)} | {loss} | "
            f"{cell([r['probe']['pretrained']['mean'] for r in rs])} | "
            f"{cell([r['probe']['pretrained']['cls'] for r in rs])} | "
            f"{cell([r['finetune_acc'] for r in rs])} |"
        )
    full = by_row[FULL.key]
    lines.append(
        f"| no pretraining (random init) | 0 | - | - | - | {cell([r['probe']['random']['mean'] for r in full])} | "
        f"{cell([r['probe']['random']['cls'] for r in full])} | {cell([r['scratch_acc'] for r in full])} |"
    )
    lines.append(f"| unigram frequencies (no context) | - | - | - | {unigram:.3f} | - | - | - |")
    return "\n".join(lines)


def cut_rows(src: str, dst: Path, n: int) -> str:
    lines = Path(src).read_text(encoding="utf-8").splitlines(keepends=True)
    dst.write_text("".join(lines[: n + 1]), encoding="utf-8")
    return str(dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: one seed, a few steps, 150 task examples")
    ap.add_argument(
        "--budget",
        type=float,
        default=240.0,
        help="CPU seconds of pretraining per row, at the calibration's step cost (default 240)",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="the full model's steps instead of --budget (other rows scaled by the calibration)",
    )
    ap.add_argument("--seeds", default="1,2", help="comma-separated seeds (default 1,2)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    ap.add_argument("--cal-steps", type=int, default=30, help="steps per calibration run (default 30)")
    ap.add_argument("--calibration", type=Path, default=None, help="reuse a calibration.json instead of measuring")
    ap.add_argument("--calibrate-only", action="store_true", help="stop after the calibration (to choose a budget)")
    ap.add_argument("--corpus", default="data/pydocs/corpus.txt")
    ap.add_argument("--train", default="data/pydocs/order_train.tsv", help="labelled task file (probe, finetune)")
    ap.add_argument("--valid", default="data/pydocs/order_valid.tsv", help="labelled validation file")
    ap.add_argument(
        "--max-seq-length",
        type=int,
        default=None,
        help="task tokens per example for probe and finetune (default: the preset's)",
    )
    ap.add_argument("--finetune-epochs", type=float, default=None, help="finetune.epochs (default: the preset's)")
    add_override_args(ap, "every row's pretraining")
    ap.add_argument("--work", type=Path, default=None, help="keep every output here (default: a temporary folder)")
    ap.add_argument("--output", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.quick:
        seeds, args.steps, args.cal_steps = seeds[:1], args.steps or 6, min(args.cal_steps, 6)
    if (args.steps is not None and args.steps < 1) or args.cal_steps < 4 or args.jobs < 1:
        sys.exit("ablation: --steps must be >= 1, --cal-steps >= 4, --jobs >= 1")
    for f in (args.corpus, args.train, args.valid):
        if not Path(f).is_file() and not (ROOT / f).is_file():
            sys.exit(f"ablation: {f}: no such file")
    corpus, train, valid = (
        str((Path(f) if Path(f).is_file() else ROOT / f).resolve()) for f in (args.corpus, args.train, args.valid)
    )

    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="ablation-")
    work = (args.work or Path(tmp.name)).resolve()
    work.mkdir(parents=True, exist_ok=True)
    task = {"train": train, "valid": valid, "max_seq_length": args.max_seq_length}
    sets, ft_sets = overrides(args)
    if args.max_seq_length:
        ft_sets += (f"finetune.max_seq_length={args.max_seq_length}",)
    if args.finetune_epochs:
        ft_sets += (f"finetune.epochs={args.finetune_epochs}",)
    if args.quick:
        task.update(
            train=cut_rows(task["train"], work / "quick_train.tsv", 150),
            valid=cut_rows(task["valid"], work / "quick_valid.tsv", 60),
        )
        ft_sets += ("finetune.max_steps=4",)
    # a work folder holds one setting: its outputs are reused, so a different corpus or task needs another folder
    setting = {"corpus": corpus, **task, "pretrain": list(sets), "finetune": list(ft_sets)}
    if (work / "setting.json").exists() and json.loads((work / "setting.json").read_text()) != setting:
        sys.exit(f"ablation: {work} holds runs of another corpus, task or finetune setting; pass another --work")
    (work / "setting.json").write_text(json.dumps(setting, indent=2) + "\n")
    t_start, load_start = time.time(), os.getloadavg()
    say(f"work folder {work}; seeds {seeds}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}")

    tok, shards = work / "tok", work / "shards"
    if not tok.exists():
        xlnet("tokenize", "train", corpus, "--out", str(tok), "--config", CONFIG, "--quiet")
    if not shards.exists():
        xlnet(
            "shard",
            corpus,
            "--tokenizer",
            str(tok),
            "--out",
            str(shards),
            "--config",
            CONFIG,
            "--shards",
            "2",
            "--workers",
            "1",
            "--quiet",
        )
    variants = {record_sets(row.sets) for row in ROWS} | {EVAL_SETS}
    rec_dir = {v: work / records_name(v) for v in variants}

    def preprocess(v: tuple[str, ...]) -> None:
        if not rec_dir[v].exists():
            xlnet("preprocess", "--shards", str(shards), "--out", str(rec_dir[v]), "--config", CONFIG, *sets_args(v))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(preprocess, sorted(variants)))
    records = {row: rec_dir[record_sets(row.sets)] for row in ROWS}
    say(f"records: {', '.join(p.name for p in rec_dir.values())}")

    if args.calibration:
        cal = json.loads(args.calibration.read_text())
    else:
        cal = calibrate(work, records, args.cal_steps, sets)
        (work / "calibration.json").write_text(json.dumps(cal, indent=2) + "\n")
    steps = steps_per_row(cal, args.budget, args.steps)
    if args.calibrate_only:
        print(json.dumps(cal, indent=2))
        return
    say("steps: " + ", ".join(f"{k} {v}" for k, v in steps.items()))

    jobs = [(row, seed) for seed in seeds for row in ROWS]  # seed-major: load drift spreads over all rows
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(run_row, row, seed, steps[row.key], work, records[row], rec_dir[EVAL_SETS], task, ft_sets, sets)
            for row, seed in jobs
        ]
        results = [f.result() for f in futures]

    minutes, load_end = (time.time() - t_start) / 60, os.getloadavg()
    import torch

    print(
        f"Ablations (Table 6 in miniature): tiny config{''.join(' --set ' + s for s in sets)}, corpus {args.corpus}, "
        f"task {args.train} / {args.valid} (finetune: {', '.join(ft_sets)}); "
        f"seeds {','.join(map(str, seeds))}; full-model step {cal['full_step_cpu_s']:.3f} CPU s at calibration, "
        f"{steps[FULL.key]} steps = {steps[FULL.key] * cal['full_step_cpu_s']:.0f} CPU s per row; "
        f"{minutes:.1f} min wall; load (1/5/15 min) {load_start[0]:.1f}/{load_start[1]:.1f}/{load_start[2]:.1f} "
        f"at start, {load_end[0]:.1f}/{load_end[1]:.1f}/{load_end[2]:.1f} at end; {os.cpu_count()} CPUs; "
        f"torch {torch.__version__}"
    )
    print(
        "Cells: median (min-max) over seeds. Pretrain CPU s: the whole `xlnet pretrain` process, start-up "
        f"({statistics.mean(cal['startup_cpu_s']):.0f} s) included. Held-out loss: `xlnet eval` on the forward-only "
        "valid records, the row's own objective (n/c: a different task, not comparable with the PLM rows)."
    )
    print(table(results, steps, cal, unigram_loss(shards, rec_dir[EVAL_SETS])))
    print("\nper run:")
    for r in results:
        print(json.dumps(r))
    if args.output:
        args.output.write_text(
            json.dumps(
                {"calibration": cal, "steps": steps, "seeds": seeds, "results": results, "minutes": minutes}, indent=2
            )
            + "\n"
        )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
