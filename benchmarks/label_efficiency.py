"""Label efficiency after finetuning: accuracy against the number of labelled examples, pretrained against random init.

    python benchmarks/label_efficiency.py --run RUN [--sizes 50,200,800] [--seeds 1] [--png label_efficiency.png]

For each size n (and the whole training file), a stratified draw of n rows of --train (`draw_rows`, drawn as the probe
curve draws) is finetuned twice with the tiny finetune settings and finetune.summary_type mean (as the demo):
`xlnet finetune --init RUN` and the same with `--from-scratch` (same finetune.seed), each scored on the whole --valid
file (finetune keeps its best evaluation by validation accuracy, for both starts alike). Small draws get more epochs so
that every run takes at least --min-steps optimizer steps (3 epochs of 50 rows are 6 steps at batch 32), and every
run is evaluated 3 times (each epoch of the whole file).
`xlnet probe --train-sizes` gives the same view from frozen features in seconds; this is the finetuned one. Prints
a Markdown table and JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

from runner import xlnet

from xlnetcli.evaluate.probe import draw_rows, read_rows


def finetune(
    train: Path,
    valid: str,
    init: str,
    out: Path,
    scratch: bool,
    epochs: float,
    eval_every: int,
    seed: int,
    summary_type: str,
) -> float:
    xlnet(
        "finetune",
        "--task",
        "classification",
        "--train",
        str(train),
        "--valid",
        valid,
        "--init",
        init,
        "--out",
        str(out),
        "--config",
        "tiny",
        "--set",
        f"finetune.epochs={epochs:g}",
        "--set",
        f"finetune.eval_every={eval_every}",
        "--set",
        f"finetune.seed={seed}",
        "--set",
        f"finetune.summary_type={summary_type}",
        "--quiet",
        *(["--from-scratch"] if scratch else []),
    )
    return json.loads((out / "results.json").read_text())["valid"]["accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="pretraining run (or checkpoint) to finetune from")
    ap.add_argument("--train", default="data/pydocs/order_train.tsv")
    ap.add_argument("--valid", default="data/pydocs/order_valid.tsv")
    ap.add_argument("--sizes", default="50,200,800")
    ap.add_argument("--seeds", default="1", help="finetune.seed values, comma-separated")
    ap.add_argument("--min-steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=32, help="the tiny preset's finetune.batch_size")
    ap.add_argument("--summary-type", default="mean", help="finetune.summary_type (the demo's: mean)")
    ap.add_argument("--skip-full", action="store_true", help="only the drawn sizes, not the whole training file")
    ap.add_argument("--png", default=None, help="also draw the curve to this PNG")
    args = ap.parse_args()
    rows = read_rows(args.train)
    sizes = [int(n) for n in args.sizes.split(",") if int(n) < len(rows)] + ([] if args.skip_full else [len(rows)])
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            part = rows if n == len(rows) else draw_rows(rows, n, seed=0)
            path = Path(tmp) / f"train_{n}.tsv"
            path.write_text("text\tlabel\n" + "".join(f"{r.text_a}\t{r.label}\n" for r in part), encoding="utf-8")
            epochs = max(3.0, math.ceil(args.min_steps * args.batch / len(part)))
            eval_every = max(1, math.ceil(len(part) / args.batch) * int(epochs) // 3)  # 3 evaluations, as 3 epochs
            for seed in seeds:
                acc = {
                    start: finetune(
                        path,
                        args.valid,
                        args.run,
                        Path(tmp) / f"{start}_{n}_{seed}",
                        start == "scratch",
                        epochs,
                        eval_every,
                        seed,
                        args.summary_type,
                    )
                    for start in ("pretrained", "scratch")
                }
                results.append({"n": len(part), "seed": seed, "epochs": epochs, **acc})
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print("| labelled examples | epochs | finetune.seed | pretrained | from scratch | difference (points) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['n']} | {r['epochs']:g} | {r['seed']} | {r['pretrained']:.3f} | {r['scratch']:.3f} | "
            f"{100 * (r['pretrained'] - r['scratch']):+.1f} |"
        )
    print(json.dumps({"run": args.run, "train": args.train, "valid": args.valid, "results": results}))
    if args.png:
        from xlnetcli.report.plot import plot_curves

        curves = {}
        for start, name in (("pretrained", "pretrained"), ("scratch", "random init")):
            by_n: dict[int, list[float]] = {}
            for r in results:
                by_n.setdefault(r["n"], []).append(r[start])
            curves[name, "finetuned"] = [(n, sum(v) / len(v)) for n, v in by_n.items()]
        plot_curves(curves, args.png, "validation accuracy (finetuned)", f"label efficiency: {Path(args.valid).name}")


if __name__ == "__main__":
    main()
