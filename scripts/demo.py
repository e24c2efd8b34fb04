"""`make demo`: the whole path on the bundled corpus, with the tiny config, on CPU.

tokenize -> shard -> preprocess -> pretrain -> linear probe (pretrained and random init, with its label-efficiency
curve) -> finetune (pretrained and from scratch) -> eval, then a summary table with every figure as measured.
The task (data/pydocs/order_*.tsv, see NOTICE.md there): is a sentence as written, or have two adjacent words been
swapped? Its sentences come from modules left out of the pretraining corpus, and each appears in both versions, so
a bag of words is at chance by construction: the labels depend on word order only.
Every step is the real `xlnet` command (printed before it runs), so the demo doubles as a worked example.
Every step runs the packaged preset `demo` (src/xlnetcli/config/presets/demo.yaml), so `--config demo` gives anyone
the recipe behind the figures. Outputs go to demo/ (replaced on every run). Set DEMO_STEPS to change the pretraining
length (default: the preset's train.max_steps).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo"
CORPUS = "data/pydocs/corpus.txt"
TASK_TRAIN, TASK_VALID = "data/pydocs/order_train.tsv", "data/pydocs/order_valid.tsv"
TRAIN_SIZES = (50, 200, 800)  # the probe's label-efficiency curve (and the whole training file)
# The packaged preset: the tiny model at depth 2 for 1000 steps, finetuned with a mean-pooled summary (why: its
# comments and BENCHMARKS.md, "Small-budget recipe")
CONFIG = "demo"
XLNET = str(Path(sys.executable).with_name("xlnet"))


def demo_steps_sets(steps: str | None) -> list[str]:
    """The --set items of DEMO_STEPS for pretrain (none when unset): its length, with warmup and evaluations scaled
    as the preset's (a tenth, a quarter)."""
    if not steps:
        return []
    n = int(steps)
    return [
        "--set",
        f"train.max_steps={n}",
        "--set",
        f"train.warmup_steps={n // 10}",
        "--set",
        f"train.eval_every={max(1, n // 4)}",
    ]


def run(*args: str, capture: bool = False) -> str:
    cmd = ["xlnet", *args]
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    t0 = time.time()
    proc = subprocess.run([XLNET, *args], cwd=ROOT, text=True, stdout=subprocess.PIPE if capture else None)
    if proc.returncode != 0:
        sys.exit(f"demo: step failed ({shlex.join(cmd)}), exit code {proc.returncode}")
    print(f"  [{time.time() - t0:.0f} s]", flush=True)
    return proc.stdout or ""


def eval_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("split") == "eval"]


def main() -> None:
    t_start = time.time()
    if DEMO.exists():
        shutil.rmtree(DEMO)
    DEMO.mkdir()
    pre_sets = demo_steps_sets(os.environ.get("DEMO_STEPS"))

    run("tokenize", "train", CORPUS, "--out", "demo/tokenizer", "--config", CONFIG)
    run(
        "tokenize",
        "encode",
        "--tokenizer",
        "demo/tokenizer",
        "--text",
        "Return a new event loop, or raise RuntimeError if there is none.",
    )
    run(
        "shard",
        CORPUS,
        "--tokenizer",
        "demo/tokenizer",
        "--out",
        "demo/shards",
        "--config",
        CONFIG,
        "--shards",
        "2",
        "--workers",
        "2",
    )
    run("preprocess", "--shards", "demo/shards", "--out", "demo/records", "--config", CONFIG)
    run("pretrain", "--config", CONFIG, "--data", "demo/records", "--out", "demo/pretrain", *pre_sets)
    run("eval", "demo/pretrain", "--data", "demo/records", "--output", "demo/eval_pretrain.json", capture=True)
    # frozen features of the pretrained model against the same architecture from random init, refitted on a few
    # labelled examples too (features once; seconds on CPU)
    run(
        "probe",
        "demo/pretrain",
        "--train",
        TASK_TRAIN,
        "--valid",
        TASK_VALID,
        "--baseline",
        "random",
        "--train-sizes",
        ",".join(map(str, TRAIN_SIZES)),
        "--output",
        "demo/probe.json",
    )
    run("plot", "demo/probe.json")
    common = ["--task", "classification", "--train", TASK_TRAIN, "--valid", TASK_VALID, "--config", CONFIG]
    run("finetune", *common, "--init", "demo/pretrain", "--out", "demo/finetune")
    run("finetune", *common, "--init", "demo/pretrain", "--from-scratch", "--out", "demo/finetune_scratch")
    for name in ("finetune", "finetune_scratch"):
        run(
            "eval",
            f"demo/{name}",
            "--file",
            TASK_VALID,
            "--output",
            f"demo/eval_{name}.json",
            "--predict",
            f"demo/predictions_{name}.tsv",
            capture=True,
        )
    # how far the words alone go on the task: the same linear probe on bag-of-words features (seconds)
    bow_cmd = ["benchmarks/bow_baseline.py", "--train", TASK_TRAIN, "--valid", TASK_VALID]
    print(f"\n$ python {shlex.join(bow_cmd)}", flush=True)
    proc = subprocess.run([sys.executable, *bow_cmd], cwd=ROOT, text=True, stdout=subprocess.PIPE)
    if proc.returncode != 0:
        sys.exit(f"demo: step failed (python {shlex.join(bow_cmd)}), exit code {proc.returncode}")
    bow = json.loads(proc.stdout)
    run("export", "demo/pretrain", "--format", "hf", "--out", "demo/hf")
    # the finetuned transformer as XLNetModel: transformers' mean summary would average the padding too, so the
    # mean-pooled head has no exact transformers equivalent (xlnet export refuses it)
    run("export", "demo/finetune", "--format", "hf", "--out", "demo/hf-finetune", "--backbone-only")
    run("plot", "demo/finetune")

    evals = eval_rows(DEMO / "pretrain")
    before, after = evals[0], json.loads((DEMO / "eval_pretrain.json").read_text())
    ft = json.loads((DEMO / "eval_finetune.json").read_text())
    scratch = json.loads((DEMO / "eval_finetune_scratch.json").read_text())
    probe = json.loads((DEMO / "probe.json").read_text())["results"]
    pre_curve = {f: {pt["n"]: pt["accuracy"] for pt in probe["pretrained"][f]["curve"]} for f in ("mean", "cls")}
    rnd_curve = {f: {pt["n"]: pt["accuracy"] for pt in probe["random"][f]["curve"]} for f in ("mean", "cls")}

    from rich.console import Console
    from rich.table import Table

    n_layer = yaml.safe_load((DEMO / "pretrain" / "config.yaml").read_text())["model"]["n_layer"]
    table = Table(
        title=f"xlnet demo: tiny config, {n_layer} layers, on the Python docs corpus (CPU); "
        "task: a sentence as written, or with adjacent words swapped"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("held-out PLM loss, initial weights (step 0)", f"{before['loss']:.3f} (ppl {before['ppl']:.0f})")
    table.add_row(
        f"held-out PLM loss after pretraining (step {evals[-1]['step']})",
        f"{after['loss']:.3f} (ppl {after['ppl']:.0f})",
    )
    table.add_row("held-out target accuracy after pretraining", f"{after['acc']:.3f}")
    for feat in ("mean", "cls"):
        pre, rnd = probe["pretrained"][feat]["accuracy"], probe["random"][feat]["accuracy"]
        table.add_row(
            f"linear probe, frozen {feat} features: pretrained / random",
            f"{pre:.3f} / {rnd:.3f} ({100 * (pre - rnd):+.1f} pts)",
        )
    for n in pre_curve["mean"]:
        table.add_row(
            f"  the same from {n} labelled examples (mean of 3 draws)",
            "  ".join(f"{f} {pre_curve[f][n]:.3f} / {rnd_curve[f][n]:.3f}" for f in ("mean", "cls")),
        )
    gain = ft["metrics"]["accuracy"] - scratch["metrics"]["accuracy"]
    table.add_row("demo task accuracy, finetuned from the pretrained model", f"{ft['metrics']['accuracy']:.3f}")
    table.add_row(
        "demo task accuracy, same model from random init",
        f"{scratch['metrics']['accuracy']:.3f} ({100 * gain:+.1f} pts)",
    )
    table.add_row("bag-of-words linear classifier (words alone)", f"{bow['accuracy']:.3f}")
    table.add_row("chance (2 balanced labels)", "0.500")
    table.add_row("wall time", f"{(time.time() - t_start) / 60:.1f} min")
    console = Console()
    console.print()
    console.print(table)
    console.print(
        "curves: demo/pretrain/curves.png, demo/finetune/curves.png, label efficiency: demo/probe.png; "
        "HF exports: demo/hf (pretrained), demo/hf-finetune (the finetuned transformer)"
    )
    gains = {f: probe["pretrained"][f]["accuracy"] - probe["random"][f]["accuracy"] for f in ("mean", "cls")}
    if min(max(gains.values()), gain) < 0.05:
        console.print(
            f"note: pretraining gained {100 * gains['mean']:+.1f} (mean) / {100 * gains['cls']:+.1f} (cls) points in "
            f"the probe and {100 * gain:+.1f} after finetuning: short of 5 points in at least one. The task needs word "
            "order (a bag of words is at chance by construction), and a few minutes of CPU pretraining on 0.4M tokens "
            "teach a tiny model only part of it; runs vary by a few points with the seed (BENCHMARKS.md, "
            '"Small-budget recipe").'
        )
    summary = {
        "plm_loss_before": before["loss"],
        "plm_loss_after": after["loss"],
        "plm_acc_after": after["acc"],
        "probe": {m: {f: probe[m][f]["accuracy"] for f in ("mean", "cls")} for m in probe},
        "probe_curve": {"pretrained": pre_curve, "random": rnd_curve},
        "finetune_accuracy": ft["metrics"]["accuracy"],
        "scratch_accuracy": scratch["metrics"]["accuracy"],
        "bow_accuracy": bow["accuracy"],
        "minutes": (time.time() - t_start) / 60,
    }
    (DEMO / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
