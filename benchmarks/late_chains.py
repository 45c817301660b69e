"""Calls with and without the late start of waiting chains, side by side, seed by seed:

    python benchmarks/late_chains.py MODEL [--seeds 2-11] [--rounds 2]

MODEL is one of ``comparisons/nuts_peers.py``'s.  In one process (the kept workers forked
once, by a first call at seed 1), each seed's default call
(``tune_and_sample(model, seed=s, progress=False, diagnose=False)``) is made twice in
turn, once with :data:`ahmc_stan.workers.LATE_SECONDS` at its default and once with the
late start off (the chains beyond one a core wait for a core, as before it), the order
alternating from seed to seed.  Prints each way's median call time and the median of the
paired ratios (late start / none) with a 90 % bootstrap interval over the pairs; the
pairing takes out most of a shared machine's drift.  The draws are the same both ways
(checked).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "comparisons")]

import ahmc_stan  # noqa: E402
import nuts_peers  # noqa: E402
from ahmc_stan import workers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--seeds", default="2-11")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    low, high = map(int, args.seeds.split("-"))
    warnings.simplefilter("ignore")
    model = nuts_peers.load(args.model)
    on, off = workers.LATE_SECONDS, 1e9  # (the workers module is not in a Snapshot)
    ahmc_stan.tune_and_sample(model, seed=1, progress=False, diagnose=False)
    seconds: dict[float, list[float]] = {on: [], off: []}
    ratios = []
    for r in range(args.rounds):
        for s in range(low, high + 1):
            draws = {}
            for late in ((on, off) if (s + r) % 2 else (off, on)):
                workers.LATE_SECONDS = late
                start = time.perf_counter()
                fit = ahmc_stan.tune_and_sample(model, seed=s, progress=False,
                                                diagnose=False)
                seconds[late].append(time.perf_counter() - start)
                draws[late] = fit.draws
            workers.LATE_SECONDS = on
            assert np.array_equal(draws[on], draws[off]), f"seed {s}: the draws differ"
            ratios.append(seconds[on][-1] / seconds[off][-1])
    ratio = np.array(ratios)
    boot = np.median(np.random.default_rng(0).choice(ratio, (2000, ratio.size)), axis=1)
    print(f"{args.model}: median call {1e3 * np.median(seconds[off]):.1f} ms without the "
          f"late start, {1e3 * np.median(seconds[on]):.1f} ms with it; paired ratio "
          f"{np.median(ratio):.3f} (90 % bootstrap {np.quantile(boot, 0.05):.3f}-"
          f"{np.quantile(boot, 0.95):.3f}, {ratio.size} pairs); the same draws")


if __name__ == "__main__":
    main()
