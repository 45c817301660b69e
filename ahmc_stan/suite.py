"""The papers' experiments against CmdStan's NUTS in one call: ``run_suite("paper")``.

Every (experiment × sampler × repeat) is an independent *job* (:func:`run_job`), run in a
``concurrent.futures`` process pool or, given a scheduler address or a
``dask.distributed.Client``, on a Dask cluster; the same seeds give the same tables either
way.  Inside a job the chains run one after another in that job's process
(``parallel=False`` / ``parallel_chains=1``): the jobs are the unit of parallelism, so
process pools are never nested.  Models are compiled once, before any job starts; a job
receives the :class:`~ahmc_stan.model.StanModel`, which pickles as its constructor
arguments, and reloads the library from the compile cache (CmdStan executables are cached
the same way), so no worker rebuilds a model that the cache holds.

Efficiency is :meth:`Fit.efficiency` (ArviZ bulk-ESS) on the columns each paper measured:
the parameters block, except the stochastic volatility (x, β, φ, σ²) and the LGCP (the
latent field x), whose non-centred programs sample innovations z instead.  The box plots
use one value per chain, as Wang, Mohamed & de Freitas (2013, section 5) do.

Outputs (``out_dir/quick`` or ``out_dir/full``): ``jobs.csv`` (one row per job),
``chains.csv`` (one row per chain), ``summary.md`` (every table), figures (PNG) and
``run.json`` (command, machine, configuration, wall time).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import datetime
import functools
import json
import logging
import math
import multiprocessing
import os
import pickle
import platform
import shutil
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import datasets
from .fit import Fit
from .model import StanModel
from .stan_models import directory

__all__ = ["run_suite", "run_job", "Experiment", "Job", "EXPERIMENTS", "SAMPLER_SPECS",
           "QUICK", "sensitivity_demo", "STAN_MODELS"]

#: The folder of the bundled models (package data, read through ``importlib.resources``).
STAN_MODELS = directory()


# ---- experiments -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Experiment:
    """A model with its data, iterations per chain and the columns whose ESS is reported.

    ``data(full)`` returns the Stan data; ``iterations`` maps ``"quick"``/``"full"`` to
    ``(warmup, draws)``; ``ess_prefixes`` (column-name prefixes) selects the measured
    columns (empty: the parameters block)."""

    name: str
    group: str
    stan_file: str
    data: Callable[[bool], dict]
    iterations: dict
    source: str
    ess_prefixes: tuple[str, ...] = ()


def _sv_data(full: bool) -> dict:
    return datasets.stochastic_volatility_data(T=2000 if full else 1000, seed=1)


def _lgcp_grid(full: bool) -> int:
    return 64 if full else 32


def _lgcp_data(full: bool) -> dict:
    return datasets.lgcp_data(d=_lgcp_grid(full), seed=1)


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in [
    Experiment("gauss2d", "gaussian", "mvn.stan",
               lambda full: datasets.correlated_gaussian_data(0.99),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "2-d Gaussian, correlation 0.99 (Wang et al. 2013 §2 Fig. 1; "
               "Titsias & Dellaportas §4.1)"),
    Experiment("neal100", "gaussian", "diag_normal.stan",
               lambda full: datasets.neal_gaussian_data(100),
               {"quick": (1000, 1000), "full": (20000, 20000)},
               "Neal's 100-d Gaussian, sds 0.01…1.00 (Titsias & Dellaportas §4.2 Table 1)"),
    Experiment("gp51", "gaussian", "mvn.stan",
               lambda full: datasets.gp_grid_gaussian_data(51),
               {"quick": (1000, 1000), "full": (20000, 20000)},
               "51-d squared-exponential covariance on [0, 4] (Titsias & Dellaportas §4.1)"),
    Experiment("std64", "gaussian", "std_normal.stan", lambda full: datasets.std_normal_data(64),
               {"quick": (500, 1000), "full": (1000, 2000)},
               "64-d standard normal (Alfaki et al. 2008, numerical results)"),
    Experiment("std128", "gaussian", "std_normal.stan",
               lambda full: datasets.std_normal_data(128),
               {"quick": (500, 1000), "full": (1000, 2000)},
               "128-d standard normal (Alfaki et al. 2008, numerical results)"),
    Experiment("pima", "logistic", "logistic.stan", lambda full: datasets.pima_data(),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "Pima Indians, MASS (Wang et al. 2013 §5.1 Fig. 2)"),
    Experiment("ripley", "logistic", "logistic.stan", lambda full: datasets.ripley_data(),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "Ripley synth.tr, MASS (Wang et al. 2013 §5.1 Fig. 2)"),
    Experiment("breast_cancer", "logistic", "logistic.stan",
               lambda full: datasets.breast_cancer_data(),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "Wisconsin breast cancer, scikit-learn (in place of the UCI sets no package "
               "ships)"),
    Experiment("caravan", "logistic", "logistic.stan", lambda full: datasets.caravan_data(),
               {"quick": (500, 500), "full": (20000, 20000)},
               "Caravan, ISLR (Titsias & Dellaportas §4.2 Table 1)"),
    Experiment("sv", "sv", "stochastic_volatility.stan", _sv_data,
               {"quick": (500, 500), "full": (10000, 20000)},
               "Stochastic volatility, T = 1000 (full: 2000) (Wang et al. 2013 §5.3 Table 1)",
               ess_prefixes=("beta", "phi", "sigma2", "x.")),
    Experiment("lgcp", "lgcp", "lgcp.stan", _lgcp_data,
               {"quick": (300, 300), "full": (1000, 5000)},
               "Log-Gaussian Cox process, 32×32 (full: 64×64) grid (Wang et al. 2013 §5.2 "
               "Figs. 3–4)", ess_prefixes=("x.",)),
]}


def _robot_arm_experiment() -> Experiment | None:
    """HOOK (issue 9): the robot-arm Bayesian neural network joins the suite when another
    module ships ``stan_models/robot_arm.stan`` and ``datasets.robot_arm_data()``."""
    if not (STAN_MODELS / "robot_arm.stan").exists() or \
            not hasattr(datasets, "robot_arm_data"):
        return None
    return Experiment("robot_arm", "bnn", "robot_arm.stan",
                      lambda full: datasets.robot_arm_data(),
                      {"quick": (150, 150), "full": (2000, 5000)},
                      "Robot-arm BNN, 16 hidden units (Wang 2012 §4.1 Table 4.1)")


def experiments() -> dict[str, Experiment]:
    """Every experiment available now (the robot arm only once it exists)."""
    out = dict(EXPERIMENTS)
    robot = _robot_arm_experiment()
    if robot is not None:
        out[robot.name] = robot
    return out


# ---- samplers --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplerSpec:
    """A table row: a registered sampler with options; ``max_dims`` skips models too large
    for samplers that form Hessians; ``iteration_factor`` multiplies the iterations of
    samplers that spend one gradient (or none) per iteration (capped at the gad paper's
    2·10⁴ warmup and draws)."""

    label: str
    sampler: str
    options: dict = field(default_factory=dict)
    max_dims: int | None = None
    iteration_factor: int = 1


def _specs() -> dict[str, SamplerSpec]:
    mh = dict(iteration_factor=10)
    return {s.label: s for s in [
        SamplerSpec("ahmc", "ahmc"),
        SamplerSpec("gadmala", "gadmala", **mh),
        SamplerSpec("gadmala_exact", "gadmala_exact", **mh),
        SamplerSpec("gadrwm", "gadrwm", **mh),
        SamplerSpec("am", "am", **mh),
        SamplerSpec("rwm", "rwm", **mh),
        SamplerSpec("mala", "mala", **mh),
        SamplerSpec("hmc-5", "hmc", {"num_steps": 5}),
        SamplerSpec("hmc-10", "hmc", {"num_steps": 10}),
        SamplerSpec("hmc-20", "hmc", {"num_steps": 20}),
        SamplerSpec("armhmc", "armhmc", max_dims=200),
        # Girolami & Calderhead's (2011) logistic-regression setting, fixed L
        SamplerSpec("rmhmc", "rmhmc", {"step_size": 0.5, "num_steps": 6}, max_dims=200),
        SamplerSpec("ohmc", "ohmc"),
        SamplerSpec("svhmc", "svhmc"),
        SamplerSpec("osvhmc", "osvhmc"),
        # the thesis's cross-validation reward needs per-model folds: ESJD everywhere
        SamplerSpec("bandit", "bandit", {"reward": "esjd"}),
    ]}


#: Table label → how to run it.  Registered samplers missing here run with defaults.
SAMPLER_SPECS = _specs()


def available_specs() -> dict[str, SamplerSpec]:
    """Every registered sampler as a spec (``hmc`` as HMC-5/10/20), then ``nuts``."""
    from .sampling import SAMPLERS

    out = {label: s for label, s in SAMPLER_SPECS.items() if s.sampler in SAMPLERS}
    known = {s.sampler for s in SAMPLER_SPECS.values()}
    out.update({name: SamplerSpec(name, name) for name in SAMPLERS if name not in known})
    out["nuts"] = SamplerSpec("nuts", "nuts")
    return out


# ---- configuration -----------------------------------------------------------------------------

#: What ``quick=True`` runs: 2 chains per job, the iterations of ``Experiment.iterations
#: ["quick"]``, these experiments and these samplers (those that are registered), NUTS;
#: Metropolis-type samplers (dense O(n²) proposals, ``iteration_factor`` > 1) skip models
#: of more than ``mh_max_dims`` dimensions (gadMALA took 6–9 minutes on the 1000-d ones).
QUICK = {
    "experiments": ["gauss2d", "neal100", "pima", "ripley", "sv", "lgcp", "robot_arm"],
    "samplers": ["ahmc", "gadmala"],
    "chains": 2,
    "mh_max_dims": 200,
}
FULL_CHAINS = 4


@dataclass(frozen=True)
class Job:
    """One sampler on one model with one seed: the unit of scale-out."""

    experiment: str
    group: str
    spec: SamplerSpec
    repeat: int
    seed: int
    chains: int
    warmup: int
    draws: int
    model: StanModel
    ess_columns: tuple[int, ...]
    keep_field: bool = False


def job_seed(base: int, experiment: str, label: str, repeat: int) -> int:
    """A seed that depends only on its arguments (not on Python's salted ``hash``)."""
    words = [base, zlib.crc32(experiment.encode()), zlib.crc32(label.encode()), repeat]
    return int(np.random.SeedSequence(words).generate_state(1)[0] % (2**31 - 2)) + 1


def _iterations(exp: Experiment, spec: SamplerSpec, mode: str) -> tuple[int, int]:
    warmup, draws = exp.iterations[mode]
    f = spec.iteration_factor
    cap = lambda n: min(f * n, max(n, 20000))  # noqa: E731
    return cap(warmup), cap(draws)


def _ess_columns(model: StanModel, prefixes: Sequence[str]) -> tuple[int, ...]:
    names = model.param_names(include_tp=True, include_gq=True)
    block = model.param_names()
    everything = block + [n for n in names if n not in set(block)]  # a Fit's column order
    if not prefixes:
        return tuple(range(len(block)))
    return tuple(i for i, n in enumerate(everything)
                 if any(n == p or (p.endswith(".") and n.startswith(p)) for p in prefixes))


# ---- one job ------------------------------------------------------------------------------------

def _measured(fit: Fit, columns: Sequence[int], chains: slice = slice(None)) -> Fit:
    """The fit restricted to some chains and to the measured columns (as its parameters),
    so that :meth:`Fit.efficiency` measures exactly those."""
    from .fit import _evaluations

    cols = list(columns)
    stats = {k: v[chains] for k, v in fit.sampler_stats.items()}
    warm = fit.warmup_sampler_stats or {}
    whole = chains == slice(None)
    n_warm = fit.n_grad_warmup if whole or "n_grad" not in warm else \
        int(np.sum(warm["n_grad"][chains]))
    evals_warm = fit.n_eval_warmup if whole else \
        _evaluations({k: v[chains] for k, v in warm.items()}, n_warm, None)
    return Fit(fit.draws[chains][:, :, cols], [fit.param_names[c] for c in cols], stats,
               n_grad_warmup=n_warm,
               n_grad_sampling=int(np.sum(stats["n_grad"])),
               n_eval_warmup=evals_warm, cost_units=fit.cost_units,
               time_warmup=fit.time_warmup if whole else math.nan,
               time_sampling=fit.time_sampling if whole else math.nan,
               sampler=fit.sampler)


@contextlib.contextmanager
def _quiet_arviz():
    from .fit import _arviz

    # ArviZ's logger is its own instance (``arviz._log``), not ``logging.getLogger("arviz")``
    logger = getattr(_arviz(), "_log", None) or logging.getLogger("arviz")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run_fit(job: Job) -> Fit:
    if job.spec.sampler == "nuts":
        from .nuts import run_nuts

        return run_nuts(job.model, chains=job.chains, warmup=job.warmup, draws=job.draws,
                        seed=job.seed, parallel_chains=1, diagnose=False,
                        **job.spec.options)
    from .sampling import tune_and_sample

    return tune_and_sample(job.model, job.spec.sampler, chains=job.chains,
                           warmup=job.warmup, draws=job.draws, seed=job.seed,
                           progress=False, parallel=False, diagnose=False,
                           **job.spec.options)


def predictive_mse(fit: Fit, y_test: np.ndarray) -> float:
    """Squared error of the posterior-mean prediction (generated quantity ``y_pred``),
    summed over the outputs and averaged over the test cases — Neal's (1996) convention for
    the robot arm, where the noise alone contributes 2·0.05² = 0.005."""
    cols = {n: i for i, n in enumerate(fit.columns)}
    pred = np.empty_like(y_test, dtype=float)
    for idx in np.ndindex(*y_test.shape):
        name = "y_pred." + ".".join(str(i + 1) for i in idx)
        pred[idx] = fit.draws[:, :, cols[name]].mean()
    return float(np.mean(np.sum((y_test - pred) ** 2, axis=1)))


def run_job(job: Job) -> dict:
    """Run one job and reduce its fit, in the worker, to what the tables need:
    ``{"row": job fields, efficiency (and ``test_mse`` when the data hold ``y_test``),
    "chains": per-chain ESS per gradient, "field": (posterior mean, variance) of the
    measured columns when ``keep_field``}``.  An exception is recorded in ``row["error"]``
    instead of stopping the suite."""
    row = {"experiment": job.experiment, "group": job.group, "sampler": job.spec.label,
           "repeat": job.repeat, "seed": job.seed, "chains": job.chains,
           "warmup": job.warmup, "draws": job.draws, "dims": job.model.dims,
           "ess_columns": len(job.ess_columns), "error": ""}
    out: dict[str, Any] = {"row": row, "chains": []}
    start = time.perf_counter()
    try:
        fit = _run_fit(job)
        measured = _measured(fit, job.ess_columns)
        eff = measured.efficiency()
        row.update(eff)
        grads = eff["n_grad_equiv_sampling"]
        for stat in ("median", "max"):
            row[f"{stat}_ess_per_grad"] = eff[f"{stat}_ess_bulk"] / grads if grads else math.nan
        row["incomplete"] = fit.incomplete
        for c in range(fit.chains):
            with _quiet_arviz():  # one chain: ArviZ warns that R-hat needs two
                e = _measured(fit, job.ess_columns, slice(c, c + 1)).efficiency()
            g = e["n_grad_equiv_sampling"]
            out["chains"].append({
                "experiment": job.experiment, "sampler": job.spec.label,
                "repeat": job.repeat, "chain": c,
                **{f"{s}_ess_per_grad": e[f"{s}_ess_bulk"] / g if g else math.nan
                   for s in ("min", "median", "max")},
                "min_ess_per_grad_total": e["min_ess_per_grad_total"],
                "accept_rate": e["accept_rate"]})
        if job.keep_field:
            x = fit.draws[:, :, list(job.ess_columns)].reshape(-1, len(job.ess_columns))
            out["field"] = (x.mean(axis=0), x.var(axis=0))
        if "y_test" in job.model.data:
            row["test_mse"] = predictive_mse(fit, np.asarray(job.model.data["y_test"]))
    except Exception as err:  # noqa: BLE001 — one failing sampler must not stop the suite
        row["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        out["traceback"] = traceback.format_exc()
    row["wall_seconds"] = time.perf_counter() - start
    return out


# ---- executors ------------------------------------------------------------------------------------

def _executor(client, workers: int | None):
    """(submit, results-in-order, shutdown) for a local process pool or a Dask client."""
    if client is None:
        ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        pool = cf.ProcessPoolExecutor(workers or os.cpu_count() or 1, mp_context=ctx)
        return (lambda fn, job: pool.submit(fn, job)), (lambda fut: fut.result()), \
            (lambda: pool.shutdown(cancel_futures=True))
    from dask.distributed import Client

    own = isinstance(client, str)
    if own:
        client = Client(client)
    submit = lambda fn, job: client.submit(fn, job, pure=False)  # noqa: E731
    return submit, (lambda fut: fut.result()), (lambda: client.close() if own else None)


def _checkpoint_name(job: Job) -> str:
    """A finished job's file in ``<out>/<mode>/jobs``: everything that decides its result
    (experiment, sampler, repeat, seed, chains, iterations)."""
    return (f"{job.experiment}-{job.spec.label}-r{job.repeat}-s{job.seed}-"
            f"{job.chains}x{job.warmup}+{job.draws}.pkl")


def _save_checkpoint(path: Path, result: Callable, future) -> None:
    """Keep a finished job's output (not a failed one), written atomically, so that an
    interrupted or extended suite run reuses it."""
    try:
        out = result(future)
    except BaseException:  # noqa: BLE001 — cancelled or lost: nothing to keep
        return
    if out["row"].get("error"):
        return
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(pickle.dumps(out))
    os.replace(tmp, path)


def _load_checkpoint(path: Path) -> dict | None:
    try:
        return pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None


def _cost(job: Job) -> float:
    """A rough relative cost, to order the submissions."""
    return job.model.dims * job.chains * (job.warmup + job.draws) / job.spec.iteration_factor


def _gather(futures: list, result: Callable, log: Callable[[str], None]) -> list[dict]:
    """Outputs in job order; an entry of ``futures`` that is already an output (a kept
    job) is taken as it is."""
    outs = []
    for fut in futures:
        kept = isinstance(fut, dict)
        out = fut if kept else result(fut)
        r = out["row"]
        status = f"FAILED ({r['error']})" if r["error"] else \
            f"min ESS/grad {r.get('min_ess_per_grad', math.nan):.4g}"
        log(f"  {r['experiment']:>13} {r['sampler']:>13} repeat {r['repeat']}: {status}, "
            f"{r['wall_seconds']:.1f} s" + (" (kept from an earlier run)" if kept else ""))
        outs.append(out)
    return outs


# ---- the sensitivity demonstration (Wang et al. 2013 section 2, Figure 1) --------------------

#: (ε, L) of Figure 1; all three have acceptance ≈ 0.7 in the paper, only the first mixes well.
SENSITIVITY_SETTINGS = ((0.16, 40), (0.16, 50), (0.15, 50))


def sensitivity_demo(model: StanModel, n_iter: int = 1000, seed: int = 2013,
                     settings=SENSITIVITY_SETTINGS) -> list[dict]:
    """Plain HMC (no jitter, identity metric) on the 2-d Gaussian at each (ε, L), from
    the same start and seed: draws, acceptance rate and autocorrelations."""
    from .fit import _arviz
    from .hmc import HMCKernel, HMCParameters

    az = _arviz()
    kernel = HMCKernel(model.density)
    out = []
    for eps, n_steps in settings:
        rng = np.random.default_rng(seed)
        start = kernel.init(np.zeros(model.dims))
        _, info = kernel.run(rng, start, HMCParameters(eps, n_steps, jitter=False), n_iter)
        x = info.positions
        ess = [float(az.ess(x[None, :, j])) for j in range(x.shape[1])]
        acf = np.array([az.autocorr(x[:, j])[:41] for j in range(x.shape[1])])
        out.append({"step_size": eps, "num_steps": n_steps, "draws": x,
                    "accept_rate": float(np.mean(info.acceptance_rate)),
                    "min_ess": min(ess), "min_ess_per_grad": min(ess) / float(np.sum(info.num_grad)),
                    "acf": acf})
    return out


# ---- the suite ----------------------------------------------------------------------------------------

def _machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "load_average_1_5_15_min": load,
            "python": sys.version.split()[0],
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _prepare(exp: Experiment, full: bool) -> tuple[StanModel, float]:
    """Build the data, compile (or load) the model and its CmdStan executable."""
    from .nuts import compile_cmdstan_model

    start = time.perf_counter()
    model = StanModel(STAN_MODELS / exp.stan_file, exp.data(full))
    compile_cmdstan_model(model.stan_file)
    return model, time.perf_counter() - start


def run_suite(suite: str = "paper", quick: bool = False, samplers: Sequence[str] | None = None,
              repeats: int = 1, out_dir: str | os.PathLike = "comparisons/results",
              client: Any = None, *, only: Sequence[str] | None = None,
              iterations: tuple[int, int] | None = None, chains: int | None = None,
              seed: int = 20130616, workers: int | None = None, figures: bool = True,
              command: str | None = None, log: Callable[[str], None] | None = print,
              resume: bool = True) -> dict:
    """Run the suite and write its tables and figures to ``out_dir/quick`` (or ``/full``).

    ``samplers``: table labels (default: ``QUICK["samplers"]`` when quick, else every
    registered sampler); NUTS always runs.  ``client``: ``None`` (local process pool of
    ``workers`` processes, default all cores), a ``dask.distributed.Client`` or a
    scheduler address.  ``only``, ``iterations`` ``(warmup, draws)`` and ``chains``
    shrink a run (the tests' smoke configuration).  Every finished job is kept in
    ``out_dir/<mode>/jobs/`` and reused by a later run with the same settings (an
    interrupted full run continues where it stopped); ``resume=False`` starts afresh.
    Returns ``{"jobs": DataFrame,
    "chains": DataFrame, "tables": {name: markdown}, "out_dir": Path, "wall_seconds"}``.
    """
    import pandas as pd

    if suite != "paper":
        raise ValueError(f"unknown suite {suite!r}; the only suite is 'paper'")
    log = log or (lambda s: None)
    mode = "quick" if quick else "full"
    start = time.perf_counter()
    available = experiments()
    names = list(only) if only else (
        [n for n in QUICK["experiments"] if n in available] if quick else list(available))
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"unknown experiments {unknown}; choose from {sorted(available)}")
    specs = available_specs()
    labels = list(samplers) if samplers else (QUICK["samplers"] if quick else list(specs))
    labels = [s for s in labels if s != "nuts"]
    missing = [s for s in labels if s not in specs]
    if missing and samplers:
        raise ValueError(f"samplers {missing} are not registered; choose from "
                         f"{sorted(specs)}")
    labels = [s for s in labels if s in specs] + ["nuts"]
    n_chains = chains or (QUICK["chains"] if quick else FULL_CHAINS)

    log(f"suite {suite!r} ({mode}): {len(names)} experiments × {len(labels)} samplers × "
        f"{repeats} repeats")
    models: dict[str, StanModel] = {}
    with cf.ThreadPoolExecutor(workers or os.cpu_count() or 1) as threads:
        prepared = {n: threads.submit(_prepare, available[n], not quick) for n in names}
        for n, fut in prepared.items():
            models[n], seconds = fut.result()
            log(f"  prepared {n} ({models[n].dims} dims) in {seconds:.1f} s")

    jobs, skipped = [], []
    for n in names:
        exp, model = available[n], models[n]
        columns = _ess_columns(model, exp.ess_prefixes)
        for label in labels:
            spec = specs[label]
            max_dims = spec.max_dims
            if quick and spec.iteration_factor > 1:
                max_dims = min(max_dims or math.inf, QUICK["mh_max_dims"])
            if max_dims is not None and model.dims > max_dims:
                skipped.append((n, label, f"{model.dims} dims > {max_dims}"))
                continue
            warmup, draws = iterations or _iterations(exp, spec, mode)
            for r in range(repeats):
                jobs.append(Job(n, exp.group, spec, r, job_seed(seed, n, label, r), n_chains,
                                warmup, draws, model, columns,
                                keep_field=exp.group == "lgcp" and r == 0))
    target = Path(out_dir) / mode
    checkpoints = target / "jobs"
    if not resume and checkpoints.exists():
        shutil.rmtree(checkpoints)
    checkpoints.mkdir(parents=True, exist_ok=True)
    finished = {i: out for i, job in enumerate(jobs)
                if (out := _load_checkpoint(checkpoints / _checkpoint_name(job))) is not None}
    if finished:
        log(f"reusing {len(finished)} finished jobs from {checkpoints}")
    todo = [i for i in range(len(jobs)) if i not in finished]
    log(f"running {len(todo)} jobs " + ("locally" if client is None else "on Dask"))
    submit, result, shutdown = _executor(client, workers)
    try:  # the costliest jobs first, so that they do not start last
        order = sorted(todo, key=lambda i: -_cost(jobs[i]))
        futures = {}
        for i in order:
            futures[i] = submit(run_job, jobs[i])
            futures[i].add_done_callback(functools.partial(
                _save_checkpoint, checkpoints / _checkpoint_name(jobs[i]), result))
        outs = _gather([futures[i] if i in futures else finished[i] for i in range(len(jobs))],
                       result, log)
    finally:
        shutdown()

    sens = sensitivity_demo(models["gauss2d"]) if "gauss2d" in models else None
    wall = time.perf_counter() - start
    job_df = pd.DataFrame([o["row"] for o in outs])
    job_df["reused"] = [i in finished for i in range(len(jobs))]
    chain_df = pd.DataFrame([c for o in outs for c in o["chains"]])
    fields = {o["row"]["sampler"]: o["field"] for o in outs if "field" in o}
    config = {
        "suite": suite, "mode": mode, "experiments": names, "samplers": labels,
        "repeats": repeats, "chains_per_job": n_chains, "seed": seed,
        "iterations": {n: {label: _iterations(available[n], specs[label], mode)
                           if iterations is None else list(iterations) for label in labels}
                       for n in names},
        "skipped": skipped,
        "executor": "local process pool" if client is None else "dask.distributed",
        "jobs_reused": len(finished),
        "workers": workers or os.cpu_count(),
    }
    truth = (datasets.simulate_lgcp(_lgcp_grid(not quick), seed=1)
             if "lgcp" in names else None)
    tables = write_report(target, job_df, chain_df, fields=fields, sensitivity=sens,
                          lgcp=truth, figures=figures,
                          notes=[f"{s} on {e}: skipped ({why})" for e, s, why in skipped])
    run = {"command": command or "ahmc_stan.suite.run_suite(...)", "machine": _machine(),
           "wall_seconds": wall, "config": config,
           "job_seconds_total": float(job_df["wall_seconds"].sum()) if len(job_df) else 0.0}
    (target / "run.json").write_text(json.dumps(run, indent=2, default=str) + "\n")
    log(f"wrote {target} in {wall:.0f} s")
    return {"jobs": job_df, "chains": chain_df, "tables": tables, "out_dir": target,
            "wall_seconds": wall, "sensitivity": sens}


# ---- the papers' numbers --------------------------------------------------------------------------

#: Wang, Mohamed & de Freitas (2013), section 5.3, Table 1: ESS per leapfrog step, (mean, sd)
#: of the minimum, median and maximum over coordinates.  The table prints no unit; its
#: values are plausible only as multiples of 10⁻³ (with ε ≤ 10⁻² a trajectory costs tens
#: to hundreds of gradients), so ours are shown ×10³ — an assumption, not the paper's word.
PAPER_SV = {"ahmc": ((1.3, 0.1), (6.9, 0.7), (14.9, 1.4)),
            "nuts": ((0.7, 0.3), (3.5, 1.6), (9.0, 2.8))}

#: Titsias & Dellaportas (2019), section 4.2, Table 1: time (s), acceptance rate, ESS (min,
#: median, max) of 2·10⁴ draws, min ESS/s (sd); our label → (paper's label, values).
PAPER_GAD = {
    "neal100": {
        "gadmala": ("gadMALAf", 8.7, 0.563, (1431.2, 2001.2, 2470.5), (165.08, 18.80)),
        "gadmala_exact": ("gadMALAe", 10.1, 0.535, (940.5, 2006.3, 2747.6), (93.67, 10.28)),
        "gadrwm": ("gadRWM", 6.3, 0.252, (24.9, 65.4, 122.2), (3.93, 0.71)),
        "am": ("AM", 2.3, 0.257, (8.7, 48.6, 829.1), (3.83, 0.89)),
        "rwm": ("RWM", 2.1, 0.261, (2.9, 8.4, 2547.6), (1.38, 0.06)),
        "mala": ("MALA", 3.0, 0.530, (2.9, 10.0, 12489.2), (0.99, 0.03)),
        "hmc": ("HMC-20", 47.4, 0.694, (306.1, 1537.8, 19732.4), (6.47, 3.52)),
        "nuts": ("NUTS", 360.5, math.nan, (18479.6, 20000.0, 20000.0), (51.28, 1.64)),
    },
    "caravan": {
        "gadmala": ("gadMALAf", 24.8, 0.599, (204.8, 785.9, 1129.5), (8.30, 2.34)),
        "gadmala_exact": ("gadMALAe", 91.5, 0.492, (56.4, 496.4, 1420.2), (0.62, 0.16)),
        "gadrwm": ("gadRWM", 23.0, 0.227, (5.6, 35.5, 98.8), (0.24, 0.04)),
        "am": ("AM", 18.2, 0.257, (3.2, 11.8, 62.5), (0.18, 0.02)),
        "rwm": ("RWM", 17.4, 0.242, (3.0, 9.3, 52.5), (0.17, 0.02)),
        "mala": ("MALA", 22.5, 0.543, (4.4, 28.3, 326.0), (0.20, 0.06)),
        "hmc": ("HMC-10", 225.8, 0.711, (248.3, 2415.7, 19778.7), (1.10, 0.14)),
        "nuts": ("NUTS", 1412.1, math.nan, (7469.5, 20000.0, 20000.0), (5.29, 0.38)),
    },
}

#: Wang (2012), section 4.1, Table 4.1: mean squared test error on the robot arm.
PAPER_ROBOT_ARM = {"Neal's (1996) HMC, hand-tuned": 0.00554,
                   "Adaptive HMC (median error)": 0.00499,
                   "Adaptive HMC (mean error)": 0.00498}

#: Alfaki, Subbey & Haugland (2008), numerical results: N_eff of N = 2000 draws on standard
#: normals (experiment → {sampler: N_eff}).
PAPER_TALK = {"std64": {"hmc": 542, "ohmc": 614, "svhmc": 1059, "osvhmc": 1400},
              "std128": {"hmc": 554, "svhmc": 1167}}


# ---- tables -----------------------------------------------------------------------------------------

def _fmt(mean: float, sd: float | None = None, digits: str = ".3g") -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    text = format(mean, digits)
    return text if sd is None or math.isnan(sd) else f"{text} ± {format(sd, digits)}"


def _ok(jobs):
    return jobs[jobs["error"] == ""] if "error" in jobs else jobs


def efficiency_table(jobs, experiment: str):
    """Mean over repeats of each sampler's efficiency on one experiment, with the ratio to
    NUTS per gradient and per second (> 1: better than NUTS)."""
    import pandas as pd

    from .comparison import to_markdown

    sub = jobs[jobs["experiment"] == experiment]
    fields = ["min_ess_bulk", "median_ess_bulk", "min_ess_per_grad", "min_ess_per_grad_total",
              "min_ess_per_s", "min_ess_per_s_total", "max_rhat", "accept_rate",
              "wall_seconds"]
    ok = _ok(sub)
    mean = ok.groupby("sampler", sort=False)[[f for f in fields if f in ok]].mean()
    nuts = mean.loc["nuts"] if "nuts" in mean.index else None
    for f, col in (("min_ess_per_grad", "per grad / NUTS"), ("min_ess_per_s", "per s / NUTS")):
        mean[col] = mean[f] / nuts[f] if nuts is not None and f in mean else math.nan
    failed = sub[sub["error"] != ""].groupby("sampler")["error"].first()
    for label, err in failed.items():
        if label not in mean.index:
            mean.loc[label] = math.nan
    mean["error"] = [failed.get(label, "") for label in mean.index]
    mean = mean.sort_values("min_ess_per_grad", ascending=False, na_position="last")
    mean.index.name = "sampler"
    return mean, to_markdown(pd.DataFrame(mean), floatfmt=".3g")


#: Above this max R-hat (of the sampler or of NUTS) a ratio is flagged: ESS of chains that
#: have not mixed means little.
RHAT_WARNING = 1.1


def overview_table(jobs) -> str:
    """One row per experiment, one column per sampler: min ESS per gradient and per second
    relative to NUTS (``per grad / per s``; > 1 is better than NUTS; ``–`` where the
    sampler uses no gradients or did not run); flagged with the worse max R-hat of the two
    when it exceeds :data:`RHAT_WARNING`."""
    cells: dict[str, dict[str, str]] = {}
    samplers: list[str] = []
    for exp in dict.fromkeys(jobs["experiment"]):
        table, _ = efficiency_table(jobs, exp)
        for label, row in table.iterrows():
            if label == "nuts":
                continue
            samplers = list(dict.fromkeys([*samplers, label]))
            text = "failed" if row["error"] else \
                f"{_fmt(row['per grad / NUTS'])} / {_fmt(row['per s / NUTS'])}"
            worst = max(row.get("max_rhat", math.nan), table["max_rhat"].get("nuts", math.nan))
            if worst > RHAT_WARNING:
                text += f" (R̂ {worst:.2g})"
            cells.setdefault(exp, {})[label] = text
    lines = ["| experiment | " + " | ".join(samplers) + " |",
             "|---|" + "---:|" * len(samplers)]
    lines += [f"| {exp} | " + " | ".join(row.get(s, "–") for s in samplers) + " |"
              for exp, row in cells.items()]
    return "\n".join(lines)


def _per_chain_stats(chains, experiment: str, sampler: str, scale: float = 1.0):
    sub = chains[(chains["experiment"] == experiment) & (chains["sampler"] == sampler)]
    return [(float(sub[c].mean() * scale), float(sub[c].std(ddof=1) * scale) if len(sub) > 1
             else math.nan) for c in ("min_ess_per_grad", "median_ess_per_grad",
                                      "max_ess_per_grad")] if len(sub) else None


def sv_table(chains) -> str:
    """Wang et al. (2013) Table 1 beside ours: ESS per leapfrog ×10³ (mean ± sd over
    chains), minimum / median / maximum over x, β, φ, σ²."""
    lines = ["| sampler | source | minimum | median | maximum |", "|---|---|---:|---:|---:|"]
    samplers = list(dict.fromkeys(["ahmc", "nuts", *chains[chains["experiment"] == "sv"]
                                   ["sampler"]]))
    for s in samplers:
        if s in PAPER_SV:
            lines.append(f"| {s} | paper | " + " | ".join(_fmt(m, sd, ".2g") for m, sd in
                                                           PAPER_SV[s]) + " |")
        ours = _per_chain_stats(chains, "sv", s, 1e3)
        if ours:
            lines.append(f"| {s} | ours | " + " | ".join(_fmt(m, sd, ".3g") for m, sd in ours)
                         + " |")
    return "\n".join(lines)


def gad_table(jobs) -> str:
    """Titsias & Dellaportas (2019) Table 1 beside ours.  Ours: time and ESS per chain
    (a paper run is one chain of 2·10⁴ draws), min ESS/s = pooled min ESS / total time;
    HMC-L is the best of HMC-5/10/20, as in the paper."""
    lines = ["| experiment | method | source | time (s) | accept | ESS (min, med, max) "
             "| min ESS/s |", "|---|---|---|---:|---:|---|---:|"]
    ok = _ok(jobs)
    for exp, rows in PAPER_GAD.items():
        sub = ok[ok["experiment"] == exp]
        for label, (paper_label, t, acc, ess, ess_s) in rows.items():
            lines.append(f"| {exp} | {paper_label} | paper | {t} | {_fmt(acc)} | "
                         f"({', '.join(f'{v:g}' for v in ess)}) | {_fmt(*ess_s)} |")
            mine = sub[sub["sampler"].str.startswith(label + "-") if label == "hmc"
                       else sub["sampler"] == label]
            if mine.empty:
                continue
            if label == "hmc":
                best = mine.groupby("sampler")["min_ess_per_s_total"].mean().idxmax()
                mine = mine[mine["sampler"] == best]
            per_chain = mine["chains"]
            time_chain = ((mine["time_warmup"] + mine["time_sampling"]) / per_chain).mean()
            ess = [(mine[f"{s}_ess_bulk"] / per_chain).mean() for s in ("min", "median", "max")]
            rate = mine["min_ess_per_s_total"]
            lines.append(f"| {exp} | {mine['sampler'].iloc[0]} | ours | {time_chain:.3g} | "
                         f"{mine['accept_rate'].mean():.3f} | "
                         f"({', '.join(f'{v:.4g}' for v in ess)}) | "
                         f"{_fmt(rate.mean(), rate.std(ddof=1) if len(rate) > 1 else None)} |")
    return "\n".join(lines)


def robot_arm_table(jobs) -> str:
    """Wang (2012) Table 4.1 beside our test MSE (:func:`predictive_mse`, mean over
    repeats)."""
    lines = ["| method | source | test MSE |", "|---|---|---:|"]
    lines += [f"| {k} | paper | {v:g} |" for k, v in PAPER_ROBOT_ARM.items()]
    sub = _ok(jobs[jobs["experiment"] == "robot_arm"])
    if "test_mse" in sub:
        for s, v in sub.groupby("sampler", sort=False)["test_mse"].mean().items():
            lines.append(f"| {s} | ours | {v:.5f} |")
    return "\n".join(lines)


def talk_table(jobs) -> str:
    """Alfaki et al. (2008) N_eff/N beside ours (median bulk-ESS / draws, pooled chains)."""
    lines = ["| experiment | sampler | paper N_eff / N | ours median ESS / N |",
             "|---|---|---:|---:|"]
    ok = _ok(jobs)
    for exp, rows in PAPER_TALK.items():
        sub = ok[ok["experiment"] == exp]
        for s in dict.fromkeys([*rows, *sub["sampler"]]):
            mine = sub[sub["sampler"] == s]
            ours = (mine["median_ess_bulk"] / (mine["chains"] * mine["draws"])).mean() \
                if len(mine) else math.nan
            paper = rows.get(s, math.nan) / 2000
            if len(mine) or s in rows:
                lines.append(f"| {exp} | {s} | {_fmt(paper)} | {_fmt(ours)} |")
    return "\n".join(lines)


def sensitivity_table(results) -> str:
    """Figure 1 of Wang et al. (2013) in numbers."""
    lines = ["| ε | L | accept (paper: ≈ 0.7 for all three) | min ESS of 1000 | "
             "min ESS / grad |", "|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['step_size']} | {r['num_steps']} | {r['accept_rate']:.3f} | "
                     f"{r['min_ess']:.1f} | {r['min_ess_per_grad']:.2e} |")
    return "\n".join(lines)


# ---- figures ------------------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_logistic(chains, path: Path) -> None:
    """Wang et al. (2013) Figure 2: per-chain min / median / max ESS per gradient, one
    group of boxes per data set, one box per sampler."""
    plt = _pyplot()
    sub = chains[chains["experiment"].isin(
        [e for e, x in experiments().items() if x.group == "logistic"])]
    sets = list(dict.fromkeys(sub["experiment"]))
    samplers = list(dict.fromkeys(sub["sampler"]))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=False)
    width = 0.8 / max(len(samplers), 1)
    for ax, stat in zip(axes, ("min", "median", "max")):
        for k, s in enumerate(samplers):
            data = [sub[(sub["experiment"] == e) & (sub["sampler"] == s)]
                    [f"{stat}_ess_per_grad"].dropna().to_numpy() for e in sets]
            pos = [i + (k - (len(samplers) - 1) / 2) * width for i in range(len(sets))]
            keep = [(p, d) for p, d in zip(pos, data) if len(d)]
            if keep:
                bp = ax.boxplot([d for _, d in keep], positions=[p for p, _ in keep],
                                widths=width * 0.9, patch_artist=True)
                for box in bp["boxes"]:
                    box.set_facecolor(f"C{k}")
            ax.plot([], [], color=f"C{k}", lw=6, label=s)
        ax.set_xticks(range(len(sets)), sets)
        ax.set_yscale("log")
        ax.set_title(f"{stat} ESS per gradient")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lgcp(fields: dict, truth: tuple[dict, np.ndarray], path: Path) -> None:
    """Wang et al. (2013) Figure 4: the true latent field and the counts, then the
    posterior mean and variance of x by each sampler."""
    plt = _pyplot()
    data, x_true = truth
    d = int(round(math.sqrt(data["n"])))
    grid = lambda v: np.asarray(v).reshape(d, d, order="F")  # noqa: E731
    rows = [("truth", [("latent field x", x_true), ("counts y", data["y"])])]
    rows += [(s, [("posterior mean of x", m), ("posterior variance of x", v)])
             for s, (m, v) in fields.items()]
    fig, axes = plt.subplots(len(rows), 2, figsize=(7, 3.2 * len(rows)), squeeze=False)
    lo, hi = float(np.min(x_true)), float(np.max(x_true))
    for (name, panels), ax_row in zip(rows, axes):
        for (title, values), ax in zip(panels, ax_row):
            kw = {"vmin": lo, "vmax": hi} if "mean" in title or "field" in title else {}
            im = ax.imshow(grid(values), origin="lower", **kw)
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sensitivity(results, path: Path) -> None:
    """Wang et al. (2013) Figure 1: trajectories and autocorrelations of HMC at three
    nearby (ε, L)."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(results), figsize=(4 * len(results), 7), squeeze=False)
    for k, r in enumerate(results):
        x = r["draws"]
        ax = axes[0, k]
        ax.plot(x[:, 0], x[:, 1], "-", lw=0.3, color="0.6")
        ax.plot(x[:, 0], x[:, 1], ".", ms=2)
        ax.set_title(f"ε = {r['step_size']}, L = {r['num_steps']}, "
                     f"accept {r['accept_rate']:.2f}", fontsize=9)
        ax.set_aspect("equal")
        ax = axes[1, k]
        for j, acf in enumerate(r["acf"]):
            ax.bar(np.arange(len(acf)) + 0.4 * j, acf, width=0.4, label=f"x{j + 1}")
        ax.set_xlabel("lag")
        ax.set_ylim(-1, 1)
        ax.legend(fontsize=8)
    axes[1, 0].set_ylabel("autocorrelation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(target: Path, jobs, chains, *, fields=None, sensitivity=None, lgcp=None,
                 figures: bool = True, notes: Sequence[str] = ()) -> dict[str, str]:
    """Write ``jobs.csv``, ``chains.csv``, ``summary.md`` and the figures; return the
    markdown tables by name."""
    target = Path(target)
    jobs.to_csv(target / "jobs.csv", index=False)
    chains.to_csv(target / "chains.csv", index=False)
    tables: dict[str, str] = {}
    sections = []
    for exp in dict.fromkeys(jobs["experiment"]):
        _, md = efficiency_table(jobs, exp)
        tables[f"efficiency:{exp}"] = md
        sections.append(f"### {exp}\n\n{experiments()[exp].source}.\n\n{md}\n")
    done = set(jobs["experiment"])
    tables["overview"] = overview_table(jobs)
    if "sv" in done:
        tables["sv"] = sv_table(chains)
    if done & set(PAPER_GAD):
        tables["gad"] = gad_table(jobs)
    if done & set(PAPER_TALK):
        tables["talk"] = talk_table(jobs)
    if "robot_arm" in done:
        tables["robot_arm"] = robot_arm_table(jobs)
    if sensitivity is not None:
        tables["sensitivity"] = sensitivity_table(sensitivity)
    titles = {"overview": "Min ESS relative to NUTS, per gradient / per second (warmup "
                          "excluded; > 1: better than NUTS)",
              "sv": "Stochastic volatility: ESS per leapfrog ×10³ (Wang et al. 2013, "
                    "Table 1)",
              "gad": "gadMALA table (Titsias & Dellaportas 2019, Table 1)",
              "talk": "Standard normals (Alfaki et al. 2008)",
              "robot_arm": "Robot arm test MSE (Wang 2012, Table 4.1)",
              "sensitivity": "HMC's sensitivity to (ε, L) on the 2-d Gaussian "
                             "(Wang et al. 2013, Figure 1)"}
    papers = [f"## {titles[k]}\n\n{tables[k]}\n" for k in titles if k in tables]
    figs = []
    if figures:
        if any(experiments().get(e) and experiments()[e].group == "logistic" for e in done) \
                and len(chains):
            plot_logistic(chains, target / "logistic_ess.png")
            figs.append("logistic_ess.png")
        if fields and lgcp is not None:
            plot_lgcp(fields, lgcp, target / "lgcp_field.png")
            figs.append("lgcp_field.png")
        if sensitivity is not None:
            plot_sensitivity(sensitivity, target / "sensitivity.png")
            figs.append("sensitivity.png")
    text = ["# Results\n",
            "Efficiency on the measured columns (ArviZ bulk-ESS); per grad / NUTS and per s / "
            "NUTS > 1 mean better than NUTS.  Means over repeats.\n",
            *(f"- {n}" for n in notes), "" if notes else None,
            *papers, "## Efficiency per experiment\n", *sections,
            *(f"![{f}]({f})\n" for f in figs)]
    (target / "summary.md").write_text("\n".join(t for t in text if t is not None))
    return tables
