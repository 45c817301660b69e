"""Bulk, tail and folded ESS per gradient of AHMC's default call, seed by seed: what a
change to the sampler does to the means and to the spread and tails separately.

    python benchmarks/spread_ess.py MODELS [--seeds 1-6] > out.jsonl

MODELS: names from ``comparisons/nuts_peers.py``, comma-separated.  The ``ahmc_stan``
imported is the one first on ``sys.path`` (``PYTHONPATH=/path/to/other/tree`` runs another
version, for an A/B seed for seed; its path is printed).  One JSON line per call: min bulk
ESS, min tail ESS (ArviZ's, of the 5 % and 95 % quantiles) and min folded ESS (the bulk
ESS of |x − median|, which the spread's estimates follow) over the parameters, each per
gradient with warmup included; the call's milliseconds, max R-hat, whether it was
extended, and each chain's final path length ε·L_max.  A sampler whose draws are
antithetic for the means (NUTS on a Gaussian) can gain bulk ESS and lose the others.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1] / "comparisons"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models")
    parser.add_argument("--seeds", default="1-6")
    args = parser.parse_args()
    low, high = map(int, args.seeds.split("-"))
    warnings.simplefilter("ignore")
    import ahmc_stan
    import nuts_peers
    from ahmc_stan import rank_diagnostics as rd

    print(f"ahmc_stan from {Path(ahmc_stan.__file__).parent}", file=sys.stderr)
    for name in args.models.split(","):
        model = nuts_peers.load(name)
        ahmc_stan.tune_and_sample(model, seed=999, progress=False, diagnose=False)  # warm
        for seed in range(low, high + 1):
            start = time.perf_counter()
            fit = ahmc_stan.tune_and_sample(model, seed=seed, progress=False, diagnose=False)
            ms = 1e3 * (time.perf_counter() - start)
            x = fit.params
            d = rd.diagnostics(x, rd.CONVERGENCE_KEYS)
            median = np.median(x.reshape(-1, x.shape[2]), axis=0)
            folded = rd.diagnostics(np.abs(x - median), ("ess_bulk",))["ess_bulk"]
            grads = fit.n_grad_warmup + fit.n_grad_sampling
            path = (np.asarray(fit.sampler_stats["step_size"])[:, -1]
                    * np.asarray(fit.sampler_stats["num_steps_max"])[:, -1])
            print(json.dumps({
                "model": name, "seed": seed, "bulk": float(d["ess_bulk"].min() / grads),
                "tail": float(d["ess_tail"].min() / grads),
                "folded": float(folded.min() / grads), "ms": round(ms),
                "rhat": round(float(np.nanmax(d["r_hat"])), 4),
                "extended": bool(fit.n_draws > 1000),
                "path_length": [round(float(t), 2) for t in path]}), flush=True)


if __name__ == "__main__":
    main()
