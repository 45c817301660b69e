"""Where a chain's time goes: warmup against sampling, per gradient, and the parts of warmup.

    python benchmarks/chain_phases.py MODEL [--seeds 3-12]

MODEL is one of ``comparisons/nuts_peers.py``'s.  Each ``tune_and_sample(model, seed=s,
progress=False, diagnose=False, parallel=1, extend=False)`` runs its chains one after
another in this process, so that every part is timed where it runs.  Prints, per call
(medians over the seeds), the chain-seconds and gradients of warmup and of sampling and
their microseconds per gradient, then the milliseconds spent in the warmup's metric
estimates (``low_rank_inv_metric``, ``fisher_inv_metric``), in the native blocks
(``hmc_adapt_block``: the scale phase; ``tuned_hmc_block``: the tuning phase and the
sampling), in the stuck-chain checks and in the tuning phase's tail checks.  The
wrappers add about a microsecond a call.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "comparisons")]

import ahmc_stan  # noqa: E402
import nuts_peers  # noqa: E402
from ahmc_stan import native  # noqa: E402
from ahmc_stan.samplers import ahmc  # noqa: E402
from ahmc_stan.tuning import hmc_warmup  # noqa: E402

PARTS = [(hmc_warmup, "low_rank_inv_metric"), (hmc_warmup, "fisher_inv_metric"),
         (hmc_warmup, "check_stuck"), (ahmc, "tail_rejections"),
         (native.NativeDensity, "hmc_adapt_block"), (native.NativeDensity, "tuned_hmc_block")]


def _timed(owner, name: str, spent: dict) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def part(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start

    setattr(owner, name, part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="neal100")
    parser.add_argument("--seeds", default="3-12")
    args = parser.parse_args()
    low, high = map(int, args.seeds.split("-"))
    spent: dict = collections.defaultdict(float)
    for owner, name in PARTS:
        _timed(owner, name, spent)
    warnings.simplefilter("ignore")
    model = nuts_peers.load(args.model)
    kwargs = dict(progress=False, diagnose=False, parallel=1, extend=False)
    ahmc_stan.tune_and_sample(model, seed=1, **kwargs)  # the first call's one-off costs
    rows = []
    for seed in range(low, high + 1):
        spent.clear()
        fit = ahmc_stan.tune_and_sample(model, seed=seed, **kwargs)
        rows.append({"warmup ms": 1e3 * fit.time_warmup, "warmup grads": fit.n_grad_warmup,
                     "sampling ms": 1e3 * fit.time_sampling,
                     "sampling grads": fit.n_grad_sampling,
                     **{f"{name} ms": 1e3 * spent[name] for _, name in PARTS}})
    med = {key: float(np.median([r[key] for r in rows])) for key in rows[0]}
    print(f"{args.model}, {len(rows)} calls of {fit.chains} chains, medians per call:")
    for phase in ("warmup", "sampling"):
        print(f"  {phase}: {med[phase + ' ms']:.1f} chain-ms for {med[phase + ' grads']:.0f} "
              f"gradients, {1e3 * med[phase + ' ms'] / med[phase + ' grads']:.2f} µs a gradient")
    for _, name in PARTS:
        print(f"  {name}: {med[name + ' ms']:.1f} ms")


if __name__ == "__main__":
    main()
