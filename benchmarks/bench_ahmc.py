"""AHMC speed: wall time per leapfrog step against the bare C++ gradient, and the tuner's
share of wall time (issue 14: at most 5 % on every suite model).

    python benchmarks/bench_ahmc.py [--models std10,logistic100,gauss2d,...]
                                    [--warmup 1000] [--draws 1000]

For each model (a 10-d standard Gaussian, where per-iteration overhead dominates; a
logistic regression with 100 parameters; the suite's models) runs one AHMC chain in this
process and reports, from the same run: the bare C++ gradient time (timed inside the
library), the chain's wall time, the wall time per leapfrog step of the sampling phase,
and the tuner's share of the chain's wall time (warmup included; the tuner's own clock,
``fit.metadata["chains"][c]["tuner_seconds"]``) — with the tuner in C++ (the default) and
in Python (``native=False``), each with the paper's infinite adaptation and with the
tuner frozen after warmup.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ahmc_stan, also for A/B copies

import numpy as np  # noqa: E402

import ahmc_stan  # noqa: E402


def measure(name: str, model: ahmc_stan.StanModel, warmup: int, draws: int,
            adapt_during_sampling: bool, native: bool) -> dict:
    x = model.initial_point(np.random.default_rng(0))
    bare_us = model.density.gradient_seconds(x, 20000) * 1e6
    fit = ahmc_stan.tune_and_sample(model, chains=1, warmup=warmup, draws=draws, seed=1,
                                    progress=False, parallel=False, diagnose=False,
                                    adapt_during_sampling=adapt_during_sampling,
                                    native=native)
    chain = fit.metadata["chains"][0]
    total = fit.time_warmup + fit.time_sampling  # the chain's own clock
    per_step = fit.time_sampling / fit.n_grad_sampling * 1e6
    return {
        "model": name, "tuner": "C++" if native else "Python",
        "in sampling": "runs" if adapt_during_sampling else "frozen",
        "dims": model.dims, "bare C++ gradient µs": bare_us, "chain ms": 1e3 * total,
        "sampling wall µs / leapfrog step": per_step, "ratio to bare": per_step / bare_us,
        "tuner share of chain wall time": chain["tuner_seconds"] / total,
        "mean L_r": float(np.mean(fit.sampler_stats["num_steps"])),
    }


def main(argv=None) -> None:
    import argparse

    from bench_samplers import load  # the same models as the samplers' benchmark

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="std10,logistic100,gauss2d,neal100,gp51,pima,"
                                        "ripley,breast_cancer")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=1000)
    args = ap.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        model = load(name)
        measure(name, model, 100, 100, True, True)  # first calls in this process
        rows += [measure(name, model, args.warmup, args.draws, adapt, native)
                 for native in (True, False) for adapt in (True, False)]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                                for k in keys) + " |", flush=True)


if __name__ == "__main__":
    main()
