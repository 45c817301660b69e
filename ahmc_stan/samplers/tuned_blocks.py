"""The outer loop of Algorithm 2 (Wang, Mohamed & de Freitas 2013), for any sampler whose
parameters γ the Bayesian-optimisation tuner chooses: run a block of m iterations at γ_i,
hand the block's reward to the tuner, repeat — through warmup and, with vanishing
probability of moving (infinite adaptation), through sampling.

A sampler supplies ``run_block(gamma, n_iter, phase) -> (previous, positions)`` (it runs
and records the iterations; ``previous`` is the position before the block) and a reward;
AHMC, ARMHMC and OHMC share this loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..metric import squared_jumps
from ..tuning import BayesOptTuner, Box, Dimension, NativeBayesOptTuner
from .chain import ChainRecorder

__all__ = ["TuningOptions", "as_box", "esjd_reward", "esjd_block_rewards", "run_tuned_blocks",
           "next_phase", "tuning_extras", "call_iterations"]


#: A call into C++ runs at most this share of a chain's iterations, so that progress
#: (a line every 10 % outside a terminal), callbacks and Ctrl-C come at least as often.
CALL_SHARE = 0.1


def call_iterations(warmup: int, draws: int) -> int:
    """The most iterations one call into C++ runs in a chain of ``warmup + draws``."""
    return max(1, math.ceil(CALL_SHARE * (warmup + draws)))


@dataclass(frozen=True)
class TuningOptions:
    """The tuner's constants (paper: k = 100, α = 4, κ = 0.2, δ = 0.1) and how it runs:
    ``block_size`` is m (default B/k, B the warmup iterations it tunes over); the
    acquisition is maximised over a grid of at most ``grid_points`` points
    (``grid_resolution`` step sizes × the values of L, thinned evenly; with the kernel's
    length scale at 0.2 of each box width, ~32 values per axis resolve the GP) or by DIRECT
    (``maximizer="direct"``); ``adapt_during_sampling=False`` freezes γ after warmup.
    ``schedule``/``lam`` and ``alpha=None`` select the thesis variant (Wang 2012, §3.3:
    ``p_i = exp(−λ(i−1))``, no reward scale), see :class:`BayesOptTuner`.

    Annealing.  With ``m = B/k`` warmup holds exactly k blocks, so the paper's
    ``p_i = max(i − k + 1, 1)^{−1/2}`` is 1 for all of warmup and sampling would start at
    full exploration.  By default the decay starts after ``anneal_start·k`` blocks
    (``p_i = max(i − ⌈anneal_start·k⌉ + 1, 1)^{−1/2}``; 0.5: p ≈ 0.14 when sampling starts,
    about 12 moves in the second half of warmup), while m stays B/k;
    ``anneal_start=1`` is the paper's exact schedule.  A frozen tuner
    (``adapt_during_sampling=False``) keeps the GP's best γ, the tried point with the
    highest posterior mean, not its last (fully exploring) pick."""

    k: int = 100
    alpha: float | None = 4.0
    kappa: float = 0.2
    delta: float = 0.1
    block_size: int | None = None
    adapt_during_sampling: bool = True
    maximizer: str = "grid"
    grid_points: int = 1024
    grid_resolution: int = 32
    #: Blocks the tuner will not move between run in one call of at most about this many
    #: leapfrog steps (deterministic, so the same seed gives the same draws).
    max_call_steps: int = 20000
    schedule: str = "ahmc"
    lam: float = 0.01
    anneal_start: float = 0.5
    #: The tuner in C++ (:class:`~ahmc_stan.tuning.native_tuner.NativeBayesOptTuner`)
    #: where the model's library has it (grid or DIRECT); with the grid AHMC then runs its
    #: blocks and the tuner's moves in one call.  ``False``: the Python tuner.
    native: bool = True

    def __post_init__(self):
        if not 0 < self.anneal_start <= 1:
            raise ValueError(f"anneal_start must be in (0, 1], not {self.anneal_start!r}")

    def make_tuner(self, box: Box, rng: np.random.Generator, initial=None,
                   density=None) -> BayesOptTuner:
        """The tuner; in C++ (:attr:`native`) when ``density`` (a
        :class:`~ahmc_stan.native.NativeDensity`) has it."""
        delay = max(1, math.ceil(self.anneal_start * self.k))
        common = dict(rng=rng, k=delay, alpha=self.alpha, kappa=self.kappa, delta=self.delta,
                      initial=initial, schedule=self.schedule, lam=self.lam,
                      grid_points=self.grid_points, grid_resolution=self.grid_resolution)
        if (self.native and self.maximizer in ("grid", "direct") and density is not None
                and density.native and self.schedule in ("ahmc", "exponential")):
            return NativeBayesOptTuner(density, box, maximizer=self.maximizer, **common)
        return BayesOptTuner(box, maximizer=self.maximizer, **common)


def as_box(box) -> Box:
    """A ``Box``, or ``((eps_low, eps_high), (L_low, L_high))`` for (step_size, num_steps)."""
    if isinstance(box, Box):
        return box
    (e_lo, e_hi), (l_lo, l_hi) = box
    return Box([Dimension("step_size", e_lo, e_hi),
                Dimension("num_steps", l_lo, l_hi, integer=True)])


def esjd_reward(previous: np.ndarray, positions: np.ndarray, num_steps: int,
                inv_metric) -> float:
    """``r = ESJD / sqrt(L)`` of a block (section 3.1): the mean squared jump over the
    block's m transitions, the first from the state before the block, in the metric's norm
    ``‖Δx‖²_M`` (Euclidean for the identity metric, as in the paper)."""
    jumps = squared_jumps(np.vstack([previous, positions]), inv_metric)
    return float(np.mean(jumps) / math.sqrt(num_steps))


def esjd_block_rewards(previous: np.ndarray, positions: np.ndarray, num_steps: int,
                       inv_metric, m: int) -> np.ndarray:
    """:func:`esjd_reward` of each consecutive block of ``m`` rows of ``positions`` (the
    last may be shorter), the jumps computed once for all of them."""
    jumps = squared_jumps(np.vstack([previous, positions]), inv_metric)
    starts = np.arange(0, len(jumps), m)
    counts = np.diff(np.append(starts, len(jumps)))
    return np.add.reduceat(jumps, starts) / counts / math.sqrt(num_steps)


def run_tuned_blocks(tuner: BayesOptTuner, rec: ChainRecorder,
                     run_block: Callable[[dict, int, int], tuple[np.ndarray, np.ndarray]],
                     rewards: Callable[[np.ndarray, Sequence, dict, int], Sequence[float]],
                     *, warmup: int, draws: int, options: TuningOptions, chain_start: float,
                     progress: Callable[[int], None], callback: Callable | None = None,
                     unit_steps: Callable[[dict], float] | None = None,
                     end: int | None = None) -> None:
    """Blocks from ``rec.n`` to ``warmup + draws`` iterations, or to ``end`` (phase 1 in
    warmup, 2 after).

    Consecutive blocks at which the tuner will not move γ (known in advance, see
    :meth:`BayesOptTuner.updates_until_move`) run in one ``run_block`` call of at most
    ``options.max_call_steps`` leapfrog steps, a unit at γ costing ``unit_steps(γ)``
    (default the mean ``(L + 1)/2`` of ``L_r ~ U{1..L}``); each block's reward still
    reaches the tuner separately, so the algorithm is unchanged and only the Python
    overhead per block goes.  The cap is a count, not a measured time: how iterations are
    grouped decides the order of the random draws, so it must not depend on timing.

    ``run_block`` returns one entry of ``positions`` per unit it ran, and may return fewer
    than asked when the chain is full; ``rewards(previous, positions, γ, m)`` returns the
    reward of each of the call's blocks of ``m`` units (AHMC: :func:`esjd_block_rewards`).
    A unit is an iteration for AHMC; for the GP bandit
    (:mod:`.bandit`, ``block_size=1``) it is a whole super-transition, and ``rec.n``
    counts super-transitions or the chain's iterations.
    """
    m = options.block_size or max(1, (warmup - rec.n) // options.k)
    end = warmup + draws if end is None else end
    while rec.n < end:
        in_warmup = next_phase(tuner, rec, warmup, options, chain_start)
        remaining = min(end, warmup if in_warmup else warmup + draws) - rec.n
        gamma = tuner.propose()
        per_unit = (unit_steps(gamma) if unit_steps is not None
                    else (int(gamma.get("num_steps", 1)) + 1) / 2)
        affordable = max(m, int(options.max_call_steps / max(per_unit, 1e-12)))
        n_blocks = tuner.updates_until_move(max(1, min(-(-remaining // m), affordable // m)))
        n_iter = min(n_blocks * m, remaining)
        previous, positions = run_block(gamma, n_iter, 1 if in_warmup else 2)
        if not tuner.frozen:
            tuner.update_many(gamma, rewards(previous, positions, gamma, m))
        progress(rec.n)
        if callback is not None:
            callback(rec)


def next_phase(tuner: BayesOptTuner, rec: ChainRecorder, warmup: int,
               options: TuningOptions, chain_start: float) -> bool:
    """Whether the chain's next iteration is a warmup one; at the first sampling
    iteration, marks the start of sampling (the recorder's clock, the tuner's history) and
    freezes the tuner at its best γ unless it adapts during sampling."""
    if rec.n < warmup:
        return True
    if rec.sampling_start is None:
        rec.mark_sampling_start(chain_start)
        tuner.mark("sampling")
        if not options.adapt_during_sampling:
            tuner.freeze(to="best")
    return False


def tuning_extras(tuner: BayesOptTuner | None) -> dict:
    """The tuner's box and history (γ_i, r_i, p_i, moved; by column:
    :meth:`~ahmc_stan.tuning.BayesOptTuner.history_table`) for the Fit's metadata,
    ``gamma_moves_sampling``: how often γ moved during sampling (None if sampling did not
    start), and the seconds the tuner took (``tuner_seconds``; in sampling,
    ``tuner_seconds_sampling``)."""
    if tuner is None:
        return {"box": None, "tuning_history": {}, "gamma_moves_sampling": None}
    return {"box": [(d.name, d.low, d.high, d.integer) for d in tuner.box.dims],
            "gamma_moves_sampling": tuner.moves_since("sampling"),
            "gp": {"kappa": tuner.kappa, "noise_var": tuner.noise_var},
            "tuner_seconds": tuner.seconds,
            "tuner_seconds_sampling": tuner.seconds_since("sampling"),
            "tuning_history": tuner.history_table()}
