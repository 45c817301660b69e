"""A chain that strays into a region of negligible mass is run again
(ahmc_stan.chain_rerun): the Laplace mass estimate on Gaussian draws, the rule on
synthetic chains (a minor mode is rerun, a wide mode of equal mass is not), the rerun
loop's bookkeeping, and a real Stan mixture through ``tune_and_sample``."""

import math

import numpy as np
import pytest
from scipy import stats

from ahmc_stan.chain_rerun import (RERUN_ATTEMPTS, STRAY_MASS_MAX, failed_chains,
                                   log_mass, rerun_stray_chains, stray_chains)
from ahmc_stan.samplers.chain import ChainResult

WARMUP, DRAWS, D = 50, 2000, 3


def component_chain(seed, weight, mean, sd, grads=7, warmup=WARMUP, draws=DRAWS):
    """A chain of iid draws from one component ``weight · N(mean, sd² I)`` of a mixture
    whose components are far apart, with lp the mixture's log density there."""
    rng = np.random.default_rng(seed)
    x = rng.normal(mean, sd, size=(warmup + draws, D))
    lp = math.log(weight) + stats.norm.logpdf(x, mean, sd).sum(axis=1)
    return ChainResult(positions=x, stats={"lp": lp, "n_grad": np.full(warmup + draws, grads)},
                       n_warmup=warmup, n_sampling=draws, time_warmup=1.0, time_sampling=2.0)


def test_log_mass_of_gaussian_components_recovers_their_weights():
    """mean lp + ½ log det Σ is −(d/2)(1 + log 2π) + log w for a component of weight w, so
    differences of log_mass are log weight ratios.  Tolerance: the MCSE of mean lp
    (sd √(d/2) over √2000: 0.027) plus the sampling error of ½ log det of a 3 × 3
    covariance from 2000 draws (sd ≈ √(d/(2n)) = 0.027), four sds of their sum."""
    main = component_chain(1, 0.9999, 0.0, 1.0)
    minor = component_chain(2, 1e-4, 10.0, 2.0)
    a = log_mass(main.positions[WARMUP:], main.stats["lp"][WARMUP:])
    b = log_mass(minor.positions[WARMUP:], minor.stats["lp"][WARMUP:])
    assert a == pytest.approx(math.log(0.9999) - D / 2 * (1 + math.log(2 * math.pi)), abs=0.15)
    assert b - a == pytest.approx(math.log(1e-4 / 0.9999), abs=0.15)
    # too few draws for the covariance: its diagonal; a coordinate that never moves: -inf
    assert np.isfinite(log_mass(main.positions[:5], main.stats["lp"][:5]))
    frozen = main.positions[:100].copy()
    frozen[:, 1] = 0.3
    assert log_mass(frozen, main.stats["lp"][:100]) == -math.inf


def test_a_chain_in_a_minor_mode_strays_and_a_wide_mode_of_equal_mass_does_not():
    main = [component_chain(s, 0.9999, 0.0, 1.0) for s in (1, 2, 3)]
    minor = component_chain(4, 1e-4, 10.0, 1.0)
    (stray,) = stray_chains(main + [minor], WARMUP)
    assert stray["chain"] == 3
    assert stray["log_mass_ratio"] == pytest.approx(math.log(1e-4 / 0.9999), abs=0.15)
    assert stray["lp_gap"] == pytest.approx(math.log(0.9999 / 1e-4), abs=0.2)
    assert stray_chains(main + [component_chain(4, 0.9999, 10.0, 1.0)], WARMUP) == []
    # half the mass in a mode 10× wider: its lp is d·log 10 = 6.9 nats lower, which the
    # lp gap flags (the diagnosis reports it), but its volume makes up for it: no rerun
    half = [component_chain(s, 0.5, 0.0, 1.0) for s in (1, 2, 3)]
    wide = component_chain(4, 0.5, 30.0, 10.0)
    from ahmc_stan.convergence import lp_gap_chains

    lp = np.array([r.stats["lp"][WARMUP:] for r in half + [wide]])
    assert [c for c, *_ in lp_gap_chains(lp)] == [3]
    assert stray_chains(half + [wide], WARMUP) == []


def test_the_mass_bound_separates_a_small_region_from_a_wide_one():
    """Both are flagged by the lp gap (allowed: 4 within-chain sds of lp, 4·√(3/2) = 4.9
    nats): 0.3 % of the mass in a mode as wide as the main one (lp 5.8 nats lower) is a
    stray, 3 % in a mode twice as wide (5.6 nats lower) is not.  Both masses lie more
    than a nat from the bound, seven times the Laplace estimate's tolerance above."""
    from ahmc_stan.convergence import lp_gap_chains

    main = [component_chain(s, 0.97, 0.0, 1.0) for s in (1, 2, 3)]
    small = component_chain(4, 0.003, 30.0, 1.0)
    wide = component_chain(4, 0.03, 30.0, 2.0)
    assert math.log(0.003 / 0.97) < math.log(STRAY_MASS_MAX) - 1
    assert math.log(0.03 / 0.97) > math.log(STRAY_MASS_MAX) + 1
    for other in (small, wide):
        lp = np.array([r.stats["lp"][WARMUP:] for r in main + [other]])
        assert [c for c, *_ in lp_gap_chains(lp)] == [3]
    (stray,) = stray_chains(main + [small], WARMUP)
    assert stray["chain"] == 3
    assert stray["log_mass_ratio"] == pytest.approx(math.log(0.003 / 0.97), abs=0.15)
    assert stray_chains(main + [wide], WARMUP) == []


def _rerun_from(replacements):
    """A ``rerun(chains, attempt)`` that returns the next chain of ``replacements``."""
    calls = []

    def rerun(ids, attempt):
        calls.append((list(ids), attempt))
        return [replacements.pop(0) for _ in ids], False
    return rerun, calls


def test_a_stray_is_replaced_by_its_rerun_and_the_cost_is_charged():
    main = [component_chain(s, 0.9999, 0.0, 1.0) for s in (1, 2, 3)]
    minor = component_chain(4, 1e-4, 10.0, 1.0, grads=11)
    good = component_chain(5, 0.9999, 0.0, 1.0, grads=5)
    rerun, calls = _rerun_from([good])
    results, record = rerun_stray_chains(main + [minor], WARMUP, rerun)
    assert calls == [([3], 1)]
    assert results[:3] == main and results[3] is good
    (entry,) = record["runs"]
    assert entry["chain"] == 4 and entry["attempt"] == 1 and entry["adopted"]
    assert entry["charged"] == {"n_grad": 11 * (WARMUP + DRAWS), "seconds": 3.0}
    # the stray's gradients on the kept chain's first iteration, its seconds in warmup
    assert good.stats["n_grad"][0] == 5 + 11 * (WARMUP + DRAWS)
    assert good.stats["n_grad"][1:].sum() == 5 * (WARMUP + DRAWS - 1)
    assert good.time_warmup == 1.0 + 3.0 and good.time_sampling == 2.0
    assert "chain 4 replaced" in record["note"]

    clean, none = rerun_stray_chains(main + [good], WARMUP, lambda *a: pytest.fail("rerun"))
    assert none is None and clean == main + [good]


def test_a_chain_whose_reruns_stray_too_is_kept_and_charged():
    main = [component_chain(s, 0.9999, 0.0, 1.0) for s in (1, 2, 3)]
    minor = component_chain(4, 1e-4, 10.0, 1.0)
    again = [component_chain(10 + a, 1e-4, 10.0, 1.0, grads=2) for a in range(RERUN_ATTEMPTS)]
    rerun, calls = _rerun_from(list(again))
    results, record = rerun_stray_chains(main + [minor], WARMUP, rerun)
    assert calls == [([3], a + 1) for a in range(RERUN_ATTEMPTS)]
    assert results[3] is minor and not any(e["adopted"] for e in record["runs"])
    assert minor.stats["n_grad"][0] == 7 + RERUN_ATTEMPTS * 2 * (WARMUP + DRAWS)
    assert minor.time_warmup == 1.0 + RERUN_ATTEMPTS * 3.0
    assert "chain 4 kept: the reruns strayed as well" in record["note"]


def test_a_rerun_that_fails_keeps_the_chains():
    """An error in a rerun (a StuckChainError, say) does not lose the finished chains."""
    from ahmc_stan.tuning.stuck import StuckChainError

    main = [component_chain(s, 0.9999, 0.0, 1.0) for s in (1, 2, 3)]
    minor = component_chain(4, 1e-4, 10.0, 1.0)

    def rerun(ids, attempt):
        raise StuckChainError("chain 4: stuck 11 times")
    results, record = rerun_stray_chains(main + [minor], WARMUP, rerun)
    assert results == main + [minor]
    (entry,) = record["runs"]
    assert not entry["adopted"] and entry["error"].startswith("StuckChainError")
    assert "a rerun failed (StuckChainError: chain 4: stuck 11 times)" in record["note"]


def ar_chain(seed, rho, divergent, grads=7, warmup=WARMUP, draws=DRAWS):
    """A chain of a stationary AR(1) process of autocorrelation ``rho`` in N(0, I) (bulk
    ESS about n (1 − ρ)/(1 + ρ)), divergent at a random ``divergent`` fraction of its
    iterations, with lp the standard normal's."""
    rng = np.random.default_rng(seed)
    n = warmup + draws
    x = np.empty((n, D))
    x[0] = rng.normal(size=D)
    e = rng.normal(size=(n, D)) * math.sqrt(1 - rho ** 2)
    for t in range(1, n):
        x[t] = rho * x[t - 1] + e[t]
    div = (rng.random(n) < divergent).astype(float)
    return ChainResult(positions=x, stats={"lp": stats.norm.logpdf(x).sum(axis=1),
                                           "n_grad": np.full(n, grads), "divergent": div},
                       n_warmup=warmup, n_sampling=draws, time_warmup=1.0, time_sampling=2.0)


def test_a_slow_divergent_chain_among_clean_ones_failed_to_adapt():
    """The rule needs both: a chain divergent in 11 % of its iterations (others 0.3 %)
    whose bulk ESS is ~0.5 % of the others' (ρ = 0.99: n(1 − ρ)/(1 + ρ) ≈ 10 against
    2000) failed; as slow but not divergent, or as divergent but mixing well, or slow and
    divergent among chains that all diverge, or in a region of higher lp than theirs (the
    model's geometry, not one chain's adaptation), it is left to the diagnosis."""
    good = [ar_chain(s, 0.0, 0.003) for s in (1, 2, 3)]
    (case,) = failed_chains(good + [ar_chain(4, 0.99, 0.11)], WARMUP)
    assert case["chain"] == 3 and case["divergent"] == pytest.approx(0.11, abs=0.025)
    assert case["ess_ratio"] < 0.05
    assert stray_chains(good + [ar_chain(4, 0.99, 0.11)], WARMUP) == []
    assert failed_chains(good + [ar_chain(4, 0.99, 0.0)], WARMUP) == []
    assert failed_chains(good + [ar_chain(4, 0.0, 0.11)], WARMUP) == []
    bad = [ar_chain(s, 0.0, 0.05) for s in (1, 2, 3)]
    assert failed_chains(bad + [ar_chain(4, 0.99, 0.11)], WARMUP) == []
    # a chain whose lp lies above the others' (a funnel's neck) may diverge because of
    # where it is: left alone (allowed gap: 4 within-chain sds of lp, 4·√(3/2) = 4.9)
    neck = ar_chain(4, 0.99, 0.11)
    neck.stats["lp"] = neck.stats["lp"] + 6.0
    assert failed_chains(good + [neck], WARMUP) == []
    neck.stats["lp"] = neck.stats["lp"] - 2.0
    assert [c["chain"] for c in failed_chains(good + [neck], WARMUP)] == [3]
    # a chain that spreads wider than the others (twice their sd here) may be the only one
    # sampling a tail their adaptation shuts out: left to the diagnosis, which flags it
    wide = ar_chain(4, 0.99, 0.11)
    wide.positions[:] *= 2.0
    assert failed_chains(good + [wide], WARMUP) == []
    # samplers that record no divergences (the Metropolis family) are not concerned
    for r in good:
        r.stats.pop("divergent")
    assert failed_chains(good + [ar_chain(4, 0.99, 0.11)], WARMUP) == []


def test_a_slow_chain_spreads_no_wider_than_the_others():
    """``reaches_further``'s false alarms on chains that only mix slowly in the others'
    region (AR(1), ρ = 0.99, N(0, I), 100 seeds): its log-sd statistic never exceeds
    REACH_Z (a slow chain's few effective draws under-state its sd, if anything), nor its
    share of draws outside the others' central 99 % REACH_OUTSIDE (at most 0.13 at these
    seeds); on the same chains scaled by 2 (a chain sampling a tail the others miss) one
    of them almost always does."""
    from ahmc_stan.chain_rerun import REACH_OUTSIDE, REACH_Z, reaches_further
    from ahmc_stan.convergence import slow_chains

    good = np.array([ar_chain(s, 0.0, 0.0).positions[WARMUP:] for s in (1, 2, 3)])
    same, wider = [], []
    for seed in range(4, 104):
        slow = ar_chain(seed, 0.99, 0.0).positions[WARMUP:]
        for scale, out in ((1.0, same), (2.0, wider)):
            x = np.concatenate([good, scale * slow[None]])
            for chain, columns, ess, _ in slow_chains(x):
                if chain == 3:
                    out.append(reaches_further(x, 3, columns, ess))
    assert len(same) == len(wider) == 100
    assert REACH_Z == 2.0 and REACH_OUTSIDE == 0.15 and not any(same)
    assert sum(wider) >= 95  # 98 at these seeds: log 2 is ~3 standard errors at ESS ~10


def test_a_failed_chain_is_replaced_by_a_rerun_that_adapts():
    good = [ar_chain(s, 0.0, 0.0) for s in (1, 2, 3)]
    failed = ar_chain(4, 0.99, 0.2, grads=13)
    again = ar_chain(5, 0.99, 0.2, grads=3)   # the first rerun fails too: kept, charged
    fine = ar_chain(6, 0.0, 0.0, grads=5)
    rerun, calls = _rerun_from([again, fine])
    results, record = rerun_stray_chains(good + [failed], WARMUP, rerun)
    assert calls == [([3], 1), ([3], 2)]
    assert results[:3] == good and results[3] is fine
    first, second = record["runs"]
    assert first["reason"] == second["reason"] == "failed"
    assert not first["adopted"] and second["adopted"]
    assert first["charged"]["n_grad"] == 3 * (WARMUP + DRAWS)
    assert second["charged"]["n_grad"] == 13 * (WARMUP + DRAWS) + 3 * (WARMUP + DRAWS)
    assert fine.stats["n_grad"][0] == 5 + 16 * (WARMUP + DRAWS)
    note = record["note"]
    assert note.startswith("2 chain reruns: chain 4 replaced by a rerun with a new seed")
    assert "adaptation failed was divergent in up to" in note and "stray" not in note
    # when every rerun fails too, the chain is kept and the note says why
    rerun, calls = _rerun_from([ar_chain(10 + a, 0.99, 0.2) for a in range(RERUN_ATTEMPTS)])
    results, record = rerun_stray_chains(good + [ar_chain(4, 0.99, 0.2)], WARMUP, rerun)
    assert not any(e["adopted"] for e in record["runs"])
    assert "chain 4 kept: the reruns failed to adapt as well" in record["note"]


def test_tune_and_sample_reruns_a_chain_stuck_in_a_minor_mode(tmp_path):
    """``stan_models/minor_mode.stan``: 1e-4 of the mass in a second mode behind a
    barrier of ~12 nats.  At seed 14 AHMC's chain 2 starts in the minor mode's basin and
    stays there (R-hat 1.53); by default it is run again with a new seed, which starts in
    the main mode, and the fit converges, the discarded chain's cost counted."""
    from ahmc_stan import StanModel, tune_and_sample

    from .conftest import stan_model_path

    model = StanModel(stan_model_path("minor_mode"))
    run = dict(chains=4, warmup=1000, draws=1000, seed=14, progress=False, diagnose=False)
    # without either rerun (the metric rerun would answer the stuck chain's R-hat and
    # ESS with a run in Stan's diagonal metric)
    off = tune_and_sample(model, "ahmc", chain_rerun=False, metric_rerun=False, **run)
    assert [p.chains for p in off.diagnose().get("stuck_chain")] == [(1,)]
    assert "chain_rerun" not in off.metadata
    x = off.draws[:, :, 0]
    assert x[1].mean() > 1 and np.all(x[[0, 2, 3]].mean(axis=1) < -1)

    fit = tune_and_sample(model, "ahmc", **run)
    assert fit.diagnose().converged, str(fit.diagnose())
    (entry,) = fit.metadata["chain_rerun"]["runs"]
    assert entry["chain"] == 2 and entry["adopted"] and entry["attempt"] == 1
    assert entry["reason"] == "stray"
    assert entry["log_mass_ratio"] < math.log(STRAY_MASS_MAX)
    np.testing.assert_array_equal(fit.draws[[0, 2, 3]], off.draws[[0, 2, 3]])
    assert fit.draws[1, :, 0].mean() < -1
    # the posterior mean, -1.5 + 3e-4 (the minor mode's share), within 4 MCSE
    row = fit.summary().loc["x"]
    assert abs(row["mean"] - (-1.5 + 3 * 1e-4)) < 4 * row["mcse_mean"]
    # the discarded chain's gradients sit on the new chain 2's first warmup iteration
    discarded = int(off.warmup_sampler_stats["n_grad"][1].sum()
                    + off.sampler_stats["n_grad"][1].sum())
    assert entry["charged"]["n_grad"] == discarded
    assert fit.warmup_sampler_stats["n_grad"][1, 0] > discarded
    np.testing.assert_array_equal(fit.warmup_sampler_stats["n_grad"][[0, 2, 3]],
                                  off.warmup_sampler_stats["n_grad"][[0, 2, 3]])
    # reproducible, and the same whether chains run in parallel or one after another;
    # with output_dir, fit.npz holds the returned fit and its record
    again = tune_and_sample(model, "ahmc", parallel=False, output_dir=tmp_path / "out",
                            **run)
    np.testing.assert_array_equal(again.draws, fit.draws)
    assert _without_seconds(again) == _without_seconds(fit)
    from ahmc_stan import load_output

    saved = load_output(tmp_path / "out")
    np.testing.assert_array_equal(saved.draws, again.draws)
    assert saved.metadata["chain_rerun"] == again.metadata["chain_rerun"]
    assert saved.n_grad_warmup == again.n_grad_warmup

    # seed 7 (of 1-100 none has three): two chains in the minor mode, two in the main
    # mode, so no majority tells them apart, only the mass; both are rerun (in parallel
    # worker processes), as chains run one after another would be
    run["seed"] = 7
    off = tune_and_sample(model, "ahmc", chain_rerun=False, metric_rerun=False, **run)
    minor = np.flatnonzero(off.draws[:, :, 0].mean(axis=1) > 1)
    assert len(minor) == 2
    found = off.diagnose()  # R-hat flags the split, the mass names the two chains
    assert found.get("rhat")
    assert sorted(c for p in found.get("stuck_chain") for c in p.chains) == list(minor)
    fit = tune_and_sample(model, "ahmc", **run)
    assert fit.diagnose().converged and np.all(fit.draws[:, :, 0].mean(axis=1) < -1)
    assert sorted(e["chain"] for e in fit.metadata["chain_rerun"]["runs"]
                  if e["adopted"]) == [c + 1 for c in range(4)
                                       if off.draws[c, :, 0].mean() > 1]
    again = tune_and_sample(model, "ahmc", parallel=False, **run)
    np.testing.assert_array_equal(again.draws, fit.draws)


def _without_seconds(fit):
    return [{**e, "charged": {**e["charged"], "seconds": None}}
            for e in fit.metadata["chain_rerun"]["runs"]]


def test_cli_prints_the_chain_rerun_and_can_turn_it_off(capsys):
    from ahmc_stan.cli import main

    from .conftest import stan_model_path

    # at 1000 warmup iterations (the default before AHMC's went to 500 on small models)
    # chain 2 starts in the minor mode's basin at seed 14, as above
    args = ["sample", str(stan_model_path("minor_mode")), "--seed", "14", "--warmup", "1000",
            "--no-progress"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "(1 chain rerun: chain 2 replaced by a rerun with a new seed" in out.out
    assert "R-hat" not in out.err
    assert main([*args, "--no-chain-rerun", "--no-metric-rerun"]) == 0
    out = capsys.readouterr()
    assert "chain rerun" not in out.out and "R-hat" in out.err
    # compare prints each fit's reruns under its line
    assert main(["compare", str(stan_model_path("minor_mode")), "--seed", "14",
                 "--warmup", "1000", "--samplers", "ahmc", "--peers", ""]) == 0
    assert "(1 chain rerun: chain 2 replaced" in capsys.readouterr().out


def test_a_slow_chain_in_a_tail_the_others_miss_reaches_further():
    """The non-centred eight schools' case: a slow chain that samples the others' region
    and a tail beyond it (a fifth of its draws above their 99.5 % quantile), its sd under
    2 standard errors above theirs at its ESS, reaches further; a chain stuck in one spot
    beyond their range (sd far below theirs: a failed chain) does not."""
    from ahmc_stan.chain_rerun import REACH_Z, reaches_further

    good = np.array([ar_chain(s, 0.0, 0.0).positions[WARMUP:, :1] for s in (1, 2, 3)])
    n = good.shape[1]
    walk = ar_chain(4, 0.99, 0.0).positions[WARMUP:, :1]
    tail = walk.copy()
    tail[: n // 5] = 3.5 + 0.3 * walk[: n // 5]  # a fifth of the run beyond 2.58
    x = np.concatenate([good, tail[None]])
    ess = 10.0
    assert np.log(tail.std() / np.median(good.std(axis=1))) < REACH_Z / np.sqrt(2 * (ess - 1))
    assert reaches_further(x, 3, [0], [ess])
    stuck = 3.5 + 0.05 * walk
    assert not reaches_further(np.concatenate([good, stuck[None]]), 3, [0], [ess])


# ---- slow chains: continued in the parameters of the chain that mixes best -------------

def _with_params(result, step_size, num_steps, inv_metric):
    """``result`` with HMC's per-iteration parameters and a metric record."""
    n = len(result.positions)
    result.stats.update(step_size=np.full(n, step_size), num_steps_max=np.full(n, num_steps))
    result.extras = {"inv_metric": inv_metric, "metric": "diag"}
    return result


def test_a_slow_chain_gets_the_chain_that_mixes_best_per_gradient_as_donor():
    """A chain that mixes slowly (AR(1), ρ = 0.99: bulk ESS ≈ 10 of 2000) among three that
    do not, with no divergences, is slow; its donor is the fast chain with the most ESS
    per gradient (ESS alike, gradients 7, 3 and 9 per iteration: the second).  The same
    chain spread twice as wide (a tail the others miss) is left to the diagnosis, as is a
    chain that mixes well."""
    from ahmc_stan.chain_rerun import slow_chain_cases

    good = [ar_chain(s, 0.0, 0.0, grads=g) for s, g in ((1, 7), (2, 3), (3, 9))]
    (case,) = slow_chain_cases(good + [ar_chain(4, 0.99, 0.0)], WARMUP)
    assert case["chain"] == 3 and case["donor"] == 1 and case["ess_ratio"] < 0.05
    wide = ar_chain(4, 0.99, 0.0)
    wide.positions[:] *= 2.0
    assert slow_chain_cases(good + [wide], WARMUP) == []
    assert slow_chain_cases(good + [ar_chain(4, 0.0, 0.0)], WARMUP) == []
    assert slow_chain_cases(good[:1] + [ar_chain(4, 0.99, 0.0)], WARMUP) == []  # 2 chains
    # divergent in over 1 % of its iterations (the failed-chain rule's, or the
    # posterior's), or in a region of higher lp (a funnel's neck): left alone
    assert slow_chain_cases(good + [ar_chain(4, 0.99, 0.02)], WARMUP) == []
    assert len(slow_chain_cases(good + [ar_chain(4, 0.99, 0.005)], WARMUP)) == 1
    neck = ar_chain(4, 0.99, 0.0)
    neck.stats["lp"] = neck.stats["lp"] + 6.0
    assert slow_chain_cases(good + [neck], WARMUP) == []
    # a chain whose E-BFMI is low (energy an AR(1) of ρ = 0.95: E-BFMI ≈ 2(1 − ρ) = 0.1)
    # points to the geometry (a funnel), not to one chain's adaptation: none concerned
    chains = good + [ar_chain(4, 0.99, 0.0)]
    noise = np.random.default_rng(5)
    for r in chains:  # energies of independent draws: E-BFMI ≈ 2
        r.stats["energy"] = noise.normal(size=len(r.positions))
    assert len(slow_chain_cases(chains, WARMUP)) == 1
    chains[0].stats["energy"] = ar_chain(9, 0.95, 0.0).positions[:, 0]
    assert slow_chain_cases(chains, WARMUP) == []


def _resume_from(continuations):
    """A ``resume(cases)`` that returns the next continuations and records the starts."""
    calls = []

    def resume(starts, round_):
        calls.append((starts, round_))
        return [continuations.pop(0) for _ in starts], False
    return resume, calls


def test_a_slow_chain_is_continued_in_the_donors_parameters_and_its_draws_become_warmup():
    from ahmc_stan.chain_rerun import continue_slow_chains, donor_start

    good = [_with_params(ar_chain(s, 0.0, 0.0, grads=g), 0.5, 4, [1.0, 1.0, 1.0])
            for s, g in ((1, 7), (2, 3), (3, 9))]
    good[1].extras["inv_metric"] = [2.0, 2.0, 2.0]
    slow = _with_params(ar_chain(4, 0.99, 0.0, grads=11), 0.1, 40, [0.1, 0.1, 0.1])
    slow.extras["metric_fallback"] = {"to": "diag"}
    start = donor_start(good + [slow], {"chain": 3, "donor": 1})
    np.testing.assert_array_equal(start.positions, slow.positions[-1:])
    assert start.stats["step_size"].tolist() == [0.5] and start.extras is good[1].extras
    # the continuation: fresh draws at 3 gradients each, recorded as sampling only
    more = ar_chain(5, 0.0, 0.0, grads=3, warmup=0)
    more.stats["step_size"] = np.full(DRAWS, 0.5)
    more.extras = {"continued": {"step_size": 0.5, "num_steps": 4}}
    more.time_warmup, more.time_sampling = 0.0, 2.5
    resume, calls = _resume_from([more])
    results, record = continue_slow_chains(good + [slow], WARMUP, resume)
    ((((chain, given),), round_),) = calls
    assert (chain, round_) == (3, 1) and given.extras is good[1].extras  # the donor's
    np.testing.assert_array_equal(given.positions, slow.positions[-1:])
    assert results[:3] == good
    new = results[3]
    np.testing.assert_array_equal(new.positions[:WARMUP], slow.positions[:WARMUP])
    np.testing.assert_array_equal(new.positions[WARMUP:], more.positions)
    assert (new.n_warmup, new.n_sampling) == (WARMUP, DRAWS)
    # the discarded draws' gradients on the first iteration, their seconds in warmup
    assert new.stats["n_grad"][0] == 11 + 11 * DRAWS
    assert new.stats["n_grad"][1:WARMUP].sum() == 11 * (WARMUP - 1)
    assert new.stats["n_grad"][WARMUP:].sum() == 3 * DRAWS
    assert new.stats["step_size"][WARMUP:].tolist() == [0.5] * DRAWS
    assert new.time_warmup == 1.0 + 2.0 and new.time_sampling == 2.5
    assert new.extras["inv_metric"] == [2.0, 2.0, 2.0]
    assert new.extras["metric_fallback"] == {"to": "diag"}  # its own warmup's records
    assert new.extras["slow_chain"] == {"parameters_of_chain": 2, "step_size": 0.5,
                                        "num_steps": 4, "draws_discarded": DRAWS}
    (entry,) = record["runs"]
    assert entry["adopted"] and entry["chain"] == 4 and entry["parameters_of_chain"] == 2
    assert entry["round"] == 1
    assert entry["charged"] == {"n_grad": 11 * DRAWS, "seconds": 2.0}
    assert record["note"].startswith("1 slow chain (ESS down to ")
    assert "chain 4 sampled again in chain 2's parameters" in record["note"]
    # nothing slow: no continuation
    same, none = continue_slow_chains(results, WARMUP, lambda *a: pytest.fail("resume"))
    assert none is None and same == results


def test_a_continuation_that_is_still_slow_is_discarded_and_charged():
    from ahmc_stan.chain_rerun import continue_slow_chains

    good = [_with_params(ar_chain(s, 0.0, 0.0), 0.5, 4, [1.0] * 3) for s in (1, 2, 3)]
    slow = _with_params(ar_chain(4, 0.99, 0.0), 0.1, 40, [0.1] * 3)
    still = ar_chain(5, 0.99, 0.0, grads=2, warmup=0)
    resume, _ = _resume_from([still])
    results, record = continue_slow_chains(good + [slow], WARMUP, resume)
    assert results[3] is slow and not record["runs"][0]["adopted"]
    assert slow.stats["n_grad"][0] == 7 + 2 * DRAWS and slow.time_warmup == 1.0 + 3.0
    assert "chain 4 kept: in the best chain's parameters still slow" in record["note"]
    # a continuation that mixes but diverges in 2 % of its iterations is not adopted
    resume, _ = _resume_from([ar_chain(6, 0.0, 0.02, warmup=0)])
    results, record = continue_slow_chains(good + [slow], WARMUP, resume)
    assert results[3] is slow and not record["runs"][0]["adopted"]
    # an error in the continuation keeps the chains
    def broken(starts, round_):
        raise RuntimeError("no")
    results, record = continue_slow_chains(good + [slow], WARMUP, broken)
    assert results[3] is slow
    assert "a continuation failed (RuntimeError: no): chain 4 kept" in record["note"]


def test_a_chain_slow_only_beside_a_mended_one_gets_a_second_round():
    """Bulk ESS of about 160, 2000, 5 and 50 (AR(1), ρ = 0.85, 0, 0.995, 0.95): the third
    chain is slow; the fourth is not (50 is above 0.2 × the others' median of 160) until
    the third, mended, lifts that median to 2000.  The first round mends the third, the
    second the fourth, each continued once."""
    from ahmc_stan.chain_rerun import continue_slow_chains, slow_chain_cases

    chains = [_with_params(ar_chain(s, rho, 0.0), 0.5, 4, [1.0] * 3)
              for s, rho in ((1, 0.85), (2, 0.0), (3, 0.995), (4, 0.95))]
    assert [k["chain"] for k in slow_chain_cases(chains, WARMUP)] == [2]
    fresh = [ar_chain(10 + i, 0.0, 0.0, warmup=0) for i in range(2)]
    for more in fresh:
        more.stats["step_size"] = np.full(DRAWS, 0.25)
    resume, calls = _resume_from(list(fresh))
    results, record = continue_slow_chains(chains, WARMUP, resume)
    assert [([c for c, _ in starts], r) for starts, r in calls] == [([2], 1), ([3], 2)]
    assert [(e["chain"], e["round"], e["adopted"]) for e in record["runs"]] == \
        [(3, 1, True), (4, 2, True)]
    assert "2 slow chains" in record["note"]
    # the second round starts from the chains as they stand: a donor mended in the first
    # lends the parameters it now has
    donor = results[record["runs"][1]["parameters_of_chain"] - 1]
    (_, start), = calls[1][0]
    assert start.stats["step_size"][-1] == donor.stats["step_size"][-1]
    assert start.extras["inv_metric"] == donor.extras["inv_metric"]


def test_tune_and_sample_continues_a_slow_chain_in_its_donors_parameters(mvn_model,
                                                                        monkeypatch):
    """The plumbing on a real model, with the slow-chain rule made to name chain 2 (its
    donor chain 4) once: chain 2's draws are a continuation from its last draw at chain
    4's last step size, number of steps and metric; the other chains and every warmup draw
    are the run's without it; the discarded draws' gradients are counted in warmup; the
    same seed gives the same draws in parallel workers and in this process."""
    import ahmc_stan.chain_rerun as chain_rerun
    from ahmc_stan import tune_and_sample

    run = dict(chains=4, warmup=200, draws=300, seed=3, progress=False, diagnose=False,
               metric_rerun=False, extend=False)
    off = tune_and_sample(mvn_model, "ahmc", chain_rerun=False, **run)
    assert "slow_chains" not in off.metadata

    def fits(parallel):
        calls = []

        def named(results, warmup, rule=None):
            calls.append(len(results))
            return [{"chain": 1, "donor": 3, "ess_ratio": 0.1}]
        monkeypatch.setattr(chain_rerun, "slow_chain_cases", named)
        fit = tune_and_sample(mvn_model, "ahmc", parallel=parallel, **run)
        assert calls == [4, 4]  # the second round names chain 2 again: not continued twice
        return fit

    fit = fits(None)
    np.testing.assert_array_equal(fit.draws[[0, 2, 3]], off.draws[[0, 2, 3]])
    np.testing.assert_array_equal(fit.warmup_draws, off.warmup_draws)
    assert not np.array_equal(fit.draws[1], off.draws[1])
    for stat in ("step_size", "num_steps_max"):
        assert np.all(fit.sampler_stats[stat][1] == off.sampler_stats[stat][3, -1])
    np.testing.assert_array_equal(fit.inv_metric[1], off.inv_metric[3])
    (entry,) = fit.metadata["slow_chains"]["runs"]
    assert entry == {**entry, "chain": 2, "parameters_of_chain": 4, "adopted": True}
    discarded = int(off.sampler_stats["n_grad"][1].sum())
    assert entry["charged"]["n_grad"] == discarded
    assert fit.n_grad_warmup == off.n_grad_warmup + discarded
    assert fit.n_grad_sampling == (off.n_grad_sampling - discarded
                                   + int(fit.sampler_stats["n_grad"][1].sum()))
    assert fit.metadata["chains"][1]["slow_chain"]["parameters_of_chain"] == 4
    again = fits(False)
    np.testing.assert_array_equal(again.draws, fit.draws)


def test_slow_chains_on_a_ridge_are_sampled_again_in_the_best_chains_parameters():
    """The regression-like ridge of ``tests/test_fisher_metric.py`` (correlation −0.99996)
    in AHMC's diagonal metric at seed 2: on their own, chain 3 mixes 0.13× as fast as the
    others and the fit does not converge (R-hat 1.013, bulk ESS 373).  By default chain 3
    is sampled again in chain 2's parameters, then chain 4, slow beside it; the fit
    converges, its whitened draws standard normal within MCSE, the discarded draws'
    gradients counted in warmup, and the same seed gives the same draws."""
    from ahmc_stan import StanModel, tune_and_sample

    from .conftest import stan_model_path
    from .stats_util import assert_moments
    from .test_fisher_metric import ridge_covariance

    sigma, mu = ridge_covariance(), np.array([10.0, 0.0, -1.0])
    model = StanModel(stan_model_path("mvn"), {"D": 3, "mu": mu, "Sigma": sigma})
    kw = dict(chains=4, warmup=1000, draws=1000, seed=2, progress=False, diagnose=False,
              metric="diag", extend=False)
    alone = tune_and_sample(model, chain_rerun=False, **kw)
    assert alone.efficiency()["max_rhat"] > 1.01
    assert [p.chains for p in alone.diagnose().get("slow_chain")] == [(2,)]
    fit = tune_and_sample(model, **kw)
    runs = fit.metadata["slow_chains"]["runs"]
    assert [(e["chain"], e["round"], e["parameters_of_chain"], e["adopted"]) for e in runs] \
        == [(3, 1, 2, True), (4, 2, 2, True)]
    assert fit.diagnose().converged, str(fit.diagnose())
    np.testing.assert_array_equal(fit.draws[:2], alone.draws[:2])
    chol = np.linalg.cholesky(sigma)
    whitened = np.linalg.solve(chol, (fit.params - mu).reshape(-1, 3).T).T
    assert_moments(whitened.reshape(fit.params.shape), np.zeros(3), np.ones(3))
    discarded = sum(e["charged"]["n_grad"] for e in runs)
    assert discarded == int(alone.sampler_stats["n_grad"][2:].sum())
    assert fit.n_grad_warmup == alone.n_grad_warmup + discarded
    np.testing.assert_array_equal(tune_and_sample(model, parallel=False, **kw).draws,
                                  fit.draws)
