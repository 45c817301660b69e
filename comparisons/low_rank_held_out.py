"""Do the low-rank metric's directions hold up on draws they were not estimated from?

    python comparisons/low_rank_held_out.py [--models sv,lgcp,gp51,breast_cancer,pima,nhtemp,galton]
        [--seed 1] [--chains 2]

Runs AHMC with ``metric="low_rank"`` (``chains`` single-chain runs in this process, 1000
+ 1000 each) and keeps every metric window's draws and gradients.  For
each window: the number of directions the estimate corrects (eigenvalue above the cutoff
2 or below 1/2); then the same estimate from the window's first half, its directions
measured on the second half (``√(vᵀCov(x)v / vᵀCov(∇)v)`` in the first half's diagonal
scaling), and how many of the first half's large (> 2) and small (< 1/2) directions the
second half confirms.  Also the ratio of the diagonal from gradients,
``sd(x)/sd(∇)``, to the draws' variance for the model's first parameters (SV: β, φ, σ²).
Writes ``comparisons/results/low_rank_held_out.md``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_peers import ROOT, load  # noqa: E402

import ahmc_stan  # noqa: E402
import ahmc_stan.tuning.hmc_warmup as hmc_warmup  # noqa: E402
from ahmc_stan.metric import LowRankInvMetric  # noqa: E402
from ahmc_stan.tuning.windows import fisher_inv_metric, low_rank_inv_metric  # noqa: E402

CUTOFF = 2.0


def held_out(draws: np.ndarray, grads: np.ndarray) -> dict:
    whole = low_rank_inv_metric(draws, grads, CUTOFF)
    half = len(draws) // 2
    first = low_rank_inv_metric(draws[:half], grads[:half], CUTOFF)
    row = {"draws": len(draws),
           "k": len(whole.vals) if isinstance(whole, LowRankInvMetric) else 0,
           "large": 0, "large_confirmed": 0, "small": 0, "small_confirmed": 0}
    if isinstance(first, LowRankInvMetric):
        scale = np.sqrt(first.diag)
        x = (draws[half:] - draws[half:].mean(axis=0)) / scale @ first.vecs
        g = (grads[half:] - grads[half:].mean(axis=0)) * scale @ first.vecs
        lam = np.sqrt((x ** 2).sum(axis=0) / (g ** 2).sum(axis=0))
        large, small = first.vals > CUTOFF, first.vals < 1 / CUTOFF
        row.update(large=int(large.sum()), large_confirmed=int((large & (lam > CUTOFF)).sum()),
                   small=int(small.sum()),
                   small_confirmed=int((small & (lam < 1 / CUTOFF)).sum()))
    ratio = fisher_inv_metric(draws, grads) / np.var(draws, axis=0, ddof=1)
    row["fisher_over_var_first3"] = np.round(ratio[:3], 2).tolist()
    row["fisher_over_var_median"] = round(float(np.median(ratio)), 2)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="sv,lgcp,gp51,breast_cancer,pima,nhtemp,galton")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "comparisons" / "results" / "low_rank_held_out"))
    args = ap.parse_args(argv)
    estimate = hmc_warmup.low_rank_inv_metric
    lines = ["# The low-rank metric's directions on held-out draws", "",
             f"`python comparisons/low_rank_held_out.py --models {args.models} --seed "
             f"{args.seed} --chains {args.chains}`: AHMC with `metric=\"low_rank\"`, "
             "1000 + 1000, every metric window of every chain (module docstring).", "",
             "| model | dims | chain | window draws | k | large: confirmed | small: confirmed "
             "| sd(x)/sd(∇) ÷ var(x), first 3 | median |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for name in args.models.split(","):
        model = load(name)
        windows = []

        def keep(draws, grads, *a, **k):
            windows.append((draws.copy(), grads.copy()))
            return estimate(draws, grads, *a, **k)

        hmc_warmup.low_rank_inv_metric = keep
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for chain in range(args.chains):
                    windows.clear()
                    ahmc_stan.tune_and_sample(model, "ahmc", chains=1, warmup=1000, draws=1000,
                                              seed=args.seed + 1000 * chain, progress=False,
                                              parallel=False, diagnose=False,
                                              metric="low_rank")
                    for draws, grads in windows:
                        r = held_out(draws, grads)
                        lines.append(
                            f"| {name} | {model.dims} | {chain + 1} | {r['draws']} | {r['k']} | "
                            f"{r['large']}: {r['large_confirmed']} | {r['small']}: "
                            f"{r['small_confirmed']} | {r['fisher_over_var_first3']} | "
                            f"{r['fisher_over_var_median']} |")
                        print(lines[-1], flush=True)
        finally:
            hmc_warmup.low_rank_inv_metric = estimate
    out = Path(args.out).with_suffix(".md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
