"""Where a call's chain time goes, block by block: every native block of AHMC's chains
(``hmc_adapt_block``: the warmup's scale phase; ``tuned_hmc_block``: the tuning phase and
the sampling), with its seconds, gradients and median step size, per process.

    python benchmarks/block_times.py MODEL [--seed 3] [--slowest 15]

MODEL is a model of ``comparisons/robustness.py`` (``--list`` there) or of
``comparisons/nuts_peers.py``.  One ``tune_and_sample(model, seed=seed, progress=False,
diagnose=False)``; each block's record is written by the process that ran it (the chain
workers are forked after the wrappers are set), then the totals per process and the
slowest blocks are printed, with the milliseconds per gradient: on a model whose
density costs more in some regions than in others (an ODE's stiff parameters), that is
where a chain's time goes and a count of gradients does not show it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "comparisons")]

import ahmc_stan  # noqa: E402
from ahmc_stan import native  # noqa: E402

BLOCKS = ("hmc_adapt_block", "tuned_hmc_block")


def _logged(name: str, folder: str) -> None:
    inner = getattr(native.NativeDensity, name)

    @functools.wraps(inner)
    def block(self, *args, **kwargs):
        start = time.perf_counter()
        lp, out = inner(self, *args, **kwargs)
        record = {"kind": name, "end": time.time(), "seconds": time.perf_counter() - start,
                  "iterations": int(len(out["n_steps"])), "grads": int(np.sum(out["n_steps"])),
                  "step_size": float(np.median(out["step_size"])) if len(out["step_size"])
                  else None}
        with open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")
        return lp, out

    setattr(native.NativeDensity, name, block)


def load(name: str):
    import robustness

    registry = robustness.load_registry()
    if name in registry.BY_NAME:
        entry = registry.BY_NAME[name]
        return robustness.build_model(entry, entry.data(), cmdstan_fallback=False)
    import nuts_peers

    return nuts_peers.load(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slowest", type=int, default=15)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="block_times_")
    for name in BLOCKS:
        _logged(name, folder)
    model = load(args.model)
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    fit = ahmc_stan.tune_and_sample(model, seed=args.seed, progress=False, diagnose=False)
    print(f"{args.model}, seed {args.seed}: {time.perf_counter() - start:.1f} s, "
          f"{fit.n_grad_warmup + fit.n_grad_sampling} gradients in the fit "
          f"(runs discarded by its decisions are charged to its warmup)")
    records = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            row["process"] = path.stem
        records += rows
        seconds, grads = sum(r["seconds"] for r in rows), sum(r["grads"] for r in rows)
        print(f"  process {path.stem}: {len(rows)} blocks, {seconds:.1f} s, {grads} gradients, "
              f"{1e3 * seconds / max(grads, 1):.3f} ms a gradient")
    first = min(r["end"] - r["seconds"] for r in records)
    print(f"the {args.slowest} slowest blocks (s from the first block's start):")
    for r in sorted(records, key=lambda r: -r["seconds"])[:args.slowest]:
        eps = "" if r["step_size"] is None else f"{r['step_size']:.3g}"
        print(f"  {r['end'] - first:7.1f} s  process {r['process']}  {r['kind']:<16} "
              f"{r['iterations']:4d} iterations  {r['grads']:6d} gradients  "
              f"{r['seconds']:7.2f} s  {1e3 * r['seconds'] / max(r['grads'], 1):8.2f} ms a "
              f"gradient  step size {eps}")


if __name__ == "__main__":
    main()
