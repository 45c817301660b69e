"""``pool_windows=True``: the scale phase's metric windows pooled across chains
(:mod:`ahmc_stan.tuning.window_pool`)."""

import multiprocessing

import numpy as np
import pytest

from ahmc_stan import tune_and_sample
from ahmc_stan.tuning.window_pool import WindowPool
from ahmc_stan.tuning.windows import low_rank_inv_metric

from .stats_util import assert_moments
from .test_fisher_metric import ridge_covariance

CTX = multiprocessing.get_context("fork")


def _member_run(pool, chain, windows, leave_after, out):
    """Chain ``chain`` puts in its windows (leaving after ``leave_after`` of them) and
    reports what came back for each."""
    member = pool.member(chain)
    got = []
    for k, (x, g) in enumerate(windows):
        if k == leave_after:
            member.leave()
            break
        shared = member.share(x, g)
        got.append(None if shared is None else (shared[0].copy(), shared[1].copy()))
    out.put((chain, got))


def _run(windows_per_chain, leave_after):
    pool = WindowPool(len(windows_per_chain), 3, 10, CTX, timeout=60)
    out = CTX.Queue()
    procs = [CTX.Process(target=_member_run, args=(pool, c, w, leave_after.get(c), out))
             for c, w in enumerate(windows_per_chain)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results


def test_pooled_windows_are_every_chains_window_centred_on_its_own_mean():
    """Three chains, two windows each: every chain gets all chains' windows, each centred
    on its own chain's mean, in chain order; when chain 2 leaves before its second
    window, every chain gets ``None`` there, and nobody waits."""
    rng = np.random.default_rng(0)
    windows = [[(rng.normal(c, 1, (n, 3)), rng.normal(-c, 2, (n, 3))) for n in (10, 7)]
               for c in range(3)]
    got = _run(windows, {})
    for k in range(2):
        x = np.concatenate([w[k][0] - w[k][0].mean(0) for w in windows])
        g = np.concatenate([w[k][1] - w[k][1].mean(0) for w in windows])
        for c in range(3):
            np.testing.assert_array_equal(got[c][k][0], x)
            np.testing.assert_array_equal(got[c][k][1], g)
    got = _run(windows, {2: 1})
    assert all(got[c][0] is not None for c in range(3))
    assert got[0][1] is None and got[1][1] is None and len(got[2]) == 1


def test_pooled_low_rank_estimate_is_better_than_one_chains():
    """Four chains' windows of 30 draws of a 20-d Gaussian with one strong direction:
    the pooled low-rank estimate finds it closer than any single chain's (the
    Marchenko–Pastur noise of 30 draws in 20 dimensions)."""
    rng = np.random.default_rng(3)
    d = 20
    v = rng.normal(size=d)
    v /= np.linalg.norm(v)
    cov = np.eye(d) + 99 * np.outer(v, v)
    prec = np.linalg.inv(cov)
    chol = np.linalg.cholesky(cov)
    chains = [rng.normal(size=(30, d)) @ chol.T for _ in range(4)]

    def kappa(inv_metric):
        dense = inv_metric.to_dense() if hasattr(inv_metric, "to_dense") else np.diag(
            inv_metric)
        ev = np.linalg.eigvals(np.linalg.solve(dense, cov)).real
        return ev.max() / ev.min()

    single = [kappa(low_rank_inv_metric(x, -x @ prec)) for x in chains]
    pooled_x = np.concatenate([x - x.mean(0) for x in chains])
    pooled = kappa(low_rank_inv_metric(pooled_x, -pooled_x @ prec))
    assert pooled < min(single)


def test_pooled_windows_on_a_ridge():
    """The ridge of ``test_fisher_metric``: with pooled windows the low-rank metric
    converges, its whitened draws are standard normal within MCSE, every chain pooled
    every window, and the same seed gives the same draws."""
    from ahmc_stan import StanModel

    from .conftest import stan_model_path

    sigma = ridge_covariance()
    model = StanModel(stan_model_path("mvn"), {"D": 3, "mu": [10.0, 0.0, -1.0],
                                               "Sigma": sigma})
    kw = dict(chains=4, warmup=1000, draws=1000, seed=2, progress=False, diagnose=False,
              metric="low_rank", pool_windows=True)
    fit = tune_and_sample(model, **kw)
    assert fit.efficiency()["max_rhat"] < 1.01
    counts = [c["pooled_windows"] for c in fit.metadata["chains"]]
    assert len(set(counts)) == 1 and counts[0] >= 4
    chol = np.linalg.cholesky(sigma)
    centred = (fit.params - np.array([10.0, 0.0, -1.0])).reshape(-1, 3)
    whitened = np.linalg.solve(chol, centred.T).T.reshape(fit.params.shape)
    assert_moments(whitened, np.zeros(3), np.ones(3))
    np.testing.assert_array_equal(tune_and_sample(model, **kw).draws, fit.draws)


def test_pooled_windows_need_parallel_chains(mvn_model):
    with pytest.raises(ValueError, match="pool_windows=True"):
        tune_and_sample(mvn_model, chains=2, warmup=100, draws=10, seed=1, progress=False,
                        pool_windows=True, parallel=False)
