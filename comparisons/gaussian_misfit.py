"""The Gaussian misfit of AHMC's first fits (``ahmc_stan.tuning.windows.gaussian_misfit``):
each model run with the default metric and no metric rerun, the misfit of all its draws
(unconstrained) and the log density's gradients there, next to the run's problems.

    python comparisons/gaussian_misfit.py --models zinb_regression,pima [--seeds 1,2,3]
        [--out comparisons/results/gaussian_misfit_table.md]

Models are those of ``nuts_peers.py`` (the paper's suite and the robustness suite).  A fit
whose chains ended without a low-rank correction (the ``"auto"`` metric's diagonal on many
parameters) is listed with its metric; the rule of ``tune_and_sample`` applies to it only
when some chain ended low-rank (README, "A rule for skewed tails")."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_peers import load  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.tuning.windows import gaussian_misfit  # noqa: E402


def misfit_of(fit, model) -> float:
    """The misfit of every draw of ``fit`` (all chains pooled, unconstrained)."""
    x = np.array([model.unconstrain(p) for p in fit.params.reshape(-1, fit.params.shape[2])])
    g = np.array([model.log_density_gradient(u)[1] for u in x])
    return gaussian_misfit(x, g)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    lines = ["| model | seed | parameters | metric | Gaussian misfit | problems |",
             "|---|---:|---:|---|---:|---|"]
    for name in args.models.split(","):
        model = load(name)
        for seed in (int(s) for s in args.seeds.split(",")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = ahmc_stan.tune_and_sample(model, "ahmc", seed=seed, progress=False,
                                                diagnose=False, metric_rerun=False)
            low_rank = any(isinstance(c.get("inv_metric"), Mapping)
                           for c in fit.metadata["chains"])
            problems = "; ".join(p.short for p in fit.diagnose().problems) or "none"
            lines.append(f"| {name} | {seed} | {model.dims} | "
                         f"{'low-rank' if low_rank else 'diagonal'} | "
                         f"{misfit_of(fit, model):.3g} | {problems} |")
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
