"""The triton kernels compile for the GPU (sm_90, bf16) on a machine without one: benchmarks/triton_resources.py
runs Triton's compiler and the ptxas bundled with the triton wheel. The interpreter tests (test_triton_attention.py)
check the maths; this catches what only the compiler refuses (a module global that is not a constexpr did once).
The default (table) path's kernels and the forward stay in registers at the shipped tiles (GPU_TILES: no local-memory
spills; dq spilled at 64 rows before the bias tile, and spills were what made tiles slow on an H200)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from clitools import ROOT

pytest.importorskip("triton")


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_and_the_default_path_does_not_spill():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "triton_resources.py"), "--quick"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if "drop=1" in line]
    assert [row[0] for row in rows] == ["fwd", "fwd", "dq", "dq", "dkdv", "dkdv", "dkr"]
    for row in rows:  # ... regs, spill B, instr, HGMMA, HMMA, loop/score
        instr, hgmma, hmma, per_score = row[-4:]
        assert instr.isdigit() and int(instr) > 0, row
        assert int(hgmma) + int(hmma) > 0, row  # tensor-core instructions
        assert 0 < float(per_score) < int(instr), row  # a loop over the tiles was found
    spills = {(row[0], row[1]): int(row[-5]) for row in rows if row[0] == "fwd" or row[1] == "table"}
    assert set(spills.values()) == {0}, spills  # the default path's kernels, and the forward for band rows
    # the bias (table and content rows' band) and the LM head's two kernels (triton_lm_head.py): no loop over tiles
    # in the bias kernel, one over the vocabulary or the rows in the head's
    once = {
        tuple(line.split()[:2]): line.split() for line in r.stdout.splitlines() if line.startswith(("bias", "head"))
    }
    assert sorted(once) == [("bias", "band"), ("bias", "table"), ("head", "grad"), ("head", "lse")], r.stdout
    assert all(row[-5] == "0" for row in once.values()), once
    assert int(once[("bias", "band")][-3]) > 0  # the band product on tensor cores
    assert all(float(once[("head", k)][-1]) > 0 for k in ("lse", "grad")), once
