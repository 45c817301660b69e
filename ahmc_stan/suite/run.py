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
from .registry import QUICK, Experiment, _lgcp_grid, available_specs, experiments, plan_runs
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
              repeats: int | None = None, out_dir: str | os.PathLike = "comparisons/results",
              client: Any = None, *, only: Sequence[str] | None = None,
              iterations: tuple[int, int] | None = None, chains: int | None = None,
              seed: int = 20130616, workers: int | None = None, figures: bool = True,
              command: str | None = None, log: Callable[[str], None] | None = print,
              resume: bool = True) -> dict:
    """Run the suite and write its tables and figures to ``out_dir/quick`` (or ``/full``).

    What runs is :func:`~.registry.plan_runs` of ``quick``, ``samplers`` (table labels;
    default: :data:`~.registry.QUICK`'s or, full, each experiment's in
    :data:`~.registry.FULL`; NUTS always runs), ``repeats`` (default: 1 when quick, else
    FULL's), ``only``, ``iterations`` and ``chains``.  ``client``: ``None`` (local process pool of
    ``workers`` processes, default all cores), a ``dask.distributed.Client`` or a
    scheduler address.  Every finished job is kept in
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
    available, specs = experiments(), available_specs()
    plan = plan_runs(quick, samplers, repeats, only, iterations, chains)
    names = list(dict.fromkeys(p.experiment for p in plan))
    full_data = {p.experiment: p.full_data for p in plan}
    log(f"suite {suite!r} ({mode}): {len(names)} experiments, {len(plan)} (experiment, "
        f"sampler) pairs, {sum(p.repeats for p in plan)} jobs")
    models: dict[str, StanModel] = {}
    with cf.ThreadPoolExecutor(workers or os.cpu_count() or 1) as threads:
        prepared = {n: threads.submit(_prepare, available[n], full_data[n]) for n in names}
        for n, fut in prepared.items():
            models[n], seconds = fut.result()
            log(f"  prepared {n} ({models[n].dims} dims) in {seconds:.1f} s")

    jobs, skipped = [], []
    columns = {n: _ess_columns(models[n], available[n].ess_prefixes) for n in names}
    for p in plan:
        exp, model, spec = available[p.experiment], models[p.experiment], specs[p.label]
        max_dims = None if p.chosen else spec.max_dims  # FULL's choice stands
        if quick and spec.iteration_factor > 1:
            max_dims = min(max_dims or math.inf, QUICK["mh_max_dims"])
        if max_dims is not None and model.dims > max_dims:
            skipped.append((p.experiment, p.label, f"{model.dims} dims > {max_dims}"))
            continue
        for r in range(p.repeats):
            jobs.append(Job(p.experiment, exp.group, spec, r,
                            job_seed(seed, p.experiment, p.label, r), p.chains, p.warmup,
                            p.draws, model, columns[p.experiment],
                            keep_field=exp.group == "lgcp" and r == 0))
    target = Path(out_dir) / mode
    checkpoints = target / "jobs"
    if not resume and checkpoints.exists():
        shutil.rmtree(checkpoints)
    checkpoints.mkdir(parents=True, exist_ok=True)
    unreadable: list[tuple[str, str]] = []
    files = [_checkpoint_name(job) for job in jobs]
    finished = {i: out for i, name in enumerate(files)
                if (out := _load_checkpoint(checkpoints / name, unreadable)) is not None}
    if finished:
        log(f"reusing {len(finished)} finished jobs from {checkpoints}")
    for name, reason in unreadable:
        log(f"  kept job {name} cannot be read ({reason}): it runs again")
    if others := len({p.name for p in checkpoints.glob("*.pkl")} - set(files)):
        log(f"  {others} other kept jobs in {checkpoints} are not part of this run (other "
            "experiments, samplers, seeds, chains or iterations)")
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
        "suite": suite, "mode": mode, "experiments": names, "seed": seed,
        "runs": [[p.experiment, p.label, p.chains, p.warmup, p.draws, p.repeats]
                 for p in plan],
        "data": {n: "full" if full_data[n] else "quick" for n in names},
        "skipped": skipped,
        "executor": "local process pool" if client is None else "dask.distributed",
        "jobs_reused": len(finished),
        "workers": workers or os.cpu_count(),
    }
    truth = (datasets.simulate_lgcp(_lgcp_grid(full_data["lgcp"]), seed=1)
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


