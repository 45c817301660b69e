"""One cost unit: every kind of evaluation counted where it is made (counting proxies
around the density), its cost in gradients measured on the model and cached, and ESS per
gradient-equivalent in ``Fit.efficiency()``."""

from __future__ import annotations

import json
import math
import multiprocessing
from collections import Counter

import numpy as np
import pytest

from ahmc_stan import StanModel, costs
from ahmc_stan.fit import Fit, load_fit
from ahmc_stan.ghmc import GHMCKernel
from ahmc_stan.hmc import HMCParameters
from ahmc_stan.riemann import RMHMCKernel
from ahmc_stan.samplers.gad import GadProposal
from ahmc_stan.samplers.metropolis import Target, run_mh_chain
from ahmc_stan.samplers.svhmc import AdaptiveVerlet, HessianVector, reference_g

from .conftest import stan_model_path


@pytest.fixture(scope="module")
def banana():
    return StanModel(stan_model_path("banana"), {"b": 1.0})


@pytest.fixture
def cost_dir(tmp_path, monkeypatch):
    """An empty cost cache (disk and memory) for one test."""
    monkeypatch.setattr(costs, "_costs_dir", lambda: tmp_path / "costs")
    costs.clear_memory_cache()
    yield tmp_path / "costs"
    costs.clear_memory_cache()


# ---- counting proxies --------------------------------------------------------------------------

class CountingDensity:
    """A NativeDensity that counts the evaluations made through it."""

    def __init__(self, kernel):
        self.kernel, self.dims, self.counts = kernel, kernel.dims, Counter()

    def log_density_gradient(self, x, grad):
        self.counts["gradient"] += 1
        return self.kernel.log_density_gradient(x, grad)

    def log_density_hessian(self, x, grad, hess, method="auto"):
        self.counts["hessian"] += 1
        return self.kernel.log_density_hessian(x, grad, hess, method)

    def third_derivatives(self, x, out, method="auto"):
        self.counts["third"] += 1
        return self.kernel.third_derivatives(x, out, method)

    def resolve_third_method(self, *args, **kwargs):
        return self.kernel.resolve_third_method(*args, **kwargs)

    def resolve_hessian_method(self, method):
        return self.kernel.resolve_hessian_method(method)


class CountingHVP:
    def __init__(self, hvp):
        self.hvp, self.n = hvp, 0

    def __call__(self, x, v, out):
        self.n += 1
        return self.hvp(x, v, out)


class CountingTarget(Target):
    def __init__(self, model):
        super().__init__(model)
        self.counts = Counter()

    def density(self, x):
        self.counts["density"] += 1
        return super().density(x)

    def gradient(self, x):
        self.counts["gradient"] += 1
        return super().gradient(x)

    def hvp(self, x, v):
        self.counts["hvp"] += 1
        return super().hvp(x, v)


# ---- counts equal the evaluations made ---------------------------------------------------------

@pytest.mark.parametrize("max_iter", [100, 6])
def test_rmhmc_counts_every_hessian_and_tensor_and_no_gradient(banana, max_iter):
    density = CountingDensity(banana.density)
    kernel = RMHMCKernel(density, max_fixed_point_iterations=max_iter)
    state = kernel.init(np.array([0.4, -0.2]))
    assert density.counts == {"hessian": 1, "third": 1}
    density.counts.clear()
    _, info = kernel.run(np.random.default_rng(3), state, HMCParameters(0.4, 4), 40)
    assert info.num_hessian.sum() == density.counts["hessian"] > 0
    assert info.num_third.sum() == density.counts["third"] > 0
    assert info.num_grad.sum() == density.counts["gradient"] == 0  # was: leapfrog steps
    assert np.all(info.num_hessian >= info.num_third)  # a tensor comes with a Hessian
    if max_iter == 6:  # some solves fail: their Hessians count too
        assert info.fixed_point_failures.sum() > 0


def test_svhmc_counts_gradients_and_products_where_they_are_made(banana):
    density, hvp = CountingDensity(banana.density), CountingHVP(HessianVector(banana))
    verlet = AdaptiveVerlet(density, hvp, None, reference=4.0)  # the talk's a = −½
    kernel = GHMCKernel(banana.density, verlet.trajectory)
    rng = np.random.default_rng(8)
    state = kernel.init(np.array([0.5, 0.1]), rng)
    _, info = kernel.run(rng, state, HMCParameters(0.3, 10), 200)
    counts = info.extra_stats
    assert info.num_grad.sum() == density.counts["gradient"]
    assert counts["n_hvp"].sum() == hvp.n
    assert not info.is_accepted.all() and info.is_divergent.any()  # failures exercised
    # the reference G's work is charged to the next trajectory
    work = {"n_grad": 0, "n_hvp": 0}
    density.counts.clear()
    hvp.n = 0
    reference_g(density, hvp, rng, rng.standard_normal((7, 2)), None, counts=work)
    assert work == {"n_grad": density.counts["gradient"], "n_hvp": hvp.n} == \
        {"n_grad": 7, "n_hvp": 7}
    verlet.pending = work
    _, info2 = kernel.run(rng, state, HMCParameters(0.3, 10), 3)
    counts2 = info2.extra_stats
    assert info2.num_grad.sum() == density.counts["gradient"]
    assert counts2["n_hvp"].sum() == hvp.n


def test_gadmala_exact_counts_products_apart_from_gradients(banana):
    target = CountingTarget(banana)
    proposal = GadProposal(2, langevin=True, exact=True, adapt_delta=0.55,
                           learning_rate=0.00015)
    result = run_mh_chain(target, np.random.default_rng(4), np.array([0.3, 0.2]), 300, 50,
                          lambda n: None, proposal)
    st = result.stats
    assert st["n_grad"].sum() + 1 == target.counts["gradient"]  # + the initial point
    assert st["n_hvp"].sum() == target.counts["hvp"] > 0       # was: 2 gradients each
    assert st["n_density"].sum() == target.counts["density"] == 0
    assert not st["n_hvp"][300:].any()                          # adaptation in warmup only


# ---- the cost table ------------------------------------------------------------------------------

def test_cost_units_measured_once_then_cached(banana, cost_dir, monkeypatch):
    calls = []
    measure = costs._measure
    monkeypatch.setattr(costs, "_measure", lambda *a: calls.append(a[1]) or measure(*a))
    units = costs.cost_units(banana, ["hvp", "hessian"])
    assert set(units) == {"gradient", "hvp", "hessian"} and units["gradient"] == 1.0
    assert units["hvp"] > 0 and units["hessian"] > 0
    files = list(cost_dir.glob("*.json"))
    assert len(files) == 1 and calls == [["hvp", "hessian"]]
    entries = json.loads(files[0].read_text())["entries"]
    assert {f"hvp/{banana.hessian_method}", f"hessian/{banana.hessian_method}"} == set(entries)
    assert costs.cost_units(banana, ["hessian", "hvp"]) == units       # memory
    costs.clear_memory_cache()
    assert costs.cost_units(banana, ["hvp"]) == {"gradient": 1.0, "hvp": units["hvp"]}  # disk
    assert len(calls) == 1
    costs.cost_units(banana, ["hvp", "density"])                        # only the new kind
    assert calls[1] == ["density"]
    assert costs.cost_units(banana, []) == {"gradient": 1.0}
    # the third-derivative method is part of what is measured
    a = costs.cost_units(banana, ["third"], third_method="gradient")
    b = costs.cost_units(banana, ["third"], third_method="hessian")
    assert calls[2:] == [["third"], ["third"]] and a != b
    entries = json.loads(files[0].read_text())["entries"]
    assert {"third/gradient", "third/hessian", "density"} <= set(entries)


def _measure_in_child(kind, barrier, queue):
    barrier.wait()
    queue.put((kind, costs.cost_units(_CHILD_MODEL, [kind])[kind]))


_CHILD_MODEL = None


def test_cost_cache_is_safe_under_concurrent_processes(banana, cost_dir):
    """Four processes at once, two kinds each asked twice: the lock makes one process
    measure each kind and the other read it (identical ratios), and no writer drops
    another's entry."""
    global _CHILD_MODEL
    _CHILD_MODEL = banana
    ctx = multiprocessing.get_context("fork")
    kinds = ["hvp", "density", "hvp", "density"]
    barrier, queue = ctx.Barrier(len(kinds)), ctx.Queue()
    procs = [ctx.Process(target=_measure_in_child, args=(k, barrier, queue)) for k in kinds]
    for p in procs:
        p.start()
    out = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    by_kind = {}
    for kind, ratio in out:
        by_kind.setdefault(kind, set()).add(ratio)
    assert all(len(v) == 1 for v in by_kind.values())
    (path,) = cost_dir.glob("*.json")
    entries = json.loads(path.read_text())["entries"]
    assert {"density", f"hvp/{banana.hessian_method}"} == set(entries)
    assert not list(cost_dir.glob("*.tmp"))
    assert costs.cost_units(banana, ["hvp"])["hvp"] in by_kind["hvp"]


def test_measured_ratios_are_plausible(logistic_model, cost_dir):
    """On the logistic regression (d = 6): a third-derivative tensor by second differences
    of gradients is 2d² + 1 = 73 gradients; an HVP and a Hessian cost more than a
    gradient; a density-only evaluation about one or less."""
    d = logistic_model.dims
    units = costs.cost_units(logistic_model, ["density", "hvp", "hessian", "third"],
                             third_method="gradient")
    assert (2 * d * d + 1) / 3 < units["third"] < 3 * (2 * d * d + 1)
    assert units["hvp"] > 1 and units["hessian"] > 1
    assert 0 < units["density"] < 3


# ---- efficiency() divides by gradient-equivalents ----------------------------------------------

def _synthetic(units=None, chains=2, draws=500, seed=0):
    rng = np.random.default_rng(seed)
    shape = (chains, draws)
    stats = {"accept_stat": np.full(shape, 0.8), "step_size": np.full(shape, 0.1),
             "n_grad": np.full(shape, 4, np.int64), "divergent": np.zeros(shape, np.int64),
             "n_hvp": np.full(shape, 2, np.int64), "n_hessian": np.ones(shape, np.int64)}
    warm = {k: v[:, :100].copy() for k, v in stats.items()}
    warm["n_hvp"][:] = 3
    return Fit(rng.normal(size=(chains, draws, 2)), ["a", "b"], stats,
               warmup_draws=rng.normal(size=(chains, 100, 2)), warmup_sampler_stats=warm,
               cost_units=units, time_sampling=1.0, time_warmup=1.0, sampler="x")


def test_efficiency_uses_gradient_equivalents(tmp_path):
    fit = _synthetic({"hvp": 3.5, "hessian": 20.0})
    n = 2 * 500
    assert fit.n_eval_sampling == {"gradient": 4 * n, "hvp": 2 * n, "hessian": n}
    assert fit.n_eval_warmup == {"gradient": 4 * 200, "hvp": 3 * 200, "hessian": 200}
    e = fit.efficiency()
    equiv = 4 * n + 3.5 * 2 * n + 20 * n
    equiv_warm = 4 * 200 + 3.5 * 3 * 200 + 20 * 200
    assert e["n_grad_sampling"] == 4 * n and e["n_grad_warmup"] == 4 * 200  # gradients
    assert e["n_grad_equiv_sampling"] == pytest.approx(equiv)
    assert e["n_grad_equiv_warmup"] == pytest.approx(equiv_warm)
    assert e["min_ess_per_grad"] == pytest.approx(e["min_ess_bulk"] / equiv)
    assert e["min_ess_per_grad_total"] == pytest.approx(
        e["min_ess_bulk"] / (equiv + equiv_warm))
    assert "gradient-equivalents" in fit.efficiency_line()
    again = load_fit(fit.save(tmp_path / "fit"))
    assert again.cost_units == fit.cost_units == {"gradient": 1.0, "hvp": 3.5,
                                                  "hessian": 20.0}
    assert again.n_eval_warmup == fit.n_eval_warmup
    assert again.efficiency()["min_ess_per_grad"] == e["min_ess_per_grad"]


def test_unknown_cost_gives_nan_and_gradient_only_fits_are_unchanged():
    e = _synthetic({"hvp": 3.5}).efficiency()                 # no unit for the Hessians
    assert math.isnan(e["min_ess_per_grad"]) and math.isnan(e["n_grad_equiv_sampling"])
    fit = _synthetic()
    plain = Fit(fit.draws, fit.param_names, {k: v for k, v in fit.sampler_stats.items()
                                             if k in ("accept_stat", "step_size", "n_grad",
                                                      "divergent")})
    assert plain.cost_units == {"gradient": 1.0}
    e = plain.efficiency()
    assert e["n_grad_equiv_sampling"] == e["n_grad_sampling"] == 4000
    assert e["min_ess_per_grad"] == pytest.approx(e["min_ess_bulk"] / 4000)
    assert "grads sampling" in plain.efficiency_line()
