"""OHMC: HMC whose momentum is updated by Neal's ordered overrelaxation instead of being
drawn afresh (Alfaki, Subbey & Haugland 2008, slide "Applying over-relaxation to P").

The momentum persists from one iteration to the next, so the transition is generalised HMC
(:mod:`ahmc_stan.ghmc`): ``p* = −OR(p)`` with K candidates per component
(:func:`~ahmc_stan.momentum.ordered_overrelaxation`), a leapfrog trajectory of
``L_r ~ Uniform{1..L}`` steps (in C++, ``NativeDensity.leapfrog``), Metropolis acceptance
and the momentum flip on rejection; :mod:`ahmc_stan.ghmc` explains why the composition
leaves ``π(x) N(p; 0, M)`` invariant.  K = 1 is plain HMC.

(ε, L) are tuned exactly as AHMC tunes them (:func:`~.ahmc.run_tuned_chain`: scale phase,
then Bayesian optimisation over Γ with the ESJD/sqrt(L) reward); the metric is the identity
or diagonal, as ordered overrelaxation needs independent momentum components.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..ghmc import GHMCKernel, GHMCState, NativeIntegrator
from ..hmc import HMCParameters
from .ahmc import HMC_STATS, _record, run_tuned_chain
from .chain import ChainResult

__all__ = ["run_chain", "ghmc_blocks", "check_metric", "leapfrog_trajectory",
           "DEFAULT_NUM_CANDIDATES"]

#: Neal's K.  The talk does not give its value; see ``comparisons/talk_tables.py``.
DEFAULT_NUM_CANDIDATES = 5


def leapfrog_trajectory(density, rng, position, inv_metric, rec):
    """The leapfrog integrator as a :data:`~ahmc_stan.ghmc.Trajectory` (no auxiliary
    variables, so its log weight is 0)."""
    def trajectory(rng, n_steps, step_size, x, p, grad, lp):
        lp, n_grad = density.leapfrog(n_steps, step_size, inv_metric, x, p, grad, lp)
        return lp, 0.0, {"n_grad": n_grad}

    trajectory.native_integrator = NativeIntegrator()
    return trajectory


def check_metric(metric, sampler: str) -> None:
    """Generalised HMC here takes ``"identity"``, ``"diag"`` or a fixed diagonal (a vector
    of M⁻¹): ordered overrelaxation needs independent momentum components."""
    if isinstance(metric, np.ndarray) and metric.ndim == 1:
        return
    if not isinstance(metric, str) or metric not in ("identity", "diag"):
        raise ValueError(f"{sampler} needs metric 'identity', 'diag' or a vector, "
                         f"not {metric!r}")


def ghmc_blocks(make_trajectory: Callable, num_candidates: int | None) -> Callable:
    """A ``make_blocks`` for :func:`~.ahmc.run_tuned_chain` running generalised HMC
    (:class:`~ahmc_stan.ghmc.GHMCKernel`) with the integrator
    ``make_trajectory(density, rng, position, inv_metric, rec)``, in C++ blocks where the
    integrator has a native form; the momentum starts fresh when the blocks start (the
    metric is fixed from then on).  A native kernel's ``run_block`` also offers
    ``tuned`` (:func:`~.ahmc.hmc_blocks` says what it is)."""
    def make_blocks(kernel, rng, state, inv_metric, rec):
        trajectory = make_trajectory(kernel.density, rng, state.position, inv_metric, rec)
        ghmc = GHMCKernel(kernel.density, trajectory, inv_metric, num_candidates,
                          native=True)
        current = GHMCState(state.position, state.logdensity, state.logdensity_grad,
                            ghmc.fresh_momentum(rng, len(state.position)))

        def run_block(gamma, n_iter, phase):
            nonlocal current
            params = HMCParameters(float(gamma["step_size"]), int(gamma["num_steps"]),
                                   inv_metric)
            previous = current.position
            current, info = ghmc.run(rng, current, params, n_iter)
            _record(rec, info, params, phase)
            return previous, info.positions

        def tuned(tuner, block_size, n_iter, max_grads, phase):
            nonlocal current
            current, steps = ghmc.tuned_run(rng, current, tuner, block_size, n_iter,
                                            max_grads)
            _record(rec, steps.info, HMCParameters(steps.step_size, steps.num_steps_max),
                    phase)

        if ghmc.native:
            run_block.tuned = tuned
        return run_block

    return make_blocks


def run_chain(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
              progress: Callable[[int], None], *, num_candidates: int = DEFAULT_NUM_CANDIDATES,
              metric: str = "diag", **options) -> ChainResult:
    """One OHMC chain; ``num_candidates`` is Neal's K, ``metric`` ``"identity"``,
    ``"diag"`` or a fixed diagonal; the other options are AHMC's (:func:`~.ahmc.run_chain`)."""
    check_metric(metric, "OHMC")
    if int(num_candidates) < 1:
        raise ValueError("num_candidates (K) must be at least 1")
    result = run_tuned_chain(model, rng, x0, warmup, draws, progress,
                             ghmc_blocks(leapfrog_trajectory, int(num_candidates)),
                             HMC_STATS, metric=metric, **options)
    result.extras["num_candidates"] = int(num_candidates)
    return result
