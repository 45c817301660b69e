"""The papers' experiments against CmdStan's NUTS in one call: ``run_suite("paper")``.

Every (experiment × sampler × repeat) is an independent job, run in a process pool or on a
Dask cluster; the same seeds give the same tables either way.  Models are compiled once,
before any job starts.  Outputs (``out_dir/quick`` or ``out_dir/full``): ``jobs.csv``,
``chains.csv``, ``summary.md`` (every table), figures (PNG) and ``run.json``.

The modules: :mod:`.registry` (experiments, sampler specs, the quick and full
configurations), :mod:`.jobs` (runner, executors, checkpoints), :mod:`.papers` (the papers' reference
numbers), :mod:`.report` (tables, figures), :mod:`.sensitivity` (Wang et al. 2013,
Figure 1) and :mod:`.run` (:func:`run_suite`, the one entry point).
"""

from .jobs import Job, job_seed, predictive_mse, run_job
from .registry import (EXPERIMENTS, FULL, QUICK, SAMPLER_SPECS, STAN_MODELS, Experiment,
                       SamplerSpec, experiments, plan_runs)
from .run import run_suite
from .sensitivity import sensitivity_demo

__all__ = ["run_suite", "run_job", "Experiment", "Job", "EXPERIMENTS", "SAMPLER_SPECS",
           "QUICK", "FULL", "plan_runs", "sensitivity_demo", "STAN_MODELS", "SamplerSpec",
           "experiments", "job_seed", "predictive_mse"]
