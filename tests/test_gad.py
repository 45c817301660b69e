"""Gradient-based adaptive MCMC (gadrwm, gadmala, gadmala_exact): the objective's gradient
against finite differences, moments, the adapted proposal (Figure 1 and 2 behaviour of
Titsias & Dellaportas 2019), cost accounting and reproducibility."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from scipy import stats

from ahmc_stan import StanModel, tune_and_sample
from ahmc_stan.samplers.gad import (objective, objective_gradient, plot_proposal,
                                    proposal_cholesky)
from ahmc_stan.samplers.metropolis import Target, langevin_log_q_ratio, propose

from .conftest import RHO, SDS_100, SIGMA_2D, stan_model_path
from .stats_util import assert_moments, assert_truncated_normal

GAD = ["gadrwm", "gadmala", "gadmala_exact"]
TARGET_ACCEPT = {"gadrwm": 0.25, "gadmala": 0.55, "gadmala_exact": 0.55}


#: the authors' 2-d demo (Figure 1) runs gadRWM with η = 0.0005, ten times its Table 1 value
FIGURE1 = {"gadrwm": {"learning_rate": 0.0005}, "gadmala": {}, "gadmala_exact": {}}


@pytest.fixture(scope="module")
def fits2d(gauss2d):
    """The paper's Figure 1 setting: 2·10⁴ adaptation iterations from L₀ = 0.1/√2·I."""
    return {s: tune_and_sample(gauss2d, s, chains=2, warmup=20000, draws=5000, seed=21,
                               progress=False, **FIGURE1[s]) for s in GAD}


# ---- the objective's gradient ------------------------------------------------------------

@pytest.mark.parametrize("variant", ["rwm", "fast", "exact"])
def test_objective_gradient_matches_finite_differences(logistic_model, variant):
    """∇_L F with ε fixed, against central differences of F over every lower-triangular
    entry of L, on a non-Gaussian target (logistic regression, so the Hessian varies with
    y).  The fast variant's differences hold ∇log π(y) fixed inside r; its gradient must
    then miss the full objective's, which the exact one matches."""
    target = Target(logistic_model)
    f = lambda z: target.gradient(np.ascontiguousarray(z))  # noqa: E731
    rng = np.random.default_rng(5)
    n, beta, step = logistic_model.dims, 1.7, 1e-6
    langevin = variant != "rwm"
    branches = set()
    for trial in range(6):
        x = rng.normal(size=n) * 0.3
        scale = 0.6 if trial % 2 == 0 else 0.05  # large L: h < 0; small L: mostly h ≥ 0
        L = np.tril(rng.normal(size=(n, n)) * scale / 4) \
            + np.diag(rng.uniform(0.5, 1.5, n) * scale)
        eps = rng.normal(size=n)
        lp_x, g_x = f(x)
        y = propose(x, L, eps, g_x if langevin else None)
        lp_y, g_y = f(y)
        h = lp_y - lp_x + (langevin_log_q_ratio(L, eps, g_x, g_y) if langevin else 0.0)
        branches.add(h < 0)
        hvp = None
        if variant == "exact":
            hvp = lambda v: logistic_model.log_density_hvp(y, v)[1]  # noqa: E731
        grad = objective_gradient(L, eps, beta, h, g_y, g_x if langevin else None, hvp)
        fixed = g_y if variant == "fast" else None
        fd = np.zeros_like(L)
        for i in range(n):
            for j in range(i + 1):
                up, down = L.copy(), L.copy()
                up[i, j] += step
                down[i, j] -= step
                fd[i, j] = (objective(up, x, eps, beta, f, langevin, fixed)
                            - objective(down, x, eps, beta, f, langevin, fixed)
                            ) / (2 * step)
        assert np.all(np.triu(grad, 1) == 0)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())
        if variant == "fast" and h < 0:
            full = np.zeros_like(L)
            for i in range(n):
                for j in range(i + 1):
                    up, down = L.copy(), L.copy()
                    up[i, j] += step
                    down[i, j] -= step
                    full[i, j] = (objective(up, x, eps, beta, f, True)
                                  - objective(down, x, eps, beta, f, True)) / (2 * step)
            assert np.abs(grad - full).max() > 1e-3 * np.abs(full).max()
    assert branches == {True, False}  # both cases of the min were exercised


# ---- the 2-d Gaussian with correlation 0.99 (Figure 1) -----------------------------------

@pytest.mark.parametrize("sampler", GAD)
def test_gad_2d_moments_and_adapted_shape(fits2d, sampler):
    fit = fits2d[sampler]
    assert_moments(fit.params, np.zeros(2), np.ones(2))
    whitened = fit.params.reshape(-1, 2) @ np.linalg.inv(np.linalg.cholesky(SIGMA_2D)).T
    assert_moments(whitened.reshape(fit.params.shape), np.zeros(2), np.ones(2))
    for L in proposal_cholesky(fit):
        assert L.shape == (2, 2) and L[0, 1] == 0 and np.all(np.diag(L) > 0)
        cov = L @ L.T
        assert abs(cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]) - RHO) < 0.05
    accept = fit.sampler_stats["accepted"].mean()
    assert abs(accept - TARGET_ACCEPT[sampler]) < 0.05, accept


def test_gadrwm_larger_beta_for_lower_target_accept(gauss2d, fits2d):
    """Figure 1: α* = 0.25 ends with a larger entropy weight β (paper: 7.4) than α* = 0.4
    (2.2), and a wider proposal.  "Final" β: geometric mean over the last 5000 warmup
    iterations of each chain (β is itself a noisy multiplicative walk)."""
    low = fits2d["gadrwm"]
    high = tune_and_sample(gauss2d, "gadrwm", chains=2, warmup=20000, draws=100, seed=22,
                           progress=False, adapt_delta=0.4, **FIGURE1["gadrwm"])

    def final_beta(fit):
        return np.exp(np.log(fit.warmup_sampler_stats["beta"][:, -5000:]).mean(axis=1))

    assert final_beta(low).min() > final_beta(high).max(), (final_beta(low),
                                                             final_beta(high))
    assert [c["adapt_delta"] for c in high.metadata["chains"]] == [0.4, 0.4]
    det = lambda fit: [np.prod(np.diag(L)) for L in proposal_cholesky(fit)]  # noqa: E731
    assert min(det(low)) > max(det(high))


def test_plot_proposal(fits2d):
    fit = fits2d["gadrwm"]
    ax = plot_proposal(fit, SIGMA_2D)
    assert len(ax.lines) == 1 + fit.chains
    assert "β" in ax.get_title()


# ---- Neal's 100-d Gaussian, sds 0.01 ... 1.00 (Figure 2) ---------------------------------

@pytest.mark.parametrize("sampler", ["gadmala", "gadmala_exact"])
def test_gadmala_100d_moments_and_diagonal(gauss100, sampler):
    fit = tune_and_sample(gauss100, sampler, chains=2, warmup=20000, draws=5000, seed=23,
                          progress=False)
    assert_moments(fit.params, np.zeros(100), SDS_100)
    for L in proposal_cholesky(fit):
        assert stats.spearmanr(np.diag(L), SDS_100)[0] >= 0.9


def test_gadrwm_100d_moments_and_diagonal(gauss100):
    """gadRWM mixes slowly here (paper: min ESS 25 per 2·10⁴ draws): every row is the state
    after 20 iterations, so the 2·10⁴ adaptation iterations are 1000 rows and the kept
    chain 10⁵ iterations."""
    fit = tune_and_sample(gauss100, "gadrwm", chains=2, warmup=1000, draws=5000,
                          steps_per_draw=20, seed=24, progress=False)
    assert_moments(fit.params, np.zeros(100), SDS_100)
    for L in proposal_cholesky(fit):
        assert stats.spearmanr(np.diag(L), SDS_100)[0] >= 0.9


@pytest.mark.parametrize("sampler", GAD)
def test_density_minus_infinity_region(sampler):
    """x[1] > 1 rejects: no gradient step is taken from such proposals, and the sampler
    samples the truncated normal."""
    model = StanModel(stan_model_path("reject_region"), {"D": 2})
    fit = tune_and_sample(model, sampler, chains=2, warmup=2000, draws=3000,
                          steps_per_draw=2, seed=28, progress=False)
    assert_truncated_normal(fit.params)
    for L in proposal_cholesky(fit):
        assert np.isfinite(L).all() and np.all(np.diag(L) > 0)


# ---- cost accounting, statistics, reproducibility ----------------------------------------

def test_gradient_accounting_and_stats(fits2d):
    rwm, fast, exact = (fits2d[s] for s in GAD)
    for fit in (rwm, fast, exact):
        assert {"accept_stat", "step_size", "n_grad", "divergent", "n_density", "beta",
                "lp"} <= set(fit.sampler_stats)
        assert np.isnan(fit.sampler_stats["step_size"]).all()
        assert not fit.sampler_stats["divergent"].any()
        for c in fit.metadata["chains"]:
            assert c["beta"] > 0 and np.asarray(c["proposal_cholesky"]).shape == (2, 2)
    # gadrwm: a gradient at y during warmup (for the L step), the density only afterwards
    assert (rwm.warmup_sampler_stats["n_grad"] == 1).all()
    assert (rwm.sampler_stats["n_grad"] == 0).all()
    assert (rwm.sampler_stats["n_density"] == 1).all()
    assert (fast.warmup_sampler_stats["n_grad"] == 1).all()
    assert (fast.sampler_stats["n_grad"] == 1).all()
    # gadmala_exact: one Hessian-vector product when h < 0, counted in n_hvp (it was
    # counted as 2 gradients in n_grad) and converted with its measured cost
    warm = exact.warmup_sampler_stats
    assert (warm["n_grad"] == 1).all()
    assert set(np.unique(warm["n_hvp"])) == {0, 1}
    assert ((warm["n_hvp"] == 1) == (warm["accept_stat"] < 1)).all()
    assert (exact.sampler_stats["n_grad"] == 1).all()
    assert not exact.sampler_stats["n_hvp"].any()
    assert exact.cost_units["hvp"] > 0
    assert exact.n_grad_equiv_warmup == pytest.approx(
        warm["n_grad"].sum() + exact.cost_units["hvp"] * warm["n_hvp"].sum())
    assert fast.cost_units == {"gradient": 1.0}          # gradients only: nothing measured
    assert "density" in rwm.cost_units                   # density-only evaluations
    # β is adapted during warmup only
    assert (np.diff(rwm.sampler_stats["beta"], axis=1) == 0).all()


def test_same_seed_same_draws(gauss2d):
    for sampler in GAD:
        runs = [tune_and_sample(gauss2d, sampler, chains=2, warmup=300, draws=200, seed=26,
                                progress=False, parallel=p) for p in (2, False)]
        np.testing.assert_array_equal(runs[0].draws, runs[1].draws)
        np.testing.assert_array_equal(proposal_cholesky(runs[0])[1],
                                      proposal_cholesky(runs[1])[1])
        other = tune_and_sample(gauss2d, sampler, chains=2, warmup=300, draws=200, seed=27,
                                progress=False)
        assert not np.array_equal(runs[0].draws, other.draws)
