"""Zero-mean Gaussian-process regression with a squared-exponential ARD kernel.

The surrogate of Wang, Mohamed & de Freitas (ICML 2013), Section 3:

    f ~ GP(0, k),   k(γ, γ') = σ_f² exp(−½ (γ − γ')ᵀ Σ⁻¹ (γ − γ')),
    Σ = diag([κ (b_u − b_l)]²)  per dimension of Γ, κ = 0.2,
    r = f(γ) + η,   η ~ N(0, σ_η²),
    μ_i(γ)  = kᵀ (K + σ_η² I)⁻¹ r,
    σ_i²(γ) = k(γ, γ) − kᵀ (K + σ_η² I)⁻¹ k.

(The paper prints the kernel as ``exp(−½ γ_iᵀ Σ⁻¹ γ_j)``; the stationary form in the
difference is meant, as in the thesis (Wang 2012, §3.1) and every SE-ARD kernel.)
The tuner passes unit-cube coordinates and length scale ``κ`` per dimension, which is the
same kernel as length scale ``κ (b_u − b_l)`` in box units.

Why not scikit-learn's ``GaussianProcessRegressor``: the paper fixes every
hyperparameter (length scales, unit signal variance, noise), so there is nothing for its
marginal-likelihood optimiser to do; ``n`` is tiny (the number of distinct γ tried, which
grows sub-linearly under annealing, paper Section 3 last paragraph); and a 30-line
Cholesky solve with :func:`scipy.linalg.cho_factor` / :func:`~scipy.linalg.cho_solve` is
faster, exact, transparent to test and adds no dependency.

Repeated observations at an identical input are merged *exactly*: ``n_j`` observations
with mean ``ȳ_j`` at ``x_j`` give the same posterior over ``f`` as the single observation
``ȳ_j`` with noise variance ``σ_η² / n_j``.  Because AHMC keeps γ fixed for long stretches
(``p_i → 0``), the kernel matrix has one row per *distinct* γ.  It is refactorised
(``O(u³)``, ``u`` distinct points) lazily, only when a prediction is asked for after new
data; for ``u`` up to a few thousand that is well under a second.

On the tuner's candidate grid (a read-only array of ``m`` points predicted again and
again) the posterior is carried over instead: ``A⁻¹ = (K + diag(σ_η²/n_j))⁻¹``,
``W = k(grid, inputs) A⁻¹`` and the grid's quadratic forms ``q = k·A⁻¹k`` are updated
for what changed since the last prediction — a new distinct input by the block-inverse
formula, more observations at an input (its noise σ_η²/n_j shrinks) by Sherman–Morrison
— at ``O(m u)`` each instead of ``O(m u²)`` for the triangular solve of every grid point.
Between two moves of the tuner only the current γ gains data, so a move costs ``O(m u)``.
Every :attr:`REFRESH_EVERY` updates the carried state is recomputed from scratch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve, solve_triangular
from scipy.linalg.blas import dger as _dger

__all__ = ["DEFAULT_NOISE_VAR", "se_ard_kernel", "kernel_terms", "GaussianProcess"]

#: Default observation-noise variance σ_η², in units of the (unit) prior signal variance.
#: The tuner's acquisition uses ``s·μ`` with ``s = α / r_max`` (best reward ↦ α = 4, see
#: :mod:`.bayesopt`), which is the same as a GP on rewards scaled so the best one is 4; 0.1
#: is then a noise s.d. of ≈0.32, ≈8 % of the best reward.  The ICML paper states no value;
#: the authors' thesis code (ziyuw/AHMC ``src/gpbo.py``) passes ``noise=0.01`` to its GP.
#: This is a judgement call, not a fitted value: on two synthetic (ε, L) rewards (the smooth
#: bump of ``tests/test_tuning.py`` and an ESJD-like ``sin²(εL/2)/√L`` ridge; 8–12 % reward
#: noise; 10 seeds × 200 updates) 0.01, 0.1, 0.25 and 1.0 all ended in the top decile; 0.1 smooths single noisy blocks a little more than 0.01 while still
#: letting one early reward steer the search.  Repeated blocks at one γ shrink the effective
#: noise there as σ_η²/n.
DEFAULT_NOISE_VAR = 0.1


def se_ard_kernel(
    x1: np.ndarray, x2: np.ndarray, length_scales: Sequence[float] | np.ndarray, signal_var: float = 1.0,
    terms1: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """``σ_f² exp(−½ Σ_j ((x1_j − x2_j)/ℓ_j)²)`` for all pairs; shapes ``(n, d), (m, d) → (n, m)``.
    ``terms1`` (:func:`kernel_terms` of ``x1``) skips recomputing them for a fixed ``x1``."""
    a, a2 = kernel_terms(x1, length_scales) if terms1 is None else terms1
    b, b2 = kernel_terms(x2, length_scales)
    sq = a2[:, None] + b2[None, :] - 2.0 * (a @ b.T)
    np.maximum(sq, 0.0, out=sq)
    return signal_var * np.exp(-0.5 * sq)


def kernel_terms(x: np.ndarray, length_scales) -> tuple[np.ndarray, np.ndarray]:
    """The scaled points ``x/ℓ`` and their squared norms, as :func:`se_ard_kernel` uses."""
    a = np.atleast_2d(np.asarray(x, dtype=float)) / np.asarray(length_scales, dtype=float)
    return a, (a * a).sum(1)


def _with_room(buf: np.ndarray, used: int, need: int) -> np.ndarray:
    """``buf`` (Fortran order) if it has ``need`` columns, else a copy of its first
    ``used`` columns in one with room to grow."""
    if buf.shape[1] >= need:
        return buf
    grown = np.empty((buf.shape[0], max(2 * need, 16)), order="F")
    grown[:, :used] = buf[:, :used]
    return grown


class GaussianProcess:
    """Zero-mean GP regression with fixed SE-ARD hyperparameters (paper Section 3).

    Parameters
    ----------
    length_scales:
        One length scale per input dimension (``κ = 0.2`` on the unit cube in the paper).
    noise_var:
        Gaussian observation-noise variance σ_η² (default :data:`DEFAULT_NOISE_VAR`).
    signal_var:
        Prior variance ``k(γ, γ)``; the paper's kernel has 1.
    jitter:
        Diagonal jitter used only if the exact Cholesky factorisation fails (then ×10 per
        further failure); with σ_η² > 0 and merged repeats it is essentially never needed.
    """

    def __init__(
        self,
        length_scales: Sequence[float] | np.ndarray,
        noise_var: float = DEFAULT_NOISE_VAR,
        signal_var: float = 1.0,
        jitter: float = 1e-10,
    ):
        self.length_scales = np.asarray(length_scales, dtype=float).ravel()
        if np.any(self.length_scales <= 0):
            raise ValueError("length scales must be positive")
        if noise_var < 0 or signal_var <= 0:
            raise ValueError("need noise_var >= 0 and signal_var > 0")
        self.noise_var = float(noise_var)
        self.signal_var = float(signal_var)
        self.jitter = float(jitter)
        self._index: dict[tuple[float, ...], int] = {}
        self._x: list[np.ndarray] = []
        self._sum: list[float] = []
        self._count: list[int] = []
        self._factor: tuple[np.ndarray, np.ndarray] | None = None  # (lower Cholesky L, α)
        self._data: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # _arrays()
        self._point: tuple[np.ndarray, np.ndarray] | None = None   # scaled inputs, A⁻¹
        # Cross-kernel cache for one fixed, read-only candidate array (the tuner's grid):
        # a new distinct input then costs one new column instead of a full recomputation.
        # Capped at ``cache_max_elements`` doubles (160 MB); beyond that, recompute.
        self.cache_max_elements = 20_000_000
        self._cand: np.ndarray | None = None
        self._cand_K = np.empty((0, 0))
        self._cand_n = 0  # columns of _cand_K in use
        self._carried: dict | None = None  # A⁻¹, W, q and the noise they include

    # ----------------------------------------------------------------- data
    @property
    def ndim(self) -> int:
        return self.length_scales.size

    @property
    def n_observations(self) -> int:
        """Total number of observations added."""
        return int(sum(self._count))

    @property
    def n_unique(self) -> int:
        """Number of distinct inputs (rows of the kernel matrix)."""
        return len(self._x)

    @property
    def inputs(self) -> np.ndarray:
        """Distinct inputs, shape ``(u, d)`` (kept until the data change; read-only)."""
        return self._arrays()[0]

    @property
    def counts(self) -> np.ndarray:
        """Number of observations at each distinct input (read-only)."""
        return self._arrays()[1]

    @property
    def means(self) -> np.ndarray:
        """Mean observed value at each distinct input (read-only)."""
        return self._arrays()[2]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._data is None:
            inputs = np.array(self._x, dtype=float).reshape(-1, self.ndim)
            counts = np.array(self._count, dtype=int)
            means = np.array(self._sum, dtype=float) / np.maximum(counts, 1)
            for a in (inputs, counts, means):
                a.setflags(write=False)
            self._data = (inputs, counts, means)
        return self._data

    def add(self, x: Sequence[float] | np.ndarray, y: float) -> None:
        """Add one observation ``y = f(x) + η``."""
        self.add_many(x, [y])

    def add_many(self, x: Sequence[float] | np.ndarray, ys: Sequence[float]) -> None:
        """Add observations ``y_1, y_2, ...`` all at ``x``, as :meth:`add` in turn does."""
        xa = np.asarray(x, dtype=float).ravel()
        if xa.size != self.ndim:
            raise ValueError(f"expected an input of length {self.ndim}, got {xa.size}")
        ys = [float(y) for y in ys]
        if not all(np.isfinite(ys)) or not np.all(np.isfinite(xa)):
            raise ValueError("inputs and observations must be finite")
        if not ys:
            return
        key = tuple(xa.tolist())
        j = self._index.get(key)
        if j is None:
            j = self._index[key] = len(self._x)
            self._x.append(xa)
            self._sum.append(ys[0])
            self._count.append(1)
            ys = ys[1:]
        total = self._sum[j]
        for y in ys:  # in order: the same sum as one add() after another
            total += y
        self._sum[j] = total
        self._count[j] += len(ys)
        self._factor = None
        self._data = None

    # ------------------------------------------------------------ posterior
    def _inverse(self) -> np.ndarray:
        """``A⁻¹ = (K + diag(σ_η²/n_j))⁻¹`` from the Cholesky factor, kept with it (with
        the scaled inputs, for :meth:`_predict_point`)."""
        L, _ = self._factorise()
        if self._point is None:
            Linv = solve_triangular(L, np.eye(len(L)), lower=True, check_finite=False)
            self._point = (self.inputs / self.length_scales, Linv.T @ Linv)
        return self._point[1]

    def _predict_point(self, x: np.ndarray) -> tuple[float, float]:
        """Mean and variance at one point from ``A⁻¹`` and the scaled inputs."""
        return self.point_predictor()(x)

    def point_predictor(self):
        """``x ↦ (μ(x), σ²(x))`` for single points ``(d,)``, with the factors of the
        current data fixed (a maximiser's inner loop: a handful of numpy calls per point;
        do not add data while using it).  With no data, the prior."""
        if self.n_unique == 0:
            return lambda x: (0.0, self.signal_var)
        _, alpha = self._factorise()
        Ainv = self._inverse()
        scaled, ls, signal = self._point[0], self.length_scales, self.signal_var

        def predict(x: np.ndarray) -> tuple[float, float]:
            diff = scaled - x / ls
            k = np.exp(np.einsum("ij,ij->i", diff, diff) * -0.5)
            k *= signal
            return float(k @ alpha), max(signal - float(k @ (Ainv @ k)), 0.0)

        return predict

    def _factorise(self) -> tuple[np.ndarray, np.ndarray]:
        if self._factor is None:
            self._point = None
            X = self.inputs
            noise = self.noise_var / self.counts
            K = se_ard_kernel(X, X, self.length_scales, self.signal_var)
            K[np.diag_indices_from(K)] += noise
            jitter = 0.0  # exact first; jitter only if the factorisation fails
            for _ in range(9):
                try:
                    c, lower = cho_factor(K + jitter * np.eye(len(K)), lower=True, check_finite=False)
                    break
                except LinAlgError:
                    jitter = self.jitter * self.signal_var if jitter == 0.0 else jitter * 10.0
            else:  # pragma: no cover - only for pathological inputs
                raise LinAlgError("kernel matrix is not positive definite even with jitter")
            alpha = cho_solve((c, lower), self.means, check_finite=False)
            self._factor = (np.tril(c), alpha)
        return self._factor

    def _cross_kernel(self, X: np.ndarray) -> np.ndarray:
        """``k(X, inputs)``, cached column-wise when ``X`` is a read-only array seen before
        (in a Fortran-ordered buffer with spare columns, so a new input writes one)."""
        if X.flags.writeable or X.shape[0] * self.n_unique > self.cache_max_elements:
            self._cand, self._cand_K = None, np.empty((0, 0))
            return se_ard_kernel(X, self.inputs, self.length_scales, self.signal_var)
        if X is not self._cand:
            self._cand, self._cand_K, self._cand_n = X, np.empty((X.shape[0], 0), order="F"), 0
            self._cand_terms = kernel_terms(X, self.length_scales)  # kept with the grid
        have, n = self._cand_n, self.n_unique
        if have < n:
            self._cand_K = _with_room(self._cand_K, have, n)
            self._cand_K[:, have:n] = se_ard_kernel(X, self.inputs[have:], self.length_scales,
                                                    self.signal_var, self._cand_terms)
            self._cand_n = n
        return self._cand_K[:, :n]

    def predict(
        self, x: Sequence[float] | np.ndarray, return_var: bool = True, chunk: int = 4096
    ) -> tuple[np.ndarray, np.ndarray] | np.ndarray:
        """Posterior mean ``μ(x)`` and variance ``σ²(x)`` of the latent ``f`` (no noise).

        ``x`` has shape ``(m, d)`` (or ``(d,)``).  With no data, returns the prior
        ``(0, σ_f²)``.  Variances are clipped at 0.  If ``x`` is a read-only array
        (``x.flags.writeable`` false, e.g. :meth:`Box.unit_grid`), ``k(x, inputs)`` is
        cached between calls, so keep such an array immutable.
        """
        X = np.atleast_2d(np.asarray(x, dtype=float))  # the same object for a 2-D float array
        if X.shape[1] != self.ndim:
            raise ValueError(f"expected inputs with {self.ndim} columns, got {X.shape}")
        m = X.shape[0]
        if self.n_unique == 0:
            mean = np.zeros(m)
            return (mean, np.full(m, self.signal_var)) if return_var else mean
        if m == 1 and return_var:  # a maximiser's single point (DIRECT): few numpy calls
            mean, var = self._predict_point(X[0])
            return np.array([mean]), np.array([var])
        cached = None if X.flags.writeable else self._cross_kernel(X)
        if cached is not None and return_var:
            return self._carried_predict(cached)
        L, alpha = self._factorise()
        Xtr = self.inputs
        mean = np.empty(m)
        var = np.empty(m) if return_var else None
        for start in range(0, m, chunk):
            sl = slice(start, min(start + chunk, m))
            if cached is None:
                Ks = se_ard_kernel(X[sl], Xtr, self.length_scales, self.signal_var)  # (c, u)
            else:
                Ks = cached[sl]
            mean[sl] = Ks @ alpha
            if return_var:
                v = solve_triangular(L, Ks.T, lower=True, check_finite=False)  # (u, c)
                var[sl] = self.signal_var - np.einsum("ij,ij->j", v, v)
        if not return_var:
            return mean
        np.maximum(var, 0.0, out=var)
        return mean, var

    #: Updates of the carried grid posterior after which it is recomputed from scratch.
    REFRESH_EVERY = 256

    def _carried_predict(self, Kc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance on the cached candidate grid (``Kc = k(grid, inputs)``) from
        the carried ``A⁻¹``, ``W``, ``q`` (module docstring), brought up to date first.
        ``W`` lives in a Fortran-ordered buffer with spare columns, updated in place by
        BLAS rank-one updates (``dger``)."""
        noise = self.noise_var / self.counts
        c = self._carried
        if c is None or c["grid"] is not self._cand or c["updates"] >= self.REFRESH_EVERY:
            c = self._carried = self._carry_from_scratch(Kc, noise)
        else:
            n_old = len(c["noise"])
            Ainv = c["Ainv"]
            W = c["W_buf"][:, :n_old]
            q = c["q"]
            for j in range(n_old):  # more observations at an input: Sherman–Morrison
                delta = noise[j] - c["noise"][j]
                if delta != 0.0:
                    a_j = Ainv[:, j].copy()
                    w_j = W[:, j].copy()
                    f = -delta / (1.0 + delta * a_j[j])
                    Ainv += f * np.outer(a_j, a_j)
                    _dger(f, w_j, a_j, a=W, overwrite_a=1)
                    w_j *= w_j
                    q += f * w_j
                    c["noise"][j] = noise[j]
                    c["updates"] += 1
            X = self.inputs if self.n_unique > n_old else None
            for j in range(n_old, self.n_unique):  # new distinct inputs: block inverse
                c["W_buf"] = _with_room(c["W_buf"], j, j + 1)
                W = c["W_buf"][:, :j]
                k = se_ard_kernel(X[:j], X[j:j + 1], self.length_scales,
                                  self.signal_var).ravel()
                b = Ainv @ k
                schur = self.signal_var + noise[j] - k @ b
                t = W @ k
                t -= Kc[:, j]
                grown_inv = np.empty((j + 1, j + 1))
                grown_inv[:j, :j] = Ainv
                grown_inv[:j, :j] += np.outer(b, b) / schur
                grown_inv[:j, j] = grown_inv[j, :j] = -b / schur
                grown_inv[j, j] = 1.0 / schur
                Ainv = c["Ainv"] = grown_inv
                _dger(1.0 / schur, t, b, a=W, overwrite_a=1)
                c["W_buf"][:, j] = t
                c["W_buf"][:, j] *= -1.0 / schur
                t *= t
                t /= schur
                q += t
                c["noise"] = np.append(c["noise"], noise[j])
                c["updates"] += 1
        mean = c["W_buf"][:, :self.n_unique] @ self.means
        var = self.signal_var - c["q"]
        np.maximum(var, 0.0, out=var)
        return mean, var

    def _carry_from_scratch(self, Kc: np.ndarray, noise: np.ndarray) -> dict:
        """``A⁻¹``, ``W = Kc A⁻¹`` and ``q`` from a Cholesky factorisation of ``A``."""
        Ainv = self._inverse().copy()  # updated in place from here on
        n = len(Ainv)
        W_buf = _with_room(np.empty((Kc.shape[0], 0), order="F"), 0, n)
        W = W_buf[:, :n]
        np.matmul(Kc, Ainv, out=W)
        return {"grid": self._cand, "Ainv": Ainv, "W_buf": W_buf,
                "q": np.einsum("ij,ij->i", W, Kc), "noise": noise.copy(), "updates": 0}
