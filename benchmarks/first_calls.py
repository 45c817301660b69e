"""A user's first calls in a fresh process, one version of ahmc-stan against another:

    git worktree add /tmp/before COMMIT
    python benchmarks/first_calls.py /tmp/before MODEL [--calls 3] [--rounds 5]

MODEL is one of ``comparisons/nuts_peers.py``'s.  Each round starts, for each version in
turn, a fresh Python process that loads the model (compiled before: the cache is shared)
and makes ``--calls`` calls ``tune_and_sample(model, seed=s, progress=False,
diagnose=False)``, seeds 1, 2, ...: the first forks the kept chain workers, and a later
call that finds something changed since forks them again.  Prints, per version, each
call's wall time (median over the rounds, and the paired ratio now / before of each
round), the times the workers were forked, and a hash of each call's draws, equal call
for call when the change did not touch the draws.  The shared machine's noise moves a
call's time by tens of percent; the versions' calls alternate so that both see it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

_CALLS = """
import hashlib, json, sys, time, warnings
root, name, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [root, root + "/comparisons"]
warnings.simplefilter("ignore")
import ahmc_stan, nuts_peers
from ahmc_stan import workers
assert ahmc_stan.__file__.startswith(root), ahmc_stan.__file__
forks, kept = [0], workers._Kept.__init__
def counted(self, *args, **kwargs):
    forks[0] += 1
    return kept(self, *args, **kwargs)
workers._Kept.__init__ = counted
model = nuts_peers.load(name)
out = {"seconds": [], "forks": [], "draws": []}
for s in range(1, calls + 1):
    start = time.perf_counter()
    fit = ahmc_stan.tune_and_sample(model, seed=s, progress=False, diagnose=False)
    out["seconds"].append(time.perf_counter() - start)
    out["forks"].append(forks[0])
    out["draws"].append(hashlib.sha1(fit.draws.tobytes()).hexdigest()[:8])
print(json.dumps(out))
"""


def run(root: str, model: str, calls: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CALLS, root, model, str(calls)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="a worktree of the version to compare with")
    parser.add_argument("model")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    versions = {"before": str(Path(args.before).resolve()), "now": str(ROOT)}
    runs: dict[str, list[dict]] = {k: [] for k in versions}
    run(versions["now"], args.model, 1)  # the model compiled and cached before timing
    for r in range(args.rounds):
        for name, root in (versions.items() if r % 2 == 0 else reversed(versions.items())):
            runs[name].append(run(root, args.model, args.calls))
    print(f"{args.model}: {args.rounds} rounds, fresh processes, calls with seeds "
          f"1..{args.calls}")
    for name, rs in runs.items():
        ms = np.array([r["seconds"] for r in rs]) * 1e3
        print(f"  {name:6s} ms per call (median over rounds): "
              + ", ".join(f"call {c + 1} {m:.1f}" for c, m in enumerate(np.median(ms, 0)))
              + f"; workers forked after each call: {rs[0]['forks']}; "
              f"draws: {' '.join(rs[0]['draws'])}")
    ratio = (np.array([r["seconds"] for r in runs["now"]])
             / np.array([r["seconds"] for r in runs["before"]]))
    print("  now / before, paired by round: " + "; ".join(
        f"call {c + 1} median {np.median(ratio[:, c]):.2f} "
        f"({', '.join(f'{v:.2f}' for v in ratio[:, c])})" for c in range(args.calls)))
    same = all(a["draws"] == b["draws"] for a, b in zip(runs["now"], runs["before"]))
    print(f"  the same draws call for call in every round: {same}")


if __name__ == "__main__":
    main()
