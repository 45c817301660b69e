"""Tolerances for statistical tests, derived from Monte Carlo standard errors."""

import numpy as np
from scipy import stats


def z_bonferroni(n_comparisons: int, family_alpha: float = 0.01) -> float:
    """Two-sided normal quantile so that ``n_comparisons`` independent checks at this
    many MCSEs all pass with probability ≥ 1 - family_alpha under a correct sampler."""
    return float(stats.norm.ppf(1 - family_alpha / (2 * n_comparisons)))


def assert_moments(draws: np.ndarray, mean: np.ndarray, sd: np.ndarray,
                   family_alpha: float = 0.01) -> None:
    """Means and sds of ``draws`` (chains, draws, dims) agree with the truth within
    z·MCSE, with ArviZ's MCSE of the mean and of the sd, z from a Bonferroni bound."""
    import arviz as az

    z = z_bonferroni(2 * draws.shape[2], family_alpha)
    mcse_mean = np.array([az.mcse(draws[:, :, j], method="mean") for j in range(draws.shape[2])])
    mcse_sd = np.array([az.mcse(draws[:, :, j], method="sd") for j in range(draws.shape[2])])
    est_mean = draws.mean(axis=(0, 1))
    est_sd = draws.std(axis=(0, 1), ddof=1)
    bad_mean = np.abs(est_mean - mean) > z * mcse_mean
    bad_sd = np.abs(est_sd - sd) > z * mcse_sd
    assert not bad_mean.any(), (
        f"means off by more than {z:.2f} MCSE at {np.flatnonzero(bad_mean)}: "
        f"{est_mean[bad_mean]} vs {np.asarray(mean)[bad_mean]} (mcse {mcse_mean[bad_mean]})")
    assert not bad_sd.any(), (
        f"sds off by more than {z:.2f} MCSE at {np.flatnonzero(bad_sd)}: "
        f"{est_sd[bad_sd]} vs {np.asarray(sd)[bad_sd]} (mcse {mcse_sd[bad_sd]})")


def assert_truncated_normal(params: np.ndarray) -> None:
    """Draws (chains, draws, 2) of ``reject_region.stan`` with D = 2: x[1] ~ N(0, 1)
    truncated above at 1 (the model rejects beyond), x[2] ~ N(0, 1)."""
    assert params[:, :, 0].max() <= 1
    truncated = stats.truncnorm(-np.inf, 1)
    assert_moments(params, np.array([truncated.mean(), 0.0]),
                   np.array([truncated.std(), 1.0]))
