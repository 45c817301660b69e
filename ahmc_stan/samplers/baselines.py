"""The baselines of Titsias & Dellaportas (2019, section 4): ``rwm`` and ``mala`` with an
isotropic proposal, ``am`` (adaptive Metropolis) and ``hmc`` with a fixed number of
leapfrog steps.  All adapt during warmup only.

* ``rwm`` / ``mala``: ``N(y | x, σ²I)`` / ``N(y | x + ½σ²∇log π(x), σ²I)``; log σ by
  Stan's dual averaging towards acceptance 0.234 / 0.574 (Roberts & Rosenthal 2001), from
  Stan's doubling/halving initial guess; σ is the averaged value after warmup.
* ``am`` (Haario, Saksman & Tamminen 2001): random walk with covariance
  ``λ²s_d(Σ̂ + δI)``, ``s_d = 2.38²/n``.  The mean and Σ̂ follow stochastic
  approximations ``Σ̂ ← (1 − γₜ)Σ̂ + γₜddᵀ``, ``d = xₜ − μ``, then ``μ ← μ + γ_μ d``,
  with the paper's rate ``γₜ = 0.001/(1 + t/4000)`` (section 4.2) and ``γ_μ = 0.01`` (the
  authors' code: a mean that keeps up with the chain's initial transient, which would
  otherwise inflate Σ̂); Σ̂'s Cholesky factor is updated by a rank-one update (O(n²)),
  and δI enters as a second independent Gaussian increment, so no factorisation of the
  sum is needed.  The initial proposal is the paper's ``(0.1/√n)²I``.  The global scale λ
  is dual-averaged towards acceptance 0.234 (AM with global adaptive scaling, Andrieu &
  Thoms 2008, Algorithm 4; the authors' code adapts one too): with λ = 1
  (``adapt_scale=False``, plain AM) on the 100-d Gaussian the transient inflates Σ̂ of the
  narrow coordinates, and after 2·10⁴ iterations the acceptance is 0.73 while Σ̂'s sd of
  the widest coordinate is still 6% of the true sd.
* ``hmc``: identity metric, ``num_steps`` leapfrog steps (required), ε by dual averaging
  towards 0.65 during warmup (:class:`~ahmc_stan.hmc.HMCKernel`, no jitter of L; ε
  jittered only if ``step_size_jitter`` is given).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import linalg

from ..hmc import HMCKernel, HMCParameters
from ..mh import MHParameters
from ..tuning.hmc_warmup import adapt_steps, check_stuck
from ..tuning.step_size import DualAveraging, initial_step_size
from ..tuning.stuck import DEFAULT_MAX_RESTARTS, WarmupRestarts, WarmupStuck
from .ahmc import HMC_STATS, _record
from .chain import ChainRecorder, ChainResult
from .metropolis import (MHStep, Proposal, Target, acceptance_probability,
                         langevin_log_q_ratio, propose, run_mh_chain)

__all__ = ["ScaleAdaptedProposal", "AdaptiveMetropolis", "cholesky_rank_one_update",
           "run_rwm", "run_mala", "run_am", "run_hmc"]


# ---- rwm, mala ---------------------------------------------------------------------------

class ScaleAdaptedProposal(Proposal):
    """Isotropic ``L = σ``, log σ dual-averaged towards ``adapt_delta``."""

    def __init__(self, scale: float, langevin: bool, adapt_delta: float):
        super().__init__(float(scale), langevin)
        self._averager = DualAveraging(float(scale), target=adapt_delta)

    def adapt(self, target: Target, step: MHStep) -> int:
        self.L = self._averager.update(step.accept_prob)
        return 0

    def end_warmup(self) -> None:
        self.L = self._averager.final

    def native_block(self, adapting: bool) -> MHParameters:
        if not adapting:
            return self.fixed_block()
        return MHParameters(1, self._averager.params_array(),
                           np.append(self._averager.state_array(), self.L),
                           langevin=self.langevin)

    def load_native(self, block: MHParameters) -> None:
        if block.adapt:
            self._averager.load_state_array(block.state[:5])
            self.L = self._averager.step_size = float(block.state[5])


def _initial_scale(target: Target, rng: np.random.Generator, x: np.ndarray,
                   langevin: bool, adapt_delta: float) -> float:
    """Stan's doubling/halving heuristic, with one proposal per trial scale."""
    lp, grad = target.gradient(x)

    def log_accept(scale):
        eps = rng.standard_normal(len(x))
        y = propose(x, scale, eps, grad if langevin else None)
        lp_y, grad_y = target.gradient(y)
        log_ratio = lp_y - lp
        if langevin and math.isfinite(lp_y):
            log_ratio += langevin_log_q_ratio(scale, eps, grad, grad_y)
        return math.log(max(acceptance_probability(log_ratio), 1e-300))

    return initial_step_size(log_accept, 1.0, adapt_delta)


def _run_isotropic(model, rng, x0, warmup, draws, progress, langevin, adapt_delta,
                   step_size, steps_per_draw) -> ChainResult:
    target = Target(model)
    if step_size is None:
        step_size = _initial_scale(target, rng, x0, langevin, adapt_delta)
    proposal = ScaleAdaptedProposal(step_size, langevin, adapt_delta)
    return run_mh_chain(target, rng, x0, warmup, draws, progress, proposal,
                        steps_per_draw=steps_per_draw)


def run_rwm(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
            progress: Callable[[int], None], *, adapt_delta: float = 0.234,
            step_size: float | None = None, steps_per_draw: int = 1) -> ChainResult:
    """Isotropic random-walk Metropolis; ``step_size`` is the initial σ (default:
    heuristic); ``steps_per_draw`` as in :func:`~ahmc_stan.samplers.metropolis.run_mh_chain`."""
    return _run_isotropic(model, rng, x0, warmup, draws, progress, False, adapt_delta,
                          step_size, steps_per_draw)


def run_mala(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
             progress: Callable[[int], None], *, adapt_delta: float = 0.574,
             step_size: float | None = None, steps_per_draw: int = 1) -> ChainResult:
    """Isotropic MALA; options as :func:`run_rwm`."""
    return _run_isotropic(model, rng, x0, warmup, draws, progress, True, adapt_delta,
                          step_size, steps_per_draw)


# ---- am ----------------------------------------------------------------------------------

def cholesky_rank_one_update(L: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Lower-triangular L' with ``L'L'ᵀ = LLᵀ + vvᵀ``, O(n²): Givens rotations of
    ``[Lᵀ; vᵀ]`` back to triangular form (``scipy.linalg.qr_insert``)."""
    n = len(v)
    _, r = linalg.qr_insert(np.eye(n), L.T, v, n, which="row", check_finite=False)
    r = r[:n]
    r *= np.where(np.diag(r) < 0, -1.0, 1.0)[:, None]  # rows with a positive diagonal
    return np.ascontiguousarray(r.T)


class AdaptiveMetropolis(Proposal):
    """``y = x + λ√s_d(L_Σ ε₁ + √δ ε₂)``, covariance ``λ²s_d(Σ̂ + δI)``; see the module
    docstring."""

    def __init__(self, dims: int, *, initial_scale: float | None = None,
                 learning_rate: float = 0.001, decay_iterations: float = 4000.0,
                 mean_rate: float = 0.01, regularization: float = 1e-8,
                 adapt_scale: bool = True, adapt_delta: float = 0.234):
        self.s_d = 2.38**2 / dims
        scale = 0.1 / math.sqrt(dims) if initial_scale is None else float(initial_scale)
        super().__init__(scale / math.sqrt(self.s_d) * np.eye(dims), langevin=False)  # L_Σ
        self.dims, self.delta = dims, float(regularization)
        self.learning_rate, self.decay = float(learning_rate), float(decay_iterations)
        self.mean_rate = float(mean_rate)
        self.mean: np.ndarray | None = None
        self.t = 0
        self.scale = 1.0  # λ
        self._averager = DualAveraging(1.0, target=adapt_delta) if adapt_scale else None

    @property
    def noise_dims(self) -> int:
        return 2 * self.dims

    def propose(self, x, grad_x, eps):
        n = self.dims
        return x + self.scale * math.sqrt(self.s_d) * (
            self.L @ eps[:n] + math.sqrt(self.delta) * eps[n:])

    def adapt(self, target: Target, step: MHStep) -> int:
        x = step.y if step.accepted else step.x  # the chain's new state
        if self.mean is None:
            self.mean = x.copy()
        self.t += 1
        gamma = self.learning_rate / (1 + self.t / self.decay)
        d = x - self.mean
        self.mean += self.mean_rate * d
        self.L = math.sqrt(1 - gamma) * cholesky_rank_one_update(
            self.L, math.sqrt(gamma / (1 - gamma)) * d)
        if self._averager is not None:
            self.scale = self._averager.update(step.accept_prob)
        return 0

    def end_warmup(self) -> None:
        if self._averager is not None and self._averager.counter:
            self.scale = self._averager.final

    def native_block(self, adapting: bool) -> MHParameters:
        averager = self._averager or DualAveraging(1.0)
        params = np.array([self.learning_rate, self.decay, self.mean_rate, self.delta,
                           self.s_d, float(self._averager is not None),
                           *averager.params_array()])
        state = np.array([self.t, self.scale, *averager.state_array()])
        self.L = np.ascontiguousarray(self.L, dtype=float)
        mean = np.zeros(self.dims) if self.mean is None else self.mean
        return MHParameters(3 if adapting else 0, params, state, chol=self.L, mean=mean,
                           am=True)

    def load_native(self, block: MHParameters) -> None:
        if not block.adapt:
            return
        self.t, self.scale = int(block.state[0]), float(block.state[1])
        if self.t:
            self.mean = block.mean
        if self._averager is not None:
            self._averager.load_state_array(block.state[2:])

    @property
    def step_size(self) -> float:
        return self.scale

    def extras(self) -> dict:
        cov = self.scale**2 * self.s_d * (self.L @ self.L.T
                                          + self.delta * np.eye(self.dims))
        return {"proposal_cholesky": np.linalg.cholesky(cov), "mean": self.mean,
                "scale": self.scale}


def run_am(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
           progress: Callable[[int], None], *, initial_scale: float | None = None,
           learning_rate: float = 0.001, decay_iterations: float = 4000.0,
           mean_rate: float = 0.01, regularization: float = 1e-8, adapt_scale: bool = True,
           adapt_delta: float = 0.234, steps_per_draw: int = 1) -> ChainResult:
    """Adaptive Metropolis: ``γₜ = learning_rate/(1 + t/decay_iterations)``, γ_μ =
    ``mean_rate``, δ =
    ``regularization``, initial proposal ``initial_scale²·I`` (0.1/√n); λ adapted towards
    ``adapt_delta`` unless ``adapt_scale=False`` (then λ = 1, Haario's plain AM)."""
    proposal = AdaptiveMetropolis(len(x0), initial_scale=initial_scale,
                                  learning_rate=learning_rate,
                                  decay_iterations=decay_iterations, mean_rate=mean_rate,
                                  regularization=regularization, adapt_scale=adapt_scale,
                                  adapt_delta=adapt_delta)
    return run_mh_chain(Target(model), rng, x0, warmup, draws, progress, proposal,
                        steps_per_draw=steps_per_draw)


# ---- hmc ---------------------------------------------------------------------------------

def run_hmc(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
            progress: Callable[[int], None], *, num_steps: int | None = None,
            adapt_delta: float = 0.65, step_size_jitter: float = 0.0,
            block_size: int = 100, max_restarts: int = DEFAULT_MAX_RESTARTS,
            detect_stuck: bool = True) -> ChainResult:
    """HMC-L: ``num_steps`` leapfrog steps (required), identity metric, ε dual-averaged
    towards the acceptance statistic ``adapt_delta`` (Stan's name; default 0.65) during
    warmup and fixed at its average afterwards.

    ``step_size_jitter`` = j > 0 uses ε·U(1 − j, 1 + j) in each iteration (Neal 2011,
    section 5.4.2.2; Stan's ``stepsize_jitter``).  With a fixed εL, a coordinate of scale
    σ with εL/σ near a multiple of π hardly moves (on the 100-d Gaussian of Titsias &
    Dellaportas, HMC-20's adapted ε gives εL/σ = 0.998π for σ = 0.1): the chain is then
    not ergodic, and jittering ε restores ergodicity.  The default 0 is the paper's HMC.

    ``max_restarts``, ``detect_stuck``: a chain stuck during warmup restarts it from a
    fresh initial point, as AHMC's scale phase does (:func:`~.ahmc.run_chain`,
    :mod:`ahmc_stan.tuning.stuck`); ``extras["restarts"]`` logs the restarts."""
    if not 0 < adapt_delta < 1:
        raise ValueError(f"adapt_delta must be in (0, 1), not {adapt_delta!r}")
    if num_steps is None or int(num_steps) < 1:
        raise ValueError("the hmc baseline needs num_steps=L, a positive number of "
                         "leapfrog steps (the paper uses 5, 10 or 20)")
    if not 0.0 <= step_size_jitter < 1.0:
        raise ValueError("step_size_jitter must be in [0, 1)")
    num_steps = int(num_steps)

    def jittered(step_size):
        if step_size_jitter == 0.0:
            return step_size
        return step_size * (1.0 + step_size_jitter * rng.uniform(-1.0, 1.0))

    kernel = HMCKernel(model.density)
    state = kernel.init(x0)
    rec = ChainRecorder(len(x0), warmup + draws, list(HMC_STATS))
    restarts = WarmupRestarts(max_restarts, detect_stuck)
    eps = math.nan
    with rec.running(warmup):
        averager = DualAveraging(kernel.initial_step_size(rng, state, None),
                                 target=adapt_delta)
        detector = restarts.detector(len(x0), averager.step_size)
        while rec.n < warmup:  # a block of iterations per call, ε adapted in C++
            state, steps = adapt_steps(
                kernel, rng, state, None, min(block_size - rec.n % block_size,
                                              warmup - rec.n), averager, 0.0, num_steps,
                0.0 if detector is None else detector.floor, jitter=False,
                step_jitter=step_size_jitter)
            _record(rec, steps.info, HMCParameters(steps.step_size, num_steps), phase=1)
            try:
                check_stuck(detector, steps, averager, rec.n - len(steps.step_size))
            except WarmupStuck as stuck:  # start the warmup afresh from a new point
                state = kernel.init(restarts.restart(stuck, rec, model, rng))
                averager = DualAveraging(kernel.initial_step_size(rng, state, None),
                                         target=adapt_delta)
                detector = restarts.detector(len(x0), averager.step_size)
            if rec.n % block_size == 0:
                progress(rec.n)
        eps = averager.final if warmup else averager.step_size
        rec.enter_sampling()
        params = HMCParameters(eps, num_steps, jitter=False)
        while rec.n < warmup + draws:
            if step_size_jitter:  # a fresh ε each iteration: one iteration per call
                params = HMCParameters(jittered(eps), num_steps, jitter=False)
                n_iter = 1
            else:
                n_iter = min(block_size, warmup + draws - rec.n)
            state, info = kernel.run(rng, state, params, n_iter)
            _record(rec, info, params, phase=2)
            if rec.n % block_size == 0 or rec.n == warmup + draws:
                progress(rec.n)
    return rec.finish({"step_size": eps, "num_steps": num_steps,
                       "restarts": restarts.records})
