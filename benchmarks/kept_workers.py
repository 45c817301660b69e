"""Calls with chain workers kept from call to call against workers forked for each call,
side by side:

    python benchmarks/kept_workers.py MODEL [--seeds 2-11] [--rounds 2]

MODEL is one of ``comparisons/nuts_peers.py``'s.  Each round runs, in a fresh Python
process per setting (``ahmc_stan.workers.KEEP`` False, then True), one call to warm up
(seed 1), then one ``tune_and_sample(model, seed=s, progress=False, diagnose=False)`` per
seed, back to back (``ab_calls.py``'s calls).  Prints each setting's median call time and a hash of each seed's
draws, which must be equal for the two settings.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_calls import ROOT, rounds  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--seeds", default="2-11")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rounds([("forked", [str(ROOT), "False"]), ("kept", [str(ROOT), "True"])],
           args.model, args.seeds, args.rounds)


if __name__ == "__main__":
    main()
