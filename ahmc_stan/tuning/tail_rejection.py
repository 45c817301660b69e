"""Rejections concentrated in a parameter's tail: the step size too large for that region.

Transitions that start in a parameter's tail (its lowest or highest :data:`TAIL_FRACTION`
of the draws) rejected at a rate (1 − mean ``accept_stat``) of at least
:data:`TAIL_REJECTION_MIN` and at least :data:`TAIL_REJECTION_RATIO` times the rate from
its central half.  The chains then visit that tail too rarely (README, "tail
rejections").  :func:`tail_rejections` is the statistic; the diagnosis of a fit
(:mod:`ahmc_stan.convergence`) applies it to the pooled draws, and AHMC's tuning phase
to one chain's own draws (:func:`ahmc_stan.samplers.ahmc.run_tuned_chain`,
``tail_check``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..rank_diagnostics import row_quantiles

__all__ = ["TAIL_FRACTION", "REGION_PROBS", "TAIL_REJECTION_MIN", "TAIL_REJECTION_RATIO",
           "TailRejection", "tail_rejections"]

#: A parameter's tails: its lowest and highest this fraction of the draws.
TAIL_FRACTION = 0.1
#: Transitions from a tail rejected at least this often ...
TAIL_REJECTION_MIN = 0.25
#: ... and at least this many times as often as from the parameter's central half.
TAIL_REJECTION_RATIO = 2.5
#: A central half that never rejects counts as this rate in the ratio.
_MID_FLOOR = 0.01
#: The quantiles that bound a column's regions: its tails and its central half.
REGION_PROBS = (TAIL_FRACTION, 0.25, 0.75, 1 - TAIL_FRACTION)


class TailRejection(NamedTuple):
    ratio: float   #: the tail's rejection rate over the central half's (floored)
    column: int    #: the column of ``x``
    side: str      #: "low" or "high"
    rate: float    #: the tail's rejection rate
    mid_rate: float  #: the central half's (in the tail's strata)


def tail_rejections(x: np.ndarray, rejected: np.ndarray,
                    min_ratio: float = TAIL_REJECTION_RATIO,
                    strata: np.ndarray | None = None, quantiles: np.ndarray | None = None
                    ) -> list[TailRejection]:
    """The columns of ``x`` (n × k: the positions the n transitions start from) with a
    tail whose transitions were rejected too often (module docstring; ``min_ratio`` times
    the central half's rate), worst first.
    ``rejected`` (n,) is each transition's rejection rate, 1 − ``accept_stat``.  A side
    counts only with at least 10 transitions from it and from the central half, and
    holding at most half of them (a column with many ties).

    ``strata`` (n,), labels of the transitions (AHMC's chains: their step size below or
    above the window's median): the tail's rate is then compared with the central
    half's rate *in the same strata*, weighted as the tail's transitions fall in them
    (indirect standardisation), so that rejections that come with a stratum (a block
    of large steps spent near one point) are not taken for the tail's.  Without it,
    one stratum: the ratio of the two rates.

    ``quantiles`` (4 × k): each column's at :data:`REGION_PROBS`, which bound its
    regions; default those of ``x``'s own rows."""
    x = np.asarray(x, dtype=float)
    rej = np.asarray(rejected, dtype=float).reshape(-1)
    q = row_quantiles(x.T, REGION_PROBS) if quantiles is None else np.asarray(quantiles)
    labels = np.zeros(x.shape[0], dtype=int) if strata is None else np.asarray(strata)
    in_stratum = (labels == np.unique(labels)[:, None]).astype(float)  # (strata, n)
    n_strata = in_stratum.shape[0]
    # per column of a region: its transitions, their rejection rates summed, and both
    # per stratum, as one product (the counts are exact; the sums round as BLAS adds)
    weights = np.vstack([np.ones(x.shape[0]), rej, in_stratum, in_stratum * rej])
    regions = {"low": x <= q[0], "high": x >= q[3], "mid": (x > q[1]) & (x < q[2])}
    sums = {r: weights @ m.astype(float) for r, m in regions.items()}
    n = {r: s[0] for r, s in sums.items()}
    rate = {r: s[1] / np.maximum(n[r], 1) for r, s in sums.items()}
    # each stratum's central rate (the whole central half's where the stratum holds
    # fewer than 10 of its transitions)
    k = sums["mid"][2:2 + n_strata]
    expected = np.where(k >= 10, sums["mid"][2 + n_strata:] / np.maximum(k, 1), rate["mid"])

    def tail_mean(per_stratum: np.ndarray, side: str) -> np.ndarray:
        """The mean over the side's transitions of their stratum's value."""
        return (per_stratum * sums[side][2:2 + n_strata]).sum(axis=0) / np.maximum(n[side], 1)

    found = []
    for side in ("low", "high"):
        ok = (n[side] >= 10) & (n[side] <= 0.5 * x.shape[0]) & (n["mid"] >= 10)
        mid_rate = tail_mean(expected, side)
        floored = tail_mean(np.maximum(expected, _MID_FLOOR), side)
        ratio = rate[side] / np.maximum(floored, _MID_FLOOR)
        bad = ok & (rate[side] >= TAIL_REJECTION_MIN) & (ratio >= min_ratio)
        found += [TailRejection(float(ratio[i]), int(i), side, float(rate[side][i]),
                                float(mid_rate[i])) for i in np.flatnonzero(bad)]
    found.sort(key=lambda f: (f.ratio, f.column, f.side), reverse=True)
    return found
