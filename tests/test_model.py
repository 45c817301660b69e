"""StanModel: densities and derivatives against analytic values, transforms, names, errors."""

import platform
import shutil
import subprocess
import threading

import numpy as np
import pytest
from scipy import stats
from scipy.special import betaln, expit

from ahmc_stan import DensityError, StanModel

from .conftest import stan_model_path


# ---- multivariate normal: everything is analytic ---------------------------------------

def test_mvn_density_gradient_hessian_hvp(mvn_model, mvn_data):
    mu, Sigma = mvn_data["mu"], mvn_data["Sigma"]
    P = np.linalg.inv(Sigma)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.normal(size=3) * 2
        full = stats.multivariate_normal(mu, Sigma).logpdf(x)
        assert mvn_model.log_density(x, propto=False) == pytest.approx(full, abs=1e-10)
        # propto drops exactly the normalising constant (Sigma is data)
        const = -0.5 * (3 * np.log(2 * np.pi) + np.linalg.slogdet(Sigma)[1])
        assert mvn_model.log_density(x) == pytest.approx(full - const, abs=1e-10)
        lp, grad = mvn_model.log_density_gradient(x)
        np.testing.assert_allclose(grad, -P @ (x - mu), atol=1e-10)
        lp, grad, hess = mvn_model.log_density_hessian(x)
        np.testing.assert_allclose(hess, -P, atol=1e-10)
        v = rng.normal(size=3)
        lp, hv = mvn_model.log_density_hvp(x, v)
        np.testing.assert_allclose(hv, -P @ v, atol=1e-10)
        assert lp == pytest.approx(full - const, abs=1e-10)


def test_kernel_matches_bridgestan(mvn_model):
    x = np.array([0.1, 0.2, 0.3])
    grad = np.empty(3)
    lp = mvn_model.density.log_density_gradient(x, grad)
    lp_ref, grad_ref = mvn_model.log_density_gradient(x)
    assert lp == lp_ref
    np.testing.assert_array_equal(grad, grad_ref)


def test_leapfrog_in_cpp_matches_python(mvn_model):
    rng = np.random.default_rng(2)
    inv_metrics = [None, np.array([0.5, 1.0, 2.0]), np.linalg.inv(np.diag([1, 2, 3.0]) + 0.1)]
    for inv_metric in inv_metrics:
        x0, p0 = rng.normal(size=3), rng.normal(size=3)
        results = []
        for native in (True, False):
            x, p, g = x0.copy(), p0.copy(), np.empty(3)
            lp = mvn_model.density.log_density_gradient(x, g)
            if native:
                lp, n = mvn_model.density.leapfrog(17, 0.1, inv_metric, x, p, g, lp)
            else:
                lp, n = mvn_model.density._leapfrog_python(17, 0.1, inv_metric, x, p, g)
            results.append((x, p, g, lp, n))
        for a, b in zip(*results):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_leapfrog_conserves_energy_to_second_order(mvn_model, mvn_data):
    """Energy error of a fixed-length trajectory shrinks ~4x when the step halves."""
    P = np.linalg.inv(mvn_data["Sigma"])
    errors = []
    for eps in (0.1, 0.05):
        x, p, g = np.zeros(3), np.ones(3), np.empty(3)
        lp = mvn_model.density.log_density_gradient(x, g)
        h0 = -lp + 0.5 * p @ p
        lp, _ = mvn_model.density.leapfrog(int(round(1.0 / eps)), eps, None, x, p, g, lp)
        errors.append(abs(-lp + 0.5 * p @ p - h0))
    assert 3.0 < errors[0] / errors[1] < 5.0
    assert np.max(np.abs(np.linalg.eigvalsh(P))) * 0.1 < 2  # stable step sizes


# ---- constrained parameters: Jacobian terms, transforms, names -------------------------

def _constrained_logp(u, rate=2.0, jacobian=True, propto=False):
    sigma, p, M = np.exp(u[0]), expit(u[1]), u[2:]
    lp = stats.expon(scale=1 / rate).logpdf(sigma) + stats.beta(2, 3).logpdf(p)
    lp += stats.norm(0, sigma).logpdf(M).sum()
    if jacobian:
        lp += u[0] + np.log(p) + np.log1p(-p)
    if propto:  # constants: log(rate), -lbeta(2,3), -6/2 log(2 pi)
        lp -= np.log(rate) - betaln(2, 3) - 3 * np.log(2 * np.pi)
    return lp


def test_lower_bounded_parameter_jacobian_and_switches(constrained_model):
    rng = np.random.default_rng(3)
    for _ in range(5):
        u = rng.normal(size=8)
        for jac in (True, False):
            for propto in (True, False):
                got = constrained_model.log_density(u, propto=propto, jacobian=jac)
                want = _constrained_logp(u, jacobian=jac, propto=propto)
                assert got == pytest.approx(want, abs=1e-10), (jac, propto)
        lp, grad = constrained_model.log_density_gradient(u)
        fd = _finite_difference(lambda z: _constrained_logp(z, propto=True), u)
        np.testing.assert_allclose(grad, fd, atol=1e-6)


def test_param_names_matrix_column_major(constrained_model):
    assert constrained_model.param_names() == [
        "sigma", "p", "M.1.1", "M.2.1", "M.1.2", "M.2.2", "M.1.3", "M.2.3"]
    assert constrained_model.param_names(include_gq=True)[-1] == "sigma_sq"
    assert constrained_model.dims == 8


def test_constrain_unconstrain_round_trip(constrained_model):
    rng = np.random.default_rng(4)
    u = rng.normal(size=8)
    theta = constrained_model.constrain(u)
    assert theta[0] == pytest.approx(np.exp(u[0]))
    assert theta[1] == pytest.approx(expit(u[1]))
    np.testing.assert_allclose(constrained_model.unconstrain(theta), u, atol=1e-12)
    # column-major: M[2,1] is the 4th constrained value
    by_name = {"sigma": theta[0], "p": theta[1], "M": theta[2:].reshape(2, 3, order="F")}
    np.testing.assert_allclose(constrained_model.unconstrain(by_name), u, atol=1e-12)
    gq = constrained_model.constrain(u, include_gq=True, rng=0)
    assert gq[-1] == pytest.approx(theta[0] ** 2)
    rows = constrained_model.constrain(np.vstack([u, u]))
    assert rows.shape == (2, 8)
    # many rows go through C++ in one call and agree with the row-by-row transform
    U = rng.normal(size=(500, 8))
    batch = constrained_model.constrain(U, include_tp=True, include_gq=True, rng=3)
    assert batch.shape == (500, 9)
    for i in (0, 123, 499):
        np.testing.assert_allclose(batch[i], constrained_model.constrain(
            U[i], include_tp=True, include_gq=True, rng=0), rtol=1e-15)
    np.testing.assert_array_equal(batch[:, -1], batch[:, 0] ** 2)
    with pytest.raises(ValueError, match="rows of 8"):
        constrained_model.constrain(U[:, :5])


# ---- logistic regression: gradient against finite differences --------------------------

def _finite_difference(f, x, h=1e-5):
    grad = np.empty_like(x)
    for i in range(len(x)):
        e = np.zeros_like(x)
        e[i] = h
        grad[i] = (f(x + e) - f(x - e)) / (2 * h)
    return grad


def test_logistic_gradient_and_hessian_finite_differences(logistic_model):
    rng = np.random.default_rng(5)
    x = rng.normal(size=logistic_model.dims) * 0.5
    lp, grad = logistic_model.log_density_gradient(x)
    fd = _finite_difference(logistic_model.log_density, x)
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6)
    _, _, hess = logistic_model.log_density_hessian(x)
    fd_hess = np.array([_finite_difference(
        lambda z: logistic_model.log_density_gradient(z)[1][i], x) for i in range(len(x))])
    np.testing.assert_allclose(hess, fd_hess, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(hess, hess.T, atol=1e-10)


# ---- initialisation and points where the density throws --------------------------------

def test_initial_point_is_reproducible_and_in_range(constrained_model):
    a = constrained_model.initial_point(np.random.default_rng(7))
    b = constrained_model.initial_point(np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert np.all(np.abs(a) <= 2)
    fixed = constrained_model.initial_point(np.random.default_rng(8), init={"sigma": 3.0})
    assert fixed[0] == pytest.approx(np.log(3.0))


def test_reject_region(tmp_path):
    model = StanModel(stan_model_path("reject_region"), {"D": 2})
    with pytest.raises(DensityError, match="outside the support"):
        model.log_density(np.array([2.0, 0.0]))
    grad = np.empty(2)
    assert model.density.log_density_gradient(np.array([2.0, 0.0]), grad) == -np.inf
    rng = np.random.default_rng(9)
    for _ in range(20):
        assert model.initial_point(rng)[0] <= 1
    # many points in one call: each row's log density and gradient as one call gives
    x = np.array([[2.0, 0.0], [0.5, -0.3], [1.5, 1.0], [-0.2, 0.7]])
    rows = np.full_like(x, np.nan)
    lp = model.density.log_density_gradient_rows(x, rows)
    for i in range(len(x)):
        one = np.full(2, np.nan)
        assert lp[i] == model.density.log_density_gradient(x[i], one)
        if np.isfinite(lp[i]):
            np.testing.assert_array_equal(rows[i], one)
    assert np.isinf(lp).tolist() == [True, False, True, False]


def test_initial_point_fails_clearly_after_max_tries(tmp_path):
    stan = tmp_path / "always_reject.stan"
    stan.write_text("parameters { real x; } model { reject(\"never\"); }")
    model = StanModel(stan)
    with pytest.raises(RuntimeError, match="100 attempts"):
        model.initial_point(np.random.default_rng(0))


# ---- concurrency -------------------------------------------------------------------------

def test_threads_give_identical_gradients(logistic_model):
    rng = np.random.default_rng(10)
    points = rng.normal(size=(50, logistic_model.dims))
    expected = np.array([logistic_model.log_density_gradient(x)[1] for x in points])
    results, errors = [None] * 4, []

    def work(t):
        try:
            out = np.empty((2000, logistic_model.dims))
            grad = np.empty(logistic_model.dims)
            for i in range(2000):
                if i % 2:
                    out[i] = logistic_model.log_density_gradient(points[i % 50])[1]
                else:
                    logistic_model.density.log_density_gradient(points[i % 50], grad)
                    out[i] = grad
            results[t] = out
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for out in results:
        np.testing.assert_array_equal(out, expected[np.arange(2000) % 50])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="TLS descriptors are the default off x86-64")
def test_the_library_reaches_the_thread_local_tape_through_tls_descriptors(logistic_model):
    """STAN_THREADS's tape is thread-local; with the default global-dynamic model every
    access from a dlopen'ed library calls __tls_get_addr (SV's gradient 1.25× slower,
    benchmarks/bench_tls.py).  The library must use TLS descriptors, and no
    global-dynamic access may remain (from a flag dropped or an object built without)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf (binutils) not found")
    relocations = subprocess.run([readelf, "-rW", str(logistic_model.lib_path)],
                                 capture_output=True, text=True, check=True).stdout
    assert "R_X86_64_TLSDESC" in relocations
    assert "__tls_get_addr" not in relocations
