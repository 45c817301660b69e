"""Warmup variants early in the scale phase, A/B seed for seed: warmup's share of the
gradients and the min bulk ESS per gradient (warmup included) of AHMC's default call.

    python benchmarks/early_caps.py MODEL [--variants 10/25,default] [--seeds 1-100]

MODEL is one of ``comparisons/nuts_peers.py``'s.  Each variant runs in a process of its
own: ``default`` as the package is; ``MAX/EVERY`` with the cap on leapfrog steps
``MAX · 2^(iteration // EVERY)`` on any number of parameters (it sets
:data:`~ahmc_stan.tuning.hmc_warmup.EARLY_MAX_STEPS`, ``EARLY_CAP_EVERY`` and their
``SMALL_`` counterparts); ``lowrank>=F`` with the low-rank estimate
(:func:`~ahmc_stan.tuning.windows.low_rank_inv_metric`) only in metric windows of at
least ``F`` times as many draws as parameters, the diagonal from draws and gradients
(:func:`~ahmc_stan.tuning.windows.fisher_inv_metric`) in the others.  The process calls
``tune_and_sample(model, seed=s, progress=False, diagnose=False)`` for every seed.  Prints
per variant the median warmup share, warmup gradients per chain, min ESS per gradient,
max R-hat and extended fits, and against the first variant the median of the paired
(same seed) ratios of ESS per gradient.  Gradients are counted, not timed, so both
variants may share the machine with anything.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run(model: str, variant: str, seeds: list[int]) -> None:
    """This process: one line of JSON per seed."""
    sys.path[:0] = [str(ROOT), str(ROOT / "comparisons")]
    import ahmc_stan
    import nuts_peers
    from ahmc_stan.tuning import hmc_warmup

    if variant.startswith("lowrank>="):
        _low_rank_from(float(variant.split(">=")[1]))
    elif variant != "default":
        steps, every = map(int, variant.split("/"))
        hmc_warmup.EARLY_MAX_STEPS = hmc_warmup.SMALL_EARLY_MAX_STEPS = steps
        hmc_warmup.EARLY_CAP_EVERY = hmc_warmup.SMALL_EARLY_CAP_EVERY = every
    warnings.simplefilter("ignore")
    stan_model = nuts_peers.load(model)
    for seed in seeds:
        fit = ahmc_stan.tune_and_sample(stan_model, seed=seed, progress=False, diagnose=False)
        e = fit.efficiency()
        grads = fit.n_grad_warmup + fit.n_grad_sampling
        print(json.dumps({"seed": seed, "share": fit.n_grad_warmup / grads,
                          "warmup_per_chain": fit.n_grad_warmup / fit.chains,
                          "ess_per_grad": float(e["min_ess_bulk"]) / grads,
                          "rhat": float(e["max_rhat"]),
                          "extended": fit.n_draws > 1000}), flush=True)


def _low_rank_from(share: float) -> None:
    """The scale phase's low-rank estimate only in windows of at least ``share`` times as
    many draws as parameters, :func:`fisher_inv_metric` in the others."""
    from ahmc_stan.tuning import hmc_warmup, windows

    def estimate(draws, grads, *args, **kwargs):
        if len(draws) < share * draws.shape[1]:
            return windows.fisher_inv_metric(draws, grads)
        return windows.low_rank_inv_metric(draws, grads, *args, **kwargs)

    hmc_warmup.low_rank_inv_metric = estimate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--variants", default="10/25,default")
    parser.add_argument("--seeds", default="1-100")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a variant, in its own process
    args = parser.parse_args()
    low, high = map(int, args.seeds.split("-"))
    seeds = list(range(low, high + 1))
    if args.run:
        return run(args.model, args.run, seeds)
    rows = {}
    for variant in args.variants.split(","):
        out = subprocess.run([sys.executable, __file__, args.model, "--seeds", args.seeds,
                              "--run", variant], check=True, capture_output=True, text=True)
        rows[variant] = {r["seed"]: r for r in map(json.loads, out.stdout.splitlines())}
    first = next(iter(rows.values()))
    for variant, by_seed in rows.items():
        r = list(by_seed.values())
        med = {k: float(np.median([x[k] for x in r]))
               for k in ("share", "warmup_per_chain", "ess_per_grad")}
        line = (f"{args.model} {variant}: share {med['share']:.3f}, warmup gradients a chain "
                f"{med['warmup_per_chain']:.0f}, min ESS per gradient {med['ess_per_grad']:.4f}, "
                f"max R-hat {max(x['rhat'] for x in r):.3f}, extended "
                f"{sum(x['extended'] for x in r)} of {len(r)}")
        if by_seed is not first:
            paired = [by_seed[s]["ess_per_grad"] / first[s]["ess_per_grad"] for s in by_seed]
            line += f"; paired ratio to {next(iter(rows))} {np.median(paired):.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
