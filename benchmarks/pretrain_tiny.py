"""End-to-end pretraining throughput (data + step) with the tiny config on the bundled corpus, CPU.

    python benchmarks/pretrain_tiny.py [--quick] [--steps N]

Builds tokenizer -> shards -> records in a temporary folder with the real commands, then runs `xlnet pretrain`
for N steps (no eval, no checkpoints until the end) and prints the tokens/s that pretrain logs (data + step time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
XLNET = str(Path(sys.executable).with_name("xlnet"))


def xlnet(*args: str, env: dict | None = None) -> None:
    subprocess.run([XLNET, *args], cwd=ROOT, check=True, env=env, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10 steps")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    steps = 10 if args.quick else args.steps
    cfg = "configs/tiny.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        xlnet("tokenize", "train", "data/pydocs/corpus.txt", "--out", str(t / "tok"), "--config", cfg, "--quiet")
        xlnet(
            "shard",
            "data/pydocs/corpus.txt",
            "--tokenizer",
            str(t / "tok"),
            "--out",
            str(t / "shards"),
            "--config",
            cfg,
            "--quiet",
        )
        xlnet("preprocess", "--shards", str(t / "shards"), "--out", str(t / "rec"), "--config", cfg)
        rows = []
        for threads in ("1", "2"):
            env = {**os.environ, "OMP_NUM_THREADS": threads, "XLNET_NO_PROGRESS": "1"}
            out = t / f"run{threads}"
            xlnet(
                "pretrain",
                "--config",
                cfg,
                "--data",
                str(t / "rec"),
                "--out",
                str(out),
                "--quiet",
                "--set",
                f"train.max_steps={steps}",
                "--set",
                f"train.warmup_steps={steps // 10}",
                "--set",
                "train.eval_every=never",
                "--set",
                "train.save_every=end",
                "--set",
                "train.log_every=5",
                env=env,
            )
            train = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
            tps = [r["tokens_per_s"] for r in train if r["split"] == "train"][1:]  # skip the warm-up window
            tps.sort()
            rows.append((threads, tps[len(tps) // 2] if tps else float("nan")))
    print(f"tiny config, seq 128, batch 16 (2,048 tokens/step), {steps} steps, torch {__import__('torch').__version__}")
    print("| OMP threads | tokens/s (median of logged windows) |\n|---|---|")
    for threads, v in rows:
        print(f"| {threads} | {v:,.0f} |")


if __name__ == "__main__":
    main()
