"""The (inverse) metric of Hamiltonian Monte Carlo, shared by every HMC-type sampler.

An inverse metric ``M⁻¹`` is ``None`` (identity), a vector (diagonal), a matrix (dense) or
a :class:`LowRankInvMetric` (diagonal plus low rank, O(dk) per product); momenta are drawn
from N(0, M) (Neal 2011, section 5.4.1), and the ideal ``M⁻¹`` is the target's covariance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import linalg


@dataclass(frozen=True, eq=False)
class LowRankInvMetric:
    """``M⁻¹ = S (I + V(Λ − I)Vᵀ) S`` with ``S = diag(√diag)``, ``V`` (d × k) orthonormal
    columns and ``Λ = diag(vals)`` (:func:`~ahmc_stan.tuning.windows.low_rank_inv_metric`).
    ``packed`` is the layout the C layer reads (``low_rank_metric`` in
    ``csrc/ahmc_bridge.cpp``)."""

    diag: np.ndarray
    vecs: np.ndarray
    vals: np.ndarray
    packed: np.ndarray = field(init=False, repr=False)
    ndim = 2  # not a vector: code that tells diagonal from dense metrics treats it as dense

    def __post_init__(self):
        diag = np.ascontiguousarray(self.diag, dtype=float)
        vecs = np.ascontiguousarray(np.reshape(self.vecs, (len(diag), -1)), dtype=float)
        vals = np.ascontiguousarray(self.vals, dtype=float)
        object.__setattr__(self, "diag", diag)
        object.__setattr__(self, "vecs", vecs)
        object.__setattr__(self, "vals", vals)
        object.__setattr__(self, "packed", np.concatenate([
            [float(len(vals))], np.sqrt(diag), 1 / np.sqrt(diag), vals - 1,
            vals ** -0.5 - 1, vecs.ravel()]))

    def __matmul__(self, v: np.ndarray) -> np.ndarray:
        """``M⁻¹ v`` (``v``: a vector or d × m columns)."""
        s = np.sqrt(self.diag).reshape((-1,) + (1,) * (np.ndim(v) - 1))
        w = s * v
        return s * (w + self.vecs @ ((self.vals - 1).reshape((-1,) + (1,) * (np.ndim(v) - 1))
                                     * (self.vecs.T @ w)))

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``M v``: ``S⁻¹ (I + V(Λ⁻¹ − I)Vᵀ) S⁻¹ v``."""
        s = 1 / np.sqrt(self.diag).reshape((-1,) + (1,) * (np.ndim(v) - 1))
        w = s * v
        return s * (w + self.vecs @ ((1 / self.vals - 1).reshape(
            (-1,) + (1,) * (np.ndim(v) - 1)) * (self.vecs.T @ w)))

    def to_dense(self) -> np.ndarray:
        return self @ np.eye(len(self.diag))

    def as_dict(self) -> dict:
        return {"diag": self.diag, "vecs": self.vecs, "vals": self.vals}


InvMetric = np.ndarray | LowRankInvMetric | None


def as_native(inv_metric: InvMetric) -> InvMetric:
    """The inverse metric as the C layer takes it: C-contiguous float64 arrays (a
    :class:`LowRankInvMetric` carries its own packed array)."""
    if inv_metric is None or isinstance(inv_metric, LowRankInvMetric):
        return inv_metric
    return np.ascontiguousarray(inv_metric, dtype=float)


def metric_record(inv_metric: InvMetric):
    """What a Fit keeps of an inverse metric (arrays; a low-rank one as its factors)."""
    return inv_metric.as_dict() if isinstance(inv_metric, LowRankInvMetric) else inv_metric


def from_record(record) -> InvMetric:
    """The inverse metric :func:`metric_record` kept (the inverse of that function)."""
    if isinstance(record, dict):
        return LowRankInvMetric(record["diag"], record["vecs"], record["vals"])
    return None if record is None else np.asarray(record, dtype=float)


def draw_momenta(rng: np.random.Generator, inv_metric: InvMetric, n: int, dims: int
                 ) -> np.ndarray:
    """``n`` momenta (rows) from N(0, M), M = (M⁻¹)⁻¹."""
    z = rng.standard_normal((n, dims))
    if inv_metric is None:
        return z
    if isinstance(inv_metric, LowRankInvMetric):  # S⁻¹ (I + V(Λ^-½ − I)Vᵀ) z
        w = z.T
        out = w + inv_metric.vecs @ ((inv_metric.vals ** -0.5 - 1)[:, None]
                                     * (inv_metric.vecs.T @ w))
        return (out / np.sqrt(inv_metric.diag)[:, None]).T
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
    if isinstance(inv_metric, LowRankInvMetric):
        return np.einsum("ij,ij->i", dx, inv_metric.solve(dx.T).T)
    if inv_metric.ndim == 1:
        return np.einsum("ij,ij->i", dx, dx / inv_metric)
    return np.einsum("ij,ij->i", dx, linalg.solve(inv_metric, dx.T, assume_a="pos").T)
