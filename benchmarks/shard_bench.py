"""Shard throughput: `xlnet shard` with 1 and 2 workers vs SentencePiece's own encode speed, on >= 10 MB of real text.

The corpus is built at run time (never committed) from the docstrings of the installed site-packages (parsed with
`ast`, nothing imported) plus data/pydocs/corpus.txt: one docstring = one document, one paragraph = one line.

    python benchmarks/shard_bench.py            # 12 MB corpus, vocab 8000
    python benchmarks/shard_bench.py --quick    # 2 MB smoke run

Figures: MB/s (input bytes) and tokens/s for `shard_corpus` end to end (read, decode, normalise, encode, write, sha256)
with 1 and 2 workers; raw SentencePiece = `sp.encode(lines, num_threads=1)` on the same (non-empty, raw) lines, one
core. "per worker vs raw" = shard MB/s / workers / raw MB/s. Timings are the best of --repeats runs.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import sys
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from xlnetcli.config import load_config  # noqa: E402
from xlnetcli.data.shards.shard import ShardOptions, shard_corpus  # noqa: E402
from xlnetcli.data.tokenizer import Tokenizer, train_tokenizer  # noqa: E402


def _docstrings(path: Path):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 80:
                yield doc


def build_corpus(out: Path, target_bytes: int) -> int:
    """Write pydocs + site-packages docstrings (deduplicated, deterministic order) until target_bytes."""
    seen: set[int] = set()
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        pydocs = (ROOT / "data" / "pydocs" / "corpus.txt").read_text(encoding="utf-8")
        f.write(pydocs.rstrip("\n") + "\n\n")
        n += len(pydocs.encode())
        site = Path(sysconfig.get_paths()["purelib"])
        for path in sorted(site.rglob("*.py")):
            for doc in _docstrings(path):
                h = hash(doc)
                if h in seen:
                    continue
                seen.add(h)
                paras = [" ".join(p.split()) for p in doc.split("\n\n")]
                text = "\n".join(p for p in paras if p) + "\n\n"
                f.write(text)
                n += len(text.encode())
                if n >= target_bytes:
                    return n
    return n


def raw_sentencepiece(tok: Tokenizer, corpus: Path, repeats: int) -> tuple[float, float]:
    text = corpus.read_text(encoding="utf-8")
    lines = [ln for ln in text.split("\n") if ln.strip()]
    nbytes = corpus.stat().st_size
    best, best_cpu, ntok = float("inf"), float("inf"), 0
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        ntok = 0
        for i in range(0, len(lines), 20000):
            ntok += sum(map(len, tok.sp.encode(lines[i : i + 20000], out_type=int, num_threads=1)))
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    return nbytes / 1e6 / best, ntok / best, nbytes / 1e6 / best_cpu


def _cpu() -> tuple[float, float]:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 MB corpus, one repeat: a smoke run")
    ap.add_argument("--mb", type=float, default=12.0, help="corpus size in MB (>= 10 for the recorded figures)")
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    ap.add_argument("--corpus", type=Path, default=None, help="reuse this corpus file instead of building one")
    ap.add_argument("--tokenizer", type=Path, default=None, help="reuse this tokenizer instead of training one")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.repeats = 2.0, 1
    workers = [int(w) for w in args.workers.split(",")]
    os.environ["XLNET_NO_PROGRESS"] = "1"
    with tempfile.TemporaryDirectory(prefix="shard_bench.") as td:
        tmp = Path(td)
        t = time.perf_counter()
        if args.corpus:
            corpus, nbytes = args.corpus, args.corpus.stat().st_size
        else:
            corpus = tmp / "corpus.txt"
            nbytes = build_corpus(corpus, int(args.mb * 1e6))
        print(f"corpus: {nbytes / 1e6:.1f} MB of docstrings + pydocs ({time.perf_counter() - t:.0f} s to build)")
        t = time.perf_counter()
        if args.tokenizer:
            tok = Tokenizer.load(args.tokenizer)
        else:
            cfg = load_config(
                None,
                [
                    f"tokenizer.vocab_size={args.vocab}",
                    "tokenizer.character_coverage=0.9999",
                    "tokenizer.input_sentence_size=100000",
                ],
            )
            tok = train_tokenizer(cfg, [corpus], tmp / "tok", quiet=True)
        print(f"tokenizer: vocab {tok.vocab_size} ({time.perf_counter() - t:.0f} s to train)")
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        raw_mb, raw_tok, raw_cpu_mb = raw_sentencepiece(tok, corpus, args.repeats)
        rows = []
        held_out = load_config(None, ["data.valid_fraction=0.01"])
        for w in workers:
            best, cpu = None, (float("inf"), float("inf"))
            for r in range(args.repeats):
                p0, c0 = _cpu()
                s = shard_corpus(
                    held_out, [corpus], tmp / f"out{w}_{r}", tok, ShardOptions(shards=4, workers=w, quiet=True)
                )
                p1, c1 = _cpu()
                if best is None or s.seconds < best.seconds:
                    best = s
                if (p1 - p0) + (c1 - c0) < sum(cpu):
                    cpu = (p1 - p0, c1 - c0)
            assert best is not None
            total_cpu = sum(cpu)
            # CPU-time view (robust to other load): MB per CPU-second of the processes doing the work, and the
            # speedup 2 idle cores would give: 1-worker CPU time / the busiest process's share with w workers.
            cores = os.cpu_count() or 1
            busiest = max(cpu[0], cpu[1] / w, total_cpu / min(cores, w + 1)) if w > 1 else total_cpu
            rows.append(
                {
                    "workers": w,
                    "seconds": best.seconds,
                    "mb_per_s": best.mb_per_s,
                    "tokens_per_s": best.tokens_per_s,
                    "per_worker_vs_raw": best.mb_per_s / w / raw_mb,
                    "cpu_parent_s": cpu[0],
                    "cpu_workers_s": cpu[1],
                    "cpu_mb_per_s": nbytes / 1e6 / total_cpu,
                    "busiest_s": busiest,
                }
            )
        base = rows[0]["mb_per_s"]
        print(f"\nload average at start: {load:.2f} on {os.cpu_count()} cores (other processes share the CPU)\n")
        print("| run | MB/s | tokens/s | speedup | per worker vs raw SentencePiece |")
        print("|---|---|---|---|---|")
        print(f"| raw SentencePiece encode, 1 thread | {raw_mb:.2f} | {raw_tok / 1e3:.0f}K | - | 1.00 |")
        for r in rows:
            print(
                f"| xlnet shard, {r['workers']} worker(s) | {r['mb_per_s']:.2f} | {r['tokens_per_s'] / 1e3:.0f}K | "
                f"{r['mb_per_s'] / base:.2f}x | {r['per_worker_vs_raw']:.2f} |"
            )
        print("\nCPU-time view (less sensitive to other processes on the machine):\n")
        print("| run | CPU s parent | CPU s workers | MB per CPU-second | vs raw | speedup bound on idle cores |")
        print("|---|---|---|---|---|---|")
        print(f"| raw SentencePiece | {nbytes / 1e6 / raw_cpu_mb:.2f} | - | {raw_cpu_mb:.2f} | 1.00 | - |")
        t1 = rows[0]["cpu_parent_s"] + rows[0]["cpu_workers_s"]
        for r in rows:
            print(
                f"| shard, {r['workers']} worker(s) | {r['cpu_parent_s']:.2f} | {r['cpu_workers_s']:.2f} | "
                f"{r['cpu_mb_per_s']:.2f} | {r['cpu_mb_per_s'] / raw_cpu_mb:.2f} | {t1 / r['busiest_s']:.2f}x |"
            )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "corpus_mb": nbytes / 1e6,
                        "vocab": tok.vocab_size,
                        "load": load,
                        "raw": {"mb_per_s": raw_mb, "tokens_per_s": raw_tok, "cpu_mb_per_s": raw_cpu_mb},
                        "shard": rows,
                    },
                    indent=2,
                )
                + "\n"
            )


if __name__ == "__main__":
    main()
