"""The LM head + loss alone on a GPU: its three paths (model/lm_head.py: plain F.cross_entropy, fused
_LMHeadLoss in torch, triton: the same function with triton_lm_head.py's two kernels) on the same inputs, in one run.

    python benchmarks/gpu_lm_head.py --json gpu_lm_head.json       # Base shapes: 16 x 85 target rows, V 32000, d 768
    TRITON_INTERPRET=1 python benchmarks/gpu_lm_head.py --smoke    # CPU check of the script, no figures

Inputs as `xlnet pretrain` gives the head at Base (configs/base.yaml): the query stream's rows [n = 16 x 85, 768] in
bf16, the tied embedding [32000, 768] and the bias in fp32, under bf16 autocast, about 15% of rows ignored (-100).
A row times forward + backward (loss only: the logits unused, as in pretraining) with CUDA events, median of
--steps calls after 3 warm-up calls, and the peak memory above the inputs. Checks, printed first: each path's loss
and gradients against the plain path's (relative error), and two triton calls give the same bits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

import torch
from gpu_attention import rel_err, timed

from xlnetcli.model.lm_head import lm_head


def make_inputs(n: int, d: int, V: int, dev, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n, d, generator=g).to(dev, torch.bfloat16).requires_grad_()
    W = (torch.randn(V, d, generator=g) * 0.02).to(dev).requires_grad_()
    b = torch.zeros(V).to(dev).requires_grad_()
    labels = torch.randint(0, V, (n,), generator=g)
    labels[torch.rand(n, generator=g) < 0.15] = -100
    return x, W, b, labels.to(dev)


def step(impl: str, ins, dev):
    """One forward + backward; returns (loss, grads)."""
    x, W, b, labels = ins
    for t in (x, W, b):
        t.grad = None
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        _, loss = lm_head(x, W, b, labels, impl=impl)
    loss.backward()
    return loss.detach(), [t.grad for t in (x, W, b)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16 * 85)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--impls", default="plain,fused,triton")
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on whatever device (CPU: the interpreter)")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        args.rows, args.vocab, args.d_model, args.steps = 24, 300, 16, 2
    ins = make_inputs(args.rows, args.d_model, args.vocab, dev)
    impls = args.impls.split(",")
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"device {name}; n {args.rows}, V {args.vocab}, d {args.d_model}, bf16 autocast")
    ref_loss, ref_grads = step("plain", ins, dev)
    results = []
    for impl in impls:
        loss, grads = step(impl, ins, dev)
        errs = [rel_err(loss, ref_loss)] + [rel_err(a, b) for a, b in zip(grads, ref_grads, strict=True)]
        same = True
        if impl == "triton":
            loss2, grads2 = step(impl, ins, dev)
            same = torch.equal(loss, loss2) and all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
        print(f"check {impl:<7} rel err loss {errs[0]:.1e}  dx {errs[1]:.1e}  dW {errs[2]:.1e}  db {errs[3]:.1e}"
              f"  {'deterministic' if same else 'NOT DETERMINISTIC'}")  # fmt: skip
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
        s = timed(lambda impl=impl: step(impl, ins, dev), args.steps, dev)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if dev.type == "cuda" else 0.0
        results.append(dict(impl=impl, ms=s * 1e3, peak_mib=peak, rel_err=errs, deterministic=same))
        print(f"{impl:<13} fwd+bwd {s * 1e3:8.3f} ms   peak above inputs {peak:8.1f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=name, rows=args.rows, vocab=args.vocab, d_model=args.d_model, results=results), f,
                      indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
