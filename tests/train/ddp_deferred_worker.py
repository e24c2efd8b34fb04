"""Run by test_engine.py under torchrun (2 processes, gloo): the toy engine under DDP with the fused AdamW (the CUDA
path, on the CPU), its figures read before each update (synced) and a step late (deferred). Writes rankN.json into
the folder it is given: whether the engine deferred, whether both ways trained the same bits, the step each stopped
at after a SIGTERM sent to rank 1 alone during step 3, and how each met a NaN loss on rank 1 alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import test_engine as te

from xlnetcli.core import dist
from xlnetcli.core.errors import Preempted, XLNetError
from xlnetcli.train import engine as engine_module


def main(out: Path) -> None:
    torch.set_num_threads(1)
    env = dist.init_distributed("cpu")
    engine_module.fused_adamw = lambda device: True
    check = engine_module.deferred_check

    def run(name: str, deferred: bool, sigterm_at: int | None = None) -> te.Engine:
        engine_module.deferred_check = check if deferred else (lambda *a: False)
        workload = te.ToyWorkload(4, 2, sigterm_at=sigterm_at if env.rank == 1 else None)
        return te.make_engine(out / name, workload, accum=2, max_steps=6, clip_norm=0.5, log_every=3, env=env)

    synced, deferred = run("synced", False), run("deferred", True)
    synced.fit()
    deferred.fit()
    same = all(torch.equal(a, b) for a, b in zip(te.params(synced), te.params(deferred), strict=True))
    stopped = {}
    for name, way in (("synced", False), ("deferred", True)):
        engine = run(f"sigterm_{name}", way, sigterm_at=2)
        try:
            engine.fit()
        except Preempted:
            stopped[name] = engine.step
    # a NaN loss on rank 1 alone during step 2: the mean loss is NaN on both, both skip the update and stop alike
    engine_module.deferred_check = check
    workload = te.ToyWorkload(4, 2, nan_at=1 if env.rank == 1 else None)
    nan = te.make_engine(out / "nan", workload, accum=2, log_every=100, env=env)
    try:
        nan.fit()
        message = None
    except XLNetError as e:
        message = str(e).split(";")[0]
    updates = sorted({int(s["step"]) for s in nan.optimizer.state.values()})
    finite = all(bool(torch.isfinite(p).all()) for p in te.params(nan))
    report = {"rank": env.rank, "deferred": deferred.deferred, "synced_deferred": synced.deferred, "same_bits": same}
    (out / f"rank{env.rank}.json").write_text(
        json.dumps({**report, "stopped": stopped, "nan": [message, updates, finite]})
    )
    dist.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
