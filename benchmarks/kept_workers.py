"""Calls with chain workers kept from call to call against workers forked for each call,
side by side:

    python benchmarks/kept_workers.py MODEL [--seeds 2-11] [--rounds 2]

MODEL is one of ``comparisons/nuts_peers.py``'s.  Each round runs, in a fresh Python
process per setting (``ahmc_stan.workers.KEEP`` False, then True), one call to warm up
(seed 1), then one ``tune_and_sample(model, seed=s, progress=False, diagnose=False)`` per
seed, back to back.  Prints each setting's median call time and a hash of each seed's
draws, which must be equal for the two settings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_calls import ROOT, rounds  # noqa: E402

_CALLS = """
import hashlib, sys, time, warnings
root, keep, name, seeds = sys.argv[1], sys.argv[2] == "True", sys.argv[3], sys.argv[4]
sys.path[:0] = [root, root + "/comparisons"]
import numpy as np, ahmc_stan, nuts_peers
from ahmc_stan import workers
workers.KEEP = keep
warnings.simplefilter("ignore")
model = nuts_peers.load(name)
ahmc_stan.tune_and_sample(model, seed=1, progress=False, diagnose=False)
seconds, draws = [], []
for s in map(int, seeds.split(",")):
    start = time.perf_counter()
    fit = ahmc_stan.tune_and_sample(model, seed=s, progress=False, diagnose=False)
    seconds.append(time.perf_counter() - start)
    draws.append(hashlib.sha1(fit.draws.tobytes()).hexdigest()[:8])
print(f"median call {1e3 * np.median(seconds):.1f} ms; draws by seed: {' '.join(draws)}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--seeds", default="2-11")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rounds(_CALLS, [("forked", [str(ROOT), "False"]), ("kept", [str(ROOT), "True"])],
           args.model, args.seeds, args.rounds)


if __name__ == "__main__":
    main()
