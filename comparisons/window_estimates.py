"""What AHMC's low-rank metric estimate makes of each scale-phase window, scale phase by
scale phase (a chain's first, then any it runs again after a metric fallback):
the window's draws, how many directions the estimate corrects
(:func:`~ahmc_stan.tuning.windows.low_rank_inv_metric`), the range of their eigenvalues,
the largest factor between it and the phase's previous estimate (the largest
generalised eigenvalue, either way), and the window variance of the named columns (of the
unconstrained coordinate at the column's position: the parameter itself where it is
unconstrained).

    python comparisons/window_estimates.py --model caravan --warmup 500 --seed 1 \\
        --columns "beta[60],beta[81]"

Models as ``comparisons/nuts_peers.py`` loads them.  The chains run one after another in
this process with the default ``metric="auto"`` (each window's estimate is recorded as
the warmup makes it; nothing else changes; no reruns or extension), 20 draws each.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy import linalg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_peers import load  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.fit import stan_name  # noqa: E402
from ahmc_stan.metric import LowRankInvMetric  # noqa: E402
from ahmc_stan.tuning import hmc_warmup  # noqa: E402


def dense(inv_metric) -> np.ndarray:
    if isinstance(inv_metric, LowRankInvMetric):
        return inv_metric.to_dense()
    return np.diag(inv_metric)


def record_raw(model, **options):
    """Run ``tune_and_sample(model, parallel=False, **options)`` with the scale phase
    (:func:`~ahmc_stan.tuning.hmc_warmup.hmc_warmup`) and the low-rank estimator
    wrapped; returns a record per scale phase run (a chain's first, and any it runs again
    after a metric fallback or a stuck start: its ``metric``, how it ``end``-ed, and its
    ``windows``, each (draws, gradients, the estimate made)), and the fit."""
    from ahmc_stan.samplers import ahmc

    estimate, warmup, phases = hmc_warmup.low_rank_inv_metric, ahmc.hmc_warmup, []

    def wrapped_estimate(draws, grads, *args, **kw):
        out = estimate(draws, grads, *args, **kw)
        phases[-1]["windows"].append((draws.copy(), grads.copy(), out))
        return out

    def wrapped_warmup(kernel, rng, state, n_iter, metric, *args, **kw):
        phases.append({"metric": metric if isinstance(metric, str) else "fixed",
                       "windows": [], "end": "done"})
        try:
            return warmup(kernel, rng, state, n_iter, metric, *args, **kw)
        except hmc_warmup.MetricFallback as fallback:
            phases[-1]["end"] = (f"fell back: {fallback.note['divergent']} divergent in "
                                 f"iterations {fallback.note['window']}")
            raise
        except Exception as other:  # a stuck start: the chain starts afresh
            phases[-1]["end"] = type(other).__name__
            raise

    hmc_warmup.low_rank_inv_metric, ahmc.hmc_warmup = wrapped_estimate, wrapped_warmup
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = ahmc_stan.tune_and_sample(model, parallel=False, progress=False,
                                            diagnose=False, extend=False, chain_rerun=False,
                                            metric_rerun=False, draws=20, **options)
    finally:
        hmc_warmup.low_rank_inv_metric, ahmc.hmc_warmup = estimate, warmup
    return phases, fit


def record_windows(model, **options):
    """:func:`record_raw`, each window summarised: its draws, the directions corrected,
    their eigenvalues' range, the factor to the previous estimate, the draws' variances."""
    phases, fit = record_raw(model, **options)
    for phase in phases:
        rows, previous = [], None
        for draws, _, out in phase["windows"]:
            d = dense(out)
            factor = None if previous is None else float(np.exp(np.max(np.abs(np.log(
                linalg.eigh(d, previous, eigvals_only=True))))))
            vals = out.vals if isinstance(out, LowRankInvMetric) else np.array([])
            rows.append({"n": len(draws), "k": len(vals),
                         "vals": (float(vals.min()), float(vals.max())) if len(vals) else None,
                         "factor": factor, "var": np.var(draws, axis=0, ddof=1)})
            previous = d
        phase["windows"] = rows
    return phases, fit


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--columns", default="", help="comma-separated column names")
    args = ap.parse_args(argv)
    model = load(args.model)
    phases, fit = record_windows(model, chains=args.chains, warmup=args.warmup,
                                 seed=args.seed)
    names = [c for c in args.columns.split(",") if c]
    stan_names = [stan_name(c) for c in fit.columns]  # beta[60] as well as beta.60
    index = [stan_names.index(c) if c in stan_names else fit.columns.index(c) for c in names]
    print(f"{args.model}, {model.dims} parameters, warmup {args.warmup}, seed {args.seed}\n")
    print("| scale phase (metric: how it ended) | window draws | directions corrected | "
          "their eigenvalues | factor to the previous estimate | "
          + " | ".join(f"window variance of {c}" for c in names) + " |")
    print("|---:|---:|---:|---|---:|" + "---:|" * len(names))
    for c, phase in enumerate(phases):
        label = f"{c} ({phase['metric']}: {phase['end']})"
        if not phase["windows"]:
            print(f"| {label} | | | | |" + " |" * len(names))
        for w in phase["windows"]:
            vals = "" if w["vals"] is None else f"{w['vals'][0]:.3g}–{w['vals'][1]:.3g}"
            factor = "" if w["factor"] is None else f"{w['factor']:.3g}"
            print(f"| {label} | {w['n']} | {w['k']} | {vals} | {factor} | "
                  + " | ".join(f"{w['var'][i]:.3g}" for i in index) + " |")


if __name__ == "__main__":
    main()
