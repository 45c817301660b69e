"""Where a call's time goes after its chains: the parent process's phases, call by call.

    python benchmarks/call_phases.py MODEL [--seeds 3-8]

MODEL is one of ``comparisons/nuts_peers.py``'s.  After two calls (which fork and then
keep the chain workers), each ``tune_and_sample(model, seed=s, progress=False,
diagnose=False)`` prints the milliseconds since the call began at which each phase began
(``>``) and ended (``<``): the chains (``_execute``, this process's own chains in
``_own_chains``, waiting for the workers' in ``_gather``), the slow-chain rule
(``_slow_rule``), assembling the fit, the metric-rerun check, the extension and its
chains.  The wrappers are set before the first call, so the kept workers see them as
they are and stay kept.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "comparisons")]

import ahmc_stan  # noqa: E402
import nuts_peers  # noqa: E402
from ahmc_stan import sampling, workers  # noqa: E402

PHASES = {sampling: ["_run_chains", "_execute", "_slow_rule", "_assemble", "_nongaussian",
                     "_metric_rerun", "_extend"],
          workers: ["_own_chains", "_gather"]}


def _timed(module, name: str, events: list) -> None:
    inner = getattr(module, name)

    @functools.wraps(inner)
    def phase(*args, **kwargs):
        events.append((name + ">", time.perf_counter()))
        try:
            return inner(*args, **kwargs)
        finally:
            events.append((name + "<", time.perf_counter()))

    setattr(module, name, phase)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="neal100")
    parser.add_argument("--seeds", default="3-8")
    args = parser.parse_args()
    low, high = map(int, args.seeds.split("-"))
    events: list = []
    for module, names in PHASES.items():
        for name in names:
            _timed(module, name, events)
    warnings.simplefilter("ignore")
    model = nuts_peers.load(args.model)
    for seed in (1, 2):
        ahmc_stan.tune_and_sample(model, seed=seed, progress=False, diagnose=False)
    for seed in range(low, high + 1):
        events.clear()
        start = time.perf_counter()
        ahmc_stan.tune_and_sample(model, seed=seed, progress=False, diagnose=False)
        total = time.perf_counter() - start
        print(f"seed {seed} call {1e3 * total:.1f} ms: " + " ".join(
            f"{name}{1e3 * (t - start):.0f}" for name, t in events), flush=True)


if __name__ == "__main__":
    main()
