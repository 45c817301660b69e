"""AHMC: HMC whose step size ε and number of leapfrog steps L are tuned by Bayesian
optimisation (Wang, Mohamed & de Freitas 2013, section 3, Algorithm 2).

One chain runs in two warmup phases and a sampling phase:

1. **Scale** (skipped when ``metric="identity"`` and a ``box`` is given, the paper's
   setting): HMC at a path length of about one unit with Stan's step-size dual averaging,
   and — for ``metric="diag"`` or ``"dense"`` — Stan's windowed estimation of the inverse
   metric (``metric="fisher"``: in the same windows, the diagonal estimate from draws and
   gradients, :func:`~ahmc_stan.tuning.windows.fisher_inv_metric`; ``"low_rank"``: that
   diagonal corrected in the directions where the draws and gradients say it is off,
   :func:`~ahmc_stan.tuning.windows.low_rank_inv_metric`; the default ``"auto"`` is
   ``"low_rank"`` where the phase's last window has at least as many draws as there are
   parameters and ``"diag"`` beyond).  Its end product is the metric and a reference step size ε*.  This phase takes
   ``scale_fraction`` of warmup (default 1/2 with a metric to adapt, 1/5 otherwise).
2. **Bayesian optimisation** over the box Γ of (ε, L) with the metric now fixed, so the
   tuner never chases a moving target: blocks of ``m = B/k`` iterations at γ_i, each with
   ``L_r ~ Uniform{1..L}``; the reward of a block is ``ESJD/sqrt(L)``, ESJD the mean
   squared jump ``‖x_{t+1} − x_t‖²_M`` measured in the adapted metric's norm (plain
   Euclidean with the identity metric, as in the paper), so that coordinates on large
   scales do not drown the others.
   A chain whose draws in this phase show rejections concentrated in a parameter's
   tail re-adapts ε* at ``adapt_delta=0.95`` and restarts the tuner in [ε*/4, ε*]
   (:func:`run_tuned_chain`, ``tail_check``).
3. **Sampling**, by default with the paper's *infinite adaptation*: the tuner keeps running
   with vanishing probability p_i of moving; ``adapt_during_sampling=False`` freezes it at
   its current γ.

Default box (when ``box`` is not given): ε ∈ [ε*/4, 1.5 ε*] (the top set by
``max_step_ratio``) and L ∈ {2..L_max} with
``L_max = clip(ceil(2π/ε*), 10, max_num_steps)``, so that the mean path ``εL/2`` can reach
half a period (π) of a unit-scale Gaussian direction at the reference step size.  L = 1,
a single leapfrog step (MALA), is left out (``min_num_steps=1`` lets it in): the reward
ranks it close to L = 2 where it mixes about half as fast per gradient
(``comparisons/min_steps.py``), so on models of a few parameters the tuner could settle
there.

Where it runs: phase 1 a metric window per call into C++ (``ahmc_hmc_adapt_block``);
phases 2 and 3, blocks, rewards and the tuner's moves together, in calls of up to a tenth
of the chain (:func:`run_native_tuned_blocks`, the tuner in C++:
:class:`~ahmc_stan.tuning.native_tuner.NativeBayesOptTuner`).  ``native=False`` keeps
the Python tuner (the reference), with a call into C++ per move.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np

from ..hmc import HMCKernel, HMCParameters
from ..metric import from_record, metric_record
from ..tuning import Box, Dimension, NativeBayesOptTuner
from ..tuning.tail_rejection import tail_rejections
from ..tuning.stuck import DEFAULT_MAX_RESTARTS, WarmupRestarts, WarmupStuck
from ..tuning.hmc_warmup import METRICS, MetricFallback, auto_metric, hmc_warmup
from ..tuning.fast_warmup import TUNING as FAST_TUNING
from .chain import ChainRecorder, ChainResult
from .tuned_blocks import (TuningOptions, as_box, esjd_block_rewards, esjd_reward,
                           call_iterations, next_phase, run_tuned_blocks,
                           tuning_extras)

__all__ = ["run_chain", "continue_chain", "run_tuned_chain", "hmc_blocks",
           "run_native_tuned_blocks", "default_box", "esjd_reward"]


#: The names of γ = (ε, L) in AHMC's box.
GAMMA = ("step_size", "num_steps")
#: The tail check (:func:`run_tuned_chain`): the acceptance statistic its step-size
#: adaptation aims at (that of the fit's second rerun, ``sampling.RERUN_STEPS``) ...
TAIL_ADAPT_DELTA = 0.95
#: ... the fewest tuning-phase iterations with which it runs, and the fewest draws it
#: tests at once (a tail of 10 %: 10 draws).
TAIL_CHECK_MIN_TUNING = 200
TAIL_CHECK_MIN_DRAWS = 100
#: The tail's rejection rate over the central half's that the chain's test asks for:
#: above the diagnosis's 2.5 (``tuning.tail_rejection.TAIL_REJECTION_RATIO``), since a
#: chain tests about 20 draws per tail where the diagnosis pools 400 (README, "A tail
#: check inside the chains").  The central half's rate is taken at the same step sizes
#: (the window's transitions split at its median ε): the tuner's blocks of large steps
#: reject wherever the chain spends them.
TAIL_CHECK_RATIO = 3.5


def default_box(reference_step_size: float, max_num_steps: int = 1000,
                min_num_steps: int = 1, high: float = 1.5) -> Box:
    """Γ derived from the reference step size ε* (see the module docstring), ε up to
    ``high`` ε*, L from ``min_num_steps`` (at most ``L_max``)."""
    eps = reference_step_size
    l_max = int(np.clip(math.ceil(2 * math.pi / eps), 10, max_num_steps))
    return Box([Dimension(GAMMA[0], eps / 4, high * eps),
                Dimension(GAMMA[1], min(max(1, min_num_steps), l_max), l_max,
                          integer=True)])


HMC_STATS = ("step_size", "num_steps_max", "num_steps", "energy", "lp")


def _record(rec: ChainRecorder, info, params: HMCParameters, phase: int, **extra) -> None:
    """Record a block; a kernel with more per-iteration statistics (RMHMC's Hessian
    counts) exposes them as ``info.extra_stats``."""
    extra = {**getattr(info, "extra_stats", {}), **extra}
    rec.add(info.positions, accept_stat=info.acceptance_rate, n_grad=info.num_grad,
            divergent=info.is_divergent, step_size=params.step_size,
            num_steps_max=params.num_steps, num_steps=info.num_steps, energy=info.energy,
            lp=info.logdensity, phase=phase, **extra)


def _scale_phase(kernel, rng, state, n_iter, metric, rec, max_num_steps, restarts=None,
                 adapt_delta: float = 0.8, progress: Callable[[int], None] | None = None,
                 notes: Callable[[dict], None] | None = None,
                 call_iterations: int | None = None, call_grads: float = math.inf,
                 grad_init: bool = False, path_length: float = 2.0, phase: int = 0,
                 restart: bool = False, pool=None, shorten=None):
    """Phase 1 (:func:`~ahmc_stan.tuning.hmc_warmup.hmc_warmup`), recorded in ``rec`` as
    ``phase`` (0; the tail check's step-size adaptation records 1); ``progress(rec.n)``
    after every call into the kernel; ``notes``, ``call_iterations``, ``call_grads``,
    ``grad_init``, ``path_length``, ``restart``, ``pool`` and ``shorten`` as
    ``hmc_warmup``'s.
    Returns (state, inverse metric, ε*)."""
    def record(steps):
        _record(rec, steps.info, HMCParameters(steps.step_size, steps.num_steps_max),
                phase=phase)

    return hmc_warmup(kernel, rng, state, n_iter, metric, record,
                      max_num_steps=max_num_steps, adapt_delta=adapt_delta,
                      restarts=restarts, notes=notes,
                      call_iterations=call_iterations, call_grads=call_grads,
                      grad_init=grad_init, path_length=path_length, restart=restart,
                      pool=pool, shorten=shorten,
                      progress=None if progress is None else lambda: progress(rec.n))


def hmc_blocks(kernel: HMCKernel, rng: np.random.Generator, state, inv_metric,
               rec: ChainRecorder) -> Callable:
    """AHMC's ``run_block(gamma, n_iter, phase)``: ``n_iter`` HMC iterations at γ in one
    C++ call, recorded in ``rec``; returns (position before the block, positions).  For
    :class:`HMCKernel` it also offers ``run_block.tuned(tuner, block_size, n_iter,
    max_grads, phase)``: the iterations, their rewards and the C++ tuner's moves in one call
    (:meth:`HMCKernel.tuned_run`), recorded in ``rec``; :func:`run_native_tuned_blocks`
    uses it."""
    def run_block(gamma, n_iter, phase):
        nonlocal state
        params = HMCParameters(float(gamma["step_size"]), int(gamma["num_steps"]),
                               inv_metric)
        previous = state.position
        state, info = kernel.run(rng, state, params, n_iter)
        _record(rec, info, params, phase)
        return previous, info.positions

    def tuned(tuner, block_size, n_iter, max_grads, phase):
        nonlocal state
        state, steps = kernel.tuned_run(rng, state, inv_metric, tuner, block_size, n_iter,
                                        max_grads)
        _record(rec, steps.info, HMCParameters(steps.step_size, steps.num_steps_max), phase)

    if type(kernel) is HMCKernel:  # RMHMC's kernel (ARMHMC) has no tuned C++ loop
        run_block.tuned = tuned
    return run_block


def run_native_tuned_blocks(tuned: Callable, tuner: NativeBayesOptTuner,
                            rec: ChainRecorder, *, warmup: int, draws: int,
                            options: TuningOptions, progress: Callable[[int], None],
                            callback: Callable | None = None, end: int | None = None) -> None:
    """Algorithm 2's blocks from ``rec.n`` to ``warmup + draws`` iterations (or ``end``) as
    :func:`~.tuned_blocks.run_tuned_blocks` runs them, but with the blocks, their rewards
    and the tuner's moves in C++ (``tuned``: a ``run_block.tuned`` of :func:`hmc_blocks`
    or :func:`~.ohmc.ghmc_blocks`): each call runs to the end of the phase, through the
    whole blocks that fit in a tenth of the chain (:func:`~.tuned_blocks.call_iterations`),
    or to the block in which it reaches ``options.max_call_steps`` gradients, so Python
    only records, reports progress and marks the start of sampling.  ``callback(rec)``
    runs after every call."""
    m = options.block_size or max(1, (warmup - rec.n) // options.k)
    per_call = whole_blocks_per_call(warmup, draws, m)
    end = warmup + draws if end is None else end
    while rec.n < end:
        in_warmup = next_phase(tuner, rec, warmup, options, rec.chain_start)
        remaining = min(end, warmup if in_warmup else warmup + draws) - rec.n
        tuned(tuner, m, min(remaining, per_call), options.max_call_steps,
              1 if in_warmup else 2)
        progress(rec.n)
        if callback is not None:
            callback(rec)


def whole_blocks_per_call(warmup: int, draws: int, m: int) -> int:
    """The iterations of one call of :func:`run_native_tuned_blocks`: the whole blocks of
    ``m`` that fit in :func:`~.tuned_blocks.call_iterations`."""
    return max(1, call_iterations(warmup, draws) // m) * m


def run_chain(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
              progress: Callable[[int], None], *, metric: str = "auto", box=None,
              scale_fraction: float | None = None, max_num_steps: int = 1000,
              callback: Callable | None = None, max_restarts: int = DEFAULT_MAX_RESTARTS,
              detect_stuck: bool = True, adapt_delta: float = 0.8, min_num_steps: int = 2,
              max_step_ratio: float = 1.5, scale_path_length: float = 2.0,
              **tuning) -> ChainResult:
    """One AHMC chain: ``warmup`` tuning iterations, then ``draws`` kept iterations.

    ``metric`` (default ``"auto"``: ``"low_rank"`` where the scale phase's last window has
    at least as many draws as there are parameters, Stan's ``"diag"`` beyond,
    :func:`~ahmc_stan.tuning.hmc_warmup.auto_metric`; or ``"low_rank"``, ``"diag"``,
    ``"fisher"``, ``"dense"``, ``"identity"`` or a fixed array): the scale phase's inverse
    metric (:mod:`ahmc_stan.tuning.hmc_warmup`), recorded in ``extras["metric"]``;
    ``comparisons/nuts_peers.py`` measures them.  A
    chain whose ``low_rank`` or ``fisher`` metric diverges in its last window
    (:func:`~ahmc_stan.tuning.hmc_warmup.fallback_divergences`) runs the scale phase again
    from there, in Stan's diagonal with its own windows, as soon as the rule is decided;
    the iterations spent are taken from the tuning phase, which keeps at least half of
    its length.  It is logged in ``extras["metric_fallback"]`` (``None`` otherwise).

    ``tuning`` holds the tuner's options (:class:`TuningOptions`: ``k``, ``alpha``,
    ``kappa``, ``delta``, ``block_size``, ``adapt_during_sampling``, ``maximizer``, ...).
    ``callback(recorder)`` runs after every block.  ``adapt_delta`` (Stan's name, default
    0.8) is the acceptance statistic the scale phase's dual averaging aims at: it sets ε*
    and so the box [ε*/4, 1.5ε*], within which the tuner then picks ε by its reward;
    ``min_num_steps`` (default 2) is the lower end of L in that box (module docstring),
    ``max_step_ratio`` (default 1.5) the top of its ε over ε*.
    ``scale_path_length`` (default 2) is the scale phase's bound on the path length εL,
    so its paths average about one unit of the adapted metric
    (``comparisons/ahmc_settings.py`` measures other values).
    ``tail_check`` (default True): a chain whose tuning-phase draws show rejections
    concentrated in a tail adapts its step size again at ``adapt_delta=0.95`` and caps ε
    at it (:func:`run_tuned_chain`).

    A chain stuck in the scale phase (step size collapsed by 10 orders of magnitude, or
    positions frozen for 50 iterations: :mod:`ahmc_stan.tuning.stuck`) restarts the
    warmup from a fresh Stan-rule initial point (uniform(-2, 2), ignoring ``init``), at
    most ``max_restarts`` times, then raises
    :class:`~ahmc_stan.tuning.stuck.StuckChainError`; ``detect_stuck=False`` turns this
    off.  The restarts are logged in ``extras["restarts"]`` (the Fit's
    ``metadata["chains"][c]["restarts"]``: iteration, reason, discarded ``n_grad``), and
    the discarded iterations' evaluations are charged to the first warmup iteration.  No
    detection without a scale phase (``scale_fraction=0``).
    """
    return run_tuned_chain(model, rng, x0, warmup, draws, progress, hmc_blocks, HMC_STATS,
                           metric=metric, box=box, scale_fraction=scale_fraction,
                           max_num_steps=max_num_steps, callback=callback,
                           max_restarts=max_restarts, detect_stuck=detect_stuck,
                           adapt_delta=adapt_delta, min_num_steps=min_num_steps,
                           max_step_ratio=max_step_ratio,
                           scale_path_length=scale_path_length, **tuning)


def continue_chain(model, rng: np.random.Generator, last: ChainResult, draws: int,
                   progress: Callable[[int], None], **options) -> ChainResult:
    """``draws`` more sampling iterations of a finished AHMC chain ``last``: HMC from its
    last position at its last γ = (ε, L) and its metric, frozen (a fixed kernel, as with
    ``adapt_during_sampling=False``), in calls of a tenth of ``draws``.  Recorded as
    phase 2 with no warmup; ``options`` (the chain's) are not needed and ignored."""
    kernel = HMCKernel(model.density)
    params = HMCParameters(float(last.stats["step_size"][-1]),
                           int(last.stats["num_steps_max"][-1]),
                           from_record(last.extras.get("inv_metric")))
    state = kernel.init(last.positions[-1])
    rec = ChainRecorder(len(state.position), draws, list(HMC_STATS))
    per_call = call_iterations(0, draws)
    with rec.running(0):
        rec.enter_sampling()
        while rec.n < draws:
            state, info = kernel.run(rng, state, params, min(per_call, draws - rec.n))
            _record(rec, info, params, phase=2)
            progress(rec.n)
    return rec.finish({"continued": {"step_size": params.step_size,
                                     "num_steps": params.num_steps}})


def run_tuned_chain(model, rng: np.random.Generator, x0: np.ndarray, warmup: int,
                    draws: int, progress: Callable[[int], None], make_blocks: Callable,
                    stat_names=HMC_STATS, *, metric: str = "low_rank", box=None,
                    scale_fraction: float | None = None, max_num_steps: int = 1000,
                    callback: Callable | None = None, kernel=None,
                    max_restarts: int = DEFAULT_MAX_RESTARTS, detect_stuck: bool = True,
                    adapt_delta: float = 0.8, grad_init: bool = False,
                    min_num_steps: int = 1, max_step_ratio: float = 1.5,
                    scale_path_length: float = 2.0, tail_check: bool = True,
                    pool_windows=None, fast_warmup=None, **tuning) -> ChainResult:
    """The AHMC chain (scale phase, then Algorithm 2's blocks over Γ of (ε, L)) for any
    sampler tuned by (ε, L): ``make_blocks(kernel, rng, state, inv_metric, rec)``, called
    once after the scale phase, returns the sampler's ``run_block`` (see
    :func:`hmc_blocks`); ``stat_names`` are the statistics it records.

    ``kernel`` (default ``HMCKernel(model.density)``) runs the scale phase: anything with
    HMCKernel's ``init``/``step`` taking :class:`HMCParameters` (ARMHMC passes its RMHMC
    kernel with ``metric="identity"``).  ``metric`` may also be an array, a fixed inverse
    metric (vector: diagonal, matrix: dense) of which only ε* is adapted.
    ``max_restarts``, ``detect_stuck``: the stuck-warmup recovery of the scale phase,
    ``adapt_delta`` its target acceptance statistic (:func:`run_chain`).  ``grad_init``
    (``metric="fisher"`` or ``"low_rank"``): the scale phase's first window runs in the
    diagonal inverse metric ``1/|∇ log p(x₀)|`` of the initial point instead of the
    identity (:func:`~ahmc_stan.tuning.hmc_warmup.gradient_init`).  ``min_num_steps``,
    ``max_step_ratio``: the lower end of L and the top of ε over ε* in the default box
    (:func:`default_box`).  ``scale_path_length``: the
    scale phase's path length εL (``L_r ~ U{1..L}``, so about half of it on average) in
    the metric's units (:func:`run_chain`).

    ``tail_check`` (default on; with an adapted metric, the default box, ``adapt_delta``
    below :data:`TAIL_ADAPT_DELTA` and at least :data:`TAIL_CHECK_MIN_TUNING` tuning
    iterations): at the end of each call into C++ in the tuning phase that leaves more
    than a call's iterations of it (iterations 700 and 900 by default), the chain tests
    its own draws since the last test (at least :data:`TAIL_CHECK_MIN_DRAWS`) for
    rejections concentrated in a parameter's tail
    (:func:`~ahmc_stan.tuning.tail_rejection.tail_rejections`, the fit diagnosis's
    statistic, with a ratio of at least :data:`TAIL_CHECK_RATIO` to the central half's
    rate at the same step sizes).  If it finds some, the
    step size is too large for that tail, and the tuner's reward, a mean over the draws,
    does not see it: up to a quarter of the tuning
    phase (at most half of what is left of it) then adapts ε* again at ``adapt_delta``
    :data:`TAIL_ADAPT_DELTA` with the metric fixed (kept at most the first ε*), and a new
    tuner runs the rest of the phase and sampling in the box with ε in [ε*/4, ε*] (no
    longer up to 1.5 ε*); no further test.  The fit's
    ``metadata["chains"][c]["tail_check"]`` logs it (``None`` when nothing was found).
    Without it such a fit fails the diagnosis's tail-rejection check and
    :func:`~ahmc_stan.sampling.tune_and_sample` runs it again (``metric_rerun``), at about
    twice the cost.

    ``pool_windows`` (given by :func:`~ahmc_stan.sampling.tune_and_sample` as this chain's
    :class:`~ahmc_stan.tuning.window_pool.PoolMember` when called with
    ``pool_windows=True``): the scale phase's windows estimate the metric from all chains'
    windows (:mod:`ahmc_stan.tuning.window_pool`); ``extras["pooled_windows"]`` counts the
    windows pooled (``None`` without).

    ``fast_warmup`` (given by :func:`~ahmc_stan.sampling.tune_and_sample` called without
    ``warmup``, as this chain's
    :class:`~ahmc_stan.tuning.fast_warmup.FastWarmupMember`): where the fit's first chain
    finds the posterior Gaussian in its scale phase, every chain's warmup is
    :data:`~ahmc_stan.tuning.fast_warmup.WARMUP` iterations instead of ``warmup``
    (:mod:`ahmc_stan.tuning.fast_warmup`); ``extras["warmup"]`` is the chain's warmup
    and ``extras["fast_warmup"]`` the decision (``None`` without)."""
    pool = pool_windows if pool_windows not in (None, False) else None
    if pool is True:
        raise ValueError("pool_windows=True needs the chains run together: pass it to "
                         "tune_and_sample, which gives each chain its share of the pool")
    if not 0 < adapt_delta < 1:
        raise ValueError(f"adapt_delta must be in (0, 1), not {adapt_delta!r}")
    fixed_metric = isinstance(metric, np.ndarray)
    if not fixed_metric and metric == "auto":
        fraction = 0.5 if scale_fraction is None else scale_fraction
        metric = auto_metric(len(x0), int(round(fraction * warmup)))
    if not fixed_metric and metric not in METRICS:
        raise ValueError(f"metric must be 'auto', one of {', '.join(map(repr, METRICS))} "
                         f"or an array, not {metric!r}")
    adapt_metric = not fixed_metric and metric != "identity"
    options = TuningOptions(**tuning)
    restarts = WarmupRestarts(max_restarts, detect_stuck)
    kernel = HMCKernel(model.density) if kernel is None else kernel
    state = kernel.init(x0)
    rec = ChainRecorder(len(x0), warmup + draws, list(stat_names))
    if scale_fraction is None:
        scale_fraction = 0.0 if (not adapt_metric and box is not None) else (
            0.5 if adapt_metric else 0.2)
    n_scale = int(round(scale_fraction * warmup))
    if box is None and n_scale == 0:
        raise ValueError(f"no scale phase (warmup={warmup}, scale_fraction={scale_fraction}),"
                         " from which the box over (step size, steps) is derived: give "
                         "box=((eps_lo, eps_hi), (L_lo, L_hi)) or a longer warmup")
    tuner, inv_metric, eps_ref, notes, tail_note = None, None, None, {}, None
    first_attempt = (metric, n_scale, grad_init)
    scale_metric, fell_back = metric, None
    with rec.running(warmup):
        while True:
            notes.clear()  # of a discarded attempt
            try:
                state, inv_metric, eps_ref = _scale_phase(
                    kernel, rng, state, n_scale, scale_metric, rec, max_num_steps, restarts,
                    adapt_delta, progress, notes.update, call_iterations(warmup, draws),
                    options.max_call_steps, grad_init, scale_path_length,
                    restart=fell_back is None, pool=pool, shorten=fast_warmup)
                break
            except WarmupStuck as stuck:  # start the warmup afresh from a new point
                state = kernel.init(restarts.restart(stuck, rec, model, rng))
                (scale_metric, n_scale, grad_init), fell_back = first_attempt, None
            except MetricFallback as fallback:  # the phase again in Stan's diagonal
                state, fell_back, scale_metric, grad_init = (
                    fallback.state, {**fallback.note, "restart": rec.n}, "diag", False)
                n_scale = min(n_scale, warmup - rec.n - (warmup - n_scale) // 2)
        if fell_back is not None:
            notes["metric_fallback"] = fell_back
        if fast_warmup is not None and fast_warmup.short and rec.n < n_scale:
            warmup = rec.warmup = rec.n + FAST_TUNING  # the scale phase ended early
            if hasattr(progress, "warmup"):
                progress.warmup(warmup)
        progress(rec.n)
        box_given = box is not None
        box = (default_box(eps_ref, max_num_steps, min_num_steps, high=max_step_ratio)
               if box is None else as_box(box))
        tuner = options.make_tuner(box, rng, _initial_gamma(eps_ref, box),
                                   getattr(model, "density", None))
        run_block = make_blocks(kernel, rng, state, inv_metric, rec)

        def run_blocks(end=None):
            tuned = getattr(run_block, "tuned", None)
            if (tuned is not None and isinstance(tuner, NativeBayesOptTuner)
                    and box.names == GAMMA):
                run_native_tuned_blocks(tuned, tuner, rec, warmup=warmup, draws=draws,
                                        options=options, progress=progress,
                                        callback=callback, end=end)
            else:
                rewards = lambda previous, positions, gamma, m: esjd_block_rewards(
                    previous, positions, int(gamma["num_steps"]), inv_metric, m)
                run_tuned_blocks(tuner, rec, run_block, rewards, warmup=warmup,
                                 draws=draws, options=options, chain_start=rec.chain_start,
                                 progress=progress, callback=callback, end=end)

        def retune(n_adapt):  # the tail check's: ε* again at TAIL_ADAPT_DELTA, a new tuner
            nonlocal state, box, options, tuner, run_block
            first = tuner
            state, _, eps_adapted = _scale_phase(
                kernel, rng, kernel.init(rec.positions[rec.n - 1]), n_adapt, inv_metric,
                rec, max_num_steps, None, TAIL_ADAPT_DELTA, progress,
                call_iterations=call_iterations(warmup, draws),
                call_grads=options.max_call_steps, path_length=scale_path_length, phase=1)
            # A tail that rejects asks for smaller steps: never above the first ε*, which
            # a short dual averaging at the higher target can overshoot.
            eps_tail = min(eps_adapted, eps_ref)
            box = default_box(eps_tail, max_num_steps, min_num_steps, high=1.0)
            options = replace(options, k=max(1, (warmup - rec.n) // options.block_size))
            tuner = options.make_tuner(box, rng, _initial_gamma(eps_tail, box),
                                       getattr(model, "density", None))
            run_block = make_blocks(kernel, rng, state, inv_metric, rec)
            return {"adapt_delta": TAIL_ADAPT_DELTA, "iterations": n_adapt,
                    "reference_step_size": [eps_ref, eps_tail], "adapted": eps_adapted,
                    "box_before": [(d.name, d.low, d.high, d.integer) for d in first.box.dims],
                    "tuner_seconds_before": first.seconds}

        n_tune = warmup - rec.n
        if (tail_check and not box_given and inv_metric is not None and eps_ref is not None
                and adapt_delta < TAIL_ADAPT_DELTA and n_tune >= TAIL_CHECK_MIN_TUNING):
            m = options.block_size or max(1, n_tune // options.k)
            options = replace(options, block_size=m)  # the loop's blocks, run in parts
            tail_note = _tail_checked_tuning(rec, run_blocks, retune, warmup=warmup,
                                             per_call=whole_blocks_per_call(warmup, draws, m))
        run_blocks()
    extras = tuning_extras(tuner)
    if tail_note is not None:
        extras["tuner_seconds"] += tail_note["tuner_seconds_before"]
    return rec.finish({"metric": metric if not fixed_metric else "fixed",
                       "inv_metric": metric_record(inv_metric), "reference_step_size": eps_ref,
                       "restarts": restarts.records, "tail_check": tail_note,
                       "metric_fallback": notes.get("metric_fallback"),
                       "pooled_windows": None if pool is None else pool.windows,
                       "warmup": warmup,
                       "fast_warmup": None if fast_warmup is None else fast_warmup.note(),
                       **extras})


def _tail_checked_tuning(rec: ChainRecorder, run_blocks: Callable, retune: Callable, *,
                         warmup: int, per_call: int) -> dict | None:
    """The tuning phase's calls of ``per_call`` iterations (``run_blocks(end)``), each but
    the last followed by the chain's tail test of its draws since the previous test (at
    least :data:`TAIL_CHECK_MIN_DRAWS`; at the ends of calls, so that a chain in which
    nothing is found makes the same draws as without the check), until one finds a tail;
    then ``retune(n_adapt)`` (a quarter of the phase, at most half of what is left)
    and no further test.  Returns the note for ``extras["tail_check"]`` or None."""
    n_tune, start = warmup - rec.n, rec.n
    while rec.n + per_call < warmup:
        run_blocks(end=rec.n + per_call)
        if rec.n - start < TAIL_CHECK_MIN_DRAWS:
            continue
        eps = rec.stats["step_size"][start + 1:rec.n]
        found = tail_rejections(rec.positions[start:rec.n - 1],
                                1.0 - rec.stats["accept_stat"][start + 1:rec.n],
                                TAIL_CHECK_RATIO, strata=eps > np.median(eps))
        window, start = [start, rec.n], rec.n
        if found:
            return {"window": window, "found": [f._asdict() for f in found[:5]],
                    **retune(min(n_tune // 4, (warmup - rec.n) // 2))}
    return None


def _initial_gamma(eps_ref: float | None, box: Box) -> dict | None:
    """The tuner's first γ: ε* and a path of about π (half a period of a unit-scale
    Gaussian direction), clipped to the box."""
    if eps_ref is None:
        return None
    return {"step_size": float(np.clip(eps_ref, box.dims[0].low, box.dims[0].high)),
            "num_steps": int(np.clip(round(math.pi / eps_ref), box.dims[1].low,
                                     box.dims[1].high))}
