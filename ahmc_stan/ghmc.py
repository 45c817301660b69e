"""Generalised HMC: the transition with a persistent momentum that OHMC, SVHMC and OSVHMC
share (Horowitz 1991, *A generalized guided Monte Carlo algorithm*; Neal 2011, *MCMC using
Hamiltonian dynamics*, section 5.5.3).

The state is (x, p); the target is the joint ``π(x) N(p; 0, M)``.  One iteration is the
composition of four maps, each of which leaves the joint invariant:

1. **Momentum update** ``p ← p*``: a fresh draw from N(0, M) (plain HMC), or Neal's ordered
   overrelaxation followed by a negation, ``p* = −OR(p)``
   (:func:`~ahmc_stan.momentum.ordered_overrelaxation` satisfies detailed balance for
   N(0, M); the negation is a volume-preserving bijection under which N(0, M) is
   symmetric).
2. **Auxiliary variables** of the integrator, if any, drawn from their conditional given
   (x, p*) (SVHMC's ρ₀, see :mod:`ahmc_stan.samplers.svhmc`); they are discarded after 3.
3. **Metropolis–Hastings with an involution**: the proposal is ``F(x, p*) = (x_L, −p_L)``
   (the integrator followed by a momentum flip).  ``F`` is an involution that preserves
   volume (in the space extended by the auxiliary variables), so accepting with
   probability ``min(1, exp(−ΔH + log w))`` — ``log w`` the log-density ratio of the
   auxiliary variables, 0 for leapfrog — satisfies detailed balance.
4. **Momentum negation** ``p ← −p``.

After 3 and 4 an accepted proposal leaves ``(x_L, p_L)`` and a rejected one ``(x, −p*)``:
the momentum flip on rejection of generalised HMC.  Each map leaves the joint invariant,
so the composition does (it is not itself reversible and need not be).  With a fresh
momentum in 1 the flips are immaterial and the chain is ordinary HMC.

Why ``−OR``: overrelaxation sends ``p_j`` to about its mirror image ``−p_j``; the negation
turns that into ``p* ≈ p`` plus noise, so an accepted trajectory is continued in the same
direction by the next one (the random walk the talk sets out to suppress), and a rejected
one is retraced.  K = 1 is a fresh draw, i.e. HMC.

The number of steps of each trajectory is drawn afresh, ``L_r ~ Uniform{1..L}`` (a mixture
of kernels each satisfying 1–4), as in :mod:`ahmc_stan.hmc`.  A non-finite log density or
weight rejects; an energy error above ``max_energy_error`` marks the iteration divergent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .hmc import HMCInfo, HMCParameters
from .metric import InvMetric, draw_momenta
from .native import NativeDensity
from .momentum import ordered_overrelaxation

__all__ = ["GHMCState", "GHMCInfo", "GHMCKernel", "Trajectory", "NativeIntegrator",
           "kinetic_energy"]

#: ``trajectory(rng, n_steps, step_size, x, p, grad, lp) -> (lp_end, log_weight, counts)``:
#: integrates in place from (x, p) and returns the log density at the end (``-inf`` if not
#: finite), the log-density ratio of its auxiliary variables (0 if none) and a dict of
#: per-iteration counts (at least ``n_grad``).
Trajectory = Callable[..., tuple[float, float, dict]]


@dataclass(frozen=True)
class NativeIntegrator:
    """What a :data:`Trajectory` that the C++ block (``ahmc_ghmc_block``) can run exposes
    as its ``native_integrator``: the leapfrog (``verlet`` None) or SVHMC's adaptive
    Störmer–Verlet with ``verlet`` = (G_ref, a, s, Hessian-vector method: 0 autodiff, 1
    differences of gradients) (:class:`~ahmc_stan.samplers.svhmc.AdaptiveVerlet`).  A
    trajectory that has evaluations to charge to its first iteration exposes them through
    ``take_pending()``."""

    verlet: tuple[float, float, float, int] | None = None


@dataclass(frozen=True)
class GHMCState:
    """The position and the persistent momentum (None: drawn fresh by the next run)."""

    position: np.ndarray
    logdensity: float
    logdensity_grad: np.ndarray
    momentum: np.ndarray | None = None


@dataclass(frozen=True)
class GHMCInfo(HMCInfo):
    """:class:`~ahmc_stan.hmc.HMCInfo` plus the trajectory's per-iteration counts of
    evaluations other than gradients (e.g. SVHMC's ``n_hvp``), as ``extra_stats``."""

    counts: dict = field(default_factory=dict)

    @property
    def extra_stats(self) -> dict[str, np.ndarray]:
        return self.counts


def kinetic_energy(p: np.ndarray, inv_metric: InvMetric) -> float:
    """``½ pᵀ M⁻¹ p`` for an identity or diagonal metric (``inf`` on overflow)."""
    with np.errstate(over="ignore"):
        return 0.5 * float(p @ p if inv_metric is None else p @ (inv_metric * p))


class GHMCKernel:
    """Generalised HMC on a model's density with a given integrator.

    ``num_candidates`` is Neal's K for the momentum update ``p* = −OR(p)``; ``None`` draws
    a fresh momentum every iteration (HMC).
    """

    max_energy_error = 1000.0

    def __init__(self, density: NativeDensity, trajectory: Trajectory,
                 inv_metric: InvMetric = None, num_candidates: int | None = None,
                 native: bool = False):
        if inv_metric is not None and np.ndim(inv_metric) != 1:
            raise ValueError("generalised HMC here needs an identity or diagonal metric")
        self.density = density
        self.trajectory = trajectory
        self.inv_metric = (None if inv_metric is None
                           else np.ascontiguousarray(inv_metric, dtype=float))
        self.num_candidates = num_candidates
        #: with ``native`` and a trajectory that exposes a :class:`NativeIntegrator`, whole
        #: blocks run in C++ (``ahmc_ghmc_block``) with their own random stream; the
        #: Python loop below is the reference
        self.native_integrator = getattr(trajectory, "native_integrator", None)
        self.native = bool(native and self.native_integrator is not None
                           and getattr(density, "native", False))

    def init(self, position: np.ndarray, rng: np.random.Generator | None = None
             ) -> GHMCState:
        """The state at ``position``, with a momentum from N(0, M) drawn from ``rng``
        (without one, the first :meth:`run` draws it)."""
        position = np.array(position, dtype=float)
        grad = np.empty_like(position)
        lp = self.density.log_density_gradient(position, grad)
        if not np.isfinite(lp):
            raise ValueError("the initial point has a non-finite log density or gradient")
        return GHMCState(position, lp, grad,
                         None if rng is None else self.fresh_momentum(rng, len(position)))

    def fresh_momentum(self, rng: np.random.Generator, dims: int) -> np.ndarray:
        return draw_momenta(rng, self.inv_metric, 1, dims)[0]

    def refresh(self, rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
        """Map 1: ``p* = −OR(p)``, or a fresh draw when ``num_candidates`` is None."""
        if self.num_candidates is None:
            return self.fresh_momentum(rng, len(p))
        return -ordered_overrelaxation(rng, p, self.num_candidates, self.inv_metric)

    def step(self, rng: np.random.Generator, state: GHMCState, params: HMCParameters
             ) -> tuple[GHMCState, GHMCInfo]:
        """One iteration."""
        return self.run(rng, state, params, 1)

    def run(self, rng: np.random.Generator, state: GHMCState, params: HMCParameters,
            n_iter: int) -> tuple[GHMCState, GHMCInfo]:
        """``n_iter`` iterations at fixed (ε, L); returns the final state and the
        per-iteration :class:`GHMCInfo` (the trajectory's counts in ``extra_stats``)."""
        dims = len(state.position)
        x, grad, lp = state.position.copy(), state.logdensity_grad.copy(), state.logdensity
        p = (self.fresh_momentum(rng, dims) if state.momentum is None
             else state.momentum.copy())
        if self.native:
            return self._run_native(rng, x, grad, lp, p, params, n_iter)
        out = {k: np.empty(n_iter) for k in ("accept", "energy", "lp")}
        flags = {k: np.zeros(n_iter, bool) for k in ("accepted", "divergent")}
        n_steps = np.empty(n_iter, int)
        counts: dict[str, np.ndarray] = {}
        positions = np.empty((n_iter, dims))
        x_new, p_new, grad_new = np.empty(dims), np.empty(dims), np.empty(dims)
        for i in range(n_iter):
            n_steps[i] = (rng.integers(1, params.num_steps, endpoint=True) if params.jitter
                          else params.num_steps)
            p = self.refresh(rng, p)
            h0 = -lp + kinetic_energy(p, self.inv_metric)
            x_new[:], p_new[:], grad_new[:] = x, p, grad
            lp_new, log_w, c = self.trajectory(rng, int(n_steps[i]), params.step_size,
                                               x_new, p_new, grad_new, lp)
            for k, v in c.items():
                counts.setdefault(k, np.zeros(n_iter, int))[i] = v
            h1 = -lp_new + kinetic_energy(p_new, self.inv_metric)
            log_ratio = h0 - h1 + log_w
            finite = math.isfinite(log_ratio)
            out["accept"][i] = math.exp(min(0.0, log_ratio)) if finite else 0.0
            flags["divergent"][i] = not finite or h1 - h0 > self.max_energy_error
            log_u = math.log(rng.uniform())
            if finite and log_u < log_ratio:
                flags["accepted"][i] = True
                x, grad, lp, p = x_new.copy(), grad_new.copy(), lp_new, p_new.copy()
                out["energy"][i] = h1
            else:
                p = -p  # the momentum flip on rejection (maps 3 + 4)
                out["energy"][i] = h0
            positions[i] = x
            out["lp"][i] = lp
        extra = {k: v for k, v in counts.items() if k != "n_grad"}
        info = GHMCInfo(positions, out["accept"], flags["accepted"], flags["divergent"],
                        n_steps, counts["n_grad"], out["energy"], out["lp"], extra)
        return GHMCState(x, lp, grad, p), info

    def _run_native(self, rng, x, grad, lp, p, params: HMCParameters, n_iter: int
                    ) -> tuple[GHMCState, GHMCInfo]:
        """:meth:`run` in one C++ call, from a seed drawn from ``rng``."""
        lp, out, _ = self.density.ghmc_block(
            params.step_size, params.num_steps, params.jitter, self.inv_metric,
            self.num_candidates or 0, int(rng.integers(0, 2**63)), n_iter,
            self.max_energy_error, x, grad, lp, p, verlet=self.native_integrator.verlet)
        return GHMCState(x, lp, grad, p), self._native_info(out)

    def tuned_run(self, rng: np.random.Generator, state: GHMCState, tuner, block_size: int,
                  n_iter: int, max_grads: float):
        """:meth:`ahmc_stan.hmc.HMCKernel.tuned_run` for generalised HMC (a native kernel
        only): up to ``n_iter`` iterations of AHMC's Algorithm 2 in one C++ call
        (``ahmc_tuned_ghmc_block``), the momentum carried through.  Returns (state,
        :class:`~ahmc_stan.tuning.hmc_warmup.AdaptedSteps`)."""
        from .tuning.hmc_warmup import AdaptedSteps

        x, grad = state.position.copy(), state.logdensity_grad.copy()
        p = (self.fresh_momentum(rng, len(x)) if state.momentum is None
             else state.momentum.copy())
        lp, out = self.density.tuned_ghmc_block(
            tuner.handle, block_size, n_iter, max_grads, self.inv_metric,
            self.num_candidates or 0, int(rng.integers(0, 2**63)), self.max_energy_error,
            x, grad, state.logdensity, p, verlet=self.native_integrator.verlet)
        tuner.sync()
        return GHMCState(x, lp, grad, p), AdaptedSteps(
            self._native_info(out), out["step_size"], out["num_steps_max"].astype(int), None)

    def _native_info(self, out: dict) -> GHMCInfo:
        """The :class:`GHMCInfo` of a C++ block's outputs; evaluations the trajectory made
        outside it (``take_pending``) are charged to its first iteration."""
        verlet = self.native_integrator.verlet
        n_iter = len(out["n_grad"])
        n_grad = out["n_grad"].astype(int)
        counts = {} if verlet is None else {"n_hvp": out["n_hvp"].astype(int)}
        take_pending = getattr(self.trajectory, "take_pending", None)
        pending = take_pending() if take_pending is not None else None
        if pending and n_iter:  # charged to the first iteration, as the Python loop does
            n_grad[0] += pending.get("n_grad", 0)
            for k in counts:
                counts[k][0] += pending.get(k, 0)
        return GHMCInfo(out["draws"], out["accept_prob"], out["accepted"].astype(bool),
                        out["divergent"].astype(bool), out["n_steps"], n_grad,
                        out["energy"], out["lp"], counts)
