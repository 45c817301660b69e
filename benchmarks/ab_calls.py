"""One version of ahmc-stan against another, by the seconds a call takes, side by side:

    git worktree add /tmp/before COMMIT
    python benchmarks/ab_calls.py /tmp/before MODEL [--seeds 2-11] [--rounds 2] [--cpu]
        [--diagnose]

MODEL is one of ``comparisons/nuts_peers.py``'s.  Each round runs, in a fresh Python
process per version, the versions taking turns: one call to warm up (seed 1), then one
``tune_and_sample(model, seed=s, progress=False, diagnose=False)`` per seed, back to
back.  Prints each version's median call time per round and a hash of each seed's draws,
which are equal seed for seed when the change did not touch the draws.  With ``--cpu``
the chains run one after another in the calling process (``parallel=False``) and the time is
that process's CPU time, which other work on a shared machine disturbs less than the
wall time; with ``--diagnose`` the calls are made as a user makes them, with the diagnosis
and its warning (``diagnose=True``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CALLS = """
import hashlib, sys, time, warnings
root, keep, name, seeds = sys.argv[1], sys.argv[2] == "True", sys.argv[3], sys.argv[4]
cpu, diagnose = sys.argv[5] == "True", sys.argv[6] == "True"
clock, options = (time.process_time, {"parallel": False}) if cpu else (time.perf_counter, {})
options["diagnose"] = diagnose
sys.path[:0] = [root, root + "/comparisons"]
import numpy as np, ahmc_stan, nuts_peers
assert ahmc_stan.__file__.startswith(root), ahmc_stan.__file__
if not keep:  # chain workers forked for every call (a version before stop 68 always does)
    from ahmc_stan import workers
    workers.KEEP = False
warnings.simplefilter("ignore")
model = nuts_peers.load(name)
ahmc_stan.tune_and_sample(model, seed=1, progress=False, **options)
seconds, draws = [], []
for s in map(int, seeds.split(",")):
    start = clock()
    fit = ahmc_stan.tune_and_sample(model, seed=s, progress=False, **options)
    seconds.append(clock() - start)
    draws.append(hashlib.sha1(fit.draws.tobytes()).hexdigest()[:8])
unit = "ms CPU" if cpu else "ms"
print(f"median call {1e3 * np.median(seconds):.1f} {unit}; draws by seed: {' '.join(draws)}")
"""


def _seeds(text: str) -> str:
    if "-" in text and "," not in text:
        low, high = map(int, text.split("-"))
        return ",".join(map(str, range(low, high + 1)))
    return text


def rounds(versions: list[tuple[str, list[str]]], model: str, seeds: str,
           n_rounds: int, cpu: bool = False, diagnose: bool = False) -> None:
    """Run the calls (:data:`_CALLS`, ``python -c``) with each version's arguments (its
    checkout, and whether to keep the chain workers), then ``model``, the seeds and
    whether to count CPU time and to diagnose, in a
    fresh process per version and round, the versions taking turns; print each one's
    output line."""
    for r in range(n_rounds):
        for label, argv in versions:
            out = subprocess.run([sys.executable, "-c", _CALLS, *argv, model, _seeds(seeds),
                                  str(cpu), str(diagnose)],
                                 capture_output=True, text=True, check=True).stdout.strip()
            print(f"round {r + 1} {label:6s} {model}: {out}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", help="the other version's checkout (a git worktree)")
    parser.add_argument("model")
    parser.add_argument("--seeds", default="2-11")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpu", action="store_true",
                        help="chains one after another, timed by the process's CPU time")
    parser.add_argument("--diagnose", action="store_true",
                        help="calls with the diagnosis and its warning, as a user's")
    args = parser.parse_args()
    rounds([("before", [str(Path(args.before).resolve()), "True"]),
            ("this", [str(ROOT), "True"])],
           args.model, args.seeds, args.rounds, args.cpu, args.diagnose)


if __name__ == "__main__":
    main()
