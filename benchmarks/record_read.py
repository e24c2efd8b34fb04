"""Records that reference the shards (format 2) against records that copied the tokens (format 1): bytes on disk per
corpus token per pass, and read throughput through `PretrainStream`, side by side in one process.

    python benchmarks/record_read.py            # 12 MB corpus, tiny preset and base's layout, 5 interleaved repeats
    python benchmarks/record_read.py --quick    # 2 MB smoke run, 1 repeat
    python benchmarks/record_read.py --layouts base --repeats 9

The corpus is built at run time (never committed; preprocess_vs_hf.build_corpus: the bundled PSF docs plus installed
site-packages docstrings, repeated to --mb), tokenized (8000 pieces), sharded into 4 train shards, preprocessed with
each layout (tiny: L 128, R 64; base: L 512, R 256; both bi_data, one pass, global batch = micro-batch = B).

Format 1's layout is built in the same run: a [G, S, L] token memmap (the tokens of every example, written from the
format-2 reader, which tests/data/test_record_refs.py holds equal to what format 1 stored) next to the same alen and
target bits, read as `PretrainStream.batch` read it before (``p.tokens[g, s]``, a contiguous slice of rows). Both
read every micro-batch of the pass through the same `permutation_batch(dense=False)` (what training consumes),
alternating every 32 micro-batches so that both see the same load on a shared machine; wall and CPU time. Also
given: the token read alone (format 1's copy of a slice of its token memmap against `PassRecords.examples`, which also
unpacks the target bits), CPU microseconds per micro-batch. Bytes: the pass files of each format over the split's
corpus tokens (the shards, 2 bytes per token here, come on top of both).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from xlnetcli.config import load_config  # noqa: E402
from xlnetcli.data.records.preprocess import preprocess  # noqa: E402
from xlnetcli.data.records.stream import PretrainStream, permutation_batch  # noqa: E402
from xlnetcli.data.shards.shard import ShardOptions, shard_corpus  # noqa: E402
from xlnetcli.data.tokenizer import train_tokenizer  # noqa: E402

LAYOUTS = {"tiny": ("tiny", 128, 64, 21), "base": ("base", 512, 256, 85)}


class TodayStream(PretrainStream):
    """`PretrainStream` reading format 1's layout as batch() did: tokens, alen and target bits from np.memmap's of
    [G, S, L], [G, S] and [G, S, L/8] per pass (np.load(mmap_mode="r"), as open_records returned them)."""

    def __init__(self, tokens: list[Path], *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        files = self.meta["splits"][self.split]["files"]
        self.old = [
            (
                np.load(t, mmap_mode="r"),
                *(np.load(self.records_dir / f"{f}.{n}.npy", mmap_mode="r") for n in ("alen", "masked")),
            )
            for t, f in zip(tokens, files, strict=True)
        ]

    def batch(self, step: int, micro: int) -> dict[str, Any]:
        tokens, alen, packed = self.old[(step // self.steps_per_pass) % len(self.passes)]
        s = step % self.steps_per_pass
        rows = self.rows(micro)
        g = slice(int(rows[0]), int(rows[-1]) + 1)
        ids = np.asarray(tokens[g, s])
        masked = np.unpackbits(packed[g, s], axis=-1, count=self.meta["seq_len"], bitorder="little").view(bool)
        b = permutation_batch(
            ids, masked, np.asarray(alen[g, s]), rows, step, self.meta, self.seed, self.dense, self.objective
        )
        b["micro_index"] = micro
        b["step"] = step
        return b


def build_old_tokens(rec: Path, out: Path) -> list[Path]:
    """Format 1's token files of the train split: [G, S, L] per pass, filled from the format-2 reader."""
    from xlnetcli.data.records.format import open_records

    meta, passes = open_records(rec, "train")
    out.mkdir()
    arrays = []
    for k, p in enumerate(passes):
        G, S = p.alen.shape
        path = out / f"pass_{k:03d}.tokens.npy"
        m = np.lib.format.open_memmap(path, "w+", meta["dtype"], (G, S, meta["seq_len"]))
        rows = np.arange(G)
        for s in range(S):
            m[:, s] = p.examples(rows, s)[0]
        m.flush()
        del m
        arrays.append(path)
    return arrays


CHUNK = 32  # micro-batches timed in a row before switching format: both see the same load, minute by minute


def read_pass(old: PretrainStream, new: PretrainStream) -> dict[str, float]:
    """Every micro-batch of the pass read by both streams (``stream.batch``, what iterating with prefetch=0 calls),
    alternating formats every CHUNK micro-batches (and which goes first): wall and CPU seconds of each."""
    positions = list(old._positions(0, 0))
    out = dict.fromkeys(("old_wall", "old_cpu", "new_wall", "new_cpu"), 0.0)
    for c0 in range(0, len(positions), CHUNK):
        chunk = positions[c0 : c0 + CHUNK]
        pair = (("old", old), ("new", new)) if (c0 // CHUNK) % 2 else (("new", new), ("old", old))
        for label, stream in pair:
            t, c = time.perf_counter(), time.process_time()
            for st, mi in chunk:
                stream.batch(st, mi)
            out[f"{label}_wall"] += time.perf_counter() - t
            out[f"{label}_cpu"] += time.process_time() - c
    out["examples"] = len(positions) * old.micro_batch_size
    return out


def read_tokens(passes: list, old_files: list[Path] | None, B: int) -> tuple[int, float, float]:
    """The token read alone over the pass: format 1's slice, or format 2's gather (``old_files`` None)."""
    old = [np.load(f, mmap_mode="r") for f in old_files or []]
    n, t, c = 0, time.perf_counter(), time.process_time()
    for k, p in enumerate(passes):
        G, S = p.alen.shape
        for s in range(S):
            for g0 in range(0, G, B):
                if not old:
                    p.examples(np.arange(g0, g0 + B), s)
                else:
                    np.array(old[k][g0 : g0 + B, s])
                n += B
    return n, time.perf_counter() - t, time.process_time() - c


def measure(d: Path, name: str, B: int, repeats: int) -> dict[str, Any]:
    from xlnetcli.data.records.format import open_records

    preset, L, R, P = LAYOUTS[name]
    cfg = load_config(
        preset,
        [
            "tokenizer.vocab_size=8000",
            "model.vocab_size=8000",
            f"data.seq_len={L}",
            f"model.reuse_len={R}",
            f"data.num_predict={P}",
            f"train.global_batch_size={B}",
            f"train.micro_batch_size={B}",
            "model.bi_data=true",
            "data.passes=1",
            "data.valid_fraction=0",
        ],
    )
    rec = d / f"rec_{name}"
    t = time.perf_counter()
    meta = preprocess(cfg, d / "shards", rec, quiet=True)
    pre_s = time.perf_counter() - t
    old = build_old_tokens(rec, d / f"old_{name}")
    info = meta["splits"]["train"]
    corpus = info["tokens"] * info["passes"]
    new_bytes = sum(f.stat().st_size for f in (rec / "train").glob("pass_*.npy"))
    old_bytes = new_bytes - sum(f.stat().st_size for f in (rec / "train").glob("pass_*.bstart.npy"))
    old_bytes += sum(f.stat().st_size for f in (d / f"old_{name}").glob("*.npy"))

    def stream(cls: type, *extra: Any) -> PretrainStream:
        return cls(*extra, rec, "train", 0, 1, B, seed=1, dense=False, prefetch=0, loop=False)

    _, passes = open_records(rec, "train")
    old_stream, new_stream = stream(TodayStream, old), stream(PretrainStream)
    runs: list[dict[str, float]] = []
    for _ in range(repeats):
        r = read_pass(old_stream, new_stream)
        row: dict[str, float] = {}
        for label in ("old", "new"):
            row[f"{label}_ex_s"] = r["examples"] / r[f"{label}_wall"]
            row[f"{label}_cpu_ex_s"] = r["examples"] / r[f"{label}_cpu"]
        for label, files in (("old", old), ("new", None)):
            n, _, cpu = read_tokens(passes, files, B)
            row[f"{label}_tokens_us"] = cpu / n * B * 1e6
        row["ratio"] = row["new_ex_s"] / row["old_ex_s"]
        row["cpu_ratio"] = row["new_cpu_ex_s"] / row["old_cpu_ex_s"]
        runs.append(row)
        print(json.dumps({name: {k: round(v, 3) for k, v in row.items()}}), file=sys.stderr)
    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    return {
        "seq_len": L,
        "reuse_len": R,
        "batch": B,
        "examples_per_pass": info["examples"],
        "corpus_tokens": info["tokens"],
        "preprocess_s": round(pre_s, 2),
        "bytes_per_token_per_pass": {
            "format 1": round(old_bytes / corpus, 3),
            "format 2": round(new_bytes / corpus, 3),
        },
        "read ex/s, wall (PretrainStream, dense=False; median)": {
            "format 1": round(med["old_ex_s"]),
            "format 2": round(med["new_ex_s"]),
            "format 2 / format 1": round(med["ratio"], 3),
        },
        "read ex/s per CPU second (median)": {
            "format 1": round(med["old_cpu_ex_s"]),
            "format 2": round(med["new_cpu_ex_s"]),
            "format 2 / format 1": round(med["cpu_ratio"], 3),
        },
        "per_repeat_ratio (wall, CPU)": [(round(r["ratio"], 3), round(r["cpu_ratio"], 3)) for r in runs],
        "token read alone, CPU us per micro-batch (median)": {
            "format 1 (slice of the token memmap)": round(med["old_tokens_us"], 1),
            "format 2 (PassRecords.examples: from the shards)": round(med["new_tokens_us"], 1),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mb", type=float, default=None, help="corpus size in MB (default 12; --quick 2)")
    ap.add_argument("--batch", type=int, default=16, help="micro-batch (and global batch) size")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 5; --quick 1)")
    ap.add_argument("--layouts", default="tiny,base", help="comma-separated: tiny, base")
    args = ap.parse_args()
    mb = args.mb or (2.0 if args.quick else 12.0)
    repeats = args.repeats or (1 if args.quick else 5)

    import torch
    from preprocess_vs_hf import build_corpus

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        train_tokenizer(
            load_config(None, ["tokenizer.vocab_size=8000"]),
            [str(ROOT / "data" / "pydocs" / "corpus.txt")],
            d / "tok",
            quiet=True,
        )
        size = build_corpus(d / "corpus.txt", mb)
        shard_corpus(
            load_config(None, ["data.valid_fraction=0"]),
            [str(d / "corpus.txt")],
            d / "shards",
            d / "tok",
            ShardOptions(shards=4, quiet=True),
        )
        res = {"corpus_mb": round(size / 1e6, 1), "repeats": repeats}
        for name in args.layouts.split(","):
            res[name] = measure(d, name, args.batch, repeats)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
