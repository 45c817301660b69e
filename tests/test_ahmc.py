"""AHMC: the HMC kernel, the sampler's moments, the tuner's choice, reproducibility,
robustness to -inf regions, interrupts."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from scipy import stats

from ahmc_stan import StanModel, tune_and_sample
from ahmc_stan.hmc import HMCKernel, HMCParameters
from ahmc_stan.samplers.ahmc import default_box, esjd_reward
from ahmc_stan.samplers.tuned_blocks import esjd_block_rewards

from .conftest import RHO, SDS_100, SIGMA_2D, stan_model_path
from .stats_util import assert_moments, z_bonferroni



# ---- the kernel --------------------------------------------------------------------------

def test_kernel_leaves_gaussian_invariant(gauss2d):
    """Start exactly from the target, take one step each: still the target (a test of
    the Metropolis correction and of L_r ~ U{1..L} at a step size where it matters)."""
    kernel = HMCKernel(gauss2d.density)
    rng = np.random.default_rng(11)
    starts = rng.multivariate_normal([0, 0], SIGMA_2D, size=3000)
    ends = np.empty_like(starts)
    accepted = []
    for i, x in enumerate(starts):
        state, info = kernel.step(rng, kernel.init(x), HMCParameters(0.18, 20))
        ends[i] = state.position
        accepted.append(info.is_accepted[0])
    assert 0.05 < np.mean(accepted) < 0.95
    assert_moments(ends[None], np.zeros(2), np.ones(2))
    # the correlation is preserved too: the whitened draws have unit variance
    whitened = ends @ np.linalg.inv(np.linalg.cholesky(SIGMA_2D)).T
    assert_moments(whitened[None], np.zeros(2), np.ones(2))


def test_momenta_drawn_in_cpp_are_normal_with_covariance_m(mvn_model):
    """The momenta of ahmc_hmc_block: p ~ N(0, M), M = (M⁻¹)⁻¹, for the identity,
    a diagonal and a dense inverse metric; whitened by U (M⁻¹ = UᵀU) they are iid N(0, 1)
    (means, sds, and correlations within z·1/sqrt(n)); the seed determines them."""
    n, dims = 40000, mvn_model.dims
    A = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.5], [0.2, -0.5, 0.7]])
    z = z_bonferroni(3 * (2 * dims + dims * (dims - 1) // 2))
    for seed, inv_metric in enumerate([None, np.array([0.25, 1.0, 4.0]), A]):
        p = mvn_model.density.draw_momenta(inv_metric, seed, n)
        if inv_metric is None:
            white = p
        elif inv_metric.ndim == 1:
            white = p * np.sqrt(inv_metric)
        else:
            white = p @ np.linalg.cholesky(inv_metric)   # rows: (U p)ᵀ = pᵀ Uᵀ, Uᵀ = chol
        assert_moments(white[None], np.zeros(dims), np.ones(dims), family_alpha=0.01 / 3)
        corr = np.corrcoef(white.T)[np.triu_indices(dims, 1)]
        assert np.all(np.abs(corr) < z / np.sqrt(n))
        np.testing.assert_array_equal(p, mvn_model.density.draw_momenta(inv_metric, seed, n))
        assert not np.array_equal(p, mvn_model.density.draw_momenta(inv_metric, seed + 7, n))
    # L_r ~ Uniform{1..L}: a chi-square test on the counts of one long block
    kernel = HMCKernel(mvn_model.density)
    _, info = kernel.run(np.random.default_rng(3), kernel.init(np.zeros(dims)),
                         HMCParameters(0.01, 6), 6000)
    counts = np.bincount(info.num_steps, minlength=7)[1:]
    assert counts.sum() == 6000 and stats.chisquare(counts).pvalue > 0.001


def test_kernel_step_info_and_jitter(gauss2d):
    kernel = HMCKernel(gauss2d.density)
    state = kernel.init(np.zeros(2))
    new, info = kernel.run(np.random.default_rng(1), state, HMCParameters(0.05, 7), 500)
    assert set(info.num_steps) == set(range(1, 8))  # L_r ~ Uniform{1..7}
    np.testing.assert_array_equal(info.num_grad, info.num_steps)
    fixed = kernel.run(np.random.default_rng(1), state,
                       HMCParameters(0.05, 7, jitter=False), 50)[1]
    assert set(fixed.num_steps) == {7}
    np.testing.assert_array_equal(new.position, info.positions[-1])
    assert not np.shares_memory(new.position, state.position)


def test_first_step_size_in_cpp_is_the_python_heuristic(mvn_model):
    """HMCKernel.initial_step_size (one call into C++) gives Stan's heuristic of
    tuning.step_size over one-step ``kernel.step`` trials, and leaves the Generator where
    that loop leaves it, for the identity, a diagonal, a dense and a low-rank inverse
    metric, from starting step sizes that double and that halve."""
    from ahmc_stan.metric import LowRankInvMetric
    from ahmc_stan.tuning.step_size import initial_step_size

    kernel, dims = HMCKernel(mvn_model.density), mvn_model.dims
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(dims, 2)))
    metrics = [None, np.array([0.25, 1.0, 4.0]),
               np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.5], [0.2, -0.5, 0.7]]),
               LowRankInvMetric(np.array([0.5, 1.5, 1.0]), q, np.array([3.0, 0.2]))]
    found = set()
    for k, inv_metric in enumerate(metrics):
        for seed, (x, eps0) in enumerate([(np.zeros(dims), 1.0), (np.full(dims, 3.0), 1e-3),
                                          (np.array([0.5, -1.0, 2.0]), 40.0)]):
            state = kernel.init(x)
            python, native = np.random.default_rng([k, seed]), np.random.default_rng([k, seed])

            def log_accept(eps):
                _, info = kernel.step(python, state, HMCParameters(eps, 1, inv_metric,
                                                                   jitter=False))
                return np.log(max(info.acceptance_rate[0], 1e-300))

            want = initial_step_size(log_accept, eps0)
            assert kernel.initial_step_size(native, state, inv_metric, eps0) == want
            assert native.bit_generator.state == python.bit_generator.state
            found.add((want > eps0) - (want < eps0))
    assert found == {-1, 1}  # both directions taken


def test_divergence_and_non_finite_density_reject(gauss2d):
    kernel = HMCKernel(gauss2d.density)
    state = kernel.init(np.array([0.5, 0.5]))
    new, info = kernel.run(np.random.default_rng(2), state, HMCParameters(5.0, 50), 20)
    assert info.is_divergent.all() and not info.is_accepted.any()
    np.testing.assert_array_equal(new.position, state.position)


# ---- the sampler ---------------------------------------------------------------------------

def test_ahmc_moments_2d_correlated(gauss2d):
    fit = tune_and_sample(gauss2d, chains=2, warmup=1000, draws=2000, seed=3,
                          progress=False)
    assert fit.params.shape == (2, 2000, 2)
    assert_moments(fit.params, np.zeros(2), np.ones(2))
    corr = np.corrcoef(fit.params.reshape(-1, 2).T)[0, 1]
    assert abs(corr - RHO) < 0.005
    assert not fit.incomplete and fit.efficiency()["divergences"] == 0


def test_ahmc_moments_100d_scales(gauss100):
    fit = tune_and_sample(gauss100, chains=2, warmup=1000, draws=1500, seed=4,
                          progress=False)
    assert_moments(fit.params, np.zeros(100), SDS_100)
    inv_metric = fit.metadata["chains"][0]["inv_metric"]
    # the adapted diagonal metric tracks the variances
    assert stats.spearmanr(inv_metric, SDS_100**2)[0] > 0.95


def test_ahmc_identity_metric_paper_setting(gauss2d):
    """The paper's setting: identity metric, box given, no scale phase."""
    box = ((0.01, 0.2), (1, 100))
    fit = tune_and_sample(gauss2d, chains=2, warmup=1000, draws=2000, seed=5,
                          progress=False, metric="identity", box=box)
    assert fit.metadata["chains"][0]["inv_metric"] is None
    assert fit.warmup_sampler_stats["phase"].min() == 1  # no scale phase
    eps = fit.sampler_stats["step_size"]
    assert eps.min() >= 0.01 and eps.max() <= 0.2
    assert_moments(fit.params, np.zeros(2), np.ones(2))


def test_same_seed_same_draws_serial_or_parallel(gauss2d):
    runs = [tune_and_sample(gauss2d, chains=2, warmup=200, draws=200, seed=6,
                            progress=False, parallel=p) for p in (2, 2, False)]
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0].draws, other.draws)
        np.testing.assert_array_equal(runs[0].sampler_stats["num_steps"],
                                      other.sampler_stats["num_steps"])
    different = tune_and_sample(gauss2d, chains=2, warmup=200, draws=200, seed=7,
                                progress=False)
    assert not np.array_equal(runs[0].draws, different.draws)


def test_tuner_ends_in_top_fifth_of_brute_force_grid(gauss2d):
    """On the 2-d Gaussian, the γ the tuner settles on has an expected reward in the
    top 20% of a brute-force grid over the same box (paper setting, identity metric)."""
    box = ((0.01, 0.2), (1, 100))
    fit = tune_and_sample(gauss2d, chains=1, warmup=2000, draws=500, seed=8,
                          progress=False, metric="identity", box=box)
    final = (fit.sampler_stats["step_size"][0, -1], int(fit.sampler_stats["num_steps_max"][0, -1]))

    kernel = HMCKernel(gauss2d.density)
    rng = np.random.default_rng(9)
    start = kernel.init(np.zeros(2))

    def expected_reward(eps, n_steps, n_iter=3000):
        state = kernel.run(rng, start, HMCParameters(eps, n_steps), 50)[0]  # to stationarity
        _, info = kernel.run(rng, state, HMCParameters(eps, n_steps), n_iter)
        return esjd_reward(state.position, info.positions, n_steps, None)

    grid = [expected_reward(e, n) for e in np.linspace(0.01, 0.2, 10)
            for n in np.unique(np.linspace(1, 100, 10).astype(int))]
    achieved = expected_reward(*final)
    assert achieved >= np.quantile(grid, 0.8), (final, achieved, np.quantile(grid, 0.8))


def test_density_minus_infinity_region():
    """x[1] > 1 rejects: AHMC samples the truncated normal without crashing."""
    model = StanModel(stan_model_path("reject_region"), {"D": 2})
    fit = tune_and_sample(model, chains=2, warmup=500, draws=2000, seed=10, progress=False)
    x1 = fit.params[:, :, 0]
    assert x1.max() <= 1
    truncated = stats.truncnorm(-np.inf, 1)
    assert_moments(fit.params[:, :, :1], np.array([truncated.mean()]),
                   np.array([truncated.std()]))


def test_interrupt_returns_partial_draws(gauss2d):
    def interrupt_after_300(recorder):
        if recorder.n >= 300:
            raise KeyboardInterrupt

    fit = tune_and_sample(gauss2d, chains=1, warmup=200, draws=1000, seed=11,
                          progress=False, parallel=False, block_size=10,
                          callback=interrupt_after_300)
    assert fit.incomplete
    assert 0 < fit.n_draws < 1000
    assert fit.n_warmup == 200
    assert np.isfinite(fit.draws).all()


def test_ctrl_c_on_parallel_chains_returns_partial_fit(tmp_path):
    script = textwrap.dedent(f"""
        import signal, sys, ahmc_stan
        # a terminal's Ctrl-C raises KeyboardInterrupt even when this test runs in a
        # background job (which starts children with SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        model = ahmc_stan.StanModel({str(stan_model_path("std_normal"))!r}, {{"D": 10}})
        print("READY", flush=True)
        # long trajectories (L in 50..100) keep the draws made before Ctrl-C few enough
        # that constraining them afterwards is quick
        fit = ahmc_stan.tune_and_sample(model, chains=2, warmup=300, draws=10**7,
                                        seed=1, progress=False, block_size=5,
                                        metric="identity", box=((0.01, 0.02), (50, 100)))
        print("INCOMPLETE", fit.incomplete, "SHAPE", fit.draws.shape, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "READY"
    time.sleep(8)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    line = [l for l in out.splitlines() if l.startswith("INCOMPLETE")][0]
    assert "INCOMPLETE True" in line
    chains, n_draws, cols = eval(line.split("SHAPE", 1)[1])
    assert chains == 2 and 0 < n_draws < 10**7 and cols == 10


def test_default_box_from_reference_step_size():
    box = default_box(0.1)
    assert box.dims[0].low == pytest.approx(0.025) and box.dims[0].high == pytest.approx(0.15)
    assert box.dims[1].high == 63  # ceil(2π / 0.1)
    assert default_box(10.0).dims[1].high == 10
    assert default_box(1e-4, max_num_steps=500).dims[1].high == 500
    assert box.dims[1].low == 1 and default_box(0.1, min_num_steps=2).dims[1].low == 2
    assert default_box(0.1, max_num_steps=1, min_num_steps=2).dims[1].low == 1


def test_ahmc_leaves_a_single_leapfrog_step_out_of_its_box(mvn_model):
    """AHMC's default box starts at L = 2 (MALA, L = 1, mixes half as fast per gradient
    where the reward ranks it close to L = 2); ``min_num_steps=1`` lets it back in."""
    for option, low in (({}, 2), ({"min_num_steps": 1}, 1)):
        fit = tune_and_sample(mvn_model, chains=1, warmup=300, draws=100, seed=3,
                              progress=False, diagnose=False, **option)
        chain = fit.metadata["chains"][0]
        assert chain["box"][1][1] == low
        steps = chain["tuning_history"]["gamma_num_steps"]
        assert min(steps) >= low


def test_tuning_history_is_kept_by_column_and_refits_the_surface(mvn_model, tmp_path):
    """A chain's tuning history is a table by column, one entry per reward, that survives
    ``save``/``load_fit``; the figure's surface takes its tried γ from it, and also
    reads the one-dict-per-reward history of fits saved before."""
    import copy

    from ahmc_stan.fit import load_fit
    from ahmc_stan.plots import tuning_surface

    fit = tune_and_sample(mvn_model, chains=1, warmup=300, draws=100, seed=3,
                          progress=False, diagnose=False)
    history = fit.metadata["chains"][0]["tuning_history"]
    n = len(history["reward"])
    assert n > 0 and all(len(column) == n for column in history.values())
    assert set(history) == {"i", "gamma_step_size", "gamma_num_steps", "reward", "p",
                            "moved", "s"}
    assert all(isinstance(v, int) for v in history["gamma_num_steps"])
    fit.save(tmp_path / "fit.npz")
    assert load_fit(tmp_path / "fit.npz").metadata["chains"][0]["tuning_history"] == history
    _, _, mean, tried, rewards, moved = tuning_surface(fit, resolution=8)
    np.testing.assert_array_equal(tried, np.column_stack(
        [history["gamma_step_size"], history["gamma_num_steps"]]))
    np.testing.assert_array_equal(rewards, history["reward"])
    old = copy.deepcopy(fit)
    old.metadata["chains"][0]["tuning_history"] = [dict(zip(history, row))
                                                   for row in zip(*history.values())]
    np.testing.assert_array_equal(tuning_surface(old, resolution=8)[2], mean)
    old.metadata["chains"][0]["tuning_history"] = []
    with pytest.raises(ValueError, match="no tuning history"):
        tuning_surface(old)


def test_max_step_ratio_is_the_top_of_the_box(mvn_model):
    """``max_step_ratio`` (default 1.5) sets the box's largest ε over ε*, and the tuner
    never steps past it."""
    for option, ratio in (({}, 1.5), ({"max_step_ratio": 2.5}, 2.5)):
        fit = tune_and_sample(mvn_model, chains=1, warmup=300, draws=100, seed=3,
                              progress=False, diagnose=False, tail_check=False, **option)
        chain = fit.metadata["chains"][0]
        (_, low, high, _), eps_ref = chain["box"][0], chain["reference_step_size"]
        assert high == pytest.approx(ratio * eps_ref) and low == pytest.approx(eps_ref / 4)
        assert max(fit.sampler_stats["step_size"][0]) <= high * (1 + 1e-12)


def test_scale_path_length_bounds_the_scale_phase_paths(mvn_model):
    """``scale_path_length`` is the scale phase's bound on εL: each iteration's L is
    ``round(scale_path_length / ε)``, the ε of that iteration, or the early cap
    (:func:`~ahmc_stan.tuning.hmc_warmup.early_cap`) where that is smaller; halving it
    halves the phase's paths."""
    from ahmc_stan.tuning.hmc_warmup import early_cap

    first, every = early_cap(mvn_model.dims)
    mean_steps = {}
    for length in (2.0, 1.0):
        fit = tune_and_sample(mvn_model, chains=1, warmup=400, draws=50, seed=4,
                              progress=False, diagnose=False, scale_path_length=length)
        stats = fit.warmup_sampler_stats
        scale = np.flatnonzero(stats["phase"][0] == 0)
        eps, bound = stats["step_size"][0, scale], stats["num_steps_max"][0, scale]
        by_length = np.clip(np.floor(length / eps + 0.5), 1, None)
        np.testing.assert_array_equal(bound, np.minimum(by_length, first * 2 ** (scale // every)))
        assert (bound == by_length).mean() > 0.5  # mostly the length's bound
        mean_steps[length] = stats["num_steps"][0, scale].mean()
    assert mean_steps[1.0] < 0.7 * mean_steps[2.0], mean_steps


def test_block_rewards_at_once_equal_the_per_block_rewards():
    """ESJD/√L of every m-block of a call, computed in one pass, is the per-block reward
    (each block's first jump from the position before it; a short last block)."""
    rng = np.random.default_rng(0)
    previous, positions = rng.normal(size=3), rng.normal(size=(23, 3))
    for inv_metric in (None, np.array([0.5, 1.0, 4.0])):
        at_once = esjd_block_rewards(previous, positions, 7, inv_metric, 5)
        one_by_one = [esjd_reward(previous if b == 0 else positions[b - 1],
                                  positions[b:b + 5], 7, inv_metric) for b in range(0, 23, 5)]
        np.testing.assert_allclose(at_once, one_by_one, rtol=1e-14)
        assert len(at_once) == 5
    # by hand: two blocks of one jump each, L = 4
    got = esjd_block_rewards(np.zeros(1), np.array([[1.0], [3.0]]), 4, None, 1)
    np.testing.assert_allclose(got, [1.0 / 2, 4.0 / 2])


def test_adapt_delta_sets_the_scale_phase_target(mvn_model):
    """``adapt_delta`` (Stan's name) is the acceptance statistic the scale phase's dual
    averaging aims at: its mean after the first windows lands near the target (dual
    averaging settles slightly below it, 0.6–1.5 points here), and a higher target gives a
    smaller reference step size ε*, so a box of smaller steps.  The HMC baseline takes
    the same name."""
    eps = {}
    for delta in (0.6, 0.8, 0.95):
        fit = tune_and_sample(mvn_model, "ahmc", chains=2, warmup=1000, draws=100, seed=2,
                              progress=False, diagnose=False, adapt_delta=delta)
        phase = fit.warmup_sampler_stats["phase"][0]
        n_scale = int(np.sum(phase == 0))
        accept = fit.warmup_sampler_stats["accept_stat"][:, 75:n_scale]
        assert abs(accept.mean() - delta) < 0.05, (delta, accept.mean())
        eps[delta] = np.array([c["reference_step_size"] for c in fit.metadata["chains"]])
    assert (eps[0.6] > eps[0.8]).all() and (eps[0.8] > eps[0.95]).all(), eps
    hmc = tune_and_sample(mvn_model, "hmc", chains=2, warmup=500, draws=100, seed=2,
                          progress=False, diagnose=False, num_steps=5, adapt_delta=0.9)
    assert abs(hmc.warmup_sampler_stats["accept_stat"][:, 100:].mean() - 0.9) < 0.05
    with pytest.raises(ValueError, match=r"adapt_delta must be in \(0, 1\), not 1.2"):
        tune_and_sample(mvn_model, "ahmc", chains=1, warmup=100, draws=10, seed=1,
                        progress=False, parallel=False, adapt_delta=1.2)


def test_ctrl_c_keeps_every_chains_draws_when_a_worker_is_idle(tmp_path):
    """3 chains on 2 workers, Ctrl-C while one chain runs alone (chain 3, or chain 2 when
    chain 3 ended first) and the other worker is idle: the idle worker used to die of the
    SIGINT, break the pool and lose the running chain.  Now all three chains are kept: the
    arrays hold the common length, the two finished chains keep their other draws in
    ``chain_draws``."""
    script = textwrap.dedent(f"""
        import os, signal, ahmc_stan
        signal.signal(signal.SIGINT, signal.default_int_handler)
        model = ahmc_stan.StanModel({str(stan_model_path("std_normal"))!r}, {{"D": 10}})
        def report(rec):  # one write per line: the workers' lines never interleave
            os.write(1, f"BLOCK {{os.getpid()}} {{id(rec)}} {{rec.n}}\\n".encode())
        print("READY", flush=True)
        fit = ahmc_stan.tune_and_sample(
            model, chains=3, warmup=200, draws=20000, seed=1, progress=False, parallel=2,
            block_size=5, metric="identity", box=((0.01, 0.02), (50, 100)),
            diagnose=False, callback=report)
        print("RESULT", fit.incomplete, fit.chains, fit.n_draws,
              [len(fit.chain_draws(c)) for c in range(fit.chains)],
              fit.metadata.get("dropped_chains"), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "READY"
    last, sent, out = {}, False, []  # (pid, recorder, generation) -> iterations done
    generation = {}  # (pid, recorder) -> its latest generation
    for line in proc.stdout:
        out.append(line)
        if line.startswith("RESULT") or sent:
            continue
        parts = line.split()
        if len(parts) == 4 and parts[0] == "BLOCK":
            # a chain's recorder is (pid, id, generation): a process's next chain may get
            # a recorder at the address its last one had; its count starts again
            key = (parts[1], parts[2])
            generation[key] = generation.get(key, 0) + (
                int(parts[3]) < last.get((*key, generation.get(key, 0)), 0))
            last[(*key, generation[key])] = int(parts[3])
            n = list(last.values())
            # two chains done, the third sampling alone: the other worker is idle (chain 3
            # after chain 1 on one worker; under load chain 2 can be the one left)
            if len(n) == 3 and sorted(n)[1] == 20200 and 1000 < min(n) < 20200:
                os.killpg(proc.pid, signal.SIGINT)
                sent = True
    proc.wait(timeout=120)
    text = "".join(out)
    assert sent and proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    result = [l for l in out if l.startswith("RESULT")][0].split(maxsplit=4)
    assert result[1] == "True" and result[2] == "3", (last, result)
    n_common, lengths = int(result[3]), eval(result[4].split("]")[0] + "]")
    assert 800 < n_common < 20000
    assert sorted(lengths) == [n_common, 20000, 20000]


def test_parallel_one_runs_the_chains_one_after_another():
    """``parallel=1`` is one chain at a time, in this process, as ``False`` is (``1 in
    (None, True)`` took it for ``True``: as many as cores); ``True``/``None`` as many
    as cores, and never more workers than chains."""
    from ahmc_stan.sampling import _workers

    cores = os.cpu_count() or 1
    assert _workers(1, 4) == _workers(False, 4) == 1
    assert _workers(True, 4) == _workers(None, 4) == min(cores, 4)
    assert _workers(3, 2) == 2 and _workers(2, 4) == 2


@pytest.mark.parametrize("parallel", [1, 2])
def test_ctrl_c_while_a_chain_returns_its_draws_keeps_the_chain(parallel):
    """Ctrl-C after the calling process's chain has made all its draws, while it returns
    them (here at the start of ``ChainRecorder.finish``, where a signal can land any time
    a chain ends): the chain is kept with all its draws and no chain starts after it.  With
    Python's default handler the KeyboardInterrupt left the sampler's loop and lost the
    chain: with one process, every chain (the call raised); with two, the caller's, the
    worker's chain alone returned, with nothing said of the other."""
    script = textwrap.dedent(f"""
        import os, signal, ahmc_stan
        from ahmc_stan.samplers import chain
        signal.signal(signal.SIGINT, signal.default_int_handler)
        model = ahmc_stan.StanModel({str(stan_model_path("std_normal"))!r}, {{"D": 3}})
        finish, me = chain.ChainRecorder.finish, os.getpid()
        def interrupted_finish(self, extras):
            if os.getpid() == me:  # the calling process's chain, not a worker's
                os.kill(me, signal.SIGINT)
            return finish(self, extras)
        chain.ChainRecorder.finish = interrupted_finish
        fit = ahmc_stan.tune_and_sample(model, chains=2, warmup=200, draws=300, seed=3,
                                        progress=False, parallel={parallel}, diagnose=False)
        print("RESULT", fit.incomplete, fit.chains, fit.n_draws,
              fit.metadata.get("dropped_chains"), flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    # one process: chain 2 does not start; two: the worker's chain 2 runs to its end
    assert result == [f"RESULT True {parallel} 300 None"], proc.stdout[-3000:]


def test_interrupt_in_a_later_chains_warmup_keeps_the_finished_chains(gauss2d):
    """Ctrl-C while chain 3 (run after chains 1–2) is in warmup: chains 1–2 keep all
    their draws, chain 3 is left out and named (it used to cut every chain to 0 draws)."""
    recorders = []

    def interrupt_chain3_warmup(rec):
        if rec not in recorders:
            recorders.append(rec)
        if len(recorders) == 3 and rec.n >= 100:
            raise KeyboardInterrupt

    fit = tune_and_sample(gauss2d, chains=3, warmup=200, draws=300, seed=4, progress=False,
                          parallel=False, block_size=10, callback=interrupt_chain3_warmup,
                          diagnose=False, metric="diag")  # no fallback window: the
    # callbacks of the tuning phase, which come after every call (50 iterations), begin at 100
    assert fit.incomplete and fit.chains == 2 and fit.n_draws == 300
    assert [d["chain"] for d in fit.metadata["dropped_chains"]] == [3]
    assert 100 <= fit.metadata["dropped_chains"][0]["warmup_iterations"] < 200
    assert [c["chain"] for c in fit.metadata["chains"]] == [1, 2]


def _threads_after_blas() -> int:
    import scipy.linalg

    a = np.random.default_rng(0).normal(size=(300, 300))
    np.linalg.svd(a)
    scipy.linalg.eigh(a @ a.T)
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_chain_workers_run_blas_without_a_thread_pool():
    """A forked chain worker does BLAS and LAPACK without OpenBLAS's thread pool, whose
    threads spin for ~0.1 s of CPU each and slowed the other worker's chains threefold."""
    import concurrent.futures as cf
    import multiprocessing

    from ahmc_stan.sampling import _init_worker

    np.ones((300, 300)) @ np.ones((300, 300))  # this process's pool is up
    with cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"),
                                initializer=_init_worker) as pool:
        assert pool.submit(_threads_after_blas).result() == 1


def test_tail_check_that_finds_nothing_leaves_the_draws_alone(mvn_model):
    """The chains' tail test runs at the ends of calls into C++, so where it finds nothing
    (a correlated Gaussian) the draws, statistics and tuner history are those of
    ``tail_check=False`` to the last bit, and each chain logs ``tail_check: None``."""
    run = dict(chains=2, warmup=1000, draws=1000, seed=5, progress=False, diagnose=False,
               metric_rerun=False, extend=False)
    on = tune_and_sample(mvn_model, **run)
    off = tune_and_sample(mvn_model, tail_check=False, **run)
    assert [c["tail_check"] for c in on.metadata["chains"]] == [None, None]
    np.testing.assert_array_equal(on.draws, off.draws)
    np.testing.assert_array_equal(on.warmup_draws, off.warmup_draws)
    for name in on.sampler_stats:
        np.testing.assert_array_equal(on.sampler_stats[name], off.sampler_stats[name])
    assert [c["tuning_history"] for c in on.metadata["chains"]] == \
        [c["tuning_history"] for c in off.metadata["chains"]]


def test_this_process_runs_chains_beside_its_worker(gauss2d, tmp_path):
    """With two workers this process runs chains itself beside one forked worker
    (``sampling._share``), each next chain going to whichever is free: the first chain
    always here (a fast warmup's deciding chain starts first), some in the worker, and
    the draws those of the chains run one after the other."""
    import functools

    log = tmp_path / "pids"
    # one run of 4 chains, each long enough (about 50 ms) that the worker, forked for the
    # call, has started before this process has run three (with 400 draws, 10-20 ms a
    # chain, a fresh CI machine once saw this process run all four)
    kw = dict(chains=4, warmup=200, draws=2000, seed=3, progress=False, diagnose=False,
              extend=False, chain_rerun=False, metric_rerun=False)
    both = tune_and_sample(gauss2d, parallel=2, callback=functools.partial(_log_pid, log),
                           **kw)
    pids = {int(line.split()[0]) for line in log.read_text().splitlines()}
    assert os.getpid() in pids and len(pids) == 2
    serial = tune_and_sample(gauss2d, parallel=False, **kw)
    np.testing.assert_array_equal(both.draws, serial.draws)
    np.testing.assert_array_equal(both.sampler_stats["step_size"],
                                  serial.sampler_stats["step_size"])


def _log_pid(log, rec):
    """A chain's callback: this process's id, one line per block, appended (the processes'
    lines never interleave)."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)


def _fake_chain(c, sleep=0.0, fail=None):
    """A stand-in for ``sampling._run_one`` in the tests of ``sampling._share``: sleeps,
    then returns which process ran chain ``c`` (or fails as ``fail`` says)."""
    import types

    time.sleep(sleep)
    if fail == "raise":
        raise ValueError(f"chain {c + 1} failed here")
    if fail == "die":
        os._exit(3)
    return types.SimpleNamespace(interrupted=False, job=c, pid=os.getpid())


def test_every_chain_a_worker_takes_is_waited_for(monkeypatch):
    """``sampling._share``: the forked worker takes each next chain from the shared
    counter when free, and this process waits for every chain it took, here the last
    one (1 s) long after this process finished its own (0.5 s: time for the worker to
    be forked and start on a loaded machine, where 20 ms was not)."""
    from ahmc_stan import sampling

    monkeypatch.setattr(sampling, "_run_one", _fake_chain)
    jobs = [(0, 0.5), (1, 0.001), (2, 0.001), (3, 1.0)]
    results, interrupted = sampling._execute(jobs, 2)
    assert not interrupted
    assert [r.job for r in results] == [0, 1, 2, 3]
    assert results[0].pid == os.getpid() and results[3].pid != os.getpid()


def test_a_chain_error_in_a_worker_is_raised_here(monkeypatch):
    """A chain that raises in a worker raises the same error in this process."""
    from ahmc_stan import sampling

    monkeypatch.setattr(sampling, "_run_one", _fake_chain)
    with pytest.raises(ValueError, match="chain 2 failed here"):
        sampling._execute([(0, 0.2), (1, 0.0, "raise"), (2, 0.0)], 2)


def test_a_worker_that_dies_names_its_chain(monkeypatch):
    """A worker process that ends during a chain (a crash in native code) is an error
    naming the chain and the exit code, not a chain quietly missing from the fit."""
    from ahmc_stan import sampling

    monkeypatch.setattr(sampling, "_run_one", _fake_chain)
    with pytest.raises(RuntimeError, match=r"chain 2 died \(exit code 3\)"):
        sampling._execute([(0, 0.2), (1, 0.0, "die"), (2, 0.0)], 2)


def test_the_slow_chain_rules_ranks_serve_the_diagnosis(gauss2d, constrained_model,
                                                         monkeypatch):
    """Where the parameters are the unconstrained coordinates themselves (an unbounded
    vector), the slow-chain rule's bulk ESS, tail ESS and R-hat of the draws, and its
    finding, are kept for the fit, and equal what the fit computes on its own, and so
    are the quantiles from the same sort that the summary and the tail check read; a
    model with bounds is judged not to constrain to itself, and its fit computes its
    own."""
    from ahmc_stan import convergence, fit as fit_module, rank_diagnostics
    from ahmc_stan.tuning import tail_rejection

    assert gauss2d.constrains_to_itself and not constrained_model.constrains_to_itself
    kw = dict(chains=4, warmup=300, draws=300, seed=4, progress=False, diagnose=False,
              metric_rerun=False, extend=False)
    fit = tune_and_sample(gauss2d, **kw)
    kept = fit._param_diag_cache
    assert kept is not None and "slow_chains" in fit._check_cache
    fresh = rank_diagnostics.diagnostics(fit.params, rank_diagnostics.CONVERGENCE_KEYS)
    for key in rank_diagnostics.CONVERGENCE_KEYS:
        np.testing.assert_array_equal(kept[key], fresh[key])
    found = convergence.slow_chains(fit.params, fresh["ess_bulk"])
    assert repr(fit._check_cache["slow_chains"]) == repr(found)
    pooled = fit.params.reshape(-1, fit.n_params)
    np.testing.assert_array_equal(fit._kept_quantiles(fit_module.QUANTILE_PROBS),
                                  np.quantile(pooled, fit_module.QUANTILE_PROBS, axis=0))
    np.testing.assert_array_equal(fit.summary()[["5%", "50%", "95%"]].to_numpy().T,
                                  np.quantile(pooled, fit_module.SUMMARY_PROBS, axis=0))
    monkeypatch.setattr(convergence, "tail_rejections",
                        lambda *a, **k: kept_q.append(k["quantiles"]) or [])
    kept_q = []
    convergence.diagnose(fit, checks=("tail_rejection",))
    np.testing.assert_array_equal(
        kept_q[0], np.quantile(pooled, tail_rejection.REGION_PROBS, axis=0))
    other = tune_and_sample(constrained_model, **kw)
    assert other._param_diag_cache is None and "slow_chains" not in other._check_cache
    assert other._param_quantiles is None


def _assembled_chains(monkeypatch) -> list:
    """The chain results each fit is assembled from, one list per fit, appended as the
    calls assemble them."""
    from ahmc_stan import sampling

    chains = []
    assemble = sampling._assemble
    monkeypatch.setattr(sampling, "_assemble", lambda model, sampler, results, *a, **k: (
        chains.append(results) or assemble(model, sampler, results, *a, **k)))
    return chains


def test_a_model_that_constrains_to_itself_keeps_its_positions(gauss2d, monkeypatch):
    """Where the parameters are the unconstrained coordinates themselves, the fit holds
    the chains' positions without constraining them: the same draws, warmup's too, as
    the model's own constraining gives."""
    chains = _assembled_chains(monkeypatch)
    fit = tune_and_sample(gauss2d, chains=2, warmup=100, draws=100, seed=3, progress=False,
                          diagnose=False, metric_rerun=False, extend=False)
    assert gauss2d.constrains_to_itself and len(fit.columns) == gauss2d.dims
    for draws, rows in ((fit.draws, slice(100, 200)), (fit.warmup_draws, slice(0, 100))):
        np.testing.assert_array_equal(
            draws, np.array([gauss2d.constrain(r.positions[rows]) for r in chains[-1]]))


def test_a_fits_warmup_draws_are_constrained_when_first_used(constrained_model, monkeypatch):
    """A model that does not constrain to itself: the fit's warmup draws are computed on
    first use (not in the call), the values the model's constraining gives with the
    fit's generated-quantities seeds, and a pickled fit carries them computed."""
    import pickle

    from ahmc_stan.fit import Deferred

    chains = _assembled_chains(monkeypatch)
    fit = tune_and_sample(constrained_model, chains=2, warmup=100, draws=100, seed=4,
                          progress=False, diagnose=False, metric_rerun=False, extend=False)
    assert isinstance(fit._warmup_draws, Deferred) and fit.n_warmup == 100
    copy = pickle.loads(pickle.dumps(fit))
    assert not isinstance(fit._warmup_draws, Deferred)  # pickling computed them
    seeds = np.random.SeedSequence([4, 1]).spawn(2)
    expected = np.array([constrained_model.constrain(
        r.positions[:100], include_tp=True, include_gq=True, rng=np.random.default_rng(s))
        for r, s in zip(chains[-1], seeds)])
    np.testing.assert_array_equal(fit.warmup_draws, expected)
    np.testing.assert_array_equal(copy.warmup_draws, expected)
    sigma = fit.warmup_draws[..., fit.columns.index("sigma")]
    np.testing.assert_allclose(fit.warmup_draws[..., fit.columns.index("sigma_sq")],
                               sigma ** 2, rtol=1e-12)
    assert (sigma > 0).all()
