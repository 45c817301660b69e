"""The Bayesian-optimisation tuner of adaptive HMC (AHMC).

Wang, Mohamed & de Freitas (ICML 2013), *Adaptive Hamiltonian and Riemann Manifold Monte
Carlo Samplers*, Section 3 and Algorithm 2.  The tuner is sampler-agnostic: it proposes a
parameter vector γ from a :class:`~.box.Box`, is told a scalar reward for the block run at
γ, and decides the next γ.  Per reward ``r_i`` observed at ``γ_i`` (``i = 1, 2, ...``):

1. augment the data ``D_i`` and the GP surrogate (:mod:`.gp`) with ``(γ_i, r_i)``;
2. if ``r_i`` is a new maximum, set the scale ``s = α / r_i`` (Alg. 2 lines 6–8);
3. draw ``u ~ U[0, 1)`` and the annealing probability ``p_i`` (Alg. 2 lines 9–10);
4. if ``u < p_i``: ``γ_{i+1} = argmax_γ u(γ)`` with the modified UCB (Section 3)
   ``u(γ) = s·μ_i(γ) + p_i·β_{i+1}^{1/2}·σ_i(γ)``; otherwise ``γ_{i+1} = γ_i``.

Conventions (documented choices where the paper is silent):

* **Where s enters.**  The GP is fitted to the *raw* rewards and the mean is multiplied by
  ``s``, exactly the paper's ``μ_i(γ, s) = kᵀ(K + σ_η² I)⁻¹ r_i s``.  Since the posterior
  mean is linear in the targets this is identical to fitting the GP to the *scaled* rewards
  ``s·r`` (best observed ↦ α = 4): the unit prior variance, the noise variance σ_η² and
  ``σ_i`` are all in scaled-reward units, which is what keeps the trade-off between
  ``s·μ`` and ``σ`` independent of the raw magnitude of the reward.
* **r ≤ 0.**  ``s`` starts at 1 and only a reward that is a new maximum *and* positive
  resets it (``s = α/r`` with ``r ≤ 0`` would be infinite or flip the sign of ``μ``).
  Normalised ESJD is ≥ 0, and a block with every proposal rejected gives exactly 0; until
  some block moves, ``μ ≡ 0`` on the data and the search is driven by ``σ`` alone.
  Rewards should therefore be ≥ 0 (the zero prior mean is "as good as the worst").
* **Indexing.**  :func:`beta_schedule` (t) returns ``β_t``; after ``i`` rewards the tuner
  uses ``β_{i+1}`` and ``p_i``, as in the paper.  ``β`` uses ``d = box.ndim``.
* **Non-finite rewards** raise ``ValueError``; mapping a failed block to a number is the
  caller's decision.

The thesis variant (Wang 2012, §3.3, Algorithm 3) plugs in through
``schedule="exponential"`` (``p_i = exp(−λ(i−1))``, λ = 0.01) and ``maximizer="direct"``;
the thesis acquisition has no scale (``ū = μ + p_i β^{1/2} σ``), obtained with
``alpha=None``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .box import Box
from .gp import DEFAULT_NOISE_VAR, GaussianProcess

__all__ = [
    "beta_schedule",
    "annealing_probability_ahmc",
    "annealing_probability_exponential",
    "ucb",
    "maximize_grid",
    "maximize_direct",
    "TunerRecord",
    "BayesOptTuner",
]

Acquisition = Callable[[np.ndarray], np.ndarray]
"""Maps unit-cube points ``(n, d)`` to acquisition values ``(n,)``."""


# --------------------------------------------------------------------------- pure functions
def beta_schedule(t: int | float, d: int, delta: float = 0.1) -> float:
    """GP-UCB exploration weight ``β_t = 2 log(t^{d/2+2} π² / (3δ))`` (Section 3).

    The paper uses ``β_{i+1}`` after ``i`` observations, i.e. ``beta_schedule(i + 1, d, δ)``.
    (Extraction 000 of the paper prints the exponent as ``d/2 + 2π²``; the thesis, §3.1,
    and Brochu et al.'s tutorial give ``t^{d/2+2} π²``, used here.)
    """
    if t < 1 or not 0 < delta < 1:
        raise ValueError("need t >= 1 and 0 < delta < 1")
    return 2.0 * ((d / 2.0 + 2.0) * math.log(t) + math.log(math.pi**2 / (3.0 * delta)))


def annealing_probability_ahmc(i: int, k: int = 100) -> float:
    """``p_i = (max{i − k + 1, 1})^{−1/2}`` (Algorithm 2 line 10); 1 for ``i ≤ k``."""
    if i < 1 or k < 1:
        raise ValueError("need i >= 1 and k >= 1")
    return float(max(i - k + 1, 1)) ** -0.5


def annealing_probability_exponential(i: int, lam: float = 0.01) -> float:
    """``p_i = exp(−λ (i − 1))`` (thesis, Wang 2012, §3.3; λ = 0.01)."""
    if i < 1 or lam <= 0:
        raise ValueError("need i >= 1 and lam > 0")
    return math.exp(-lam * (i - 1))


def ucb(mu, sigma, s: float, p: float, beta: float):
    """The modified UCB of Section 3: ``u = s·μ + p·sqrt(β)·σ`` (element-wise)."""
    return s * np.asarray(mu) + p * math.sqrt(beta) * np.asarray(sigma)


# --------------------------------------------------------------------------- maximisers
def maximize_grid(acq: Acquisition, box: Box, max_points: int = 20000, resolution: int = 200) -> np.ndarray:
    """``argmax`` of ``acq`` over the box's candidate grid (:meth:`Box.grid`); box units.

    Deterministic: ties go to the first grid point in C order.
    """
    g = box.grid(max_points, resolution)
    vals = np.asarray(acq(box.unit_grid(max_points, resolution)), dtype=float)
    vals = np.where(np.isfinite(vals), vals, -np.inf)
    return np.array(g[int(np.argmax(vals))])


def maximize_direct(acq: Acquisition, box: Box, maxfun: int = 2000, **kwargs: Any) -> np.ndarray:
    """``argmax`` of ``acq`` by DIRECT (:func:`scipy.optimize.direct`) on the unit cube; box units.

    Integer dimensions are rounded before each evaluation, so the maximiser searches the
    mixed box of Section 3.  An ``acq`` with a ``point`` attribute (``u ↦ value`` for one
    point ``(d,)``, as :meth:`BayesOptTuner.acquisition_function` gives) is evaluated
    through it.  Extra keyword arguments go to :func:`scipy.optimize.direct`
    (defaults here: ``maxfun=2000``, ``maxiter=10000``, ``locally_biased=True``).
    """
    kwargs.setdefault("maxiter", 10000)
    dims = [(d.low, d.width, d.integer) for d in box.dims]

    def snapped(u: np.ndarray) -> list[float]:
        """``box.to_unit(box.unit_to_box(u))`` for one point, in plain Python (DIRECT
        calls this thousands of times per maximisation)."""
        out = []
        for (low, width, integer), ui in zip(dims, u.tolist()):
            if width == 0:
                out.append(0.0)
                continue
            v = low + min(max(ui, 0.0), 1.0) * width
            out.append(((round(v) if integer else v) - low) / width)  # ties to even
        return out

    point = getattr(acq, "point", None)  # a single-point form of acq, if it has one

    def neg(u: np.ndarray) -> float:
        if point is not None:
            val = point(np.array(snapped(u)))
        else:
            val = float(np.asarray(acq(np.array([snapped(u)]))).ravel()[0])
        return -val if math.isfinite(val) else math.inf

    from scipy.optimize import direct  # here, not at import: scipy.optimize is slow to import

    res = direct(neg, [(0.0, 1.0)] * box.ndim, maxfun=maxfun, **kwargs)
    return box.unit_to_box(res.x)


# --------------------------------------------------------------------------- the tuner
@dataclass(frozen=True)
class TunerRecord:
    """One call of :meth:`BayesOptTuner.update`.

    ``gamma`` is γ_i (where ``reward`` was observed), ``p`` is p_i (0 once frozen), ``moved``
    says whether the bandit jumped to the acquisition maximiser (``u < p_i``), ``s`` is the
    scale after this reward, ``beta`` is β_{i+1}, ``next_gamma`` is γ_{i+1}.
    """

    i: int
    gamma: dict[str, Any]
    reward: float
    p: float
    moved: bool
    s: float
    beta: float
    next_gamma: dict[str, Any]


class BayesOptTuner:
    """Bayesian-optimisation bandit of AHMC (Algorithm 2), independent of any sampler.

    Usage::

        tuner = BayesOptTuner(box, seed=1)
        for block in range(n_blocks):
            gamma = tuner.propose()          # e.g. {"eps": 0.05, "L": 37}
            reward = run_block(**gamma)      # the caller's business
            tuner.update(gamma, reward)
        tuner.freeze()                       # stop adapting

    Parameters
    ----------
    box:
        The search box Γ.
    rng, seed:
        A :class:`numpy.random.Generator` (or anything :func:`numpy.random.default_rng`
        accepts) — give at most one of the two.  The only randomness is one ``U[0,1)`` draw
        per update, so the same seed gives the same sequence of proposals.
    k:
        Annealing delay of the AHMC schedule (``p_i = 1`` for ``i ≤ k``); paper: 100.
    alpha:
        Reward scale target, ``s = α / r_max``; paper: 4.  ``None`` disables scaling
        (``s ≡ 1``, the thesis acquisition).
    kappa:
        Kernel length scale as a fraction of each box width; paper: 0.2.
    delta:
        δ of ``β``; paper: 0.1.
    schedule:
        ``"ahmc"`` (paper), ``"exponential"`` (thesis, uses ``lam``) or a callable
        ``i ↦ p_i``.
    lam:
        λ of the exponential schedule; thesis: 0.01.
    maximizer:
        ``"grid"`` (default; the candidate grid of :meth:`Box.grid`), ``"direct"``
        (:func:`maximize_direct`) or a callable ``(acq, box) ↦ point in box units``.
    initial:
        γ_1; default the centre of the box.
    noise_var:
        GP observation-noise variance σ_η² in scaled-reward units (see module docstring
        and :data:`.gp.DEFAULT_NOISE_VAR`).
    grid_points, grid_resolution:
        Size cap and continuous resolution of the candidate grid.
    direct_maxfun:
        Evaluation budget of DIRECT per maximisation.
    """

    def __init__(
        self,
        box: Box,
        rng: np.random.Generator | int | None = None,
        *,
        seed: int | None = None,
        k: int = 100,
        alpha: float | None = 4.0,
        kappa: float = 0.2,
        delta: float = 0.1,
        schedule: str | Callable[[int], float] = "ahmc",
        lam: float = 0.01,
        maximizer: str | Callable[[Acquisition, Box], np.ndarray] = "grid",
        initial: Mapping[str, float] | None = None,
        noise_var: float = DEFAULT_NOISE_VAR,
        grid_points: int = 20000,
        grid_resolution: int = 200,
        direct_maxfun: int = 2000,
    ):
        if rng is not None and seed is not None:
            raise ValueError("give rng or seed, not both")
        if alpha is not None and alpha <= 0:
            raise ValueError("alpha must be positive (or None)")
        if kappa <= 0:
            raise ValueError("kappa must be positive")
        self.box = box
        self.rng = np.random.default_rng(seed if rng is None else rng)
        self.k, self.alpha, self.kappa, self.delta, self.lam = int(k), alpha, float(kappa), float(delta), float(lam)

        if callable(schedule):
            self._schedule = schedule
        elif schedule == "ahmc":
            annealing_probability_ahmc(1, self.k)  # validates k
            self._schedule = lambda i: annealing_probability_ahmc(i, self.k)
        elif schedule == "exponential":
            annealing_probability_exponential(1, self.lam)  # validates lam
            self._schedule = lambda i: annealing_probability_exponential(i, self.lam)
        else:
            raise ValueError(f"unknown schedule {schedule!r}")
        self.schedule = schedule

        if callable(maximizer):
            self._maximize = maximizer
        elif maximizer == "grid":
            self._maximize = lambda acq, b: maximize_grid(acq, b, grid_points, grid_resolution)
        elif maximizer == "direct":
            self._maximize = lambda acq, b: maximize_direct(acq, b, maxfun=direct_maxfun)
        else:
            raise ValueError(f"unknown maximizer {maximizer!r}")
        self.maximizer = maximizer

        # On the unit cube the paper's length scales κ(b_u − b_l) are κ in every dimension.
        self._gp = GaussianProcess(np.full(box.ndim, self.kappa), noise_var=noise_var)
        start = box.center() if initial is None else initial
        self._current: np.ndarray = box.snap(start)
        self._i = 0
        self._s = 1.0
        self._r_max = -math.inf
        self._frozen = False
        self._queued_u: list[float] = []  # uniforms drawn ahead by updates_until_move
        #: Seconds spent in :meth:`update_many` (the GP and the moves).
        self.seconds = 0.0
        self._mark_seconds: dict[str, float] = {}
        self._history: list[TunerRecord] = []
        #: name -> number of rewards received when the caller marked it (:meth:`mark`).
        self.marks: dict[str, int] = {}

    # ------------------------------------------------------------------ state
    @property
    def i(self) -> int:
        """Number of rewards received so far."""
        return self._i

    @property
    def gp(self) -> GaussianProcess:
        """The GP surrogate of the rewards (:mod:`.gp`)."""
        return self._gp

    @property
    def noise_var(self) -> float:
        """The GP's observation-noise variance σ_η²."""
        return self._gp.noise_var

    @property
    def history(self) -> list[TunerRecord]:
        """One :class:`TunerRecord` per reward received."""
        return self._history

    @property
    def s(self) -> float:
        """Current reward scale ``s`` (1 until the first positive reward; Alg. 2 line 7)."""
        return self._s

    @property
    def frozen(self) -> bool:
        return self._frozen

    def propose(self) -> dict[str, Any]:
        """γ for the next block (γ_{i+1}); does not change any state."""
        return self.box.to_dict(self._current)

    def acquisition(self, unit_points: np.ndarray, p: float | None = None) -> np.ndarray:
        """``u(γ) = s·μ_i(γ) + p·sqrt(β_{i+1})·σ_i(γ)`` at unit-cube points ``(n, d)``.

        ``p`` defaults to ``p_i`` of the last update (1 before any).
        """
        return self.acquisition_function(p)(unit_points)

    def acquisition_function(self, p: float | None = None) -> Acquisition:
        """:meth:`acquisition` with this moment's ``p``, β and ``s`` fixed (the GP's data
        must not change while it is used), with a ``point`` attribute for single points."""
        if p is None:
            p = self._schedule(max(self._i, 1))
        s = self._s
        weight = p * math.sqrt(beta_schedule(self._i + 1, self.box.ndim, self.delta))

        def acq(unit_points: np.ndarray) -> np.ndarray:
            mu, var = self.gp.predict(unit_points)
            return s * mu + weight * np.sqrt(var)

        predictors = []  # the GP's single-point form, made on first use (DIRECT's)

        def point(u: np.ndarray) -> float:
            if not predictors:
                predictors.append(self.gp.point_predictor())
            mu, var = predictors[0](u)
            return s * mu + weight * math.sqrt(var)

        acq.point = point
        return acq

    def update(self, gamma: Mapping[str, float], reward: float) -> None:
        """Record the reward of the block run at ``gamma`` and choose γ_{i+1} (Algorithm 2).

        ``gamma`` is normally what :meth:`propose` returned; it is clipped into the box and
        its integer dims rounded.  One ``U[0,1)`` draw is consumed unless frozen.
        """
        self.update_many(gamma, [reward])

    def update_many(self, gamma: Mapping[str, float], rewards: Sequence[float]) -> None:
        """The rewards of consecutive blocks all run at ``gamma``: exactly :meth:`update`
        called for each in turn (the same GP, uniforms, moves and history), with ``gamma``
        converted once and the GP given the rewards between two moves at once."""
        start = time.perf_counter()
        rewards = [float(r) for r in rewards]
        bad = [r for r in rewards if not math.isfinite(r)]
        if bad:
            raise ValueError(f"reward must be finite, got {bad[0]}")
        x = self.box.snap(gamma)
        unit = self.box.to_unit(x)
        at = self.box.to_dict(x)
        current = self.box.to_dict(self._current)
        pending: list[float] = []
        for reward in rewards:
            self._i += 1
            i = self._i
            pending.append(reward)                                     # line 5
            if reward > self._r_max:                                   # lines 6-8
                if reward > 0 and self.alpha is not None:
                    self._s = self.alpha / reward
                self._r_max = reward
            beta = beta_schedule(i + 1, self.box.ndim, self.delta)
            if self._frozen:
                p, moved = 0.0, False
            else:
                u = self._queued_u.pop(0) if self._queued_u else self.rng.random()  # line 9
                p = float(self._schedule(i))                               # line 10
                moved = bool(u < p)
                if moved:                                                  # line 12
                    self.gp.add_many(unit, pending)
                    pending = []
                    self._current = np.array(self.box.snap(self._maximize(
                        self.acquisition_function(p), self.box)), dtype=float)
                    current = self.box.to_dict(self._current)
                else:                                                      # line 14
                    self._current = np.array(x, dtype=float)
                    current = at
            self._history.append(TunerRecord(i=i, gamma=dict(at), reward=reward, p=p,
                                            moved=moved, s=self._s, beta=beta,
                                            next_gamma=dict(current)))
        if pending:
            self.gp.add_many(unit, pending)
        self.seconds += time.perf_counter() - start

    def updates_until_move(self, n: int) -> int:
        """How many of the next ``n`` updates run up to and including the first that will
        move γ (``n`` if none will, or if frozen).

        The uniforms those updates use are drawn now and queued, so the answer is exact and
        the proposals are the ones the tuner would make anyway: a sampler may run all those
        blocks at the current γ in one go and then report their rewards one by one.
        """
        if self._frozen:
            return n
        while len(self._queued_u) < n:
            self._queued_u.append(self.rng.random())
        for j in range(n):
            if self._queued_u[j] < self._schedule(self._i + 1 + j):
                return j + 1
        return n

    def mark(self, name: str) -> None:
        """Remember how many rewards have been received now, under ``name`` (e.g. the
        start of sampling), so the history can be split there."""
        self.marks[name] = self._i
        self._mark_seconds[name] = self.seconds

    def seconds_since(self, name: str) -> float | None:
        """:attr:`seconds` spent after the mark ``name`` (None if unmarked)."""
        return self.seconds - self._mark_seconds[name] if name in self.marks else None

    def moves_since(self, name: str) -> int | None:
        """Moves of γ made by the updates after the mark ``name`` (None if unmarked)."""
        if name not in self.marks:
            return None
        return sum(r.moved for r in self.history[self.marks[name]:])

    def history_table(self) -> dict[str, list]:
        """The history as a Fit's metadata keeps it, by column (``pandas.DataFrame``
        takes it as it is): per reward, ``i``, ``gamma_<name>`` of each dimension,
        ``reward``, ``p``, ``moved`` and ``s``.  Columns, not one dict per reward: a
        chain's table (600 rewards on the suite's defaults) is built and pickled back from
        its worker in a fraction of the time."""
        names = [d.name for d in self.box.dims]
        return {"i": [r.i for r in self.history],
                **{f"gamma_{k}": [r.gamma[k] for r in self.history] for k in names},
                "reward": [r.reward for r in self.history], "p": [r.p for r in self.history],
                "moved": [r.moved for r in self.history], "s": [r.s for r in self.history]}

    def best(self) -> dict[str, Any]:
        """The tried γ with the highest posterior mean (the current γ if nothing is observed)."""
        if self.gp.n_unique == 0:
            return self.propose()
        X = np.array(self.gp.inputs)  # writable: not the cached candidate grid
        mu = self.gp.predict(X, return_var=False)
        return self.box.from_unit(X[int(np.argmax(mu))])

    def freeze(self, to: str = "current") -> dict[str, Any]:
        """Stop adapting: from now on :meth:`propose` always returns one γ.

        ``to="current"`` keeps γ_{i+1} (what the annealed chain would use next);
        ``to="best"`` switches to :meth:`best`.  Later :meth:`update` calls are still
        recorded (with ``p = 0``, ``moved = False``) and still inform the GP.
        Returns the frozen γ.
        """
        if to == "best":
            self._current = self.box.snap(self.best())
        elif to != "current":
            raise ValueError("to must be 'current' or 'best'")
        self._frozen = True
        return self.propose()

    def unfreeze(self) -> None:
        """Resume adaptation with the schedule where it left off."""
        self._frozen = False
