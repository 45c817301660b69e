"""Where a ``tune_and_sample`` call's time goes, chain by chain:

    python benchmarks/chain_timeline.py [MODEL] [--seeds 1,2,3,4]

MODEL is one of ``comparisons/nuts_peers.py``'s (default ``nhtemp``).  For each seed, one
call with the defaults (``diagnose=False``, as that benchmark calls it), and one line:

    seed 2 call 44 ms: |exec W1:8-20 P0:6-20 P2:20-28 W3:21-29 end 31| after 13 ms

each run of the chains (``|exec ... end|``, in ms from its start) with each chain's start
and end, in this process (``P``) or a forked worker (``W``), then the call's time after
the last run (the decisions, the Fit).  The first seed's call also pays the first call's
imports; the others show the steady state.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "comparisons"))

import ahmc_stan  # noqa: E402
import nuts_peers  # noqa: E402
from ahmc_stan import sampling  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="nhtemp")
    parser.add_argument("--seeds", default="1,2,3,4")
    args = parser.parse_args()
    model = nuts_peers.load(args.model)
    run_one, execute = sampling._run_one, sampling._execute
    pid = os.getpid()
    events: dict = {}

    def timed_chain(*job, **kw):  # a worker inherits this: it writes to the pipe
        start = time.perf_counter()
        try:
            return run_one(*job, **kw)
        finally:
            os.write(events["pipe"], f"{os.getpid()} {job[2]} {start} "
                                     f"{time.perf_counter()}\n".encode())

    def timed_execute(*a, **kw):
        os.write(events["pipe"], f"exec {time.perf_counter()}\n".encode())
        try:
            return execute(*a, **kw)
        finally:
            os.write(events["pipe"], f"end {time.perf_counter()}\n".encode())

    timed_chain.__qualname__ = "_run_one"
    sampling._run_one, sampling._execute = timed_chain, timed_execute
    warnings.simplefilter("ignore")
    for seed in (int(s) for s in args.seeds.split(",")):
        read, events["pipe"] = os.pipe()
        start = time.perf_counter()
        ahmc_stan.tune_and_sample(model, seed=seed, progress=False, diagnose=False)
        end = time.perf_counter()
        os.close(events["pipe"])
        with os.fdopen(read) as f:
            lines = f.read().split()
        print(f"seed {seed} call {1e3 * (end - start):.0f} ms: {_timeline(lines, pid, end)}")


def _timeline(words: list[str], pid: int, call_end: float) -> str:
    out, i, origin, last = [], 0, 0.0, 0.0
    while i < len(words):
        if words[i] == "exec":
            origin = float(words[i + 1])
            out.append("|exec")
            i += 2
        elif words[i] == "end":
            last = float(words[i + 1])
            out.append(f"end {1e3 * (last - origin):.0f}|")
            i += 2
        else:
            who = "P" if int(words[i]) == pid else "W"
            a, b = (1e3 * (float(w) - origin) for w in words[i + 2:i + 4])
            out.append(f"{who}{words[i + 1]}:{a:.0f}-{b:.0f}")
            i += 4
    return " ".join(out) + f" after {1e3 * (call_end - last):.0f} ms"


if __name__ == "__main__":
    main()
