"""How well could any (ε, L) do on Neal's 100-d Gaussian?  An upper bound for AHMC there.

HMC at fixed (ε, L) with ``L_r ~ U{1..L}`` (AHMC's kernel, ``ahmc_stan.hmc.HMCKernel``, on
the compiled model), in the inverse metric AHMC's scale phase ends with on this model
(the draws' and gradients' exact ratio σ², with Stan's regularisation:
(n σ² + 10⁻³·5) / (n + 5), n = 200), started at stationarity, on a grid of (ε, L): 4
chains × ``--draws`` draws, ``--seeds`` seeds.  For the best (ε, L) by median min bulk
ESS per gradient (ArviZ) the bound counts a warmup of ``--warmup`` iterations at the
same cost per iteration, and sets it beside nutpie's min ESS per gradient (warmup
included, its own 400 iterations) from ``--nutpie-json`` (a ``nuts_peers.py`` result).

    python comparisons/neal_oracle.py [--seeds 1,2,3] [--warmup 1000] [--draws 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import arviz as az
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_peers import load  # noqa: E402

from ahmc_stan.hmc import HMCKernel, HMCParameters  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NUTPIE_JSON = ROOT / "comparisons" / "results" / "nuts_peers_own_warmup_o1.json"


def scale_phase_metric(sigma: np.ndarray, n: int = 200) -> np.ndarray:
    """Stan's regularised variance estimate of exact variances σ² from a window of n."""
    return (n * sigma ** 2 + 1e-3 * 5) / (n + 5)


def run(kernel, inv_metric, sigma, eps, num_steps, seed, chains, draws):
    """Min bulk ESS and gradients of ``chains`` chains of fixed-(ε, L) HMC."""
    rng = np.random.default_rng(seed)
    positions, grads = [], 0
    for _ in range(chains):
        state = kernel.init(rng.standard_normal(len(sigma)) * sigma)
        _, info = kernel.run(rng, state, HMCParameters(eps, num_steps, inv_metric), draws)
        positions.append(info.positions)
        grads += int(info.num_grad.sum())
    ess = az.ess(az.convert_to_dataset({"x": np.stack(positions)}))["x"].values
    return float(ess.min()), grads


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--nutpie-json", default=str(NUTPIE_JSON))
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]

    model = load("neal100")
    sigma = np.asarray(model.data["sigma"], dtype=float)
    inv_metric = scale_phase_metric(sigma)
    kernel = HMCKernel(model.density)
    rows = []
    for eps in np.round(np.arange(0.40, 1.001, 0.05), 2):
        for num_steps in range(2, 11):
            runs = [run(kernel, inv_metric, sigma, float(eps), num_steps, s, args.chains,
                        args.draws) for s in seeds]
            per_grad = [e / g for e, g in runs]
            steps = np.mean([g for _, g in runs]) / (args.chains * args.draws)
            rows.append((float(np.median(per_grad)), float(eps), num_steps,
                         min(per_grad), max(per_grad), steps))
    rows.sort(reverse=True)
    print(f"Fixed-(ε, L) HMC on Neal's 100-d Gaussian, {args.chains} chains × {args.draws} "
          f"draws, seeds {args.seeds}; the best six (ε, L) by median min bulk ESS per "
          "gradient (sampling only):\n")
    print("| ε | L | median | min–max over seeds | gradients per iteration |")
    print("|---:|---:|---:|---|---:|")
    for med, eps, num_steps, lo, hi, steps in rows[:6]:
        print(f"| {eps:.2f} | {num_steps} | {med:.3f} | {lo:.3f}–{hi:.3f} | {steps:.2f} |")
    best = rows[0][0]
    bound = best * args.draws / (args.draws + args.warmup)
    print(f"\nWith {args.warmup} warmup iterations at the best's cost per iteration: "
          f"{bound:.3f} min ESS per gradient, warmup included.")
    nutpie = json.loads(Path(args.nutpie_json).read_text())["models"]["neal100"]
    per_grad = [r["per_grad"] for r in nutpie["runs"]["nutpie"]]
    print(f"nutpie (its own warmup), {Path(args.nutpie_json).name}: median "
          f"{np.median(per_grad):.3f} ({min(per_grad):.3f}–{max(per_grad):.3f}); "
          f"the bound over it: {bound / np.median(per_grad):.2f}×.")


if __name__ == "__main__":
    main()
