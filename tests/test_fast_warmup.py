"""The default warmup shortened where the posterior looks Gaussian
(:mod:`ahmc_stan.tuning.fast_warmup`)."""

import numpy as np
import pytest

from ahmc_stan import StanModel, load_output, tune_and_sample
from ahmc_stan.tuning import fast_warmup as fw

from .conftest import SDS_100, stan_model_path
from .stats_util import assert_moments


def test_window_misfit_is_zero_for_a_gaussian_and_counts_distinct_draws_only():
    rng = np.random.default_rng(1)
    cov = np.array([[1.0, 0.9], [0.9, 1.0]])
    x = rng.multivariate_normal([1.0, -1.0], cov, size=40)
    g = -(x - [1.0, -1.0]) @ np.linalg.inv(cov)
    assert fw.window_misfit(x, g) < 1e-12
    # a skewed target (a Gamma(2) direction): its gradient 1/x - 1 is not affine
    y = rng.gamma(2.0, size=(60, 1))
    assert fw.window_misfit(y, 1.0 / y - 1.0) > 1.0
    # 5 distinct rows repeated (rejections) in 3 dimensions: an affine fit of 4
    # coefficients would fit them whatever the target, so the misfit is not defined
    z = np.repeat(rng.gamma(2.0, size=(5, 3)), 20, axis=0)
    assert fw.window_misfit(z, 1.0 / z - 1.0) == float("inf")


def test_the_first_chain_decides_and_the_others_follow():
    gauss = np.random.default_rng(2).normal(size=(50, 2))
    skewed = np.random.default_rng(3).gamma(2.0, size=(50, 2))
    shared = fw.FastWarmup()
    first, second = shared.member(0), shared.member(1)
    assert shared.decision is None
    assert first(gauss, -gauss, 0, 3) is True
    # the second chain's own draws are not Gaussian: it follows the first
    assert second(skewed, 1.0 / skewed - 1.0, 0, 3) is True
    assert second.note()["misfit"] < 1e-12 and second.note()["short"] is True
    # divergences in the window (as many as the metric fallback's rule) keep it full
    shared = fw.FastWarmup()
    assert shared.member(0)(gauss, -gauss, 3, 3) is False
    # a first chain that ends before deciding leaves the others the full warmup
    shared = fw.FastWarmup()
    shared.member(0).leave()
    assert shared.member(1)(gauss, -gauss, 0, 3) is False
    assert fw.FastWarmup(forced=True).member(0)(skewed, 1.0 / skewed - 1.0, 0, 3) is True


@pytest.fixture(scope="module")
def neal100():
    return StanModel(stan_model_path("diag_normal"), {"D": 100, "sigma": SDS_100})


def test_a_gaussian_gets_the_short_warmup_and_its_moments(neal100):
    fit = tune_and_sample(neal100, seed=3, progress=False)
    assert fit.metadata["warmup"] == fw.WARMUP
    assert fit.metadata["fast_warmup"]["short"] is True
    assert fit.warmup_draws.shape[1] == fw.WARMUP and fit.draws.shape[1] >= 1000
    for chain in fit.metadata["chains"]:
        assert chain["warmup"] == fw.WARMUP
    scale_phase = fit.warmup_sampler_stats["phase"] == 0
    assert scale_phase.sum(axis=1).tolist() == [fw.SCALE] * fit.chains
    assert_moments(fit.draws, np.zeros(100), SDS_100)


def test_same_seed_same_draws_whatever_runs_in_parallel(gauss2d):
    together = tune_and_sample(gauss2d, seed=4, progress=False, parallel=True)
    alone = tune_and_sample(gauss2d, seed=4, progress=False, parallel=False)
    assert together.metadata["warmup"] == alone.metadata["warmup"] == fw.WARMUP
    assert np.array_equal(together.draws, alone.draws)


def test_an_explicit_warmup_is_run_as_asked(gauss2d):
    fit = tune_and_sample(gauss2d, seed=4, warmup=1000, draws=200, progress=False)
    assert fit.metadata["warmup"] == 1000 and "fast_warmup" not in fit.metadata
    assert fit.warmup_draws.shape[1] == 1000


def test_a_skewed_posterior_keeps_the_full_warmup(constrained_model):
    fit = tune_and_sample(constrained_model, seed=5, draws=200, progress=False,
                          diagnose=False)
    assert fit.metadata["fast_warmup"]["short"] is False
    assert fit.metadata["fast_warmup"]["misfit"] > fw.MISFIT
    assert fit.metadata["warmup"] == 1000 and fit.warmup_draws.shape[1] == 1000


def test_a_short_warmup_streamed_to_disk_is_rebuilt_with_its_length(gauss2d, tmp_path):
    fit = tune_and_sample(gauss2d, seed=6, draws=300, progress=False, output_dir=tmp_path)
    (tmp_path / "fit.npz").unlink()  # as if the run had been killed after its last draw
    rebuilt = load_output(tmp_path, gauss2d)
    assert rebuilt.metadata["warmup"] == fw.WARMUP
    assert np.array_equal(rebuilt.draws, fit.draws)


def test_a_rerun_chain_follows_the_fits_short_warmup(gauss2d, monkeypatch):
    from ahmc_stan import chain_rerun

    real = chain_rerun._to_rerun
    calls = []

    def first_call_reruns_chain_2(results, warmup):  # as if chain 2 had failed once
        calls.append(warmup)
        if len(calls) == 1:
            return [{"chain": 1, "reason": "failed", "divergent": 0.5, "ess_ratio": 0.01}]
        return real(results, warmup)

    monkeypatch.setattr(chain_rerun, "_to_rerun", first_call_reruns_chain_2)
    fit = tune_and_sample(gauss2d, seed=7, draws=300, progress=False, diagnose=False)
    assert calls[0] == fw.WARMUP  # the fit's warmup, not the 1000 it started from
    rerun = fit.metadata["chain_rerun"]["runs"][0]
    assert rerun["chain"] == 2 and rerun["adopted"]  # 1-based
    assert all(c["warmup"] == fw.WARMUP for c in fit.metadata["chains"])
    assert fit.warmup_draws.shape[1] == fw.WARMUP
