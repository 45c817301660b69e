"""ARMHMC against RMHMC at fixed (ε, L), AHMC and CmdStan's NUTS on the two logistic
regressions of seed 000 §5.1 that ship in a package (Pima, Ripley), from one run:

    python comparisons/armhmc_logistic.py [--chains 2] [--warmup 500] [--draws 1000] [--seed 1]
                                          [--rmhmc 0.5x6,0.2x6] [--differences]

ARMHMC and AHMC run with their defaults (derived boxes); RMHMC runs with fixed L at each
``--rmhmc EPSxL`` setting (default: Girolami & Calderhead's logistic-regression setting
0.5x6, and 0.2x6, a smaller step that converges from dispersed starts; ``--rmhmc ""``
skips them); ``--differences`` adds ARMHMC with its Hessians and third derivatives from
differences of gradients.  Every chain starts from Stan's dispersed initial point.
Prints, per data set, the ``compare`` table (ESS per gradient-equivalent, see
:mod:`ahmc_stan.costs`) with the samplers' work: generalised leapfrog steps
(``n_leapfrog``), gradients, Hessians and third-derivative tensors, and fixed-point
failures, over warmup + sampling.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import ahmc_stan
from ahmc_stan import datasets
from ahmc_stan.comparison import to_markdown

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["min_ess_bulk", "median_ess_bulk", "max_ess_bulk", "min_ess_per_grad",
           "min_ess_per_s", "min_ess_per_s / NUTS", "leapfrog steps", "gradients", "Hessians",
           "third-derivative tensors", "fixed-point failures", "accept_rate", "max_rhat",
           "time_warmup", "time_sampling"]
DATA = {"Pima": datasets.pima_data, "Ripley": datasets.ripley_data}


def _work(fit, name: str) -> float:
    stats = fit.sampler_stats
    total = float(np.sum(stats[name])) if name in stats else 0.0
    if fit.warmup_sampler_stats is not None and name in fit.warmup_sampler_stats:
        total += float(np.sum(fit.warmup_sampler_stats[name]))
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rmhmc", default="0.5x6,0.2x6",
                        help="RMHMC settings EPSxL, comma-separated (default 0.5x6,0.2x6)")
    parser.add_argument("--data", default="Pima,Ripley")
    parser.add_argument("--differences", action="store_true",
                        help="also ARMHMC with Hessians and third derivatives by differences "
                             "of gradients (hessian='gradient', third_derivatives='gradient')")
    args = parser.parse_args(argv)
    run = dict(chains=args.chains, warmup=args.warmup, draws=args.draws, seed=args.seed)
    for name in args.data.split(","):
        model = ahmc_stan.StanModel(ROOT / "stan_models" / "logistic.stan", DATA[name]())
        start = time.perf_counter()
        fits = {"armhmc": ahmc_stan.tune_and_sample(model, sampler="armhmc",
                                                    progress=False, **run)}
        if args.differences:
            fits["armhmc (differences)"] = ahmc_stan.tune_and_sample(
                model, sampler="armhmc", progress=False, hessian="gradient",
                third_derivatives="gradient", **run)
        for setting in filter(None, args.rmhmc.split(",")):
            eps, steps = setting.split("x")
            fits[f"rmhmc (ε={eps}, L={steps})"] = ahmc_stan.tune_and_sample(
                model, sampler="rmhmc", progress=False, step_size=float(eps),
                num_steps=int(steps), **run)
        fits["ahmc"] = ahmc_stan.tune_and_sample(model, progress=False, **run)
        fits["nuts"] = ahmc_stan.run_nuts(model, **run)
        table = ahmc_stan.compare(fits)
        for column, stat in [("leapfrog steps", "n_leapfrog"), ("gradients", "n_grad"),
                             ("Hessians", "n_hessian"),
                             ("third-derivative tensors", "n_third"),
                             ("fixed-point failures", "fixed_point_failures")]:
            table[column] = [_work(fits[key], stat) for key in table.index]
        print(f"\n### {name} ({model.dims} parameters; {args.chains} chains × "
              f"{args.warmup} warmup + {args.draws} draws, seed {args.seed}; "
              f"{time.perf_counter() - start:.0f} s)\n")
        print(to_markdown(table, columns=COLUMNS), flush=True)


if __name__ == "__main__":
    main()
