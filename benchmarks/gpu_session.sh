#!/usr/bin/env bash
# Issue 23's measurements on a lent GPU in one call, most valuable first: the GPU tests (paths that run only there),
# the model's step (gpu_pretrain.py), the LM head's paths (gpu_lm_head.py), the engine's (gpu_engine.py), the kernels
# and their tile sweep, Nsight Compute.
# Each step under its own limit and all of them inside BUDGET seconds; logs and JSON under $OUT.
#   OUT=/tmp/gpu bash benchmarks/gpu_session.sh          # run with the device tool's timeout_s 600
# ROWS (gpu_pretrain.py rows), PROFILE_ROWS (those of them profiled), TILES (theirs; empty: the shipped ones),
# ENGINE (gpu_engine.py rows), SWEEP (tiles tried after the shipped ones),
# T_TESTS, T_PRETRAIN, T_ENGINE, T_HEAD, T_ATTENTION (each step's limit in seconds),
# TESTS (pytest -k, empty: all of tests/test_gpu.py and tests/model/test_triton_*.py) and NCU (empty: no
# Nsight Compute) choose what runs. Before a lent GPU, check the script here: SMOKE=1 runs every step on the CPU
# (Triton's interpreter, tiny shapes, no figures; about 3 minutes). The defaults fill BUDGET (570 s) with the tests,
# the step rows, the head's and the engine's rows (a compiled row warms up 30-80 s); the kernels' sweep and Nsight
# Compute run only in what is left (give them T_* time by trimming the rows); ENGINE= skips the engine's rows.
set -u
SMOKE=${SMOKE:-}
if [ -n "$SMOKE" ]; then
    export TRITON_INTERPRET=1 ROWS=${ROWS:-base:2:triton,base:2:einsum} SWEEP=${SWEEP:-16x4} TESTS=${TESTS-"dropout and band"}
    export ENGINE=${ENGINE-eager:synced,eager:deferred}
fi
OUT=${OUT:-/tmp/gpu_session}; mkdir -p "$OUT"; rm -f "$OUT/tiles.txt"
BUDGET=${BUDGET:-570}
ENGINE=${ENGINE-eager:deferred:syncs,compile:deferred,compile:deferred:graphs,compile:deferred:graphs:nodet}
ROWS=${ROWS:-base:16:triton,base:16:triton:compile,base:16:triton:layergraphs,large:8:triton:layergraphs}
SWEEP=${SWEEP:-64/32x4,32/64x4,32/64x4x2,16/64x4,128/64x8,64/64x8,64/64x4x2}
TESTS=${TESTS-triton or auto or engine or cuda_graphs}
PROFILE_ROWS=${PROFILE_ROWS:-base:16:triton:compile}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false
start=$(date +%s)
step() {  # step SECONDS NAME COMMAND...: run under min(SECONDS, what is left), log to $OUT/NAME.log
    local want=$1 name=$2; shift 2
    local left=$((BUDGET - ($(date +%s) - start)))
    local secs=$((want < left ? want : left))
    if [ "$secs" -lt 20 ]; then echo "=== $name skipped: ${left}s left"; return; fi
    echo "=== $name (limit ${secs}s, t=$(($(date +%s) - start))s)"
    timeout -k 5 "$secs" "$@" >"$OUT/$name.log" 2>&1
    echo "=== $name rc $? (t=$(($(date +%s) - start))s)"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"
XDIST=$(python3 -c "import xdist" 2>/dev/null && [ -z "$SMOKE" ] && echo "-n 4")
step "${T_TESTS:-150}" tests python3 -m pytest -p no:cacheprovider $XDIST -vv -rfEs --durations=5 ${TESTS:+-k "$TESTS"} \
    tests/test_gpu.py tests/model/test_triton_attention.py tests/model/test_triton_lm_head.py
grep -c " PASSED" "$OUT/tests.log"; grep " FAILED\|ERROR \|passed\|failed" "$OUT/tests.log" | tail -n 12
step "${T_PRETRAIN:-220}" pretrain python3 benchmarks/gpu_pretrain.py --hf --json "$OUT/pretrain.json" --profile 14 --tiles "${TILES:-}" \
    --profile-rows "$PROFILE_ROWS" --rows "$ROWS" ${SMOKE:+--smoke}
grep "^base\|^large\|^  base\|^  large\|profile:\|split:\|^device" "$OUT/pretrain.log" | tail -n 30
step "${T_HEAD:-40}" head python3 benchmarks/gpu_lm_head.py --json "$OUT/head.json" ${SMOKE:+--smoke}
grep "^device\|^check\|fwd+bwd\|Error" "$OUT/head.log"
if [ -n "$ENGINE" ]; then  # `xlnet pretrain` itself: the engine's logged tokens/s, figures read synced / deferred
    step "${T_ENGINE:-200}" engine python3 benchmarks/gpu_engine.py --rows "$ENGINE" --json "$OUT/engine.json" ${SMOKE:+--smoke}
    grep "^device\|^eager\|^compile\|Error\|error" "$OUT/engine.log" | tail -n 12
fi
step "${T_ATTENTION:-150}" attention python3 benchmarks/gpu_attention.py --json "$OUT/attention.json" --tiles "$SWEEP" \
    --best "$OUT/tiles.txt" --breakdown --impls triton,einsum,sdpa,einsum:compile ${SMOKE:+--smoke}
grep "^check\|^triton\|^einsum\|^sdpa\|^fused\|^best\|^breakdown\|^   \|Error" "$OUT/attention.log" | tail -n 40
if [ -n "${NCU-1}" ] && command -v ncu >/dev/null; then  # the three kernels' limits (Nsight Compute; NCU= skips)
    step 90 ncu ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis --section WarpStateStats -k "regex:_fwd_kernel|_dq_kernel|_dkdv_kernel" \
        --launch-skip 3 --launch-count 3 python3 benchmarks/gpu_attention.py --once "$(cat "$OUT/tiles.txt" 2>/dev/null)"
    grep -E "^  _|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Local Memory" \
        "$OUT/ncu.log" | head -n 30
fi
