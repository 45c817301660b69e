"""Metropolis–Hastings with a Gaussian proposal as a kernel ``(rng, state, params) ->
(state, info)``, the protocol of :mod:`ahmc_stan.hmc`.

``MHKernel(density).init(position) -> MHState``; ``run(rng, state, params, n_iter) ->
(MHState, MHInfo)`` runs ``n_iter`` iterations in one C++ call (``ahmc_mh_block`` in
``csrc/ahmc_bridge.cpp``), the noise and uniforms drawn there from one 64-bit seed taken
from ``rng``.  :class:`MHParameters` describe the proposal — random walk ``y = x + Lε``
or Langevin ``y = x + ½LLᵀ∇log π(x) + Lε`` (Titsias & Dellaportas 2019, sections
2.2–2.3), AM's mixture (Haario et al. 2001), gadMALA's exact variant — as the C++ block
takes it.  With ``adapt = 0`` the proposal is fixed; otherwise the call also runs the
sampler's warmup adaptation on the arrays of ``params``, in place (as
:meth:`~ahmc_stan.hmc.HMCKernel.adapt_run` does for HMC's step size): dual averaging of
σ (1), gad's RMSProp step on L and its β update (2), AM's running mean and rank-one
Cholesky updates (3).  The proposals and their Python reference are
:mod:`ahmc_stan.samplers.metropolis` and the samplers' modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .hmc import DensityKernel, HMCState

__all__ = ["MHParameters", "MHState", "MHInfo", "MHKernel"]


@dataclass
class MHParameters:
    """A proposal and its adaptation as the C++ block takes them: ``adapt`` 0 (fixed), 1
    (dual averaging of log σ), 2 (gad) or 3 (AM); ``am`` selects AM's proposal;
    ``params`` and ``state`` are the adaptation's constants and state (layouts in
    ``csrc/ahmc_bridge.cpp``, ``mh_chain``); ``chol`` the lower-triangular L (None for a
    scalar σ, then ``state[5]`` = σ), ``sq_grad`` RMSProp's G, ``mean`` AM's running mean.
    The arrays are C-contiguous float64; an adapting call updates them in place."""

    adapt: int
    params: np.ndarray
    state: np.ndarray
    chol: np.ndarray | None = None
    sq_grad: np.ndarray | None = None
    mean: np.ndarray | None = None
    langevin: bool = False
    exact: bool = False
    am: bool = False


#: The state, as HMC's: a position with its log density and gradient.
MHState = HMCState


@dataclass(frozen=True)
class MHInfo:
    """Per-row arrays of a block (a row is the state after ``steps_per_draw``
    iterations; counts summed and acceptance averaged over them)."""

    positions: np.ndarray        # state after each row
    acceptance_rate: np.ndarray  # mean min(1, ratio)
    is_accepted: np.ndarray      # fraction of the row's iterations accepted
    num_grad: np.ndarray         # gradient evaluations
    num_density: np.ndarray      # density-only evaluations
    num_hvp: np.ndarray          # Hessian-vector products (gadMALA exact's adaptation)
    logdensity: np.ndarray       # log density of the state kept
    step_size: np.ndarray        # σ of an isotropic proposal (nan for a matrix L)
    beta: np.ndarray             # gad's β (nan for other proposals)

    def stats(self) -> dict[str, np.ndarray]:
        """The chain statistics of these rows, under :class:`~ahmc_stan.fit.Fit`'s names."""
        return {"accept_stat": self.acceptance_rate, "accepted": self.is_accepted,
                "n_grad": self.num_grad, "n_density": self.num_density,
                "n_hvp": self.num_hvp, "lp": self.logdensity, "step_size": self.step_size,
                "beta": self.beta}


class MHKernel(DensityKernel):
    """Metropolis–Hastings on a model's density (``model.density``)."""

    def run(self, rng: np.random.Generator, state: MHState, params: MHParameters,
            n_iter: int, steps_per_draw: int = 1) -> tuple[MHState, MHInfo]:
        """``n_iter`` rows of ``steps_per_draw`` iterations in one call into C++, whose
        noise comes from one 64-bit seed taken from ``rng``."""
        seed = int(rng.integers(0, 2**63))
        x, grad = state.position.copy(), state.logdensity_grad.copy()
        lp, rows, st, _ = self.density.mh_block(n_iter, steps_per_draw, params, seed, x,
                                                grad, state.logdensity)
        info = MHInfo(rows, st["accept_stat"], st["accepted"], st["n_grad"],
                      st["n_density"], st["n_hvp"], st["lp"], st["step_size"], st["beta"])
        return MHState(x, lp, grad), info
