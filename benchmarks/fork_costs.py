"""What running a call's chains in forked processes costs, apart from the chains:

    python benchmarks/fork_costs.py [MODEL] [--repeats 7]

MODEL is one of ``comparisons/nuts_peers.py``'s (default ``nhtemp``).  After two calls,
so that this process holds what a user's holds (the model, numpy, SciPy, the sampler's
modules and the benchmark's imports), each of these is measured side by side in this
process, medians over the repeats:

- **fork**: the time this process spends in ``os.fork()``;
- **exit**: a forked child that does nothing, from its ``os._exit`` until it is reaped
  (the kernel frees its copy of the page tables), and the system time it takes;
- **first chain**: one chain (AHMC's defaults, one chain) in a child forked just before,
  then the same chain again in that child: the first run pays the copy-on-write faults of
  its first writes to pages it shares with this process, the second does not;
- **diagnostics after a fork**: the rank diagnostics of the model's draws
  (:func:`ahmc_stan.rank_diagnostics.diagnostics`, as the decisions after a run compute
  them) in this process right after forking a child that exits at once, against the
  same with no fork: this process's first writes fault too, and the child's exit takes
  a core.

``benchmarks/chain_timeline.py`` shows where these land in a call.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "comparisons"))

import ahmc_stan  # noqa: E402
import nuts_peers  # noqa: E402
from ahmc_stan import rank_diagnostics  # noqa: E402


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _anon_mb() -> float:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["RssAnon"].split()[0]) / 1024


def _in_child(task) -> dict:
    """``task()`` in a child forked now, its result (a dict) sent back as JSON."""
    read, write = os.pipe()
    gc.freeze()  # as sampling._execute forks
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.write(write, json.dumps(task()).encode())
        finally:
            os._exit(0)
    gc.unfreeze()
    os.close(write)
    with os.fdopen(read) as f:
        out = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="nhtemp")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    model = nuts_peers.load(args.model)
    fit = None
    for seed in (1, 2):
        fit = ahmc_stan.tune_and_sample(model, seed=seed, progress=False, diagnose=False)
    draws = np.asarray(fit.params)
    rows: dict[str, list] = {}

    def add(key, value):
        rows.setdefault(key, []).append(value)

    def one_chain(seed: int) -> tuple[float, int]:
        start, faults = time.perf_counter(), _faults()
        ahmc_stan.tune_and_sample(model, chains=1, parallel=False, seed=seed, progress=False,
                                  diagnose=False, metric_rerun=False, extend=False,
                                  chain_rerun=False)
        return 1e3 * (time.perf_counter() - start), _faults() - faults

    def diagnose() -> tuple[float, int]:
        start, faults = time.perf_counter(), _faults()
        rank_diagnostics.diagnostics(draws, rank_diagnostics.CONVERGENCE_KEYS)
        return 1e3 * (time.perf_counter() - start), _faults() - faults

    for r in range(args.repeats):
        gc.freeze()
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        add("fork_ms", 1e3 * (time.perf_counter() - start))
        gc.unfreeze()
        os.waitpid(pid, 0)

        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            os.write(write, repr(time.perf_counter()).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            exited = float(f.read())
        _, _, usage = os.wait4(pid, 0)
        add("exit_ms", 1e3 * (time.perf_counter() - exited))
        add("exit_sys_ms", 1e3 * usage.ru_stime)

        chains = _in_child(lambda: dict(zip(("first_ms", "first_faults", "again_ms",
                                            "again_faults"),
                                           (*one_chain(10 + r), *one_chain(10 + r)))))
        for key, value in chains.items():
            add(key, value)

        diagnose()  # warm
        ms, faults = diagnose()
        add("diagnostics_ms", ms)
        add("diagnostics_faults", faults)
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        gc.unfreeze()
        ms, faults = diagnose()
        os.waitpid(pid, 0)
        add("diagnostics_after_fork_ms", ms)
        add("diagnostics_after_fork_faults", faults)

    med = {k: float(np.median(v)) for k, v in rows.items()}
    print(f"{args.model}: this process {_anon_mb():.0f} MB of anonymous memory; "
          f"medians of {args.repeats}")
    print(f"  fork                       {med['fork_ms']:6.2f} ms")
    print(f"  a child's exit             {med['exit_ms']:6.2f} ms "
          f"({med['exit_sys_ms']:.1f} ms system time)")
    print(f"  one chain, first in a fork {med['first_ms']:6.2f} ms "
          f"({med['first_faults']:.0f} page faults); again {med['again_ms']:.2f} ms "
          f"({med['again_faults']:.0f})")
    print(f"  diagnostics {draws.shape}  {med['diagnostics_ms']:6.2f} ms "
          f"({med['diagnostics_faults']:.0f} page faults); right after a fork "
          f"{med['diagnostics_after_fork_ms']:.2f} ms "
          f"({med['diagnostics_after_fork_faults']:.0f})")


if __name__ == "__main__":
    main()
