"""How far a run is: the engine's counters (saved in every train state) and the clock of a fit."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class TrainProgress:
    """The engine's counters (torchtitan's train_state): optimizer steps done, tokens trained on, the losses of the
    steps since the last train row (their mean is logged), and the batch layout they were counted under."""

    world_size: int
    accumulation: int
    step: int = 0
    tokens_seen: int = 0
    log_window: list[float] = field(default_factory=list)

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "world_size": self.world_size,
            "accumulation": self.accumulation,
            "log_window": list(self.log_window),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.log_window = [float(v) for v in state.get("log_window", [])]


class StepClock:
    """Wall time of a fit without its pauses (evaluation, checkpoint writing): the logged throughput counts data and
    step time only, the ETA extrapolates it, and it is the summary's elapsed_s."""

    def __init__(self) -> None:
        self.start = self.interval_start = time.perf_counter()
        self.paused_s = 0.0
        self.steps = 0  # steps of this fit
        self.tokens = 0  # tokens of this fit's steps
        self.tokens_in_interval = 0  # since the last train row

    def tick(self, tokens: int) -> None:
        self.steps += 1
        self.tokens += tokens
        self.tokens_in_interval += tokens

    def interval(self, steps_left: int) -> tuple[float, float]:
        """(tokens/s over the steps since the last call, seconds left); the next interval starts now."""
        now = time.perf_counter()
        tps = self.tokens_in_interval / max(now - self.interval_start, 1e-9)
        eta = steps_left * (now - self.start - self.paused_s) / max(self.steps, 1)
        self.interval_start, self.tokens_in_interval = now, 0
        return tps, eta

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        t = time.perf_counter()
        yield
        paused = time.perf_counter() - t
        self.interval_start += paused
        self.paused_s += paused

    def elapsed(self) -> float:
        return time.perf_counter() - self.start - self.paused_s
