"""Compile the Triton kernels (model/triton_attention.py, triton_lm_head.py) for a GPU without one; print their needs.

    python benchmarks/triton_resources.py                    # sm_90 (H100/H200), the shipped tiles, bf16
    python benchmarks/triton_resources.py --tiles 64x8       # other tiles (BMxWARPS, every kernel)

Triton's front end and the ptxas bundled with the triton wheel compile every kernel variant the launchers use
(content and query rows, dropout on and off, segments and mask on) for the chosen architecture, with no GPU and no
CUDA driver; cuobjdump (also in the wheel) reads each one's registers, local-memory stack (spills), its tensor-core
instructions (HGMMA: Hopper's wgmma; HMMA: mma.sync) and the instructions per score of its loop over tiles
(loop/score: thread instructions of one iteration / the tile's scores; at head size 64 the products are a small
share: it is what the element-wise work costs). A kernel that does not compile for the GPU (it may still run in the
interpreter) fails here. Must run without TRITON_INTERPRET (the kernels are compiled, not
interpreted, when the module is imported). tests/model/test_triton_compile.py runs it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("run without TRITON_INTERPRET=1: the kernels must be compiled, not interpreted")

import triton
from gpu_attention import parse_tile, tile_name
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from xlnetcli.model import triton_attention as ta
from xlnetcli.model import triton_lm_head as th

FLOATS = {"scale", "keep_scale"}
INTS = {"rows_ptr": "*i32", "flags_ptr": "*u8", "seed_ptr": "*i32", "lab_ptr": "*i64"}
# The integer arguments at Base's pretraining shapes (gpu_attention.py: K = 896 keys, N = 597 rows, R = 1408
# positions, all rows on the table): the launch specializes on them as Triton's JIT does (divisible by 16: aligned;
# 1: a constant), so the compiled code is the one the GPU runs.
BASE = dict(H=12, N=597, K=896, R=1408, L=512, P=597, GB=8, row0=0, row_end=597, n_content=0)
BASE.update(start=512, end=597, tab0=512)  # _bias_kernel's table launch (the query rows); BIAS_BAND: the content rows'
BIAS_BAND = dict(start=0, end=512)
BASE["drop_thr"] = 1677722  # attention dropout 0.1: round(0.1 * 2^24)
# k and v: views of the layer's [B,K,2,H,D] projection (their strides)
BASE.update(kv_b=896 * 2 * 12 * 64, kv_h=64, kv_r=2 * 12 * 64)
BASE.update(do_b=597 * 12 * 64, do_h=64, do_r=12 * 64)  # do: the o projection's gradient [B,N,H·D] viewed per head
BASE.update(n=1360, V=32000, stride=32000)  # the LM head: 16 x 85 target rows, the paper's 32000-piece vocabulary
FP32 = {"ef_ptr", "stats_ptr", "delta_ptr", "def_ptr", "dkr_ptr"}  # dqw, dqr, dk, dv: in the inputs' dtype
FP32 |= {"lse_ptr", "picked_ptr", "coef_ptr", "db_ptr"}
TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def signature(fn, consts: dict, dtype: str) -> dict:
    """Triton's signature of ``fn``: pointers to ``dtype`` (q, k, v, kr, tables, out, do) or their fixed types."""
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in INTS:
            sig[name] = INTS[name]
        elif name.endswith("_ptr"):
            sig[name] = "*fp32" if name in FP32 else f"*{dtype}"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    return sig


def specialization(fn, consts: dict, sig: dict, ints: dict) -> tuple[dict, dict]:
    """Triton's JIT specialization at the launch's integers ``ints`` (BASE and the variant's own): pointers 16-byte
    aligned, integers divisible by 16 marked so, integers equal to 1 turned into constants. Returns (constexprs,
    attrs) for ASTSource."""
    consts = dict(consts)
    attrs = {}
    for n, name in enumerate(fn.arg_names):
        if sig[name].startswith("*") or (sig[name] == "i32" and ints[name] % 16 == 0):
            attrs[(n,)] = [["tt.divisibility", 16]]
        elif sig[name] == "i32" and ints[name] == 1:
            consts[name] = 1
    return consts, attrs


def variants(tiles: dict, drops=(False, True)) -> list[tuple[str, object, dict, tuple, dict]]:
    """(label, kernel, constexprs, (BM, warps, stages), integers unlike BASE's) of every launch the launchers make,
    segments and mask on: table rows with the tile's BN, band rows with BN = BM."""
    out = []
    common = dict(HAS_SEG=True, HAS_MASK=True, D=64, BD=64)
    for band in (False, True):
        bm, bn, *launch = tiles["bias band" if band else "bias"]
        c = dict(BAND=band, BM=bm, BN=bm if band else bn, **common)
        ints = BIAS_BAND if band else {}
        out.append((f"bias {'band ' if band else 'table'}", ta._bias_kernel, c, (bm, *launch), ints))
    for drop in drops:
        for name, fn in (("fwd", ta._fwd_kernel), ("dq", ta._dq_kernel)):
            for query in (False, True):
                bm, bn, *launch = tiles[name if query else "band"]
                c = dict(QUERY=query, DROP=drop, BM=bm, BN=bn if query else bm, **common)
                out.append((f"{name:<4} {'table' if query else 'band '} drop={int(drop)}", fn, c, (bm, *launch), {}))
        for band in (False, True):
            bm, bn, *launch = tiles["band" if band else "dkdv"]
            c = dict(DROP=drop, HAS_BAND=band, BM=bm, BN=bm if band else bn, **common)
            out.append((f"dkdv {'band ' if band else 'table'} drop={int(drop)}", ta._dkdv_kernel, c, (bm, *launch), {}))
        bm, _, *launch = tiles["dkr"]
        c = dict(DROP=drop, BM=bm, BR=bm, **common)
        out.append((f"dkr  band  drop={int(drop)}", ta._dkr_kernel, c, (bm, *launch), {}))
    launch = (th.LAUNCH["num_warps"], th.LAUNCH["num_stages"])
    out.append(("head lse", th._lse_kernel, dict(BV=th.LSE_COLS), (1, *launch), {}))
    bm, bn = th.GRAD_TILE
    out.append(("head grad", th._grad_kernel, dict(HAS_GLOG=False, BM=bm, BN=bn), (bm, *launch), {}))
    return out


def _longest_loop(sass: str) -> int:
    """Instructions in the longest loop body of a SASS listing (from a backward branch's target to the branch): the
    kernel's walk over key (or row) tiles, what each tile costs every thread."""
    addrs, texts = [], []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addrs.append(int(m.group(1), 16))
            texts.append(m.group(2))
    index = {a: n for n, a in enumerate(addrs)}
    best = 0
    for n, text in enumerate(texts):
        target = re.search(r"BRA.*?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) in index and int(target.group(1), 16) < addrs[n]:
            best = max(best, n - index[int(target.group(1), 16)] + 1)
    return best


def resources(cubin: bytes) -> dict:
    """Registers, stack, instruction counts (all, the longest loop's, tensor-core ones) of a compiled kernel
    (cuobjdump)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        sass = subprocess.run([os.path.join(TOOLS, "cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    fields = dict(w.split(":") for line in usage.splitlines() if "REG:" in line for w in line.split() if ":" in w)
    return dict(
        loop=_longest_loop(sass),
        regs=int(fields["REG"]),
        stack=int(fields["STACK"]),
        instructions=sum(1 for line in sass.splitlines() if line.strip().startswith("/*") and ";" in line),
        hgmma=sass.count("HGMMA"),
        hmma=sass.count("HMMA"),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    ap.add_argument("--tiles", default="", help="BM[/BN]xWARPS[xSTAGES] for every kernel (default: GPU_TILES)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--quick", action="store_true", help="only the dropout variants (they hold the others' code)")
    args = ap.parse_args()
    tiles = dict(ta.GPU_TILES)
    if args.tiles:
        tiles = dict.fromkeys(tiles, parse_tile(args.tiles))
    target = GPUTarget("cuda", args.arch, 32)
    print(f"triton {triton.__version__}, sm_{args.arch}, {args.dtype}, tiles {tiles}")
    print(
        f"{'kernel':<24} {'tile':>9} {'regs':>5} {'spill B':>8} {'instr':>7} {'HGMMA':>6} {'HMMA':>5} "
        f"{'loop/score':>10}"
    )
    failed = 0
    for label, fn, consts, (_, warps, stages), ints in variants(tiles, (True,) if args.quick else (False, True)):
        try:
            sig = signature(fn, consts, args.dtype)
            specialized, attrs = specialization(fn, consts, sig, {**BASE, **ints})
            sig = {k: "constexpr" if k in specialized else v for k, v in sig.items()}
            k = triton.compile(ASTSource(fn, sig, constexprs=specialized, attrs=attrs), target=target,
                               options={"num_warps": warps, "num_stages": stages})  # fmt: skip
            r = resources(k.asm["cubin"])
        except Exception as e:  # noqa: BLE001 - every variant is reported; the exit code says whether any failed
            failed += 1
            cause = e.__cause__ or e  # a CompilationError's own text ends with the source line and a caret
            print(f"{label:<24} FAILED: {type(cause).__name__}: {str(cause).splitlines()[0][:200]}")
            continue
        bm = consts.get("BM", 1)  # the head's lse kernel: one row of BV columns
        bn = consts.get("BN", consts.get("BR", consts.get("BV", bm)))
        tile = tile_name((bm, bn, warps, stages))
        per_score = r["loop"] * 32 * warps / (bm * bn)  # thread instructions per score of one loop iteration's tile
        print(
            f"{label:<24} {tile:>9} {r['regs']:>5} {r['stack']:>8} {r['instructions']:>7} {r['hgmma']:>6} "
            f"{r['hmma']:>5} {per_score:>10.1f}"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
