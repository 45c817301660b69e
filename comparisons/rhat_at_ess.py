"""What R-hat ≤ 1.01 asks of a model with many parameters: the largest R-hat that chains
which are exactly stationary reach at a given folded ESS, against AHMC's runs.

    python comparisons/rhat_at_ess.py [--model lgcp] [--draws 1000,2000] [--seeds 1,2,3]
                                      [--reps 4]

The R-hat that ArviZ reports (Vehtari et al. 2021) is the larger of the rank-normalised
split R-hat of the draws and of their distances from the median (the "folded" draws).
Its sampling spread shrinks with the ESS of each, and the fit reports the maximum over
every quantity.  Part 1 simulates chains that are stationary by construction and whose
folded draws mix slowly while their bulk mixes fast (as HMC's scale does in high
dimensions): ``x = exp(0.35·a)·ε``, ``a`` an AR(1) of coefficient ρ per quantity, ε
white noise; 4 chains, as many quantities and draws as the model's run.  Part 2 runs AHMC
(the default sampler, 4 chains, 1000 warmup) at each number of draws and reports its
largest R-hat, its median folded ESS, its min bulk ESS and its gradients, warmup
included.  Writes ``comparisons/results/rhat_at_ess.md``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "comparisons"))

import numpy as np  # noqa: E402

RESULTS = ROOT / "comparisons" / "results"


def _ess_rhat(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Folded ESS, bulk ESS and R-hat of each quantity of ``x`` (chain, draw, quantity)."""
    import arviz as az

    ds = az.convert_to_dataset({"x": x})
    return (az.ess(ds, method="folded")["x"].values, az.ess(ds, method="bulk")["x"].values,
            az.rhat(ds)["x"].values)


def stationary(n_quantities: int, draws: int, rho: float, rng) -> np.ndarray:
    """4 stationary chains (chain, draw, quantity) with a slowly mixing scale."""
    a = np.empty((4, n_quantities, draws))
    e = rng.normal(size=a.shape)
    a[..., 0] = e[..., 0]
    for t in range(1, draws):
        a[..., t] = rho * a[..., t - 1] + np.sqrt(1 - rho**2) * e[..., t]
    return (np.exp(0.35 * a) * rng.normal(size=a.shape)).transpose(0, 2, 1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="lgcp")
    ap.add_argument("--draws", default="1000,2000")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--out", default=str(RESULTS / "rhat_at_ess.md"))
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    import ahmc_stan
    from nuts_peers import load

    model = load(args.model)
    runs = []
    n_quantities = None
    for draws in (int(d) for d in args.draws.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            fit = ahmc_stan.tune_and_sample(model, chains=4, warmup=1000, draws=draws,
                                            seed=seed, progress=False, diagnose=False)
            folded, bulk, rhat = _ess_rhat(fit.draws)
            n_quantities = len(rhat)
            e = fit.efficiency()
            runs.append((draws, seed, rhat.max(), int((rhat > 1.01).sum()), np.median(folded),
                         bulk.min(), e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]))
            print(args.model, *runs[-1], flush=True)
    rng = np.random.default_rng(0)
    sims = []
    for draws in sorted({r[0] for r in runs}):
        for rho in (0.9, 0.95):
            for _ in range(args.reps):
                folded, bulk, rhat = _ess_rhat(stationary(n_quantities, draws, rho, rng))
                sims.append((draws, rho, np.median(folded), np.median(bulk), rhat.max(),
                             int((rhat > 1.01).sum())))
                print("stationary", *sims[-1], flush=True)
    lines = [f"# The largest R-hat at a given folded ESS: {args.model}\n",
             f"`python comparisons/rhat_at_ess.py --model {args.model} --draws {args.draws} "
             f"--seeds {args.seeds} --reps {args.reps}` (the script's docstring); "
             f"{n_quantities} quantities, 4 chains.\n",
             "## AHMC (default sampler, 1000 warmup)\n",
             "| draws | seed | largest R-hat | quantities > 1.01 | median folded ESS | "
             "min bulk ESS | gradients |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {d} | {s} | {r:.4f} | {n} | {f:.0f} | {b:.0f} | {g:.0f} |"
              for d, s, r, n, f, b, g in runs]
    lines += ["", "## Stationary chains with a slowly mixing scale\n",
              "| draws | ρ | median folded ESS | median bulk ESS | largest R-hat | "
              "quantities > 1.01 |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {d} | {rho} | {f:.0f} | {b:.0f} | {r:.4f} | {n} |"
              for d, rho, f, b, r, n in sims]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
