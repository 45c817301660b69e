"""``tune_and_sample``: run any of our samplers on a Stan model, chains in parallel
(this process and forked workers), and collect a :class:`~ahmc_stan.fit.Fit`.

A sampler is a function ``run_chain(model, rng, x0, warmup, draws, progress, **options)
-> ChainResult`` registered in :data:`SAMPLERS`.  Each chain gets its own
``numpy.random.Generator`` spawned from ``seed`` and a dispersed initial point drawn with
Stan's rule, so the same seed gives the same draws whether chains run in parallel or not.
Ctrl-C stops every chain and returns a Fit of the draws made so far, flagged
``incomplete``.  With ``output_dir`` every chain also streams its iterations to a file as
they are made, so a run killed outright keeps them too (:func:`load_output`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import dataclasses
import functools
import gc
import inspect
import json
import math
import multiprocessing
import numbers
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from . import blas
from .chain_rerun import continue_slow_chains, last_state, rerun_stray_chains
from .convergence import seed_slow_chains, slow_chains
from .fit import QUANTILE_PROBS, Deferred, Fit
from .model import StanModel
from .samplers.chain import ChainResult, read_stream, streaming, thin_result
from .tuning.fast_warmup import WARMUP as FAST_WARMUP, FastWarmup
from .tuning.stuck import StuckChainError
from .tuning.windows import NONGAUSSIAN_MISFIT, gaussian_misfit
from .workers import share, slot

__all__ = ["tune_and_sample", "load_output", "SAMPLERS", "register_sampler",
           "sampler_options"]


def _ahmc():
    from .samplers import ahmc

    return ahmc.run_chain


def _baseline(name: str):
    def load():
        from .samplers import baselines

        return getattr(baselines, f"run_{name}")
    return load


def _gad(name: str):
    def load():
        from .samplers import gad

        return getattr(gad, f"run_{name}")
    return load


def _module(module: str, function: str = "run_chain"):
    """Loader of ``samplers.<module>.<function>`` (OHMC, SVHMC, OSVHMC)."""
    def load():
        import importlib

        return getattr(importlib.import_module(f".samplers.{module}", __package__), function)
    return load


#: Sampler name -> a function returning its ``run_chain`` (imported on first use).
SAMPLERS: dict[str, Callable[[], Callable[..., ChainResult]]] = {
    "ahmc": _ahmc,
    "rwm": _baseline("rwm"), "mala": _baseline("mala"), "am": _baseline("am"),
    "hmc": _baseline("hmc"),
    "gadrwm": _gad("gadrwm"), "gadmala": _gad("gadmala"),
    "gadmala_exact": _gad("gadmala_exact"),
    "ohmc": _module("ohmc"), "svhmc": _module("svhmc", "run_svhmc"),
    "osvhmc": _module("svhmc", "run_osvhmc"),
    "armhmc": _module("armhmc"), "rmhmc": _module("armhmc", "run_fixed_chain"),
    "bandit": _module("bandit"),  # GP-bandit HMC, super-transitions (Wang 2012, Alg. 3)
}


#: Sampler name -> a function returning its ``continue_chain(model, rng, last, draws,
#: progress, **options)``: more draws of a finished chain (:func:`_extend`).
CONTINUATIONS: dict[str, Callable[[], Callable[..., ChainResult]]] = {
    "ahmc": _module("ahmc", "continue_chain"),
}


#: Warmup iterations per chain when a call does not give ``warmup``: CmdStan's 1000, for
#: every sampler (``README.md``, "The default warmup": AHMC's shorter 500 on small models
#: gained on regressions and lost, in bias and per gradient, on hierarchical models).
STAN_WARMUP = 1000
#: Samplers whose default warmup is shortened where the posterior looks Gaussian
#: (:mod:`ahmc_stan.tuning.fast_warmup`).
FAST_WARMUP_SAMPLERS = ("ahmc",)


def register_sampler(name: str, loader: Callable[[], Callable[..., ChainResult]]) -> None:
    SAMPLERS[name] = loader


#: Where the built-in samplers' ``**options`` go: the AHMC chain's options
#: (:func:`~ahmc_stan.samplers.ahmc.run_tuned_chain`) and the tuner's
#: (:class:`~ahmc_stan.samplers.tuned_blocks.TuningOptions`), or the tuner's alone.
_FORWARDS = {"ahmc": "tuned_chain", "ohmc": "tuned_chain", "svhmc": "tuned_chain",
             "osvhmc": "tuned_chain", "armhmc": "tuned_chain", "bandit": "tuning"}


def sampler_options(sampler: str) -> frozenset[str] | None:
    """The option names ``tune_and_sample(..., sampler=sampler, **options)`` accepts, read
    from the sampler's signature (and, for those that pass options on, from where they go);
    ``None`` for a registered sampler that takes any ``**options``."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose from {sorted(SAMPLERS)}")
    params = list(inspect.signature(SAMPLERS[sampler]()).parameters.values())
    names = {p.name for p in params[6:]
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        return frozenset(names)
    forwards = _FORWARDS.get(sampler)
    if forwards is None:
        return None
    from .samplers.ahmc import run_tuned_chain
    from .samplers.tuned_blocks import TuningOptions

    names |= {f.name for f in dataclasses.fields(TuningOptions)}
    if forwards == "tuned_chain":
        names |= {p.name for p in inspect.signature(run_tuned_chain).parameters.values()
                  if p.kind == p.KEYWORD_ONLY} - {"kernel", "fast_warmup"}
    return frozenset(names)


def _chain_inits(init, chains: int) -> tuple[list[dict | None], float]:
    """Per-chain initial values and the radius of Stan's uniform initialisation from
    ``init`` as cmdstanpy's ``inits`` takes it: ``None``; a number (the radius; 0 starts at
    zero on the unconstrained scale); a dict, or a JSON file of one, for every chain; or a
    list of ``chains`` dicts or files, one per chain.  Values not given are drawn by
    Stan's rule."""
    def load(value, what):
        if value is None or isinstance(value, Mapping):
            return None if value is None else dict(value)
        if isinstance(value, (str, os.PathLike)):
            path = Path(value)
            if not path.is_file():
                raise ValueError(f"{what}: no such file {str(path)!r}")
            try:
                loaded = json.loads(path.read_text())
            except json.JSONDecodeError as err:
                raise ValueError(f"{what}: {path} is not valid JSON ({err})") from None
            if not isinstance(loaded, dict):
                raise ValueError(f"{what}: {path} must hold a JSON object of initial values")
            return loaded
        raise ValueError(f"{what} must be a dict of initial values or a JSON file, not "
                         f"{type(value).__name__}")

    if isinstance(init, numbers.Real) and not isinstance(init, bool):
        if not (init >= 0 and np.isfinite(init)):
            raise ValueError(f"init as a number is the radius of the uniform "
                             f"initialisation and must be >= 0, not {init!r}")
        return [None] * chains, float(init)
    if isinstance(init, (list, tuple)):
        if len(init) != chains:
            raise ValueError(f"init has {len(init)} entries for {chains} chains; give one "
                             "per chain, or one dict for all")
        return [load(v, f"init[{c}]") for c, v in enumerate(init)], 2.0
    one = load(init, "init")
    return [one] * chains, 2.0


def _check_arguments(sampler: str, chains, warmup, draws, seed, parallel,
                     options: Mapping[str, Any], thin=1) -> None:
    """Every argument and option name checked in the caller's process, before any work,
    each with a one-line message."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose from {sorted(SAMPLERS)}")

    def integer(name, value, low):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, not {value!r}")

    integer("chains", chains, 1)
    if warmup is not None:  # None: the default (STAN_WARMUP)
        integer("warmup", warmup, 0)
    integer("draws", draws, 1)
    integer("thin", thin, 1)
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or \
                not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), not {seed!r}")
    if parallel is not None and not isinstance(parallel, bool):
        integer("parallel", parallel, 1)
    if _FORWARDS.get(sampler) and warmup == 0 and options.get("box") is None:
        raise ValueError(f"sampler {sampler!r} derives its box over (step size, steps) "
                         "during warmup: with warmup=0 give box=((eps_lo, eps_hi), "
                         "(L_lo, L_hi))")
    valid = sampler_options(sampler)
    unknown = [k for k in options if valid is not None and k not in valid]
    if unknown:
        raise ValueError(f"unknown option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} for sampler {sampler!r}; valid "
                         f"options: {', '.join(sorted(valid)) or 'none'}")


_CHAIN_RUNNING = False
_STOPPED = False


def _worker_sigint(signum, frame):
    """SIGINT in a worker process: a running chain stops and returns its draws (the
    samplers catch KeyboardInterrupt); an idle worker, or one whose chain has made all
    its draws and is returning them, does not raise (that would break the pool, or lose
    the finished chain); no chain starts in the worker afterwards."""
    global _STOPPED
    _STOPPED = True
    if _CHAIN_RUNNING:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _sigint_as_in_a_worker():
    """A chain run in this (the calling) process: Ctrl-C handled as in a worker
    (:func:`_worker_sigint`) for the chain's duration.  With Python's default handler a
    SIGINT that came after the chain had made all its draws, while it was returning them,
    raised outside the sampler's loop and lost the whole chain; now it stops the call
    after the chain (:func:`_stopped`), the chain kept.  Only in the main thread and over
    Python's default handler: a handler of the caller's own is left in place."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    signal.signal(signal.SIGINT, _worker_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _built_in(job: tuple) -> bool:
    """Whether a job's chain runs ahmc-stan's own code only (a built-in sampler, not one
    registered by :func:`register_sampler`): only such a job may go to a kept worker
    (:mod:`ahmc_stan.workers`), which watches ahmc-stan's modules for changes, not a
    user's."""
    if len(job) < 2 or not isinstance(job[1], str):
        return False
    loaders = CONTINUATIONS if len(job) > 12 and job[12] is not None else SAMPLERS
    return getattr(loaders.get(job[1]), "__module__", None) == __name__


def _stopped() -> bool:
    """Whether Ctrl-C came to this worker process: it takes no more chains."""
    return _STOPPED


def _begin() -> None:
    """A kept worker's next call: a Ctrl-C that came while it was idle is not this
    call's."""
    global _STOPPED
    _STOPPED = False


def _init_worker():
    """A chain worker: Ctrl-C handled by :func:`_worker_sigint`; BLAS without threads
    (:func:`_blas_without_threads`)."""
    signal.signal(signal.SIGINT, _worker_sigint)
    _blas_without_threads()


def _blas_without_threads() -> None:
    """OpenBLAS (numpy's and SciPy's) with no thread pool in this forked worker, whose
    chains are the parallelism.  After a fork OpenBLAS builds its pool again at the first
    BLAS call — or when told to use one thread (``openblas_set_num_threads``, which
    threadpoolctl's ``limit`` calls) — with a thread per core that spins for about 0.1 s
    of CPU each time it is woken: two workers on two cores then run their first chains at
    a third of their speed (measured: a 10-d normal's 4 chains took 100-120 ms instead of
    35).  Setting the pool's size (``blas_num_threads``) and the threads to use
    (``blas_cpu_number``) to 1 before any BLAS call leaves the pool empty; where a BLAS
    lacks these symbols, threadpoolctl's limit for the worker's life."""
    pools = blas.threadpools()
    for lib in pools.info():
        if lib.get("internal_api") != "openblas":
            continue
        try:
            handle = ctypes.CDLL(lib["filepath"])
            for name in ("blas_num_threads", "blas_cpu_number"):
                ctypes.c_int.in_dll(handle, name).value = 1
        except (OSError, ValueError):
            break
    else:
        return
    global _WORKER_BLAS_LIMIT
    _WORKER_BLAS_LIMIT = pools.limit(limits=1, user_api="blas")


class OutOfTime(KeyboardInterrupt):
    """Raised in a chain when ``max_seconds`` has passed: the samplers stop as on Ctrl-C
    and return the draws made so far."""


@contextlib.contextmanager
def _deadline(deadline: float | None):
    """Raise :class:`OutOfTime` in this (main) thread at ``deadline`` (``time.time()``)."""
    if deadline is None:
        yield
        return

    def handler(signum, frame):
        raise OutOfTime()

    if threading.current_thread() is not threading.main_thread():
        raise ValueError("max_seconds with chains run in this process needs the main "
                         "thread; call from it, or use parallel workers")
    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.time(), 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _start_clock(max_seconds) -> float | None:
    """The deadline (``time.time()``) of a call with a ``max_seconds`` budget."""
    if max_seconds is None:
        return None
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, numbers.Real) or \
            not max_seconds > 0:
        raise ValueError(f"max_seconds must be a positive number, not {max_seconds!r}")
    if not hasattr(signal, "setitimer"):
        raise ValueError("max_seconds needs POSIX interval timers (not on this platform)")
    return time.time() + float(max_seconds)


def _run_one(model: StanModel, sampler: str, chain: int, seed: np.random.SeedSequence,
             init: Mapping[str, Any] | None, warmup: int, draws: int, progress: bool,
             options: dict, radius: float = 2.0, deadline: float | None = None,
             stream: Path | None = None, resume: ChainResult | None = None
             ) -> ChainResult | None:
    """One chain, in this process or a worker.  BLAS runs single-threaded inside a chain:
    chains are the parallelism, and threaded BLAS on small matrices (the tuner's GP) only
    oversubscribes the cores — ten times slower on a loaded machine.  At ``deadline`` the
    chain stops and returns what it has (``None`` if it had not started sampling).
    ``stream``: the file the chain streams its iterations to.  ``resume``: a finished
    chain that this one continues for ``draws`` more iterations (:func:`_extend`)."""
    global _CHAIN_RUNNING
    if _STOPPED or deadline is not None and time.time() >= deadline:
        return None
    with _sigint_as_in_a_worker():
        _CHAIN_RUNNING = True
        try:
            with _deadline(deadline), streaming(stream):
                return _run_chain(model, sampler, chain, seed, init, warmup, draws,
                                  progress, options, radius, resume)
        except OutOfTime:  # before the sampler's own loop caught it
            return None
        finally:
            _CHAIN_RUNNING = False


class ChainProgress:
    """A chain's progress, ``progress(n)`` after ``n`` iterations: a tqdm bar that names
    the phase (``warmup``/``sampling``) on a terminal; elsewhere (CI logs, files) a plain
    line at every 10 % instead of escape sequences."""

    def __init__(self, label: str, warmup: int, draws: int, position: int = 0,
                 enabled: bool = True, stream=None):
        from tqdm.auto import tqdm

        self.label, self.warmup, self.total = label, warmup, warmup + draws
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.phase, self.next_percent = None, 10
        tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = tqdm(total=self.total, desc=f"{label} ({self._phase(0)})",
                        position=position, leave=True, mininterval=0.5,
                        file=self.stream) if tty else None
        if self.bar is not None:
            self.phase = self._phase(0)

    def set_warmup(self, warmup: int) -> None:
        """The chain's warmup turned out to be ``warmup`` iterations (a fast warmup)."""
        self.total += warmup - self.warmup
        self.warmup = warmup
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def _phase(self, n: int) -> str:
        return "warmup" if n < self.warmup else "sampling"

    def __call__(self, n: int) -> None:
        phase = self._phase(n)
        if self.bar is not None:
            if phase != self.phase:
                self.bar.set_description(f"{self.label} ({phase})", refresh=False)
            self.bar.update(n - self.bar.n)
        elif self.enabled and self.total:
            percent = 100 * n // self.total
            if percent >= self.next_percent or (phase != self.phase and n):
                self.stream.write(f"{self.label}: {phase} {n}/{self.total} ({percent}%)\n")
                self.stream.flush()  # one write a line: parallel chains do not interleave
                self.next_percent = (percent // 10 + 1) * 10
        self.phase = phase

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _one_blas_thread():
    """BLAS limited to one thread for a chain, unless it is already (as in
    :func:`tune_and_sample`, and in a worker): telling OpenBLAS its number of threads
    rebuilds the pool that a fork shut down, with threads that spin, slowing the chains
    of this process and its workers (README, "AHMC against the best NUTS", stop 65)."""
    pools = blas.threadpools()
    if all(lib.get("num_threads") == 1 for lib in pools.info()
           if lib.get("user_api") == "blas"):
        return contextlib.nullcontext()
    return pools.limit(limits=1, user_api="blas")


def _run_chain(model, sampler, chain, seed, init, warmup, draws, progress, options, radius,
               resume=None):
    rng = np.random.default_rng(seed)
    if resume is None:
        run_chain = SAMPLERS[sampler]()
        x0 = model.initial_point(rng, init, radius=radius)
    else:
        run_chain = CONTINUATIONS[sampler]()
    label = f"{sampler} chain {chain + 1}" + ("" if resume is None else " (more draws)")
    bar = ChainProgress(label, warmup, draws, position=chain, enabled=progress)

    def report(n: int) -> None:
        global _CHAIN_RUNNING
        bar(n)
        if n >= bar.total:  # every draw made: a SIGINT now must not lose the chain
            _CHAIN_RUNNING = False

    report.warmup = bar.set_warmup  # a fast warmup shortens the chain
    fast = options.get("fast_warmup")
    if hasattr(fast, "member"):  # this chain's side of the fit's decision
        fast = fast.member(chain)
        options = {**options, "fast_warmup": fast}
    pool = options.get("pool_windows")
    if pool is not None and hasattr(pool, "member"):  # this chain's share of the pool
        pool = pool.member(chain)
        options = {**options, "pool_windows": pool}
    try:
        with _one_blas_thread():
            if resume is not None:
                return run_chain(model, rng, resume, draws, report, **options)
            return run_chain(model, rng, x0, warmup, draws, report, **options)
    except StuckChainError as err:  # name the chain (1-based, as the progress bars)
        raise err.for_chain(chain + 1) from None
    finally:
        bar.close()
        if hasattr(pool, "leave"):  # done, stopped or failed: no chain waits for this one
            pool.leave()  # (the windows it put in stay pooled)
        if hasattr(fast, "leave"):
            fast.leave()


def _cost_units(model: StanModel, results: list[ChainResult], *stats: dict) -> dict:
    """Cost in gradients of each kind of evaluation the chains made
    (:func:`ahmc_stan.costs.cost_units`, measured once per model at a draw of the first
    chain); a failed measurement leaves the kind out (its equivalents are then nan)."""
    from .costs import COST_STATS, cost_units

    kinds = sorted({kind for block in stats for stat, kind in COST_STATS.items()
                    if kind != "gradient" and stat in block and np.any(block[stat])})
    if not kinds:
        return {}
    third, hessian = (next((r.extras.get(key) for r in results if r.extras.get(key)), "auto")
                      for key in ("third_derivatives", "hessian"))
    x = next((r.positions[-1] for r in results if len(r.positions)), None)
    try:
        return cost_units(model, kinds, third_method=third, hessian_method=hessian, x=x)
    except Exception as err:  # noqa: BLE001 — the draws stay usable without the units
        warnings.warn(f"could not measure the cost of {', '.join(kinds)} on "
                      f"{model.name}: {err}; ESS per gradient will be nan", RuntimeWarning)
        return {}


def _assemble(model: StanModel, sampler: str, results: list[ChainResult], seed: int,
              warmup: int, draws: int, options: dict, interrupted: bool, thin: int = 1,
              gq_key: int = 1) -> Fit:
    """Constrain the chains' positions and stack them into a Fit, keeping every
    ``thin``-th of the ``draws`` sampling iterations (:func:`thin_result`).  After an interruption
    chains may have different lengths: chains that had not finished warmup are left out
    when others have post-warmup draws (``metadata["dropped_chains"]``); the Fit's
    arrays hold the draws all kept chains reached, and each chain's draws beyond that
    are kept in ``metadata["extra_draws"]`` (:meth:`Fit.chain_draws` gives a chain's
    whole run).  ``gq_key``: the generated quantities' random numbers come from
    ``SeedSequence([seed, gq_key])`` (another key for a continuation, :func:`_extend`)."""
    results = [thin_result(r, warmup, thin) for r in results]
    kept_draws = -(-draws // thin)
    dropped = []
    if any(r.n_warmup == warmup and r.n_sampling > 0 for r in results):
        dropped = [{"chain": r.extras.get("chain"), "warmup_iterations": r.n_warmup}
                   for r in results if not (r.n_warmup == warmup and r.n_sampling > 0)]
        results = [r for r in results if r.n_warmup == warmup and r.n_sampling > 0]
    n_warm = min(r.n_warmup for r in results)
    n_samp = min(r.n_sampling for r in results) if n_warm == warmup else 0
    names = model.param_names(include_tp=True, include_gq=True)
    gq_rngs = np.random.SeedSequence([seed, gq_key]).spawn(len(results))

    itself = len(names) == model.dims and model.constrains_to_itself  # the positions

    def constrained(r, rows, gq_seed):
        if itself:
            return r.positions[rows].copy()
        return model.constrain(r.positions[rows], include_tp=True, include_gq=True,
                               rng=np.random.default_rng(gq_seed))

    warm_rows, samp_rows = slice(0, n_warm), slice(warmup, warmup + n_samp)
    if itself:
        stack = lambda rows: np.array([r.positions[rows] for r in results])  # noqa: E731
    else:
        stack = lambda rows: np.array(model.constrain_each(  # noqa: E731
            [r.positions[rows] for r in results],
            [np.random.default_rng(s) for s in gq_rngs], include_tp=True, include_gq=True))
    stats = lambda rows: {k: np.array([r.stats[k][rows] for r in results])
                          for k in results[0].stats}
    incomplete = interrupted or any(r.interrupted for r in results) or n_samp < kept_draws \
        or bool(dropped)
    warm_stats, samp_stats = stats(warm_rows), stats(samp_rows)
    ragged = {}
    if any(r.n_sampling > n_samp for r in results) or dropped:
        tail_rngs = np.random.SeedSequence([seed, gq_key + 1]).spawn(len(results))
        ragged = {"dropped_chains": dropped, "extra_draws": [
            constrained(r, slice(warmup + n_samp, warmup + r.n_sampling), s)
            if r.n_sampling > n_samp else np.empty((0, len(names)))
            for r, s in zip(results, tail_rngs)]}
    warm_shape = (len(results), n_warm, len(names))
    return Fit(
        stack(samp_rows).reshape(len(results), n_samp, len(names)), names, samp_stats,
        n_params=len(model.param_names()),
        # the warmup's draws when first used (constraining them costs as much again)
        warmup_draws=Deferred(warm_shape, lambda: stack(warm_rows).reshape(warm_shape)),
        warmup_sampler_stats=warm_stats,
        cost_units=_cost_units(model, results, warm_stats, samp_stats),
        time_warmup=sum(r.time_warmup for r in results),
        time_sampling=sum(r.time_sampling for r in results),
        sampler=sampler, incomplete=incomplete,
        metadata={"seed": seed, "warmup": warmup, "draws": draws, "thin": thin, "options": {
            k: v for k, v in options.items() if isinstance(v, (int, float, str, bool))},
            "chains": [r.extras for r in results], "int_variables": model.int_variables(),
            **ragged},
    )


def tune_and_sample(model: StanModel, sampler: str = "ahmc", chains: int = 4,
                    warmup: int | None = None, draws: int = 1000,
                    seed: int | None = None,
                    init: Any = None, progress: bool = True,
                    parallel: bool | int | None = None, diagnose: bool = True,
                    max_seconds: float | None = None, thin: int = 1,
                    output_dir: str | os.PathLike | None = None,
                    metric_rerun: bool = True, chain_rerun: bool = True,
                    extend: bool = True, **options) -> Fit:
    """Tune ``sampler`` on ``model`` during ``warmup`` iterations, then run ``draws``
    sampling iterations and keep every ``thin``-th (CmdStan's ``thin``: the first, then
    every ``thin``-th; a kept draw's ``n_grad`` counts the gradients of the ``thin``
    iterations it stands for, so ESS per gradient is unchanged; warmup iterations are all
    kept).  ``warmup`` defaults to CmdStan's 1000 (:data:`STAN_WARMUP`); for AHMC
    (:data:`FAST_WARMUP_SAMPLERS`) the default is 500 where the first chain finds the
    posterior Gaussian in its scale phase, and every chain follows it
    (:mod:`ahmc_stan.tuning.fast_warmup`; ``metadata["fast_warmup"]`` records it, and
    ``metadata["warmup"]`` the length run).  A ``warmup`` given is run as asked.

    ``parallel``: number of chains run at once (``True``/``None``: as many as cores,
    capped at ``chains``; ``False`` or 1: one after another in this process); this
    process runs chains too, beside ``parallel - 1`` forked workers.  With
    ``True``/``None`` on two or more cores, chains still waiting for a core
    :data:`~ahmc_stan.workers.LATE_SECONDS` after the start start then, sharing the
    cores, so that a core does not idle while the last chain runs.
    ``options`` go to the sampler (for AHMC: ``metric``, ``box``, ``k``,
    ``adapt_during_sampling``, ... — see :mod:`ahmc_stan.samplers.ahmc`).
    ``diagnose``: run :func:`ahmc_stan.convergence.diagnose` on the fit and emit a
    :class:`~ahmc_stan.convergence.ConvergenceWarning` with its report if it finds
    problems (R-hat, ESS, divergences, stuck chains, E-BFMI, ...).

    A chain whose warmup gets stuck more than ``max_restarts`` times (an option of the
    AHMC family and of ``hmc``, :mod:`ahmc_stan.tuning.stuck`) raises
    :class:`~ahmc_stan.tuning.stuck.StuckChainError` naming the chain (``"chain 3: ..."``).

    ``init`` as cmdstanpy's ``inits``: a dict of initial values (or a JSON file of one)
    for every chain, a list of one per chain, or a number, the radius of Stan's uniform
    initialisation (default 2; 0: zero on the unconstrained scale).

    ``max_seconds``: a time budget for the whole call.  When it runs out every chain stops
    as on Ctrl-C and the Fit holds the draws made so far, flagged ``incomplete`` with
    ``metadata["out_of_time"]`` set (chains run one after another that had not started
    are left out).

    ``output_dir``: each chain streams its iterations to ``chain_<c>.stream`` there as they
    are made (unconstrained positions and statistics; ``run.json`` says how to rebuild
    the Fit); at the end the Fit is written to ``fit.npz`` and its draws, with Stan's
    column names, to ``draws.csv``.  :func:`load_output` reads the folder back, also after
    the run was killed.

    ``metric_rerun``: a sampler whose default metric is estimated from gradients (AHMC's
    ``auto``; where it chose Stan's diagonal only the second step below applies), run
    without a ``metric`` option, whose fit fails the tail-rejection
    check (:mod:`ahmc_stan.convergence`: the step size too large for a tail, which the
    chains then under-explore, all alike), or both the R-hat and an ESS check with an ESS
    below a tenth of the draws (chains that disagree and mix slowly), or in which at least
    half but not all chains fell back to Stan's diagonal, or whose low-rank chains' draws
    are far from Gaussian (:func:`_nongaussian`: a skewed or long-tailed direction the
    chains can all under-visit), and not the E-BFMI
    check, is run again, same seed, with Stan's diagonal metric (``metric="diag"``); if
    that fit fails the tail-rejection check too, or has divergent transitions, once more
    with ``adapt_delta=0.95`` as well (unless the call set it) (:data:`RERUN_STEPS`).  The
    first of these fits that has converged without divergences is returned, else of those
    that converged the one with the fewest divergences (the later on a tie; else the one
    with the largest min ESS, the first fit on a tie).  (The misfit is measured on every
    complete fit some of whose chains ended with
    a low-rank metric, also when the call chose the metric or turned the rerun off: the
    diagnosis warns ``nongaussian`` when the draws returned are such a fit's and far from
    Gaussian.)  ``fit.metadata["metric_rerun"]`` logs it; the gradients and seconds of the
    runs not returned are charged to the returned one's warmup (each chain's first
    iteration), so ESS per gradient and per second count them; with ``output_dir`` the
    reruns' chains stream to its subfolders ``metric_rerun`` and ``metric_rerun_2`` and
    ``fit.npz`` holds the returned fit.  ``False`` turns this off.

    ``chain_rerun``: a chain whose draws lie in a region of far lower density than the
    other chains' (a minor mode, or a slow crawl from a far-out start) and that holds, by
    a Laplace estimate, a negligible share of the probability mass is run again with a new
    seed, and so is a chain whose adaptation failed (divergent in over 1 % of its
    iterations while the other chains are not, and mixing far slower than they do)
    (:mod:`ahmc_stan.chain_rerun`); ``fit.metadata["chain_rerun"]`` logs it and the
    discarded chain's cost is charged to the kept chain's warmup.  A chain that only
    mixes far slower than the others (the diagnosis's slow-chain rule) is sampled again
    from its last draw in the parameters of the chain that mixes best, its first draws
    counted as warmup (samplers that can continue a chain, :data:`CONTINUATIONS`;
    ``fit.metadata["slow_chains"]``).  ``False`` turns both off.

    ``extend``: a fit whose R-hat is above 1.01 or an ESS below 100 per chain, while every
    bulk and tail ESS is at least 50 per chain (the chains mix; R-hat's noise and the
    ESS's shortfall are then a matter of draws) and no problem that more draws cannot
    cure is found (:data:`EXTEND_BLOCKERS`), gets ``draws`` more iterations per chain,
    once: each chain of a sampler that can continue one (:data:`CONTINUATIONS`:
    AHMC) goes on from its last draw with its last step size, number of steps and
    metric, frozen (:func:`_extend`).  The Fit then holds twice the draws,
    ``metadata["extension"]`` logs it (R-hat and min ESS before and after, gradients,
    seconds), and the diagnosis judges the whole.  ``False`` turns this off.

    Arguments and option names are checked before any work starts (``ValueError``, one
    line, listing the valid options: :func:`sampler_options`).
    """
    _check_arguments(sampler, chains, warmup, draws, seed, parallel, options, thin)
    inits, radius = _chain_inits(init, chains)
    fast = warmup is None and sampler in FAST_WARMUP_SAMPLERS and os.name == "posix"
    if warmup is None:
        warmup = STAN_WARMUP
    deadline = _start_clock(max_seconds)
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**32)
    # this process's own work (its chains, and the decisions between runs) on arrays of
    # one fit: BLAS threads only contend with the workers and wake slowly (the diagnosis
    # holds them to one thread itself)
    with blas.one_thread():
        fit = _tune_and_sample(model, sampler, chains, warmup, draws, seed, inits, radius,
                               progress, parallel, deadline, max_seconds, thin, chain_rerun,
                               fast, metric_rerun, extend, output_dir, options)
    if diagnose:
        from .convergence import warn_if_problems

        warn_if_problems(fit)
    return fit


def _tune_and_sample(model, sampler, chains, warmup, draws, seed, inits, radius, progress,
                     parallel, deadline, max_seconds, thin, chain_rerun, fast, metric_rerun,
                     extend, output_dir, options) -> Fit:
    """The runs of one :func:`tune_and_sample` call and the decisions between them."""
    run = functools.partial(_run_chains, model, sampler, chains, warmup, draws, seed, inits,
                            radius, progress, parallel, deadline, max_seconds, thin,
                            chain_rerun)
    fit = run({**options, "fast_warmup": True} if fast else options, output_dir)
    nongaussian = "" if fit.incomplete else _nongaussian(fit, model)  # also with no rerun
    steps = _fit_rerun_steps(sampler, options, fit) if metric_rerun and not fit.incomplete else []
    if steps:
        fit = _metric_rerun(fit, lambda step, i: run(
            {**options, **step}, None if output_dir is None else
            Path(output_dir) / ("metric_rerun" if i == 0 else f"metric_rerun_{i + 1}")),
            progress, steps, nongaussian)
    if extend and not fit.incomplete:
        fit = _extend(fit, model, sampler, seed, draws, thin, progress, parallel, deadline,
                      options)
    fit.__dict__.pop("_chain_results", None)  # the raw chains: not kept with the Fit
    if output_dir is not None:
        fit.save(Path(output_dir) / "fit.npz")
        fit.draws_pd().to_csv(Path(output_dir) / "draws.csv", index=False)
    return fit


#: Gradient-based metrics (:mod:`ahmc_stan.tuning.hmc_warmup`) whose fits get the rerun.
GRADIENT_METRICS = ("low_rank", "fisher")
#: The reruns, in order, each made when the run before fails the tail-rejection check
#: (the first also when its chains disagree and mix slowly, a later one when the run
#: before has an R-hat above 1.01 or divergent transitions) and not the E-BFMI check:
#: Stan's diagonal metric, from the draws alone; then the same with smaller steps (dual
#: averaging aiming at an acceptance statistic of 0.95, Stan's advice when the step size
#: is too large for a region of the posterior).  A step is left out when the call set
#: one of its options.
RERUN_STEPS = ({"metric": "diag"}, {"metric": "diag", "adapt_delta": 0.95})
#: Chain reruns draw their seeds from ``SeedSequence([seed, RERUN_SEED_KEY, attempt])``,
#: slow chains' continuations from ``SeedSequence([seed, SLOW_SEED_KEY])`` (with the
#: round appended from the second on).
RERUN_SEED_KEY = 100
SLOW_SEED_KEY = 102


def _rerun_applies(sampler: str, options: Mapping[str, Any]) -> bool:
    """The sampler's default metric is gradient-based (or ``"auto"``, which may be) and
    the call did not choose one."""
    if "metric" in options:
        return False
    param = inspect.signature(SAMPLERS[sampler]()).parameters.get("metric")
    return param is not None and param.default in (*GRADIENT_METRICS, "auto")


def _ran_gradient_metric(fit: Fit) -> bool:
    """Some chain of ``fit`` ran a gradient-based metric (``"auto"`` resolves per model;
    where it chose Stan's diagonal, only the reruns that change more than the metric
    apply)."""
    chains = fit.metadata.get("chains") or []
    return any(c.get("metric", "low_rank") in GRADIENT_METRICS for c in chains) or not chains


def _rerun_steps(sampler: str, options: Mapping[str, Any]) -> list[dict]:
    """The steps of :data:`RERUN_STEPS` that apply to this call: none unless
    :func:`_rerun_applies`; then those none of whose options the call set and all of
    which the sampler takes."""
    if not _rerun_applies(sampler, options):
        return []
    params = inspect.signature(SAMPLERS[sampler]()).parameters
    return [dict(step) for step in RERUN_STEPS
            if all(k in params and k not in options for k in step)]


def _fit_rerun_steps(sampler: str, options: Mapping[str, Any], fit: Fit) -> list[dict]:
    """:func:`_rerun_steps` for ``fit``: where ``"auto"`` ran Stan's diagonal, the steps
    that change only the metric are left out (they would run the same again)."""
    steps = _rerun_steps(sampler, options)
    if steps and not _ran_gradient_metric(fit):
        steps = [step for step in steps if set(step) != {"metric"}]
    return steps


def _options_text(step: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in step.items())


def _metric_rerun(first: Fit, rerun: Callable[[dict, int], Fit], progress: bool,
                  steps=RERUN_STEPS[:1], nongaussian: str = "") -> Fit:
    """``first``, or the fit of the first of ``steps`` that converged, each step run
    (``rerun(step options, index)``) only when the run before fails the tail-rejection
    check; the other runs' cost charged to the returned fit's warmup.  The first step
    runs too when ``first``'s chains both disagree and mix slowly
    (:func:`_slow_and_apart`): on SV the low-rank metric leaves φ and β so, where Stan's
    diagonal mixes them better (README, "SV since the two changes"), or when at least
    half but not all of its chains fell back to Stan's diagonal (:func:`_mixed_fallback`),
    or when ``nongaussian`` gives a reason (:func:`_nongaussian`: on a zero-inflated
    regression's skewed inflation intercept the low-rank chains agree and under-visit its
    long tail, with nothing in the diagnosis to show for it); a later step also when the
    run before has an R-hat above 1.01: there the diagonal's chains still disagree, and
    its smaller steps (``adapt_delta=0.95``) converge (README, "Models the defaults were
    not tuned on"), or divergent transitions, Stan's sign of a step size too large for a
    region (on UCB admissions the diagonal's fits that diverge under-state ``sigma``'s
    sd: README, "Divergences after the rerun").  A converged fit with divergences is
    kept while the next step runs, and returned if that one does not converge or
    diverges more.
    When none of the reruns converged, the complete fit with the largest min ESS (bulk
    and tail, over the parameters; the first fit on a tie) is returned: ESS falls both
    when the chains disagree and when they mix slowly, so it ranks fits that all warn
    (on SV the diagonal's fits against the low-rank one).  No rerun when the E-BFMI is low as
    well: the momenta cannot explore the energy (Betancourt 2016), a funnel-like
    geometry that a reparameterisation cures and no constant metric does
    (``comparisons/metric_rerun.py`` measures both rules)."""
    from .convergence import diagnose

    found = diagnose(first, checks=("tail_rejection", "ebfmi", "rhat_ess"))
    fell_back = _mixed_fallback(first)
    if not (found.get("tail_rejection") or _slow_and_apart(first, found) or fell_back
            or nongaussian):
        return first
    reason = "; ".join(r for r in (found.summary(), fell_back, nongaussian) if r)
    record = {"metric": steps[0]["metric"], "reason": reason, "runs": [],
              "first_warmup": first.metadata.get("warmup")}
    if "gaussian_misfit" in first.metadata:
        record["gaussian_misfit"] = first.metadata["gaussian_misfit"]
    if found.get("ebfmi"):
        record.update(ran=False, adopted=False, note=(
            f"{record['reason']} with the default metric: not run again with "
            f"{_options_text(steps[0])}, since a low E-BFMI points to the geometry "
            "(reparameterise) rather than the metric"))
        first.metadata["metric_rerun"] = record
        return first
    record["ran"] = True
    fits, chosen = [first], None
    for i, step in enumerate(steps):
        if i > 0:  # each later step is judged on the run before it
            found = diagnose(fits[-1], checks=("tail_rejection", "ebfmi", "rhat_ess",
                                               "divergences"))
            if not (found.get("tail_rejection") or found.get("rhat")
                    or found.get("divergences")) or found.get("ebfmi"):
                break
        if progress:
            why = reason if i == 0 else found.summary()
            print(f"{first.sampler}: {why}; running again with {_options_text(step)}",
                  file=sys.stderr, flush=True)
        try:
            fit = rerun(step, i)
        except (KeyboardInterrupt, TimeoutError) as stop:  # no draw made: keep the others
            record["stopped"] = type(stop).__name__
            break
        problems = diagnose(fit)
        converged = not fit.incomplete and problems.converged
        record["runs"].append({"options": dict(step), "problems": problems.summary(),
                               "adopted": converged})
        fits.append(fit)
        if converged:  # with divergences, the next step (if any) runs too
            if chosen is None or (fit.efficiency()["divergences"]
                                  <= chosen.efficiency()["divergences"]):
                chosen = fit
            if not problems.get("divergences"):
                break
        if fit.incomplete:  # interrupted or out of time: no further step
            record["stopped"] = "incomplete"
            break
    record["adopted"] = chosen is not None
    for run, fit in zip(record["runs"], fits[1:]):
        run["adopted"] = fit is chosen
    if chosen is None:
        chosen = max((f for f in fits if not f.incomplete), key=_min_ess)  # first of equals
        record["best_unconverged"] = fits.index(chosen)
    if record["runs"]:
        record["rerun_problems"] = record["runs"][-1]["problems"]
    others = [f for f in fits if f is not chosen]
    notes = []
    for other in others:
        _charge(chosen, other)
        for key in ("chain_rerun", "slow_chains"):  # their cost is in other's, now charged
            if key in other.metadata:
                notes.append(other.metadata[key]["note"])
    if notes:
        record["other_run_chain_rerun"] = "; ".join(notes)
    if others:
        record["charged"] = {
            "n_grad": sum(o.n_grad_warmup + o.n_grad_sampling for o in others),
            "seconds": sum(o.time_warmup + o.time_sampling for o in others)}
    ran = "; then with ".join(_options_text(r["options"]) for r in record["runs"])
    if record["adopted"]:
        at = fits.index(chosen)
        kept = ("its fit is returned" if len(record["runs"]) == 1 else
                "the last fit is returned" if at == len(fits) - 1 else
                f"the last {'diverged more' if converged else 'did not converge'} "
                f"({record['rerun_problems']}): the fit with "
                f"{_options_text(record['runs'][at - 1]['options'])} is returned")
    else:
        best = record["best_unconverged"]
        which = ("the first fit is returned" if best == 0 else
                 f"the fit with {_options_text(record['runs'][best - 1]['options'])} is "
                 f"returned, its min ESS {_min_ess(chosen):.0f} the largest (the first "
                 f"fit's {_min_ess(first):.0f})")
        kept = (f"it did not converge either ({record.get('rerun_problems') or 'stopped'}): "
                + which)
    runs = "run's" if len(others) == 1 else "runs'"
    cost = (f"; the other {runs} {record['charged']['n_grad']} gradients and "
            f"{record['charged']['seconds']:.3g} chain-seconds are counted in warmup"
            if "charged" in record else "")
    record["note"] = (f"{record['reason']} with the default metric: ran again with "
                      f"{ran or _options_text(steps[0]) + ' (stopped)'}; {kept}{cost}")
    chosen.metadata["metric_rerun"] = record
    return chosen


#: :func:`_slow_and_apart`: an ESS below this share of the draws is slow mixing.
SLOW_ESS_PER_DRAW = 0.1


def metric_fallbacks(metadata: Mapping[str, Any]) -> int:
    """The chains of a fit (``fit.metadata``) whose gradient-based metric fell back to
    Stan's diagonal in their last window; 0 where ``metadata["chains"]`` is not a list of
    chains' records (CmdStan's NUTS keeps the number of chains there)."""
    chains = metadata.get("chains")
    if not isinstance(chains, list):
        return 0
    return sum(c.get("metric_fallback") is not None for c in chains)


def _mixed_fallback(fit: Fit) -> str:
    """A reason for :func:`_metric_rerun` when at least half but not all chains of
    ``fit`` fell back to Stan's diagonal (:func:`metric_fallbacks`), else ``""``.  So many
    fallbacks show the gradient-based metric diverging on this posterior, and the chains
    that kept it are the suspect ones: on UCB admissions they under-visit the curved tail
    of the group scale with nothing in the diagnosis to show for it.  One chain of four
    falling back, mostly the step size's restart diverging early in the last window, is
    left alone (README, "A silent failure at the defaults", measures both)."""
    n, chains = metric_fallbacks(fit.metadata), fit.metadata.get("chains")
    if n and len(chains) <= 2 * n < 2 * len(chains):
        return (f"the gradient-based metric fell back to Stan's diagonal in {n} of "
                f"{len(chains)} chains")
    return ""


#: :func:`_nongaussian` runs a low-rank fit again above the Gaussian misfit
#: :data:`~ahmc_stan.tuning.windows.NONGAUSSIAN_MISFIT`; it takes the gradients at this
#: many draws (evenly spaced over the chains), a quarter of them first, and stops there
#: when that quarter's misfit is below :data:`MISFIT_CLEAR` (Gaussian posteriors give 0
#: to rounding, the GLMs measured up to 0.1: README, "A rule for skewed tails").
MISFIT_DRAWS = 1000
MISFIT_CLEAR = 1.0


def _nongaussian(fit: Fit, model: StanModel) -> str:
    """A reason for :func:`_metric_rerun` when some chain of ``fit`` sampled with a
    low-rank metric and the posterior its draws show is far from Gaussian, else ``""``:
    the :func:`~ahmc_stan.tuning.windows.gaussian_misfit` of :data:`MISFIT_DRAWS` of its
    draws (all chains pooled, unconstrained) and their gradients is above
    :data:`NONGAUSSIAN_MISFIT` (computed from a quarter of them first, and no further
    when that is below :data:`MISFIT_CLEAR`).  The low-rank correction fits a Gaussian's
    scales, between the draws' variance and the inverse of the gradients' along a skewed
    or long-tailed direction, and its chains can agree while they under-visit that tail
    (README, "A rule for skewed tails").  The gradients are counted, and their seconds
    charged, in the fit's warmup; ``metadata["gaussian_misfit"]`` keeps the misfit and
    that cost, and the diagnosis's ``nongaussian`` warning reads it when this fit's draws
    are the ones returned.  Nothing is measured (``""``, no record) with no more draws
    than the misfit's affine fit needs."""
    results = getattr(fit, "_chain_results", None)
    chains = fit.metadata.get("chains") or []
    if not results or not any(isinstance(c.get("inv_metric"), Mapping) for c in chains):
        return ""  # no chain ended with a low-rank correction (its record: the factors)
    rows = [r.positions[r.n_warmup:r.n_warmup + r.n_sampling] for r in results]
    every = max(1, -(-sum(map(len, rows)) // MISFIT_DRAWS))
    rows = [r[::every] for r in rows]
    x, n_chains = np.concatenate(rows), len(rows)
    owner = np.repeat(np.arange(n_chains), [len(r) for r in rows])
    if len(x) <= x.shape[1] + 2:
        return ""  # too few draws for the misfit's affine fit
    g, have = np.empty_like(x), np.zeros(len(x), dtype=bool)
    every_draw, quarter = np.ones_like(have), np.zeros_like(have)
    quarter[::4] = True
    stages = (quarter, every_draw) if quarter.sum() > x.shape[1] + 2 else (every_draw,)
    start = time.perf_counter()
    for done in stages:  # a quarter first (enough draws for it), the rest unless clear
        rows = np.flatnonzero(done & ~have)
        out = np.empty((len(rows), x.shape[1]))
        model.density.log_density_gradient_rows(x[rows], out)
        g[rows] = out
        have = done
        misfit = gaussian_misfit(x[done], g[done])
        if not misfit >= MISFIT_CLEAR:
            break
    seconds = time.perf_counter() - start
    spent = np.bincount(owner[have], minlength=n_chains)  # each chain's draws' gradients
    _charge_counts(fit, spent, seconds, {"gradient": int(spent.sum())})
    fit.metadata["gaussian_misfit"] = {"misfit": misfit, "n_grad": int(spent.sum()),
                                       "seconds": seconds}
    if not misfit > NONGAUSSIAN_MISFIT:
        return ""
    return (f"the draws are far from Gaussian (misfit {misfit:.3g} above "
            f"{NONGAUSSIAN_MISFIT:g}), where the low-rank metric can under-visit a tail")


def _slow_and_apart(fit: Fit, found) -> bool:
    """Chains that disagree and mix slowly, which :func:`_metric_rerun` runs again: the
    diagnosis ``found`` of ``fit`` has R-hat above 1.01 and a bulk or tail ESS below 100
    per chain, and that ESS is below :data:`SLOW_ESS_PER_DRAW` of the draws (so that a
    short run of chains that mix well, whose R-hat is noisy, is not run again)."""
    return bool(found.get("rhat") and (found.get("ess_bulk") or found.get("ess_tail"))
                and _min_ess(fit) < SLOW_ESS_PER_DRAW * fit.chains * fit.n_draws)


def _min_ess(fit: Fit) -> float:
    """The smallest bulk or tail ESS over the fit's varying parameters (0 if none is
    finite): what :func:`_metric_rerun` ranks unconverged fits by."""
    e = fit.efficiency()
    values = [e["min_ess_bulk"], e["min_ess_tail"]]
    return float(min(values)) if all(np.isfinite(values)) else 0.0


def _charge(fit: Fit, other: Fit) -> None:
    """Charge ``other``'s evaluations and seconds to ``fit``'s warmup
    (:func:`_charge_counts`)."""
    spent = None
    if "n_grad" in other.sampler_stats:
        spent = np.sum(other.sampler_stats["n_grad"], axis=1)
        if other.warmup_sampler_stats and "n_grad" in other.warmup_sampler_stats:
            spent = spent + np.sum(other.warmup_sampler_stats["n_grad"], axis=1)
    evals = {kind: other.n_eval_warmup.get(kind, 0) + other.n_eval_sampling.get(kind, 0)
             for kind in set(other.n_eval_warmup) | set(other.n_eval_sampling)}
    _charge_counts(fit, spent, other.time_warmup + other.time_sampling, evals)


def _charge_counts(fit: Fit, per_chain, seconds: float, evals: Mapping[str, int]) -> None:
    """Charge the evaluations ``evals`` (kind → count) and ``seconds`` to ``fit``'s
    warmup, the gradients ``per_chain`` (or ``None``) to each chain's first warmup
    iteration (all to chain 1's when the chains do not pair up)."""
    ws = fit.warmup_sampler_stats
    n_grad = ws.get("n_grad") if ws else None
    if per_chain is not None and n_grad is not None and n_grad.shape[1]:
        per_chain = np.asarray(per_chain)
        if len(per_chain) == n_grad.shape[0]:
            n_grad[:, 0] += per_chain.astype(n_grad.dtype)
        else:
            n_grad[0, 0] += per_chain.sum().astype(n_grad.dtype)
    for kind, n in evals.items():
        fit.n_eval_warmup[kind] = fit.n_eval_warmup.get(kind, 0) + n
    fit.n_grad_warmup = fit.n_eval_warmup["gradient"]
    fit.time_warmup += seconds


#: Extensions draw their chains' seeds from ``SeedSequence([seed, EXTEND_SEED_KEY])``.
EXTEND_SEED_KEY = 101
#: :func:`_extend` takes up a fit whose every bulk and tail ESS is at least this share of
#: the diagnosis's bound (100 per chain): twice the draws can then reach it.
EXTEND_ESS_SHARE = 0.5
#: Problems that say the kernel misses part of the posterior, which more of its draws do
#: not cure (a low E-BFMI: the funnel-like geometry the metric rerun leaves alone too;
#: rejections in a tail; divergences past the diagnosis's bound; a stuck chain): a fit
#: with one of them is not extended (on the centred eight schools it only made the
#: flagged bias surer, README "R-hat settled by more draws").
EXTEND_BLOCKERS = ("ebfmi", "tail_rejection", "divergences", "stuck_chain")


def _extend(fit: Fit, model: StanModel, sampler: str, seed: int, draws: int, thin: int,
            progress: bool, parallel, deadline, options: Mapping[str, Any]) -> Fit:
    """``fit`` with ``draws`` more iterations per chain when its R-hat is above 1.01 or an
    ESS below 100 per chain while every bulk and tail ESS is at least half that
    (:data:`EXTEND_ESS_SHARE`) and no problem of :data:`EXTEND_BLOCKERS` is found (a
    divergence count only past the diagnosis's bound), else ``fit`` itself: for chains
    that mix, R-hat's noise and the ESS's shortfall are matters of draws, and twice the
    draws double the ESS; chains that disagree, or mix too slowly for that, are left to
    the diagnosis (more draws cannot hide chains that disagree: R-hat only gets surer).
    Each chain continues from its last draw with its last parameters (the sampler's
    ``continue_chain``, :data:`CONTINUATIONS`); the new draws, statistics, gradients and
    seconds are appended to the sampling phase (:func:`_concatenate`).  A fit whose
    chains are not all at hand (``_chain_results``), or a sampler that cannot continue a
    chain, is returned as it is.  An extension stopped before every chain made a draw is
    discarded (its cost too); one stopped later keeps the draws every chain reached, the
    rest in ``metadata["extra_draws"]``, and the Fit is flagged incomplete."""
    from .convergence import ESS_PER_CHAIN_MIN, diagnose

    results = getattr(fit, "_chain_results", None)
    if sampler not in CONTINUATIONS or not results or len(results) != fit.chains:
        return fit
    found = diagnose(fit)
    flagged = [p for p in found if p.kind in ("rhat", "ess_bulk", "ess_tail")]
    floor = EXTEND_ESS_SHARE * ESS_PER_CHAIN_MIN * fit.chains
    blocked = any(p.kind in EXTEND_BLOCKERS and (p.kind != "divergences" or p.convergence)
                  for p in found)
    if not flagged or blocked or _min_ess(fit) < floor:
        return fit
    reason = found.summary()
    if progress:
        print(f"{sampler}: {reason}, every ESS at least {floor:.0f}; running each chain "
              f"{draws} more iterations", file=sys.stderr, flush=True)
    seeds = np.random.SeedSequence([seed, EXTEND_SEED_KEY]).spawn(len(results))
    more, interrupted = _continue_chains(
        model, sampler, [(c, last_state(r, r)) for c, r in enumerate(results)], seeds,
        draws, progress, options, deadline, parallel)
    record = {"extended": False, "draws": draws, "reason": reason, "rhat_before": _max_rhat(fit),
              "min_ess_before": _min_ess(fit)}
    if any(r is None or r.n_sampling == 0 for r in more):
        record["note"] = (f"{reason}: the {draws} more draws per chain were stopped "
                          "before every chain made one; none are kept")
        fit.metadata["extension"] = record
        return fit
    part = _assemble(model, sampler, more, seed, 0, draws, dict(options), interrupted,
                     thin, gq_key=3)
    merged = _concatenate(fit, part)
    after = diagnose(merged, checks=("rhat_ess",))
    record.update(extended=True, rhat_after=_max_rhat(merged), min_ess_after=_min_ess(merged),
                  problems_after=after.summary(), n_grad=part.n_grad_sampling,
                  seconds=part.time_warmup + part.time_sampling,
                  chains=[r.extras.get("continued") for r in more])
    now = f"still {after.summary()}" if after else "R-hat and ESS now pass"
    record["note"] = (
        f"{reason} with every ESS at least {floor:.0f}: each chain ran {draws} more "
        f"iterations, R-hat now {record['rhat_after']:.4f}, min ESS "
        f"{record['min_ess_after']:.0f} ({now}; {part.n_grad_sampling} gradients, "
        f"{record['seconds']:.3g} chain-seconds more)")
    merged.metadata["extension"] = record
    return merged


def _continue_chains(model: StanModel, sampler: str, starts: list[tuple[int, ChainResult]],
                     seeds, draws: int, progress: bool, options: Mapping[str, Any],
                     deadline, parallel) -> tuple[list, bool]:
    """``draws`` more iterations of each ``(chain, start)`` (a finished chain's
    :func:`~ahmc_stan.chain_rerun.last_state`) with the sampler's continuation
    (:data:`CONTINUATIONS`), chain ``c`` from ``seeds[c]``: :func:`_execute`'s results."""
    return _execute([(model, sampler, c, seeds[c], None, 0, draws, progress, dict(options),
                      2.0, deadline, None, start) for c, start in starts],
                    _workers(parallel, len(starts)), late=_all_cores(parallel))


def _max_rhat(fit: Fit) -> float:
    """The largest R-hat over the fit's parameters (nan if none is finite)."""
    rhat = fit._diagnostics(params_only=True)["r_hat"][:fit.n_params]
    return float(np.nanmax(rhat)) if np.isfinite(rhat).any() else math.nan


def _concatenate(first: Fit, part: Fit) -> Fit:
    """``first`` with ``part``'s draws (a continuation of its chains, no warmup) appended
    to its sampling phase: draws, statistics (a statistic ``part`` lacks is nan there),
    evaluations and seconds; warmup, cost units and metadata are ``first``'s (with
    ``part``'s ragged ``extra_draws``, if any)."""
    def cat(name):
        tail = part.sampler_stats.get(name)
        if tail is None:
            tail = np.full(part.draws.shape[:2], np.nan)
        return np.concatenate([first.sampler_stats[name], tail], axis=1)

    sampling = {k: first.n_eval_sampling.get(k, 0) + part.n_eval_sampling.get(k, 0)
                for k in set(first.n_eval_sampling) | set(part.n_eval_sampling)}
    metadata = {**first.metadata, "draws": first.metadata.get("draws", first.n_draws)
                + part.metadata.get("draws", part.n_draws)}
    for key in ("extra_draws", "dropped_chains"):
        if key in part.metadata:
            metadata[key] = part.metadata[key]
    return Fit(np.concatenate([first.draws, part.draws], axis=1), first.columns,
               {k: cat(k) for k in first.sampler_stats}, n_params=first.n_params,
               warmup_draws=first._warmup_draws,  # as it is: computed or deferred
               warmup_sampler_stats=first.warmup_sampler_stats,
               n_grad_warmup=first.n_grad_warmup, n_eval_warmup=first.n_eval_warmup,
               n_grad_sampling=first.n_grad_sampling + part.n_grad_sampling,
               n_eval_sampling=sampling, cost_units=first.cost_units,
               time_warmup=first.time_warmup,
               time_sampling=first.time_sampling + part.time_warmup + part.time_sampling,
               sampler=first.sampler, metadata=metadata,
               incomplete=first.incomplete or part.incomplete)


def _run_chains(model: StanModel, sampler: str, chains: int, warmup: int, draws: int,
                seed: int, inits, radius, progress, parallel, deadline, max_seconds, thin,
                chain_rerun: bool, options: Mapping[str, Any], output_dir) -> Fit:
    """The chains of one :func:`tune_and_sample` call, assembled into a Fit."""
    seeds = np.random.SeedSequence(seed).spawn(chains)
    workers = _workers(parallel, chains)
    streams = [None] * chains
    if output_dir is not None:
        streams = _start_output(Path(output_dir), model, sampler, chains, seed, warmup,
                                draws, thin, options)
    fast, shared = options.get("fast_warmup"), {}
    options = {k: v for k, v in options.items() if k != "fast_warmup"}
    if fast:  # the fit's first chain decides the warmup's length for all
        fast = FastWarmup(shared=slot())
        shared = {"fast_warmup": fast}
    alone = {**options, **shared, **({"pool_windows": None} if "pool_windows" in options
                                     else {})}
    first, in_parent = alone, True
    if options.get("pool_windows") and chains > 1:  # every chain in a worker of its own
        pool = _window_pool(model, chains, warmup, parallel, options.get("scale_fraction"))
        first, workers, in_parent = {**options, **shared, "pool_windows": pool}, chains, False

    def job(c, seed_c, stream, opts=alone):
        return (model, sampler, c, seed_c, inits[c], warmup, draws, progress, opts,
                radius, deadline, stream)

    results, interrupted = _execute([job(c, seeds[c], streams[c], first)
                                     for c in range(chains)], workers, in_parent,
                                    late=_all_cores(parallel))
    if fast and fast.decision:
        warmup = FAST_WARMUP
    rerun_record = slow_record = None
    finished = chain_rerun and not interrupted and all(
        r is not None and not r.interrupted and r.n_sampling == draws for r in results)
    if finished:
        def rerun(chain_ids, attempt):  # new seeds; the streams keep the first chains
            fresh = np.random.SeedSequence([seed, RERUN_SEED_KEY, attempt]).spawn(chains)
            opts = alone if not fast else {  # the fit's decision, made again by none
                **alone, "fast_warmup": FastWarmup(forced=bool(fast.decision),
                                                   shared=slot())}
            return _execute([job(c, fresh[c], None, opts) for c in chain_ids],
                            _workers(parallel, chains), late=_all_cores(parallel))

        results, rerun_record = rerun_stray_chains(results, warmup, rerun, progress,
                                                   label=sampler)
    judged: dict = {}  # the slow-chain rule's draws and their diagnostics, if kept
    if finished and sampler in CONTINUATIONS:  # a rerun is adopted only when finished
        def resume(starts, round_):  # each (chain, the finished chain it continues)
            key = [seed, SLOW_SEED_KEY] + ([round_] if round_ > 1 else [])
            return _continue_chains(model, sampler, starts,
                                    np.random.SeedSequence(key).spawn(chains), draws,
                                    progress, options, deadline, parallel)

        results, slow_record = continue_slow_chains(
            results, warmup, resume, progress, label=sampler,
            rule=functools.partial(_slow_rule, model, judged))
    done = [r for r in results if r is not None]
    for c, r in enumerate(results):
        if r is not None:
            r.extras["chain"] = c + 1
    out_of_time = deadline is not None and time.time() >= deadline and (
        len(done) < chains or any(r.interrupted for r in done))
    if not done:
        if out_of_time:
            raise TimeoutError(f"max_seconds={max_seconds} ran out before any chain "
                               "produced a draw")
        raise KeyboardInterrupt("interrupted before any chain produced a draw")
    fit = _assemble(model, sampler, done, seed, warmup, draws, options,
                    interrupted or len(done) < chains, thin)
    if judged and judged["x"].shape == fit.params.shape and \
            np.array_equal(judged["x"], fit.params):  # the same draws: the same values
        fit._param_diag_cache = judged["diagnostics"]
        fit._param_quantiles = judged["quantiles"]
        seed_slow_chains(fit, judged["slow_chains"])
    if fast:
        fit.metadata["fast_warmup"] = fast.note()
    fit._chain_results = done  # the raw chains, which :func:`_extend` continues
    if rerun_record is not None:
        fit.metadata["chain_rerun"] = rerun_record
    if slow_record is not None:
        fit.metadata["slow_chains"] = slow_record
    if out_of_time:
        fit.metadata["out_of_time"] = True
        fit.metadata["max_seconds"] = float(max_seconds)
    return fit


def _slow_rule(model: StanModel, judged: dict, x: np.ndarray) -> list[tuple]:
    """The slow-chain rule (:func:`~ahmc_stan.convergence.slow_chains`) on the
    unconstrained draws ``x``.  Where the model's parameters are these coordinates
    themselves (:attr:`~ahmc_stan.model.StanModel.constrains_to_itself`), the decisions
    after it judge the same draws by the same ESS, tail ESS and R-hat, and the diagnosis
    applies the same rule: all three are computed here (sharing the ranks) and kept in
    ``judged`` with the rule's finding, for the fit whose parameters turn out equal to
    ``x``, with the quantiles that the summary and the tail check read
    (:data:`~ahmc_stan.fit.QUANTILE_PROBS`, from the same sort)."""
    from .rank_diagnostics import CONVERGENCE_KEYS, diagnostics

    if not model.constrains_to_itself:
        return slow_chains(x)
    found = diagnostics(x, CONVERGENCE_KEYS, QUANTILE_PROBS)
    judged.update(x=x, quantiles=found.pop("quantiles").T, diagnostics=found)
    judged["slow_chains"] = slow_chains(x, judged["diagnostics"]["ess_bulk"])
    return judged["slow_chains"]


def _window_pool(model: StanModel, chains: int, warmup: int, parallel, scale_fraction):
    """The :class:`~ahmc_stan.tuning.window_pool.WindowPool` of a call with
    ``pool_windows=True``, sized for the windows of a scale phase of ``scale_fraction``
    (default a half) of ``warmup``: its chains then run in a worker process each, forked
    after it is made."""
    from .tuning.windows import adaptation_windows
    from .tuning.window_pool import WindowPool

    if not _all_cores(parallel) or os.name != "posix":
        raise ValueError("pool_windows=True runs each chain in a forked worker process of "
                         f"its own: it needs parallel=None or True (not {parallel!r}) "
                         "and a POSIX system")
    n_scale = int(round((0.5 if scale_fraction is None else scale_fraction) * warmup))
    longest = max([end - start for start, end in adaptation_windows(n_scale)], default=0)
    return WindowPool(chains, model.dims, max(longest, 1),
                      multiprocessing.get_context("fork"))


def _all_cores(parallel) -> bool:
    """Whether ``parallel`` asks for as many chains at once as cores: ``True`` or
    ``None``, not the number 1 (which ``1 in (None, True)`` would take for ``True``)."""
    return parallel is None or parallel is True


def _workers(parallel, chains: int) -> int:
    """Worker processes for ``chains`` chains (``parallel`` as :func:`tune_and_sample`
    takes it: ``True``/``None`` as many as cores), at least 1 and at most ``chains``."""
    workers = (os.cpu_count() or 1) if _all_cores(parallel) else int(parallel)
    return max(1, min(workers, chains))


def _execute(jobs: list[tuple], workers: int, in_parent: bool = True, late: bool = False
             ) -> tuple[list[ChainResult | None], bool]:
    """Run :func:`_run_one` on each job, ``workers`` at a time: the results in job order
    (``None`` for a chain that did not run) and whether Ctrl-C stopped them.  With
    ``in_parent`` this process is one of the ``workers`` (:func:`_share`); otherwise all
    run in worker processes (the window pool's chains, each in a process of its own).
    ``late`` (``parallel`` asked for all cores): the jobs still waiting for one of the
    ``workers`` :data:`~ahmc_stan.workers.LATE_SECONDS` after the start start then, in
    kept workers of their own (:func:`~ahmc_stan.workers.share`)."""
    global _STOPPED
    _STOPPED = False  # this process's chains (_sigint_as_in_a_worker): no Ctrl-C yet
    results: list[ChainResult | None] = [None] * len(jobs)
    if workers == 1 or len(jobs) == 1:
        interrupted = False
        for c, job in enumerate(jobs):
            try:
                results[c] = _run_one(*job)
            except KeyboardInterrupt:
                interrupted = True
            if interrupted or results[c] is None or results[c].interrupted or _STOPPED:
                interrupted = True  # Ctrl-C: the remaining chains do not start
                break
        return results, interrupted
    workers = min(workers, len(jobs))
    # fork: no `if __name__ == "__main__"` needed in user scripts, and the workers
    # inherit the model (its library loaded, its data read) instead of building it again
    # for every chain from its pickle (its arguments: 40 ms for a regression with 500 x 100
    # covariates); with spawn, the library is reloaded from the cache.
    if os.name != "posix":  # spawn: each job pickled to a pool's process
        with cf.ProcessPoolExecutor(workers, initializer=_init_worker,
                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            return _collect(pool, jobs, results)
    blas.threadpools()  # scanned once here and inherited, not again in each worker
    import tqdm.auto  # noqa: F401  (the progress bars': imported once, not in each worker)

    # The objects a forked worker inherits stay out of its garbage collections, which
    # would otherwise touch (and so copy) every page of the parent's heap: 60-80 ms in
    # the middle of a chain, measured on a 10-d normal whose chain takes 10 ms.
    gc.freeze()
    try:
        return share(jobs, workers - in_parent, in_parent, results, _run_one, _stopped,
                     _begin, _init_worker, keep=all(map(_built_in, jobs)),
                     late=len(jobs) - workers if late and in_parent else 0)
    finally:
        gc.unfreeze()


def _collect(pool, jobs: list[tuple], results: list) -> tuple[list, bool]:
    """Submit the jobs to ``pool`` and wait: :func:`_execute`'s results."""
    return _collect_futures({c: pool.submit(_run_one, *job) for c, job in enumerate(jobs)},
                            results)


def _collect_futures(futures: dict[int, cf.Future], results: list) -> tuple[list, bool]:
    """Wait for the chains ``futures`` (job index → future) and put their results in
    ``results``; Ctrl-C meanwhile cancels those not started."""
    interrupted = False
    try:
        cf.wait(list(futures.values()))
    except KeyboardInterrupt:  # workers got SIGINT too and return what they have
        interrupted = True
        for f in futures.values():
            f.cancel()
        cf.wait([f for f in futures.values() if not f.cancelled()])
    for c, f in futures.items():
        if f.cancelled():
            continue
        if f.exception() is not None:
            if interrupted and isinstance(f.exception(), (
                    KeyboardInterrupt, cf.process.BrokenProcessPool)):
                continue
            raise f.exception()
        results[c] = f.result()
    return results, interrupted


def _start_output(out: Path, model: StanModel, sampler: str, chains: int, seed: int,
                  warmup: int, draws: int, thin: int, options: dict) -> list[Path]:
    """``run.json`` (what :func:`load_output` needs to rebuild the Fit) in ``out``, and
    each chain's stream file; a previous run's files there are replaced."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("chain_*.stream"), out / "fit.npz", out / "draws.csv"]:
        old.unlink(missing_ok=True)
    seed_model, stanc_args, include_paths = model._init_args
    run = {"format": "ahmc_stan.run", "sampler": sampler, "chains": chains, "seed": seed,
           "warmup": warmup, "draws": draws, "thin": thin,
           "options": {k: v for k, v in options.items()
                       if isinstance(v, (int, float, str, bool, type(None)))},
           "model": {"stan_file": str(model.stan_file), "data_json": model.data_json,
                     "seed": seed_model, "stanc_args": stanc_args,
                     "include_paths": include_paths}}
    tmp = out / "run.json.tmp"
    tmp.write_text(json.dumps(run, indent=1))
    os.replace(tmp, out / "run.json")
    return [out / f"chain_{c + 1}.stream" for c in range(chains)]


def load_output(output_dir: str | os.PathLike, model: StanModel | None = None) -> Fit:
    """The Fit of a run made with ``tune_and_sample(..., output_dir=output_dir)``: the
    saved ``fit.npz`` of a finished run, else the Fit rebuilt from the chains' streams
    (a run killed or still going), flagged ``incomplete``, exactly as Ctrl-C at that
    point would have returned it except for each chain's final tuning record
    (``metadata["chains"]``).  ``model`` defaults to the one recorded in ``run.json``
    (loaded from the compile cache).  A bandit chain's stream counts its own copy's
    gradients only."""
    from .fit import load_fit

    out = Path(output_dir)
    if (out / "fit.npz").exists():
        return load_fit(out / "fit.npz")
    if not (out / "run.json").exists():
        raise FileNotFoundError(f"{out} holds no run of tune_and_sample (no run.json)")
    run = json.loads((out / "run.json").read_text())
    if model is None:
        m = run["model"]
        model = StanModel(m["stan_file"], m["data_json"] or None, seed=m["seed"],
                          stanc_args=m["stanc_args"], include_paths=m["include_paths"])
    warmup = run["warmup"]
    if run["options"].get("fast_warmup"):  # the first chain that sampled says how long
        for c in range(run["chains"]):
            path = out / f"chain_{c + 1}.stream"
            phase = read_stream(path, warmup).stats.get("phase") if path.exists() else None
            if phase is not None and (phase == 2).any():
                warmup = int(np.argmax(phase == 2))
                break
    results = []
    for c in range(run["chains"]):
        path = out / f"chain_{c + 1}.stream"
        if path.exists():
            r = read_stream(path, warmup)
            if r.n_warmup + r.n_sampling:
                r.extras["chain"] = c + 1
                results.append(r)
    if not results:
        raise ValueError(f"no chain in {out} recorded an iteration")
    return _assemble(model, run["sampler"], results, run["seed"], warmup,
                     run["draws"], run["options"], True, run["thin"])
