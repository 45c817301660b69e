"""More draws for a fit whose R-hat is the noise of too few draws (``tune_and_sample``'s
``extend``, :func:`ahmc_stan.sampling._extend`)."""

import warnings

import numpy as np
import pytest

from ahmc_stan import Fit, convergence, sampling, tune_and_sample
from ahmc_stan.samplers.chain import ChainResult
from ahmc_stan.sampling import _extend

from .conftest import SDS_100
from .stats_util import assert_moments


def _quiet(model, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tune_and_sample(model, progress=False, **kwargs)


def test_an_extended_fit_continues_every_chain(gauss100, monkeypatch):
    """With the R-hat bound at 1.0 every fit of Neal's Gaussian is flagged while its
    chains mix, so every one is extended: its first draws are the unextended fit's, the
    chains go on from their last draws at a valid kernel (moments within MCSE), the cost
    counts both parts, and the same seed gives the same draws."""
    plain = _quiet(gauss100, chains=2, warmup=500, draws=500, seed=3, extend=False)
    monkeypatch.setattr(convergence, "RHAT_MAX", 1.0)
    fit = _quiet(gauss100, chains=2, warmup=500, draws=500, seed=3)
    again = _quiet(gauss100, chains=2, warmup=500, draws=500, seed=3)
    record = fit.metadata["extension"]
    assert fit.n_draws == 1000 and fit.metadata["draws"] == 1000 and not fit.incomplete
    np.testing.assert_array_equal(fit.draws[:, :500], plain.draws)
    np.testing.assert_array_equal(fit.warmup_draws, plain.warmup_draws)
    assert not np.array_equal(fit.draws[:, 500:], fit.draws[:, :500])
    np.testing.assert_array_equal(fit.draws, again.draws)
    assert fit.n_grad_sampling == int(fit.sampler_stats["n_grad"].sum())
    assert fit.n_grad_sampling == plain.n_grad_sampling + record["n_grad"] > plain.n_grad_sampling
    assert fit.n_grad_warmup == plain.n_grad_warmup
    # the seconds count both parts: the extension's (its record) on top of the first
    # draws' (compared within the run; two runs' wall times differ by more than 500 draws)
    assert record["seconds"] > 0 and fit.time_sampling > record["seconds"]
    assert fit.time_warmup > 0
    # each chain runs on at its last step size and number of steps
    for c, continued in enumerate(record["chains"]):
        assert continued["step_size"] == plain.sampler_stats["step_size"][c, -1]
        assert np.all(fit.sampler_stats["step_size"][c, 500:] == continued["step_size"])
    assert record["extended"] and record["rhat_before"] > 1.0 and "R-hat" in record["reason"]
    assert "more iterations" in record["note"]
    assert_moments(fit.draws[:, 500:], np.zeros(100), SDS_100)


def _synthetic(rng, chains=4, draws=1000, shift=0.0, rho=0.0, energy_walk=False):
    """A Fit of AR(1) chains (lag-one correlation ``rho``), chain 1 moved by ``shift``;
    ``energy_walk``: an ``energy`` statistic that moves as a random walk (E-BFMI near 0,
    the momenta cannot move the energy: a funnel's sign)."""
    x = np.empty((chains, draws, 2))
    x[:, 0] = rng.standard_normal((chains, 2))
    for t in range(1, draws):
        x[:, t] = rho * x[:, t - 1] + np.sqrt(1 - rho**2) * rng.standard_normal((chains, 2))
    x[0] += shift
    stats = {k: np.zeros((chains, draws)) for k in ("accept_stat", "step_size", "n_grad",
                                                    "divergent")}
    if energy_walk:
        stats["energy"] = np.cumsum(rng.standard_normal((chains, draws)), axis=1)
    return Fit(x, ["a", "b"], stats, sampler="ahmc")


class _Model:
    """No chain may run: a model whose every use fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"the extension ran ({name})")


def test_no_extension_for_chains_that_disagree_or_mix_too_slowly():
    """Chains apart (R-hat well above 1.01, a low ESS), chains so slow that twice the
    draws would still leave an ESS below 100 per chain (below 50 now), chains that mix
    but whose energy the momenta cannot move (a low E-BFMI: more draws of the same kernel
    do not reach what it misses), and a fit whose diagnosis is clean are returned as they
    are."""
    rng = np.random.default_rng(7)
    fits = {"apart": _synthetic(rng, shift=1.0), "slow": _synthetic(rng, rho=0.995),
            "slowish": _synthetic(rng, rho=0.93), "fine": _synthetic(rng),
            "funnel": _synthetic(np.random.default_rng(8), shift=0.35, energy_walk=True)}
    for name, fit in fits.items():
        found = convergence.diagnose(fit)
        assert bool(found) == (name != "fine")
        if name == "funnel":
            assert found.get("rhat") and found.get("ebfmi")
            assert sampling._min_ess(fit) >= 50 * fit.chains
        else:
            assert name == "fine" or sampling._min_ess(fit) < 50 * fit.chains
        fit._chain_results = [object()] * fit.chains
        assert _extend(fit, _Model(), "ahmc", 1, 1000, 1, False, 1, None, {}) is fit
        assert "extension" not in fit.metadata


@pytest.mark.parametrize("flagged", [
    {"shift": 0.35},  # R-hat 1.012 alone, every ESS above 400
    {"rho": 0.85},    # ESS below 400 (and R-hat), above 200
])
def test_a_fit_flagged_while_its_chains_mix_is_extended_only_by_samplers_that_continue(
        monkeypatch, flagged):
    """The rule's other side, without running a chain: a fit flagged by R-hat or ESS
    whose every ESS is at least 50 per chain is taken up (its chains are handed to the
    continuation, each from its last draw), unless the sampler cannot continue one or the
    chains are missing; an extension stopped before every chain made a draw is logged and
    dropped."""
    fit = _synthetic(np.random.default_rng(8), **flagged)
    assert convergence.diagnose(fit) and sampling._min_ess(fit) >= 50 * fit.chains
    assert _extend(fit, _Model(), "gadmala", 1, 1000, 1, False, 1, None, {}) is fit
    assert _extend(fit, _Model(), "ahmc", 1, 1000, 1, False, 1, None, {}) is fit  # no chains
    fit._chain_results = [ChainResult(fit.draws[c, :, :2], {"n_grad": np.ones(1000)}, 0,
                                      1000, 0.0, 0.0) for c in range(fit.chains)]
    handed = []

    def stopped(jobs, workers, late=False):
        handed.extend(jobs)
        return [None] * len(jobs), True

    monkeypatch.setattr(sampling, "_execute", stopped)
    assert _extend(fit, _Model(), "ahmc", 1, 1000, 1, False, 1, None, {}) is fit
    assert len(handed) == fit.chains
    for c, job in enumerate(handed):
        np.testing.assert_array_equal(job[-1].positions, fit.draws[c, -1:, :2])
    assert fit.n_draws == 1000 and "none are kept" in fit.metadata["extension"]["note"]
    assert fit.metadata["extension"]["extended"] is False


def test_cli_prints_the_extension_and_can_turn_it_off(tmp_path, monkeypatch, capsys):
    import json

    from ahmc_stan.cli import main

    from .conftest import stan_model_path

    data = tmp_path / "data.json"
    data.write_text(json.dumps({"D": 100, "sigma": list(SDS_100)}))
    monkeypatch.setattr(convergence, "RHAT_MAX", 1.0)  # every fit flagged, chains mixing
    args = ["sample", str(stan_model_path("diag_normal")), "--data", str(data), "--seed",
            "3", "--chains", "2", "--warmup", "500", "--draws", "500", "--no-progress"]
    assert main(args) == 0
    assert "each chain ran 500 more iterations, R-hat now" in capsys.readouterr().out
    assert main([*args, "--no-extend"]) == 0
    assert "more iterations" not in capsys.readouterr().out
