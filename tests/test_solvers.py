"""Models that call Stan's ODE and algebraic solvers (no forward-mode instances): they
compile, get Hessians by finite differences of autodiff gradients, and sample to the
posterior moments computed by quadrature."""

import numpy as np
import pytest

from ahmc_stan import StanModel, tune_and_sample
from tests.conftest import stan_model_path

SIGMA = 0.1


@pytest.fixture(scope="module")
def decay_data():
    rng = np.random.default_rng(7)
    ts = 0.5 * np.arange(1, 11)
    y = 1.2 * np.exp(-0.4 * ts) + SIGMA * rng.normal(size=ts.size)
    return {"N": ts.size, "ts": ts, "y": y, "sigma": SIGMA}


@pytest.fixture(scope="module")
def ode_model(decay_data):
    return StanModel(stan_model_path("ode_decay"), {**decay_data, "solver": 1})


def _normal_logpdf(x, mu, sd):
    return -0.5 * ((x - mu) / sd) ** 2 - np.log(sd)


@pytest.fixture(scope="module")
def decay_moments(decay_data):
    """Posterior mean and sd of (k, y0) by quadrature on a fine grid."""
    k = np.linspace(1e-3, 1.5, 1500)[:, None]
    y0 = np.linspace(0.3, 2.1, 1500)[None, :]
    mu = y0[..., None] * np.exp(-k[..., None] * decay_data["ts"])
    logp = (_normal_logpdf(np.log(k), np.log(0.5), 0.5) - np.log(k)
            + _normal_logpdf(y0, 1.0, 0.3)
            + _normal_logpdf(decay_data["y"], mu, SIGMA).sum(axis=-1))
    w = np.exp(logp - logp.max())
    w /= w.sum()
    out = {}
    for name, grid in (("k", k), ("y0", y0)):
        mean = float(np.sum(w * grid))
        out[name] = (mean, float(np.sqrt(np.sum(w * (grid - mean) ** 2))))
    return out


def _assert_moments(fit, reference, z_max=5.0):
    """Means and sds within z_max Monte Carlo standard errors (ArviZ's MCSE)."""
    s = fit.summary()
    for name, (mean, sd) in reference.items():
        row = s.loc[name]
        assert abs(row["mean"] - mean) <= z_max * row["mcse_mean"], (name, row, mean)
        assert abs(row["sd"] - sd) <= z_max * row["mcse_sd"], (name, row, sd)


def test_ode_model_builds_with_finite_difference_hessians(ode_model, decay_data):
    """The ODE model compiles (before: a C++ error in coupled_ode_system for fvar<var>);
    its build log says why its Hessians are differences of gradients, and they agree with
    the autodiff Hessians of the same density written in closed form."""
    assert ode_model.hessian_method == "finite_differences"
    assert not ode_model.density.third_order_available
    log = ode_model.build_log.read_text()
    assert "without second-order autodiff" in log and "error:" in log
    closed = StanModel(stan_model_path("decay_closed_form"), {**decay_data, "solver": 0})
    assert closed.hessian_method == "autodiff"
    for x in ([np.log(0.4), 1.2], [np.log(0.8), 0.7]):
        x = np.array(x)
        lp, g, h = ode_model.log_density_hessian(x)
        lp0, g0, h0 = closed.log_density_hessian(x)
        assert lp == pytest.approx(lp0, rel=1e-8)
        np.testing.assert_allclose(g, g0, rtol=1e-6)
        np.testing.assert_allclose(h, h0, rtol=1e-5, atol=1e-6 * np.abs(h0).max())
        v = np.array([0.3, -1.1])
        _, hv = ode_model.log_density_hvp(x, v)
        np.testing.assert_allclose(hv, h0 @ v, rtol=1e-5, atol=1e-6 * np.abs(h0).max())
        # third derivatives fall back to differences of gradients too
        t = ode_model.log_density_third_derivatives(x)
        t0 = closed.log_density_third_derivatives(x)
        np.testing.assert_allclose(t, t0, rtol=1e-3, atol=1e-4 * np.abs(t0).max())


@pytest.mark.parametrize("solver", [1, 2], ids=["rk45", "bdf"])
def test_ode_model_samples_the_posterior(solver, decay_data, decay_moments):
    model = StanModel(stan_model_path("ode_decay"), {**decay_data, "solver": solver})
    fit = tune_and_sample(model, "ahmc", chains=2, warmup=500, draws=1000, seed=3,
                          progress=False)
    _assert_moments(fit, decay_moments)


def test_sampler_needing_hessian_products_runs_on_ode_model(ode_model, decay_moments):
    """gadMALA-exact differentiates through the gradient (Hessian-vector products): on a
    model without forward-mode autodiff it uses differences of gradients."""
    fit = tune_and_sample(ode_model, "gadmala_exact", chains=2, warmup=2000, draws=3000,
                          seed=5, progress=False)
    _assert_moments(fit, decay_moments)


def test_algebraic_solver_model_samples_the_posterior():
    rng = np.random.default_rng(11)
    y = 0.8 + rng.normal(size=20)
    model = StanModel(stan_model_path("algebra_cubic"), {"N": y.size, "y": y})
    assert model.hessian_method == "finite_differences"
    a = np.linspace(-15, 15, 200001)
    x = np.cbrt(a / 2 + np.sqrt(a**2 / 4 + 1 / 27)) + np.cbrt(a / 2 - np.sqrt(a**2 / 4 + 1 / 27))
    np.testing.assert_allclose(x**3 + x, a, atol=1e-9)
    logp = _normal_logpdf(a, 1, 2) + _normal_logpdf(y[:, None], x, 1).sum(axis=0)
    w = np.exp(logp - logp.max())
    w /= w.sum()
    reference = {}
    for name, v in (("a", a), ("x", x)):
        mean = float(np.sum(w * v))
        reference[name] = (mean, float(np.sqrt(np.sum(w * (v - mean) ** 2))))
    fit = tune_and_sample(model, "ahmc", chains=2, warmup=500, draws=1000, seed=2,
                          progress=False)
    _assert_moments(fit, reference)


def test_the_stiff_solver_runs_in_threads_that_never_took_a_gradient(decay_data):
    """``ode_bdf_tol`` nests autodiff (CVODES' Jacobian) even when the model runs with
    doubles, so the C layer gives a thread its autodiff tape before it constrains draws
    or evaluates the log density, not only before gradients: the chains' draws are
    constrained a chain per thread when a fit is assembled (``constrain_each``), and
    nutpie runs its chains in threads.  Without the tape this crashed the process."""
    import threading

    model = StanModel(stan_model_path("ode_decay"), {**decay_data, "solver": 2})
    rng = np.random.default_rng(3)
    xs = [np.column_stack([rng.normal(np.log(0.4), 0.1, 50), rng.normal(1.2, 0.1, 50)])
          for _ in range(4)]
    seeds = np.random.SeedSequence(1).spawn(4)
    at_once = model.constrain_each(xs, [np.random.default_rng(s) for s in seeds],
                                   include_tp=True, include_gq=True)
    for x, s, got in zip(xs, seeds, at_once):
        want = model.constrain(x, include_tp=True, include_gq=True,
                               rng=np.random.default_rng(s))
        np.testing.assert_array_equal(got, want)
        k, y0 = np.exp(x[:, :1]), x[:, 1:]  # mu: the closed form, to the solver's tolerance
        np.testing.assert_allclose(got[:, 2:], y0 * np.exp(-k * decay_data["ts"]),
                                   rtol=1e-6, atol=1e-8)
    found = {}

    def density():
        found["lp"] = model.bridge.log_density(xs[0][0], propto=False)

    thread = threading.Thread(target=density)
    thread.start()
    thread.join()
    assert found["lp"] == model.bridge.log_density(xs[0][0], propto=False)
