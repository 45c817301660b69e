"""Hamiltonian Monte Carlo as a pure step ``(rng, state, params) -> (state, info)``.

The kernel protocol every transition of the package follows (:class:`HMCKernel`,
:class:`~ahmc_stan.ghmc.GHMCKernel`, :class:`~ahmc_stan.riemann.RMHMCKernel`,
:class:`~ahmc_stan.mh.MHKernel`):
``init(position) -> state``; ``run(rng, state, params, n_iter) -> (state, info)`` with
:class:`HMCParameters` passed per call and per-iteration arrays in ``info`` (an
:class:`HMCInfo`, whose subclasses add their evaluation counts as ``extra_stats``);
``step`` is ``run`` of one iteration.  Adaptation lives outside the kernels
(:mod:`ahmc_stan.tuning`).

HMC with the leapfrog integrator and a Metropolis correction (Neal 2011, section 5.3.2),
an identity, diagonal or dense inverse metric, and — as AHMC requires (Wang, Mohamed & de
Freitas 2013, section 2) — the number of leapfrog steps drawn afresh each iteration,
``L_r ~ Uniform{1..L}``, a mixture of kernels that each satisfy detailed balance.

The iterations run in C++ (``ahmc_hmc_block`` in ``csrc/ahmc_bridge.cpp``, the one place
the algorithm is written), random numbers included: each call takes one 64-bit seed from
the caller's numpy Generator, so the same seed gives the same draws.  A non-finite log
density or gradient anywhere on the trajectory rejects the proposal; an energy error
above ``max_energy_error`` (1000, as Stan) marks the iteration divergent.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .metric import InvMetric, as_native
from .native import NativeDensity

__all__ = ["HMCState", "HMCParameters", "HMCInfo", "DensityKernel", "HMCKernel",
           "stack_infos"]


@dataclass(frozen=True)
class HMCState:
    position: np.ndarray
    logdensity: float
    logdensity_grad: np.ndarray


@dataclass(frozen=True)
class HMCParameters:
    """Step size ε, number of leapfrog steps L (the upper bound when ``jitter``) and the
    inverse metric."""

    step_size: float
    num_steps: int
    inv_metric: InvMetric = None
    jitter: bool = True


@dataclass(frozen=True)
class HMCInfo:
    """Per-iteration arrays of a block of iterations (length 1 for a single step)."""

    positions: np.ndarray          # state after each iteration, one row each
    acceptance_rate: np.ndarray    # min(1, exp(-ΔH))
    is_accepted: np.ndarray
    is_divergent: np.ndarray
    num_steps: np.ndarray          # leapfrog steps L_r of the trajectory
    num_grad: np.ndarray           # gradient evaluations made
    energy: np.ndarray             # Hamiltonian of the state kept
    logdensity: np.ndarray         # log density of the state kept


def stack_infos(infos: list) -> HMCInfo:
    """One info of the iterations of several (of one type: HMCInfo or a subclass; a dict
    field of per-iteration arrays is stacked key by key)."""
    first = infos[0]

    def stack(name):
        values = [getattr(i, name) for i in infos]
        if isinstance(values[0], dict):
            return {k: np.concatenate([v[k] for v in values]) for k in values[0]}
        return np.concatenate(values)

    return type(first)(**{f.name: stack(f.name) for f in dataclasses.fields(first)})


class DensityKernel:
    """The part of the protocol shared by kernels whose state is a position with its log
    density and gradient (:class:`HMCKernel`, :class:`~ahmc_stan.mh.MHKernel`)."""

    def __init__(self, density: NativeDensity):
        self.density = density

    def init(self, position: np.ndarray) -> HMCState:
        position = np.array(position, dtype=float)
        grad = np.empty_like(position)
        lp = self.density.log_density_gradient(position, grad)
        if not np.isfinite(lp):
            raise ValueError("the initial point has a non-finite log density or gradient")
        return HMCState(position, lp, grad)

    def step(self, rng: np.random.Generator, state, params):
        """One iteration: :meth:`run` of 1."""
        return self.run(rng, state, params, 1)

    def run(self, rng: np.random.Generator, state, params, n_iter: int):
        raise NotImplementedError


#: The most trials of Stan's first-step-size heuristic: one, then at most 100 doublings or
#: halvings (:func:`~ahmc_stan.tuning.step_size.initial_step_size`).
INIT_TRIALS = 101


class HMCKernel(DensityKernel):
    """HMC on a model's density (``model.density``)."""

    max_energy_error = 1000.0

    def run(self, rng: np.random.Generator, state: HMCState, params: HMCParameters,
            n_iter: int) -> tuple[HMCState, HMCInfo]:
        """``n_iter`` iterations at fixed parameters in one call into C++, whose random
        numbers (momenta, ``L_r``, the Metropolis uniforms) come from one 64-bit seed
        taken from ``rng``."""
        seed = int(rng.integers(0, 2**63))
        x, grad = state.position.copy(), state.logdensity_grad.copy()
        inv_metric = as_native(params.inv_metric)
        lp, out = self.density.hmc_block(
            params.step_size, params.num_steps, params.jitter, inv_metric, seed, n_iter,
            self.max_energy_error, x, grad, state.logdensity)
        return HMCState(x, lp, grad), self._info(out)

    def initial_step_size(self, rng: np.random.Generator, state: HMCState, inv_metric,
                          step_size: float = 1.0, target: float = 0.8) -> float:
        """Stan's first step size (:func:`~ahmc_stan.tuning.step_size.initial_step_size`
        with one-step trajectories from ``state``) in one call into C++: the same trials,
        each seeded as :meth:`step` would seed it from ``rng``, so the step size and
        ``rng``'s state afterwards are those of that loop over :meth:`step`."""
        before = rng.bit_generator.state
        seeds = rng.integers(0, 2**63, size=INIT_TRIALS, dtype=np.int64)
        eps, trials = self.density.init_stepsize(
            step_size, target, as_native(inv_metric), seeds.view(np.uint64),
            self.max_energy_error, state.position, state.logdensity_grad, state.logdensity)
        rng.bit_generator.state = before  # then as many seeds as the trials took
        rng.integers(0, 2**63, size=trials, dtype=np.int64)
        return eps

    def tuned_run(self, rng: np.random.Generator, state: HMCState, inv_metric, tuner,
                  block_size: int, n_iter: int, max_grads: float):
        """Up to ``n_iter`` iterations of AHMC's Algorithm 2 in one C++ call
        (``ahmc_tuned_hmc_block``): blocks of ``block_size`` at the γ = (ε, L) of
        ``tuner`` (a :class:`~ahmc_stan.tuning.native_tuner.NativeBayesOptTuner` over
        (step_size, num_steps)), which receives each block's reward ESJD/√L and moves γ;
        the call ends after the block in which the gradients reach ``max_grads``.  Returns
        (state, :class:`~ahmc_stan.tuning.hmc_warmup.AdaptedSteps` of the iterations
        made)."""
        from .tuning.hmc_warmup import AdaptedSteps

        seed = int(rng.integers(0, 2**63))
        x, grad = state.position.copy(), state.logdensity_grad.copy()
        lp, out = self.density.tuned_hmc_block(
            tuner.handle, block_size, n_iter, max_grads, as_native(inv_metric), seed,
            self.max_energy_error, x, grad, state.logdensity)
        tuner.sync()
        return HMCState(x, lp, grad), AdaptedSteps(
            self._info(out), out["step_size"], out["num_steps_max"].astype(int), None)

    @staticmethod
    def _info(out: dict) -> HMCInfo:
        return HMCInfo(out["draws"], out["accept_prob"], out["accepted"].astype(bool),
                       out["divergent"].astype(bool), out["n_steps"], out["n_grad"],
                       out["energy"], out["lp"])

    def adapt_run(self, rng: np.random.Generator, state: HMCState, inv_metric,
                  n_iter: int, averager, path_length: float, max_steps,
                  min_step_size: float = 0.0, want_grads: bool = False,
                  jitter: bool = True, step_jitter: float = 0.0,
                  max_grads: float = math.inf, max_divergent: int = 0):
        """Warmup iterations with the step size adapted inside one C++ call
        (``ahmc_hmc_adapt_block``), as :func:`ahmc_stan.tuning.hmc_warmup.adapt_steps`
        describes; ``averager`` (a :class:`~ahmc_stan.tuning.step_size.DualAveraging`)
        is advanced to where the block left it."""
        from .tuning.hmc_warmup import AdaptedSteps

        seed = int(rng.integers(0, 2**63))
        x, grad = state.position.copy(), state.logdensity_grad.copy()
        inv_metric = as_native(inv_metric)
        da = averager.state_array()
        lp, out = self.density.hmc_adapt_block(
            path_length, max_steps, jitter, inv_metric, seed, n_iter, self.max_energy_error,
            min_step_size, da, averager.params_array(), x, grad, state.logdensity,
            want_grads, step_jitter, max_grads, max_divergent)
        averager.load_state_array(da)
        return HMCState(x, lp, grad), AdaptedSteps(
            self._info(out), out["step_size"], out["num_steps_max"].astype(int), out.get("grads"))
