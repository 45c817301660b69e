"""GP-bandit adaptive HMC with super-transitions and a pluggable, e.g. predictive, reward
(Wang 2012, MSc thesis, chapter 3, Algorithm 3).

Round i is one *super-transition* (§3.2): HMC at ``a_i = (ε_i, L_i)`` until a fixed budget
``B`` of leapfrog steps is spent, so that rounds at different settings cost the same; its
draws give the reward ``r_i``; the bandit — :class:`~ahmc_stan.tuning.BayesOptTuner` with
the thesis's choices: ``p_i = exp(−λ(i−1))``, λ = 0.01, the UCB ``μ + p_i β^½ σ`` without
a reward scale (``alpha=None``), length scales 0.2 of the box, DIRECT — picks ``a_{i+1}``
(in C++ where the model's library is ours, :class:`~ahmc_stan.tuning.NativeBayesOptTuner`;
``native=False`` or a BridgeStan-built library: scipy's DIRECT).  The loop is
:func:`.tuned_blocks.run_tuned_blocks` with one super-transition per block.

**Exact budget.**  A round is ``⌊B/L⌋`` HMC iterations of exactly ``L`` leapfrog steps and,
if ``B mod L > 0``, one iteration of ``B mod L`` steps (:func:`super_transition_steps`).
Every iteration is a complete HMC transition — fresh momentum, its ``L_r`` steps, a
Metropolis test at the end — whose ``L_r`` is fixed before it starts and does not depend
on the state, so each is reversible with respect to π and a round, a fixed composition of
them, leaves π invariant.  (Stopping a trajectory wherever a budget runs out and keeping
that point untested would not.)  ``jitter=True`` draws AHMC's ``L_r ~ U{1..L}`` instead,
the last cut to the remaining budget, again before and independently of the state.  The
thesis authors' code ran ``⌊B/L⌋`` iterations and dropped the remainder (ziyuw/AHMC,
``control.py``), so its rounds cost up to ``L − 1`` steps less than ``B``.

**Copies: one chain on a product space.**  The cross-validation reward (§3.2) needs the
model conditioned on each n − 1 of n folds — "a single Markov chain exploring the state
space which is a combination of n independent copies".  :class:`ProductHMC` advances every
copy each iteration with the same ε and ``L_r`` but its own momentum and its own
Metropolis test.  Its target is ``π_1 ⊗ … ⊗ π_n`` and its kernel the product of the
copies' HMC kernels; each factor is reversible with respect to its ``π_j``, so the product
kernel is reversible with respect to the product target.  One joint test on ``Σ_j ΔH_j``
would be valid as well, but its acceptance probability is about the product of the
copies' and so falls geometrically with n, and a bad trajectory of one copy would hold
back all others.  The factors act on disjoint coordinates and commute, so running one
copy's whole round, then the next copy's, is the same chain as interleaving them
iteration by iteration; each copy's round is then one or two C++ calls.

**Metric.**  Each copy gets its own inverse metric and reference step size ε* from AHMC's
scale phase (:mod:`.ahmc`: Stan's windowed adaptation and dual averaging), the analogue of
Neal's heuristic per-group step sizes that the thesis's ε multiplies; ε is shared in those
units, and the default box is AHMC's, around the median ε*.

Entry points: :func:`run_chain` (``tune_and_sample(model, sampler="bandit", ...)``) counts
iterations like every sampler; :func:`run_rounds` counts super-transitions, as the thesis.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..hmc import HMCKernel, HMCParameters
from ..metric import InvMetric, metric_record
from ..rewards import CrossValidation, fold_models
from ..tuning import BayesOptTuner
from .ahmc import HMC_STATS, _record, _scale_phase, default_box
from .chain import ChainRecorder, ChainResult
from .tuned_blocks import TuningOptions, as_box, esjd_reward, run_tuned_blocks, tuning_extras

__all__ = ["THESIS_TUNING", "super_transition_steps", "Round", "ProductHMC", "esjd_round",
           "BanditResult", "run_rounds", "run_chain"]

#: The tuner of the thesis (§3.1 footnote 2, §3.3, Algorithm 3); one super-transition per
#: bandit update.
THESIS_TUNING = dict(schedule="exponential", lam=0.01, alpha=None, kappa=0.2, delta=0.1,
                     maximizer="direct", block_size=1)

STATS = (*HMC_STATS, "round")


def super_transition_steps(budget: int, num_steps: int, rng: np.random.Generator | None = None,
                           jitter: bool = False) -> np.ndarray:
    """Leapfrog steps of each iteration of one super-transition; they sum to ``budget``
    exactly (module docstring): ``⌊B/L⌋`` × ``L`` and the remainder, or with ``jitter``
    draws of ``U{1..L}`` from ``rng``, the last one cut."""
    budget, num_steps = int(budget), int(num_steps)
    if budget < 1 or num_steps < 1:
        raise ValueError("need budget >= 1 and num_steps >= 1")
    if not jitter:
        full, rest = divmod(budget, num_steps)
        return np.array([num_steps] * full + ([rest] if rest else []), dtype=int)
    steps = np.zeros(0, dtype=int)
    while steps.sum() < budget:
        chunk = 2 * (budget - steps.sum()) // (num_steps + 1) + 8
        steps = np.concatenate([steps, rng.integers(1, num_steps, size=chunk, endpoint=True)])
    n = int(np.searchsorted(np.cumsum(steps), budget)) + 1
    steps = steps[:n]
    steps[-1] -= steps.sum() - budget
    return steps


@dataclass(frozen=True)
class Round:
    """One super-transition: its index, γ, the leapfrog steps of its iterations, and per
    copy the position before it and the positions after each iteration."""

    index: int
    gamma: dict
    steps: np.ndarray
    previous: list[np.ndarray]
    positions: list[np.ndarray]


class _GrowingRecorder(ChainRecorder):
    """A ChainRecorder without a fixed capacity (a run counted in super-transitions does
    not know its number of iterations in advance)."""

    def add(self, positions: np.ndarray, **stats) -> None:
        need = self.n + len(positions)
        if need > len(self.positions):
            size = max(need, 2 * len(self.positions))
            grown = np.empty((size, self.positions.shape[1]))
            grown[:self.n] = self.positions[:self.n]
            self.positions = grown
            self.stats = {k: np.concatenate([v, np.zeros(size - len(v))])
                          for k, v in self.stats.items()}
        super().add(positions, **stats)


class ProductHMC:
    """HMC on the product of independent targets (module docstring): copy j has its own
    model, state, inverse metric and recorder; every iteration uses the shared ε and
    ``L_r`` with per-copy momenta and Metropolis tests.

    ``capacity`` bounds the iterations of each copy (a fixed-size recorder; a round stops
    early when it is reached), ``None`` lets the recorders grow.
    """

    def __init__(self, models: Sequence, x0s: Sequence[np.ndarray], capacity: int | None,
                 adapt_delta: float = 0.8):
        if not 0 < adapt_delta < 1:
            raise ValueError(f"adapt_delta must be in (0, 1), not {adapt_delta!r}")
        self.adapt_delta = float(adapt_delta)
        self.models = list(models)
        self.kernels = [HMCKernel(m.density) for m in self.models]
        self.states = [k.init(x0) for k, x0 in zip(self.kernels, x0s, strict=True)]
        self.inv_metrics: list[InvMetric] = [None] * len(self.models)
        self.notes: list[dict] = [{} for _ in self.models]  # the scale phase's, per copy
        self.capacity = capacity
        self.recs = [ChainRecorder(m.dims, capacity, list(STATS), stream=j == 0)
                     if capacity is not None
                     else _GrowingRecorder(m.dims, 1024, list(STATS), stream=j == 0)
                     for j, m in enumerate(self.models)]  # copy 0 is the chain

    @property
    def room(self) -> float:
        return math.inf if self.capacity is None else self.capacity - self.recs[0].n

    def scale(self, rng: np.random.Generator, n_iter: int, metric: str,
              max_num_steps: int) -> list[float | None]:
        """AHMC's scale phase for each copy (a metric fallback switches in place rather
        than restarting the phase, since the rounds' layout is fixed, and is noted in
        ``notes[j]``); returns the reference step sizes ε*."""
        eps = []
        for j, (kernel, rec) in enumerate(zip(self.kernels, self.recs)):
            self.states[j], self.inv_metrics[j], e = _scale_phase(
                kernel, rng, self.states[j], n_iter, metric, rec, max_num_steps,
                adapt_delta=self.adapt_delta, notes=self.notes[j].update)
            eps.append(e)
        return eps

    def run(self, rng: np.random.Generator, step_size: float, steps: np.ndarray,
            phase: int, index: int, gamma: dict) -> Round:
        """The iterations ``steps`` (leapfrog steps of each) on every copy."""
        steps = steps[:int(min(len(steps), self.room))]
        previous, positions = [], []
        for j, (kernel, rec) in enumerate(zip(self.kernels, self.recs)):
            previous.append(self.states[j].position)
            blocks = []
            for n_steps, count in _runs(steps):  # one C++ call per run of equal L_r
                params = HMCParameters(step_size, n_steps, self.inv_metrics[j], jitter=False)
                self.states[j], info = kernel.run(rng, self.states[j], params, count)
                _record(rec, info, params, phase, round=index)
                blocks.append(info.positions)
            positions.append(np.concatenate(blocks) if blocks else
                             np.empty((0, len(previous[-1]))))
        return Round(index, dict(gamma), steps, previous, positions)


def _runs(steps: np.ndarray) -> list[tuple[int, int]]:
    """``(value, count)`` of each run of equal consecutive values."""
    if len(steps) == 0:
        return []
    cuts = np.flatnonzero(np.diff(steps)) + 1
    starts = np.concatenate([[0], cuts])
    counts = np.diff(np.concatenate([starts, [len(steps)]]))
    return [(int(steps[s]), int(c)) for s, c in zip(starts, counts)]


def esjd_round(inv_metrics: Sequence[InvMetric]) -> Callable[[Round], float]:
    """AHMC's reward ``ESJD/√L`` (:func:`.tuned_blocks.esjd_reward`) of a round, averaged
    over the copies."""
    def reward(rnd: Round) -> float:
        return float(np.mean([esjd_reward(p, x, int(rnd.gamma["num_steps"]), m)
                              for p, x, m in zip(rnd.previous, rnd.positions, inv_metrics)]))
    return reward


@dataclass
class BanditResult:
    """A run of :func:`run_rounds`: per copy a :class:`ChainResult` (warmup = the scale
    phase), the rounds' first rows, steps and γ, the tuner, metrics and ε*."""

    chains: list[ChainResult]
    round_starts: np.ndarray
    round_gammas: list[dict]
    tuner: BayesOptTuner
    inv_metrics: list[InvMetric]
    reference_step_sizes: list[float | None]
    extras: dict = field(default_factory=dict)


class _Clock:
    """What :func:`run_tuned_blocks` reads of a recorder, counting super-transitions or
    the first copy's iterations."""

    def __init__(self, product: ProductHMC, count_rounds: bool):
        self.product, self.count_rounds, self.rounds = product, count_rounds, 0

    @property
    def n(self) -> int:
        return self.rounds if self.count_rounds else self.product.recs[0].n

    @property
    def sampling_start(self):
        return self.product.recs[0].sampling_start

    def mark_sampling_start(self, chain_start: float) -> None:
        for rec in self.product.recs:
            rec.mark_sampling_start(chain_start)


def _bandit(product: ProductHMC, rng: np.random.Generator, clock: _Clock, reward, *,
            warmup: int, draws: int, budget: int | None, n_scale: int, metric: str, box,
            jitter: bool, max_num_steps: int, tune: bool, initial: dict | None,
            progress: Callable[[int], None], callback: Callable | None, tuning: dict):
    """Scale phase, then super-transitions under the bandit; returns the tuner, ε*, the
    rounds' (first row, γ) and the budget."""
    options = TuningOptions(**{**THESIS_TUNING, **tuning, "block_size": 1})
    eps_refs = product.scale(rng, n_scale, metric, max_num_steps)
    finite = [e for e in eps_refs if e is not None]
    eps_ref = float(np.median(finite)) if finite else None
    progress(clock.n)
    if box is None and eps_ref is None:
        raise ValueError("without a scale phase a box must be given")
    box = (default_box(eps_ref, max_num_steps) if box is None else
           as_box(box(eps_ref) if callable(box) else box))
    if callable(initial):
        initial = initial(eps_ref)
    elif initial is None and eps_ref is not None:
        initial = {"step_size": float(np.clip(eps_ref, box.dims[0].low, box.dims[0].high)),
                   "num_steps": int(np.clip(round(math.pi / eps_ref), box.dims[1].low,
                                            box.dims[1].high))}
    tuner = options.make_tuner(box, rng, initial, density=product.models[0].density)
    if not tune:
        tuner.freeze()
    budget = int(budget) if budget is not None else 5 * int(box.dims[1].high)
    reward = reward(product) if reward is not None else esjd_round(product.inv_metrics)
    starts, gammas = [], []

    def run_block(gamma, n_rounds, phase):
        done = []
        for _ in range(n_rounds):
            if product.room <= 0:
                break
            steps = super_transition_steps(budget, int(gamma["num_steps"]), rng, jitter)
            starts.append(product.recs[0].n)
            gammas.append(dict(gamma))
            done.append(product.run(rng, float(gamma["step_size"]), steps, phase,
                                    len(starts), gamma))
            clock.rounds += 1
        return None, done

    run_tuned_blocks(tuner, clock, run_block,  # one round per block (block_size 1)
                     lambda _, rounds, __, ___: [reward(r) for r in rounds],
                     warmup=warmup, draws=draws, options=options,
                     chain_start=time.perf_counter(), progress=progress, callback=callback,
                     unit_steps=lambda gamma: budget)
    return tuner, eps_refs, np.array(starts, dtype=int), gammas, budget


def run_rounds(models: Sequence, rng: np.random.Generator, x0s: Sequence[np.ndarray],
               rounds: int, budget: int, *, reward: Callable | None = None,
               scale_iterations: int = 500, metric: str = "diag", box=None,
               jitter: bool = False, tune: bool = True, initial: dict | None = None,
               max_num_steps: int = 1000, progress: Callable[[int], None] | None = None,
               callback: Callable | None = None, adapt_delta: float = 0.8,
               **tuning) -> BanditResult:
    """Algorithm 3 on the product of ``models`` (one each: start ``x0s``): the scale phase
    (``scale_iterations`` per copy), then ``rounds`` super-transitions of ``budget``
    leapfrog steps per copy.

    ``reward(product) -> (Round -> float)`` builds the reward once the metrics are known
    (default: :func:`esjd_round`; cross-validation over all copies:
    ``lambda product: lambda rnd: cv(rnd.positions)`` with ``cv`` a
    :class:`~ahmc_stan.rewards.CrossValidation`).
    ``box`` and ``initial`` (γ_1) may be functions of the median ε*.  ``tune=False``
    freezes the bandit at ``initial`` (hand-set HMC with the same super-transitions).
    ``tuning`` overrides :data:`THESIS_TUNING`.
    """
    product = ProductHMC(models, x0s, None, adapt_delta)
    clock = _Clock(product, count_rounds=True)
    start = time.perf_counter()
    tuner, eps_refs, starts, gammas, budget = _bandit(
        product, rng, clock, reward, warmup=rounds, draws=0, budget=budget,
        n_scale=scale_iterations, metric=metric, box=box, jitter=jitter,
        max_num_steps=max_num_steps, tune=tune, initial=initial,
        progress=progress or (lambda n: None), callback=callback, tuning=tuning)
    extras = {"budget": budget, "inv_metric": None, **tuning_extras(tuner)}
    chains = [rec.result(scale_iterations, start,
                         {**extras, "inv_metric": metric_record(m),
                          "metric_fallback": notes.get("metric_fallback")})
              for rec, m, notes in zip(product.recs, product.inv_metrics, product.notes)]
    return BanditResult(chains, starts, gammas, tuner, product.inv_metrics, eps_refs, extras)


def run_chain(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
              progress: Callable[[int], None], *, reward: str | None = None, budget: int | None = None,
              folds: int = 8, case_vars: Sequence[str] | None = None, n_var: str = "N",
              suffix: str = "_test", prediction: str | None = None, target: str | None = None,
              loss: str | Callable = "mse", reward_unit: float = 0.1, metric: str = "diag",
              box=None, scale_fraction: float | None = None, jitter: bool = False,
              max_num_steps: int = 1000, callback: Callable | None = None,
              adapt_delta: float = 0.8, **tuning) -> ChainResult:
    """One chain of ``tune_and_sample(model, sampler="bandit", ...)``: ``warmup`` then
    ``draws`` HMC iterations of ``model`` in super-transitions of ``budget`` leapfrog
    steps (default 5 × the box's largest L, the thesis's 24000/5020), tuned by the thesis's
    bandit (:data:`THESIS_TUNING`; ``tuning`` overrides) during warmup and, annealed,
    after it.  A super-transition may straddle the end of warmup; the last one stops when
    the chain is full.

    ``reward`` (default: ``"cv"`` when ``case_vars``, ``prediction`` and ``target`` are
    given, else ``"esjd"``, so that the default runs on any model).
    ``reward="esjd"``: AHMC's normalised ESJD of the model's chain (with ``alpha=4`` unless
    given, since its scale is arbitrary).  ``reward="cv"``: ``folds`` copies of the model,
    each conditioned on the other folds of the per-case data ``case_vars`` (counted by
    ``n_var``; the held-out fold becomes ``v + suffix``, see
    :func:`~ahmc_stan.rewards.fold_data`), run alongside the model's own chain with the
    same (ε, L_r); a round's reward is minus the mean ``loss`` ("mse" or
    "classification") of the generated quantity ``prediction`` against the held-out data
    variable ``target`` (:class:`~ahmc_stan.rewards.CrossValidation`).  The Fit holds the
    model's own chain; the folds' chains are not kept, but their work is: ``n_grad`` of
    each iteration is the gradients of every copy (the model's own are ``n_grad_own``),
    so ESS per gradient charges the reward's copies to the sampler.

    ``scale_fraction`` of warmup (default 1/2, 0 with ``metric="identity"`` and a box)
    is AHMC's scale phase, whose dual averaging aims at ``adapt_delta``.
    """
    cv_inputs = {"case_vars": case_vars, "prediction": prediction, "target": target}
    if reward is None:
        given = [k for k, v in cv_inputs.items() if v]
        if given and len(given) < len(cv_inputs):
            raise ValueError("the cross-validation reward needs case_vars, prediction and "
                             f"target; only {', '.join(given)} given")
        reward = "cv" if given else "esjd"
    if reward == "esjd":
        models, make_reward = [model], None
        tuning.setdefault("alpha", 4.0)
    elif reward == "cv":
        if not (case_vars and prediction and target):
            raise ValueError('reward="cv" needs case_vars, prediction and target')
        fold_copies, targets = fold_models(model, folds, case_vars=case_vars, n_var=n_var,
                                           suffix=suffix, target=target)
        models = [model, *fold_copies]
        cv = CrossValidation(fold_copies, targets, prediction, loss=loss, unit=reward_unit,
                             rng=np.random.default_rng(rng.integers(2**63)))
        make_reward = lambda product: (lambda rnd: cv(rnd.positions[1:]))
    else:
        raise ValueError(f'reward must be "cv" or "esjd", not {reward!r}')
    if scale_fraction is None:
        scale_fraction = 0.0 if (metric == "identity" and box is not None) else 0.5
    n_scale = int(round(scale_fraction * warmup))
    product = ProductHMC(models, [x0] * len(models), warmup + draws, adapt_delta)
    clock = _Clock(product, count_rounds=False)
    start = time.perf_counter()
    tuner = None
    try:
        tuner, eps_refs, starts, _, budget = _bandit(
            product, rng, clock, make_reward, warmup=warmup, draws=draws, budget=budget,
            n_scale=n_scale, metric=metric, box=box, jitter=jitter,
            max_num_steps=max_num_steps, tune=True, initial=None, progress=progress,
            callback=callback, tuning=tuning)
    except KeyboardInterrupt:
        for rec in product.recs:
            rec.interrupted = True
    rec = product.recs[0]
    rec.stats["n_grad_own"] = rec.stats["n_grad"].copy()
    for other in product.recs[1:]:  # every copy's gradients are the chain's cost
        n = min(rec.n, other.n)
        rec.stats["n_grad"][:n] += other.stats["n_grad"][:n]
    phase = rec.stats["phase"]
    phase[n_scale:warmup], phase[warmup:rec.n] = 1, 2  # a round may straddle warmup's end
    if rec.sampling_start is None and rec.n >= warmup:
        rec.mark_sampling_start(start)
    extras = {"inv_metric": metric_record(product.inv_metrics[0]),
              "reference_step_size": None if tuner is None else eps_refs[0],
              "budget": None if tuner is None else budget,
              "round_starts": [] if tuner is None else starts.tolist(),
              "copies": len(models),
              "metric_fallback": product.notes[0].get("metric_fallback"),
              **tuning_extras(tuner)}
    if reward == "cv":
        extras["cv_errors"] = list(cv.errors)
    return rec.result(warmup, start, extras)
