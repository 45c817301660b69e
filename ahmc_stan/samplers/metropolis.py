"""Metropolis–Hastings with a Gaussian proposal of Cholesky factor L — the pieces shared
by the non-HMC samplers (``rwm``, ``mala``, ``am``, ``gadrwm``, ``gadmala``,
``gadmala_exact``).

Proposals (Titsias & Dellaportas 2019, sections 2.2–2.3), ε ~ N(0, I):

* random walk: ``y = x + Lε``, symmetric, so ``q`` cancels from the MH ratio;
* Langevin: ``y = x + ½LLᵀ∇log π(x) + Lε``, for which (section 2.3)
  ``log q(x|y) − log q(y|x) = ½‖ε‖² − ½‖ε + ½Lᵀ(∇log π(x) + ∇log π(y))‖²``.

``L`` is a lower-triangular matrix or a scalar σ (``L = σI``, O(n) per iteration); with a
matrix every operation is O(n²): matrix–vector products and, in
:func:`langevin_log_density`, a triangular solve — never a factorisation.

:func:`run_mh_chain` is the one chain loop (blocks of :class:`~ahmc_stan.mh.MHKernel`, in
C++, or :func:`mh_iteration` in Python): each iteration draws ε (then a uniform for the
accept step), proposes, evaluates the target at y, accepts if ``log u < log ratio`` (a
non-finite target rejects), and during warmup hands the iteration (:class:`MHStep`) to the
proposal's ``adapt``.  What differs between samplers lives in a :class:`Proposal` subclass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import linalg

from ..mh import MHKernel, MHParameters, MHState
from ..model import DensityError
from .chain import ChainRecorder, ChainResult

__all__ = ["Target", "MHStep", "Proposal", "mh_iteration", "propose",
           "langevin_log_q_ratio", "langevin_log_density", "accept", "acceptance_probability",
           "run_mh_chain"]


# ---- the target --------------------------------------------------------------------------

class Target:
    """A model's log density: density only (``bridge.log_density``), density and gradient
    (``model.density``, the fast path) and Hessian-vector products; ``-inf`` where the model
    throws or the value is not finite."""

    def __init__(self, model):
        self.model = model
        self.dims = model.dims
        self._kernel = model.density
        self._density = model.bridge.log_density
        #: the C++ blocks' path (None for a library without them, or a subclass that
        #: overrides an evaluation: its override must see every call)
        overridden = any(getattr(type(self), name) is not getattr(Target, name)
                         for name in ("density", "gradient", "hvp"))
        self.native_density = (model.density if model.density.native and not overridden
                               else None)

    def density(self, x: np.ndarray) -> float:
        try:
            lp = self._density(x)
        except RuntimeError:
            return -math.inf
        return lp if math.isfinite(lp) else -math.inf

    def gradient(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        grad = np.empty(self.dims)
        return self._kernel.log_density_gradient(x, grad), grad

    def hvp(self, x: np.ndarray, v: np.ndarray) -> np.ndarray | None:
        """``∇²log π(x) v`` (None where the model throws)."""
        try:
            _, hv = self.model.log_density_hvp(x, v)
        except (DensityError, RuntimeError, ValueError):
            return None
        return hv if np.all(np.isfinite(hv)) else None


# ---- proposal and accept step -----------------------------------------------------------

def _times_l(L, v: np.ndarray) -> np.ndarray:
    return L * v if np.ndim(L) == 0 else L @ v


def _times_lt(L, v: np.ndarray) -> np.ndarray:
    return L * v if np.ndim(L) == 0 else L.T @ v


def propose(x: np.ndarray, L, eps: np.ndarray, grad_x: np.ndarray | None = None
            ) -> np.ndarray:
    """``y = x + Lε`` (random walk, ``grad_x`` None) or ``y = x + ½LLᵀ∇log π(x) + Lε``
    (Langevin)."""
    if grad_x is None:
        return x + _times_l(L, eps)
    return x + _times_l(L, 0.5 * _times_lt(L, grad_x) + eps)


def langevin_log_q_ratio(L, eps: np.ndarray, grad_x: np.ndarray, grad_y: np.ndarray
                         ) -> float:
    """``log q(x|y) − log q(y|x)`` for ``y = propose(x, L, ε, ∇log π(x))``, from ε
    (section 2.3): ``½‖ε‖² − ½‖r‖²`` with ``r = ε + ½Lᵀ(∇log π(x) + ∇log π(y))``."""
    r = eps + 0.5 * _times_lt(L, grad_x + grad_y)
    return 0.5 * float(eps @ eps - r @ r)


def langevin_log_density(y: np.ndarray, x: np.ndarray, grad_x: np.ndarray, L) -> float:
    """``log N(y | x + ½LLᵀ∇log π(x), LLᵀ)`` by one triangular solve (O(n²));
    ``grad_x`` zero gives the random-walk density."""
    n = len(x)
    if np.ndim(L) == 0:
        z = (y - x) / L - 0.5 * L * grad_x
        log_det = n * math.log(L)
    else:
        # L⁻¹(y − x − ½LLᵀg) = L⁻¹(y − x) − ½Lᵀg
        z = linalg.solve_triangular(L, y - x, lower=True, check_finite=False) \
            - 0.5 * (L.T @ grad_x)
        log_det = float(np.sum(np.log(np.diag(L))))
    return -0.5 * float(z @ z) - log_det - 0.5 * n * math.log(2 * math.pi)


def accept(log_ratio: float, log_u: float) -> bool:
    """The MH decision ``log u < log ratio``; a non-finite (nan, -inf) ratio rejects."""
    return bool(log_u < log_ratio)


def acceptance_probability(log_ratio: float) -> float:
    """``min(1, exp(log ratio))``, 0 for a non-finite ratio other than +inf."""
    if math.isnan(log_ratio):
        return 0.0
    return 1.0 if log_ratio >= 0 else math.exp(log_ratio)


# ---- what a sampler plugs into the chain loop --------------------------------------------

@dataclass
class MHStep:
    """One iteration, as the proposal's ``adapt`` sees it (``grad_*`` None when not
    evaluated; ``log_ratio`` is ``-inf`` where the target is not finite at y)."""

    x: np.ndarray
    lp_x: float
    grad_x: np.ndarray | None
    eps: np.ndarray
    y: np.ndarray
    lp_y: float
    grad_y: np.ndarray | None
    log_ratio: float
    accept_prob: float
    accepted: bool


class Proposal:
    """A Gaussian proposal of Cholesky factor ``L`` (scalar: isotropic), random walk or
    Langevin, fixed; subclasses adapt it during warmup by overriding :meth:`adapt`."""

    #: per-iteration statistics beyond the loop's own (``stats()`` gives their values)
    stat_names: tuple[str, ...] = ()
    #: per-iteration counts of other kinds of evaluation that :meth:`adapt` reports
    #: (e.g. ``n_hvp``), summed over thinned iterations
    count_names: tuple[str, ...] = ()

    def __init__(self, L, langevin: bool):
        self.L = L
        self.langevin = langevin

    @property
    def noise_dims(self) -> int | None:
        """Length of ε (None: the state's dimension)."""
        return None

    def propose(self, x: np.ndarray, grad_x: np.ndarray | None, eps: np.ndarray
                ) -> np.ndarray:
        return propose(x, self.L, eps, grad_x if self.langevin else None)

    def log_q_ratio(self, eps: np.ndarray, grad_x, grad_y) -> float:
        return langevin_log_q_ratio(self.L, eps, grad_x, grad_y) if self.langevin else 0.0

    def needs_gradient(self, adapting: bool) -> bool:
        """Whether the iteration evaluates ∇log π(y) (else the density only)."""
        return self.langevin

    def adapt(self, target: Target, step: MHStep) -> int | dict[str, int]:
        """Warmup adaptation after the accept step; returns the gradient evaluations it
        made beyond the proposal's, or a dict of counts (``n_grad`` and those of
        :attr:`count_names`, e.g. ``{"n_hvp": 1}``)."""
        return 0

    def end_warmup(self) -> None:
        """Called once when sampling starts; the proposal is fixed from then on."""

    def native_block(self, adapting: bool) -> MHParameters | None:
        """This proposal for the C++ block (None: Python only); the base class is the
        fixed proposal (a subclass that adapts without saying how in C++ gets None).
        After the call :meth:`load_native` reads the state back."""
        if type(self).adapt is not Proposal.adapt:
            return None
        return self.fixed_block()

    def fixed_block(self) -> MHParameters:
        """The current proposal, not adapted, for the C++ block."""
        if np.ndim(self.L) == 0:
            return MHParameters(0, np.zeros(1), np.array([0, 0, 0, 0, 0, float(self.L)]),
                               langevin=self.langevin)
        return MHParameters(0, np.zeros(1), np.zeros(1),
                           chol=np.ascontiguousarray(self.L, dtype=float),
                           langevin=self.langevin)

    def load_native(self, block: MHParameters) -> None:
        """Take the adapted state back from a C++ block (nothing for a fixed proposal)."""

    @property
    def step_size(self) -> float:
        return float(self.L) if np.ndim(self.L) == 0 else math.nan

    def stats(self) -> dict[str, float]:
        return {}

    def extras(self) -> dict:
        """The final proposal: ``step_size`` σ (isotropic) or ``proposal_cholesky`` L."""
        if np.ndim(self.L) == 0:
            return {"step_size": float(self.L)}
        return {"proposal_cholesky": np.array(self.L, dtype=float)}


# ---- the chain loop ----------------------------------------------------------------------

_LOOP_STATS = ("step_size", "n_density", "accepted", "lp")


def mh_iteration(target: Target, proposal: Proposal, x: np.ndarray, lp: float, grad,
                 eps: np.ndarray, log_u: float, adapting: bool):
    """One MH iteration from the noise ``eps`` and ``log_u`` (the Python reference of the
    C++ block): propose, evaluate, accept if ``log u < log ratio`` (a non-finite target
    rejects), adapt during warmup.  Returns (x, lp, grad, acceptance probability,
    accepted, counts of evaluations)."""
    counts = {"n_grad": 0, "n_density": 0}
    y = proposal.propose(x, grad, eps)
    if proposal.needs_gradient(adapting):
        lp_y, grad_y = target.gradient(y)
        counts["n_grad"] += 1
    else:
        lp_y, grad_y = target.density(y), None
        counts["n_density"] += 1
    log_ratio = lp_y - lp
    if math.isfinite(lp_y) and proposal.langevin:
        log_ratio += proposal.log_q_ratio(eps, grad, grad_y)
    prob = acceptance_probability(log_ratio)
    accepted = accept(log_ratio, log_u)
    if adapting:
        work = proposal.adapt(target, MHStep(x, lp, grad, eps, y, lp_y, grad_y, log_ratio,
                                             prob, accepted))
        for k, v in (work.items() if isinstance(work, dict) else [("n_grad", work)]):
            counts[k] = counts.get(k, 0) + v
    if accepted:
        x, lp = y, lp_y
        if proposal.langevin:
            grad = grad_y
    return x, lp, grad, prob, accepted, counts


def run_mh_chain(target: Target, rng: np.random.Generator, x0: np.ndarray, warmup: int,
                 draws: int, progress: Callable[[int], None], proposal: Proposal, *,
                 steps_per_draw: int = 1, block_size: int = 200,
                 native: bool | None = None) -> ChainResult:
    """``warmup`` adapted then ``draws`` fixed-proposal rows; each row is the state after
    ``steps_per_draw`` MH iterations (``n_grad``/``n_density`` summed and
    ``accept_stat``/``accepted`` averaged over them), so the chain runs
    ``(warmup + draws)·steps_per_draw`` iterations (seed 003's protocol; unlike
    ``tune_and_sample``'s ``thin``, adaptation also sees every iteration of warmup).

    Blocks of ``block_size`` rows run in one C++ call (``ahmc_mh_block``, noise drawn in
    C++ from one seed per block) when the model library has it and the proposal says how
    (:meth:`Proposal.native_block`); ``native=False`` runs :func:`mh_iteration` in Python
    with numpy's noise instead (the reference; a different random stream).

    Statistics: ``accept_stat`` (mean ``min(1, ratio)``), ``accepted`` (fraction),
    ``n_grad`` (gradient evaluations, each also giving the density), ``n_density``
    (density-only evaluations), ``divergent`` (always 0), ``step_size`` (σ or nan), ``lp``,
    and the proposal's ``stat_names`` and ``count_names`` (``n_hvp``).
    """
    if steps_per_draw < 1:
        raise ValueError(f"steps_per_draw must be a positive integer, not {steps_per_draw}")
    dims = len(x0)
    n_noise = proposal.noise_dims or dims
    density = target.native_density
    if native is None:
        native = density is not None and proposal.native_block(warmup > 0) is not None
    elif native and (density is None or proposal.native_block(warmup > 0) is None):
        raise ValueError("this model library or proposal has no C++ block")
    rec = ChainRecorder(dims, warmup + draws,
                        [*_LOOP_STATS, *proposal.stat_names, *proposal.count_names])
    x = np.array(x0, dtype=float)
    lp, grad = (target.gradient(x) if proposal.langevin or native
                else (target.density(x), None))
    if not math.isfinite(lp):
        raise ValueError("the initial point has a non-finite log density or gradient")
    if native:
        kernel, state = MHKernel(density), MHState(x, lp, grad)
    names = ("accept_stat", "accepted", "n_grad", "n_density", "lp", "step_size",
             *proposal.stat_names, *proposal.count_names)
    with rec.running(warmup):
        rows, out, done, adapting = np.empty((0, dims)), {}, 0, warmup > 0
        try:
            if warmup == 0:
                proposal.end_warmup()
            while rec.n < warmup + draws:
                adapting = rec.n < warmup
                if not adapting:
                    rec.enter_sampling()
                n_rows = min(block_size, (warmup if adapting else warmup + draws) - rec.n)
                if native:
                    block = proposal.native_block(adapting)
                    state, info = kernel.run(rng, state, block, n_rows, steps_per_draw)
                    proposal.load_native(block)
                    rows, st = info.positions, info.stats()
                    out = {k: st[k] for k in names}
                    if not block.adapt:  # the proposal's own statistics are fixed
                        out.update({k: np.full(n_rows, v)
                                    for k, v in proposal.stats().items()})
                    done = n_rows
                else:
                    rows, done = np.empty((n_rows, dims)), 0
                    out = {k: np.zeros(n_rows) for k in names}
                    for i in range(n_rows):
                        for _ in range(steps_per_draw):
                            eps = rng.standard_normal(n_noise)
                            log_u = math.log(rng.uniform())
                            x, lp, grad, prob, accepted, counts = mh_iteration(
                                target, proposal, x, lp, grad, eps, log_u, adapting)
                            for k, v in counts.items():
                                out[k][i] += v
                            out["accept_stat"][i] += prob / steps_per_draw
                            out["accepted"][i] += accepted / steps_per_draw
                        rows[i] = x
                        out["lp"][i] = lp
                        out["step_size"][i] = proposal.step_size
                        for k, v in proposal.stats().items():
                            out[k][i] = v
                        done = i + 1
                rec.add(rows, divergent=0, phase=1 if adapting else 2, **out)
                done = 0
                if adapting and rec.n == warmup:
                    proposal.end_warmup()
                progress(rec.n)
        except KeyboardInterrupt:
            if done:  # the rows of the unfinished block
                rec.add(rows[:done], divergent=0, phase=1 if adapting else 2,
                        **{k: v[:done] for k, v in out.items()})
            raise
    return rec.finish({**proposal.extras(), "steps_per_draw": steps_per_draw})
