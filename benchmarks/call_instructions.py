"""One version of ahmc-stan against another, by the instructions a call executes:

    git worktree add /tmp/before COMMIT
    python benchmarks/call_instructions.py /tmp/before MODEL [--calls 3]

MODEL is one of ``comparisons/nuts_peers.py``'s.  For each version, ``valgrind
--tool=callgrind`` counts the instructions of a Python process that loads the model and
makes one ``tune_and_sample(model, seed=3, progress=False, parallel=False,
diagnose=False)`` call, and of one that makes ``1 + calls`` (seeds 3, 4, ...); the
difference over ``calls`` is a call's count, imports and the first call's setup left out
(``PYTHONHASHSEED=0``: the same order of sets and dicts in every process).
The count moves far less than seconds with other work on a shared machine (a few
percent between runs of the same code, from work that depends on timing, such as idle
BLAS threads), so it shows changes that the wall clock's noise hides; run it more than
once.  The four processes run two at a
time, each about fifty times slower than without valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CALLS = """
import sys, warnings
root, n, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path[:0] = [root, root + "/comparisons"]
warnings.simplefilter("ignore")
import ahmc_stan, nuts_peers
assert ahmc_stan.__file__.startswith(root), ahmc_stan.__file__
model = nuts_peers.load(name)
for seed in range(3, 3 + n):
    ahmc_stan.tune_and_sample(model, seed=seed, progress=False, parallel=False,
                              diagnose=False)
"""


def instructions(root: str, n: int, model: str, out: Path) -> int:
    """The instructions callgrind counts in a process that makes ``n`` calls."""
    log = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                          sys.executable, "-c", _CALLS, root, str(n), model],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}).stderr
    return int(re.search(r"Collected : (\d+)", log).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", help="the other version's checkout (a git worktree)")
    parser.add_argument("model")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    versions = {"before": str(Path(args.before).resolve()), "this": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        counts = {(label, n): pool.submit(instructions, root, n, args.model,
                                          Path(tmp) / f"{label}_{n}.out")
                  for label, root in versions.items() for n in (1, 1 + args.calls)}
        per_call = {label: (counts[label, 1 + args.calls].result()
                            - counts[label, 1].result()) / args.calls for label in versions}
    for label, count in per_call.items():
        print(f"{label:6s} {args.model}: {count / 1e6:.1f} million instructions a call")
    print(f"change: {100 * (per_call['this'] / per_call['before'] - 1):+.1f} %")


if __name__ == "__main__":
    main()
