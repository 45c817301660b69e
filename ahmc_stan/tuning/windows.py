"""Metric adaptation in Stan's windows (Stan Reference Manual, "HMC algorithm parameters",
automatic parameter tuning): a fast initial buffer, slow windows doubling in length in
which the covariance is estimated, and a terminal buffer; the estimate is regularised
towards a small multiple of the identity exactly as Stan does.

Besides Stan's estimate from the draws alone, :func:`fisher_inv_metric` estimates a
diagonal inverse metric from the draws *and their gradients* (Seyboldt, Carlson &
Carpenter 2026, the diagonal minimiser of their Fisher divergence)."""

from __future__ import annotations

import numpy as np
from scipy import linalg

from ..metric import LowRankInvMetric


def adaptation_windows(num_warmup: int, init_buffer: int = 75, term_buffer: int = 50,
                       base_window: int = 25,
                       early_window: int = 0) -> list[tuple[int, int]]:
    """(start, end) iteration ranges of the slow windows, Stan's rules included: with fewer
    than 20 iterations nothing is adapted; when the defaults do not fit, the buffers
    become 15% and 10% of warmup.  ``early_window`` > 0 splits the initial buffer into
    windows of that many iterations as well (the whole ones that fit)."""
    if num_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > num_warmup:
        init_buffer = int(0.15 * num_warmup)
        term_buffer = int(0.1 * num_warmup)
        base_window = num_warmup - (init_buffer + term_buffer)
    windows = [(start, start + early_window)
               for start in range(0, init_buffer - early_window + 1, early_window)
               ] if early_window > 0 else []
    start, size = init_buffer, base_window
    end_of_slow = num_warmup - term_buffer
    while start < end_of_slow:
        end = start + size
        if end + 2 * size > end_of_slow:  # the next window would not fit: stretch this one
            end = end_of_slow
        windows.append((start, end))
        start, size = end, 2 * size
    return windows


def regularized_inv_metric(draws: np.ndarray, dense: bool) -> np.ndarray:
    """Stan's regularised covariance of the window's draws: (n/(n+5)) Σ̂ + 1e-3 (5/(n+5)) I
    (the diagonal of it for a diagonal metric)."""
    n = len(draws)
    shrink, ridge = n / (n + 5.0), 1e-3 * 5.0 / (n + 5.0)
    if dense:
        cov = np.atleast_2d(np.cov(draws, rowvar=False))
        return shrink * cov + ridge * np.eye(cov.shape[0])
    return shrink * np.var(draws, axis=0, ddof=1) + ridge


#: How far below the draws' variance a gradient-based estimate may go (both agree for any
#: Gaussian): gradients that are heavy-tailed in a window, as on a steep wall, would
#: otherwise shrink a direction's scale by many orders and freeze it.  There is no bound
#: above: the draws of an early window are autocorrelated, their variance too small, and
#: the gradients' estimate right.
AGREEMENT = 10.0

#: The weight of Stan's regularisation towards the identity in :func:`fisher_inv_metric`,
#: Stan's own.  The gradients' estimate is exact for a Gaussian, where the identity's
#: share matters on scales below about 0.02; leaving it out was measured no better
#: (``comparisons/results/fisher_ridge_stop85.md``).
FISHER_RIDGE = 1e-3


def fisher_inv_metric(draws: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """The diagonal inverse metric that minimises the Fisher divergence between the
    target and the Gaussian the metric implies, estimated from the window's draws and
    the gradients of the log density there: ``M⁻¹_i = sd(x_i) / sd(∇_i log p)``, exact
    (the variance) for every Gaussian with diagonal covariance whatever the number of
    draws.  Never more than :data:`AGREEMENT` times below the draws' variance;
    regularised as :func:`regularized_inv_metric`; a coordinate whose draws or gradients
    do not vary keeps the Stan estimate."""
    n = len(draws)
    shrink, ridge = n / (n + 5.0), FISHER_RIDGE * 5.0 / (n + 5.0)
    sd_x = np.std(draws, axis=0, ddof=1)
    sd_g = np.std(grads, axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = np.where((sd_x > 0) & (sd_g > 0) & np.isfinite(sd_g), sd_x / sd_g,
                            sd_x ** 2)
    estimate = np.maximum(estimate, sd_x ** 2 / AGREEMENT)
    return shrink * estimate + ridge


#: Directions of the window's draws and gradients whose squared singular value is below
#: this fraction of the largest carry no data (the centring removes one per block, repeated
#: draws of rejections more): the span keeps the others.
SPAN_TOL = 1e-12


def _span(x: np.ndarray, g: np.ndarray):
    """Coordinates of the rows of ``x`` and ``g`` (n × d each) in an orthonormal basis of
    a space that holds all 2n rows, and the map from coordinates to the d parameters.
    With at least as many rows as parameters that space is R^d itself, in its own
    coordinates: a direction no row has data in then gets γ·I in both covariances of
    :func:`low_rank_inv_metric` and so S = I, as if it had been left out.  With fewer
    rows it is their span, from the eigendecomposition of ``AAᵀ`` (2n × 2n),
    ``A = [x; g]``.  Forming it squares A's singular values, which is safe here: every
    direction of the span carries the draws' or the gradients' spread, whichever is
    larger (for a Gaussian, after the diagonal scaling, their product is 1), so none with
    data comes near the rounding floor."""
    n, d = x.shape
    if d <= 2 * n:
        return x, g, lambda c: c
    a = np.concatenate([x, g])
    gram = a @ a.T
    w, u = np.linalg.eigh(gram)
    keep = w > SPAN_TOL * max(w[-1], 0.0)  # nothing when no row carries data
    coef = u[:, keep] / np.sqrt(w[keep])  # basis = Aᵀ·coef, orthonormal
    return gram[:n] @ coef, gram[n:] @ coef, lambda c: a.T @ (coef @ c)


#: :func:`_nothing_to_correct`'s relative margin below the bounds it proves, for rounding.
SHORTCUT_MARGIN = 1e-6


def _nothing_to_correct(chol: np.ndarray, cov_x: np.ndarray, cutoff: float) -> bool:
    """Whether :func:`low_rank_inv_metric` would keep no direction, proved without its
    two eigendecompositions: S = Cov(∇)⁻¹ # Cov(x) (the geometric mean) is monotone in
    Cov(x) and ``A # (cB) = √c (A # B)``, so when ``Cov(∇)/c ≼ Cov(x) ≼ c·Cov(∇)`` (the
    eigenvalues of ``L⁻¹ Cov(x) L⁻ᵀ``, ``Cov(∇) = L Lᵀ``, within [1/c, c]) every
    eigenvalue of S lies within [1/√c, √c], since ``Cov(∇)⁻¹ # Cov(∇) = I``; with
    √c < ``cutoff`` none is kept, unless the floor of :data:`AGREEMENT` lifts one, which
    needs a direction whose draws' variance exceeds ``AGREEMENT·cutoff`` (bounded by
    Gershgorin's discs, else the largest eigenvalue).  For a Gaussian with a diagonal
    covariance both covariances, scaled by the diagonal, are the same matrix, so this
    holds however noisy the window's draws."""
    bound = cutoff * (1 - SHORTCUT_MARGIN)
    half = linalg.solve_triangular(chol, cov_x, lower=True)
    pencil = linalg.solve_triangular(chol, half.T, lower=True)  # L⁻¹ Cov(x) L⁻ᵀ
    ends = np.diagonal(pencil)  # Rayleigh quotients: within the extreme eigenvalues
    if not (ends.min() > bound ** -2 and ends.max() < bound ** 2):
        return False
    ev = np.linalg.eigvalsh(0.5 * (pencil + pencil.T))
    if not (ev[0] > bound ** -2 and ev[-1] < bound ** 2):
        return False
    return _floor_lifts_none(cov_x, bound)


def _floor_lifts_none(cov_x: np.ndarray, bound: float) -> bool:
    """Whether no direction's draws' variance reaches ``AGREEMENT·bound``, so that the
    floor of :data:`AGREEMENT` lifts no eigenvalue of S above ``bound``: Gershgorin's
    discs bound ``cov_x``'s largest eigenvalue, else it is computed."""
    floor = AGREEMENT * bound
    if np.abs(cov_x).sum(axis=1).max() < floor:
        return True
    return bool(linalg.eigh(cov_x, eigvals_only=True,
                            subset_by_index=[len(cov_x) - 1] * 2)[0] < floor)


def _keeps_none(lam: np.ndarray, cov_x: np.ndarray, cutoff: float) -> bool:
    """Whether :func:`low_rank_inv_metric` keeps no direction of S, proved from S's
    eigenvalues ``lam`` alone (no eigenvectors: about a third of the decomposition's
    time): all within ``cutoff`` either way, by :data:`SHORTCUT_MARGIN` for rounding,
    and none the floor of :data:`AGREEMENT` could lift (:func:`_floor_lifts_none`)."""
    bound = cutoff * (1 - SHORTCUT_MARGIN)
    return bool(lam[0] > 1 / bound and lam[-1] < bound) and _floor_lifts_none(cov_x, bound)


def low_rank_inv_metric(draws: np.ndarray, grads: np.ndarray, cutoff: float = 2.0,
                        gamma: float = 1e-5) -> np.ndarray:
    """Diagonal plus low-rank inverse metric from the window's draws and gradients
    (after Seyboldt, Carlson & Carpenter 2026): with the diagonal ``D`` of
    :func:`fisher_inv_metric` as a first scaling, the Fisher-divergence minimiser among
    all inverse metrics, ``S`` with ``S·Cov(∇)·S = Cov(x)`` (the geometric mean of
    ``Cov(x)`` and ``Cov(∇)⁻¹``; exact, ``S = Σ``, for any Gaussian once the draws span
    the space), is computed in the span of the scaled draws and gradients; its
    eigendirections with eigenvalue above ``cutoff`` or below ``1/cutoff`` correct the
    diagonal, the others keep it.  ``gamma`` regularises both covariances, and no
    eigenvalue falls more than a factor :data:`AGREEMENT` below the draws' variance in
    its direction, as on the diagonal.  Returns the
    :class:`~ahmc_stan.metric.LowRankInvMetric` ``D^½ (I + V(Λ − I)Vᵀ) D^½``, or the
    vector ``D`` when no direction needs correcting (or an eigendecomposition fails)."""
    n = len(draws)
    diag = fisher_inv_metric(draws, grads)
    scale = np.sqrt(diag)
    x = (draws - draws.mean(axis=0)) / scale
    g = (grads - grads.mean(axis=0)) * scale
    try:
        xq, gq, to_params = _span(x, g)
    except (np.linalg.LinAlgError, ValueError):  # no eigendecomposition: the diagonal
        return diag
    k = xq.shape[1]
    cov_x = xq.T @ xq / max(n - 1, 1) + gamma * np.eye(k)
    cov_g = gq.T @ gq / max(n - 1, 1) + gamma * np.eye(k)
    try:  # S = L⁻ᵀ (Lᵀ Cov(x) L)^½ L⁻¹ = Y Yᵀ with Cov(∇) = L Lᵀ (then S·Cov(∇)·S = Cov(x))
        chol = np.linalg.cholesky(cov_g)
        if _nothing_to_correct(chol, cov_x, cutoff):
            return diag
        w, u = np.linalg.eigh(chol.T @ cov_x @ chol)
        y = linalg.solve_triangular(chol, u * np.clip(w, 0, None) ** 0.25, lower=True,
                                    trans="T")
        s = y @ y.T
        if _keeps_none(np.linalg.eigvalsh(s), cov_x, cutoff):
            return diag
        lam, vecs = np.linalg.eigh(s)
    except (np.linalg.LinAlgError, ValueError):
        return diag
    var_x = np.einsum("ij,ij->j", vecs, cov_x @ vecs)
    lam = np.maximum(lam, var_x / AGREEMENT)
    keep = (lam > cutoff) | (lam < 1.0 / cutoff)
    if not keep.any():  # nothing to correct: the diagonal, kept diagonal (cheaper steps)
        return diag
    return LowRankInvMetric(diag, to_params(vecs[:, keep]), lam[keep])


#: The :func:`gaussian_misfit` above which a low-rank metric's draws are taken to be far
#: from Gaussian (Gaussian posteriors give 0 to rounding, the GLMs measured up to 0.1,
#: the ZINB's skewed intercept 26–97: README, "A rule for skewed tails").
NONGAUSSIAN_MISFIT = 10.0


def gaussian_misfit(draws: np.ndarray, grads: np.ndarray) -> float:
    """How far the draws' posterior is from Gaussian, in the metric's own terms: the
    gradients' least-squares residual ``r`` on an affine function of the draws, and the
    largest eigenvalue of ``Cov(x)^½ Cov(r) Cov(x)^½`` (``r``'s covariance corrected for
    the d + 1 fitted coefficients).  For a Gaussian target ``∇ log p`` is affine in ``x``,
    so the residual, and the misfit, is 0 whatever the number of draws.  By Stein's
    identity (``Cov(x, ∇) = −I``) ``Cov(x)^½ Cov(∇) Cov(x)^½ = I + Cov(x)^½ Cov(r)
    Cov(x)^½``: the misfit is how far, along the worst direction, the draws' variance and
    the inverse of the gradients' differ, which :func:`low_rank_inv_metric` splits the
    difference between.  ``nan`` with too few draws (n ≤ d + 2) or values that are not
    finite."""
    n, d = draws.shape
    if n <= d + 2 or not (np.isfinite(draws).all() and np.isfinite(grads).all()):
        return float("nan")
    x = draws - draws.mean(axis=0)
    sd = np.std(x, axis=0)
    sd[sd == 0] = 1.0
    x, g = x / sd, (grads - grads.mean(axis=0)) * sd  # the misfit is scale-free
    gram = x.T @ x
    try:  # gram = L Lᵀ serves the fit and the square root: Lᵀ A L ~ Cov(x)^½ A Cov(x)^½
        low = linalg.cholesky(gram, lower=True, check_finite=False)
        collinear = not np.diag(low).min() > 1e-6 * np.diag(low).max()
    except linalg.LinAlgError:
        collinear = True
    if collinear:  # least squares and the symmetric square root, as defined
        coef, *_ = np.linalg.lstsq(x, g, rcond=None)
        r = g - x @ coef
        w, v = np.linalg.eigh(gram / (n - 1))
        half = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
        return float(np.linalg.eigvalsh(half @ (r.T @ r / (n - d - 1)) @ half)[-1])
    r = g - x @ linalg.cho_solve((low, True), x.T @ g, check_finite=False)
    low = low / np.sqrt(n - 1)
    return float(linalg.eigvalsh(low.T @ (r.T @ r / (n - d - 1)) @ low, check_finite=False,
                                 subset_by_index=[d - 1, d - 1])[-1])
