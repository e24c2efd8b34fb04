"""XLNet's relative attention core alone on a GPU: attn_impl triton (model/triton_attention.py) against the other
kernels on the same inputs, at Base's pretraining shapes, in one run.

    python benchmarks/gpu_attention.py --json gpu_attention.json          # the BENCHMARKS.md rows
    python benchmarks/gpu_attention.py --tiles 32x4,32x8,64x8             # also time other tile sizes x warps
    TRITON_INTERPRET=1 python benchmarks/gpu_attention.py --smoke         # CPU check of the script, no figures
    ncu -k regex:_fwd_kernel python benchmarks/gpu_attention.py --once ""  # two calls only, for a profiler

Inputs as one layer of `xlnet pretrain` sees them (configs/base.yaml): micro-batch 16, 12 heads of 64, seq L 512,
memory 384 (K = 896 keys), 85 query-stream rows stacked under the 512 content rows (N = 597), bi_data's two position
tables (R = 1408), segments, a mask with about half the keys masked, attention dropout 0.1, q/k/v/kr in bf16 and
the biases in fp32 under bf16 autocast. A row times forward (no grad) and forward + backward (the gradient of every
input) with CUDA events: median of --steps calls after 3 warm-up calls. TFLOP/s count the useful matrix work
(model/flops.py's convention: 3 products of N x K x D per head forward, 3x that for forward + backward).

Checks, printed before the timings: the triton kernel in bf16 against the einsum kernel in fp32 on the same inputs
(dropout off): relative error ||a - b|| / ||b|| of the output and of each gradient; two identical triton calls with
dropout give bit-identical gradients (deterministic backward).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch

NAMES = ("q", "k", "v", "kr", "r_w", "r_r", "r_s", "seg_embed")


def make_inputs(B, H, D, L, M, P, G, dev, seed=0):
    """Random attention inputs and their layout (kernels.AttnLayout), as one pretraining layer sees them."""
    from xlnetcli.model.kernels import AttnLayout

    g = torch.Generator().manual_seed(seed)
    N, K = L + P, M + L
    mk = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    ins = [mk(B, H, N, D), mk(B, H, K, D), mk(B, H, K, D), mk(G, H, K + L, D)]
    ins += [mk(H, D) * 0.1, mk(H, D) * 0.1, mk(H, D) * 0.1, mk(2, H, D) * 0.1]
    rows = torch.cat([torch.arange(L).expand(B, L), torch.randint(0, L, (B, P), generator=g)], 1)
    rel = (L - rows)[:, None, :, None] + torch.arange(K)
    same = torch.rand(B, 1, N, K, generator=g) > 0.5
    mask = torch.rand(B, 1, N, K, generator=g) > 0.5
    mask[:, :, :, :M] = False  # memory is visible to every row, as in pretraining
    on = lambda t: t.to(dev)  # noqa: E731
    return [on(t) for t in ins], AttnLayout(L, on(rows), on(rel), on(same), on(mask))


def leaves(ins, dtype) -> list:
    """The inputs as leaves with gradients: q, k, v, kr in ``dtype`` (activations), the biases and seg_embed in fp32
    (parameters, as under autocast)."""
    return [t.to(dtype if i < 4 else torch.float32).requires_grad_(True) for i, t in enumerate(ins)]


def call(impl: str, ins, layout, p_drop: float, compiled=None):
    """One attention call of ``impl`` (einsum / sdpa / fused / flex / triton, or compiled: a torch.compile'd einsum)."""
    import dataclasses

    from xlnetcli.model.kernels import additive_mask, relative_attention

    q, k, v, kr, r_w, r_r, r_s, seg = ins
    base = "einsum" if impl == "einsum:compile" else impl
    lay = layout
    if base in ("einsum", "sdpa"):
        lay = dataclasses.replace(layout, mask_bias=additive_mask(layout.mask, base, q.dtype))
    fn = compiled or relative_attention
    return fn(q, k, v, kr, (r_w, r_r, r_s), seg, lay, p_drop, p_drop > 0, base)


def timed(fn, steps: int, dev) -> float:
    """Median seconds of fn() over ``steps`` calls after 3 warm-up calls (CUDA events; wall clock on CPU)."""
    import time

    for _ in range(3):
        fn()
    ts = []
    for _ in range(steps):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(ins, layout, dev) -> dict:
    """triton in bf16 against einsum in fp32 (dropout off), and triton's backward run twice with dropout. On CPU
    (the interpreter, whose tl.dot on bf16 is unreliable) fp16 without autocast instead of bf16."""
    go = torch.randn(ins[0].shape, generator=torch.Generator().manual_seed(1)).to(dev)
    low = torch.bfloat16 if dev.type == "cuda" else torch.float16
    res = {}
    outs = {}
    for impl, dtype in (("einsum", torch.float32), ("triton", low)):
        xs = leaves(ins, dtype)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == low and dev.type == "cuda"):
            out = call(impl, xs, layout, 0.0)
        outs[impl] = (out, torch.autograd.grad(out, xs, go.to(out.dtype)))
    (oe, ge), (ot, gt) = outs["einsum"], outs["triton"]
    res["out"] = rel_err(ot, oe)
    for name, a, b in zip(NAMES, gt, ge, strict=True):
        res[name] = rel_err(a, b)
    grads = []
    for _ in range(2):
        xs = leaves(ins, low)
        torch.manual_seed(3)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            out = call("triton", xs, layout, 0.1)
        grads.append(torch.autograd.grad(out, xs, go.to(out.dtype)))
    res["deterministic"] = all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    return res


def bench(impl: str, ins, layout, p_drop: float, steps: int, dev, compiled=None) -> dict:
    xs = leaves(ins, torch.bfloat16)
    go = torch.randn(xs[0].shape, device=dev, dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
            call(impl, xs, layout, p_drop, compiled)

    def fwd_bwd():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = call(impl, xs, layout, p_drop, compiled)
        torch.autograd.grad(out, xs, go.to(out.dtype))

    r = dict(fwd_s=timed(fwd, steps, dev))
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    r["fwd_bwd_s"] = timed(fwd_bwd, steps, dev)
    if dev.type == "cuda":
        r["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impls", default="triton,einsum,einsum:compile,sdpa,fused")
    ap.add_argument("--tiles", default="", help="also time triton with these tiles (parse_tile's, comma-separated)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--best", default=None, help="write the fastest setting here (pos=..,fwd=..,dq=..,dkdv=..)")
    ap.add_argument("--breakdown", action="store_true", help="device time per kernel of the fastest setting")
    ap.add_argument("--smoke", action="store_true", help="small shapes (CPU: under TRITON_INTERPRET=1)")
    ap.add_argument("--once", default=None, metavar="SETTING", help="only two triton calls at SETTING (set_tiles)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.smoke:
        raise SystemExit("no CUDA device: run with --smoke (and TRITON_INTERPRET=1) to check the script on CPU")
    from xlnetcli.model import triton_attention as ta
    from xlnetcli.model.kernels import relative_attention

    B, H, D, L, M, P, G = (2, 2, 16, 24, 8, 4, 2) if args.smoke else (args.micro, 12, 64, 512, 384, 85, 2)
    steps = 2 if args.smoke else args.steps
    ins, layout = make_inputs(B, H, D, L, M, P, G, dev)
    N, K = L + P, M + L
    flops_fwd = 3 * 2 * B * H * N * K * D
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}; B {B} H {H} D {D} L {L} M {M} P {P} G {G}", flush=True)
    if args.once is not None:  # for a profiler (ncu): the triton core twice, forward and backward, nothing else
        set_tiles(args.once)
        xs = leaves(ins, torch.bfloat16)
        for _ in range(2):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                o = call("triton", xs, layout, 0.1)
            torch.autograd.grad(o, xs, torch.ones_like(o))
        return
    out = dict(device=name, torch=torch.__version__, shape=dict(B=B, H=H, D=D, L=L, M=M, P=P, G=G), rows=[])
    for pos in ("band", "table"):
        ta.CONTENT_POSITIONS = pos
        out[f"check_{pos}"] = c = check(ins, layout, dev)
        print(f"check {pos} (triton bf16 vs einsum fp32, relative error):", json.dumps(c), flush=True)

    def row(label, impl, compiled=None):
        try:
            r = bench(impl, ins, layout, 0.1, steps, dev, compiled)
        except Exception as e:  # noqa: BLE001 - a failing row is reported, the others still run
            r = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        r["row"] = label
        if "fwd_s" in r:
            r["fwd_tflops"] = flops_fwd / r["fwd_s"] / 1e12
            r["fwd_bwd_tflops"] = 3 * flops_fwd / r["fwd_bwd_s"] / 1e12
            print(
                f"{label:<22} fwd {r['fwd_s'] * 1e3:8.2f} ms ({r['fwd_tflops']:6.1f} TFLOP/s)  fwd+bwd "
                f"{r['fwd_bwd_s'] * 1e3:8.2f} ms ({r['fwd_bwd_tflops']:6.1f} TFLOP/s)  "
                f"peak {r.get('peak_gib', float('nan')):6.2f} GiB",
                flush=True,
            )
        else:
            print(f"{label:<22} {r['error']}", flush=True)
        out["rows"].append(r)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    impls = args.impls.split(",")
    default = dict(ta.GPU_TILES)
    if "triton" in impls:  # the two ways of the content rows' position scores, then tiles for the faster one
        for pos in ("band", "table"):
            ta.CONTENT_POSITIONS = pos
            row(f"triton {pos}", "triton")
        done = [r for r in out["rows"][-2:] if "fwd_bwd_s" in r]
        ta.CONTENT_BIAS = "table"  # the content rows' bias from the forward table (before the ninth session)
        row("triton table, table bias", "triton")
        ta.CONTENT_BIAS = "band"
        pos = min(done, key=lambda r: r["fwd_bwd_s"])["row"].split()[1] if done else "band"
        ta.CONTENT_POSITIONS = pos
        # each setting's time per kernel (profiler), then per kernel the fastest tile: the forward, dq and dk/dv
        # kernels share nothing but the inputs, so their tiles are chosen apart
        per_kernel = {}  # kernel -> [(ms, tile)]
        settings = [("shipped", None)] + [(t, parse_tile(t)) for t in filter(None, args.tiles.split(","))]
        for t, tile in settings:
            ta.GPU_TILES.update(default if tile is None else dict.fromkeys(ta.GPU_TILES, tile))
            if tile is not None:
                row(f"triton {pos} tiles {t}", "triton")
                if "fwd_s" not in out["rows"][-1]:
                    continue
            if dev.type == "cuda":
                ms = breakdown(ins, layout, 0.1, dev, quiet=True)
                for kernel in ("fwd", "dq", "dkdv"):
                    got = [v for k, v in ms.items() if k.startswith(f"_{kernel}_kernel")]
                    if got:
                        per_kernel.setdefault(kernel, []).append((sum(got), ta.GPU_TILES[kernel]))
        ta.GPU_TILES.update(default)
        if per_kernel:
            out["per_kernel_ms"] = {k: [(ms, tile_name(t)) for ms, t in v] for k, v in per_kernel.items()}
            best = f"pos={pos}," + ",".join(f"{k}={tile_name(min(v)[1])}" for k, v in per_kernel.items())
            out["best"] = best
            print(f"best: {best}", flush=True)
            for k, v in per_kernel.items():
                print(f"  {k}: " + ", ".join(f"{tile_name(t)} {ms:.3f} ms" for ms, t in sorted(v)), flush=True)
            if args.best:
                with open(args.best, "w") as f:
                    f.write(best)
            set_tiles(best)
            row(f"triton {pos} best", "triton")
            if args.breakdown and dev.type == "cuda":
                for p_drop in (0.1, 0.0):
                    out.setdefault("breakdown", {})[str(p_drop)] = breakdown(ins, layout, p_drop, dev)
    for impl in impls:  # the other kernels on the same inputs
        if impl == "einsum:compile":
            row(impl, impl, torch.compile(relative_attention, dynamic=False))
        elif impl != "triton":
            row(impl, impl)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def breakdown(ins, layout, p_drop: float, dev, quiet: bool = False) -> dict:
    """Device time per kernel of one triton forward + backward (torch profiler, mean of 3 calls after one)."""
    from torch.profiler import ProfilerActivity, profile

    xs = leaves(ins, torch.bfloat16)
    go = torch.randn(xs[0].shape, device=dev, dtype=torch.bfloat16)

    def once():
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = call("triton", xs, layout, p_drop)
        torch.autograd.grad(out, xs, go.to(out.dtype))

    once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            once()
        torch.cuda.synchronize()
    per = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", 0) or 0
        if t > 0:
            per[e.key[:60]] = t / 3 / 1e3  # ms per call
    if quiet:
        return per
    top = dict(sorted(per.items(), key=lambda kv: -kv[1])[:10])
    print(f"breakdown, dropout {p_drop} (ms per fwd+bwd, total {sum(per.values()):.2f}):", flush=True)
    for k, v in top.items():
        print(f"  {v:7.3f}  {k}", flush=True)
    return per


def parse_tile(t: str) -> tuple[int, int, int, int]:
    """``BM[/BN]xWARPS[xSTAGES]`` -> (BM, BN, warps, stages): BN = BM and 3 stages (Triton's default) unless given."""
    rows, *rest = t.split("x")
    bm, bn = (int(x) for x in rows.split("/")) if "/" in rows else (int(rows), int(rows))
    return (bm, bn, int(rest[0]), int(rest[1]) if len(rest) > 1 else 3)


def tile_name(t: tuple) -> str:
    """parse_tile's inverse."""
    bm, bn, warps, stages = t
    return f"{bm}{'' if bn == bm else f'/{bn}'}x{warps}x{stages}"


def set_tiles(spec: str) -> None:
    """``pos=band|table,bias=band|table,fwd=TILE,dq=TILE,dkdv=TILE`` (this script's best; TILE as parse_tile reads it;
    bwd=TILE sets dq, dkdv and dkr) -> triton_attention's CONTENT_POSITIONS, CONTENT_BIAS and GPU_TILES."""
    from xlnetcli.model import triton_attention as ta

    for part in filter(None, spec.split(",")):
        which, t = part.split("=")
        if which in ("pos", "bias"):
            setattr(ta, "CONTENT_POSITIONS" if which == "pos" else "CONTENT_BIAS", t)
            continue
        for k in ("dq", "dkdv", "dkr") if which == "bwd" else (which,):
            ta.GPU_TILES[k] = parse_tile(t)


if __name__ == "__main__":
    main()
