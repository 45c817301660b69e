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
