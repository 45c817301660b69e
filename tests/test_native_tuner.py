"""AHMC's tuner in C++ (:class:`~ahmc_stan.tuning.native_tuner.NativeBayesOptTuner`) and
Algorithm 2 in one C++ call (``ahmc_tuned_hmc_block``), each against the Python
reference: the same moves on the same rewards and uniforms, the same draws block by
block."""

import math

import numpy as np
import pytest

from ahmc_stan import tune_and_sample
from ahmc_stan.hmc import HMCKernel
from ahmc_stan.metric import LowRankInvMetric
from ahmc_stan.samplers.tuned_blocks import esjd_block_rewards
from ahmc_stan.tuning import BayesOptTuner, Box, Dimension, NativeBayesOptTuner

from .stats_util import assert_moments

GOLDEN = 0x9E3779B97F4A7C15
MASK = 2**64 - 1


def mix64(z: int) -> int:
    """splitmix64's output function, as ``ahmc_tuned_hmc_block`` derives its seeds."""
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def box(l_max: int = 40) -> Box:
    return Box([Dimension("step_size", 0.05, 0.6), Dimension("num_steps", 1, l_max,
                                                                 integer=True)])


def reward_surface(gamma, rng) -> float:
    """A noisy bump over (ε, L), an ESJD-like ridge along εL ≈ 3."""
    eps, steps = gamma["step_size"], gamma["num_steps"]
    return float(np.sin(min(eps * steps, np.pi) / 2) ** 2 / np.sqrt(steps)
                 * (1 + 0.1 * rng.normal()))


def same_move(reference: BayesOptTuner, native_gamma: dict) -> bool:
    """Whether ``native_gamma``, where the reference's last move went elsewhere, ties
    with the reference's choice on the reference's acquisition (to rounding)."""
    if native_gamma == reference.propose():
        return True
    grid = reference.box.grid(reference_grid_points, 32)
    unit = reference.box.unit_grid(reference_grid_points, 32)
    last = reference.history[-1]
    acq = reference.acquisition(unit, p=last.p)
    at = np.flatnonzero((grid == reference.box.to_array(native_gamma)).all(axis=1))
    assert len(at) == 1
    return bool(np.isclose(acq[at[0]], acq.max(), rtol=1e-12, atol=1e-12))


reference_grid_points = 1024


def make_pair(density, schedule="ahmc", k=20, alpha=4.0, seed=3, b=None):
    common = dict(k=k, alpha=alpha, schedule=schedule, grid_points=reference_grid_points,
                  grid_resolution=32)
    b = box() if b is None else b
    return (BayesOptTuner(b, seed=seed, **common),
            NativeBayesOptTuner(density, b, seed=seed, **common))


@pytest.mark.parametrize("schedule,alpha", [("ahmc", 4.0), ("exponential", None)])
def test_native_tuner_makes_the_python_tuners_moves(gauss2d, schedule, alpha):
    """Fed the same rewards, batched as the sampler batches them (updates_until_move,
    then update_many), the C++ tuner draws the same uniforms and makes the same moves,
    with the same p, β, s and the same GP posterior on the grid; where the two pick
    different grid points, the points tie on the acquisition."""
    reference, native = make_pair(gauss2d.density, schedule, alpha=alpha)
    rewards = np.random.default_rng(11)
    ties = 0
    for _ in range(120):
        gamma = reference.propose()
        assert native.propose() == gamma
        n = reference.updates_until_move(7)
        assert native.updates_until_move(7) == n
        batch = [reward_surface(gamma, rewards) for _ in range(n)]
        reference.update_many(gamma, batch)
        native.update_many(gamma, batch)
        for mine, theirs in zip(native.history[-n:], reference.history[-n:]):
            assert (mine.i, mine.gamma, mine.reward, mine.moved) == (
                theirs.i, theirs.gamma, theirs.reward, theirs.moved)
            assert mine.p == theirs.p and mine.beta == theirs.beta and mine.s == theirs.s
        if native.propose() != reference.propose():
            assert same_move(reference, native.propose())
            ties += 1
            reference._current = reference.box.snap(native.propose())  # stay in step
        assert (native.i, native.s, native.frozen) == (reference.i, reference.s,
                                                       reference.frozen)
    assert native.rng.random() == reference.rng.random()  # the same uniforms drawn
    assert ties <= 3
    mean, var = native.predict_grid()
    ref_mean, ref_var = reference.gp.predict(
        reference.box.unit_grid(reference_grid_points, 32))
    np.testing.assert_allclose(mean, ref_mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(var, ref_var, rtol=0, atol=1e-10)
    # the Python GP the native tuner keeps for best() and figures holds the same data
    np.testing.assert_array_equal(native.gp.inputs, reference.gp.inputs)
    np.testing.assert_array_equal(native.gp.counts, reference.gp.counts)
    assert native.history_table() == reference.history_table()
    moves = sum(r.moved for r in reference.history)
    assert 20 < moves < 120


def test_native_tuner_freezes_at_the_best_and_resumes(gauss2d):
    reference, native = make_pair(gauss2d.density, k=1000)
    rewards = np.random.default_rng(2)
    for _ in range(30):
        gamma = native.propose()
        r = reward_surface(gamma, rewards)
        for tuner in (reference, native):
            tuner._current = tuner.box.snap(gamma)
            tuner.update(gamma, r)
    assert native.freeze(to="best") == reference.freeze(to="best")
    frozen = native.propose()
    native.update_many(frozen, [0.5, 0.7])
    assert native.propose() == frozen and native.frozen
    assert [r.p for r in native.history[-2:]] == [0.0, 0.0]
    assert not any(r.moved for r in native.history[-2:])
    native.unfreeze()
    native.update(frozen, 0.1)
    assert native.history[-1].moved  # k = 1000: p = 1 again


def test_native_tuner_rejects_a_nonfinite_reward(gauss2d):
    _, native = make_pair(gauss2d.density)
    with pytest.raises(ValueError, match="finite"):
        native.update_many(native.propose(), [0.5, float("nan")])
    assert native.i == 0 and native.history == []


def _branin(u):
    x, y = -5 + 15 * u[0], 15 * u[1]
    return ((y - 5.1 / (4 * math.pi**2) * x * x + 5 / math.pi * x - 6) ** 2
            + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x) + 10)


def _camel(u):
    x, y = -3 + 6 * u[0], -2 + 4 * u[1]
    return (4 - 2.1 * x**2 + x**4 / 3) * x**2 + x * y + (-4 + 4 * y**2) * y**2


_HART_A = np.array([[3, 10, 30], [0.1, 10, 35], [3, 10, 30], [0.1, 10, 35]])
_HART_P = np.array([[.3689, .1170, .2673], [.4699, .4387, .7470], [.1091, .8732, .5547],
                    [.0381, .5743, .8828]])


def _hartmann3(u):
    return -float(np.array([1, 1.2, 3, 3.2]) @ np.exp(-(_HART_A * (u - _HART_P) ** 2).sum(1)))


@pytest.mark.parametrize("f,d,minimum", [(_branin, 2, 0.397887), (_camel, 2, -1.031628),
                                         (_hartmann3, 3, -3.86278)])
def test_native_direct_finds_scipys_minimiser(gauss2d, f, d, minimum):
    """The C++ DIRECT (``direct_minimise``) and :func:`scipy.optimize.direct` (the Python
    tuner's maximiser), both locally biased with 2000 evaluations, return the same point
    on standard test functions, at their known global minima."""
    import ctypes

    from scipy.optimize import direct

    def call(p, _):
        return f(np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_double)),
                                       (d,)).copy())

    callback = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p)(call)
    x = np.zeros(d)
    n_eval = gauss2d.density.entry("ahmc_direct_minimise")(d, callback, None, 2000,
                                                            x.ctypes.data)
    reference = direct(f, [(0.0, 1.0)] * d, maxfun=2000)
    # it stops after the iteration that reaches maxfun, which divides a few rectangles
    assert 2000 <= n_eval < 2050
    np.testing.assert_allclose(x, reference.x, rtol=0, atol=1e-12)
    assert f(x) == pytest.approx(minimum, abs=1e-4)


def test_native_direct_tuner_moves_as_the_scipy_tuner(gauss2d):
    """The thesis's tuner (exponential schedule, no scale, DIRECT) in C++ against the
    Python one with :func:`scipy.optimize.direct`, fed the same γ, rewards and uniforms:
    the two maximise one acquisition with two codes of one algorithm, whose choices part
    where acquisition values tie to rounding (the GPs are computed differently) and then
    reach other local maxima, as often better as worse.  So most moves are the same point
    and, over all moves, the C++ one reaches the reference's acquisition value on average
    (within 0.5 % of the acquisition's range over the box)."""
    b = box()
    unit = b.unit_grid(20000, 500)  # for the acquisition's range
    common = dict(schedule="exponential", lam=0.01, alpha=None, maximizer="direct")
    same = moves = 0
    shortfall = []
    for seed in range(3):
        reference = BayesOptTuner(b, seed=seed, **common)
        native = NativeBayesOptTuner(gauss2d.density, b, seed=seed, **common)
        rewards = np.random.default_rng(seed + 100)
        for _ in range(120):
            gamma = reference.propose()
            r = reward_surface(gamma, rewards)
            reference.update(gamma, r)
            native.update(gamma, r)
            last = reference.history[-1]
            assert native.history[-1].moved == last.moved
            if not last.moved:
                continue
            moves += 1
            same += native.propose() == reference.propose()
            acq = reference.acquisition(unit, p=last.p)
            at = reference.acquisition(np.array([b.to_unit(b.to_array(g)) for g in (
                reference.propose(), native.propose())]), p=last.p)
            shortfall.append((at[0] - at[1]) / (acq.max() - acq.min()))
    assert moves > 150
    assert same >= 0.8 * moves
    assert np.mean(shortfall) <= 0.005


def metrics(dims: int):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(dims, dims))
    vecs = np.linalg.qr(rng.normal(size=(dims, 2)))[0]
    return {"identity": None, "diag": np.linspace(0.5, 2.0, dims),
            "dense": a @ a.T / dims + np.eye(dims),
            "low_rank": LowRankInvMetric(np.linspace(0.5, 2.0, dims), vecs,
                                         np.array([4.0, 0.3]))}


@pytest.mark.parametrize("metric", ["identity", "diag", "dense", "low_rank"])
def test_tuned_block_is_algorithm_2_in_python(mvn_model, metric):
    """One call of ``ahmc_tuned_hmc_block`` against Algorithm 2 in Python: block b's
    iterations are ``ahmc_hmc_block``'s from the seed the call derives for it, bit for
    bit; its reward is :func:`esjd_block_rewards`'s in the metric's norm; the Python tuner
    fed that reward and the call's uniform makes the same move."""
    inv_metric = metrics(mvn_model.dims)[metric]
    density = mvn_model.density
    kernel = HMCKernel(density)
    state = kernel.init(np.array([0.5, -1.0, 2.0]))
    reference, native = make_pair(density, k=8)
    rng = np.random.default_rng(4)
    seed = int(np.random.default_rng(4).integers(0, 2**63))  # what tuned_run draws
    m, n_iter = 5, 123
    end, steps = kernel.tuned_run(rng, state, inv_metric, native, m, n_iter, math.inf)
    info = steps.info
    assert len(info.positions) == n_iter
    x, grad, lp = state.position.copy(), state.logdensity_grad.copy(), state.logdensity
    rows = native.history_array()
    for b, start in enumerate(range(0, n_iter, m)):
        gamma = reference.propose()
        nb = min(m, n_iter - start)
        block = slice(start, start + nb)
        assert (steps.step_size[block] == gamma["step_size"]).all()
        assert (steps.num_steps_max[block] == gamma["num_steps"]).all()
        previous = x.copy()
        lp, out = density.hmc_block(gamma["step_size"], gamma["num_steps"], True,
                                    inv_metric, mix64(seed + (2 * b + 1) * GOLDEN), nb,
                                    kernel.max_energy_error, x, grad, lp)
        np.testing.assert_array_equal(out["draws"], info.positions[block])
        np.testing.assert_array_equal(out["n_steps"], info.num_steps[block])
        np.testing.assert_array_equal(out["accept_prob"], info.acceptance_rate[block])
        reward = esjd_block_rewards(previous, out["draws"], gamma["num_steps"], inv_metric,
                                    nb)[0]
        u = (mix64(seed + (2 * b + 2) * GOLDEN) >> 11) * 2.0**-53
        assert rows[b, -1] == u
        assert rows[b, 3] == pytest.approx(reward, rel=1e-12)
        reference._queued_u = [u]
        reference.update(gamma, rows[b, 3])
        theirs = reference.history[-1]
        assert (rows[b, 4], bool(rows[b, 5]), rows[b, 6]) == (theirs.p, theirs.moved,
                                                              theirs.s)
        mine = native.box.to_dict(rows[b, 8:10])
        if mine != reference.propose():
            assert same_move(reference, mine)
            reference._current = reference.box.snap(mine)
    assert b + 1 == native.i == len(rows)
    np.testing.assert_array_equal(end.position, x)
    assert end.logdensity == lp


def test_tuned_block_stops_after_the_block_that_reaches_the_gradient_budget(mvn_model):
    kernel = HMCKernel(mvn_model.density)
    state = kernel.init(np.zeros(3))
    _, native = make_pair(mvn_model.density)
    _, steps = kernel.tuned_run(np.random.default_rng(1), state, None, native, 4, 400, 150)
    grads = steps.info.num_grad
    n = len(grads)
    assert n % 4 == 0 and n < 400
    assert grads[:n - 4].sum() < 150 <= grads.sum()
    assert native.i == n // 4


def test_frozen_tuner_takes_no_rewards_in_the_tuned_block(mvn_model):
    kernel = HMCKernel(mvn_model.density)
    _, native = make_pair(mvn_model.density)
    gamma = native.freeze()
    _, steps = kernel.tuned_run(np.random.default_rng(1), kernel.init(np.zeros(3)), None,
                                native, 5, 50, math.inf)
    assert native.i == 0 and native.history == []
    assert (steps.step_size == gamma["step_size"]).all()
    assert (steps.num_steps_max == gamma["num_steps"]).all()


def test_python_tuner_option_gives_the_same_posterior(gauss2d):
    """``native=False`` runs Algorithm 2 with the Python tuner (the reference): a
    different random stream, the same target."""
    fit = tune_and_sample(gauss2d, chains=2, warmup=1000, draws=2000, seed=3,
                          progress=False, native=False)
    assert_moments(fit.params, np.zeros(2), np.ones(2))
    assert len(fit.metadata["chains"][0]["tuning_history"]["reward"]) == 100 + 2000 // 5


@pytest.mark.parametrize("case", ["ohmc", "svhmc"])
def test_tuned_ghmc_block_is_the_ghmc_blocks_with_the_tuners_moves(mvn_model, case):
    """``ahmc_tuned_ghmc_block``: block b's iterations are ``ahmc_ghmc_block``'s from the
    seed the call derives for it, the momentum carried from block to block (OHMC's
    ordered overrelaxation; SVHMC's adaptive Störmer–Verlet with its fresh momentum)."""
    from ahmc_stan.ghmc import GHMCKernel
    from ahmc_stan.samplers.ohmc import leapfrog_trajectory
    from ahmc_stan.samplers.svhmc import AdaptiveVerlet, hessian_vector

    density = mvn_model.density
    inv_metric = np.linspace(0.5, 2.0, mvn_model.dims)
    if case == "ohmc":
        trajectory, k = leapfrog_trajectory(density, None, None, inv_metric, None), 5
    else:
        trajectory, k = AdaptiveVerlet(density, hessian_vector(mvn_model, "gradient"),
                                       inv_metric, 3.0, 0.5, 0.1), None
    kernel = GHMCKernel(density, trajectory, inv_metric, k, native=True)
    state = kernel.init(np.array([0.5, -1.0, 2.0]), np.random.default_rng(0))
    reference, native = make_pair(density, k=8)
    seed = int(np.random.default_rng(4).integers(0, 2**63))
    m, n_iter = 4, 61
    end, steps = kernel.tuned_run(np.random.default_rng(4), state, native, m, n_iter,
                                  math.inf)
    x, grad, lp, p = (state.position.copy(), state.logdensity_grad.copy(),
                      state.logdensity, state.momentum.copy())
    rows = native.history_array()
    verlet = kernel.native_integrator.verlet
    for b, start in enumerate(range(0, n_iter, m)):
        nb = min(m, n_iter - start)
        block = slice(start, start + nb)
        eps, L = steps.step_size[start], int(steps.num_steps_max[start])
        assert (steps.step_size[block] == eps).all()
        assert (steps.num_steps_max[block] == L).all()
        lp, out, _ = density.ghmc_block(eps, L, True, inv_metric, k or 0,
                                        mix64(seed + (2 * b + 1) * GOLDEN), nb,
                                        kernel.max_energy_error, x, grad, lp, p,
                                        verlet=verlet)
        np.testing.assert_array_equal(out["draws"], steps.info.positions[block])
        np.testing.assert_array_equal(out["n_grad"], steps.info.num_grad[block])
        assert rows[b, 1] == eps and rows[b, 2] == L  # the reward went to this γ
        reference._queued_u = [rows[b, -1]]
        reference._current = reference.box.snap({"step_size": eps, "num_steps": L})
        reference.update({"step_size": eps, "num_steps": L}, rows[b, 3])
        mine = native.box.to_dict(rows[b, 8:10])
        if mine != reference.propose():
            assert same_move(reference, mine)
    np.testing.assert_array_equal(end.position, x)
    np.testing.assert_array_equal(end.momentum, p)
    assert native.i == len(rows) == -(-n_iter // m)
