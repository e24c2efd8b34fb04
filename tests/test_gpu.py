"""The CUDA paths (skipped without a GPU; run on one with `python -m pytest tests/test_gpu.py`).

- every attention kernel (fused, sdpa, flex) against the plain reference in float64 on the CPU: loss, logits,
  memories and every gradient within 1e-5 in float32; within the documented bf16 bound under bf16 autocast;
- torch.compile of the layers and activation checkpointing change nothing (float32, dropout on: same masks);
- determinism: with train.deterministic (torch.use_deterministic_algorithms) two identical steps are bit-identical;
- an end-to-end `pretrain` on CUDA in bf16 whose resume from a checkpoint is bit-exact, also with the layers replayed
  as CUDA graphs (train.cuda_graphs), which train the same bits as without them;
- a diverging run on CUDA (fused AdamW, whose check of a step's figures comes a step late) stops with the diagnosis
  and saves nothing after its last finite step.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from modeltools import plm_batch, tiny_cfg, twins  # noqa: E402

from xlnetcli.model import XLNetLMHeadModel  # noqa: E402

CUDA = torch.device("cuda")
TOL_FP32 = 1e-5
TOL_BF16 = 3e-2  # relative (‖ours - ref‖ / ‖ref‖) for logits and gradients under bf16 autocast
try:
    import triton  # noqa: F401

    IMPLS = ["fused", "sdpa", "flex", "triton"]  # triton: model/triton_attention.py's compiled kernels
except ImportError:
    IMPLS = ["fused", "sdpa", "flex"]


def gpu_cfg(**kw):
    # head size 32: FlexAttention and the fused SDPA kernels want D >= 16
    base = dict(d_model=64, n_head=2, d_head=32, d_inner=128, n_layer=3)
    base.update(kw)
    return tiny_cfg(**base)


def batch(B=4, P=3, seed=0, device=CUDA):
    ids, tt, perm, tmap = plm_batch(B, P, np.random.default_rng(seed))
    labels = torch.randint(0, 60, (B, P), generator=torch.Generator().manual_seed(seed))
    return {
        k: v.to(device)
        for k, v in dict(input_ids=ids, token_type_ids=tt, perm_mask=perm, target_mapping=tmap, labels=labels).items()
    }


def run(model, b, steps=2, autocast=None, need_hidden=True):
    """Two forward/backward passes carrying memory (the second one attends to it); returns loss, logits, mems,
    gradients of the last pass (gradients accumulate over both, as a micro-batch loop would)."""
    model.zero_grad(set_to_none=True)
    mems = None
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast is not None):
            out = model(**b, mems=mems, need_hidden=need_hidden)
        out.loss.backward()
        mems = out.mems
    grads = {
        k.replace("._checkpoint_wrapped_module", ""): p.grad.detach().double().cpu()
        for k, p in model.named_parameters()
        if p.grad is not None
    }
    return out.loss.detach().double().cpu(), out.logits.detach().double().cpu(), [m.double().cpu() for m in mems], grads


def reference(cfg, b):
    torch.manual_seed(0)
    ref = XLNetLMHeadModel(dataclasses.replace(cfg, attn_impl="einsum")).double().eval()
    return ref, run(ref.to("cpu"), {k: v.cpu() for k, v in b.items()}, autocast=None)


def twin(ref, cfg, impl, dtype=torch.float32):
    m = XLNetLMHeadModel(dataclasses.replace(cfg, attn_impl=impl)).to(CUDA)
    m.load_state_dict({k: v.to(dtype) for k, v in ref.state_dict().items()})
    return m.eval()


def maxdiff(a, b):
    return (a - b).abs().max().item()


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bi_data", [False, True])
def test_kernel_matches_reference_fp32(impl, bi_data):
    cfg = gpu_cfg(bi_data=bi_data)
    b = batch()
    ref, (l0, lg0, m0, g0) = reference(cfg, b)
    l1, lg1, m1, g1 = run(twin(ref, cfg, impl), b)
    assert maxdiff(l1, l0) <= TOL_FP32
    assert maxdiff(lg1, lg0) <= TOL_FP32
    assert all(maxdiff(a, c) <= TOL_FP32 for a, c in zip(m1, m0, strict=True))
    assert g1.keys() == g0.keys()
    worst = max(g0, key=lambda k: maxdiff(g1[k], g0[k]))
    assert maxdiff(g1[worst], g0[worst]) <= TOL_FP32, worst


@pytest.mark.parametrize("impl", IMPLS)
def test_kernel_bf16_within_documented_bound(impl):
    cfg = gpu_cfg(bi_data=True)
    b = batch()
    ref, (l0, lg0, _, g0) = reference(cfg, b)
    l1, lg1, _, g1 = run(twin(ref, cfg, impl), b, autocast=torch.bfloat16)
    assert rel(lg1, lg0) <= TOL_BF16
    assert abs(l1 - l0).item() <= TOL_BF16 * abs(l0).item()
    total = rel(torch.cat([g1[k].flatten() for k in g0]), torch.cat([g0[k].flatten() for k in g0]))
    assert total <= TOL_BF16


@pytest.mark.parametrize("impl", IMPLS)
def test_activation_checkpointing_changes_nothing(impl):
    """Dropout on: the recomputation replays the RNG, so the masks, the loss and every gradient are identical."""
    from xlnetcli.model.parallel import apply_activation_checkpointing

    cfg = gpu_cfg(bi_data=True, dropout=0.1, dropatt=0.0 if impl == "flex" else 0.1, attn_impl=impl)
    b = batch()
    plain, ac = (m.to(CUDA) for m in twins(cfg))
    apply_activation_checkpointing(ac)
    assert ac.state_dict().keys() == plain.state_dict().keys()
    torch.manual_seed(1)
    l0, _, _, g0 = run(plain, b, need_hidden=False)
    torch.manual_seed(1)
    l1, _, _, g1 = run(ac, b, need_hidden=False)
    assert torch.equal(l0, l1)
    if impl == "flex":  # FlexAttention's backward sums the segment term's gradient with atomic adds: rounding only
        assert max(maxdiff(g1[k], g0[k]) for k in g0) <= 1e-6
    else:
        assert all(torch.equal(g0[k], g1[k]) for k in g0)


@pytest.mark.parametrize("impl", IMPLS)
def test_compiled_layers_match_eager(impl):
    """Per-layer torch.compile against eager, float32, dropout off (inductor draws its own dropout masks)."""
    from xlnetcli.model.parallel import compile_layers

    cfg = gpu_cfg(bi_data=True, dropout=0.0, dropatt=0.0, attn_impl=impl)
    b = batch()
    eager, comp = (m.to(CUDA) for m in twins(cfg))
    compile_layers(comp)
    l0, lg0, _, g0 = run(eager, b, need_hidden=False)
    l1, lg1, _, g1 = run(comp, b, need_hidden=False)
    assert maxdiff(l1, l0) <= TOL_FP32 and maxdiff(lg1, lg0) <= TOL_FP32
    assert max(maxdiff(g1[k], g0[k]) for k in g0) <= TOL_FP32


def test_auto_runs_triton_eagerly_and_in_compiled_layers(monkeypatch):
    """attn_impl auto on a CUDA GPU with triton and bf16: the triton kernels, eagerly and inside each compiled layer
    (train.compile); without them: SDPA eagerly, the einsum formulation inside compiled layers."""
    import torch.nn.functional as F

    from xlnetcli.model.kernels import _triton_usable
    from xlnetcli.model.parallel import compile_layers

    calls = {"sdpa": 0, "triton": 0}
    sdpa = F.scaled_dot_product_attention

    def counted_sdpa(*args, **kwargs):
        calls["sdpa"] += 1
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted_sdpa)
    if "triton" in IMPLS:
        from xlnetcli.model import triton_attention

        fused = triton_attention.triton_rel_attention

        def counted_triton(*args, **kwargs):
            calls["triton"] += 1
            return fused(*args, **kwargs)

        monkeypatch.setattr(triton_attention, "triton_rel_attention", counted_triton)
    want = "triton" if _triton_usable(CUDA) else "sdpa"
    eager, comp = (m.to(CUDA) for m in twins(gpu_cfg(dropout=0.0, dropatt=0.0, attn_impl="auto")))
    b = batch()
    run(eager, b, steps=1)
    assert calls[want] and not calls["sdpa" if want == "triton" else "triton"], calls
    calls.update(sdpa=0, triton=0)
    compile_layers(comp)
    run(comp, b, steps=1)
    assert not calls["sdpa"], "auto inside compiled layers ran SDPA"
    if want == "triton":
        assert calls["triton"], "auto inside compiled layers did not run the triton kernels"


@pytest.mark.parametrize("impl", IMPLS)
def test_deterministic_mode_is_bit_exact(impl):
    cfg = gpu_cfg(bi_data=True, dropout=0.1, dropatt=0.0 if impl == "flex" else 0.1, attn_impl=impl)
    b = batch(B=8, P=4)
    torch.manual_seed(0)
    model = XLNetLMHeadModel(cfg).to(CUDA).train()
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        outs = []
        for _ in range(2):
            torch.manual_seed(3)
            outs.append(run(model, b, autocast=torch.bfloat16, need_hidden=False))
    finally:
        torch.use_deterministic_algorithms(prev)
    (la, _, _, ga), (lb, _, _, gb) = outs
    assert torch.equal(la, lb) and all(torch.equal(ga[k], gb[k]) for k in ga)


@pytest.mark.parametrize("compile_,impl", [(False, "auto"), (True, "auto"), (False, "triton")])
def test_pretrain_on_cuda_resumes_exactly(builds, tmp_path, compile_, impl):
    """`pretrain` end to end on the GPU in bf16 (fused AdamW; attn_impl auto: sdpa eager, einsum compiled; or the
    triton kernel; dropout on; train.deterministic as shipped); stopping after a checkpoint and resuming gives
    bit-identical losses and weights to an uninterrupted run."""
    if impl == "triton" and "triton" not in IMPLS:
        pytest.skip("triton is not installed")
    from clitools import FAST_PRETRAIN, TINY, step_weights, train_losses

    from xlnetcli.config import load_config
    from xlnetcli.train.pretrain import pretrain

    rec = builds.pipeline(FAST_PRETRAIN).records
    over = [
        *FAST_PRETRAIN,
        "train.max_steps=8",
        "train.save_every=4",
        "train.eval_every=4",
        "train.precision=bf16",
        f"train.compile={str(compile_).lower()}",
        f"model.attn_impl={impl}",
    ]
    cfg = load_config(TINY, over)
    a = pretrain(cfg, rec, tmp_path / "a", device="cuda", quiet=True)
    assert a["step"] == 8
    pretrain(cfg, rec, tmp_path / "b", device="cuda", quiet=True, stop_after=4)
    pretrain(cfg, rec, tmp_path / "b", resume="latest", device="cuda", quiet=True)
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b")
    wa = step_weights(tmp_path / "a" / "step_0000008")
    wb = step_weights(tmp_path / "b" / "step_0000008")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_cuda_graphs_train_the_same_bits_and_resume_exactly(builds, tmp_path):
    """train.cuda_graphs (each compiled layer replayed as a CUDA graph, attn_impl auto = triton): no layer skipped
    by the graph trees; dropout off, the same losses and weights bit for bit as the compiled run without graphs (the
    same kernels, replayed); dropout on, stopped after a checkpoint and resumed, bit-identical to an uninterrupted
    run (the triton op's seed and inductor's dropout draw on the device, inside the graphs)."""
    from clitools import FAST_PRETRAIN, TINY, step_weights, train_losses
    from torch._dynamo.utils import counters

    from xlnetcli.config import load_config
    from xlnetcli.train.pretrain import pretrain

    rec = builds.pipeline(FAST_PRETRAIN).records
    over = [*FAST_PRETRAIN, "train.max_steps=8", "train.save_every=4", "train.eval_every=4", "train.precision=bf16"]
    over += ["train.compile=true", "train.static_shapes=true", "model.mem_len=24"]
    graphs = ["train.cuda_graphs=true"]
    off = ["model.dropout=0", "model.dropatt=0"]
    counters.clear()
    pretrain(load_config(TINY, [*over, *off]), rec, tmp_path / "plain", device="cuda", quiet=True)
    pretrain(load_config(TINY, [*over, *off, *graphs]), rec, tmp_path / "graphs", device="cuda", quiet=True)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert train_losses(tmp_path / "plain") == train_losses(tmp_path / "graphs")
    wa, wb = step_weights(tmp_path / "plain" / "step_0000008"), step_weights(tmp_path / "graphs" / "step_0000008")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    cfg = load_config(TINY, [*over, *graphs])
    pretrain(cfg, rec, tmp_path / "a", device="cuda", quiet=True)
    pretrain(cfg, rec, tmp_path / "b", device="cuda", quiet=True, stop_after=4)
    pretrain(cfg, rec, tmp_path / "b", resume="latest", device="cuda", quiet=True)
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b")
    wa, wb = step_weights(tmp_path / "a" / "step_0000008"), step_weights(tmp_path / "b" / "step_0000008")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_engine_on_cuda_stops_a_diverging_run_and_saves_no_later_step(builds, tmp_path):
    """bf16 on one GPU: the engine reads a step's loss and gradient norm one step late (fused AdamW skips a non-finite
    update on the device); the run still stops with the one-line diagnosis, and no step folder is from the diverged
    step or later."""
    import re

    from clitools import FAST_PRETRAIN, TINY

    from xlnetcli.config import load_config
    from xlnetcli.core.errors import XLNetError
    from xlnetcli.train.pretrain import pretrain

    rec = builds.pipeline(FAST_PRETRAIN).records
    over = ["train.max_steps=20", "train.save_every=1", "train.eval_every=never", "train.lr=1e30"]
    over += ["train.warmup_steps=0", "train.clip_norm=0", "train.precision=bf16"]
    cfg = load_config(TINY, [*FAST_PRETRAIN, *over])
    with pytest.raises(XLNetError) as e:
        pretrain(cfg, rec, tmp_path / "run", device="cuda", quiet=True)
    msg = str(e.value)
    found = re.search(r"training diverged at step (\d+): .*the update was not applied", msg)
    assert found and "\n" not in msg, msg
    saved = [int(p.name.split("_")[1]) for p in (tmp_path / "run").glob("step_*")]
    assert all(s < int(found.group(1)) for s in saved), (saved, msg)


def test_engine_stream_pins_its_batches_on_the_current_device(builds):
    """pin_memory (pretraining on CUDA): every tensor of a prefetched batch is page-locked, so that its non-blocking
    copy to the device does not wait for the device's queue."""
    from clitools import FAST_PRETRAIN

    from xlnetcli.data.records.stream import PretrainStream

    stream = PretrainStream(builds.pipeline(FAST_PRETRAIN).records, "train", 0, 1, 2, dense=False, pin_memory=True)
    try:
        b = next(iter(stream))
        assert all(v.is_pinned() for v in b.values() if isinstance(v, torch.Tensor))
    finally:
        stream.close()


def test_engine_reads_a_steps_figures_without_waiting_for_the_work_queued_after_them():
    """The deferred check reads step N's loss and gradient norm while step N+1's kernels are queued: the read waits
    for the copy queued behind step N, not for the device's whole queue (a plain .item() would)."""
    import time

    from xlnetcli.train.step_figures import HostCopy

    values = torch.tensor([2.5, 0.75], device=CUDA) * 2
    figures = HostCopy(values)
    torch.cuda._sleep(2_000_000_000)  # about a second of device time queued after the copy: "the next step"
    t0 = time.perf_counter()
    assert figures.read() == [5.0, 1.5]
    waited = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.cuda.synchronize()
    queued = time.perf_counter() - t0
    assert waited < 0.25 * queued, (waited, queued)
