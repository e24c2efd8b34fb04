"""Pretraining data at seq 512: our preprocessing + online permutation vs transformers' PLM collator, and the peak
memory of preprocessing as the corpus grows.

    python benchmarks/preprocess_vs_hf.py            # 12 MB corpus (built at run time, never committed)
    python benchmarks/preprocess_vs_hf.py --quick    # smoke run (~2 MB)

Ours: `preprocess` (A/B split, span masking; records on disk) then `PretrainStream` reading micro-batches and sampling
the factorisation order (perm_mask, target_mapping, targets) — full semantics. Reported twice: with dense perm_mask
[B,L,L] and target_mapping [B,P,L] built on the CPU, and with the O(B·L) rank vectors only (what a GPU run ships; the
[B,L,L] mask is one comparison on the device). HF: `DataCollatorForPermutationLanguageModeling` on the same token
ids, batches of the same size (its perm_mask and target_mapping are [B,L,L]).
Combined examples/s = 1 / (1/preprocess rate + 1/stream rate): every example is preprocessed once and read once.
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

    return load_config(ROOT / "configs" / "base.yaml", [
        f"tokenizer.vocab_size={vocab}", f"model.vocab_size={vocab}", f"train.global_batch_size={batch}",
        f"train.micro_batch_size={batch}", "data.valid_fraction=0.0",
    ])


def child_preprocess(shards: str, out: str, vocab: int, batch: int) -> None:
    """Run in a subprocess: preprocess and report time and peak RSS."""
    from xlnetcli.preprocess import preprocess

    t = time.perf_counter()
    meta = preprocess(shards, out, cfg_for(vocab, batch), quiet=True)
    dt = time.perf_counter() - t
    print(json.dumps({"seconds": dt, "examples": meta["splits"]["train"]["examples"],
                      "tokens": meta["splits"]["train"]["tokens"],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(shards: Path, out: Path, vocab: int, batch: int) -> dict:
    code = ("import sys; sys.path.insert(0, %r); from preprocess_vs_hf import child_preprocess; "
            "child_preprocess(%r, %r, %d, %d)") % (str(Path(__file__).parent), str(shards), str(out), vocab, batch)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--mb", type=float, default=None, help="corpus size in MB (default 12; --quick 2)")
    ap.add_argument("--batch", type=int, default=16, help="examples per batch (both sides)")
    ap.add_argument("--seconds", type=float, default=None, help="time budget per stream measurement")
    args = ap.parse_args()
    mb = args.mb or (2.0 if args.quick else 12.0)
    secs = args.seconds or (2.0 if args.quick else 8.0)
    B, L = args.batch, 512

    import numpy as np
    import torch
    from transformers import DataCollatorForPermutationLanguageModeling

    from xlnetcli.config import TokenizerConfig
    from xlnetcli.data import PretrainStream
    from xlnetcli.shard import shard_corpus
    from xlnetcli.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        vocab = 8000
        train_tokenizer([str(ROOT / "data" / "pydocs" / "corpus.txt")], d / "tok", TokenizerConfig(vocab_size=vocab),
                        quiet=True)
        sizes = {}
        for name, frac in (("half", 0.5), ("full", 1.0)):
            corpus = d / f"corpus_{name}.txt"
            sizes[name] = build_corpus(corpus, mb * frac)
            shard_corpus([str(corpus)], d / f"shards_{name}", d / "tok", shards=4, quiet=True)
        mem = {name: run_child(d / f"shards_{name}", d / f"rec_{name}", vocab, B) for name in ("half", "full")}
        pre = mem["full"]
        pre_rate = pre["examples"] / pre["seconds"]

        def stream_rate(dense: bool) -> float:
            s = PretrainStream(d / "rec_full", "train", 0, 1, B, seed=1, dense=dense, prefetch=0)
            it = iter(s)
            next(it)
            n, t = 0, time.perf_counter()
            while time.perf_counter() - t < secs:
                next(it)
                n += B
            return n / (time.perf_counter() - t)

        ours_dense, ours_ranks = stream_rate(True), stream_rate(False)

        class _Tok:  # what the collator reads from a tokenizer
            mask_token, mask_token_id, pad_token_id, pad_token, _pad_token = "<mask>", 6, 5, "<pad>", "<pad>"

            def get_special_tokens_mask(self, ids, already_has_special_tokens=True):
                return [1 if i in (3, 4) else 0 for i in ids]

            def __len__(self):
                return vocab

        coll = DataCollatorForPermutationLanguageModeling(tokenizer=_Tok(), plm_probability=1 / 6, max_span_length=5)
        rec = np.load(d / "rec_full" / "train" / "pass_000.tokens.npy", mmap_mode="r")
        examples = [torch.from_numpy(np.array(rec[g % rec.shape[0], g // rec.shape[0]], dtype=np.int64))
                    for g in range(min(256, rec.shape[0] * rec.shape[1]))]
        coll(examples[:B])
        n, t, k = 0, time.perf_counter(), 0
        while time.perf_counter() - t < secs:
            batch = [examples[(k + j) % len(examples)] for j in range(B)]
            coll(batch)
            k, n = k + B, n + B
        hf = n / (time.perf_counter() - t)

    comb = lambda s: 1.0 / (1.0 / pre_rate + 1.0 / s)  # noqa: E731
    res = {
        "seq_len": L, "batch": B, "corpus_mb": round(sizes["full"] / 1e6, 1),
        "preprocess_examples_per_s": round(pre_rate), "stream_dense_examples_per_s": round(ours_dense),
        "stream_ranks_examples_per_s": round(ours_ranks),
        "ours_dense_examples_per_s": round(comb(ours_dense)), "ours_ranks_examples_per_s": round(comb(ours_ranks)),
        "hf_collator_examples_per_s": round(hf),
        "speedup_dense": round(comb(ours_dense) / hf, 1), "speedup_ranks": round(comb(ours_ranks) / hf, 1),
        "peak_rss_mb": {f"{sizes[k] / 1e6:.1f} MB corpus ({mem[k]['tokens']} tokens)": round(mem[k]["peak_rss_mb"])
                        for k in ("half", "full")},
    }
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
