"""Rank-normalised split R-hat, bulk and tail ESS and MCSE of many columns at once
(Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021, *Rank-normalization, folding, and
localization: an improved R-hat*, Bayesian Analysis 16:667, sections 3–4), computed as
ArviZ computes them (``arviz.ess`` with ``method="bulk"``, ``"tail"``, ``arviz.rhat``,
``arviz.mcse`` with ``method="mean"``, ``"sd"``), vectorised over the columns.

ArviZ runs its estimators one column at a time in Python (rank, normal scores, FFT
autocovariance, Geyer's initial monotone sequence), so that on models with many
parameters and cheap gradients a run spent longer in its diagnostics than in its chains
(``benchmarks/bench_diagnostics.py`` measures both).  Here each
step is one array operation over all columns: the same ranks (scipy's ``rankdata``,
ties averaged), Blom's normal scores, ArviZ's FFT autocovariance along the draws and
its quantiles (R's type 7, scipy's ``mquantiles`` formula), and Geyer's truncation
written over all columns at once.  The truncation of Geyer's initial positive sequence
(Geyer 1992, as in Stan) stops at the first pair of autocorrelations whose sum is not
positive; the monotone sequence is then the running minimum of the pair sums.  Each
column's split draws are sorted once, for the normal scores, the tail quantiles, the
folded draws' ranks and any quantiles asked for (the summary's, the tail check's); blocks
of columns run in threads.  Results
equal ArviZ's to rounding (``tests/test_rank_diagnostics.py`` checks them against the
installed ArviZ on chains with ties, heavy tails, constant and NaN columns).

Where a C++ compiler is at hand, all five are computed by ``csrc/ahmc_diagnostics.cpp``
(:data:`NATIVE`), the same steps fused per column: a sort of the split draws (into
buckets between their extremes, then by insertion; a radix sort where the draws crowd
into a few buckets); the normal scores looked up in a table of the scores of every whole
and half rank (:func:`_score_table`, by scipy's ``ndtri``); the folded draws' order by
merging the sorted draws below and above the median; autocovariances summed lag by lag
up to Geyer's truncation (for the MCSEs those of the split draws and of their squared
deviations), and for the tail indicators counted from the positions of their rarer
value, the sorted draws on its side of the quantile.  Numpy computes what the library
leaves: a column with a value that is not finite, an ESS whose truncation lies past the
library's lags (there the FFT is the cheaper), an odd number of draws.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.special import ndtri

__all__ = ["diagnostics", "CONVERGENCE_KEYS", "ess_bulk", "ess_tail", "rhat", "mcse_mean",
           "mcse_sd", "arviz_diagnostics", "row_quantiles"]

_BLOM = 3 / 8
KEYS = ("ess_bulk", "ess_tail", "r_hat", "mcse_mean", "mcse_sd")


def next_fast_len(target: int) -> int:
    """The smallest 2^a 3^b 5^c ≥ ``target`` (``scipy.fftpack.next_fast_len``, the FFT
    length ArviZ pads to; here to spare importing scipy.fft)."""
    if target <= 6:
        return max(int(target), 1)
    best, p5 = 2 ** int(target - 1).bit_length(), 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            p2 = p35 << max(0, (-(-target // p35) - 1).bit_length())  # p35·2^k ≥ target
            best = min(best, p2)
            p35 *= 3
        p5 *= 5
    return best


def _split(x: np.ndarray) -> np.ndarray:
    """``(k, chain, draw)`` → ``(k, 2·chain, draw // 2)``: each chain's first and last
    halves (the middle draw of an odd count left out), as ArviZ's ``_split_chains``."""
    half = x.shape[2] // 2
    return np.concatenate([x[:, :, :half], x[:, :, x.shape[2] - half:]], axis=1)


def _ties(ordered: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where sorted rows hold ties: the flat indices of the tied positions, each one's
    tie (0, 1, ... in flat order) and each tie's rank, the mean of its ranks (1-based,
    within its row).  Only the tied positions are indexed (a rejected proposal repeats a
    draw: a sixth of them, say)."""
    k, n = ordered.shape
    same = np.zeros((k, n + 1), bool)  # same[:, i]: position i equals position i - 1
    np.equal(ordered[:, 1:], ordered[:, :-1], out=same[:, 1:n])
    tied = np.flatnonzero(same[:, :n] | same[:, 1:])  # equal to its left or right
    if tied.size == 0:
        return tied, tied, np.zeros(0)
    first = ~same[:, :n].ravel()[tied]  # a tie's first position
    tie = np.cumsum(first) - 1
    column = tied[first] % n  # no tie spans two rows: a row's first position starts one
    length = np.bincount(tie)
    return tied, tie, 0.5 * (column + 1 + column + length)  # ranks column+1 .. column+length


def _sorted(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's sorting permutation and the sorted row."""
    order = np.argsort(rows, axis=1)
    return order, np.take_along_axis(rows, order, axis=1)


def _rank_transform(order: np.ndarray, ordered: np.ndarray, f=lambda ranks: ranks
                    ) -> np.ndarray:
    """``f`` of each row's ranks 1..n, ties given their average, in the row's own order,
    from its sorting permutation and sorted values: ``f`` of ranks 1..n once, scattered
    by the permutation; only tied positions (a rejected proposal repeats a draw) get
    ``f`` of their mean rank."""
    k, n = ordered.shape
    values = np.tile(f(np.arange(1.0, n + 1.0)), k)
    tied, tie, mean_rank = _ties(ordered)
    values[tied] = f(mean_rank)[tie]
    out = np.empty((k, n))
    np.put_along_axis(out, order, values.reshape(k, n), axis=1)
    return out


def _ranks(rows: np.ndarray) -> np.ndarray:
    """Ranks 1..n along each row, ties given their average (scipy's ``rankdata`` with
    ``method="average"``; the average does not depend on the order within a tie, so an
    unstable sort serves)."""
    return _rank_transform(*_sorted(rows))


def _normal_scores(order: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """Blom's normal scores of each row's ranks, ties averaged (``scipy.stats.norm.ppf``
    is ``ndtri``)."""
    n = ordered.shape[1]
    return _rank_transform(order, ordered, lambda r: ndtri((r - _BLOM) / (n - 2 * _BLOM + 1)))


def _z_scale(x: np.ndarray) -> np.ndarray:
    """Normal scores of the ranks of each column's draws, ties averaged (Blom's offset)."""
    k = x.shape[0]
    return _normal_scores(*_sorted(x.reshape(k, -1))).reshape(x.shape)


def _ess(x: np.ndarray) -> np.ndarray:
    """ESS of each column of ``(k, chain, draw)`` (Geyer's initial monotone sequence of
    the chains' averaged autocorrelations; a column that does not vary: its draws)."""
    x = np.asarray(x, dtype=float)
    k, n_chain, n_draw = x.shape
    size = n_chain * n_draw
    if k == 0:
        return np.zeros(0)
    flat = x.reshape(k, size)
    constant = (flat.max(axis=1) - flat.min(axis=1)) < np.finfo(float).resolution
    m = next_fast_len(2 * n_draw)
    chain_mean = x.mean(axis=2)
    spectrum = np.fft.rfft(x - chain_mean[:, :, None], n=m, axis=2)
    # The chains' mean autocovariance: the inverse transform of their mean power
    # spectrum (the transform is linear), one inverse transform per column.
    power = (np.abs(spectrum) ** 2).mean(axis=1)  # contiguous, unlike .real and .imag
    mean_acov = np.fft.irfft(power, n=m, axis=1)[:, :n_draw] / n_draw  # (k, n_draw)
    mean_var = mean_acov[:, 0] * n_draw / (n_draw - 1.0)
    var_plus = mean_var * (n_draw - 1.0) / n_draw
    if n_chain > 1:
        var_plus = var_plus + np.var(chain_mean, axis=1, ddof=1)
    rho = 1.0 - (mean_var[:, None] - mean_acov) / var_plus[:, None]
    rho[:, 0] = 1.0
    # Pairs j = 0, 1, ...: rho[2j] + rho[2j+1]; pair j >= 1 is looked at while pair
    # j - 1's sum is > 0 and 2j - 1 < n_draw - 3.  J: the first pair not looked at.
    n_pairs = max((n_draw - 3) // 2 + 1, 1)  # j = 1 .. n_pairs - 1 within the bound
    pairs = rho[:, 0:2 * n_pairs:2] + rho[:, 1:2 * n_pairs:2]  # (k, n_pairs)
    goes_on = pairs[:, :n_pairs - 1] > 0.0 if n_pairs > 1 else np.zeros((k, 0), bool)
    goes_on = goes_on & (2 * np.arange(1, n_pairs) - 1 < n_draw - 3)
    stops = np.concatenate([~goes_on, np.ones((k, 1), bool)], axis=1)
    J = np.argmax(stops, axis=1) + 1  # pairs 1 .. J-1 were looked at
    rows = np.arange(k)
    last = J - 1  # the last pair looked at (0: none)
    last_sum = pairs[rows, last]
    last_even = np.where(J > 1, rho[rows, 2 * last], 1.0)
    # Pairs 1 .. J-2 all had positive sums: kept, then made monotone (running minimum,
    # starting from pair 0).  Pair J-1's even term is kept if its pair sum is >= 0 or
    # the term itself is > 0 ("improve estimation"); its odd term is beyond max_t.
    monotone = np.minimum.accumulate(pairs, axis=1)
    cols = np.arange(n_pairs)
    body = np.where(cols[None, :] <= (J - 2)[:, None], monotone, 0.0).sum(axis=1)
    keep_even = (J > 1) & ((last_sum >= 0.0) | (last_even > 0.0)) | (J == 1)
    extra = np.where(keep_even, last_even, 0.0)
    tau = -1.0 + 2.0 * body + extra
    tau = np.maximum(tau, 1 / np.log10(size))
    ess = size / tau
    # ArviZ returns nan when a kept autocorrelation is nan.
    kept_nan = (np.isnan(monotone) & (cols[None, :] <= (J - 2)[:, None])).any(axis=1)
    kept_nan |= np.isnan(rho[:, 1]) | (keep_even & np.isnan(last_even))
    return np.where(constant, float(size), np.where(kept_nan, np.nan, ess))


def _valid(x: np.ndarray, min_chains: int) -> np.ndarray:
    """Columns ArviZ computes: no nan, at least 4 draws and ``min_chains`` chains."""
    ok = ~np.isnan(x).any(axis=(1, 2))
    if x.shape[2] < 4 or x.shape[1] < min_chains:
        ok[:] = False
    return ok


def _rhat_plain(x: np.ndarray) -> np.ndarray:
    """Gelman–Rubin R-hat of each column of ``(k, chain, draw)``."""
    n = x.shape[2]
    chain_mean = x.mean(axis=2)
    between = n * np.var(chain_mean, axis=1, ddof=1)
    within = np.var(x, axis=2, ddof=1).mean(axis=1)
    return np.sqrt((between / within + n - 1) / n)


def _by_column(values: np.ndarray) -> np.ndarray:
    """``(chain, draw, k)`` → ``(k, chain, draw)`` as floats."""
    return np.ascontiguousarray(np.moveaxis(np.asarray(values, dtype=float), 2, 0))


def _blocks(n_columns: int, threads: int) -> list[tuple[int, int]]:
    """(start, stop) of blocks of at most :data:`BLOCK` columns, as many per thread and
    of equal size to a column (100 columns in two threads: four of 25, not 32, 32, 32
    and 4, which leave one thread 64 columns and the other 36); a block has at least
    :data:`MIN_BLOCK` columns, so that a few columns stay in one block."""
    if n_columns <= 0:
        return []
    per_round = max(1, threads)
    count = per_round * -(-n_columns // (per_round * BLOCK))
    count = max(1, min(count, n_columns // MIN_BLOCK))
    edges = [n_columns * i // count for i in range(count + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _in_blocks(block, n_columns: int) -> list:
    """``block(start, stop)`` for the column blocks of :func:`_blocks`, in :func:`_threads`
    threads when there are several (numpy's sorts, transforms and ufuncs release the
    GIL).  Every statistic is computed column by column, so the blocks do not change a
    value."""
    threads = _threads()
    blocks = _blocks(n_columns, threads)
    workers = min(threads, len(blocks))
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(lambda b: block(*b), blocks))
    return [block(*b) for b in blocks]


def _quantile_ess(x: np.ndarray, prob: float, ordered: np.ndarray) -> np.ndarray:
    """ESS of the indicator ``x <= q_prob`` (q: R's type-7 quantile, in the arithmetic of
    scipy's ``mquantiles`` with ``alphap = betap = 1``)."""
    n = ordered.shape[1]
    aleph = n * prob + (1.0 - prob)
    k = int(np.floor(min(max(aleph, 1), n - 1)))
    gamma = min(max(aleph - k, 0.0), 1.0)
    q = (1.0 - gamma) * ordered[:, k - 1] + gamma * ordered[:, k]
    return _ess(_split((x <= q[:, None, None]).astype(float)))


def _tail(x, ordered=None):
    """Tail ESS; ``ordered``: each column's draws sorted, if at hand."""
    if ordered is None:
        ordered = np.sort(x.reshape(x.shape[0], -1), axis=1)
    low, high = _quantile_ess(x, 0.05, ordered), _quantile_ess(x, 0.95, ordered)
    return np.where(high < low, high, low)  # Python's min(low, high), nan as ArviZ


def _median_of_sorted(ordered: np.ndarray) -> np.ndarray:
    """``np.median`` of each sorted row (the middle value, or the mean of the two)."""
    half = ordered.shape[1] // 2
    if ordered.shape[1] % 2:
        return ordered[:, half]
    return ordered[:, half - 1:half + 1].mean(axis=1)


def _rhat_rank(split: np.ndarray, order: np.ndarray, ordered: np.ndarray,
               z: np.ndarray) -> np.ndarray:
    """The larger of the split R-hats of the normal scores ``z`` of the split draws and of
    the folded split draws (|x − median|).  ``order`` and ``ordered``: the split draws'
    sorting, per column, which the folded draws' sorting starts from.  (Any sort serves:
    tied draws get the same score whatever their order.  The default sort is the faster:
    ties break the falling run that a stable one would merge in linear time.)"""
    folded = np.abs(ordered - _median_of_sorted(ordered)[:, None])
    merge, folded_sorted = _sorted(folded)
    folded_z = _normal_scores(np.take_along_axis(order, merge, axis=1), folded_sorted)
    bulk, tail = _rhat_plain(z), _rhat_plain(folded_z.reshape(split.shape))
    return np.where(tail > bulk, tail, bulk)  # Python's max(bulk, tail), nan as ArviZ


def _split_and_scores(x: np.ndarray):
    """The split draws, their sorting per column (permutation, values) and their normal
    scores, shared by the bulk ESS, the tail ESS and R-hat."""
    split = _split(x)
    order, ordered = _sorted(split.reshape(split.shape[0], -1))
    return split, order, ordered, _normal_scores(order, ordered).reshape(split.shape)


def _mcse_mean(x):
    sd = np.std(x.reshape(x.shape[0], -1), axis=1, ddof=1)
    return sd / np.sqrt(_ess(_split(x)))


def _mcse_sd(x):
    flat = x.reshape(x.shape[0], -1)
    sims_c2 = (x - flat.mean(axis=1)[:, None, None]) ** 2
    ess = _ess(_split(sims_c2))
    c2 = sims_c2.reshape(x.shape[0], -1)
    evar = c2.mean(axis=1)
    varvar = ((c2 ** 2).mean(axis=1) - evar ** 2) / ess
    return np.sqrt(varvar / evar / 4)


def ess_bulk(values: np.ndarray) -> np.ndarray:
    """``arviz.ess(values[:, :, j], method="bulk")`` for every column j of a
    ``(chain, draw, column)`` array."""
    return diagnostics(values, ("ess_bulk",))["ess_bulk"]


def ess_tail(values: np.ndarray) -> np.ndarray:
    """``arviz.ess(..., method="tail")`` (the 5 % and 95 % quantiles) per column."""
    return diagnostics(values, ("ess_tail",))["ess_tail"]


def rhat(values: np.ndarray) -> np.ndarray:
    """``arviz.rhat`` (rank-normalised split R-hat, the larger of bulk and folded)."""
    return diagnostics(values, ("r_hat",))["r_hat"]


def mcse_mean(values: np.ndarray) -> np.ndarray:
    """``arviz.mcse(..., method="mean")`` per column."""
    return diagnostics(values, ("mcse_mean",))["mcse_mean"]


def mcse_sd(values: np.ndarray) -> np.ndarray:
    """``arviz.mcse(..., method="sd")`` per column."""
    return diagnostics(values, ("mcse_sd",))["mcse_sd"]


#: At most this many threads: a block's temporaries take about 15 MB at peak (4 × 1000 draws).
MAX_THREADS = 8


def _threads() -> int:
    """The cores this process may run on, at most :data:`MAX_THREADS`: :func:`diagnostics`
    computes its blocks in as many threads."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_THREADS))


#: At most this many columns per block in :func:`diagnostics`, so that a block's
#: temporaries stay in the caches (measured faster than all columns at once from a few
#: hundred columns on) ...
BLOCK = 32
#: ... and at least this many, unless there are fewer (two threads on four columns each
#: were measured no faster than one thread on the eight).
MIN_BLOCK = 8


#: The three that convergence is judged by (the MCSEs are left out where only these serve).
CONVERGENCE_KEYS = ("ess_bulk", "ess_tail", "r_hat")


def diagnostics(values: np.ndarray, keys=KEYS, probs=()) -> dict[str, np.ndarray]:
    """Those of the five named in ``keys`` (default all) of a ``(chain, draw, column)``
    array: ``ess_bulk``, ``ess_tail``, ``r_hat``, ``mcse_mean``, ``mcse_sd`` (the split
    and the normal scores shared), in blocks of columns (:func:`_blocks`); nan where
    ArviZ gives nan, without warnings.  With ``probs``, also ``quantiles``: each column's
    (all chains' draws) at ``probs``, ``(column, prob)``, :func:`row_quantiles`' values
    from the sort the others share."""
    values = np.asarray(values, dtype=float)
    keys = tuple(k for k in KEYS if k in keys)
    probs = tuple(float(p) for p in probs)

    def block(start: int, stop: int) -> dict[str, np.ndarray]:
        with np.errstate(all="ignore"):  # infinite draws give nan, as in ArviZ
            return _diagnostics_block(_by_column(values[:, :, start:stop]), keys, probs)

    blocks = _in_blocks(block, values.shape[2])
    out = {key: np.concatenate([b[key] for b in blocks] or [np.zeros(0)]) for key in keys}
    if probs:
        out["quantiles"] = np.concatenate([b["quantiles"] for b in blocks]
                                          or [np.zeros((0, len(probs)))])
    return out


def _diagnostics_block(x: np.ndarray, keys=KEYS, probs=()) -> dict[str, np.ndarray]:
    out = {key: np.full(x.shape[0], np.nan) for key in keys}
    if probs:
        out["quantiles"] = np.full((x.shape[0], len(probs)), np.nan)
    ok = _valid(x, 1)
    quantiled = np.zeros(x.shape[0], dtype=bool)
    if ok.any():
        _diagnostics_valid(x, ok, keys, probs, out, quantiled)
    if probs and not quantiled.all():  # the columns the library left, by numpy
        rows = x[~quantiled].reshape(int((~quantiled).sum()), -1)
        out["quantiles"][~quantiled] = row_quantiles(rows, probs).T
    return out


def _diagnostics_valid(x, ok, keys, probs, out, quantiled) -> None:
    """:func:`_diagnostics_block` on its valid columns ``ok``; ``quantiled`` marks those
    whose quantiles the library wrote."""
    native = [key for key in KEYS if key in out
              and (key != "r_hat" or x.shape[1] >= 2)]  # R-hat needs two chains
    y = x[ok]
    # each statistic where the native library did not compute it, by numpy
    rest = {key: ~done for key, done in _native_block(y, native, out, ok, probs).items()}
    if probs:
        quantiled[np.flatnonzero(ok)] = ~rest.pop("quantiles")
    columns = np.flatnonzero(ok)
    ranked = [key for key in ("ess_bulk", "ess_tail", "r_hat")
              if key in rest and rest[key].any()]
    if ranked:
        redo = np.logical_or.reduce([rest[key] for key in ranked])
        split, order, ordered, z = _split_and_scores(y[redo])
        numpy = {"ess_bulk": lambda: _ess(z),
                 # an even number of draws: the split holds them all
                 "ess_tail": lambda: _tail(y[redo], ordered if y.shape[2] % 2 == 0 else None),
                 "r_hat": lambda: _rhat_rank(split, order, ordered, z)}
        for key in ranked:
            left = rest[key]
            out[key][columns[redo][left[redo]]] = numpy[key]()[left[redo]]
    for key, mcse in (("mcse_mean", _mcse_mean), ("mcse_sd", _mcse_sd)):
        if key in rest and rest[key].any():
            out[key][columns[rest[key]]] = mcse(y[rest[key]])
    return out


#: Whether :func:`diagnostics` computes its statistics in the native
#: library (``csrc/ahmc_diagnostics.cpp``) where it can be built: the same statistics to
#: rounding, several times faster (``benchmarks/bench_diagnostics.py``).
NATIVE = True
_WANT = {"ess_bulk": 1, "ess_tail": 2, "r_hat": 4, "mcse_mean": 16, "mcse_sd": 32}
_SCORED = 8  # the library's flag: a column's normal scores written for numpy's bulk ESS
_QUANTILED = 64  # ... and its quantiles written


@functools.lru_cache(maxsize=8)
def _score_table(n: int) -> np.ndarray:
    """Blom's normal scores of the ranks 1, 1.5, 2, ..., n of n draws (a tie's mean rank
    is a whole or half number), each as :func:`_normal_scores` computes it."""
    table = ndtri((np.arange(2 * n - 1) * 0.5 + 1.0 - _BLOM) / (n - 2 * _BLOM + 1))
    table.flags.writeable = False
    return table


def _native_block(y: np.ndarray, keys: list[str], out: dict[str, np.ndarray],
                  where: np.ndarray, probs=()) -> dict[str, np.ndarray]:
    """The statistics ``keys`` of the columns ``y`` (``(k, chain, draw)``) by the native
    library, written into ``out[key]`` at the columns ``where`` selects; returns, for each
    of ``keys``, which columns it computed (none where it cannot run: odd draws, no
    library; see ``ahmc_rank_diagnostics`` for the others it leaves).  A bulk ESS whose
    autocorrelations reach past the library's lags is computed here, by the FFT
    (:func:`_ess`), from the normal scores the library returns.  With ``probs``, the
    quantiles too (``out["quantiles"]``, and ``"quantiles"`` in the returned dict)."""
    k, chains, draws = y.shape
    done = np.zeros(k, np.intc)
    values = {key: np.full(k, np.nan) for key in _WANT}
    quantiles = np.full((k, len(probs)), np.nan)
    entry = (_native_entry() if NATIVE and (keys or probs) and draws % 2 == 0 and draws >= 4
             else None)
    if entry is not None:
        y = np.ascontiguousarray(y, dtype=float)
        table = _score_table(chains * draws)
        z = np.empty((k, chains * draws)) if "ess_bulk" in keys else None
        at = np.asarray(probs, dtype=float)
        if entry(y.ctypes.data, k, chains, draws, table.ctypes.data,
                 sum(_WANT[key] for key in keys),
                 *[values[key].ctypes.data for key in _WANT], done.ctypes.data,
                 None if z is None else z.ctypes.data, at.ctypes.data, len(probs),
                 quantiles.ctypes.data):
            done[:] = 0
        scored = (done & _SCORED) != 0  # the bulk ESS left to the FFT, from the scores
        if scored.any():
            values["ess_bulk"][scored] = _ess(z[scored].reshape(-1, 2 * chains, draws // 2))
            done[scored] |= _WANT["ess_bulk"]
    computed = {key: (done & _WANT[key]) != 0 for key in keys}
    columns = np.flatnonzero(where)
    for key, yes in computed.items():
        out[key][columns[yes]] = values[key][yes]
    if probs:
        computed["quantiles"] = yes = (done & _QUANTILED) != 0
        out["quantiles"][columns[yes]] = quantiles[yes]
    return computed


def _native_entry():
    from .native import rank_diagnostics_entry

    return rank_diagnostics_entry()


def row_quantiles(rows: np.ndarray, probs) -> np.ndarray:
    """``np.quantile(rows, probs, axis=1)`` (its default, linear, method) to the last bit,
    from a sort of each row's copy: numpy's vectorised sort is faster than the partition
    about several indices that ``np.quantile`` makes (``benchmarks/ab_calls.py``
    measures whole calls).  A row holding NaN is left to ``np.quantile`` (nan)."""
    ordered = np.array(rows, dtype=float, order="C")  # a copy with each row contiguous
    ordered.sort(axis=1)  # (np.sort keeps a transposed view's layout: strided, slower)
    if ordered.size == 0 or np.isnan(ordered[:, -1]).any():  # NaN sorts last
        return np.quantile(rows, probs, axis=1)
    n = ordered.shape[1]
    virtual = (n - 1) * np.asarray(probs, dtype=float)
    below = np.clip(np.floor(virtual), 0, n - 1)
    above = np.clip(below + 1, 0, n - 1)
    gamma = (virtual - below)[:, None]
    a, b = ordered[:, below.astype(np.intp)].T, ordered[:, above.astype(np.intp)].T
    diff = b - a  # numpy's _lerp: from the nearer end
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)


def arviz_diagnostics(values: np.ndarray) -> dict[str, np.ndarray]:
    """The same five by ArviZ itself, one column at a time (its ufunc over a Dataset of
    one ``(chain, draw, column)`` variable): the reference that the tests and
    ``benchmarks/bench_diagnostics.py`` compare :func:`diagnostics` with."""
    import warnings

    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ArviZ's import-time notice; nan columns
        import arviz as az

        values = np.asarray(values, dtype=float)
        ds = xr.Dataset({"v": (("chain", "draw", "column"), values)})
        out = {"ess_bulk": az.ess(ds, method="bulk"), "ess_tail": az.ess(ds, method="tail"),
               "r_hat": az.rhat(ds), "mcse_mean": az.mcse(ds, method="mean"),
               "mcse_sd": az.mcse(ds, method="sd")}
    return {k: np.asarray(v["v"].values, dtype=float).reshape(values.shape[2])
            for k, v in out.items()}
