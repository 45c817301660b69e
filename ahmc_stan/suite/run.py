"""The one entry point, :func:`run_suite`: prepare the models, run the jobs, write the report
and ``run.json`` (command, machine, configuration, wall time)."""

from __future__ import annotations

import concurrent.futures as cf
import datetime
import functools
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import datasets
from ..model import StanModel
from ..stan_models import stan_file
from .jobs import (Job, _checkpoint_name, _cost, _ess_columns, _executor, _gather,
                   _load_checkpoint, _save_checkpoint, job_seed, run_job)
from .registry import (FULL_CHAINS, QUICK, Experiment, _iterations, _lgcp_grid,
                       available_specs, experiments)
from .report import write_report
from .sensitivity import sensitivity_demo


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
    from ..nuts import compile_cmdstan_model

    start = time.perf_counter()
    model = StanModel(stan_file(exp.stan_file), exp.data(full))
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
    names = list(only) if only else (list(QUICK["experiments"]) if quick else list(available))
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


