"""Pretraining data at seq 512: our preprocessing + online permutation vs transformers' PLM collator, and the peak
memory of preprocessing as the corpus grows.

    python benchmarks/preprocess_vs_hf.py            # 12 MB corpus (built at run time, never committed), 3 repeats
    python benchmarks/preprocess_vs_hf.py --quick    # smoke run (~2 MB, 1 repeat)

Definition (both sides start from token ids; tokenising and sharding are not counted):
- ours = N / (T_pre + T_read): T_pre is the wall time of `preprocess()` (A/B split, span masking, records written
  to disk; fresh process, one worker) building N examples from the shards, T_read the wall time of reading all N
  back through `PretrainStream(dense=False)` in micro-batches of B (factorisation order sampled online: the two O(B·L)
  rank vectors, targets, target index, segment ids — full semantics; the [B,L,L] perm_mask is one comparison the
  model does on its device, see data.perm_mask_from_ranks).
- HF = examples/s of `DataCollatorForPermutationLanguageModeling` building batches of B from pre-tokenised
  512-token examples (its span masking, [B,L,L] perm_mask and [B,P=L,L] target_mapping on the CPU).
Each repeat measures ours then HF back to back (same load); the table gives the median of the per-repeat figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_corpus(path: Path, mb: float) -> int:
    """Real text: the bundled PSF docs plus installed site-packages docstrings, repeated to ``mb`` MB."""
    import ast
    import sysconfig

    parts = [(ROOT / "data" / "pydocs" / "corpus.txt").read_text(encoding="utf-8")]
    site = Path(sysconfig.get_paths()["purelib"])
    size = len(parts[0])
    for f in sorted(site.glob("*/**/*.py"))[:3000]:
        if size > 6e6:
            break
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    parts.append(doc.strip() + "\n")
                    size += len(doc)
    text = "\n".join(parts) + "\n\n"
    want = int(mb * 1e6)
    with open(path, "w", encoding="utf-8") as f:
        written = 0
        while written < want:
            piece = text[: want - written]
            f.write(piece)
            written += len(piece)
    return path.stat().st_size


def cfg_for(vocab: int, batch: int):
    from xlnetcli.config import load_config

    return load_config(
        ROOT / "configs" / "base.yaml",
        [
            f"tokenizer.vocab_size={vocab}",
            f"model.vocab_size={vocab}",
            f"train.global_batch_size={batch}",
            f"train.micro_batch_size={batch}",
            "data.valid_fraction=0.0",
        ],
    )


def child_preprocess(shards: str, out: str, vocab: int, batch: int, workers: int = 1) -> None:
    """Run in a subprocess: preprocess and report time and peak RSS."""
    from xlnetcli.data.records.preprocess import preprocess

    cfg = cfg_for(vocab, batch)
    base = _vm_hwm_mb()
    t = time.perf_counter()
    meta = preprocess(cfg, shards, out, quiet=True, workers=workers)
    dt = time.perf_counter() - t
    print(
        json.dumps(
            {
                "seconds": dt,
                "examples": meta["splits"]["train"]["examples"],
                "tokens": meta["splits"]["train"]["tokens"],
                "rss_before_mb": base,
                "peak_rss_mb": _vm_hwm_mb(),
            }
        )
    )


def _vm_hwm_mb() -> float:
    """Peak RSS of this process (VmHWM). Not ru_maxrss: Linux carries that over from the parent across exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(shards: Path, out: Path, vocab: int, batch: int, workers: int = 1) -> dict:
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"from preprocess_vs_hf import child_preprocess; "
        f"child_preprocess({str(shards)!r}, {str(out)!r}, {vocab}, {batch}, {workers})"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mb", type=float, default=None, help="corpus size in MB (default 12; --quick 2)")
    ap.add_argument("--batch", type=int, default=16, help="examples per batch (both sides)")
    ap.add_argument("--seconds", type=float, default=None, help="time budget of each HF measurement")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3; --quick 1)")
    args = ap.parse_args()
    mb = args.mb or (2.0 if args.quick else 12.0)
    secs = args.seconds or (2.0 if args.quick else 6.0)
    repeats = args.repeats or (1 if args.quick else 3)
    B, L = args.batch, 512

    import numpy as np
    import torch
    from transformers import DataCollatorForPermutationLanguageModeling

    from xlnetcli.config import load_config
    from xlnetcli.data.records.format import open_records
    from xlnetcli.data.records.stream import PretrainStream
    from xlnetcli.data.shards.shard import ShardOptions, shard_corpus
    from xlnetcli.data.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        vocab = 8000
        train_tokenizer(
            load_config(None, [f"tokenizer.vocab_size={vocab}"]),
            [str(ROOT / "data" / "pydocs" / "corpus.txt")],
            d / "tok",
            quiet=True,
        )
        none_held_out = load_config(None, ["data.valid_fraction=0"])
        sizes = {}
        for name, frac in (("quarter", 0.25), ("half", 0.5), ("full", 1.0)):
            corpus = d / f"corpus_{name}.txt"
            sizes[name] = build_corpus(corpus, mb * frac)
            shard_corpus(
                none_held_out, [str(corpus)], d / f"shards_{name}", d / "tok", ShardOptions(shards=4, quiet=True)
            )
        mem = {name: run_child(d / f"shards_{name}", d / f"rec_{name}", vocab, B) for name in ("quarter", "half")}

        def read_all(dense: bool, limit: float | None = None) -> tuple[int, float]:
            s = PretrainStream(d / "rec_full", "train", 0, 1, B, seed=1, dense=dense, prefetch=0, loop=False)
            n, t = 0, time.perf_counter()
            for _ in s:
                n += B
                if limit is not None and time.perf_counter() - t > limit:
                    break
            return n, time.perf_counter() - t

        class _Tok:  # what the collator reads from a tokenizer
            mask_token, mask_token_id, pad_token_id, pad_token, _pad_token = "<mask>", 6, 5, "<pad>", "<pad>"

            def get_special_tokens_mask(self, ids, already_has_special_tokens=True):
                return [1 if i in (3, 4) else 0 for i in ids]

            def __len__(self):
                return vocab

        coll = DataCollatorForPermutationLanguageModeling(tokenizer=_Tok(), plm_probability=1 / 6, max_span_length=5)

        def hf_rate(examples: list) -> float:
            coll(examples[:B])
            n, t, k = 0, time.perf_counter(), 0
            while time.perf_counter() - t < secs:
                coll([examples[(k + j) % len(examples)] for j in range(B)])
                k, n = k + B, n + B
            return n / (time.perf_counter() - t)

        runs = []
        for rep in range(repeats):
            pre = run_child(d / "shards_full", d / "rec_full", vocab, B)
            n_read, t_read = read_all(False)
            assert n_read == pre["examples"], (n_read, pre["examples"])
            if rep == 0:
                mem["full"] = pre
                _, (p0, *_) = open_records(d / "rec_full", "train")
                G = p0.alen.shape[0]
                examples = [
                    torch.from_numpy(p0.examples(np.array([g % G]), g // G)[0][0].astype(np.int64))
                    for g in range(min(256, G * p0.alen.shape[1]))
                ]
            hf = hf_rate(examples)
            pre2 = run_child(d / "shards_full", d / "rec_w2", vocab, B, workers=2)
            n_dense, t_dense = read_all(True, limit=min(secs, 3.0))
            N = pre["examples"]
            runs.append(
                {
                    "examples": N,
                    "preprocess_s": pre["seconds"],
                    "read_s": t_read,
                    "preprocess_ex_s": N / pre["seconds"],
                    "read_ex_s": N / t_read,
                    "ours_ex_s": N / (pre["seconds"] + t_read),
                    "hf_ex_s": hf,
                    "speedup": N / (pre["seconds"] + t_read) / hf,
                    "ours_2workers_ex_s": N / (pre2["seconds"] + t_read),
                    "speedup_2workers": N / (pre2["seconds"] + t_read) / hf,
                    "read_dense_ex_s": n_dense / t_dense,
                }
            )
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in runs[-1].items()}),
                file=sys.stderr,
            )

    med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    res = {
        "definition": "ours = N / (preprocess wall time + reading all N through PretrainStream(dense=False)); "
        "HF = DataCollatorForPermutationLanguageModeling examples/s on batches of the same size from "
        "pre-tokenised examples; median of interleaved repeats",
        "seq_len": L,
        "batch": B,
        "corpus_mb": round(sizes["full"] / 1e6, 1),
        "examples": runs[0]["examples"],
        "repeats": repeats,
        **{
            k: round(v, 1)
            if k.startswith("speedup")
            else round(v)
            if not k.endswith("_s") or k.endswith("ex_s")
            else round(v, 3)
            for k, v in med.items()
            if k != "examples"
        },
        "per_repeat_speedup": [round(r["speedup"], 1) for r in runs],
        "peak_rss_mb (preprocess process, one worker; before -> peak)": {
            f"{sizes[k] / 1e6:.1f} MB corpus ({mem[k]['tokens']} tokens)": (
                f"{mem[k]['rss_before_mb']:.0f} -> {mem[k]['peak_rss_mb']:.0f}"
            )
            for k in ("quarter", "half", "full")
        },
    }
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
