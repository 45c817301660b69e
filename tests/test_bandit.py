"""The GP-bandit sampler of Wang's thesis (chapter 3, Algorithm 3): exact super-transition
budgets, the product-space kernel, folds, the cross-validation reward, the thesis tuner
and the robot-arm network of §4.1."""

import math

import numpy as np
import pytest
from scipy import stats

from ahmc_stan import StanModel, tune_and_sample
from ahmc_stan.datasets import robot_arm_data, robot_arm_function
from ahmc_stan.rewards import (CrossValidation, CVReward, classification_error, cv_error,
                               fold_data, fold_indices, mean_squared_error, predictions,
                               variable_draws)
from ahmc_stan.samplers.bandit import (THESIS_TUNING, ProductHMC, run_rounds,
                                       super_transition_steps)
from ahmc_stan.samplers.tuned_blocks import TuningOptions, run_tuned_blocks
from ahmc_stan.tuning import Box, Dimension

from .conftest import stan_model_path
from .stats_util import assert_moments

SDS = np.array([0.5, 2.0])


@pytest.fixture(scope="module")
def normals():
    """Two different targets for the two copies of a product chain."""
    return [StanModel(stan_model_path("diag_normal"), {"D": 2, "sigma": SDS}),
            StanModel(stan_model_path("diag_normal"), {"D": 2, "sigma": 3 * SDS})]


@pytest.fixture(scope="module")
def robot():
    """The robot-arm network on 40 training and 10 test cases (8 hidden units)."""
    data = robot_arm_data(seed=3, n_train=40, n_test=10, hidden=8)
    return StanModel(stan_model_path("robot_arm"), data, stanc_args=["--O1"]), data


def forward(model, theta, x):
    """numpy forward pass of robot_arm.stan with the constrained draw ``theta``."""
    names = model.param_names()
    get = lambda v: variable_draws(theta[None], names, v)[0]
    return np.tanh(x @ get("W1") + get("b1")) @ get("W2") + get("b2")


# ---- super-transitions --------------------------------------------------------------------

@pytest.mark.parametrize("budget, L", [(100, 30), (100, 100), (100, 1), (7, 50), (2400, 37)])
def test_super_transition_budget_is_exact(budget, L):
    fixed = super_transition_steps(budget, L)
    assert fixed.sum() == budget
    assert np.all(fixed[:-1] == L) and 1 <= fixed[-1] <= L
    assert len(fixed) == math.ceil(budget / L)
    jittered = super_transition_steps(budget, L, np.random.default_rng(budget + L), jitter=True)
    assert jittered.sum() == budget and jittered.min() >= 1 and jittered.max() <= L
    with pytest.raises(ValueError):
        super_transition_steps(0, L)


def test_product_round_spends_the_budget_on_every_copy(normals):
    product = ProductHMC(normals, [np.zeros(2), np.ones(2)], capacity=None)
    product.inv_metrics = [None, None]
    rng = np.random.default_rng(1)
    for index, (budget, L, jitter) in enumerate([(500, 7, False), (500, 60, False),
                                                 (333, 1000, False), (400, 9, True)]):
        steps = super_transition_steps(budget, L, rng, jitter)
        rnd = product.run(rng, 0.3, steps, phase=1, index=index, gamma={"num_steps": L})
        for j, rec in enumerate(product.recs):
            rows = rec.stats["round"][:rec.n] == index
            assert rec.stats["num_steps"][:rec.n][rows].sum() == budget
            assert rec.stats["n_grad"][:rec.n][rows].sum() == budget
            assert len(rnd.positions[j]) == len(steps)
    # the copies share L_r but accept independently
    acc = [rec.stats["accept_stat"][:rec.n] for rec in product.recs]
    assert not np.array_equal(acc[0], acc[1])


def test_product_chain_samples_each_target(normals):
    """Hand-set HMC (frozen bandit) in super-transitions on two different Gaussians: each
    copy has its own target's moments (per-copy Metropolis tests, shared ε and L_r)."""
    result = run_rounds(normals, np.random.default_rng(7), [np.zeros(2), np.zeros(2)],
                        rounds=40, budget=2000, scale_iterations=0, metric="identity",
                        box=((0.05, 1.0), (1, 50)), tune=False,
                        initial={"step_size": 0.45, "num_steps": 7})
    for chain, scale in zip(result.chains, [1, 3]):
        draws = chain.positions[len(chain.positions) // 10:]
        assert_moments(draws[None], np.zeros(2), scale * SDS)
    # exact budget: 40 rounds × 2000 leapfrog steps per copy
    assert all(c.stats["n_grad"].sum() == 40 * 2000 for c in result.chains)
    assert len(result.round_starts) == 40


def test_bandit_loop_runs_whole_rounds_and_may_stop_short():
    """run_tuned_blocks with a super-transition per block and a clock in iterations
    (rounds of 3 iterations, a chain of 10): a reward for every round run_block returned,
    the last one cut short, and none for rounds it could not run."""
    from ahmc_stan.tuning import BayesOptTuner

    box = Box([Dimension("step_size", 0.1, 1.0), Dimension("num_steps", 1, 10, integer=True)])
    tuner = BayesOptTuner(box, seed=0, schedule="exponential", alpha=None,
                          maximizer=lambda acq, b: b.low)

    class Clock:
        n, sampling_start = 0, None

        def mark_sampling_start(self, t):
            self.sampling_start = t

    clock, seen = Clock(), []

    def run_block(gamma, n_rounds, phase):
        done = []
        for _ in range(n_rounds):
            if clock.n >= 10:
                break
            done.append(min(3, 10 - clock.n))
            clock.n += done[-1]
        return None, done

    rewards = lambda _, rounds, __, m: [seen.append([r]) or 1.0 for r in rounds]  # noqa: E731
    run_tuned_blocks(tuner, clock, run_block, rewards, warmup=5, draws=5,
                     options=TuningOptions(block_size=1), chain_start=0.0,
                     progress=lambda n: None)
    assert seen == [[3], [3], [3], [1]] and tuner.i == 4 and clock.n == 10
    assert clock.sampling_start is not None


# ---- the thesis tuner -----------------------------------------------------------------------

def test_thesis_tuning_options():
    """Algorithm 3's tuner: p_i = exp(−0.01(i − 1)), no reward scale (ū = μ + p β^½ σ),
    DIRECT, κ = 0.2; one super-transition per update."""
    box = Box([Dimension("step_size", 0.01, 1.01), Dimension("num_steps", 20, 5020, integer=True)])
    options = TuningOptions(**{**THESIS_TUNING, "grid_points": 50})
    assert options.block_size == 1
    tuner = options.make_tuner(box, np.random.default_rng(0))
    assert (tuner.schedule, tuner.maximizer, tuner.alpha, tuner.kappa) == (
        "exponential", "direct", None, 0.2)
    for r in [3.0, 5.0, -2.0]:
        tuner.update(tuner.propose(), r)
    assert [h.p for h in tuner.history] == pytest.approx([1.0, math.exp(-0.01), math.exp(-0.02)])
    assert [h.s for h in tuner.history] == [1.0, 1.0, 1.0]


# ---- folds and the cross-validation reward --------------------------------------------------

@pytest.mark.parametrize("n, k", [(200, 8), (10, 3), (7, 7)])
def test_folds_are_deterministic_disjoint_and_cover(n, k):
    folds = fold_indices(n, k)
    assert len(folds) == k
    assert all(np.array_equal(a, b) for a, b in zip(folds, fold_indices(n, k)))
    joined = np.concatenate(folds)
    assert np.array_equal(np.sort(joined), np.arange(n))   # disjoint and covering
    sizes = [len(f) for f in folds]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        fold_indices(n, n + 1)


def test_fold_data_moves_the_fold_to_the_test_set():
    data = robot_arm_data(seed=1, n_train=20, n_test=5)
    held = fold_indices(20, 4)[2]
    fold = fold_data(data, held, case_vars=["x", "y"])
    keep = np.setdiff1d(np.arange(20), held)
    assert fold["N"] == 15 and fold["N_test"] == 5
    np.testing.assert_array_equal(fold["x"], data["x"][keep])
    np.testing.assert_array_equal(fold["y_test"], data["y"][held])
    assert fold["H"] == data["H"] and data["N"] == 20  # other entries kept, input untouched


def test_losses_by_hand():
    pred = np.array([[1.0, 2.0], [0.0, 0.0], [3.0, -1.0]])
    target = np.array([[1.5, 2.0], [1.0, -1.0], [3.0, 0.0]])
    assert mean_squared_error(pred, target) == pytest.approx((0.25 + 2.0 + 1.0) / 3)
    assert classification_error(np.array([0.9, 0.2, 0.6, 0.4]), np.array([1, 0, 0, 1])) == 0.5
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    assert classification_error(probs, np.array([1, 2])) == 0.5


def test_cv_error_and_reward_of_hand_built_draws():
    """Two folds, three draws each: the error is the mean over folds of the loss of the
    draws' mean prediction."""
    p1 = np.array([[0.0], [1.0], [2.0]])[:, :, None] * np.ones((3, 2, 1))  # (draws, cases, 1)
    t1 = np.array([[1.0], [2.0]])
    p2 = np.array([[1.0, 1.0], [3.0, 1.0]])[:, :, None]                   # mean [2, 1]
    t2 = np.array([[2.0], [0.0]])
    # fold 1: mean prediction 1 → errors 0 and 1 → 0.5; fold 2: errors 0 and 1 → 0.5
    assert cv_error([p1, p2], [t1, t2]) == pytest.approx(0.5)
    assert cv_error([p1, p2], [t1, t2], loss=lambda p, t: float(np.abs(p - t).max())) == 1.0
    reward = CVReward()
    assert reward(0.5) == 0.0 and reward.ref == 0.5
    assert reward(0.45) == pytest.approx(1.0)   # 10 % better than the reference: +1 unit
    assert reward(0.6) == pytest.approx(-2.0)


def test_cross_validation_reward_on_robot_arm_draws(robot):
    """CrossValidation's error from Stan's generated quantities equals the numpy
    computation from the same draws."""
    model, data = robot
    rng = np.random.default_rng(5)
    folds = fold_indices(data["N"], 2)
    copies = [StanModel(model.stan_file, fold_data(data, f, case_vars=["x", "y"]),
                        stanc_args=["--O1"]) for f in folds]
    targets = [data["y"][f] for f in folds]
    draws = [rng.normal(scale=0.5, size=(4, model.dims)) for _ in folds]
    cv = CrossValidation(copies, targets, "y_pred", rng=1)
    by_hand = np.mean([
        np.mean(np.sum((np.mean([forward(m, m.constrain(x), data["x"][f]) for x in d], axis=0)
                        - data["y"][f]) ** 2, axis=1))
        for m, d, f in zip(copies, draws, folds)])
    assert cv.error(draws) == pytest.approx(by_hand, rel=1e-10)
    assert cv(draws) == 0.0 and cv.errors == [pytest.approx(by_hand, rel=1e-10)]


# ---- the robot-arm network (thesis §4.1) ----------------------------------------------------

def test_robot_arm_data():
    d = robot_arm_data(seed=1)
    again = robot_arm_data(seed=1)
    assert d["N"] == d["N_test"] == 200 and d["x"].shape == (200, 2)
    np.testing.assert_array_equal(d["y_test"], again["y_test"])
    x = np.vstack([d["x"], d["x_test"]])
    assert np.all((np.abs(x[:, 0]) >= 0.453) & (np.abs(x[:, 0]) <= 1.932))
    assert np.all((x[:, 1] >= 0.534) & (x[:, 1] <= 3.142))
    resid = d["y"] - np.column_stack([2 * np.cos(d["x"][:, 0]) + 1.3 * np.cos(d["x"].sum(1)),
                                      2 * np.sin(d["x"][:, 0]) + 1.3 * np.sin(d["x"].sum(1))])
    np.testing.assert_allclose(robot_arm_function(d["x"]), d["y"] - resid, atol=1e-12)
    # 400 N(0, 0.05²) residuals: sd within 4 standard errors (se of an sd ≈ sd/√(2n))
    assert abs(resid.std() - 0.05) < 4 * 0.05 / math.sqrt(800)


def test_robot_arm_prediction_and_density_match_numpy(robot):
    model, data = robot
    H = data["H"]
    assert model.dims == 2 * H + H + 2 * H + 2 + 4
    rng = np.random.default_rng(11)
    for _ in range(3):
        x = rng.normal(size=model.dims)
        theta = model.constrain(x, include_gq=True, rng=1)
        names = model.param_names(include_gq=True)
        pred = variable_draws(theta[None], names, "y_pred")[0]
        np.testing.assert_allclose(pred, forward(model, theta, data["x_test"]), rtol=1e-12,
                                   atol=1e-12)
        np.testing.assert_allclose(predictions(model, x, "y_pred", rng)[0], pred)
        # the log density (all constants, no Jacobian) from scipy
        get = lambda v: variable_draws(theta[None], names, v)[0]
        shape = data["alpha"] / 2
        rate = shape * data["omega"] ** 2
        tau = {v: float(get(v)) for v in ("tau_W1", "tau_b1", "tau_W2", "tau_noise")}
        gamma = lambda t, r: stats.gamma.logpdf(t, shape, scale=1 / r)
        normal = lambda v, t: stats.norm.logpdf(get(v), 0, t ** -0.5).sum()
        f = forward(model, theta, data["x"])
        expected = (gamma(tau["tau_W1"], rate) + gamma(tau["tau_b1"], rate)
                    + gamma(tau["tau_W2"], rate / H) + gamma(tau["tau_noise"], rate)
                    + normal("W1", tau["tau_W1"]) + normal("b1", tau["tau_b1"])
                    + normal("W2", tau["tau_W2"])
                    + stats.norm.logpdf(get("b2"), 0, data["bias_out_sd"]).sum()
                    + stats.norm.logpdf(data["y"], f, tau["tau_noise"] ** -0.5).sum())
        assert model.log_density(x, propto=False, jacobian=False) == pytest.approx(
            expected, rel=1e-10)


def test_tune_and_sample_bandit_cv_is_reproducible(robot):
    """sampler="bandit", reward="cv": the model's chain with 2 fold copies; every complete
    round spends the budget exactly; the same seed gives the same draws."""
    model, _ = robot
    kwargs = dict(sampler="bandit", chains=1, warmup=60, draws=20, progress=False,
                  reward="cv", folds=2, case_vars=["x", "y"], prediction="y_pred",
                  target="y_test", budget=150, box=((0.005, 0.05), (2, 40)),
                  scale_fraction=0.5)
    fit = tune_and_sample(model, seed=4, **kwargs)
    again = tune_and_sample(model, seed=4, **kwargs)
    np.testing.assert_array_equal(fit.draws, again.draws)
    chain = fit.metadata["chains"][0]
    starts = chain["round_starts"]
    steps = np.concatenate([fit.warmup_sampler_stats["num_steps"][0],
                            fit.sampler_stats["num_steps"][0]])
    assert starts[0] == 30 and len(starts) >= 2
    assert all(steps[a:b].sum() == 150 for a, b in zip(starts[:-1], starts[1:]))
    assert len(chain["cv_errors"]) == len(chain["tuning_history"]["reward"]) == len(starts)
    assert chain["tuning_history"]["reward"][0] == 0.0  # the first error is the reference
    assert all(np.isfinite(chain["cv_errors"]))


def test_bandit_cv_counts_the_gradients_of_every_copy(robot, monkeypatch):
    """With the cross-validation reward the chain's cost is every copy's gradients (the
    model's own chain and the fold copies, which used to be left out): each recorded
    block's gradients, summed over all copies, are the Fit's ``n_grad``."""
    import ahmc_stan.samplers.ahmc as ahmc_module
    import ahmc_stan.samplers.bandit as bandit_module

    model, _ = robot
    made = []
    record = ahmc_module._record

    def spy(rec, info, params, phase, **extra):
        made.append(int(np.sum(info.num_grad)))
        record(rec, info, params, phase, **extra)

    monkeypatch.setattr(ahmc_module, "_record", spy)
    monkeypatch.setattr(bandit_module, "_record", spy)
    fit = tune_and_sample(model, "bandit", chains=1, warmup=40, draws=20, seed=5,
                          progress=False, parallel=False, diagnose=False, reward="cv",
                          folds=2, case_vars=["x", "y"], prediction="y_pred",
                          target="y_test", budget=100, box=((0.005, 0.05), (2, 20)),
                          scale_fraction=0.5)
    assert fit.metadata["chains"][0]["copies"] == 3 and not fit.incomplete
    assert fit.n_grad_warmup + fit.n_grad_sampling == sum(made)
    own = (fit.warmup_sampler_stats["n_grad_own"].sum()
           + fit.sampler_stats["n_grad_own"].sum())
    assert own < sum(made)  # the model's own chain is not the whole cost
    assert fit.efficiency()["n_grad_equiv_sampling"] == fit.n_grad_sampling


def test_bandit_default_reward_runs_on_any_model(mvn_model, mvn_data):
    """Without cross-validation inputs the bandit's default reward is ESJD, so
    ``sampler="bandit"`` runs out of the box on a model with no held-out data; its draws
    have the target's moments."""
    fit = tune_and_sample(mvn_model, "bandit", chains=2, warmup=400, draws=1000, seed=3,
                          progress=False, parallel=False, diagnose=False)
    assert fit.metadata["chains"][0]["copies"] == 1
    assert "cv_errors" not in fit.metadata["chains"][0]
    assert_moments(fit.draws[:, :, :3], mvn_data["mu"], np.sqrt(np.diag(mvn_data["Sigma"])))


def test_bandit_partial_cv_inputs_are_an_error(mvn_model):
    with pytest.raises(ValueError, match="needs case_vars, prediction and target; only "
                                         "prediction given"):
        tune_and_sample(mvn_model, "bandit", chains=1, warmup=20, draws=10, seed=1,
                        progress=False, parallel=False, prediction="y_pred")


def test_bandit_logs_a_metric_fallback_without_a_restart(mvn_model, monkeypatch):
    """The bandit's scale phase falls back like AHMC's (forced here) and logs it, but
    switches in place instead of running the phase again: the rounds start where they
    were planned to."""
    from ahmc_stan.tuning import hmc_warmup

    kw = dict(chains=1, warmup=400, draws=50, seed=3, metric="low_rank", progress=False,
              parallel=False, diagnose=False)
    assert tune_and_sample(mvn_model, "bandit", **kw).metadata["chains"][0][
        "metric_fallback"] is None
    monkeypatch.setattr(hmc_warmup, "fallback_divergences", lambda window: 0)
    fit = tune_and_sample(mvn_model, "bandit", **kw)
    log = fit.metadata["chains"][0]["metric_fallback"]
    assert log["window"][0] == 100 and 100 < log["window"][1] <= 150
    assert "restart" not in log
    assert (fit.warmup_sampler_stats["phase"][0] == 0).sum() == 200
