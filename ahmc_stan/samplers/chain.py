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
        self._discarded: dict[str, float] = {}  # evaluations of discarded iterations
        self._discard_row = 0                    # ... charged to this row by result()

    def add(self, positions: np.ndarray, **stats) -> None:
        """Append a block of iterations: rows of ``positions`` and, per statistic, a scalar
        or one value per row."""
        n_new = min(len(positions), len(self.positions) - self.n)
        block = slice(self.n, self.n + n_new)
        self.positions[block] = positions[:n_new]
        for name, value in stats.items():
            self.stats[name][block] = np.broadcast_to(value, (len(positions),))[:n_new]
        self.n += n_new

    def discard(self, start: int = 0) -> dict[str, float]:
        """Forget the iterations from row ``start`` on (a restarted warmup,
        :mod:`ahmc_stan.tuning.stuck`).  Their evaluation counts (the statistics of
        :data:`ahmc_stan.costs.COST_STATS`: ``n_grad``, ``n_hessian``, ...) are returned, and
        :meth:`result` charges them to row ``start`` (the first iteration of the new
        attempt), so that the chain's totals (and the Fit's ``n_grad_warmup``) still count
        them."""
        from ..costs import COST_STATS

        rows = slice(start, self.n)
        counts = {name: float(np.sum(self.stats[name][rows]))
                  for name in COST_STATS if name in self.stats}
        if not self._discarded:
            self._discard_row = start
        self._discard_row = min(self._discard_row, start)
        for name, amount in counts.items():
            self._discarded[name] = self._discarded.get(name, 0.0) + amount
        for values in self.stats.values():
            values[rows] = 0
        self.n = start
        return counts

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
        if self._discard_row < self.n:  # discarded iterations' evaluations (discard())
            for name, amount in self._discarded.items():
                stats[name][self._discard_row] += amount
        return ChainResult(self.positions[:self.n].copy(), stats, min(self.n, warmup),
                           max(0, self.n - warmup), time_warmup, time_sampling,
                           self.interrupted, extras)
