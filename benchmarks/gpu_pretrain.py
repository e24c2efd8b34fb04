"""XLNet pretraining step on a GPU: ours against transformers' XLNetLMHeadModel on the same batch, in one run.

    python benchmarks/gpu_pretrain.py                       # the BENCHMARKS.md table (Base 8/16/32, Large 4/8)
    python benchmarks/gpu_pretrain.py --rows base:16:sdpa,base:16:flex:compile --hf   # chosen rows
    python benchmarks/gpu_pretrain.py --smoke               # CPU smoke run (tiny sizes, 2 steps): checks the script
    TRITON_INTERPRET=1 python benchmarks/gpu_pretrain.py --smoke --rows base:2:triton   # the Triton kernel on CPU

A row is SIZE:MICRO:IMPL[:compile][:ac][:dropatt0][:det][:cudnn][:static][:graphs][:layergraphs]: size base or large
(configs/*.yaml: seq 512, mem_len 384, reuse_len 256, 85 targets, bi_data on, dropout 0.1, dropatt 0.1), micro-batch,
attention kernel (model/kernels.py), then per-layer torch.compile, activation checkpointing, attention dropout off,
deterministic algorithms (torch.use_deterministic_algorithms, as train.deterministic), SDPA restricted to cuDNN's
kernel, static shapes (train.static_shapes: the memory padded to mem_len from the first step, its padding masked;
model/objective.Memories), and CUDA graphs: the whole model compiled with ``torch.compile(mode="reduce-overhead",
dynamic=False)`` (implies static; each step's memory is cloned out of the graph's output buffers), or each compiled
layer replayed as a CUDA graph, the rest eager (layergraphs: train.cuda_graphs, parallel.replay_layers_as_graphs;
implies static). Each row also prints the host's time to launch a step (``host``: near the step's time, the host
sets the pace). --hf adds
transformers' model for each (size, micro) pair: the same config (hf.to_hf_config with the pretraining layout), the
same batch (perm_mask, target_mapping, segments), the same memory length (both carry memories across steps), the same
loss, the same fused AdamW and clipping.

A step is forward + loss + backward + clip + AdamW in bf16 autocast (fp32 weights), as `xlnet pretrain` runs it.
Times are CUDA-event medians over --steps steps after --warmup steps (memories reach full length in the warm-up).
MFU = model FLOPs of the step (model/flops.py: the useful matrix work, counted the same for both engines) / time / the
device's bf16 dense peak (flops.PEAK_BF16_TFLOPS). Peak memory = torch.cuda.max_memory_allocated over the timed steps
(weights, AdamW state, gradients, activations).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

import torch
from engine_vs_hf import make_batch  # the same original-style PLM batch as the CPU benchmark

DEFAULT_ROWS = (
    "base:16:einsum:compile,base:16:einsum:compile:det,base:16:einsum:compile:dropatt0,"
    "base:8:einsum:compile,base:32:einsum:compile,base:16:sdpa,base:16:sdpa:det,"
    "large:8:einsum:compile,large:8:einsum:compile:ac,large:16:einsum:compile:ac,"
    "base:16:triton,base:16:triton:compile,large:8:triton,large:8:triton:compile,"  # issue 23's fused kernel
    "base:16:einsum:static:graphs,base:8:einsum:static:graphs"  # issue 23's static shapes + CUDA graphs
)
SIZES = {"base": "configs/base.yaml", "large": "configs/large.yaml", "tiny": "configs/tiny.yaml"}


def model_config(size: str, impl: str, dropatt0: bool, smoke: bool):
    from xlnetcli.config import load_config

    root = os.path.join(os.path.dirname(__file__), "..")
    cfg = load_config(os.path.join(root, SIZES[size]))
    over = dict(attn_impl=impl)
    if dropatt0:
        over["dropatt"] = 0.0
    if smoke:
        over.update(vocab_size=1000, d_model=64, n_layer=2, n_head=2, d_head=32, d_inner=128, mem_len=24, reuse_len=16)
    import dataclasses

    m = dataclasses.replace(cfg.model, **over)
    L = 32 if smoke else cfg.data.seq_len
    return m, L, cfg.train


def to_device(batch: dict, dev) -> dict:
    return {k: v.to(dev) for k, v in batch.items()}


def build_ours(m, opts: set, dev):
    """Our model and its loss function (memories carried across calls); ``opts`` the row's options."""
    from xlnetcli.model import XLNetLMHeadModel
    from xlnetcli.model.objective import Memories
    from xlnetcli.model.parallel import apply_activation_checkpointing, compile_layers, replay_layers_as_graphs

    torch.manual_seed(0)
    model = XLNetLMHeadModel(m).to(dev).train()
    if "ac" in opts:
        apply_activation_checkpointing(model)
    if "layergraphs" in opts:  # train.cuda_graphs: each compiled layer a CUDA graph, the rest eager
        replay_layers_as_graphs(model)
    elif "compile" in opts:
        compile_layers(model)
    graphs = "graphs" in opts
    step_model = torch.compile(model, mode="reduce-overhead", dynamic=False) if graphs else model
    static = (m.n_layer, m.d_model) if graphs or "static" in opts or "layergraphs" in opts else None
    mems = Memories(m.mem_len, [[]], dev, static)  # one micro-batch (its records rows matter only to checkpoints)

    def loss_fn(b):
        if graphs:  # a new step: the graphs' output buffers of the last one may be reused
            torch.compiler.cudagraph_mark_step_begin()
        out = step_model(
            b["input_ids"],
            token_type_ids=b["token_type_ids"],
            perm_mask=b["perm_mask"],
            target_index=b["target_index"],
            labels=b["labels"],
            need_hidden=False,
            **mems.inputs(0, b["input_ids"].shape[0]),
        )
        if graphs:  # outputs of a CUDA graph live in its pool, overwritten by the next replay: keep copies
            out.mems = [x.clone() for x in out.mems]
            out.mem_pad = None if out.mem_pad is None else out.mem_pad.clone()
        mems.carry(0, out)
        return out.loss

    return model, loss_fn


def build_hf(m, dev):
    import transformers

    from xlnetcli.model.state_dict_adapter import to_hf_config

    hc = to_hf_config(m, pretraining_layout=True)
    hc.pop("architectures", None), hc.pop("model_type", None)
    torch.manual_seed(0)
    model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**hc)).to(dev).train()
    mems = None

    def loss_fn(b):
        nonlocal mems
        out = model(
            b["input_ids"],
            token_type_ids=b["token_type_ids"],
            perm_mask=b["perm_mask"],
            target_mapping=b["target_mapping"],
            labels=b["labels"],
            mems=mems,
            use_mems=True,
        )
        mems = [t.detach() for t in out.mems]
        return out.loss

    return model, loss_fn


def time_steps(model, loss_fn, batch, dev, warmup: int, steps: int, precision_bf16: bool, graphs=False) -> dict:
    """Median step time; peak memory over the timed steps, or from the first step with ``graphs`` (CUDA graphs
    allocate their memory pool while warming up, and replays allocate nothing)."""
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6, fused=fused)
    params = [p for p in model.parameters() if p.requires_grad]

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision_bf16):
            loss = loss_fn(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t_first = time.perf_counter()
    if graphs and dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        loss = step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        if not graphs:
            torch.cuda.reset_peak_memory_stats()
    warm_s = time.perf_counter() - t_first
    times, host = [], []
    for _ in range(steps):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            t0 = time.perf_counter()
            loss = step()
            host.append(time.perf_counter() - t0)  # the host's time to launch the step (the device may lag behind)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1000.0)
        else:
            t0 = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
    # the same steps back to back, one sync at the end: what a step costs when the host never waits on the device
    # (the engine's deferred check); step_s above waits at each step's end, as a per-step check would
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    back_to_back = (time.perf_counter() - t0) / steps
    return dict(
        step_s=statistics.median(times),
        host_s=statistics.median(host) if host else float("nan"),
        back_to_back_s=back_to_back,
        min_s=min(times),
        max_s=max(times),
        peak_gib=peak,
        loss=float(loss),
        warmup_s=warm_s,
    )


def sdpa_backend(cudnn: bool):
    """Row option ``cudnn``: restrict scaled_dot_product_attention to cuDNN's kernel (else PyTorch chooses)."""
    import contextlib

    if not cudnn:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION])


# Where a step's device time goes: our Triton kernels by name (triton_attention's, triton_lm_head's), then
# kernel-name patterns per category, the first match wins (lower-case names).
OUR_KERNELS = {
    **dict.fromkeys(("_fwd_kernel", "_dq_kernel", "_dkdv_kernel", "_dkr_kernel", "_bias_kernel"),
                    "attention (triton op)"),
    **dict.fromkeys(("_lse_kernel", "_grad_kernel"), "LM head (triton)"),
}  # fmt: skip
SPLIT = (
    ("optimizer", ("adam", "multi_tensor")),
    ("sdpa / flash", ("flash", "fmha", "efficient_attention", "cudnn")),
    ("matmul (cuBLAS)", ("nvjet", "gemm", "xmma", "cutlass", "sm80_", "sm90_", "ampere_", "hopper_")),
    ("inductor fused", ("triton_",)),
    ("copies and casts", ("copy", "cast")),
    ("elementwise and reductions (aten)", ("elementwise", "reduce", "softmax", "layer_norm", "dropout", "fill")),
)


def _annotation(e) -> bool:
    """A range's device row (record_function, Optimizer.step, a compiled region) repeats its kernels' time."""
    return bool(getattr(e, "is_user_annotation", False))


def step_split(events, steps: int) -> dict:
    """ms per step of device time by category (OUR_KERNELS, SPLIT) from a profiler's key_averages(); "other" for the
    rest."""
    split: dict = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU or not e.self_device_time_total or _annotation(e):
            continue
        name = e.key.lower()
        cat = OUR_KERNELS.get(e.key, "other")
        cat = next((c for c, pats in SPLIT if any(p in name for p in pats)), cat)
        split[cat] = split.get(cat, 0.0) + e.self_device_time_total / 1e3 / steps
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))


def profile(model, loss_fn, batch, dev, top: int) -> dict:
    """Print the kernels that take the most device time over two training steps, device-busy vs wall time and the
    split by category (step_split); returns the figures (ms per step) for the row's JSON."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch_profile(activities=acts, record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(2):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = loss_fn(batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize() if dev.type == "cuda" else None
        wall = time.perf_counter() - t0
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    split = step_split(events, 2)  # device-busy: the kernels' own time (step_split's device rows), in ms per step
    busy = sum(split.values()) / 1e3
    print(f"  profile: {wall / 2 * 1e3:.1f} ms wall per step, {busy * 1e3:.1f} ms device-busy per step")
    for cat, ms in split.items():
        print(f"  split: {ms:8.2f} ms  {cat}")
    print(events.table(sort_by=key, row_limit=top, max_name_column_width=70))
    # where the host's time goes (the compiled step takes about as long to launch as to run): CPU rows by self time
    host_rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    for e in host_rows:
        per_step = e.self_cpu_time_total / 1e3 / 2
        print(f"  host {per_step:7.2f} ms/step  x{e.count / 2:<5g} {e.key[:90]}")
    # the torch ops (outside inductor's kernels) by input shapes: which tensor a copy, cast or product moves
    shaped = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    for e in sorted(shaped, key=lambda e: -e.self_device_time_total)[:top]:
        ms = e.self_device_time_total / 1e3 / 2
        print(f"  op {ms:7.2f} ms/step  x{e.count / 2:<5g} {e.key:<26} {str(e.input_shapes)[:150]}")
    return dict(wall_ms=wall / 2 * 1e3, busy_ms=busy * 1e3, split_ms=split)


def run_row(row: str, args, dev, peak_tflops, results: list, done_hf: set) -> None:
    from xlnetcli.model.flops import train_flops

    parts = row.split(":")
    size, micro, impl = parts[0], int(parts[1]), parts[2]
    opts = set(parts[3:])
    m, L, _ = model_config(size, impl, "dropatt0" in opts, args.smoke)
    P = max(1, round(L / 6)) if args.smoke else 85
    batch = make_batch(micro, L, seed=0)
    vocab = m.vocab_size
    batch["input_ids"] = batch["input_ids"] % vocab
    batch["labels"] = batch["labels"] % vocab
    if batch["target_index"].shape[1] != P:  # make_batch uses round(L/6) targets = 85 at L=512
        raise SystemExit(f"target count {batch['target_index'].shape[1]} != {P}")
    batch = to_device(batch, dev)
    flops = train_flops(m, micro, L, m.mem_len, P)
    engines = [("ours", row)]
    hf_key = (size, micro, "ac" in opts)
    if args.hf and hf_key not in done_hf and "dropatt0" not in opts and "ac" not in opts:
        # transformers' XLNet has no activation checkpointing (it raises): no HF row for ":ac"
        engines.append(("hf", f"{size}:{micro}:transformers"))
        done_hf.add(hf_key)
    for engine, name in engines:
        torch.cuda.empty_cache() if dev.type == "cuda" else None
        try:
            if engine == "ours":
                if {"graphs", "layergraphs"} & opts:  # the graph trees say why they skip a graph
                    from torch._dynamo.utils import counters

                    counters["inductor"]["cudagraph_skips"] = 0
                    torch._logging.set_logs(perf_hints=True)
                model, loss_fn = build_ours(m, opts, dev)
            else:
                model, loss_fn = build_hf(m, dev)
            prev = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms("det" in opts and engine == "ours", warn_only=True)
            try:
                with sdpa_backend("cudnn" in opts):
                    r = time_steps(
                        model,
                        loss_fn,
                        batch,
                        dev,
                        args.warmup,
                        args.steps,
                        not args.smoke or dev.type == "cuda",
                        graphs=bool({"graphs", "layergraphs"} & opts) and engine == "ours",
                    )
                    if {"graphs", "layergraphs"} & opts and engine == "ours":  # captured, or skipped (why: above)
                        from torch._dynamo.utils import counters

                        r["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
                    if (
                        args.profile
                        and engine == "ours"
                        and (not args.profile_rows or row in args.profile_rows.split(","))
                    ):
                        r["profile"] = profile(model, loss_fn, batch, dev, args.profile)
            finally:
                torch.use_deterministic_algorithms(prev)
        except torch.OutOfMemoryError:
            r = dict(error="OOM")
        except Exception as e:  # noqa: BLE001 - a failing row is reported, the others still run
            r = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        finally:
            model = loss_fn = None
        r.update(
            row=name,
            engine=engine,
            size=size,
            micro=micro,
            seq=L,
            mem=m.mem_len,
            targets=P,
            tflop_per_step=flops / 1e12,
        )
        if "step_s" in r:
            r["tokens_per_s"] = micro * L / r["step_s"]
            r["mfu"] = flops / r["step_s"] / (peak_tflops * 1e12) if peak_tflops else None
        results.append(r)
        print(fmt(r), flush=True)
        if args.json:  # after every row, so a run cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(
                    dict(device=name_of(dev), torch=torch.__version__, peak_tflops=peak_tflops, results=results),
                    f,
                    indent=1,
                )


def name_of(dev) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def fmt(r: dict) -> str:
    if "error" in r:
        return f"{r['row']:<34} {r['error']}"
    mfu = f"{100 * r['mfu']:5.1f}%" if r.get("mfu") else "   n/a"
    return (
        f"{r['row']:<34} {r['step_s'] * 1e3:8.1f} ms  {r['tokens_per_s']:>10,.0f} tok/s  MFU {mfu}  "
        f"peak {r['peak_gib']:6.2f} GiB  loss {r['loss']:.3f}  (warm-up {r['warmup_s']:.0f} s)  "
        f"back to back {r['back_to_back_s'] * 1e3:.1f} ms  host {r.get('host_s', float('nan')) * 1e3:.1f} ms"
        + (f"  graphs skipped {r['cudagraph_skips']}" if "cudagraph_skips" in r else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated SIZE:MICRO:IMPL[:compile][:ac][:static]...")
    ap.add_argument("--hf", action="store_true", help="also time transformers' XLNetLMHeadModel on each batch")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", default=None, help="write all figures here")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest kernels of each row")
    ap.add_argument("--tiles", default="", help="triton tiles, pos=..,fwd=..,dq=..,dkdv=.. (gpu_attention.set_tiles)")
    ap.add_argument("--profile-rows", default="", help="only these rows (comma-separated) with --profile")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny sizes on whatever device is there (CPU: checks the code)"
    )
    args = ap.parse_args()
    if args.smoke:
        args.warmup, args.steps = 3, 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.smoke:
        raise SystemExit("no CUDA device: run with --smoke to check the script on CPU")
    from xlnetcli.model.flops import peak_tflops

    if args.tiles:
        from gpu_attention import set_tiles

        set_tiles(args.tiles)

    name = name_of(dev)
    peak = peak_tflops(name)
    print(f"device {name}, bf16 peak {peak} TFLOP/s, torch {torch.__version__}, tiles {args.tiles}", flush=True)
    results: list = []
    done_hf: set = set()
    for row in args.rows.split(","):
        run_row(row.strip(), args, dev, peak, results, done_hf)
    # ratios against transformers for each (size, micro) pair
    hf = {(r["size"], r["micro"]): r for r in results if r["engine"] == "hf" and "step_s" in r}
    print("\nagainst transformers (same size, micro-batch):")
    for r in results:
        h = hf.get((r["size"], r["micro"]))
        if r["engine"] == "ours" and "step_s" in r and h:
            print(
                f"  {r['row']:<34} speed {h['step_s'] / r['step_s']:.2f}x  peak memory "
                f"{r['peak_gib'] / h['peak_gib']:.2f}x"
            )


if __name__ == "__main__":
    main()
