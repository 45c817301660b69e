"""ARMHMC and RMHMC: Riemann-manifold HMC on the Stan Hessian (SoftAbs metric,
:mod:`ahmc_stan.riemann`), with (ε, L) tuned by AHMC's Bayesian optimisation (Wang,
Mohamed & de Freitas 2013, sections 2 and 5: "ARMHMC") or fixed by the user ("RMHMC", the
Girolami & Calderhead 2011 protocol).

``metric`` chooses the geometry:

* ``"softabs"`` (default up to 200 dimensions): the position-dependent SoftAbs metric
  G(x) with the generalised leapfrog (:class:`~ahmc_stan.riemann.RMHMCKernel`, whose
  iterations run in C++ blocks, ``ahmc_rmhmc_block``).
* ``"constant"`` (default above 200 dimensions): the SoftAbs of the Hessian at the mode
  (L-BFGS from the chain's initial point, :func:`~ahmc_stan.riemann.constant_softabs_metric`)
  as the fixed dense metric of plain HMC — what Girolami & Calderhead do for the LGCP.
  A generalised-leapfrog step costs a third-derivative tensor (d(d+1)/2 third-order
  autodiff sweeps), a handful of Hessians (d forward-over-reverse sweeps each), O(d³)
  eigendecompositions and contractions and a d³ tensor (64 MB at d = 200): above ~200
  dimensions a constant metric is the only affordable Riemannian choice.

ARMHMC is AHMC's chain (:func:`~.ahmc.run_tuned_chain`) with the RMHMC kernel: a scale
phase (``scale_fraction`` of warmup, default 1/5; skipped when a ``box`` is given) runs the
kernel with Stan's step-size dual averaging at a path length of ~2, giving ε* and AHMC's
default box ε ∈ [ε*/4, 1.5ε*], L ∈ {1..clip(⌈2π/ε*⌉, 10, max_num_steps)} (the paper's
logistic-regression box is ε ∈ [0.1, 1], L ∈ {1..12}); then blocks of ``L_r ~ U{1..L}``
iterations with the reward ESJD/sqrt(L) (Euclidean, as the paper).

Statistics per iteration, beyond AHMC's: ``n_hessian`` (Hessians), ``n_third``
(third-derivative tensors, each d(d+1)/2 third-order autodiff sweeps or their
finite-difference fallback), ``n_leapfrog`` (generalised leapfrog steps, the paper's L,
reversibility check included) and ``fixed_point_failures``.  With SoftAbs ``n_grad`` is 0:
the generalised leapfrog evaluates gradients only inside Hessians (see
:mod:`ahmc_stan.riemann`, "Cost"); the Fit converts Hessians and tensors into
gradient-equivalents with their costs measured on the model (:mod:`ahmc_stan.costs`; the
methods of the tensors and Hessians are ``extras["third_derivatives"]`` and
``extras["hessian"]``).  In constant mode the
statistics are HMC's (``n_grad`` = leapfrog steps) and the Riemannian ones are 0.  Work
done outside recorded iterations (the first point's geometry, step-size probes, the
optimiser of constant mode) is charged to the first warmup iteration.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..hmc import HMCKernel, HMCParameters
from ..riemann import (DEFAULT_SOFTNESS, RIEMANN_STATS, RMHMCKernel,
                       constant_softabs_metric)
from .ahmc import HMC_STATS, _record, hmc_blocks, run_tuned_chain
from .chain import ChainRecorder, ChainResult

__all__ = ["run_chain", "run_fixed_chain", "choose_metric", "CONSTANT_METRIC_DIMS"]

#: Above this many dimensions ``metric`` defaults to ``"constant"``.
CONSTANT_METRIC_DIMS = 200

STATS = (*HMC_STATS, *RIEMANN_STATS)


def choose_metric(metric: str | None, dims: int) -> str:
    """``metric``, or the default for ``dims`` (module docstring)."""
    if metric is None:
        return "softabs" if dims <= CONSTANT_METRIC_DIMS else "constant"
    if metric not in ("softabs", "constant"):
        raise ValueError(f"metric must be 'softabs' or 'constant', not {metric!r}")
    return metric


def _charge_unrecorded(result: ChainResult, work: dict[str, float], seconds: float = 0.0
                       ) -> ChainResult:
    """Add work done outside recorded iterations to the first warmup iteration."""
    if result.n_warmup > 0:
        for name, amount in work.items():
            result.stats[name][0] += amount
    result.time_warmup += seconds
    result.extras["unrecorded_work"] = dict(work)
    return result


def _kernel_work(kernel: RMHMCKernel, result: ChainResult) -> dict[str, float]:
    return {name: kernel.totals[name] - float(np.sum(result.stats[name]))
            for name in ("n_grad", "n_hessian", "n_third")}


def _constant_metric(model, x0, softness):
    started = time.perf_counter()
    found = constant_softabs_metric(model.density, x0, softness)
    work = {"n_grad": found["n_grad"], "n_hessian": 1}
    extras = {"mode": found["mode"], "optimizer_success": found["optimizer_success"]}
    return found["inv_metric"], work, extras, time.perf_counter() - started


def run_chain(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
              progress: Callable[[int], None], *, metric: str | None = None,
              softness: float = DEFAULT_SOFTNESS, fixed_point_tol: float = 1e-10,
              max_fixed_point_iterations: int = 100, check_reversibility: bool = True,
              third_derivatives: str = "auto", hessian: str = "auto", box=None,
              scale_fraction: float | None = None, max_num_steps: int | None = None,
              callback: Callable | None = None, **tuning) -> ChainResult:
    """One ARMHMC chain (``sampler="armhmc"``).  ``softness``, ``fixed_point_tol``,
    ``max_fixed_point_iterations``, ``check_reversibility``, ``third_derivatives`` and
    ``hessian`` (``"gradient"``: Hessians by differences of gradients) go to
    :class:`~ahmc_stan.riemann.RMHMCKernel`; the tuner's options (``k``, ``block_size``,
    ``adapt_during_sampling``, ...) are AHMC's.
    ``max_num_steps`` caps L of the default box (100 with SoftAbs, 1000 constant)."""
    metric = choose_metric(metric, len(x0))
    common = dict(box=box, scale_fraction=scale_fraction, callback=callback, **tuning)
    if metric == "constant":
        inv_metric, work, extras, seconds = _constant_metric(model, x0, softness)
        result = run_tuned_chain(model, rng, x0, warmup, draws, progress, hmc_blocks, STATS,
                                 metric=inv_metric, max_num_steps=max_num_steps or 1000,
                                 **common)
    else:
        kernel = RMHMCKernel(model.density, softness, fixed_point_tol,
                             max_fixed_point_iterations, check_reversibility,
                             third_derivatives=third_derivatives, hessian=hessian)
        common.setdefault("max_call_steps", 50)  # RMHMC steps cost ~2d Hessians each
        result = run_tuned_chain(model, rng, x0, warmup, draws, progress, hmc_blocks, STATS,
                                 metric="identity", max_num_steps=max_num_steps or 100,
                                 kernel=kernel, **common)
        work, extras, seconds = _kernel_work(kernel, result), {}, 0.0
        extras.update(third_derivatives=kernel.third_method, hessian=kernel.hessian_method)
    result.extras.update(metric=metric, softness=softness, **extras)
    return _charge_unrecorded(result, work, seconds)


def run_fixed_chain(model, rng: np.random.Generator, x0: np.ndarray, warmup: int,
                    draws: int, progress: Callable[[int], None], *,
                    step_size: float | None = None, num_steps: int | None = None,
                    metric: str | None = None, softness: float = DEFAULT_SOFTNESS,
                    fixed_point_tol: float = 1e-10, max_fixed_point_iterations: int = 100,
                    check_reversibility: bool = True, third_derivatives: str = "auto",
                    hessian: str = "auto", jitter: bool = False, block_size: int = 10,
                    callback: Callable | None = None) -> ChainResult:
    """One RMHMC chain at a fixed, user-given (ε, L) (``sampler="rmhmc"``; warmup is
    plain burn-in).  ``jitter=True`` draws ``L_r ~ U{1..L}`` as ARMHMC does; the default
    is Girolami & Calderhead's fixed L."""
    if step_size is None or num_steps is None:
        raise ValueError("sampler 'rmhmc' runs at a fixed (ε, L): give step_size and "
                         "num_steps (e.g. step_size=0.5, num_steps=6), or use "
                         "sampler='armhmc' to have them tuned")
    if not step_size > 0 or int(num_steps) < 1:
        raise ValueError("need step_size > 0 and num_steps >= 1")
    metric = choose_metric(metric, len(x0))
    start = time.perf_counter()
    if metric == "constant":
        inv_metric, work, extras, _ = _constant_metric(model, x0, softness)
        kernel = HMCKernel(model.density)
    else:
        inv_metric, extras = None, {}
        kernel = RMHMCKernel(model.density, softness, fixed_point_tol,
                             max_fixed_point_iterations, check_reversibility,
                             third_derivatives=third_derivatives, hessian=hessian)
    params = HMCParameters(float(step_size), int(num_steps), inv_metric, jitter=jitter)
    rec = ChainRecorder(len(x0), warmup + draws, list(STATS))
    with rec.running(warmup):
        rec.chain_start = start  # the constant metric's optimisation is the chain's time
        state = kernel.init(x0)
        while rec.n < warmup + draws:
            in_warmup = rec.n < warmup
            if not in_warmup:
                rec.enter_sampling()
            n_iter = min(block_size, (warmup if in_warmup else warmup + draws) - rec.n)
            state, info = kernel.run(rng, state, params, n_iter)
            _record(rec, info, params, phase=1 if in_warmup else 2)
            progress(rec.n)
            if callback is not None:
                callback(rec)
    result = rec.finish({"metric": metric, "softness": softness, "inv_metric": inv_metric,
                         **extras})
    if metric == "softabs":
        work = _kernel_work(kernel, result)
        result.extras.update(third_derivatives=kernel.third_method,
                             hessian=kernel.hessian_method)
    return _charge_unrecorded(result, work)  # the optimiser's time is in the chain's
