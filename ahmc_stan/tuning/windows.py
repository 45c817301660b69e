"""Metric adaptation in Stan's windows (Stan Reference Manual, "HMC algorithm parameters",
automatic parameter tuning): a fast initial buffer, slow windows doubling in length in
which the covariance is estimated, and a terminal buffer; the estimate is regularised
towards a small multiple of the identity exactly as Stan does.

Besides Stan's estimate from the draws alone, :func:`fisher_inv_metric` estimates a
diagonal inverse metric from the draws *and their gradients* (Seyboldt, Carlson &
Carpenter 2026, the diagonal minimiser of their Fisher divergence)."""

from __future__ import annotations

import numpy as np


def adaptation_windows(num_warmup: int, init_buffer: int = 75, term_buffer: int = 50,
                       base_window: int = 25) -> list[tuple[int, int]]:
    """(start, end) iteration ranges of the slow windows, Stan's rules included: with fewer
    than 20 iterations nothing is adapted; when the defaults do not fit, the buffers
    become 15% and 10% of warmup."""
    if num_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > num_warmup:
        init_buffer = int(0.15 * num_warmup)
        term_buffer = int(0.1 * num_warmup)
        base_window = num_warmup - (init_buffer + term_buffer)
    windows, start, size = [], init_buffer, base_window
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


def fisher_inv_metric(draws: np.ndarray, grads: np.ndarray) -> np.ndarray:
    """The diagonal inverse metric that minimises the Fisher divergence between the
    target and the Gaussian the metric implies, estimated from the window's draws and
    the gradients of the log density there: ``M⁻¹_i = sd(x_i) / sd(∇_i log p)``, exact
    (the variance) for every Gaussian with diagonal covariance whatever the number of
    draws.  Regularised as :func:`regularized_inv_metric`; a coordinate whose draws or
    gradients do not vary keeps the Stan estimate."""
    n = len(draws)
    shrink, ridge = n / (n + 5.0), 1e-3 * 5.0 / (n + 5.0)
    sd_x = np.std(draws, axis=0, ddof=1)
    sd_g = np.std(grads, axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = np.where((sd_x > 0) & (sd_g > 0) & np.isfinite(sd_g), sd_x / sd_g,
                            sd_x ** 2)
    return shrink * estimate + ridge
