"""Our XLNet engine vs transformers.XLNetLMHeadModel: training-step tokens/s and peak memory on CPU.

    .venv/bin/python benchmarks/engine_vs_hf.py            # seq 128 x batch 8 and seq 512 x batch 4
    .venv/bin/python benchmarks/engine_vs_hf.py --quick    # smoke run (seq 128 only, few steps)

Same config for both (d_model 256, 4 layers, 4 heads, d_head 64, d_inner 1024, vocab 32000, dropout 0.1), the same
original-style PLM batch (P = L/6 targets, perm_mask from the factorisation-order algorithm with reuse_len = L/2,
target_mapping for HF, target_index for ours), the same loss (mean CE over targets computed outside the model), the
same AdamW (+ clip 1.0). No memory for either in the headline; "ours+mem" adds a carried memory of L/2 tokens
(realistic pretraining) for information. Each measurement runs in its own subprocess (honest peak RSS: VmHWM after
resetting it post-setup, minus VmRSS before the first step), and the runs are interleaved ours/HF/ours/HF so load
from other processes on a shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CFG = dict(vocab_size=32000, d_model=256, n_layer=4, n_head=4, d_head=64, d_inner=1024, dropout=0.1, dropatt=0.1)


def _status(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0  # MiB
    return float("nan")


def make_batch(B: int, L: int, seed: int = 0):
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    R, P = L // 2, max(1, round(L / 6))
    ids = rng.integers(9, CFG["vocab_size"], size=(B, L))
    ids[:, -1], ids[:, -2], ids[:, R + (L - R) // 2] = 3, 4, 4  # <cls>, <sep>, <sep>
    tt = np.zeros((B, L), dtype=np.int64)
    tt[:, R + (L - R) // 2 + 1: L - 1] = 1
    tt[:, -1] = 2
    perm = np.ones((B, L, L), dtype=np.float32)
    tidx = np.zeros((B, P), dtype=np.int64)

    def local_perm(masked, func):
        n = len(masked)
        rank = np.empty(n, dtype=np.int64)
        rank[rng.permutation(n)] = np.arange(n)
        rev = np.where(~masked & ~func, -1, rank)
        self_rev = np.where(masked & ~func, rev, rev + 1)
        return (self_rev[:, None] <= rev[None, :]) & (masked | func)[None, :]

    for b in range(B):
        func = (ids[b] == 3) | (ids[b] == 4)
        masked = np.zeros(L, dtype=bool)
        masked[np.sort(rng.choice(np.flatnonzero(~func), P, replace=False))] = True
        pm = np.ones((L, L), dtype=bool)
        pm[:R, :R] = local_perm(masked[:R], func[:R])
        pm[R:, R:] = local_perm(masked[R:], func[R:])
        pm[R:, :R] = False
        perm[b] = pm
        tidx[b] = np.flatnonzero(masked)
    t = torch.from_numpy
    labels = t(np.take_along_axis(ids, tidx, 1))
    tmap = torch.nn.functional.one_hot(t(tidx), L).float()
    return dict(input_ids=t(ids), token_type_ids=t(tt), perm_mask=t(perm), target_index=t(tidx),
                target_mapping=tmap, labels=labels)


def child(which: str, B: int, L: int, steps: int, warmup: int, impl: str, bf16: bool = False) -> dict:
    import torch

    torch.manual_seed(0)
    batch = make_batch(B, L)
    mem = None
    if which == "hf":
        import transformers

        hc = transformers.XLNetConfig(**{k: v for k, v in CFG.items() if k not in ("dropatt", "d_head")},
                                      mem_len=None, reuse_len=L // 2, bi_data=False, untie_r=True)
        model = transformers.XLNetLMHeadModel(hc)

        def fwd():  # HF's own loss path: CrossEntropyLoss over logits.view(-1, V) (mean over the B*P targets)
            out = model(batch["input_ids"], token_type_ids=batch["token_type_ids"], perm_mask=batch["perm_mask"],
                        target_mapping=batch["target_mapping"], labels=batch["labels"], use_mems=False)
            return out.loss
    else:
        from xlnetcli.model import XLNetLMHeadModel, named_config

        with_mem = which == "ours+mem"
        cfg = named_config("tiny", **CFG, mem_len=L // 2 if with_mem else 0, reuse_len=L // 2, bi_data=False,
                           attn_impl=impl)
        model = XLNetLMHeadModel(cfg)

        def fwd():  # our own loss path: the same mean cross entropy over the B*P targets
            nonlocal mem
            out = model(batch["input_ids"], token_type_ids=batch["token_type_ids"], perm_mask=batch["perm_mask"],
                        target_index=batch["target_index"], mems=mem, return_mems=with_mem, labels=batch["labels"])
            mem = out.mems
            return out.loss
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    n_params = sum(p.numel() for p in model.parameters())
    base = _status("VmRSS")  # after imports, model and batch: before any training memory exists
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = _status("VmHWM")
    steady = _status("VmRSS")  # between steps: params + AdamW state (grads are set to None)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    step()
    step_peak = _status("VmHWM") - steady
    sec = statistics.median(times)
    return {"which": which, "B": B, "L": L, "bf16": bf16, "step_s": sec, "tokens_per_s": B * L / sec,
            "peak_delta_mib": peak - base, "step_peak_mib": step_peak, "base_rss_mib": base,
            "steady_delta_mib": steady - base, "peak_rss_mib": peak, "params": n_params,
            "threads": torch.get_num_threads()}


def run_child(which, B, L, steps, warmup, impl, bf16=False):
    cmd = [sys.executable, __file__, "--child", which, "--B", str(B), "--L", str(L), "--steps", str(steps),
           "--warmup", str(warmup), "--impl", impl] + (["--bf16"] if bf16 else [])
    # big allocations via mmap so freed memory leaves RSS at once: the peak then tracks live tensors, not malloc caching
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode:
        raise SystemExit(f"{which} B={B} L={L} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median_run(runs: list[dict]) -> dict:
    """Median over rounds of each figure (tokens/s and memory separately)."""
    out = dict(runs[0])
    for key in ("tokens_per_s", "step_s", "peak_delta_mib", "step_peak_mib", "steady_delta_mib", "peak_rss_mib"):
        out[key] = statistics.median(r[key] for r in runs)
    out["tokens_per_s_all"] = [round(r["tokens_per_s"]) for r in runs]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: seq 128 only, 2 steps, 1 round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved ours/HF rounds per shape (median kept)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run (default 6 at 8x128, 3 at 4x512)")
    ap.add_argument("--impl", default="auto", help="our attention path: auto (= fused), fused, einsum, sdpa")
    ap.add_argument("--with-mem", action="store_true", help="also time ours with a carried memory of L/2")
    ap.add_argument("--bf16", action="store_true", help="also run both under CPU bf16 autocast (extra rows)")
    ap.add_argument("--shapes", default=None, help="e.g. 8x128,4x512 (batch x seq)")
    ap.add_argument("--json", default=None, help="write all measurements here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--B", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--L", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.B, a.L, a.steps or 6, a.warmup, a.impl, a.bf16)))
        return
    shapes = [(8, 128), (4, 512)]
    if a.shapes:
        shapes = [tuple(int(v) for v in sh.split("x")) for sh in a.shapes.split(",")]
    if a.quick:
        shapes = shapes[:1]
    rounds = 1 if a.quick else a.rounds
    whos = ["ours", "hf"] + (["ours+mem"] if a.with_mem else [])
    precisions = [False, True] if a.bf16 else [False]
    print(f"CPU: {os.cpu_count()} cores visible; load average {os.getloadavg()[0]:.2f}; interleaved runs; "
          f"median step time of each run, median over {rounds} round(s)", flush=True)
    rows, results = [], []
    for bf16 in precisions:
        for B, L in shapes:
            steps = 2 if a.quick else (a.steps or (6 if L <= 128 else 3))
            runs: dict[str, list] = {}
            for r in range(rounds):
                for who in whos:
                    res = run_child(who, B, L, steps, 1 if a.quick else 2, a.impl, bf16)
                    results.append(res)
                    runs.setdefault(who, []).append(res)
                    print(f"  round {r} {who:9s} {'bf16' if bf16 else 'fp32'} B={B} L={L}: "
                          f"{res['tokens_per_s']:8.0f} tok/s, peak +{res['peak_delta_mib']:.0f} MiB "
                          f"(RSS {res['peak_rss_mib']:.0f}), steady +{res['steady_delta_mib']:.0f} MiB, "
                          f"step working set +{res['step_peak_mib']:.0f} MiB, load {os.getloadavg()[0]:.2f}",
                          flush=True)
            med = {who: _median_run(v) for who, v in runs.items()}
            rows.append((B, L, bf16, med["ours"], med["hf"], med.get("ours+mem")))
    print()
    print("| shape | precision | HF tok/s | ours tok/s | speedup | HF peak MiB | ours peak MiB | peak ratio "
          "| HF step MiB | ours step MiB | step ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for B, L, bf16, ours, hf, om in rows:
        prec = "bf16" if bf16 else "fp32"
        print(f"| {B}x{L} | {prec} | {hf['tokens_per_s']:.0f} | {ours['tokens_per_s']:.0f} | "
              f"{ours['tokens_per_s'] / hf['tokens_per_s']:.2f}x | {hf['peak_delta_mib']:.0f} | "
              f"{ours['peak_delta_mib']:.0f} | {ours['peak_delta_mib'] / hf['peak_delta_mib']:.2f}x | "
              f"{hf['step_peak_mib']:.0f} | {ours['step_peak_mib']:.0f} | "
              f"{ours['step_peak_mib'] / hf['step_peak_mib']:.2f}x |")
        if om:
            print(f"| {B}x{L} ours+mem(L/2) | {prec} | | {om['tokens_per_s']:.0f} | | | {om['peak_delta_mib']:.0f} | "
                  f"| | {om['step_peak_mib']:.0f} | |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
