"""The (inverse) metric of Hamiltonian Monte Carlo, shared by every HMC-type sampler.

An inverse metric ``M⁻¹`` is ``None`` (identity), a vector (diagonal) or a matrix (dense);
momenta are drawn from N(0, M) (Neal 2011, section 5.4.1), and the ideal ``M⁻¹`` is the
target's covariance.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

InvMetric = np.ndarray | None


def draw_momenta(rng: np.random.Generator, inv_metric: InvMetric, n: int, dims: int
                 ) -> np.ndarray:
    """``n`` momenta (rows) from N(0, M), M = (M⁻¹)⁻¹."""
    z = rng.standard_normal((n, dims))
    if inv_metric is None:
        return z
    if inv_metric.ndim == 1:
        return z / np.sqrt(inv_metric)
    # M = (M^-1)^-1 = U^-1 U^-T for M^-1 = U^T U, so p = U^-1 z has covariance M.
    upper = linalg.cholesky(inv_metric, lower=False)
    return linalg.solve_triangular(upper, z.T, lower=False).T


def squared_jumps(positions: np.ndarray, inv_metric: InvMetric) -> np.ndarray:
    """Squared distances between consecutive rows of ``positions`` in the metric's norm
    ``‖Δx‖²_M = Δxᵀ M Δx`` (plain Euclidean for the identity), one per jump."""
    dx = np.diff(positions, axis=0)
    if inv_metric is None:
        return np.einsum("ij,ij->i", dx, dx)
    if inv_metric.ndim == 1:
        return np.einsum("ij,ij->i", dx, dx / inv_metric)
    return np.einsum("ij,ij->i", dx, linalg.solve(inv_metric, dx.T, assume_a="pos").T)
