"""Process-group setup for `torchrun` (single node or multi-node rendezvous) and small collective helpers.

    env = init_distributed("auto")      # reads RANK / WORLD_SIZE / LOCAL_RANK (set by torchrun); 1 process otherwise
    model = wrap_model(model, env, "ddp")   # or "fsdp" (FSDP2 fully_shard per layer, then the root)
    ...
    all_reduce_sum(t); barrier(); cleanup()

Backend: nccl when the device is CUDA, gloo on CPU. Without torchrun (no WORLD_SIZE or WORLD_SIZE=1) no process group
is created and every helper is a no-op, so the same training code runs in one plain process.
Only rank 0 logs and writes files (`env.is_main`).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import resource
except ImportError:  # pragma: no cover - not on POSIX
    resource = None  # type: ignore[assignment]

from xlnetcli.core.errors import ConfigError, XLNetError


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None  # None: no process group (one process)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise XLNetError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


def resolve_device(device: str | None, local_rank: int = 0) -> torch.device:
    """'auto' (or None): cuda:<local_rank> when CUDA is available, else cpu. 'cuda' -> cuda:<local_rank>."""
    if device in (None, "", "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{local_rank}"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise XLNetError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise XLNetError(f"device {device} requested but CUDA is not available; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise XLNetError(f"device {device} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise XLNetError("device mps requested but MPS is not available; use --device cpu")
    return dev


def init_distributed(device: str | None = "auto", timeout_s: float = 1800.0) -> DistEnv:
    """Create the process group when launched by torchrun (WORLD_SIZE > 1); return this process's place in it."""
    world = _env_int("WORLD_SIZE", 1)
    _env_int("RANK", 0)  # checked here so a malformed RANK fails early; the rank itself comes from the group
    local_rank = _env_int("LOCAL_RANK", 0)
    dev = resolve_device(device, local_rank)
    if world <= 1:
        return DistEnv(0, 1, 0, dev, None)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not tdist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise XLNetError("WORLD_SIZE > 1 but MASTER_ADDR is not set; launch with torchrun --nproc-per-node N ...")
        kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
        if dev.type == "cuda":
            kwargs["device_id"] = dev
        tdist.init_process_group(**kwargs)
    return DistEnv(tdist.get_rank(), tdist.get_world_size(), local_rank, dev, backend)


def cleanup() -> None:
    """Destroy the process group. Garbage first: DDP's backward leaves reference cycles that hold gloo work; freed
    after the group, at the interpreter's exit, they abort the process ("terminate called without an active
    exception", about a third of 2-process CPU runs with torch 2.13; none after collecting them here)."""
    if tdist.is_available() and tdist.is_initialized():
        gc.collect()
        tdist.destroy_process_group()


def in_group() -> bool:
    """Whether this process is one of several in a process group (the collectives below are no-ops otherwise)."""
    return tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1


def world_and_rank() -> tuple[int, int]:
    """(processes, this one's rank) of the process group; (1, 0) in one process."""
    return (tdist.get_world_size(), tdist.get_rank()) if in_group() else (1, 0)


def barrier() -> None:
    if in_group():
        tdist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In place sum over ranks (no-op in one process); returns ``t``."""
    if in_group():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    if in_group():
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    if in_group():
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
        t /= tdist.get_world_size()
    return t


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s object on every rank (pickled)."""
    if not in_group():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's object, in rank order, on every rank."""
    if not in_group():
        return [obj]
    out: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool, device: torch.device | str = "cpu") -> bool:
    """True on every rank when ``flag`` is True on at least one (e.g. a non-finite loss or an OOM on one rank)."""
    if not in_group():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    all_reduce_max(t)
    return bool(t.item() > 0)


def wrap_model(
    model: torch.nn.Module, env: DistEnv, strategy: str = "ddp", layer_types: tuple[type, ...] = ()
) -> torch.nn.Module:
    """DDP (default) or FSDP2 ``fully_shard`` (each module of ``layer_types``, then the root); unchanged in one process.

    Every rank must have built the same model (same seed); DDP also broadcasts rank 0's weights at construction.
    """
    if not env.distributed:
        return model
    if strategy == "ddp":
        ids = [env.device.index] if env.device.type == "cuda" else None
        return DDP(model, device_ids=ids)
    if strategy == "fsdp":
        try:  # imported here: torch.distributed.fsdp takes seconds to import and only FSDP runs need it
            from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - heavy, only FSDP runs need it
        except ImportError:  # pragma: no cover - torch < 2.6
            raise XLNetError("train.distributed=fsdp needs torch >= 2.6 (FSDP2 fully_shard); use ddp") from None
        for module in model.modules():
            if layer_types and isinstance(module, layer_types):
                fully_shard(module)
        fully_shard(model)
        return model
    raise XLNetError(f"train.distributed must be ddp or fsdp, got {strategy!r}")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DDP and torch.compile wrappers (FSDP2 shards in place: the module itself)."""
    while True:
        orig = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(orig, torch.nn.Module):
            model = orig
        elif isinstance(model, DDP):
            model = model.module
        else:
            return model


def is_fsdp(model: torch.nn.Module) -> bool:
    try:  # lazy, as in wrap_model
        from torch.distributed.fsdp import FSDPModule  # noqa: PLC0415 - heavy, only FSDP runs need it
    except ImportError:  # pragma: no cover
        return False
    return isinstance(unwrap(model), FSDPModule)


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA allocations on a GPU, resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    if resource is None:  # pragma: no cover - not on POSIX
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def set_deterministic(enabled: bool) -> None:
    """Bit-identical runs on GPUs: deterministic kernels (torch.use_deterministic_algorithms; an op without one warns
    rather than fails) and cuBLAS's fixed workspace. CPU kernels are deterministic either way."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled, warn_only=True)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 where the device runs it fast (a CUDA GPU with bf16 support), else fp32; any other value is
    kept."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def cpu_has_bf16() -> bool:
    """This CPU has bf16 matrix instructions (AVX512-BF16 or AMX): bf16 autocast ran 1.5-2.2x faster than fp32 on
    such a CPU (BENCHMARKS.md, engine vs HF), and 2.1-2.4x slower without them (issue 33: tiny model, seq 128)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's, private: absent means no
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def checked_precision(
    precision: str, device: torch.device, key: str, warn: Callable[[str], None], fix: str | None = None
) -> str:
    """``precision`` (named ``key``: a config key or an option) as a run on ``device`` uses it: auto resolved
    (``resolve_precision``); fp16 on a CPU refused (its autocast overflows the attention mask's -1e30); bf16 on a CPU
    without bf16 instructions kept, with one line through ``warn`` saying what it costs and the ``fix``."""
    if device.type == "cpu" and precision == "fp16":
        raise ConfigError(f"{key}=fp16 needs a CUDA device (use auto or fp32 on CPU)")
    if device.type == "cpu" and precision == "bf16" and not cpu_has_bf16():
        warn(
            f"[yellow]warning:[/yellow] {key}=bf16 on a CPU runs about 2x slower than fp32 here (no bf16 "
            f"instructions); use {fix or f'{key}=auto or fp32'}"
        )
    return resolve_precision(precision, device)


def autocast_ctx(device: torch.device, precision: str):
    """Mixed precision for a forward pass: nothing for fp32, else torch.autocast in bf16 or fp16 (auto: as
    resolve_precision; a run resolves it once at its start)."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
