"""The Metropolis-type samplers' C++ blocks (``ahmc_mh_block``) against the Python
reference of one iteration (:func:`~ahmc_stan.samplers.metropolis.mh_iteration` and the
proposals' ``adapt``), fed the noise the block drew: the same states, statistics and
adapted proposals, for every family, in warmup and in sampling."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from ahmc_stan import tune_and_sample
from ahmc_stan.samplers.baselines import AdaptiveMetropolis, ScaleAdaptedProposal
from ahmc_stan.samplers.gad import GadProposal
from ahmc_stan.samplers.metropolis import Target, mh_iteration

N_ITER = 40


def proposals(dims):
    gad = dict(adapt_delta=0.55, learning_rate=0.01)  # a large rate: L moves visibly
    return {
        "rwm": ScaleAdaptedProposal(0.1, False, 0.234),
        "mala": ScaleAdaptedProposal(0.1, True, 0.574),
        "am": AdaptiveMetropolis(dims, learning_rate=0.05),
        "am_fixed_scale": AdaptiveMetropolis(dims, learning_rate=0.05, adapt_scale=False),
        "gadrwm": GadProposal(dims, langevin=False, exact=False, **gad),
        "gadmala": GadProposal(dims, langevin=True, exact=False, **gad),
        "gadmala_exact": GadProposal(dims, langevin=True, exact=True, **gad),
    }


def proposal_state(p) -> dict:
    out = {"L": np.asarray(p.L, dtype=float), "step_size": p.step_size, **p.stats()}
    if isinstance(p, AdaptiveMetropolis):
        out.update(mean=p.mean, t=p.t, scale=p.scale)
    if isinstance(p, GadProposal):
        out["G"] = p._sq_grad
    return out


@pytest.mark.parametrize("adapting", [True, False], ids=["warmup", "sampling"])
@pytest.mark.parametrize("name", list(proposals(2)))
def test_block_is_the_python_iteration(logistic_model, name, adapting):
    model = logistic_model
    target = Target(model)
    native = proposals(model.dims)[name]
    if not adapting:  # a proposal adapted for a while, then fixed
        x = np.full(model.dims, 0.1)
        lp, grad = target.gradient(x)
        block = native.native_block(True)
        model.density.mh_block(300, 1, block, 7, x, grad, lp)
        native.load_native(block)
        native.end_warmup()
    x = np.linspace(-0.3, 0.3, model.dims)
    lp, grad = target.gradient(x)
    initial_L = np.array(native.L, dtype=float)
    accepted, hvps = [], 0
    for i in range(N_ITER):  # one iteration per call, each from the same state
        reference = copy.deepcopy(native)
        xr, lpr, gr = x.copy(), lp, grad.copy() if reference.langevin else None
        block = native.native_block(adapting)
        lp, rows, stats, noise = model.density.mh_block(1, 1, block, 2024 + i, x, grad, lp,
                                                        want_noise=True)
        native.load_native(block)
        xr, lpr, gr, prob, acc, made = mh_iteration(target, reference, xr, lpr, gr,
                                                    noise[0, :-1], noise[0, -1], adapting)
        np.testing.assert_allclose(rows[0], xr, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(x, xr, rtol=1e-12, atol=1e-14)
        assert lp == pytest.approx(lpr, rel=1e-12)
        assert stats["accept_stat"][0] == pytest.approx(prob, rel=1e-9, abs=1e-300)
        assert stats["accepted"][0] == acc
        for k in ("n_grad", "n_density", "n_hvp"):
            assert stats[k][0] == made.get(k, 0), k
        hvps += made.get("n_hvp", 0)
        got, want = proposal_state(native), proposal_state(reference)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-14, err_msg=k)
        accepted.append(acc)
    assert 0 < np.mean(accepted) < 1  # both branches exercised
    if name == "gadmala_exact" and adapting:
        assert hvps > 0
    if adapting and name not in ("rwm", "mala"):
        assert not np.allclose(native.L, initial_L)  # it adapted


def test_same_seed_same_draws(gauss2d):
    """Blocks draw their noise in C++ from one seed per block, taken from the chain's
    Generator: the same seed gives the same draws, another seed others."""
    run = dict(chains=2, warmup=500, draws=500, progress=False, diagnose=False)
    a = tune_and_sample(gauss2d, "gadmala", seed=11, **run)
    b = tune_and_sample(gauss2d, "gadmala", seed=11, **run)
    c = tune_and_sample(gauss2d, "gadmala", seed=12, **run)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)


# ---- generalised HMC's C++ block (ahmc_ghmc_block) against GHMCKernel's Python loop -------

class _Replay:
    """Stands in for the Generator of GHMCKernel.run, handing out the noise the C++ block
    drew, in the order the Python loop asks for it: L_r, the momentum's normals (the
    overrelaxation's K x n candidates, or a fresh momentum's n), ρ₀'s normal (SVHMC), u."""

    def __init__(self, row, k, n, verlet):
        self.row, self.k, self.n, self.verlet = row, k, n, verlet

    def integers(self, low, high, endpoint=False):
        return int(self.row[0])

    def standard_normal(self, shape=None):
        if shape is None:  # ρ₀'s
            assert self.verlet
            return float(self.row[-2])
        return self.row[1:1 + max(self.k, 1) * self.n].reshape(shape)

    def uniform(self):
        return float(self.row[-1])


@pytest.fixture(scope="module")
def banana_model():
    from ahmc_stan import StanModel

    from .conftest import stan_model_path

    return StanModel(stan_model_path("banana"), {"b": 1.0})


#: (K, Hessian-vector product of the adaptive Störmer–Verlet; None: the leapfrog): OHMC,
#: SVHMC (fresh momentum), OSVHMC, and SVHMC with differences of gradients in U.
GHMC_CASES = {"ohmc": (5, None), "svhmc": (0, "autodiff"), "osvhmc": (5, "autodiff"),
              "svhmc_differences": (0, "gradient")}


@pytest.mark.parametrize("diagonal", [False, True], ids=["identity", "diagonal"])
@pytest.mark.parametrize("case", list(GHMC_CASES))
def test_ghmc_block_is_the_python_iteration(logistic_model, banana_model, case, diagonal):
    """40 single iterations of the C++ block, each from the reference's last state and
    fed to the reference on the noise it drew: the same steps, evaluations, acceptance
    and states.  SVHMC also on the banana with the talk's exponent, where some
    trajectories end with ρ ≤ 0 (rejected, divergent)."""
    from ahmc_stan.ghmc import GHMCKernel, GHMCState
    from ahmc_stan.hmc import HMCParameters
    from ahmc_stan.samplers.ohmc import leapfrog_trajectory
    from ahmc_stan.samplers.svhmc import AdaptiveVerlet, hessian_vector

    k, hvp = GHMC_CASES[case]
    for model in [logistic_model] if hvp is None else [logistic_model, banana_model]:
        inv_metric = np.linspace(0.5, 2.0, model.dims) if diagonal else None
        verlet = None
        if hvp is None:
            trajectory = leapfrog_trajectory(model.density, None, None, inv_metric, None)
        else:
            trajectory = AdaptiveVerlet(model.density, hessian_vector(model, hvp),
                                        inv_metric, 3.0,
                                        -0.5 if model is banana_model else 0.5, 0.1)
            verlet = trajectory.native_integrator.verlet
        reference = GHMCKernel(model.density, trajectory, inv_metric,
                               num_candidates=k or None)
        assert not reference.native
        # A central difference divides rounding errors by h ≈ 1.5e-8 (1 + |x|): the dot
        # products in G, summed in another order in numpy and Eigen, differ in the last
        # bit, and after a difference in the 8th digit.  Without differences, the last bits.
        rel, (state_rtol, state_atol) = ((1e-9, (1e-12, 1e-14)) if hvp != "gradient"
                                         else (1e-6, (1e-6, 1e-8)))
        rng = np.random.default_rng(5)
        state = reference.init(np.linspace(-0.2, 0.2, model.dims), rng)
        accepted, failed = [], 0
        for i in range(40):
            eps = 0.05 if i % 3 else 0.6  # some rejections, so the flip is exercised
            params = HMCParameters(eps, 8)
            x, grad, p = (state.position.copy(), state.logdensity_grad.copy(),
                          state.momentum.copy())
            lp, out, noise = model.density.ghmc_block(
                eps, 8, True, inv_metric, k, 100 + i, 1, 1000.0, x, grad, state.logdensity,
                p, verlet=verlet, want_noise=True)
            ref_state, info = reference.run(_Replay(noise[0], k, model.dims, verlet),
                                            state, params, 1)
            assert out["n_steps"][0] == info.num_steps[0]
            assert out["n_grad"][0] == info.num_grad[0]
            if verlet is not None:
                assert out["n_hvp"][0] == info.extra_stats["n_hvp"][0]
            assert bool(out["accepted"][0]) == bool(info.is_accepted[0])
            assert bool(out["divergent"][0]) == bool(info.is_divergent[0])
            # A trajectory rejected with probability ≈ 1 (ΔH ≈ 17 on the banana) amplifies
            # the differences' rounding in ΔH; below 1e-9 an acceptance probability makes
            # no difference to the chain (the decision is compared exactly above).
            assert out["accept_prob"][0] == pytest.approx(info.acceptance_rate[0], rel=rel,
                                                          abs=1e-9 if hvp == "gradient"
                                                          else 1e-300)
            assert out["energy"][0] == pytest.approx(info.energy[0], rel=rel)
            np.testing.assert_allclose(x, ref_state.position, rtol=state_rtol, atol=state_atol)
            np.testing.assert_allclose(p, ref_state.momentum, rtol=state_rtol, atol=state_atol)
            assert lp == pytest.approx(ref_state.logdensity, rel=state_rtol)
            accepted.append(bool(out["accepted"][0]))
            failed += bool(out["accept_prob"][0] == 0)
            state = GHMCState(x, lp, grad, p)
        assert 0 < np.mean(accepted) < 1
        if model is banana_model:
            assert failed > 0


def test_mh_kernel_follows_the_kernel_protocol(logistic_model):
    """``MHKernel``: ``init`` then ``run(rng, state, params, n)`` as HMCKernel; a fixed
    proposal is not changed by the call, an adapting one is adapted in place; the state
    is new (the caller's is not modified); same seed, same draws; ``step`` is one row."""
    from ahmc_stan.mh import MHInfo, MHKernel, MHState

    model = logistic_model
    kernel = MHKernel(model.density)
    state = kernel.init(np.full(model.dims, 0.1))
    assert isinstance(state, MHState) and np.isfinite(state.logdensity)
    start = state.position.copy()
    fixed = proposals(model.dims)["gadmala"].native_block(False)
    L = fixed.chol.copy()
    a, info = kernel.run(np.random.default_rng(5), state, fixed, 50)
    b, again = kernel.run(np.random.default_rng(5), state, fixed, 50)
    assert isinstance(info, MHInfo) and info.positions.shape == (50, model.dims)
    np.testing.assert_array_equal(a.position, b.position)
    np.testing.assert_array_equal(info.positions, again.positions)
    np.testing.assert_array_equal(state.position, start)
    np.testing.assert_array_equal(fixed.chol, L)
    np.testing.assert_array_equal(info.positions[-1], a.position)
    assert a.logdensity == info.logdensity[-1] == model.log_density(a.position)
    np.testing.assert_allclose(a.logdensity_grad,
                               model.log_density_gradient(a.position)[1], rtol=1e-12)
    assert np.all(info.num_grad == 1) and set(np.unique(info.is_accepted)) <= {0.0, 1.0}
    assert np.all((info.acceptance_rate >= 0) & (info.acceptance_rate <= 1))
    moved = np.any(np.diff(info.positions, axis=0) != 0, axis=1)
    np.testing.assert_array_equal(moved, info.is_accepted[1:] == 1)
    assert set(info.stats()) >= {"accept_stat", "accepted", "n_grad", "lp"}
    adapting = proposals(model.dims)["rwm"].native_block(True)
    sigma = adapting.state[5]
    kernel.run(np.random.default_rng(5), state, adapting, 50)
    assert adapting.state[5] != sigma
    one, row = kernel.step(np.random.default_rng(6), state, fixed)
    assert row.positions.shape == (1, model.dims)


_TRIANGULAR_BLOCK = """
import sys, numpy as np
from ahmc_stan import StanModel
from ahmc_stan.samplers.baselines import AdaptiveMetropolis
from ahmc_stan.samplers.gad import GadProposal
rng = np.random.default_rng(5)
d = 23  # a panel of 16 columns, one of 4, three single ones (csrc/ahmc_triangular.hpp)
a = np.triu(rng.normal(size=(d, d)))
model = StanModel(sys.argv[1], {"D": d, "mu": rng.normal(size=d), "Sigma": a.T @ a + np.eye(d)})
out = []
for p in (GadProposal(d, langevin=True, exact=False, adapt_delta=0.55, learning_rate=0.01),
          GadProposal(d, langevin=True, exact=True, adapt_delta=0.55, learning_rate=0.01),
          GadProposal(d, langevin=False, exact=False, adapt_delta=0.25, learning_rate=0.01),
          AdaptiveMetropolis(d, learning_rate=0.05)):
    p.L = np.tril(rng.normal(size=(d, d)), -1) * 0.05 + np.diag(rng.uniform(0.3, 0.6, d))
    p.L[np.triu_indices(d, 1)] = np.nan  # never read
    x = rng.normal(size=d)
    grad = np.empty(d)
    lp = model.density.log_density_gradient(x, grad)
    for adapting in (True, False):
        block = p.native_block(adapting)
        lp, rows, stats, _ = model.density.mh_block(60, 1, block, 9, x, grad, lp)
        p.load_native(block)
        out += [rows.ravel(), np.tril(p.L).ravel(), stats["accepted"]]
print(repr(np.concatenate(out).tolist()))
"""


def test_triangular_products_and_rmsprop_with_and_without_avx2():
    """The baseline loops (``AHMC_NO_AVX2=1``) and the AVX2 ones, where the CPU has them,
    give the same gadMALA (fast and exact), gadRWM and AM blocks to rounding, warmup and
    sampling, on 23 dimensions (every panel width of ``csrc/ahmc_triangular.hpp``), and
    neither reads L's upper triangle (NaN here)."""
    from .conftest import with_and_without_avx2

    avx2, baseline, two_paths = with_and_without_avx2(_TRIANGULAR_BLOCK, "mvn")
    assert np.all(np.isfinite(avx2))
    np.testing.assert_allclose(avx2, baseline, rtol=1e-9, atol=1e-12)
    if two_paths:  # the products' fused and unfused roundings
        assert not np.array_equal(avx2, baseline)


def test_rmsprop_rounds_the_same_with_and_without_avx512():
    """Where the CPU has AVX-512F, gad's RMSProp step runs 8 wide (the outer product's row
    formed in registers, G's rows scaled in place); with ``AHMC_NO_AVX512=1`` it runs on
    the AVX2 loops.  The products are the same AVX2 code on both, so the blocks, warmup
    and sampling, must agree to the last bit."""
    from .conftest import cpu_flags, run_with_env

    wide = run_with_env(_TRIANGULAR_BLOCK, "mvn", AHMC_NO_AVX512="")
    narrow = run_with_env(_TRIANGULAR_BLOCK, "mvn", AHMC_NO_AVX512="1")
    assert np.all(np.isfinite(wide))
    np.testing.assert_array_equal(wide, narrow)
    if " avx512f" not in cpu_flags():
        pytest.skip("no AVX-512F here: both runs took the AVX2 loops")
