"""What the walk from a random start to the typical set costs AHMC's warmup, bounded:

    python benchmarks/init_transient.py MODEL [--seeds 1-8]

MODEL is one of ``comparisons/nuts_peers.py``'s.  Each seed's default call
(``tune_and_sample(model, seed=s, progress=False, diagnose=False)``, Stan's random
inits) is run again started at the posterior mean of a reference fit (seed 99), a start no
sampler has, so the difference bounds what any better start could save.  Prints, for
both starts, the median over the seeds of the warmup's share of the gradients and of the
min bulk ESS per gradient (warmup included).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "comparisons")]

import ahmc_stan  # noqa: E402
import nuts_peers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--seeds", default="1-8")
    args = parser.parse_args()
    low, high = map(int, args.seeds.split("-"))
    warnings.simplefilter("ignore")
    model = nuts_peers.load(args.model)
    ref = ahmc_stan.tune_and_sample(model, seed=99, progress=False, diagnose=False)
    mean = dict(zip(ref.columns[:ref.n_params], ref.params.mean(axis=(0, 1)).tolist()))
    for label, start in (("random inits", {}), ("the posterior mean", {"init": mean})):
        shares, per_grad = [], []
        for seed in range(low, high + 1):
            fit = ahmc_stan.tune_and_sample(model, seed=seed, progress=False,
                                            diagnose=False, **start)
            e = fit.efficiency()  # as comparisons/nuts_peers.py reports them
            shares.append(e["n_grad_equiv_warmup"]
                          / (e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]))
            per_grad.append(e["min_ess_per_grad_total"])
        print(f"{args.model}, from {label}: warmup share {np.median(shares):.2f}, min bulk "
              f"ESS per gradient {np.median(per_grad):.4f} (medians of seeds {args.seeds})",
              flush=True)


if __name__ == "__main__":
    main()
