"""``metric="fisher"``: the diagonal inverse metric estimated from draws and gradients
(Seyboldt, Carlson & Carpenter 2026) in AHMC's scale phase."""

import numpy as np
import pytest

from ahmc_stan import tune_and_sample
from ahmc_stan.tuning.windows import adaptation_windows, fisher_inv_metric

from .conftest import SDS_100
from .stats_util import assert_moments


def unregularized(inv_metric, n):
    """Undo Stan's regularisation (n/(n+5)) v + 1e-3 (5/(n+5)) of a window of n draws."""
    return (inv_metric - 1e-3 * 5 / (n + 5)) * (n + 5) / n


def test_exact_for_a_diagonal_gaussian_from_few_draws():
    """For N(μ, diag σ²), ∇log p = −(x − μ)/σ², so sd(x)/sd(∇) = σ² exactly, however
    few the draws — Stan's variance estimate from 30 draws is off by ~25 %."""
    rng = np.random.default_rng(1)
    sds = np.array([1e-3, 0.1, 1.0, 30.0])
    x = 2.0 + sds * rng.standard_normal((30, 4))
    grads = -(x - 2.0) / sds**2
    np.testing.assert_allclose(unregularized(fisher_inv_metric(x, grads), 30), sds**2,
                               rtol=1e-10)
    # a coordinate whose gradient does not vary falls back to the variance
    grads[:, 1] = 0.0
    assert unregularized(fisher_inv_metric(x, grads), 30)[1] == \
        pytest.approx(np.var(x[:, 1], ddof=1), rel=1e-12)


def test_ahmc_fisher_on_an_ill_scaled_diagonal_gaussian(gauss100):
    """Neal's 100-d Gaussian (sds 0.01 … 1): the adapted metric is the true variances
    (up to Stan's regularisation) and the moments are right within MCSE."""
    fit = tune_and_sample(gauss100, chains=2, warmup=1000, draws=1500, seed=4,
                          metric="fisher", progress=False)
    n_last = np.diff(adaptation_windows(500)[-1])[0]
    for inv_metric in fit.inv_metric:
        np.testing.assert_allclose(unregularized(inv_metric, n_last), SDS_100**2,
                                   rtol=1e-8)
    assert_moments(fit.params, np.zeros(100), SDS_100)


def test_ahmc_fisher_on_a_dense_correlated_gaussian(mvn_model, mvn_data):
    """A correlated 3-d Gaussian: whitened by its true covariance, the draws are
    standard normal within MCSE; the same seed gives the same draws."""
    kw = dict(chains=2, warmup=1000, draws=2000, seed=9, metric="fisher", progress=False)
    fit = tune_and_sample(mvn_model, **kw)
    chol = np.linalg.cholesky(np.asarray(mvn_data["Sigma"]))
    whitened = np.linalg.solve(chol, (fit.params - mvn_data["mu"]).reshape(-1, 3).T).T
    assert_moments(whitened.reshape(fit.params.shape), np.zeros(3), np.ones(3))
    again = tune_and_sample(mvn_model, **kw)
    np.testing.assert_array_equal(again.draws, fit.draws)
