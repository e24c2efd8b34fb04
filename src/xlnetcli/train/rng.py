"""The random number generators of a process: seeding, their state in a checkpoint (tensors and plain values only:
``save_tree`` stores nothing else), and the seed of a resume with another layout."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    legacy = np.random.get_state()  # the global RandomState is MT19937: its legacy tuple (the stub also allows a dict)
    assert isinstance(legacy, tuple)
    name, keys, pos, has_gauss, cached = legacy
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.set_rng_state_all(state["cuda"])


class RandomState:
    """This process's random number generators (python, numpy, torch, CUDA): dropout masks and sampling continue
    after a resume as they would have. A process's generators have no counterpart in another layout: a resume with
    another number of processes or micro-batch size calls ``reseed`` instead (``load_state_dicts``)."""

    def __init__(self, reseed: Callable[[], None] | None = None) -> None:
        self.reseed = reseed

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state)

    def load_state_dicts(self, states: list[dict]) -> None:
        assert self.reseed is not None  # only elastic runs re-assign their rank states
        self.reseed()


def layout_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank ``rank``'s generators after a resume at ``step`` with another layout: deterministic, so two
    such resumes give the same run, but its dropout masks are not the uninterrupted run's."""
    return int(np.random.SeedSequence([seed, step, rank, 0x1A7]).generate_state(1)[0])
