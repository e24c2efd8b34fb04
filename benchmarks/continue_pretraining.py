"""Continued pretraining (#20): a general model, continued on another domain, against the same model from scratch.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/continue_pretraining.py --seeds 1,2    # what BENCHMARKS.md shows
    .venv/bin/python benchmarks/continue_pretraining.py --quick                         # smoke run (60 steps)
    .venv/bin/python benchmarks/continue_pretraining.py --sweep 5e-5,2e-4,5e-4,1e-3     # the lr levers

Corpus A: the bundled Python docs (data/pydocs/corpus.txt). Corpus B: the World English Bible, built at run time from
Debian's sword-text-web package by scripts/make_domain_corpus.py (which says how to get the .deb), with a B-domain
word-order task from books held out of B (the demo task's construction). Every step is the real `xlnet` command:

1. general model: `tokenize train` / `shard` / `preprocess` / `pretrain --config demo` on A (tiny at depth 2);
2. B sharded with the general model's tokenizer and preprocessed with continue-tiny;
3. per seed, at the same time (one OpenMP thread each, so load hits both alike), the same steps of
   `pretrain --config continue-tiny --set model.n_layer=2`: (a) `--init` the general model, (b) from random init
   at the from-scratch lr (tiny's train.lr, 1e-3; continue-tiny's 1e-4 would starve it), warmup and schedule alike;
4. held-out PLM loss on B over steps (metrics.jsonl, step 0 included; `train.eval_batches` batches) and at the end
   on the whole B valid split (`xlnet eval --data`); held-out loss on A (`xlnet eval --data A`) for the general
   model and after (a) and (b); tokens/s and seconds of each run;
5. B task: `xlnet probe` (frozen mean / <cls> features) and `xlnet finetune --config continue-tiny` for the general
   model, (a) and (b).

Goals (issue #20): (a) reaches (b)'s final held-out B loss in <= 0.25x the steps; at equal steps (a) beats (b) on
the B task by >= 5 points and the general model by >= 3; A's held-out loss rises by <= 10%. A Markdown table on
stdout, JSON in --output. `--sweep LRS` runs only (a) at each train.lr (and `--sweep-set` items) and reports the
held-out losses on B and A: how continue-tiny's lr was chosen.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runner import ROOT, say, sets_args, xlnet

sys.path.insert(0, str(ROOT / "scripts"))
from make_domain_corpus import SOURCES, find_deb

from xlnetcli.config import load_config

CORPUS_A = ROOT / "data/pydocs/corpus.txt"
GENERAL = "demo"  # the general model's recipe: tiny at depth 2, 1000 steps on A
CONTINUE = "continue-tiny"
SCRATCH_LR = load_config("tiny").train.lr  # (b)'s lr: the from-scratch recipe's (tiny, demo: 1e-3)
DEPTH = ("model.n_layer=2",)  # the general model's architecture (demo), on (a) and (b) alike
EVAL_BATCHES = 100  # of 8 examples: A's valid split is 22 batches, B's about 1100 (too slow on a shared CPU)
GOALS = {"steps_fraction": 0.25, "finetune_vs_scratch": 5.0, "finetune_vs_general": 3.0, "forgetting": 0.10}


def prepare(work: Path, deb: str | None, source: str) -> None:
    """Corpus B (and its task), the general model on A, and B's records (each skipped when already there)."""
    if not (work / "b" / "corpus_b.txt").is_file():
        package, builder = SOURCES[source]
        say(f"corpus B ({source}): {builder(work / 'b', find_deb(deb, work / 'b', package))}")
    w = str(work)
    steps = [
        ("tok", ["tokenize", "train", str(CORPUS_A), "--out", f"{w}/tok", "--config", GENERAL, "--quiet"]),
        ("shards_a", ["shard", str(CORPUS_A), "--tokenizer", f"{w}/tok", "--out", f"{w}/shards_a"]),
        ("records_a", ["preprocess", "--shards", f"{w}/shards_a", "--out", f"{w}/records_a", "--config", GENERAL]),
        ("general", ["pretrain", "--config", GENERAL, "--data", f"{w}/records_a", "--out", f"{w}/general"]),
        ("shards_b", ["shard", f"{w}/b/corpus_b.txt", "--tokenizer", f"{w}/tok", "--out", f"{w}/shards_b"]),
        ("records_b", ["preprocess", "--shards", f"{w}/shards_b", "--out", f"{w}/records_b", "--config", CONTINUE]),
    ]
    done = {"general": f"step_{load_config(GENERAL).train.max_steps:07d}"}  # a run is done at its last step
    for name, args in steps:
        if (work / name / done.get(name, "meta.json" if name.startswith("records") else "")).exists():
            continue
        if name == "general" and (work / name).exists():
            shutil.rmtree(work / name)  # an unfinished run of an earlier call
        if name.startswith("shards"):
            args += ["--config", GENERAL, "--shards", "2", "--workers", "1", "--quiet"]
        wall, _ = xlnet(*args, threads=2, echo=True)
        say(f"{name}: {wall:.0f} s")


def pretrain_b(
    work: Path, name: str, seed: int, steps: int, init: bool, sets: tuple[str, ...], reuse: bool = False
) -> dict:
    """One pretraining run on B (continued with ``init``, else from scratch); its eval curve, seconds, tokens/s.
    ``reuse`` (the sweep): a finished run of that name is read, not run again (no seconds then)."""
    out = work / "runs" / name
    run_sets = (
        *DEPTH,
        f"train.max_steps={steps}",
        f"train.warmup_steps={max(1, steps // 10)}",
        f"train.eval_every={max(1, steps // 20)}",
        f"train.save_every={steps}",
        "train.keep_last=1",
        f"train.seed={seed}",
        *sets,
    )
    args = ["pretrain", "--config", CONTINUE, "--data", str(work / "records_b"), "--out", str(out), "--quiet"]
    args += ["--init", str(work / "general")] if init else []
    wall = cpu = None
    if reuse and (out / f"step_{steps:07d}").is_dir():
        say(f"{name}: reused (its last step is there)")
    else:
        if out.exists():
            shutil.rmtree(out)
        wall, cpu = xlnet(*args, *sets_args(run_sets), threads=1, echo=True)
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["loss"]) for r in rows if r["split"] == "eval"]
    tps = [r["tokens_per_s"] for r in rows if r["split"] == "train"][1:]
    return {"run": str(out), "wall_s": wall, "cpu_s": cpu, "curve": curve, "tokens_per_s": statistics.median(tps)}


def plm_loss(run: str, records: Path, reuse: bool = False) -> float:
    """Held-out PLM loss of a checkpoint on the first EVAL_BATCHES batches of the valid split of ``records``
    (``reuse``: an earlier result is read)."""
    out = Path(run) / f"eval_{records.name}.json"
    if not (reuse and out.is_file()):
        xlnet("eval", run, "--data", str(records), "--batches", str(EVAL_BATCHES), "--output", str(out), threads=1)
    return json.loads(out.read_text())["loss"]


def task_scores(work: Path, run: str, seed: int, reuse: bool = False) -> dict:
    """B task: linear probe on frozen features and finetuned accuracy (best validation epoch); ``reuse``: scores
    already there are read."""
    b, tag = work / "b", Path(run).name
    out = work / "task" / tag
    out.mkdir(parents=True, exist_ok=True)
    task = ["--train", str(b / "order_train.tsv"), "--valid", str(b / "order_valid.tsv")]
    if not (reuse and (out / "probe.json").is_file()):
        xlnet("probe", run, *task, "--output", str(out / "probe.json"), threads=1)
    if not (reuse and (out / "ft" / "results.json").is_file()):
        ft = ["finetune", "--task", "classification", *task, "--config", CONTINUE, "--init", run]
        xlnet(*ft, "--out", str(out / "ft"), "--set", f"finetune.seed={seed}", "--quiet", threads=1)
    probe = json.loads((out / "probe.json").read_text())["results"]["pretrained"]
    return {
        "probe_mean": probe["mean"]["accuracy"],
        "probe_cls": probe["cls"]["accuracy"],
        "finetune": json.loads((out / "ft" / "results.json").read_text())["value"],
    }


def lr_set(lr: str | None) -> tuple[str, ...]:
    return (f"train.lr={lr}",) if lr else ()


def in_pairs(jobs: list, fn) -> list:
    """``fn(*job)`` for every job, two at a time (one thread each), results in order."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda job: fn(*job), jobs))


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step whose loss is at or below ``target`` (None: never)."""
    return next((s for s, loss in curve if loss <= target), None)


def sweep(work: Path, lrs: list[str], seeds: list[int], steps: int, extra: tuple[str, ...]) -> list[dict]:
    """(a) only, at each lr and seed: held-out B loss (whole valid split) and A loss, against the general model's."""
    general_a = plm_loss(str(work / "general"), work / "records_a")
    general_b = plm_loss(str(work / "general"), work / "records_b")
    jobs = [(lr, seed) for seed in seeds for lr in lrs]

    def one(lr: str, seed: int) -> dict:
        tag = "_".join(s.split("=")[1] for s in extra)
        r = pretrain_b(work, f"sweep_lr{lr}{tag}_s{seed}", seed, steps, True, (f"train.lr={lr}", *extra), True)
        return {
            "lr": lr,
            "sets": list(extra),
            "seed": seed,
            "b_loss": plm_loss(r["run"], work / "records_b"),
            "a_loss": plm_loss(r["run"], work / "records_a"),
            "wall_s": r["wall_s"],
        }

    rows = in_pairs(jobs, one)
    print(f"general model: held-out B {general_b:.3f}, A {general_a:.3f}; {steps} steps on B, continue-tiny")
    print("| train.lr | other --set | train.seed | held-out B loss | held-out A loss (change) | wall s |")
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['lr']} | {' '.join(r['sets']) or '-'} | {r['seed']} | {r['b_loss']:.3f} | {r['a_loss']:.3f} "
            f"({100 * (r['a_loss'] / general_a - 1):+.1f}%) | {r['wall_s'] or 0:.0f} |"
        )
    return [{"general_a": general_a, "general_b": general_b}, *rows]


def compare(work: Path, seeds: list[int], steps: int, sets: tuple[str, ...], lr: str | None, reuse: bool) -> dict:
    """(a) and (b) per seed, run together; A and B losses at the end; the B task for the general model, (a), (b).
    ``lr``: (a)'s train.lr instead of continue-tiny's; ``reuse``: finished runs and task scores are read, not redone."""
    runs = {}
    for seed in seeds:
        scratch = (f"train.lr={SCRATCH_LR:g}", *sets)  # (b) at the from-scratch lr: continue-tiny's would be unfair
        jobs = [
            (work, f"continued{'_lr' + lr if lr else ''}_s{seed}", seed, steps, True, (*sets, *lr_set(lr)), reuse),
            (work, f"scratch_s{seed}", seed, steps, False, scratch, reuse),
        ]
        runs["continued", seed], runs["scratch", seed] = in_pairs(jobs, pretrain_b)
    general = str(work / "general")
    models = [("general", 0, general), *((side, seed, r["run"]) for (side, seed), r in runs.items())]
    evals = [(run, work / rec, reuse) for _, _, run in models for rec in ("records_a", "records_b")]
    losses = in_pairs(evals, plm_loss)
    tasks = in_pairs([(work, run, seed or seeds[0], reuse) for _, _, run in models], task_scores)
    out: dict = {"general": {"a_loss": losses[0], "b_loss": losses[1], **tasks[0]}, "runs": []}
    for i, (side, seed, _) in enumerate(models[1:], start=1):
        r = runs[side, seed]
        out["runs"].append(
            {
                "side": side,
                "seed": seed,
                "lr": float(lr or load_config(CONTINUE).train.lr) if side == "continued" else SCRATCH_LR,
                "a_loss": losses[2 * i],
                "b_loss": losses[2 * i + 1],
                **tasks[i],
                **r,
            }
        )
    return out


def goals(res: dict, steps: int) -> list[dict]:
    """Per seed: the four goals' figures and whether each is met."""
    g, rows = res["general"], []
    for seed in sorted({r["seed"] for r in res["runs"]}):
        a, b = (next(r for r in res["runs"] if r["side"] == s and r["seed"] == seed) for s in ("continued", "scratch"))
        reach = steps_to(a["curve"], b["curve"][-1][1])
        figs = {
            "steps_fraction": None if reach is None else reach / steps,
            "finetune_vs_scratch": 100 * (a["finetune"] - b["finetune"]),
            "finetune_vs_general": 100 * (a["finetune"] - g["finetune"]),
            "forgetting": a["a_loss"] / g["a_loss"] - 1,
        }
        met = {
            "steps_fraction": figs["steps_fraction"] is not None and figs["steps_fraction"] <= GOALS["steps_fraction"],
            "finetune_vs_scratch": figs["finetune_vs_scratch"] >= GOALS["finetune_vs_scratch"],
            "finetune_vs_general": figs["finetune_vs_general"] >= GOALS["finetune_vs_general"],
            "forgetting": figs["forgetting"] <= GOALS["forgetting"],
        }
        rows.append({"seed": seed, "figures": figs, "met": met})
    return rows


def print_tables(res: dict, goal_rows: list[dict], steps: int) -> None:
    g = res["general"]
    print("| model | steps on B | held-out B loss | held-out A loss | probe mean / cls | finetuned | tokens/s | s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| general (A only) | 0 | {g['b_loss']:.3f} | {g['a_loss']:.3f} | {g['probe_mean']:.3f} / "
        f"{g['probe_cls']:.3f} | {g['finetune']:.3f} | - | - |"
    )
    for r in res["runs"]:
        wall = "-" if r["wall_s"] is None else f"{r['wall_s']:.0f}"  # reused: not run this time
        name = f"{'(a) continued' if r['side'] == 'continued' else '(b) from scratch'}, lr {r['lr']:g}"
        print(
            f"| {name}, seed {r['seed']} | {steps} | {r['b_loss']:.3f} | {r['a_loss']:.3f} | {r['probe_mean']:.3f} / "
            f"{r['probe_cls']:.3f} | {r['finetune']:.3f} | {r['tokens_per_s']:,.0f} | {wall} |"
        )
    evals = sorted({s for r in res["runs"] for s, _ in r["curve"]})
    shown = [s for s in evals if s in {0, steps // 10, steps // 5, steps // 4, steps // 2, steps}]
    print("\n| held-out B loss at step | " + " | ".join(map(str, shown)) + " |")
    print("|---|" + "---:|" * len(shown))
    for r in res["runs"]:
        c = dict(r["curve"])
        print(f"| {r['side']}, seed {r['seed']} | " + " | ".join(f"{c[s]:.3f}" for s in shown) + " |")
    print(
        "\n| seed | (a) at (b)'s final B loss, x steps (<= 0.25) | finetune (a)-(b), pts (>= 5) | "
        "(a)-general (>= 3) | A loss change (<= +10%) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for row in goal_rows:
        f, m = row["figures"], row["met"]
        frac = "never" if f["steps_fraction"] is None else f"{f['steps_fraction']:.2f}"
        ok = {k: "met" if v else "missed" for k, v in m.items()}
        print(
            f"| {row['seed']} | {frac} ({ok['steps_fraction']}) | {f['finetune_vs_scratch']:+.1f} "
            f"({ok['finetune_vs_scratch']}) | {f['finetune_vs_general']:+.1f} ({ok['finetune_vs_general']}) | "
            f"{100 * f['forgetting']:+.1f}% ({ok['forgetting']}) |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="runs/continue_pretraining", help="work folder (data and general model reused)")
    ap.add_argument("--deb", default=None, help="the package's .deb (default: looked for, see the builder)")
    ap.add_argument("--source", choices=SOURCES, default="web", help="corpus B: web, or gcide (with --sweep only)")
    ap.add_argument("--seeds", default="1,2", help="train.seed (and finetune.seed) values, comma-separated")
    ap.add_argument("--steps", type=int, default=None, help="steps on B (default: continue-tiny's train.max_steps)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="train.* for (a) and (b)")
    ap.add_argument("--continued-lr", default=None, metavar="LR", help="(a)'s train.lr (default: continue-tiny's)")
    ap.add_argument("--reuse", action="store_true", help="read finished runs and task scores in WORK (0 s: reused)")
    ap.add_argument("--sweep", default=None, metavar="LR,LR,...", help="only (a), at each train.lr")
    ap.add_argument("--sweep-set", action="append", default=[], metavar="KEY=VALUE", help="with --sweep")
    ap.add_argument("--output", default=None, help="JSON results (default: WORK/results.json)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 60 steps, one seed")
    a = ap.parse_args()
    steps = 60 if a.quick else a.steps or load_config(CONTINUE).train.max_steps
    seeds = [int(s) for s in a.seeds.split(",")][: 1 if a.quick else None]
    work = Path(a.work).resolve()
    t0 = time.time()
    say(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    if a.source != "web" and not a.sweep:
        ap.error("--source gcide has no B task: use it with --sweep")
    prepare(work, a.deb, a.source)
    if a.sweep:
        res: dict = {"sweep": sweep(work, a.sweep.split(","), seeds, steps, tuple(a.sweep_set))}
    else:
        res = compare(work, seeds, steps, tuple(a.set), a.continued_lr, a.reuse)
        res["goals"] = goals(res, steps)
        print_tables(res, res["goals"], steps)
    res |= {"source": a.source, "steps": steps, "seeds": seeds, "sets": a.set, "minutes": (time.time() - t0) / 60}
    out = Path(a.output or work / "results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    say(f"{(time.time() - t0) / 60:.1f} min; results: {out}")


if __name__ == "__main__":
    main()
