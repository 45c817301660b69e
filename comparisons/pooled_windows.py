"""Pooled metric windows (``tune_and_sample(..., pool_windows=True)``) measured two ways.

``conditioning``: how well each scale-phase window's metric estimate fits the posterior,
from one chain's window (as AHMC makes it) and from all chains' windows pooled, on the
same draws: the condition number of the posterior covariance in the estimate's metric
(the ratio of the largest to the smallest generalised eigenvalue of (Σ, M⁻¹); HMC's
steps per independent draw grow with its square root).  Σ is the covariance of
reference draws: CmdStan NUTS's (4 × (1000 + 1000), seed 11), or a ``.npy`` of draws
``(..., dims)`` given with ``--reference``.  The chains run one after another in this
process without pooling (``comparisons/window_estimates.py``'s recording, with
``metric="low_rank"``; each chain's first scale phase), so the
pooled column is what pooling would have made of those windows.

    python comparisons/pooled_windows.py conditioning --model caravan --warmup 1000 \\
        --seed 2 [--reference draws.npy]

``wall``: AHMC with and without pooling, side by side, seeds one after another: the
call's wall time (the chains run in parallel; with pooling a worker process each, so on
fewer cores than chains its chain-seconds count time the chain waited for a core and
are not comparable), min bulk ESS per gradient and per wall-second, warmup included.

    python comparisons/pooled_windows.py wall --models neal100,pima,gauss2d,breast_cancer \\
        [--seeds 1,2,3]

Models as ``comparisons/nuts_peers.py`` loads them.  Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from scipy import linalg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_peers import load  # noqa: E402
from window_estimates import dense, record_raw  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.tuning.windows import low_rank_inv_metric, regularized_inv_metric  # noqa: E402


def conditioning(args) -> None:
    model = load(args.model)
    if args.reference:
        sigma = np.cov(np.load(args.reference).reshape(-1, model.dims).T)
    else:
        from ahmc_stan.nuts import run_nuts

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = run_nuts(model, chains=4, warmup=1000, draws=1000, seed=11)
        sigma = np.cov(np.asarray(ref.params).reshape(-1, model.dims).T)

    def kappa(inv_metric) -> float:
        ev = linalg.eigh(sigma, dense(inv_metric), eigvals_only=True)
        return float(ev.max() / ev.min())

    phases, _ = record_raw(model, chains=args.chains, warmup=args.warmup, seed=args.seed,
                           metric="low_rank")
    first = [p["windows"] for p in phases if p["metric"] == "low_rank"][:args.chains]
    print(f"{args.model}, {model.dims} parameters, warmup {args.warmup}, seed {args.seed}: "
          "condition number of Σ in each window's metric\n")
    print("| window | draws per chain | one chain's low rank (each chain) | "
          "one chain's Stan diagonal (each chain) | pooled low rank | pooled Stan diagonal |")
    print("|---:|---:|---|---|---:|---:|")
    for w in range(min(len(p) for p in first)):
        rows = [p[w] for p in first]
        x = np.concatenate([r[0] - r[0].mean(0) for r in rows])
        g = np.concatenate([r[1] - r[1].mean(0) for r in rows])
        own = ", ".join(f"{kappa(r[2]):.3g}" for r in rows)
        own_diag = ", ".join(f"{kappa(regularized_inv_metric(r[0], dense=False)):.3g}"
                             for r in rows)
        print(f"| {w + 1} | {len(rows[0][0])} | {own} | {own_diag} | "
              f"{kappa(low_rank_inv_metric(x, g)):.3g} | "
              f"{kappa(regularized_inv_metric(x, dense=False)):.3g} |")


def wall(args) -> None:
    seeds = [int(s) for s in args.seeds.split(",")]
    print("| model | pool_windows | call wall s (per seed) | min ESS per gradient | "
          "min ESS per wall-second | ratio per gradient, per second (median) |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model = load(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ahmc_stan.tune_and_sample(model, seed=seeds[0], progress=False, diagnose=False)
            out = {False: [], True: []}
            for seed in seeds:
                for pool in (False, True):  # alternately: the same conditions for both
                    start = time.perf_counter()
                    fit = ahmc_stan.tune_and_sample(model, seed=seed, progress=False,
                                                    diagnose=False, pool_windows=pool)
                    seconds = time.perf_counter() - start
                    e = fit.efficiency()
                    out[pool].append((seconds, e["min_ess_per_grad_total"],
                                      e["min_ess_bulk"] / seconds))
        base = np.array(out[False])
        for pool in (False, True):
            a = np.array(out[pool])
            ratio = "" if not pool else (f"{np.median(a[:, 1] / base[:, 1]):.2f}, "
                                         f"{np.median(a[:, 2] / base[:, 2]):.2f}")
            print(f"| {name} | {pool} | {', '.join(f'{v:.2f}' for v in a[:, 0])} | "
                  f"{', '.join(f'{v:.3g}' for v in a[:, 1])} | "
                  f"{', '.join(f'{v:.3g}' for v in a[:, 2])} | {ratio} |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("conditioning")
    c.add_argument("--model", required=True)
    c.add_argument("--warmup", type=int, default=1000)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--chains", type=int, default=4)
    c.add_argument("--reference", help=".npy of reference draws (..., dims)")
    w = sub.add_parser("wall")
    w.add_argument("--models", required=True)
    w.add_argument("--seeds", default="1,2,3")
    args = ap.parse_args(argv)
    (conditioning if args.command == "conditioning" else wall)(args)


if __name__ == "__main__":
    main()
