"""What every sampler's chain records, and hands back to ``tune_and_sample``.

A chain's recorder can also stream every block it records to a file as it is made
(:func:`streaming`, ``tune_and_sample(..., output_dir=...)``), so that a run killed outright
(not just interrupted) keeps its draws: :func:`read_stream` turns the file back into the
:class:`ChainResult` the chain had reached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

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

    def __init__(self, dims: int, capacity: int, stat_names: list[str], *,
                 stream: bool = True):
        self.positions = np.empty((capacity, dims))
        self.stats = {name: np.zeros(capacity) for name in (*COMMON_STATS, *stat_names, "phase")}
        self.n = 0
        # the chain's stream (:func:`streaming`), claimed by its first recorder; helpers'
        # recorders (the bandit's copies) pass ``stream=False``
        self._stream = _claim_stream(dims, list(self.stats)) if stream else None
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
        for name, value in stats.items():  # a scalar fills the rows, an array is cut
            self.stats[name][block] = value if np.ndim(value) == 0 else value[:n_new]
        if self._stream is not None:
            self._stream.write(self.n, self.positions[block],
                               [self.stats[k][block] for k in self._stream.stat_names])
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
        if self._stream is not None:
            self._stream.discard(start, counts)
        return counts

    def positions_since(self, start: int) -> np.ndarray:
        return self.positions[start:self.n]

    def mark_sampling_start(self, chain_start: float) -> None:
        self.sampling_start = time.perf_counter()
        self._warmup_seconds = self.sampling_start - chain_start

    # ---- the chain's run: clock, Ctrl-C, result (every single-chain sampler's loop) ----

    @contextlib.contextmanager
    def running(self, warmup: int):
        """The chain's run of ``warmup`` + draws iterations: starts its clock; a
        KeyboardInterrupt inside ends the run quietly (:attr:`interrupted`, the draws
        made so far kept).  Then :meth:`finish`."""
        self.warmup, self.chain_start = warmup, time.perf_counter()
        try:
            yield self
        except KeyboardInterrupt:
            self.interrupted = True

    def enter_sampling(self) -> None:
        """Note the start of the sampling phase (once; later calls do nothing)."""
        if self.sampling_start is None:
            self.mark_sampling_start(self.chain_start)

    def finish(self, extras: dict) -> ChainResult:
        """The :class:`ChainResult` of a :meth:`running` run (warmup and sampling times
        split where sampling started, or at the end of a warmup that completed)."""
        if self.sampling_start is None and self.n >= self.warmup:
            self.mark_sampling_start(self.chain_start)
        return self.result(self.warmup, self.chain_start, extras)

    def result(self, warmup: int, chain_start: float, extras: dict) -> ChainResult:
        now = time.perf_counter()
        if self._stream is not None:
            self._stream.file.close()
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


def thin_stats(stats: dict[str, np.ndarray], thin: int) -> dict[str, np.ndarray]:
    """Statistics (iterations on the last axis) of every ``thin``-th iteration, the
    first kept; evaluation counts (:data:`ahmc_stan.costs.COST_STATS`) summed over the
    ``thin`` iterations a kept one stands for, so totals do not change."""
    from ..costs import COST_STATS

    out = {}
    for name, values in stats.items():
        values = np.asarray(values)
        starts = np.arange(0, values.shape[-1], thin)
        if name in COST_STATS and len(starts):
            out[name] = np.add.reduceat(values, starts, axis=-1)
        else:
            out[name] = values[..., ::thin].copy()
    return out


def thin_result(result: ChainResult, warmup: int, thin: int) -> ChainResult:
    """Every ``thin``-th sampling iteration of ``result`` (the first, then every
    ``thin``-th, as CmdStan's ``thin``; :func:`thin_stats`); warmup iterations are all
    kept."""
    if thin == 1:
        return result
    n_warm, n_samp = result.n_warmup, result.n_sampling
    sampling = thin_stats({k: v[n_warm:n_warm + n_samp] for k, v in result.stats.items()},
                          thin)
    stats = {k: np.concatenate([v[:n_warm], sampling[k]]) for k, v in result.stats.items()}
    positions = np.concatenate([result.positions[:n_warm],
                                result.positions[n_warm:n_warm + n_samp:thin]])
    return dataclasses.replace(result, positions=positions, stats=stats,
                               n_sampling=len(positions) - n_warm)


# ---- streaming a chain to a file ------------------------------------------------------------
#
# File layout: one JSON header line (dims, statistic names), then records of float64 values
# ``[row, elapsed seconds, *position, *statistics]``.  ``row`` >= 0: the iterations from that
# row on (a block of several records); ``row`` = -(start + 1): the recorder discarded the
# iterations from ``start`` on (a restarted warmup), the statistics holding the discarded
# evaluation counts.  A torn last record (a killed process) is ignored on reading.

_STREAM_PATH: Path | None = None
_OPEN_STREAMS: list[_Stream] = []


@contextlib.contextmanager
def streaming(path: str | os.PathLike | None):
    """Within the block, the first :class:`ChainRecorder` created streams to ``path``;
    the file is closed when the block ends, also when the chain raised."""
    global _STREAM_PATH
    previous, _STREAM_PATH = _STREAM_PATH, None if path is None else Path(path)
    opened = len(_OPEN_STREAMS)
    try:
        yield
    finally:
        _STREAM_PATH = previous
        while len(_OPEN_STREAMS) > opened:
            _OPEN_STREAMS.pop().file.close()


class _Stream:
    def __init__(self, path: Path, dims: int, stat_names: list[str]):
        self.dims, self.stat_names = dims, stat_names
        self.start = time.perf_counter()
        self.file = open(path, "wb")
        header = {"format": "ahmc_stan.chain", "dims": dims, "stats": stat_names}
        self.file.write((json.dumps(header) + "\n").encode())
        self.file.flush()

    def write(self, row: int, positions: np.ndarray, stats: list[np.ndarray]) -> None:
        n = len(positions)
        if not n:
            return
        block = np.empty((n, 2 + self.dims + len(stats)))
        block[:, 0] = row + np.arange(n)
        block[:, 1] = time.perf_counter() - self.start
        block[:, 2:2 + self.dims] = positions
        for j, values in enumerate(stats):
            block[:, 2 + self.dims + j] = values
        self.file.write(block.tobytes())
        self.file.flush()

    def discard(self, start: int, counts: dict[str, float]) -> None:
        record = np.full(2 + self.dims + len(self.stat_names), math.nan)
        record[0] = -(start + 1)
        record[2 + self.dims:] = [counts.get(k, 0.0) for k in self.stat_names]
        self.file.write(record.tobytes())
        self.file.flush()


def _claim_stream(dims: int, stat_names: list[str]) -> _Stream | None:
    global _STREAM_PATH
    path, _STREAM_PATH = _STREAM_PATH, None
    if path is None:
        return None
    _OPEN_STREAMS.append(_Stream(path, dims, stat_names))
    return _OPEN_STREAMS[-1]


def read_stream(path: str | os.PathLike, warmup: int) -> ChainResult:
    """The :class:`ChainResult` a streamed chain had reached (flagged ``interrupted``;
    times from the records' clock; no ``extras``)."""
    from ..costs import COST_STATS

    with open(path, "rb") as f:
        header = json.loads(f.readline())
        raw = f.read()
    dims, names = header["dims"], header["stats"]
    width = 2 + dims + len(names)
    records = np.frombuffer(raw[:len(raw) // (8 * width) * 8 * width]).reshape(-1, width)
    n = 0 if not len(records) else int(max(records[:, 0].max() + 1, 0))
    positions, values = np.empty((n, dims)), np.zeros((n, len(names)))
    charged, charge_row = np.zeros(len(names)), None
    length, warm_time, last_time = 0, 0.0, 0.0
    cost = np.array([k in COST_STATS for k in names])
    discards = np.flatnonzero(records[:, 0] < 0)
    start_of = 0
    for end in [*discards, len(records)]:  # appends between discards, vectorised
        block = records[start_of:end]
        if len(block):
            rows = block[:, 0].astype(np.int64)
            positions[rows], values[rows] = block[:, 2:2 + dims], block[:, 2 + dims:]
            length, last_time = int(rows[-1]) + 1, float(block[-1, 1])
            warm = np.flatnonzero(rows < warmup)
            if len(warm):
                warm_time = float(block[warm[-1], 1])
        if end < len(records):  # forget rows from start on, keep their evaluation counts
            start = -int(records[end, 0]) - 1
            charged[cost] += records[end, 2 + dims:][cost]
            charge_row = start if charge_row is None else min(charge_row, start)
            values[start:length] = 0
            length = start
        start_of = end + 1
    if charge_row is not None and charge_row < length:
        values[charge_row] += charged
    return ChainResult(positions[:length].copy(),
                       {k: values[:length, j].copy() for j, k in enumerate(names)},
                       min(length, warmup), max(0, length - warmup), warm_time,
                       max(0.0, last_time - warm_time) if length > warmup else 0.0,
                       interrupted=True)
