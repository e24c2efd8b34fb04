"""Our XLNet engine vs transformers.XLNetLMHeadModel: training-step tokens/s and memory on CPU.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_vs_hf.py --rounds 3 --bf16   # what BENCHMARKS.md shows
    .venv/bin/python benchmarks/engine_vs_hf.py --quick                               # smoke run (seq 128, 2 steps)

Same config for both (d_model 256, 4 layers, 4 heads, d_head 64, d_inner 1024, vocab 32000, dropout and attention
dropout 0.1), the same original-style PLM batch (P = L/6 targets, perm_mask from the factorisation-order algorithm with
reuse_len = L/2, segments A/B/<cls>; target_mapping for HF, target_index for ours), the same loss (mean cross entropy
over the B*P targets, each engine through its own `labels=` path; ours with need_hidden=False as pretraining uses it),
the same torch AdamW (lr 1e-4, wd 0.01, default implementation) and clip_grad_norm 1.0. No memory (mems) for either.

Memory, one process per engine (MALLOC_MMAP_THRESHOLD_=64 KiB so freed tensors leave RSS at once):
  peak         = VmHWM over warm-up and timed steps - VmRSS after imports, model and batch creation (so: AdamW state +
                 gradients + activations + temporaries; the same fixed part for both engines);
  step working = VmHWM during one more step - VmRSS between steps (params and AdamW state already resident): the
                 gradients, activations and temporaries of one training step.
Speed: ours and HF are built in ONE process and their steps alternate ours/HF/ours/HF, so load from other processes
on a shared machine hits both alike; the speedup is the median of the per-pair time ratios over all pairs of
--rounds processes ([min-max] shown); tokens/s are medians of the step times. --bf16 adds rows with both engines
under torch.autocast("cpu", bfloat16) (an extra, not the headline).
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
    tt[:, R + (L - R) // 2 + 1 : L - 1] = 1
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
    return dict(
        input_ids=t(ids),
        token_type_ids=t(tt),
        perm_mask=t(perm),
        target_index=t(tidx),
        target_mapping=tmap,
        labels=labels,
    )


def build(which: str, B: int, L: int, impl: str, bf16: bool, batch: dict):
    """(model, step) for "ours", "ours+mem" or "hf": one full training step (forward, loss, backward, clip, AdamW)."""
    import torch

    torch.manual_seed(0)
    mem = None
    if which == "hf":
        import transformers

        hc = transformers.XLNetConfig(
            **{k: v for k, v in CFG.items() if k not in ("dropatt", "d_head")},
            mem_len=None,
            reuse_len=L // 2,
            bi_data=False,
            untie_r=True,
        )
        model = transformers.XLNetLMHeadModel(hc)

        def fwd():  # HF's own loss path: CrossEntropyLoss over logits.view(-1, V) (mean over the B*P targets)
            out = model(
                batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                perm_mask=batch["perm_mask"],
                target_mapping=batch["target_mapping"],
                labels=batch["labels"],
                use_mems=False,
            )
            return out.loss
    else:
        from xlnetcli.model import XLNetLMHeadModel, named_config

        with_mem = which == "ours+mem"
        cfg = named_config(
            "tiny", **CFG, mem_len=L // 2 if with_mem else 0, reuse_len=L // 2, bi_data=False, attn_impl=impl
        )
        model = XLNetLMHeadModel(cfg)

        def fwd():  # our own loss path: the same mean cross entropy over the B*P targets
            nonlocal mem
            out = model(
                batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                perm_mask=batch["perm_mask"],
                target_index=batch["target_index"],
                mems=mem,
                return_mems=with_mem,
                labels=batch["labels"],
                need_hidden=False,
            )  # the loss needs only the query stream (as pretrain.py)
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

    return model, step


def paired(B: int, L: int, steps: int, warmup: int, impl: str, bf16: bool = False) -> dict:
    """Timing only: ours and HF in ONE process, steps alternated ours/HF/ours/HF..., so load from other processes on a
    shared machine hits both alike; the speedup is the median of the per-pair time ratios."""
    import torch

    batch = make_batch(B, L)
    (_, ours), (_, hf) = build("ours", B, L, impl, bf16, batch), build("hf", B, L, impl, bf16, batch)
    for _ in range(warmup):
        ours(), hf()
    t_o, t_h = [], []
    for _ in range(steps):
        for fn, acc in ((ours, t_o), (hf, t_h)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return {
        "which": "pair",
        "B": B,
        "L": L,
        "bf16": bf16,
        "ours_s": t_o,
        "hf_s": t_h,
        "threads": torch.get_num_threads(),
    }


def child(which: str, B: int, L: int, steps: int, warmup: int, impl: str, bf16: bool = False) -> dict:
    import torch

    batch = make_batch(B, L)
    model, step = build(which, B, L, impl, bf16, batch)
    n_params = sum(p.numel() for p in model.parameters())
    base = _status("VmRSS")  # after imports, model and batch: before any training memory exists
    with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM to the current RSS
        f.write("5")
    for _ in range(warmup):
        step()
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    peak = _status("VmHWM")
    steady = _status("VmRSS")  # between steps: params + AdamW state (grads are set to None)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    step()
    step_peak = _status("VmHWM") - steady
    sec = statistics.median(times)
    cpu_sec = statistics.median(cpu)
    return {
        "which": which,
        "B": B,
        "L": L,
        "bf16": bf16,
        "step_s": sec,
        "tokens_per_s": B * L / sec,
        "cpu_s": cpu_sec,
        "tokens_per_cpu_s": B * L / cpu_sec,
        "peak_delta_mib": peak - base,
        "step_peak_mib": step_peak,
        "base_rss_mib": base,
        "steady_delta_mib": steady - base,
        "peak_rss_mib": peak,
        "params": n_params,
        "threads": torch.get_num_threads(),
    }


def run_child(which, B, L, steps, warmup, impl, bf16=False):
    cmd = [
        sys.executable,
        __file__,
        "--child",
        which,
        "--B",
        str(B),
        "--L",
        str(L),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--impl",
        impl,
    ] + (["--bf16"] if bf16 else [])
    # big allocations via mmap so freed memory leaves RSS at once: the peak then tracks live tensors, not malloc caching
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if out.returncode:
        raise SystemExit(f"{which} B={B} L={L} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: seq 128 only, 2 steps, 1 round")
    ap.add_argument("--rounds", type=int, default=3, help="timing processes per shape (ours/HF alternate inside)")
    ap.add_argument(
        "--steps", type=int, default=None, help="timed step pairs per process (default 8 at L<=128, else 4)"
    )
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
    if a.child == "pair":
        print(json.dumps(paired(a.B, a.L, a.steps or 6, a.warmup, a.impl, a.bf16)))
        return
    if a.child:
        print(json.dumps(child(a.child, a.B, a.L, a.steps or 6, a.warmup, a.impl, a.bf16)))
        return
    shapes = [(8, 128), (4, 512)]
    if a.shapes:
        shapes = [tuple(int(v) for v in sh.split("x")) for sh in a.shapes.split(",")]
    if a.quick:
        shapes = shapes[:1]
    rounds = 1 if a.quick else a.rounds
    precisions = [False, True] if a.bf16 else [False]
    print(
        f"CPU: {os.cpu_count()} cores visible, torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}; "
        f"load average {os.getloadavg()[0]:.2f}. Memory: one process per engine. Speed: ours and HF alternate "
        f"step by step in one process, {rounds} process(es) per shape; speedup = median of per-pair time ratios",
        flush=True,
    )
    rows, results = [], []
    for bf16 in precisions:
        prec = "bf16" if bf16 else "fp32"
        for B, L in shapes:
            steps = 2 if a.quick else (a.steps or (8 if L <= 128 else 4))
            mem = {}
            for who in ["ours", "hf"] + (["ours+mem"] if a.with_mem else []):
                mem[who] = res = run_child(who, B, L, 2, 1, a.impl, bf16)
                results.append(res)
                print(
                    f"  memory {who:9s} {prec} B={B} L={L}: peak +{res['peak_delta_mib']:.0f} MiB "
                    f"(VmHWM {res['peak_rss_mib']:.0f}), steady +{res['steady_delta_mib']:.0f} MiB, "
                    f"step working set +{res['step_peak_mib']:.0f} MiB",
                    flush=True,
                )
            t_o, t_h = [], []
            for r in range(rounds):
                res = run_child("pair", B, L, steps, 1 if a.quick else 2, a.impl, bf16)
                results.append(res)
                t_o += res["ours_s"]
                t_h += res["hf_s"]
                ratios = [h / o for o, h in zip(res["ours_s"], res["hf_s"], strict=True)]
                print(
                    f"  speed  round {r} {prec} B={B} L={L}: ours {B * L / statistics.median(res['ours_s']):.0f} "
                    f"tok/s, HF {B * L / statistics.median(res['hf_s']):.0f} tok/s, per-pair speedups "
                    f"{' '.join(f'{x:.2f}' for x in ratios)}, load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
            ratios = [h / o for o, h in zip(t_o, t_h, strict=True)]
            rows.append(
                (
                    B,
                    L,
                    prec,
                    B * L / statistics.median(t_o),
                    B * L / statistics.median(t_h),
                    statistics.median(ratios),
                    min(ratios),
                    max(ratios),
                    mem,
                )
            )
    print()
    print(
        "| shape | precision | HF tok/s | ours tok/s | speedup (median [min-max] of pairs) | HF peak MiB "
        "| ours peak MiB | peak ratio | HF step working set MiB | ours step working set MiB | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for B, L, prec, ours_tps, hf_tps, sp, lo, hi, mem in rows:
        o, h = mem["ours"], mem["hf"]
        print(
            f"| {B}x{L} | {prec} | {hf_tps:.0f} | {ours_tps:.0f} | {sp:.2f}x [{lo:.2f}-{hi:.2f}] | "
            f"{h['peak_delta_mib']:.0f} | {o['peak_delta_mib']:.0f} | "
            f"{o['peak_delta_mib'] / h['peak_delta_mib']:.2f}x | {h['step_peak_mib']:.0f} | "
            f"{o['step_peak_mib']:.0f} | {o['step_peak_mib'] / h['step_peak_mib']:.2f}x |"
        )
        if "ours+mem" in mem:
            om = mem["ours+mem"]
            print(
                f"| {B}x{L} ours+mem(L/2) | {prec} | | | | | {om['peak_delta_mib']:.0f} | | | "
                f"{om['step_peak_mib']:.0f} | |"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
