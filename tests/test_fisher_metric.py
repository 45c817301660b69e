"""``metric="fisher"``: the diagonal inverse metric estimated from draws and gradients
(Seyboldt, Carlson & Carpenter 2026) in AHMC's scale phase."""

import numpy as np
import pytest

from ahmc_stan import tune_and_sample
from ahmc_stan.metric import LowRankInvMetric
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


# ---- low rank ------------------------------------------------------------------------------

def ridge_covariance():
    """A regression-like ridge: sds 100, 0.05, 1 and correlation −0.99996 between the first
    two (an intercept and a slope on an uncentred predictor)."""
    sd = np.array([100.0, 0.05, 1.0])
    corr = np.array([[1.0, -0.99996, 0.0], [-0.99996, 1.0, 0.0], [0.0, 0.0, 1.0]])
    return corr * np.outer(sd, sd)


def test_auto_metric_is_low_rank_only_with_as_many_draws_as_parameters(gauss100):
    """``metric="auto"`` (AHMC's default) is ``low_rank`` where the scale phase's last
    window has at least as many draws as the model has parameters, else Stan's ``diag``;
    the chains record which, and a fit run in Stan's diagonal gets only the metric rerun
    with smaller steps (the other would switch to that same metric)."""
    from ahmc_stan.sampling import RERUN_STEPS, _fit_rerun_steps, _ran_gradient_metric
    from ahmc_stan.tuning.hmc_warmup import auto_metric

    last = np.diff(adaptation_windows(500)[-1])[0]  # 1000 warmup: a scale phase of 500
    assert last == 200
    assert auto_metric(last, 500) == "low_rank" and auto_metric(last + 1, 500) == "diag"
    assert auto_metric(1003, 500) == "diag" and auto_metric(1003, 5000) == "low_rank"
    assert auto_metric(5, 10) == "low_rank"  # no window at all: nothing is estimated
    # warmup 200: a scale phase of 100, whose one window (15, 90) has 75 draws < 100
    fit = tune_and_sample(gauss100, chains=2, warmup=200, draws=200, seed=2, progress=False,
                          diagnose=False)
    assert [c["metric"] for c in fit.metadata["chains"]] == ["diag", "diag"]
    assert all(np.ndim(m) == 1 for m in fit.inv_metric)
    assert not _ran_gradient_metric(fit)
    # its metric rerun (when its checks fire) only takes smaller steps in the same metric
    assert _fit_rerun_steps("ahmc", {}, fit) == [{"metric": "diag", "adapt_delta": 0.95}]
    assert _fit_rerun_steps("ahmc", {"adapt_delta": 0.9}, fit) == []
    fit = tune_and_sample(gauss100, chains=2, warmup=1000, draws=200, seed=2, progress=False,
                          diagnose=False)
    assert [c["metric"] for c in fit.metadata["chains"]] == ["low_rank", "low_rank"]
    assert _ran_gradient_metric(fit)
    assert _fit_rerun_steps("ahmc", {}, fit) == [dict(step) for step in RERUN_STEPS]


def test_low_rank_is_the_covariance_of_a_gaussian():
    """Without the cutoff and regularisation the estimate is Σ itself as soon as the
    draws span the space (to rounding: each entry within 10⁻¹⁰ of its scale
    sqrt(Σ_ii Σ_jj); the unregularised ridge's condition number is 5·10¹⁰, and the estimate
    is computed in the parameters' own coordinates); with the defaults the leading
    eigenvector is recovered and the whitened target's condition number is at most the
    cutoff."""
    from ahmc_stan.tuning.windows import low_rank_inv_metric

    rng = np.random.default_rng(3)
    sigma = ridge_covariance()
    x = rng.multivariate_normal(np.ones(3), sigma, size=8)
    grads = -np.linalg.solve(sigma, (x - 1).T).T
    exact = low_rank_inv_metric(x, grads, cutoff=1.0, gamma=0.0).to_dense()
    scale = np.sqrt(np.outer(np.diag(sigma), np.diag(sigma)))
    assert np.max(np.abs(exact - sigma) / scale) < 1e-10
    estimate = low_rank_inv_metric(x, grads).to_dense()
    top = lambda m: np.linalg.eigh(m)[1][:, -1]  # noqa: E731
    assert abs(top(estimate) @ top(sigma)) > 1 - 1e-6
    chol = np.linalg.cholesky(estimate)
    whitened = np.linalg.solve(chol, np.linalg.solve(chol, sigma).T)
    assert np.linalg.cond(whitened) <= 2.0 + 1e-6


def test_low_rank_survives_a_failed_decomposition(monkeypatch):
    """LAPACK fails on rare finite inputs (an SVD did so on a window of the SV model): when
    the span's eigendecomposition or the Cholesky factor of the gradients' covariance fails,
    the estimate is the diagonal one, not an exception in the middle of warmup."""
    from ahmc_stan.tuning import windows

    rng = np.random.default_rng(3)
    sigma = ridge_covariance()
    x = rng.multivariate_normal(np.ones(3), sigma, size=8)
    grads = -np.linalg.solve(sigma, (x - 1).T).T
    assert isinstance(windows.low_rank_inv_metric(x, grads), LowRankInvMetric)

    def fails(*args, **kwargs):
        raise np.linalg.LinAlgError("did not converge")

    for name in ("eigh", "cholesky"):
        with monkeypatch.context() as patch:
            patch.setattr(windows.np.linalg, name, fails)
            np.testing.assert_array_equal(windows.low_rank_inv_metric(x, grads),
                                          windows.fisher_inv_metric(x, grads))


def test_low_rank_shortcut_gives_what_the_decompositions_give(monkeypatch):
    """The proof that no direction will be kept (``_nothing_to_correct``) fires on windows
    of a Gaussian with a diagonal covariance that span the space, and returns the diagonal
    the full computation returns; on a wide window (the draws' and the gradients' rows
    span different subspaces), a correlated Gaussian, a heavy-tailed target and near the
    bounds it does not change the result.  Nor does the later proof from S's eigenvalues
    alone (``_keeps_none``), which fires on the wide window of the diagonal Gaussian,
    where the first cannot."""
    from ahmc_stan.tuning import windows

    rng = np.random.default_rng(11)
    fired, later = [], []
    shortcut, from_eigenvalues = windows._nothing_to_correct, windows._keeps_none

    def spy(*args):
        fired.append(shortcut(*args))
        return fired[-1]

    def later_spy(*args):
        later.append(from_eigenvalues(*args))
        return later[-1]

    def full(x, g, **kw):
        with monkeypatch.context() as patch:
            patch.setattr(windows, "_nothing_to_correct", lambda *a: False)
            patch.setattr(windows, "_keeps_none", lambda *a: False)
            return windows.low_rank_inv_metric(x, g, **kw)

    monkeypatch.setattr(windows, "_nothing_to_correct", spy)
    monkeypatch.setattr(windows, "_keeps_none", later_spy)
    scales = np.exp(rng.uniform(-3, 3, 40))
    cases = []
    for n, fires in ((15, False), (50, True), (200, True)):  # 2n < d, 2n > d
        x = rng.standard_normal((n, 40)) * scales
        cases.append((x, -x / scales ** 2, fires))
    sigma = ridge_covariance()
    x = rng.multivariate_normal(np.zeros(3), sigma, size=100)
    cases.append((x, -np.linalg.solve(sigma, x.T).T, False))
    t = rng.standard_t(3, size=(300, 5))
    cases.append((t, -4 * t / (3 + t ** 2), None))
    for x, g, fires in cases:
        fired.clear()
        later.clear()
        got, want = windows.low_rank_inv_metric(x, g), full(x, g)
        if fires is False and x.shape[1] == 40:  # the wide window of the diagonal Gaussian
            assert later == [True]
        assert type(got) is type(want)
        if isinstance(want, np.ndarray):
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_equal(got.to_dense(), want.to_dense())
        if fires is not None:
            assert fired == [fires]
    # variance f along (1, 1, 0, 0)/√2: after the diagonal (sd(x)/sd(∇) = √f in both
    # coordinates) S has eigenvalues √f and 1/√f, outside the cutoff 2 from f = 4 on; the
    # pencil's eigenvalues are f and 1/f, so the shortcut's bound sits at the same edge
    v = np.array([1.0, 1.0, 0.0, 0.0]) / np.sqrt(2)
    kinds = []
    for f in (2.5, 3.8, 4.3, 6.0):
        sigma = np.eye(4) + (f - 1) * np.outer(v, v)
        x = rng.multivariate_normal(np.zeros(4), sigma, size=400)
        g = -np.linalg.solve(sigma, x.T).T
        got, want = windows.low_rank_inv_metric(x, g), full(x, g)
        assert type(got) is type(want)
        if isinstance(want, np.ndarray):
            np.testing.assert_array_equal(got, want)
        kinds.append(type(want).__name__)
    assert kinds == ["ndarray", "ndarray", "LowRankInvMetric", "LowRankInvMetric"]


def test_low_rank_span_of_a_wide_window_matches_a_tall_one():
    """With fewer draws than parameters the span comes from the 2n × 2n Gram matrix, with
    more from the d × d one: on the same window, padded with parameters the draws do not
    move and the gradients do not see, both give the same metric in the shared
    coordinates (and the padding keeps its diagonal)."""
    from ahmc_stan.tuning.windows import low_rank_inv_metric

    rng = np.random.default_rng(5)
    sigma = ridge_covariance()
    x = rng.multivariate_normal(np.ones(3), sigma, size=4)  # 2n = 8 > d = 3: tall
    grads = -np.linalg.solve(sigma, (x - 1).T).T
    tall = low_rank_inv_metric(x, grads).to_dense()
    pad = 7  # d = 10 > 2n = 8: wide
    x_wide = np.hstack([x, np.zeros((4, pad))])
    g_wide = np.hstack([grads, np.zeros((4, pad))])
    wide = low_rank_inv_metric(x_wide, g_wide)
    np.testing.assert_allclose(wide.to_dense()[:3, :3], tall, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(wide.to_dense()[3:, 3:], np.diag(wide.diag[3:]), atol=1e-12)


def test_ahmc_low_rank_on_a_ridge(tmp_path):
    """On the ridge AHMC's diagonal metric, each chain on its own, does not converge in
    4 × (1000 + 1000) (R-hat > 1.01; with ``chain_rerun`` its slow chains are sampled
    again in the best chain's parameters: ``tests/test_chain_rerun.py``); the low-rank
    metric does, and its whitened draws are standard normal within MCSE; the same seed
    gives the same draws."""
    from ahmc_stan import StanModel

    from .conftest import stan_model_path

    sigma = ridge_covariance()
    model = StanModel(stan_model_path("mvn"), {"D": 3, "mu": [10.0, 0.0, -1.0],
                                               "Sigma": sigma})
    kw = dict(chains=4, warmup=1000, draws=1000, seed=2, progress=False, diagnose=False)
    diag = tune_and_sample(model, metric="diag", extend=False, chain_rerun=False, **kw)
    assert diag.efficiency()["max_rhat"] > 1.01
    fit = tune_and_sample(model, metric="low_rank", **kw)
    assert fit.efficiency()["max_rhat"] < 1.01
    chol = np.linalg.cholesky(sigma)
    centred = (fit.params - np.array([10.0, 0.0, -1.0])).reshape(-1, 3)
    whitened = np.linalg.solve(chol, centred.T).T.reshape(fit.params.shape)
    assert_moments(whitened, np.zeros(3), np.ones(3))
    np.testing.assert_array_equal(tune_and_sample(model, metric="low_rank", **kw).draws,
                                  fit.draws)


@pytest.mark.parametrize("dims, rank", [(3, 2), (13, 5), (13, 8)])
def test_low_rank_metric_in_the_c_layer(mvn_model, dims, rank):
    """The C layer's diagonal-plus-low-rank kind: leapfrog steps equal those with the same
    metric as a dense matrix, and its momenta have covariance M = (M⁻¹)⁻¹.  13 × 5 and
    13 × 8 take the AVX2 loops (where the CPU has them) through their blocks of four rows
    and four directions and through both tails."""
    from ahmc_stan import StanModel
    from ahmc_stan.metric import LowRankInvMetric, draw_momenta

    from .conftest import stan_model_path

    rng = np.random.default_rng(8)
    if dims == 3:
        model = mvn_model
    else:
        a = np.triu(rng.normal(size=(dims, dims)))
        model = StanModel(stan_model_path("mvn"), {"D": dims, "mu": rng.normal(size=dims),
                                                   "Sigma": a.T @ a + np.eye(dims)})
    q, _ = np.linalg.qr(rng.normal(size=(dims, rank)))
    low = LowRankInvMetric(rng.uniform(0.5, 2.0, dims), q,
                           np.exp(rng.uniform(-2.0, 2.0, rank)))
    dense = low.to_dense()
    np.testing.assert_allclose(low @ np.eye(dims), dense)
    np.testing.assert_allclose(low.solve(dense), np.eye(dims), atol=1e-12)
    density = model.density
    ends = []
    for metric in (low, dense):
        x, p, g = rng.normal(size=dims), rng.normal(size=dims), np.empty(dims)
        if ends:
            x, p = ends[0][4].copy(), ends[0][5].copy()
        x0, p0 = x.copy(), p.copy()
        lp = density.log_density_gradient(x, g)
        lp, n = density.leapfrog(12, 0.05, metric, x, p, g, lp)
        ends.append((x, p, lp, n, x0, p0))
    np.testing.assert_allclose(ends[0][0], ends[1][0], rtol=1e-12)
    np.testing.assert_allclose(ends[0][1], ends[1][1], rtol=1e-12)
    assert ends[0][2:4] == pytest.approx(ends[1][2:4], rel=1e-12)
    # momenta: C++ and numpy draws both have covariance M
    m = np.linalg.inv(dense)
    for p in (density.draw_momenta(low, 11, 40000), draw_momenta(rng, low, 40000, dims)):
        cov = np.cov(p, rowvar=False)
        # the sd of a sample covariance entry is sqrt((M_ii M_jj + M_ij²) / n)
        tol = 5 * np.sqrt((np.outer(np.diag(m), np.diag(m)) + m**2) / len(p))
        assert np.all(np.abs(cov - m) < tol), (cov, m)


_LOW_RANK_LEAPFROG = """
import sys, numpy as np
from ahmc_stan import StanModel
from ahmc_stan.metric import LowRankInvMetric
rng = np.random.default_rng(4)
d, k = 13, 6
a = np.triu(rng.normal(size=(d, d)))
model = StanModel(sys.argv[1], {"D": d, "mu": rng.normal(size=d), "Sigma": a.T @ a + np.eye(d)})
q, _ = np.linalg.qr(rng.normal(size=(d, k)))
low = LowRankInvMetric(rng.uniform(0.5, 2.0, d), q, np.exp(rng.uniform(-2.0, 2.0, k)))
x, p, g = rng.normal(size=d), rng.normal(size=d), np.empty(d)
lp = model.density.log_density_gradient(x, g)
lp, n = model.density.leapfrog(20, 0.05, low, x, p, g, lp)
print(repr(np.concatenate([x, p, [lp]]).tolist()))
"""


def test_low_rank_products_with_and_without_avx2():
    """The baseline loops (``AHMC_NO_AVX2=1``) and the AVX2 ones, where the CPU has them,
    give the same trajectory to rounding."""
    from .conftest import with_and_without_avx2

    avx2, baseline, two_paths = with_and_without_avx2(_LOW_RANK_LEAPFROG, "mvn")
    np.testing.assert_allclose(avx2, baseline, rtol=1e-11, atol=1e-13)
    if two_paths:  # fused and unfused roundings
        assert not np.array_equal(avx2, baseline)


def test_adaptation_windows_follow_stan_and_split_the_buffer_for_gradient_metrics(
        mvn_model, monkeypatch):
    """Stan's windows (CmdStan's at 1000 warmup iterations: a 75-iteration buffer, then
    25, 50, 100, 200 and a stretched 500, a 50-iteration terminal buffer; 15 %/10 %
    buffers when they do not fit); ``early_window`` splits the initial buffer.  The scale
    phase splits it for the metrics from gradients only, each estimate from its own
    window's draws, and only on up to ``EARLY_WINDOW_MAX_DIMS`` parameters."""
    from ahmc_stan import hmc
    from ahmc_stan.tuning import hmc_warmup as warmup

    stan = [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    assert adaptation_windows(1000) == stan
    assert adaptation_windows(1000, early_window=25) == [(0, 25), (25, 50), (50, 75), *stan]
    assert adaptation_windows(1000, early_window=30) == [(0, 30), (30, 60), *stan]
    assert adaptation_windows(100, early_window=25) == [(15, 90)]
    assert adaptation_windows(19) == []

    kernel = hmc.HMCKernel(mvn_model.density)
    for metric, estimator, expected in (("low_rank", "low_rank_inv_metric",
                                         adaptation_windows(300, early_window=25)),
                                        ("fisher", "fisher_inv_metric",
                                         adaptation_windows(300, early_window=25)),
                                        ("diag", "regularized_inv_metric",
                                         adaptation_windows(300))):
        seen = []

        def estimate(draws, *rest, **kw):
            seen.append(len(draws))
            return np.ones(draws.shape[1])
        monkeypatch.setattr(warmup, estimator, estimate)
        warmup.hmc_warmup(kernel, np.random.default_rng(1), kernel.init(
            np.full(mvn_model.dims, 0.5)), 300, metric, lambda steps: None)
        assert seen == [end - start for start, end in expected]
        assert len(expected) == (6 if metric != "diag" else 3)
        if metric == "low_rank":  # more parameters than EARLY_WINDOW_MAX_DIMS: Stan's
            seen.clear()
            with monkeypatch.context() as few:
                few.setattr(warmup, "EARLY_WINDOW_MAX_DIMS", mvn_model.dims - 1)
                warmup.hmc_warmup(kernel, np.random.default_rng(1), kernel.init(
                    np.full(mvn_model.dims, 0.5)), 300, metric, lambda steps: None)
            assert seen == [end - start for start, end in adaptation_windows(300)]


def test_paths_start_short_with_a_metric_from_gradients():
    """With a metric from gradients the scale phase caps the leapfrog steps early
    (:func:`~ahmc_stan.tuning.hmc_warmup.early_cap`: on 3 parameters 5 steps, doubled
    every 75 iterations).  On a regression with an uncentred predictor ε stays small
    until the metric is estimated, and 2/ε-step paths (up to 1000) would take most of
    warmup.  The initial buffer's windows estimate it from the 25th iteration on, so
    from the 150th the paths run far under the cap (with Stan's windows alone they ran
    at it until the 100th)."""
    from ahmc_stan import StanModel, datasets
    from ahmc_stan.tuning.hmc_warmup import EARLY_WINDOW, early_cap

    from .conftest import stan_model_path

    model = StanModel(stan_model_path("linear_regression"),
                      datasets.uncentred_regression_data("nhtemp"))
    fit = tune_and_sample(model, chains=1, warmup=1000, draws=10, seed=1,
                          metric="low_rank", progress=False, diagnose=False)
    bound = fit.warmup_sampler_stats["num_steps_max"][0][:500]
    first, every = early_cap(model.dims)
    assert (first, every) == (5, 75)
    cap = first * 2.0 ** (np.arange(500) // every)
    assert (bound <= cap).all()
    assert (bound[:EARLY_WINDOW] == cap[:EARLY_WINDOW]).all()  # until the first estimate
    assert bound[150:300].mean() < cap[150:300].mean() / 4


@pytest.mark.parametrize("dims, first, every", [(25, 5, 75), (26, 10, 25)])
def test_the_early_cap_depends_on_the_number_of_parameters(dims, first, every):
    """On up to 25 parameters the early cap is 5 steps doubled every 75 iterations, on
    more 10 doubled every 25 (an ill-scaled diagonal Gaussian started in the identity:
    the first window's paths run at the cap)."""
    from ahmc_stan import StanModel
    from ahmc_stan.tuning.hmc_warmup import early_cap

    from .conftest import stan_model_path

    assert early_cap(dims) == (first, every)
    model = StanModel(stan_model_path("diag_normal"),
                      {"D": dims, "sigma": np.arange(1, dims + 1) / dims})
    fit = tune_and_sample(model, chains=2, warmup=1000, draws=100, seed=4, metric="fisher",
                          progress=False, diagnose=False)
    bound = fit.warmup_sampler_stats["num_steps_max"][:, :300]
    assert (bound <= first * 2 ** (np.arange(300) // every)).all()
    assert np.median(bound[:, :25]) == first


def test_grad_init_starts_from_the_initial_gradient(mvn_model):
    """``1/|∇ log p(x₀)|``: for a Gaussian direction of sd σ at distance δ from its centre,
    σ²/δ; zero or non-finite components keep 1, the rest clipped to [1e-10, 1e10].  With
    ``grad_init`` the scale phase of ``fisher`` and ``low_rank`` runs its first window in
    it, by default in the identity; other metrics refuse it."""
    from ahmc_stan import hmc
    from ahmc_stan.tuning import hmc_warmup as warmup
    from ahmc_stan.tuning.hmc_warmup import gradient_init

    sd, delta = np.array([0.01, 1.0, 30.0]), np.array([0.5, 2.0, -1.0])
    np.testing.assert_allclose(gradient_init(-delta / sd**2), sd**2 / np.abs(delta))
    np.testing.assert_array_equal(gradient_init(np.array([0.0, np.nan, 1e20, 1e-20])),
                                  [1.0, 1.0, 1e-10, 1e10])

    kernel = hmc.HMCKernel(mvn_model.density)
    state = kernel.init(np.array([0.3, -1.2, 2.0])[:mvn_model.dims]
                        if mvn_model.dims == 3 else np.full(mvn_model.dims, 0.5))
    seen = []

    def first_metric(kernel_, rng, state_, inv_metric, *args, **kw):
        seen.append(inv_metric)
        raise StopIteration
    start = gradient_init(state.logdensity_grad)
    ones = np.ones(mvn_model.dims)
    for metric, grad_init, expected in (("fisher", True, start), ("low_rank", True, start),
                                        ("fisher", False, ones), ("low_rank", False, ones),
                                        ("diag", False, ones)):
        seen.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(warmup, "adapt_steps", first_metric)
            with pytest.raises(StopIteration):
                warmup.hmc_warmup(kernel, np.random.default_rng(1), state, 200, metric,
                                  lambda steps: None, grad_init=grad_init)
        np.testing.assert_array_equal(seen[0], expected)
    with pytest.raises(ValueError, match="grad_init applies to the metrics from gradients"):
        warmup.hmc_warmup(kernel, np.random.default_rng(1), state, 200, "diag",
                          lambda steps: None, grad_init=True)
    with pytest.raises(ValueError, match="grad_init applies"):
        tune_and_sample(mvn_model, metric="diag", grad_init=True, progress=False)
    # through tune_and_sample: the option changes the draws, the same seed the same draws
    kw = dict(chains=1, warmup=200, draws=20, seed=2, progress=False, diagnose=False)
    a = tune_and_sample(mvn_model, grad_init=True, **kw)
    np.testing.assert_array_equal(a.draws, tune_and_sample(mvn_model, grad_init=True,
                                                           **kw).draws)
    assert not np.array_equal(a.draws, tune_and_sample(mvn_model, **kw).draws)


# ---- fallback to Stan's diagonal -------------------------------------------------------------

def test_metric_fallback_rule():
    """More than 2 % of the last window's iterations, and more than 2, diverged."""
    from ahmc_stan.tuning.hmc_warmup import fallback_divergences

    assert [fallback_divergences(n) for n in (0, 50, 150, 200, 250, 1000)] == [3, 3, 4, 5, 6, 21]


def _restarted(fit, fired, warmup=400):
    """The iterations of the scale phase run again in Stan's diagonal from ``fired`` on,
    and the draws of its last window."""
    n_scale = warmup // 2
    again = min(n_scale, warmup - fired - (warmup - n_scale) // 2)
    a, b = adaptation_windows(again)[-1]
    return again, fit.warmup_draws[0, fired + a:fired + b]


def test_a_diverging_gradient_metric_falls_back_to_stans_diagonal(mvn_model, monkeypatch):
    """When the rule fires (forced here: no small model diverges the way Caravan does,
    ``comparisons/nuts_peers.py``), it fires at the end of the first call into the last
    window, and the chain runs the scale phase again from there in Stan's diagonal with
    its own windows, taking the iterations from the tuning phase (which keeps at least
    half of its length); the metric is Stan's regularised variance of that phase's last
    window, and the fallback is logged with the window, the divergences and where the
    phase restarted; otherwise nothing is logged."""
    from ahmc_stan.tuning import hmc_warmup
    from ahmc_stan.tuning.windows import regularized_inv_metric

    kw = dict(chains=1, warmup=400, draws=10, seed=3, metric="low_rank", parallel=False,
              progress=False, diagnose=False)
    assert tune_and_sample(mvn_model, **kw).metadata["chains"][0]["metric_fallback"] is None
    monkeypatch.setattr(hmc_warmup, "fallback_divergences", lambda window: 0)
    fit = tune_and_sample(mvn_model, **kw)
    start, end = adaptation_windows(200)[-1]
    log = fit.metadata["chains"][0]["metric_fallback"]
    fired = log["window"][1]
    assert log["metric"] == "low_rank" and log["to"] == "diag"
    assert log["window"][0] == start and start < fired <= end and log["restart"] == fired
    assert log["divergent"] == fit.warmup_sampler_stats["divergent"][0][start:fired].sum()
    again, window = _restarted(fit, fired)
    np.testing.assert_allclose(fit.inv_metric[0], regularized_inv_metric(window, dense=False),
                               rtol=1e-12)
    assert (fit.warmup_sampler_stats["phase"][0] == 0).sum() == fired + again
    assert 400 - fired - again >= 100


def test_the_fallback_is_decided_in_the_diverging_iteration(monkeypatch):
    """The C++ block of the last window stops in the iteration whose divergence decides
    the rule (on the centred eight schools, which diverges for real): the draws until
    then are those of a run that never falls back, and the scale phase runs again from
    there in Stan's diagonal."""
    from ahmc_stan import StanModel
    from ahmc_stan.tuning import hmc_warmup
    from ahmc_stan.tuning.windows import regularized_inv_metric

    from .conftest import stan_model_path
    from .test_convergence import EIGHT_SCHOOLS

    model = StanModel(stan_model_path("eight_schools_centered"), EIGHT_SCHOOLS)
    start, end = adaptation_windows(200)[-1]
    need = hmc_warmup.fallback_divergences(end - start)
    for seed in (2, 1, 3, 4, 5, 6, 7, 8):  # the first where it fires (seed 2 on AVX2)
        kw = dict(chains=1, warmup=400, draws=10, seed=seed, metric="low_rank",
                  parallel=False, progress=False, diagnose=False)
        fit = tune_and_sample(model, **kw)
        log = fit.metadata["chains"][0]["metric_fallback"]
        if log is not None and log["window"][1] < end:
            break
    else:
        pytest.fail("the fallback did not fire inside the last window at seeds 1-8")
    fired = log["window"][1]
    divergent = fit.warmup_sampler_stats["divergent"][0]
    assert log["window"][0] == start and log["divergent"] == need
    assert divergent[start:fired].sum() == need and divergent[fired - 1]
    again, window = _restarted(fit, fired)
    window = window.copy()
    window[:, 1] = np.log(window[:, 1])  # tau > 0: the metric is on the unconstrained scale
    np.testing.assert_allclose(fit.inv_metric[0], regularized_inv_metric(window, dense=False),
                               rtol=1e-10)
    assert (fit.warmup_sampler_stats["phase"][0] == 0).sum() == fired + again
    monkeypatch.setattr(hmc_warmup, "fallback_divergences", lambda window: 10**6)
    never = tune_and_sample(model, **kw)
    assert never.metadata["chains"][0]["metric_fallback"] is None
    np.testing.assert_array_equal(never.warmup_draws[0, :fired], fit.warmup_draws[0, :fired])


def test_without_restart_the_fallback_switches_inside_the_window(monkeypatch):
    """``hmc_warmup`` without ``restart`` (the bandit's scale phase): at the deciding
    divergence the chain switches to Stan's diagonal of its last window-length of draws
    and estimates it again from the rest of the window; with ``restart`` it raises
    :class:`MetricFallback` there instead."""
    from ahmc_stan import StanModel, hmc
    from ahmc_stan.tuning import hmc_warmup
    from ahmc_stan.tuning.windows import regularized_inv_metric

    from .conftest import stan_model_path
    from .test_convergence import EIGHT_SCHOOLS

    model = StanModel(stan_model_path("eight_schools_centered"), EIGHT_SCHOOLS)
    kernel = hmc.HMCKernel(model.density)
    monkeypatch.setattr(hmc_warmup, "fallback_divergences", lambda window: 1)
    start, end = adaptation_windows(200, early_window=25)[-1]
    rows, notes = [], {}
    _, inv_metric, _ = hmc_warmup.hmc_warmup(
        kernel, np.random.default_rng(4), kernel.init(np.full(model.dims, 0.5)), 200,
        "low_rank", rows.append, notes=notes.update)
    positions = np.concatenate([r.info.positions for r in rows])
    divergent = np.concatenate([r.info.is_divergent for r in rows])
    fired = notes["metric_fallback"]["window"][1]
    assert notes["metric_fallback"]["window"][0] == start and start < fired < end
    assert divergent[start:fired].sum() == 1 and divergent[fired - 1]
    assert len(positions) == 200
    np.testing.assert_allclose(
        inv_metric, regularized_inv_metric(positions[fired:end], dense=False), rtol=1e-12)
    with pytest.raises(hmc_warmup.MetricFallback) as raised:
        hmc_warmup.hmc_warmup(
            kernel, np.random.default_rng(4), kernel.init(np.full(model.dims, 0.5)), 200,
            "low_rank", lambda steps: None, restart=True)
    assert raised.value.note == notes["metric_fallback"]
    np.testing.assert_array_equal(raised.value.state.position, positions[fired - 1])


def test_gaussian_misfit_is_zero_for_a_gaussian_and_the_log_gamma_skew_otherwise():
    """:func:`gaussian_misfit`: 0 (to rounding) for any Gaussian from few draws, since its
    gradient is affine in x; for x = log y, y ~ Gamma(a) (p(x) ∝ exp(a x − eˣ), ∇ = a − eˣ,
    a tail to the left that lengthens as a falls) it is Var(x)·Var(r) = a ψ₁(a) − 1 with
    Var(x) = ψ₁(a), Var(eˣ) = a and Cov(x, eˣ) = 1 (Stein).  Estimated from 4000 draws,
    whatever linear map mixes that coordinate with two Gaussian ones; the tolerance is 4
    sds of the estimate over 20 seeds (0.11, 1.0 and 2.8 at the three shapes)."""
    from scipy.special import polygamma

    from ahmc_stan.tuning.windows import gaussian_misfit

    rng = np.random.default_rng(0)
    cov = np.array([[1.0, 0.99], [0.99, 1.0]])
    x = 3.0 + rng.standard_normal((40, 2)) @ np.linalg.cholesky(cov).T
    assert gaussian_misfit(x, -(x - 3.0) @ np.linalg.inv(cov)) < 1e-10
    assert np.isnan(gaussian_misfit(x[:4], x[:4]))  # n ≤ d + 2
    for shape, sd in ((0.5, 0.11), (0.1, 1.0), (0.05, 2.8)):
        y = rng.gamma(shape, size=4000)
        z = rng.standard_normal((4000, 2))
        mix = rng.standard_normal((3, 3))
        draws = np.column_stack([np.log(y), z]) @ mix.T
        grads = np.column_stack([shape - y, -z]) @ np.linalg.inv(mix)
        assert gaussian_misfit(draws, grads) == pytest.approx(
            shape * polygamma(1, shape) - 1, abs=4 * sd)


def test_gaussian_misfit_by_cholesky_equals_its_definition():
    """The Cholesky route of :func:`gaussian_misfit` (one factor ``Cov(x) = L Lᵀ`` for the
    affine fit and for ``Lᵀ Cov(r) L``, which has the eigenvalues of ``Cov(x)^½ Cov(r)
    Cov(x)^½``) gives the definition's value, computed here by least squares and the
    symmetric square root; collinear draws take the definition's route and stay finite."""
    from ahmc_stan.tuning.windows import gaussian_misfit

    def definition(draws, grads):
        n, d = draws.shape
        x = draws - draws.mean(axis=0)
        sd = x.std(axis=0)
        x, g = x / sd, (grads - grads.mean(axis=0)) * sd
        r = g - x @ np.linalg.lstsq(x, g, rcond=None)[0]
        w, v = np.linalg.eigh(x.T @ x / (n - 1))
        half = (v * np.sqrt(w)) @ v.T
        return np.linalg.eigvalsh(half @ (r.T @ r / (n - d - 1)) @ half)[-1]

    rng = np.random.default_rng(3)
    for d, n in ((2, 40), (8, 150), (100, 150)):
        y = rng.gamma(0.3, size=n)
        z = rng.standard_normal((n, d - 1))
        mix = rng.standard_normal((d, d))
        draws = np.column_stack([np.log(y), z]) @ mix.T
        grads = np.column_stack([0.3 - y, -z]) @ np.linalg.inv(mix)
        assert gaussian_misfit(draws, grads) == pytest.approx(definition(draws, grads),
                                                              rel=1e-8)
    x = rng.standard_normal((50, 2))
    twice = np.column_stack([x[:, 0], x[:, 0], x[:, 1]])
    assert gaussian_misfit(twice, -twice) < 1e-10
