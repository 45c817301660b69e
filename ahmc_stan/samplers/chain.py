"""What every sampler's chain records, and hands back to ``tune_and_sample``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

#: Per-iteration statistics every sampler records (the Fit's required columns).
COMMON_STATS = ("accept_stat", "n_grad", "divergent")


@dataclass
class ChainResult:
    """One chain's unconstrained positions and per-iteration statistics, warmup first."""

    positions: np.ndarray              # (iterations done, dims)
    stats: dict[str, np.ndarray]       # name -> (iterations done,)
    n_warmup: int                      # warmup iterations done
    n_sampling: int                    # sampling iterations done
    time_warmup: float
    time_sampling: float
    interrupted: bool = False
    extras: dict = field(default_factory=dict)


class ChainRecorder:
    """Preallocated storage for a chain's positions and statistics."""

    def __init__(self, dims: int, capacity: int, stat_names: list[str]):
        self.positions = np.empty((capacity, dims))
        self.stats = {name: np.zeros(capacity) for name in (*COMMON_STATS, *stat_names, "phase")}
        self.n = 0
        self.interrupted = False
        self.sampling_start: float | None = None
        self._warmup_seconds = 0.0

    def add(self, positions: np.ndarray, **stats) -> None:
        """Append a block of iterations: rows of ``positions`` and, per statistic, a scalar
        or one value per row."""
        n_new = min(len(positions), len(self.positions) - self.n)
        block = slice(self.n, self.n + n_new)
        self.positions[block] = positions[:n_new]
        for name, value in stats.items():
            self.stats[name][block] = np.broadcast_to(value, (len(positions),))[:n_new]
        self.n += n_new

    def positions_since(self, start: int) -> np.ndarray:
        return self.positions[start:self.n]

    def mark_sampling_start(self, chain_start: float) -> None:
        self.sampling_start = time.perf_counter()
        self._warmup_seconds = self.sampling_start - chain_start

    def result(self, warmup: int, chain_start: float, extras: dict) -> ChainResult:
        now = time.perf_counter()
        if self.sampling_start is None:
            time_warmup, time_sampling = now - chain_start, 0.0
        else:
            time_warmup, time_sampling = self._warmup_seconds, now - self.sampling_start
        stats = {k: v[:self.n].copy() for k, v in self.stats.items()}
        return ChainResult(self.positions[:self.n].copy(), stats, min(self.n, warmup),
                           max(0, self.n - warmup), time_warmup, time_sampling,
                           self.interrupted, extras)
