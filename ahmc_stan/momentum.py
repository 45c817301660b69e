"""Ordered overrelaxation of the momentum (Neal 1998, *Suppressing random walks in Markov
chain Monte Carlo using ordered overrelaxation*; Alfaki, Subbey & Haugland 2008, slide
"Applying over-relaxation to P").

With an identity or diagonal metric the components of ``p ~ N(0, M)`` are independent, so
the conditional of ``p_j`` given the others is ``N(0, M_jj)``.  Per component: draw K
values from that conditional, let ``r`` be the number of them below ``p_j`` (the rank of
``p_j`` among the K + 1 values, 0..K) and take the value of mirrored rank ``K − r``.
This update leaves ``N(0, M)`` invariant and satisfies detailed balance with respect to it
(Neal 1998, section 3).  K = 1 is a fresh Gibbs draw; as K grows the new value tends to
the mirror image ``−p_j`` (quantile ``1 − F(p_j)``).
"""

from __future__ import annotations

import numpy as np

from .metric import InvMetric

__all__ = ["ordered_overrelaxation"]


def ordered_overrelaxation(rng: np.random.Generator, p: np.ndarray, num_candidates: int,
                           inv_metric: InvMetric = None) -> np.ndarray:
    """Neal's ordered overrelaxation of every component of ``p ~ N(0, M)`` with
    ``num_candidates`` (K ≥ 1) values per component; ``inv_metric`` is None (identity) or
    the diagonal of M⁻¹.  Returns a new array; ``p`` is not modified."""
    if num_candidates < 1:
        raise ValueError("num_candidates (K) must be at least 1")
    if inv_metric is not None and np.ndim(inv_metric) != 1:
        raise ValueError("ordered overrelaxation needs an identity or diagonal metric")
    p = np.asarray(p, dtype=float)
    sd = 1.0 if inv_metric is None else 1.0 / np.sqrt(inv_metric)  # sd of p_j is sqrt(M_jj)
    z = p / sd
    candidates = rng.standard_normal((num_candidates, len(z)))
    rank = np.count_nonzero(candidates < z, axis=0)
    ordered = np.sort(np.vstack([candidates, z]), axis=0)
    return ordered[num_candidates - rank, np.arange(len(z))] * sd
