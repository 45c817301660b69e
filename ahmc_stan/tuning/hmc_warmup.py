"""The warmup shared by the HMC family: Stan's step-size dual averaging and windowed metric
estimation (Stan Reference Manual, "HMC algorithm parameters"), at a path length of about
``path_length`` (AHMC's scale phase, Wang et al. 2013 as extended here: the tuner then
searches a box around the reference step size ε* this phase ends with).

:func:`hmc_warmup` proposes parameters only: it runs a kernel, reports every block of
iterations to ``record`` and returns the adapted inverse metric and ε*.  A kernel with
``adapt_run`` (:class:`~ahmc_stan.hmc.HMCKernel`: dual averaging and the cap on leapfrog
steps inside the C++ block, ``ahmc_hmc_adapt_block``) runs each metric window (or at most
``call_iterations`` iterations) in one call; any other kernel with ``step`` (RMHMC) runs
one iteration per call with the same rule and draws from the same Generator.

Metrics: ``"identity"``; ``"diag"``/``"dense"``, Stan's regularised covariance of each
window's draws; ``"fisher"``, the diagonal from draws and gradients
(:func:`~ahmc_stan.tuning.windows.fisher_inv_metric`); ``"low_rank"``, that diagonal
corrected in the directions the draws and gradients single out
(:func:`~ahmc_stan.tuning.windows.low_rank_inv_metric`); or an array (or a
:class:`~ahmc_stan.metric.LowRankInvMetric`), a fixed inverse metric of which only ε is
adapted.  All metrics are estimated in Stan's windows (a
75-iteration buffer lets a chain started far out reach the typical set first).  On up to
:data:`EARLY_WINDOW_MAX_DIMS` parameters the gradient-based metrics are also estimated in
the buffer, in windows of :data:`EARLY_WINDOW` iterations, each from its own draws and
gradients (as nutpie's early windows switch): along a Gaussian direction sd(x)/sd(∇) is
the variance however little the chain moved, so a chain still crawling along a ridge far
out gets the ridge's scales after 25 iterations instead of running 75 at the ridge's
narrow width in the identity; Stan's windows then re-estimate from later draws.  Beyond
that (windows whose 50 draws and gradients span less than half the space) they cost
more than they save on the latent fields measured (``README.md``).  (Doubling windows
from the 10th iteration were tried: a chain restarted in a slow region of ARMA(1,1)
baked its slowness into the metric, R-hat 1.84.)  Their paths start short
(:func:`early_cap`: at most 10 steps, a cap doubled every 25 iterations; on at most 25
parameters 5 steps, doubled every 75):
their draws need only span the space, not be independent; with ``grad_init`` they run in
``1/|∇ log p(x₀)|`` (:func:`gradient_init`) instead of the identity until the first
window ends.  A gradient-based metric whose last window diverges in more than
:data:`FALLBACK_DIVERGENT` of its iterations gives way to Stan's diagonal
(:func:`fallback_divergences`), decided in the iteration whose divergence decides the
rule (the C++ block stops there).  With ``restart`` the phase then raises :class:`MetricFallback`
and the caller runs a scale phase again in Stan's diagonal, with its own windows, from
that state (:func:`~ahmc_stan.samplers.ahmc.run_tuned_chain`): the failing metric
under-scales the directions it gets wrong, so its chain has barely moved along them, and
any diagonal estimated from its draws is too small there (on Caravan's collinear pair,
1–5 % of the posterior variance; ``README.md``).  Without ``restart`` the chain switches
to Stan's diagonal estimate from its last window-length of draws and runs the rest of the
window in it, estimated again at the window's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..metric import LowRankInvMetric
from .step_size import DualAveraging, initial_step_size
from .windows import (adaptation_windows, fisher_inv_metric, low_rank_inv_metric,
                      regularized_inv_metric)

__all__ = ["hmc_warmup", "gradient_init", "adapt_steps", "check_stuck", "auto_metric",
           "AdaptedSteps", "METRICS", "early_cap", "EARLY_MAX_STEPS", "EARLY_CAP_EVERY",
           "SMALL_EARLY_MAX_STEPS", "SMALL_EARLY_CAP_EVERY", "SMALL_EARLY_MAX_DIMS",
           "EARLY_WINDOW", "EARLY_WINDOW_MAX_DIMS", "FALLBACK_DIVERGENT",
           "fallback_divergences", "MetricFallback"]

METRICS = ("identity", "diag", "dense", "fisher", "low_rank")

#: Gradient-based metrics: the cap on leapfrog steps in the first iterations of warmup,
#: doubled every EARLY_CAP_EVERY iterations.
EARLY_MAX_STEPS = 10
EARLY_CAP_EVERY = 25
#: On at most SMALL_EARLY_MAX_DIMS parameters (fewer than an early window's draws) the cap
#: starts at SMALL_EARLY_MAX_STEPS and is held through the buffer (doubled every
#: SMALL_EARLY_CAP_EVERY iterations): the windows' draws still span the space, and the
#: buffer's swinging ε no longer buys long paths.  On Caravan's 86 parameters that cap
#: cost more than it saved (``README.md``, "AHMC against the best NUTS").
SMALL_EARLY_MAX_STEPS = 5
SMALL_EARLY_CAP_EVERY = 75
SMALL_EARLY_MAX_DIMS = 25

#: Gradient-based metrics on at most EARLY_WINDOW_MAX_DIMS parameters: the initial buffer
#: is split into windows of EARLY_WINDOW iterations, each estimated from its own draws
#: and gradients (module docstring).
EARLY_WINDOW = 25
EARLY_WINDOW_MAX_DIMS = 4 * EARLY_WINDOW


def early_cap(dims: int) -> tuple[int, int]:
    """(first cap on leapfrog steps, iterations per doubling) of a gradient-based metric's
    scale phase on ``dims`` parameters."""
    if dims <= SMALL_EARLY_MAX_DIMS:
        return SMALL_EARLY_MAX_STEPS, SMALL_EARLY_CAP_EVERY
    return EARLY_MAX_STEPS, EARLY_CAP_EVERY


def auto_metric(dims: int, n_iter: int) -> str:
    """The metric ``"auto"`` stands for in a warmup of ``n_iter`` iterations: ``"low_rank"``
    when its last metric window has at least as many draws as there are parameters, else
    Stan's ``"diag"``.  With fewer draws the window's covariances are singular and their
    eigenvalues far from the true ones (Marchenko & Pastur 1967): on the two latent
    fields measured (about 1000 parameters, 200 draws in the last window at 1000 warmup
    iterations) none of the low-rank estimate's directions above its cutoff recurred in
    held-out draws, and on the stochastic volatility model the diagonal from gradients
    gave β and φ a fifth to a half of their variance; Stan's diagonal mixes them better
    (``README.md``, "Where the low-rank metric applies")."""
    windows = adaptation_windows(n_iter)
    if not windows:
        return "low_rank"
    start, end = windows[-1]
    return "low_rank" if dims <= end - start else "diag"


#: A gradient-based metric falls back to Stan's diagonal when more than this share of its
#: last window's iterations (and more than two) diverged (:func:`fallback_divergences`).
FALLBACK_DIVERGENT = 0.02


def fallback_divergences(window: int) -> int:
    """The number of divergent transitions in the last window of ``window`` iterations at
    which the draws-and-gradients estimate gives way to Stan's diagonal estimate from the
    draws alone: the smallest above 2 and above :data:`FALLBACK_DIVERGENT` of them.
    Divergences there say that the curvature changes across the region the window
    visited; the gradient-based estimates fit the curvature *where the window was*, and
    their reference step size and box over (ε, L) then differ from chain to chain and keep
    out the long paths such a posterior needs, while the draws' variances set a small ε and
    so a box that reaches them.  Divergences only add up, so the rule is decided in the
    iteration that reaches this number."""
    return math.floor(max(2, FALLBACK_DIVERGENT * window)) + 1


@dataclass(frozen=True)
class AdaptedSteps:
    """A stretch of warmup iterations: the kernel's ``info``, and per iteration the step
    size used, the bound on leapfrog steps, and (when asked for) the gradient at the
    state kept."""

    info: object
    step_size: np.ndarray
    num_steps_max: np.ndarray
    grads: np.ndarray | None


def _steps_bound(step_size, path_length: float, max_steps: int):
    """``clamp(round(path_length / ε), 1, max_steps)``, rounding halves away from zero as
    the C++ block does; ``max_steps`` when ``path_length`` <= 0."""
    step_size = np.asarray(step_size, dtype=float)
    if path_length <= 0:
        return np.full(step_size.shape, int(max_steps))
    return np.clip(np.floor(path_length / step_size + 0.5), 1, max_steps).astype(int)


def adapt_steps(kernel, rng: np.random.Generator, state, inv_metric, n_iter: int,
                averager: DualAveraging, path_length: float, max_steps,
                min_step_size: float = 0.0, want_grads: bool = False, jitter: bool = True,
                step_jitter: float = 0.0, max_grads: float = math.inf,
                max_divergent: int = 0):
    """Up to ``n_iter`` iterations, each at the averager's current ε with
    ``L_r ~ U{1..L}``, ``L = clamp(round(path_length/ε), 1, max_steps)`` (``max_steps``
    when ``path_length`` <= 0; ``L_r = L`` without ``jitter``; ``max_steps`` a number or
    one per iteration), the averager updated with each acceptance probability; stops after
    an update takes ε below ``min_step_size``, after the iteration in which the
    gradients reach ``max_grads``, or (``max_divergent`` > 0) after the one in which the
    divergent transitions reach ``max_divergent``.  ``step_jitter`` = j > 0 runs each iteration at
    ε·U(1 − j, 1 + j) (Neal 2011, §5.4.2.2).  Returns (state, :class:`AdaptedSteps`)."""
    if hasattr(kernel, "adapt_run"):
        return kernel.adapt_run(rng, state, inv_metric, n_iter, averager, path_length,
                                max_steps, min_step_size, want_grads, jitter, step_jitter,
                                max_grads, max_divergent)
    from ..hmc import HMCParameters, stack_infos

    caps = np.broadcast_to(max_steps, (n_iter,))
    infos, sizes, bounds, grads, n_grad, n_div = [], [], [], [], 0, 0
    for j in range(n_iter):
        eps = averager.step_size
        bound = int(_steps_bound(eps, path_length, int(caps[j])))
        if step_jitter:
            eps *= 1 + step_jitter * rng.uniform(-1, 1)
        state, info = kernel.step(rng, state, HMCParameters(
            eps, bound, inv_metric, jitter))
        infos.append(info)
        sizes.append(eps)
        bounds.append(bound)
        if want_grads:
            grads.append(state.logdensity_grad.copy())
        n_grad += int(info.num_grad[0])
        n_div += bool(info.is_divergent[0])
        if not averager.update(float(info.acceptance_rate[0])) >= min_step_size:
            break
        if n_grad >= max_grads or 0 < max_divergent <= n_div:
            break
    return state, AdaptedSteps(stack_infos(infos), np.array(sizes), np.array(bounds),
                               np.array(grads) if want_grads else None)


def check_stuck(detector, steps: AdaptedSteps, averager: DualAveraging, done: int) -> None:
    """Feed a stretch's iterations to a :class:`~ahmc_stan.tuning.stuck.StuckDetector`
    (each with the ε adaptation chose after it); raise
    :class:`~ahmc_stan.tuning.stuck.WarmupStuck` at the first stuck one (``done``: the
    attempt's iterations before the stretch).  No-op without a detector."""
    from .stuck import WarmupStuck

    if detector is None:
        return
    info = steps.info
    eps_next = np.append(steps.step_size[1:], averager.step_size)
    found = detector.update_many(eps_next, info.positions, info.acceptance_rate,
                                 info.logdensity)
    if found is not None:
        raise WarmupStuck(done + found[0] + 1, found[1])


def gradient_init(grad: np.ndarray) -> np.ndarray:
    """The diagonal inverse metric the gradient-based metrics start from: ``1/|∇ log
    p(x₀)|`` at the initial point (nutpie's ``grad_init``, Seyboldt, Carlson & Carpenter
    2026).  At a distance δ from the centre of a Gaussian direction of sd σ the gradient
    is δ/σ², so ``1/|g|`` is σ²/δ: with Stan's initial points (δ of order 1 on the
    unconstrained scale) the order of that direction's variance, where the identity
    would leave the step size to the narrowest direction until the first window ends.
    Not the default: from the far-out starts of a stiff ODE model it is the scale of a
    region the chain leaves (``README.md``, "AHMC against the best NUTS").
    Components whose gradient is zero or not finite keep 1; the rest are clipped to
    [1e-10, 1e10]."""
    g = np.abs(np.asarray(grad, dtype=float))
    ok = np.isfinite(g) & (g > 0)
    return np.clip(np.where(ok, 1.0 / np.where(ok, g, 1.0), 1.0), 1e-10, 1e10)


class MetricFallback(Exception):
    """Internal signal from :func:`hmc_warmup` with ``restart``: the fallback fired in
    ``state``; ``note`` is what it logs."""

    def __init__(self, state, note: dict):
        super().__init__("metric fallback")
        self.state, self.note = state, note


def hmc_warmup(kernel, rng: np.random.Generator, state, n_iter: int, metric,
               record: Callable[[AdaptedSteps], None], *, max_num_steps: int = 1000,
               adapt_delta: float = 0.8, path_length: float = 2.0, restarts=None,
               progress: Callable[[], None] | None = None,
               notes: Callable[[dict], None] | None = None,
               call_iterations: int | None = None, call_grads: float = math.inf,
               grad_init: bool = False, restart: bool = False, pool=None, shorten=None):
    """``n_iter`` warmup iterations of ``kernel`` from ``state``: dual averaging of ε
    towards the acceptance statistic ``adapt_delta`` at a path length of about
    ``path_length``, the inverse metric estimated at the end of each of Stan's windows
    (module docstring for ``metric``); ``record(steps)`` and ``progress()`` after every
    call into the kernel, which runs to the end of a window, through at most
    ``call_iterations`` iterations, or to the iteration in which it reaches
    ``call_grads`` gradients.  With ``restarts`` (a
    :class:`~ahmc_stan.tuning.stuck.WarmupRestarts`) a stuck chain raises
    :class:`~ahmc_stan.tuning.stuck.WarmupStuck`.  A fallback to Stan's diagonal metric
    (:func:`fallback_divergences`) is reported as ``notes({"metric_fallback": {...}})``, or
    with
    ``restart`` raised as :class:`MetricFallback` (module docstring).  ``grad_init``
    (``fisher`` and ``low_rank`` only): until the first window ends the chain runs in
    :func:`gradient_init` instead of the identity.  ``pool`` (a
    :class:`~ahmc_stan.tuning.window_pool.PoolMember`): each window's estimate from all
    chains' windows; the chain leaves the pool when it leaves the common schedule (a
    fallback or a stuck start; whatever else ends the chain, the chain's caller in
    :mod:`ahmc_stan.sampling` makes it leave).  ``shorten`` (a
    :class:`~ahmc_stan.tuning.fast_warmup.FastWarmupMember`; metrics from gradients
    only): at the end of the window that ends at its iteration ``shorten.at``, when later
    windows follow, ``shorten(draws, grads, divergent, rule)`` with the draws and
    gradients since ``shorten.start``, the window's divergent transitions and the
    fallback's rule for it; if it says so, the later windows are dropped and the phase
    ends after its terminal buffer.
    Returns (state, inverse metric, ε*), ε* ``None`` when ``n_iter`` is 0."""
    dims = len(state.position)
    fixed = isinstance(metric, (np.ndarray, LowRankInvMetric))
    if not fixed and metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(map(repr, METRICS))} or an "
                         f"array, not {metric!r}")
    inv_metric = metric if fixed else None if metric == "identity" else (
        np.eye(dims) if metric == "dense" else np.ones(dims))
    from_gradients = not fixed and metric in ("fisher", "low_rank")
    if grad_init:
        if not from_gradients:
            raise ValueError("grad_init applies to the metrics from gradients "
                             f"('fisher', 'low_rank'), not metric={metric!r}")
        inv_metric = gradient_init(state.logdensity_grad)
    early = from_gradients and dims <= EARLY_WINDOW_MAX_DIMS
    windows = {} if inv_metric is None or fixed else dict(adaptation_windows(
        n_iter, early_window=EARLY_WINDOW if early else 0))
    window_start = {end: start for start, end in windows.items()}
    # with gradients, short paths at first: until the metric has settled a badly scaled
    # start makes ε tiny and 2/ε steps long
    first_cap, every = early_cap(dims)

    def caps(it, n):  # of iterations it.., doubled every `every` iterations
        if not (from_gradients and windows):
            return max_num_steps
        doublings = np.minimum(np.arange(it, it + n) // every, 30)
        return np.minimum(max_num_steps, first_cap * 2 ** doublings)

    def log_accept(eps):  # one leapfrog step with a fresh momentum; the state is kept
        from ..hmc import HMCParameters

        _, info = kernel.step(rng, state, HMCParameters(eps, 1, inv_metric, jitter=False))
        return math.log(max(info.acceptance_rate[0], 1e-300))

    def first_step_size(eps=1.0):  # Stan's heuristic from the current state
        if hasattr(kernel, "initial_step_size"):  # in one call into C++
            return kernel.initial_step_size(rng, state, inv_metric, eps)
        return initial_step_size(log_accept, eps)

    if n_iter == 0:
        return state, inv_metric, None
    averager = DualAveraging(first_step_size(), target=adapt_delta)
    detector = restarts.detector(dims, averager.step_size) if restarts is not None else None
    positions, grads, divergent = [], [], []
    last_window_end = max(window_start, default=None)
    watch = from_gradients and last_window_end is not None  # for the fallback
    estimator = metric  # "diag" after a fallback
    if watch:
        last_start = window_start[last_window_end]
        rule = fallback_divergences(last_window_end - last_start)
    diverged = 0  # in the last window so far
    it = 0
    while it < n_iter:
        stop = min([n_iter, it + (call_iterations or n_iter),
                    *[end for end in window_start if end > it]])
        # in the last window (calls never cross a window's end): stop where the
        # fallback rule is decided
        in_last = watch and it >= last_start
        limit = rule - diverged if in_last else 0
        floor = 0.0 if detector is None else detector.floor
        state, steps = adapt_steps(kernel, rng, state, inv_metric, stop - it, averager,
                                   path_length, caps(it, stop - it), floor, from_gradients,
                                   max_grads=call_grads, max_divergent=limit)
        record(steps)
        positions.append(steps.info.positions)
        divergent.append(steps.info.is_divergent)
        if from_gradients:
            grads.append(steps.grads)
        try:
            check_stuck(detector, steps, averager, it)
        except Exception:  # the chain starts afresh: off the common schedule
            if pool is not None:
                pool.leave()
            raise
        it += len(steps.info.positions)
        if progress is not None:
            progress()
        fell_back = False
        if in_last:
            diverged += int(steps.info.is_divergent.sum())
            fell_back = diverged >= rule
            watch = not fell_back and it < last_window_end
        if fell_back:
            note = {"metric": metric, "to": "diag", "window": [last_start, it],
                    "divergent": diverged}
            if pool is not None:  # off the common schedule
                pool.leave()
            if restart:
                raise MetricFallback(state, note)
            # Stan's diagonal for the rest of the window, estimated again at its end
            before = max(it - (last_window_end - last_start), min(window_start.values()))
            inv_metric = regularized_inv_metric(np.concatenate(positions)[before:it],
                                                dense=False)
            estimator = "diag"
            if it < last_window_end:
                window_start[last_window_end] = it
            if notes is not None:
                notes({"metric_fallback": note})
        elif it in window_start:
            start = window_start[it]
            window = np.concatenate(positions)[start:it]
            window_grads = np.concatenate(grads)[start:it] if from_gradients else None
            shared = None if pool is None else pool.share(window, window_grads)
            if shared is not None:
                window, window_grads = shared
            if estimator in ("fisher", "low_rank"):
                estimate = fisher_inv_metric if metric == "fisher" else low_rank_inv_metric
                inv_metric = estimate(window, window_grads)
            else:
                inv_metric = regularized_inv_metric(window, dense=estimator == "dense")
            if (shorten is not None and from_gradients and it == shorten.at
                    and estimator == metric and max(window_start) > it
                    and shorten(np.concatenate(positions)[shorten.start:it],
                                np.concatenate(grads)[shorten.start:it],
                                int(np.concatenate(divergent)[start:it].sum()),
                                fallback_divergences(it - start))):
                n_iter = it + (n_iter - last_window_end)  # the terminal buffer
                window_start = {end: s for end, s in window_start.items() if end <= it}
                watch = False
        else:
            continue
        averager.restart(first_step_size(averager.final))
        if detector is not None:
            detector.restart(averager.step_size)
    return state, inv_metric, averager.final
