"""Tests of the Bayesian-optimisation tuner (Wang, Mohamed & de Freitas 2013, Section 3, Alg. 2).

Numbers in the schedule tests are worked out by hand in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ahmc_stan.tuning import (
    BayesOptTuner,
    Box,
    Dimension,
    GaussianProcess,
    annealing_probability_ahmc,
    annealing_probability_exponential,
    beta_schedule,
    maximize_direct,
    maximize_grid,
    se_ard_kernel,
    ucb,
)


def hmc_box(l_max: int = 100) -> Box:
    return Box([Dimension("eps", 0.01, 0.2), Dimension("L", 1, l_max, integer=True)])


# ----------------------------------------------------------------------------- schedules
def test_beta_schedule_hand_values():
    # β_t = 2 log(t^{d/2+2} π² / (3δ)), d = 2 → exponent d/2 + 2 = 3, δ = 0.1 → 3δ = 0.3.
    # π² / 0.3 = 9.8696044011 / 0.3 = 32.898681337;  log(32.898681337) = 3.493432576.
    # t = 1:  1³ · 32.8987 = 32.8987;      2 · 3.493432576                  = 6.986865152
    # t = 2:  2³ · 32.8987 = 263.18945;    2 · (3 log 2 + 3.493432576)
    #                                      = 2 · (2.079441542 + 3.493432576) = 11.145748236
    # t = 10: 10³ · 32.8987 = 32898.68;    2 · (3 log 10 + 3.493432576)
    #                                      = 2 · (6.907755279 + 3.493432576) = 20.802375710
    assert beta_schedule(1, 2, 0.1) == pytest.approx(6.986865152, abs=1e-8)
    assert beta_schedule(2, 2, 0.1) == pytest.approx(11.145748236, abs=1e-8)
    assert beta_schedule(10, 2, 0.1) == pytest.approx(20.802375710, abs=1e-8)
    with pytest.raises(ValueError):
        beta_schedule(0, 2, 0.1)


def test_annealing_probability_ahmc_hand_values():
    # p_i = (max{i − k + 1, 1})^{−1/2}, k = 100.
    assert annealing_probability_ahmc(1, 100) == 1.0  # max(1 − 99, 1) = 1      → 1
    assert annealing_probability_ahmc(100, 100) == 1.0  # max(100 − 99, 1) = 1  → 1
    # i = 101: max(2, 1) = 2 → 2^{−1/2} = 0.70710678
    assert annealing_probability_ahmc(101, 100) == pytest.approx(0.7071067811865476, rel=1e-12)
    # i = 199: max(100, 1) = 100 → 100^{−1/2} = 0.1
    assert annealing_probability_ahmc(199, 100) == pytest.approx(0.1, rel=1e-12)


def test_annealing_probability_exponential_hand_values():
    # p_i = exp(−λ (i − 1)), λ = 0.01.
    assert annealing_probability_exponential(1, 0.01) == 1.0  # exp(0) = 1
    # i = 2: exp(−0.01) = 0.990049834
    assert annealing_probability_exponential(2, 0.01) == pytest.approx(0.9900498337491681, rel=1e-12)


def test_ucb_arithmetic():
    # u = s·μ + p·sqrt(β)·σ.  s = 4, μ = 0.5, p = 0.5, β = 9 (sqrt 3), σ = 0.2:
    # 4·0.5 + 0.5·3·0.2 = 2 + 0.3 = 2.3
    assert ucb(0.5, 0.2, s=4.0, p=0.5, beta=9.0) == pytest.approx(2.3)
    # vectorised: μ = [0, 1], σ = [1, 0], s = 2, p = 0.1, β = 4 (sqrt 2):
    # [2·0 + 0.1·2·1, 2·1 + 0] = [0.2, 2.0]
    np.testing.assert_allclose(ucb(np.array([0.0, 1.0]), np.array([1.0, 0.0]), 2.0, 0.1, 4.0), [0.2, 2.0])


# ----------------------------------------------------------------------------- the box
def test_box_unit_cube_round_trip_and_rounding():
    box = hmc_box()
    assert box.ndim == 2 and box.names == ("eps", "L")
    np.testing.assert_allclose(box.to_unit({"eps": 0.01, "L": 1}), [0.0, 0.0])
    np.testing.assert_allclose(box.to_unit({"eps": 0.2, "L": 100}), [1.0, 1.0])
    # (0.105 − 0.01)/0.19 = 0.5; (50 − 1)/99 = 0.49494...
    np.testing.assert_allclose(box.to_unit({"eps": 0.105, "L": 50}), [0.5, 49 / 99])
    g = box.from_unit([0.25, 0.3])  # L = 1 + 0.3·99 = 30.7 → 31
    assert g["L"] == 31 and isinstance(g["L"], int)
    assert g["eps"] == pytest.approx(0.01 + 0.25 * 0.19)
    assert box.from_unit([-1.0, 2.0]) == {"eps": 0.01, "L": 100}  # clipped
    np.testing.assert_allclose(box.length_scales(0.2), [0.2 * 0.19, 0.2 * 99])


def test_box_grid_all_integers_and_cap():
    box = hmc_box()
    g = box.grid()  # 200 eps values × all 100 integers = 20000
    assert g.shape == (20000, 2)
    np.testing.assert_array_equal(np.unique(g[:, 1]), np.arange(1, 101))
    assert g[:, 0].min() == pytest.approx(0.01) and g[:, 0].max() == pytest.approx(0.2)
    assert not g.flags.writeable

    big = Box([Dimension("eps", 0.001, 0.1), Dimension("L", 1, 500, integer=True)])
    gb = big.grid(max_points=20000)
    assert len(gb) <= 20000
    ls = np.unique(gb[:, 1])
    assert ls[0] == 1 and ls[-1] == 500 and len(ls) > 100  # evenly thinned, endpoints kept
    assert np.all(ls == np.round(ls))
    assert np.ptp(np.diff(ls)) <= 1  # even spacing up to rounding


# ----------------------------------------------------------------------------- the GP
def test_gp_interpolates_with_tiny_noise():
    X = np.array([[0.1, 0.2], [0.5, 0.9], [0.9, 0.1], [0.4, 0.4]])
    y = np.array([1.0, -2.0, 0.5, 3.0])
    gp = GaussianProcess([0.2, 0.2], noise_var=1e-10)
    for x, v in zip(X, y):
        gp.add(x, v)
    mean, var = gp.predict(X)
    np.testing.assert_allclose(mean, y, atol=1e-6)
    np.testing.assert_allclose(var, 0.0, atol=1e-6)
    # far from the data: back to the prior N(0, 1)
    m_far, v_far = gp.predict([[5.0, 5.0]])
    assert abs(m_far[0]) < 1e-12 and v_far[0] == pytest.approx(1.0)


def test_gp_matches_dense_formula_1d():
    ell, noise = 0.2, 0.05
    xs = [0.1, 0.35, 0.8]
    ys = [1.0, -0.5, 2.0]
    xt = [0.0, 0.22, 0.5, 0.79, 1.0]

    def k(a, b):  # written out independently of se_ard_kernel
        return math.exp(-0.5 * (a - b) ** 2 / ell**2)

    K = np.array([[k(a, b) for b in xs] for a in xs]) + noise * np.eye(3)
    Ks = np.array([[k(a, b) for b in xs] for a in xt])
    mu_ref = Ks @ np.linalg.solve(K, ys)
    var_ref = np.array([1.0 - Ks[j] @ np.linalg.solve(K, Ks[j]) for j in range(len(xt))])

    gp = GaussianProcess([ell], noise_var=noise)
    for a, b in zip(xs, ys):
        gp.add([a], b)
    mu, var = gp.predict(np.array(xt)[:, None])
    np.testing.assert_allclose(mu, mu_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, var_ref, rtol=1e-10, atol=1e-12)


def test_gp_merging_repeats_is_exact():
    # Observations 1, 3, 2 at x = 0.3 and 0 at x = 0.6, versus the dense GP with 4 rows.
    ell, noise = 0.2, 0.1
    xs = np.array([0.3, 0.3, 0.3, 0.6])[:, None]
    ys = np.array([1.0, 3.0, 2.0, 0.0])
    gp = GaussianProcess([ell], noise_var=noise)
    for a, b in zip(xs, ys):
        gp.add(a, b)
    assert gp.n_unique == 2 and gp.n_observations == 4
    xt = np.linspace(0, 1, 7)[:, None]
    K = se_ard_kernel(xs, xs, [ell]) + noise * np.eye(4)
    Ks = se_ard_kernel(xt, xs, [ell])
    mu_ref = Ks @ np.linalg.solve(K, ys)
    var_ref = 1.0 - np.einsum("ij,ji->i", Ks, np.linalg.solve(K, Ks.T))
    mu, var = gp.predict(xt)
    np.testing.assert_allclose(mu, mu_ref, atol=1e-10)
    np.testing.assert_allclose(var, var_ref, atol=1e-10)


def test_gp_candidate_cache_consistent():
    rng = np.random.default_rng(0)
    cand = rng.random((50, 2))
    cand.setflags(write=False)
    gp = GaussianProcess([0.2, 0.2])
    for _ in range(3):
        for x in rng.random((4, 2)):
            gp.add(x, rng.normal())
        m1, v1 = gp.predict(cand)  # cached path
        m2, v2 = gp.predict(np.array(cand))  # writable copy → no cache
        np.testing.assert_allclose(m1, m2, atol=1e-12)
        np.testing.assert_allclose(v1, v2, atol=1e-12)


def test_gp_carried_grid_posterior_matches_a_fresh_factorisation():
    """The tuner's pattern: runs of repeats at one input, jumps to grid points, predictions
    on the read-only grid between them (carried A⁻¹, W, q) against the dense formula,
    across a refresh from scratch (GaussianProcess.REFRESH_EVERY)."""
    rng = np.random.default_rng(3)
    grid = np.stack(np.meshgrid(np.linspace(0, 1, 12), np.linspace(0, 1, 9)), -1).reshape(-1, 2)
    grid.setflags(write=False)
    gp = GaussianProcess([0.2, 0.2], noise_var=0.1)
    gp.REFRESH_EVERY = 40  # several refreshes in this run
    xs, ys = [], []
    current = grid[5]
    for step in range(400):
        if rng.random() < 0.25:
            current = grid[rng.integers(len(grid))]
        y = rng.normal() + 2
        gp.add(current, y)
        xs.append(current)
        ys.append(y)
        if step % 7 == 0:
            X = np.array(xs)
            K = se_ard_kernel(X, X, [0.2, 0.2]) + 0.1 * np.eye(len(X))
            Ks = se_ard_kernel(grid, X, [0.2, 0.2])
            mu, var = gp.predict(grid)
            np.testing.assert_allclose(mu, Ks @ np.linalg.solve(K, ys), atol=1e-9)
            np.testing.assert_allclose(
                var, np.maximum(1 - np.einsum("ij,ji->i", Ks, np.linalg.solve(K, Ks.T)), 0),
                atol=1e-9)
    assert gp.n_unique > 40


def test_gp_single_point_prediction_matches_the_batch():
    """DIRECT asks for one point at a time: that path (A⁻¹ kept with the factor) gives
    the batch prediction, also after more data."""
    rng = np.random.default_rng(1)
    gp = GaussianProcess([0.2, 0.3])
    X = rng.random((40, 2))
    for round_ in range(3):
        for x in rng.random((15, 2)):
            gp.add(x, rng.normal())
            gp.add(x, rng.normal())  # repeats too
        mean, var = gp.predict(X)
        one = [gp.predict(X[i:i + 1]) for i in range(len(X))]
        np.testing.assert_allclose([m[0] for m, _ in one], mean, atol=1e-12)
        np.testing.assert_allclose([v[0] for _, v in one], var, atol=1e-12)


# ----------------------------------------------------------------------------- the tuner
def test_scale_after_rewards_1_3_2():
    tuner = BayesOptTuner(hmc_box(), seed=0, maximizer=lambda acq, box: box.low)  # cheap maximiser
    scales = []
    for r in [1.0, 3.0, 2.0]:
        tuner.update(tuner.propose(), r)
        scales.append(tuner.s)
    # s = α/r on each new maximum, α = 4: r=1 → 4; r=3 → 4/3; r=2 not a maximum → 4/3
    assert scales == pytest.approx([4.0, 4.0 / 3.0, 4.0 / 3.0])
    assert [h.s for h in tuner.history] == pytest.approx(scales)


def test_scale_ignores_nonpositive_rewards_and_nonfinite_raises():
    tuner = BayesOptTuner(hmc_box(), seed=0, maximizer=lambda acq, box: box.low)
    for r in [0.0, -1.0]:
        tuner.update(tuner.propose(), r)
        assert tuner.s == 1.0  # s starts at 1; α/0 and α/(−1) are never used
    tuner.update(tuner.propose(), 2.0)
    assert tuner.s == pytest.approx(2.0)  # 4/2
    with pytest.raises(ValueError):
        tuner.update(tuner.propose(), float("nan"))
    thesis = BayesOptTuner(hmc_box(), seed=0, alpha=None, maximizer=lambda acq, box: box.low)
    thesis.update(thesis.propose(), 5.0)
    assert thesis.s == 1.0


def test_history_records_schedule_and_beta():
    tuner = BayesOptTuner(hmc_box(), seed=3, k=5, maximizer=lambda acq, box: box.high)
    for _ in range(8):
        tuner.update(tuner.propose(), 1.0)
    h = tuner.history
    assert [r.i for r in h] == list(range(1, 9))
    assert [r.p for r in h] == pytest.approx([annealing_probability_ahmc(i, 5) for i in range(1, 9)])
    assert all(r.moved for r in h[:5])  # p_i = 1 for i ≤ k
    assert h[0].gamma == hmc_box().center() and h[0].next_gamma == {"eps": 0.2, "L": 100}
    assert h[0].beta == pytest.approx(beta_schedule(2, 2, 0.1))  # β_{i+1}
    for r in h:
        assert r.next_gamma == (tuner.box.to_dict(tuner.box.high) if r.moved else r.gamma)

    expo = BayesOptTuner(hmc_box(), seed=3, schedule="exponential", lam=0.01, maximizer=lambda acq, box: box.high)
    for _ in range(3):
        expo.update(expo.propose(), 1.0)
    assert [r.p for r in expo.history] == pytest.approx([math.exp(-0.01 * j) for j in range(3)])


def _bump(eps, L):
    """A smooth reward on the (eps, L) box, peak 0.06 at (0.13, 30), of normalised-ESJD size."""
    return 0.05 * np.exp(-0.5 * ((eps - 0.13) / 0.03) ** 2 - 0.5 * ((L - 30) / 15) ** 2) + 0.01 * eps / 0.2


def test_tuner_finds_top_decile_of_noisy_smooth_reward():
    box = hmc_box()
    grid = box.grid()
    threshold = np.quantile(_bump(grid[:, 0], grid[:, 1]), 0.9)
    noise = np.random.default_rng(2024)
    tuner = BayesOptTuner(box, seed=7)
    for _ in range(200):
        g = tuner.propose()
        r = _bump(g["eps"], g["L"]) + 0.005 * noise.standard_normal()  # noise sd ≈ 8% of the peak
        tuner.update(g, max(r, 0.0))
    final = tuner.propose()
    assert _bump(final["eps"], final["L"]) >= threshold
    best = tuner.best()
    assert _bump(best["eps"], best["L"]) >= threshold
    # annealing: after k = 100 the bandit moves rarely (expected ≈ Σ_{j=2}^{101} j^{-1/2} ≈ 18)
    assert sum(r.moved for r in tuner.history[100:]) < 40


def test_same_seed_same_proposals():
    def run(seed):
        tuner = BayesOptTuner(hmc_box(), seed=seed, k=10, grid_points=2000)
        out = []
        for _ in range(30):
            g = tuner.propose()
            out.append(g)
            tuner.update(g, float(_bump(g["eps"], g["L"])))
        return out, [r.moved for r in tuner.history]

    first, again = run(11), run(11)
    assert first == again
    assert any(not m for m in first[1][10:])  # the schedule did keep γ some of the time


def test_direct_maximiser_finds_quadratic_maximum():
    box = hmc_box()

    def acq(U):  # a concave quadratic in box units, maximum at eps = 0.123, L = 37
        eps = 0.01 + U[:, 0] * 0.19
        L = 1 + U[:, 1] * 99
        return -(((eps - 0.123) / 0.19) ** 2) - ((L - 37) / 99) ** 2

    x = maximize_direct(acq, box, maxfun=2000)
    assert x[0] == pytest.approx(0.123, abs=1e-3)
    assert x[1] == 37
    xg = maximize_grid(acq, box)
    assert abs(xg[0] - 0.123) <= 0.19 / 199 and xg[1] == 37

    tuner = BayesOptTuner(box, seed=0, maximizer="direct", direct_maxfun=300, schedule="exponential")
    for _ in range(3):
        g = tuner.propose()
        tuner.update(g, float(_bump(g["eps"], g["L"])))
    assert all(r.moved for r in tuner.history)  # p_1 = 1, p_2 = p_3 ≈ 0.99 with this seed
    assert all(isinstance(r.next_gamma["L"], int) for r in tuner.history)


def test_freeze_stops_moves():
    tuner = BayesOptTuner(hmc_box(), seed=5, k=1000, grid_points=2000)  # p_i = 1 → always moves
    for _ in range(5):
        g = tuner.propose()
        tuner.update(g, float(_bump(g["eps"], g["L"])))
    frozen = tuner.freeze()
    assert tuner.frozen
    for _ in range(20):
        assert tuner.propose() == frozen
        tuner.update(frozen, float(_bump(frozen["eps"], frozen["L"])))
    assert not any(r.moved for r in tuner.history[5:])
    assert all(r.p == 0.0 for r in tuner.history[5:])
    best = tuner.freeze(to="best")
    assert tuner.propose() == best
    tuner.unfreeze()
    tuner.update(best, 0.01)
    assert tuner.history[-1].moved  # k = 1000 → p = 1 again once unfrozen


# ---- freezing at the GP's best, annealing during warmup (issue: trust) ---------------------

def _synthetic_tuning_run(seed: int, options, warmup: int = 1000, draws: int = 200):
    """Algorithm 2's loop (run_tuned_blocks) on a known reward surface over (ε, L) with
    Gaussian noise (sd 0.15 of the peak): returns the tuner, the γs tried in warmup and
    the γ the sampling phase ran at."""
    from ahmc_stan.samplers.tuned_blocks import run_tuned_blocks
    from ahmc_stan.tuning import Box, Dimension

    box = Box([Dimension("step_size", 0.0, 1.0), Dimension("num_steps", 1, 30, integer=True)])
    noise = np.random.default_rng(10_000 + seed)

    class Clock:
        n, sampling_start = 0, None

        def mark_sampling_start(self, t):
            self.sampling_start = t

    clock, ran = Clock(), []

    def run_block(gamma, n_iter, phase):
        clock.n += n_iter
        ran.append((phase, dict(gamma)))
        return None, [None] * n_iter

    def rewards(previous, positions, gamma, m):
        n_blocks = -(-len(positions) // m)
        return list(true_reward(gamma) + 0.15 * noise.normal(size=n_blocks))

    tuner = options.make_tuner(box, np.random.default_rng(seed))
    run_tuned_blocks(tuner, clock, run_block, rewards, warmup=warmup, draws=draws,
                     options=options, chain_start=0.0, progress=lambda n: None)
    tried = [g for phase, g in ran if phase == 1]
    sampled = {tuple(g.items()) for phase, g in ran if phase == 2}
    return tuner, tried, sampled


def true_reward(gamma) -> float:
    """A smooth unimodal surface with its peak 1 at ε = 0.7, L = 18."""
    return float(np.exp(-(gamma["step_size"] - 0.7) ** 2 / 0.05
                        - ((gamma["num_steps"] - 18) / 8.0) ** 2))


def test_frozen_tuner_keeps_the_gps_best_gamma():
    """adapt_during_sampling=False freezes at the tried γ of highest GP posterior mean
    (the tuner's best() at the freeze): over 20 seeds its true reward is in the top 30 %
    of the γs tried in warmup every time (measured: lowest 0.77 quantile, 14 of 20 in the
    top decile).  The last UCB pick under the paper's schedule, frozen before, fails this
    for 9 of the 20 seeds (4 below the median)."""
    from ahmc_stan.samplers.tuned_blocks import TuningOptions

    for seed in range(20):
        tuner, tried, sampled = _synthetic_tuning_run(
            seed, TuningOptions(adapt_during_sampling=False))
        assert len(sampled) == 1  # one γ for all of sampling
        frozen = dict(next(iter(sampled)))
        assert frozen == tuner.best()
        values = np.array([true_reward(g) for g in tried])
        assert np.mean(values <= true_reward(frozen)) >= 0.7, seed


def test_annealing_starts_during_warmup():
    """Default: p_i starts to decay half-way through warmup's k blocks, so the last warmup
    update has p = (k/2 + 1)^(-1/2); anneal_start=1 is the paper's schedule (p = 1 for
    all of warmup).  The number of γ moves during sampling is recorded."""
    from ahmc_stan.samplers.tuned_blocks import TuningOptions, tuning_extras

    tuner, tried, _ = _synthetic_tuning_run(0, TuningOptions())
    warm = tuner.history[:tuner.marks["sampling"]]
    assert len(warm) == 100
    assert warm[-1].p == pytest.approx(51 ** -0.5)
    assert all(r.p == 1.0 for r in warm[:50])
    extras = tuning_extras(tuner)
    assert extras["gamma_moves_sampling"] == sum(
        r.moved for r in tuner.history[tuner.marks["sampling"]:])
    paper, _, _ = _synthetic_tuning_run(0, TuningOptions(anneal_start=1.0))
    assert all(r.p == 1.0 for r in paper.history[:paper.marks["sampling"]])
    frozen, _, _ = _synthetic_tuning_run(0, TuningOptions(adapt_during_sampling=False))
    assert tuning_extras(frozen)["gamma_moves_sampling"] == 0
    with pytest.raises(ValueError, match="anneal_start"):
        TuningOptions(anneal_start=0.0)


@pytest.mark.parametrize("k", [1, 8, 1000])
def test_update_many_is_update_one_after_another(k):
    """A batch of rewards at one γ (the sampler's blocks between two moves, or across moves
    when k makes every update move) leaves the tuner exactly as single updates do."""
    one, many = (BayesOptTuner(hmc_box(), seed=3, k=k, grid_points=500) for _ in range(2))
    rewards = np.random.default_rng(0).uniform(-0.1, 1.0, size=60)
    start = 0
    for size in [1, 3, 7, 2, 12, 5, 30]:
        gamma = many.propose()
        assert one.propose() == gamma
        batch = rewards[start:start + size]
        start += size
        for r in batch:
            one.update(gamma, float(r))
        many.update_many(gamma, batch)
        if start >= 30 and not many.frozen:  # the last batch frozen
            one.freeze()
            many.freeze()
    assert one.history == many.history
    assert one.propose() == many.propose()
    assert np.array_equal(one.gp.inputs, many.gp.inputs)
    assert np.array_equal(one.gp.means, many.gp.means)
    assert np.array_equal(one.gp.counts, many.gp.counts)
    assert one.rng.random() == many.rng.random()
    if k == 1000:  # p = 1 throughout warmup: every unfrozen update moved
        assert sum(r.moved for r in many.history) == 30


def test_update_many_rejects_a_nonfinite_reward_before_changing_anything():
    tuner = BayesOptTuner(hmc_box(), seed=1)
    with pytest.raises(ValueError, match="finite"):
        tuner.update_many(tuner.propose(), [0.5, float("nan")])
    assert tuner.i == 0 and tuner.gp.n_observations == 0 and tuner.history == []

