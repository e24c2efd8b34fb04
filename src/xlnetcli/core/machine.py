"""What the machine has: memory of the host or of a CUDA device, for checks before allocating (config/sizes.py)."""

from __future__ import annotations

import contextlib
import os
from typing import Any


def host_ram() -> int | None:
    """Physical memory in bytes (os.sysconf; None where the platform does not say)."""
    with contextlib.suppress(ValueError, OSError, AttributeError):
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        if pages > 0 and size > 0:
            return int(pages * size)
    return None


def memory_bytes(device: Any = None) -> tuple[int | None, str]:
    """(bytes of memory, its name for a message): the CUDA device's total memory for a CUDA ``device`` (a string or
    torch.device), else host RAM."""
    name = str(device) if device is not None else "cpu"
    if name.startswith("cuda"):
        import torch  # noqa: PLC0415 - only CUDA runs ask

        if torch.cuda.is_available():
            index = torch.device(name).index
            _, total = torch.cuda.mem_get_info(index if index is not None else torch.cuda.current_device())
            return int(total), f"GPU {name}"
    return host_ram(), "this machine's RAM"
