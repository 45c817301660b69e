"""AHMC against CmdStan's NUTS on three of the papers' targets, from one run:

    python comparisons/ahmc_vs_nuts.py [--chains 4] [--warmup 1000] [--draws 1000] [--seed 1]

the 2-d Gaussian with correlation 0.99, the 100-d Gaussian with standard deviations
0.01…1.00 (seed 003, Table 1) and the Pima logistic regression (seed 000, §5.1).  AHMC runs
with its defaults (diagonal metric, derived box) and in the paper's setting (identity
metric, the paper's box for logistic regression; for the Gaussians a box from the same
rule).  Prints one ``compare`` table per model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ahmc_stan
from ahmc_stan import datasets
from ahmc_stan.comparison import to_markdown

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["min_ess_bulk", "median_ess_bulk", "max_ess_bulk", "min_ess_per_grad",
           "min_ess_per_grad_total", "min_ess_per_s", "min_ess_per_grad / NUTS",
           "min_ess_per_grad_total / NUTS", "min_ess_per_s / NUTS", "max_rhat",
           "divergences"]

TARGETS = {
    "gaussian 2-d, rho 0.99": ("mvn", datasets.correlated_gaussian_data, ((0.01, 0.2), (1, 100))),
    "gaussian 100-d, sds 0.01..1": ("diag_normal", datasets.neal_gaussian_data,
                                    ((0.001, 0.02), (1, 500))),
    "logistic regression, Pima": ("logistic", datasets.pima_data, ((0.01, 0.2), (1, 100))),
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    run = dict(chains=args.chains, warmup=args.warmup, draws=args.draws, seed=args.seed)
    for title, (stan, data, paper_box) in TARGETS.items():
        model = ahmc_stan.StanModel(ROOT / "stan_models" / f"{stan}.stan", data())
        start = time.perf_counter()
        fits = {
            "ahmc (default: low_rank metric, derived box)": ahmc_stan.tune_and_sample(
                model, progress=False, **run),
            "ahmc (paper: identity, fixed box)": ahmc_stan.tune_and_sample(
                model, progress=False, metric="identity", box=paper_box, **run),
            "nuts": ahmc_stan.run_nuts(model, **run),
        }
        print(f"\n### {title} ({model.dims} parameters; {args.chains} chains × "
              f"{args.warmup} warmup + {args.draws} draws, seed {args.seed}; "
              f"{time.perf_counter() - start:.0f} s)\n")
        print(to_markdown(ahmc_stan.compare(fits), columns=COLUMNS))


if __name__ == "__main__":
    main()
