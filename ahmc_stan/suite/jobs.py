"""Jobs: one sampler on one experiment with one seed (:func:`run_job`, reduced in the worker
to the tables' rows), the executors that run them (a local process pool or Dask) and the
checkpoints that let an interrupted or extended run reuse finished jobs.

Inside a job the chains run one after another in that job's process (``parallel=False`` /
``parallel_chains=1``): the jobs are the unit of parallelism, so process pools are never
nested.  A job carries its :class:`~ahmc_stan.model.StanModel`, which pickles as its
constructor arguments and reloads the library from the compile cache.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing
import os
import pickle
import time
import traceback
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..fit import Fit
from ..model import StanModel
from .registry import SamplerSpec


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


def _ess_columns(model: StanModel, prefixes: Sequence[str]) -> tuple[int, ...]:
    names = model.param_names(include_tp=True, include_gq=True)
    block = model.param_names()
    everything = block + [n for n in names if n not in set(block)]  # a Fit's column order
    if not prefixes:
        return tuple(range(len(block)))
    return tuple(i for i, n in enumerate(everything)
                 if any(n == p or (p.endswith(".") and n.startswith(p)) for p in prefixes))


# ---- one job ---------------------------------------------------------------------------------

def _measured(fit: Fit, columns: Sequence[int], chains: slice = slice(None)) -> Fit:
    """The fit restricted to some chains and to the measured columns (as its parameters),
    so that :meth:`Fit.efficiency` measures exactly those."""
    from ..fit import _evaluations

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


def _run_fit(job: Job) -> Fit:
    if job.spec.sampler == "nuts":
        from ..nuts import run_nuts

        return run_nuts(job.model, chains=job.chains, warmup=job.warmup, draws=job.draws,
                        seed=job.seed, parallel_chains=1, diagnose=False,
                        **job.spec.options)
    from ..sampling import tune_and_sample

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
        row["draws"] = fit.n_draws  # twice job.draws for an extended fit (tune_and_sample)
        measured = _measured(fit, job.ess_columns)
        eff = measured.efficiency()
        row.update(eff)
        grads = eff["n_grad_equiv_sampling"]
        for stat in ("median", "max"):
            row[f"{stat}_ess_per_grad"] = eff[f"{stat}_ess_bulk"] / grads if grads else math.nan
        row["incomplete"] = fit.incomplete
        for c in range(fit.chains):
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


# ---- executors -------------------------------------------------------------------------------

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


def _load_checkpoint(path: Path, problems: list | None = None) -> dict | None:
    """A kept job's output, ``None`` when there is none; one that exists but cannot be
    read is not trusted either (``None``), and ``(file name, reason)`` goes to
    ``problems``."""
    try:
        return pickle.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as err:
        if problems is not None:
            problems.append((path.name, f"{type(err).__name__}: {err}"))
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


