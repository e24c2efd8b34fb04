"""The product's own path on a GPU: `xlnet pretrain` (the engine, the records stream, the logged tokens/s and MFU),
XLNet-Base shapes on the bundled corpus, with the step's figures read before each update (synced) and a step late
(deferred: the default on one GPU without fp16), eager and compiled.

    python benchmarks/gpu_engine.py --json /tmp/engine.json          # on a GPU: about 3 minutes with compile
    python benchmarks/gpu_engine.py --smoke                          # CPU: tiny shapes, checks the script

gpu_pretrain.py times the model's step alone (its own loop over one batch); this times what a user runs: records read
and pinned by the prefetch thread, memories carried, the engine's clipping, check and logging. The figure of a row is
the logged tokens/s over the train rows after the first ``--skip`` (compilation, warm-up), the mean over those rows.
Base shapes: seq 512, memory 384, 85 targets, bi_data, micro-batch 16 (accumulation 1), bf16; the vocabulary is the
bundled corpus's (8000 pieces, the preset's 32000 is too many for 1.6 MB of text): the step's FLOPs change by the
output layer's share (logged MFU uses the run's own model FLOPs).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import statistics
import tempfile
import traceback
import warnings
from pathlib import Path

from runner import ROOT, sets_args, xlnet

CORPUS = ROOT / "data" / "pydocs" / "corpus.txt"


def build_records(work: Path, smoke: bool) -> tuple[Path, list[str]]:
    """Tokenizer, shards and records of the bundled corpus at the row's shapes; returns (records, --set items)."""
    sets = ["tokenizer.vocab_size=8000", "model.vocab_size=8000", "train.global_batch_size=16", "data.passes=4"]
    if smoke:  # the tiny preset's model at seq 64: the same code, seconds on a CPU
        sets = ["tokenizer.vocab_size=1000", "model.vocab_size=1000", "train.global_batch_size=4"]
        sets += ["train.micro_batch_size=4", "data.passes=2", "data.seq_len=64", "model.reuse_len=32"]
        sets += ["model.mem_len=32", "data.num_predict=10", "data.perm_size=32"]
    config = "tiny" if smoke else "base"

    def only(*sections: str) -> list[str]:  # each command refuses keys it does not read
        return sets_args(s for s in sets if s.split(".")[0] in sections)

    xlnet("tokenize", "train", str(CORPUS), "--out", str(work / "tok"), "--config", config, *only("tokenizer"))
    workers = ("--workers", str(min(8, os.cpu_count() or 1)))  # the output is the same for any number
    shards = ("--out", str(work / "shards"), "--config", config, *workers)
    xlnet("shard", str(CORPUS), "--tokenizer", str(work / "tok"), *shards)
    pre = ("--config", config, *only("data", "train", "model"), *workers)
    xlnet("preprocess", "--shards", str(work / "shards"), "--out", str(work / "rec"), *pre)
    return work / "rec", [*sets, f"config={config}"]


class SyncFinder:
    """Where the host waits for the device: torch's sync debug mode warns at each synchronizing call; counted by the
    innermost frames in xlnetcli (a count near the step count is a sync per step)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()

    def __enter__(self) -> SyncFinder:
        import torch

        self._show, self._filters = warnings.showwarning, warnings.filters[:]
        warnings.simplefilter("always")
        warnings.showwarning = self._record  # type: ignore[assignment]
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def _record(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        ours = [f for f in traceback.extract_stack()[:-1] if "xlnetcli" in f.filename or "benchmarks" in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-3:]))
        self.counts[where or "(outside xlnetcli)"] += 1

    def __exit__(self, *exc) -> None:
        import torch

        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning, warnings.filters[:] = self._show, self._filters

    def report(self) -> list[dict]:
        return [{"count": n, "where": w} for w, n in self.counts.most_common(12)]


def run_row(records: Path, sets: list[str], out: Path, opts: set, steps: int, dev: str) -> dict:
    """One `xlnet pretrain` run. ``opts``: compile (else eager), synced (figures read before each update, else
    deferred), nodet (train.deterministic false), graphs (train.cuda_graphs), syncs (count where the host waits,
    SyncFinder)."""
    import torch

    from xlnetcli.config import load_config
    from xlnetcli.report.metrics_log import read_metrics
    from xlnetcli.train import engine
    from xlnetcli.train.pretrain import pretrain

    config = next(s.split("=", 1)[1] for s in sets if s.startswith("config="))
    over = [s for s in sets if not s.startswith("config=")]
    over += [f"train.max_steps={steps}", "train.log_every=5", "train.eval_every=never", f"train.save_every={steps}"]
    over += [f"train.compile={str('compile' in opts).lower()}", "train.warmup_steps=10"]
    if "nodet" in opts:
        over += ["train.deterministic=false"]
    if "graphs" in opts:  # each compiled layer replayed as a CUDA graph (needs compile, static shapes)
        over += ["train.cuda_graphs=true", "train.static_shapes=true"]
    if dev == "cpu":
        over += ["train.precision=fp32"]
    cfg = load_config(config, over)
    keep = engine.deferred_check, engine.fused_adamw
    if "synced" in opts:
        engine.deferred_check = lambda *a: False  # the same engine, its figures read before each update
    elif dev == "cpu":
        engine.fused_adamw = lambda d: True  # smoke: the deferred path runs on the CPU's fused AdamW
    finder = SyncFinder() if "syncs" in opts and dev == "cuda" else contextlib.nullcontext()
    try:
        gc.collect()  # the last row's engine (weights, AdamW state) out of this row's peak
        if dev == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        with finder:
            res = pretrain(cfg, records, out, device=dev, quiet=True)
    finally:
        engine.deferred_check, engine.fused_adamw = keep
    rows = [r for r in read_metrics(out) if r["split"] == "train"]
    return {"rows": rows, "loss": res["loss"], "syncs": finder.report() if isinstance(finder, SyncFinder) else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per row (train rows every 5)")
    ap.add_argument("--skip", type=int, default=2, help="train rows left out of the figure (compile, warm-up)")
    ap.add_argument(
        "--rows",
        default="eager:synced,eager:deferred,compile:synced,compile:deferred",
        help="comma-separated MODE:CHECK[:nodet][:graphs][:syncs], MODE eager or compile, CHECK synced or deferred",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (checks the script)")
    args = ap.parse_args()
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not args.smoke:
        raise SystemExit("no CUDA device: run with --smoke to check the script on CPU")
    if args.smoke:
        args.steps, args.skip = 10, 1
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="xlnet-gpu-engine-") as tmp:
        work = Path(tmp)
        records, sets = build_records(work, args.smoke)
        for i, row in enumerate(args.rows.split(",")):
            r = run_row(records, sets, work / f"run{i}", set(row.split(":")), args.steps, dev)
            timed = r["rows"][args.skip :]
            tps = statistics.mean(x["tokens_per_s"] for x in timed)
            mfu = [x["mfu"] for x in timed if "mfu" in x]
            out = {
                "row": row,
                "tokens_per_s": tps,
                "mfu": statistics.mean(mfu) if mfu else None,
                "peak_gib": max(x["peak_mem_gib"] for x in timed),
                "loss": r["loss"],
                "steps": args.steps,
                "rows_timed": len(timed),
            }
            if r["syncs"] is not None:
                out["syncs"] = r["syncs"]
            results.append(out)
            mfu_s = f"{100 * out['mfu']:5.1f}%" if out["mfu"] else "  n/a"
            print(
                f"{row:<18} {tps:>10,.0f} tok/s  MFU {mfu_s}  peak {out['peak_gib']:.2f} GiB  loss {out['loss']:.3f}",
                flush=True,
            )
            for x in out.get("syncs") or []:
                print(f"  sync x{x['count']:<5} {x['where']}", flush=True)
    by = {r["row"].replace(":syncs", ""): r for r in results}  # finding the syncs changes nothing else
    pairs = [(f"{m}:synced", f"{m}:deferred", f"{m}: deferred / synced") for m in ("eager", "compile")]
    pairs += [("compile:deferred", "compile:deferred:graphs", "compile: CUDA graphs / none")]
    pairs += [("compile:deferred:graphs", "compile:deferred:graphs:nodet", "graphs: deterministic off / on")]
    for x, y, what in pairs:
        a, b = by.get(x), by.get(y)
        if a and b:
            print(f"{what} tokens/s {b['tokens_per_s'] / a['tokens_per_s']:.3f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"device": name, "torch": torch.__version__, "results": results}, indent=1)
        )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
