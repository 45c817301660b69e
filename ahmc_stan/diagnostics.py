"""The efficiency criteria of Alfaki, Subbey & Haugland (2008, slide "Evaluation Criteria"):
integrated autocorrelation time, effective sample size, and the spectral estimate of the
variance of the sample mean of Dunkley, Bucher, Ferreira, Moodley & Skordis (2005, *Fast
and reliable MCMC for cosmological parameter estimation*, MNRAS 356, 925, section 3).

Conventions.  A chain is an array ``(draws,)`` or ``(chains, draws)``; autocovariances are
averaged over chains (each about its own mean), as Stan and ArviZ do.

* ``τ_int = ½ + Σ_{t≥1} ρ(t)`` (so an independent chain has τ_int = ½), with the sum cut by
  Geyer's initial monotone sequence of pair sums ρ(2k) + ρ(2k+1) (Geyer 1992) — unlike a
  fixed window it keeps the negative correlations of antithetic chains; ``N_eff =
  N/(2 τ_int)`` with N the draws of all chains.
* Spectral: the chain, standardised by σ₀ (its sample sd unless given), has periodogram
  ``P_j = |N^{-1/2} Σ_n x_n e^{iκ_j n}|²`` at ``κ_j = 2πj/N``, ``j = 1..⌊(N−1)/2⌋``;
  ``E P_j`` is the spectral density, ≡ 1 for independent draws.  The template
  ``P(κ) = P₀ (κ*/κ)^α / ((κ*/κ)^α + 1)`` is fitted by least squares to
  ``ln P_j + γ_E`` (``ln P_j`` of an exponential variable has mean ``ln E P_j − γ_E``;
  with several chains the mean of their ``ln P_j``).  Then ``σ²_x̄ = P₀ σ₀²/N`` (the
  variance of one chain's mean), the convergence ratio ``r = σ²_x̄/σ₀² = P₀/N`` and the
  dimensionless efficiency ``E = (σ₀²/N)/σ²_x̄ = 1/P₀`` (1 for independent draws).
  α ≥ 0: the template cannot rise with κ, so for antithetic chains (P(0) < 1) P₀ is the
  level of the flat part it fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["autocorrelation", "integrated_autocorr_time", "effective_sample_size",
           "SpectralFit", "spectral_fit", "spectral_template", "talk_criteria"]

EULER_GAMMA = 0.5772156649015329
#: The fit is redone on the frequencies κ ≤ WINDOW·κ*, where the template's low-frequency
#: form (P₀ − P₀(κ/κ*)^α + …) is what matters for P(0); never on fewer than
#: MIN_FREQUENCIES.  κ* ≥ κ_{J_MIN} keeps some frequencies on the plateau, and α ≥ ALPHA_MIN
#: excludes the degenerate α → 0 (P ≡ P₀/2).
WINDOW = 1.0
MIN_FREQUENCIES = 50
J_MIN = 10
ALPHA_MIN = 1.0


def _chains(x) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2 or x.shape[1] < 4:
        raise ValueError("a chain is (draws,) or (chains, draws) with at least 4 draws")
    return x


def autocorrelation(x) -> np.ndarray:
    """ρ(t), t = 0..N−1, from the autocovariance (divisor N, by FFT) averaged over chains."""
    x = _chains(x)
    n = x.shape[1]
    centred = x - x.mean(axis=1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(centred, size, axis=1)
    acov = np.fft.irfft(f * np.conj(f), size, axis=1)[:, :n].mean(axis=0) / n
    return acov / acov[0] if acov[0] > 0 else np.full(n, np.nan)


def integrated_autocorr_time(x) -> float:
    """``τ_int = ½ + Σ_{t≥1} ρ(t)``, the sum cut by Geyer's initial monotone sequence."""
    rho = autocorrelation(x)
    if not np.isfinite(rho[0]):
        return math.nan
    pairs = rho[: 2 * (len(rho) // 2)].reshape(-1, 2).sum(axis=1)  # Γ_k = ρ(2k) + ρ(2k+1)
    first_negative = np.flatnonzero(pairs <= 0)
    pairs = pairs[: first_negative[0] if len(first_negative) else len(pairs)]
    pairs = np.minimum.accumulate(pairs) if len(pairs) else pairs
    # Σ_{t≥0} ρ(t) = Σ_k Γ_k, so τ_int = Σ_k Γ_k − ½ (never below 1/(2N), ESS ≤ N·N).
    n_total = _chains(x).size
    return max(float(pairs.sum()) - 0.5, 1.0 / (2.0 * n_total)) if len(pairs) else 0.5


def effective_sample_size(x) -> float:
    """``N_eff = N / (2 τ_int)`` over all draws of all chains."""
    return _chains(x).size / (2.0 * integrated_autocorr_time(x))


def spectral_template(kappa, p0: float, kappa_star: float, alpha: float):
    """``P(κ) = P₀ (κ*/κ)^α / ((κ*/κ)^α + 1)`` (Dunkley et al. 2005, eq. 12)."""
    u = (kappa_star / np.asarray(kappa, dtype=float)) ** alpha
    return p0 * u / (u + 1.0)


@dataclass(frozen=True)
class SpectralFit:
    """The fitted template and what the talk derives from it (per chain of ``n`` draws)."""

    p0: float           # P(0), in units of σ₀²
    kappa_star: float   # turnover frequency κ* (radians per draw)
    alpha: float
    n: int              # draws per chain
    sigma0_sq: float    # σ₀², the variance the chain was standardised by

    @property
    def var_mean(self) -> float:
        """σ²_x̄ = P(0) σ₀² / N, the variance of a chain's mean."""
        return self.p0 * self.sigma0_sq / self.n

    @property
    def r(self) -> float:
        """Convergence ratio ``σ²_x̄ / σ₀² = P(0)/N`` (the talk asks for < 0.01)."""
        return self.p0 / self.n

    @property
    def efficiency(self) -> float:
        """Dimensionless efficiency ``E = (σ₀²/N) / σ²_x̄ = 1/P(0)``."""
        return 1.0 / self.p0


def spectral_fit(x, sigma0: float | None = None, max_refits: int = 3) -> SpectralFit:
    """Fit the template to the periodogram of ``x`` ((draws,) or (chains, draws))."""
    x = _chains(x)
    n = x.shape[1]
    sigma0_sq = float(np.var(x, ddof=1)) if sigma0 is None else float(sigma0) ** 2
    if not sigma0_sq > 0:
        raise ValueError("the chain is constant")
    z = (x - x.mean(axis=1, keepdims=True)) / math.sqrt(sigma0_sq)
    j = np.arange(1, (n - 1) // 2 + 1)
    power = np.abs(np.fft.fft(z, axis=1)[:, j]) ** 2 / n
    log_p = np.log(np.maximum(power, 1e-300)).mean(axis=0) + EULER_GAMMA
    kappa = 2 * np.pi * j / n
    log_kappa = np.log(kappa)

    from scipy import optimize  # here, not at import: it is slow to import

    def fit(m):  # least squares on the lowest m frequencies; θ = (ln P₀, ln κ*, α)
        lk, y = log_kappa[:m], log_p[:m]

        def residuals(theta):
            a = theta[2] * (theta[1] - lk)                    # ln u = α ln(κ*/κ)
            return theta[0] + a - np.logaddexp(a, 0.0) - y

        def jacobian(theta):
            a = theta[2] * (theta[1] - lk)
            d = 0.5 * (1.0 - np.tanh(0.5 * a))               # ∂r/∂a = 1/(1 + e^a)
            return np.column_stack([np.ones(m), d * theta[2], d * (theta[1] - lk)])

        lower = [-30.0, log_kappa[min(J_MIN, len(lk)) - 1], ALPHA_MIN]
        upper = [30.0, math.log(np.pi) + 7.0, 10.0]
        level = y[: max(3, m // 50)].mean()
        starts = [np.array([level, np.clip(math.log(k), lower[1], upper[1]), 2.0])
                  for k in (0.05, 0.5, 3.0)]
        return min((optimize.least_squares(residuals, s, jacobian, bounds=(lower, upper))
                    for s in starts), key=lambda r: r.cost).x

    theta = fit(len(j))
    for _ in range(max_refits):  # refit on κ ≤ WINDOW·κ*, where the template holds
        m = int(np.clip(np.searchsorted(kappa, WINDOW * math.exp(theta[1]), "right"),
                        MIN_FREQUENCIES, len(j)))
        if m == len(j):
            break
        theta = fit(m)
    ln_p0, ln_ks, alpha = theta
    return SpectralFit(float(math.exp(ln_p0)), float(math.exp(ln_ks)), float(alpha), n,
                       sigma0_sq)


def talk_criteria(fit, param: str | list[str] | None = None, *,
                  sigma0: dict[str, float] | None = None):
    """The talk's criteria per column of a :class:`~ahmc_stan.fit.Fit` (default: every
    parameters-block column; ``param`` a name or list of names), or of a ``(chains,
    draws, columns)`` / ``(chains, draws)`` array.  ``sigma0`` optionally maps a column to
    its known sd.  Returns a DataFrame indexed by column: ``tau_int, n_eff, p0,
    kappa_star, alpha, var_mean, r, E``."""
    import pandas as pd

    from .fit import stan_name

    if hasattr(fit, "draws"):
        names = fit.param_names[: fit.n_params] if param is None else (
            [param] if isinstance(param, str) else list(param))
        columns = {stan_name(name): fit.column(name) for name in names}  # Stan's names
    else:
        values = np.asarray(fit, dtype=float)
        if values.ndim == 2:
            values = values[:, :, None]
        columns = {str(k): values[:, :, k] for k in range(values.shape[2])}
    rows = {}
    for name, chains in columns.items():
        known = (sigma0 or {}).get(name)
        spec = spectral_fit(chains, known)
        rows[name] = {"tau_int": integrated_autocorr_time(chains),
                      "n_eff": effective_sample_size(chains), "p0": spec.p0,
                      "kappa_star": spec.kappa_star, "alpha": spec.alpha,
                      "var_mean": spec.var_mean, "r": spec.r, "E": spec.efficiency}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("param")
