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
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..metric import squared_jumps
from ..tuning import BayesOptTuner, Box, Dimension
from .chain import ChainRecorder

__all__ = ["TuningOptions", "as_box", "esjd_reward", "run_tuned_blocks", "tuning_extras"]


@dataclass(frozen=True)
class TuningOptions:
    """The tuner's constants (paper: k = 100, α = 4, κ = 0.2, δ = 0.1) and how it runs:
    ``block_size`` is m (default B/k, B the warmup iterations it tunes over); the
    acquisition is maximised over a grid of at most ``grid_points`` points
    (``grid_resolution`` step sizes × the values of L, thinned evenly; with the kernel's
    length scale at 0.2 of each box width, ~32 values per axis resolve the GP) or by DIRECT
    (``maximizer="direct"``); ``adapt_during_sampling=False`` freezes γ after warmup."""

    k: int = 100
    alpha: float = 4.0
    kappa: float = 0.2
    delta: float = 0.1
    block_size: int | None = None
    adapt_during_sampling: bool = True
    maximizer: str = "grid"
    grid_points: int = 1024
    grid_resolution: int = 32

    def make_tuner(self, box: Box, rng: np.random.Generator, initial=None) -> BayesOptTuner:
        return BayesOptTuner(box, rng=rng, k=self.k, alpha=self.alpha, kappa=self.kappa,
                             delta=self.delta, initial=initial, maximizer=self.maximizer,
                             grid_points=self.grid_points,
                             grid_resolution=self.grid_resolution)


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


def run_tuned_blocks(tuner: BayesOptTuner, rec: ChainRecorder,
                     run_block: Callable[[dict, int, int], tuple[np.ndarray, np.ndarray]],
                     reward: Callable[[np.ndarray, np.ndarray, dict], float], *,
                     warmup: int, draws: int, options: TuningOptions, chain_start: float,
                     progress: Callable[[int], None], callback: Callable | None = None,
                     seconds_per_call: float = 0.5) -> None:
    """Blocks from ``rec.n`` to ``warmup + draws`` iterations (phase 1 in warmup, 2 after).

    Consecutive blocks at which the tuner will not move γ (known in advance, see
    :meth:`BayesOptTuner.updates_until_move`) run in one ``run_block`` call of about
    ``seconds_per_call`` at most; each block's reward still reaches the tuner separately,
    so the algorithm is unchanged and only the Python overhead per block goes.
    """
    m = options.block_size or max(1, (warmup - rec.n) // options.k)
    seconds_per_iteration = 0.0
    while rec.n < warmup + draws:
        in_warmup = rec.n < warmup
        if not in_warmup and rec.sampling_start is None:
            rec.mark_sampling_start(chain_start)
            if not options.adapt_during_sampling:
                tuner.freeze()
        remaining = (warmup if in_warmup else warmup + draws) - rec.n
        affordable = int(seconds_per_call / seconds_per_iteration) if seconds_per_iteration else m
        n_blocks = tuner.updates_until_move(max(1, min(-(-remaining // m), affordable // m)))
        n_iter = min(n_blocks * m, remaining)
        gamma = tuner.propose()
        started = time.perf_counter()
        previous, positions = run_block(gamma, n_iter, 1 if in_warmup else 2)
        seconds_per_iteration = (time.perf_counter() - started) / n_iter
        if not tuner.frozen:
            for b in range(0, n_iter, m):
                before = previous if b == 0 else positions[b - 1]
                tuner.update(gamma, reward(before, positions[b:b + m], gamma))
        progress(rec.n)
        if callback is not None:
            callback(rec)


def tuning_extras(tuner: BayesOptTuner | None) -> dict:
    """The tuner's box and history (γ_i, r_i, p_i, moved) for the Fit's metadata."""
    if tuner is None:
        return {"box": None, "tuning_history": []}
    return {"box": [(d.name, d.low, d.high, d.integer) for d in tuner.box.dims],
            "gp": {"kappa": tuner.kappa, "noise_var": tuner.gp.noise_var},
            "tuning_history": [{"i": r.i, **{f"gamma_{k}": v for k, v in r.gamma.items()},
                                "reward": r.reward, "p": r.p, "moved": r.moved, "s": r.s}
                               for r in tuner.history]}
