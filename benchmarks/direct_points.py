"""How much work the GP bandit's DIRECT does per move (seed 001, Algorithm 3), one command:

    python benchmarks/direct_points.py [--models std10,neal100] [--seeds 1,2,3]

Runs one bandit chain (1000 + 1000) per model and seed on the Python reference path
(``native=False``: scipy's DIRECT, the same algorithm as the C++ one) and counts, at each
move, the points DIRECT evaluates and the distinct points after the integer L is rounded
(each a GP prediction: the C++ tuner predicts each such point once per move).  With the
chain's gradients and CmdStan NUTS's cost per leapfrog step from
``benchmarks/bench_samplers.py``, these counts bound the cost of a move from below.
Writes ``benchmarks/results/direct_points.md``.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

import ahmc_stan  # noqa: E402
import ahmc_stan.tuning.bayesopt as bayesopt  # noqa: E402
from bench_samplers import load  # noqa: E402


def count_moves(model, seed: int) -> dict:
    """One bandit chain with DIRECT's evaluations counted per move."""
    moves = []
    maximize = bayesopt.maximize_direct

    def counted(acq, box, maxfun=2000, **kwargs):
        point, seen, calls = acq.point, set(), [0]

        def one(u):
            calls[0] += 1
            seen.add(tuple(u.tolist()))
            return point(u)

        out = maximize(SimpleNamespace(point=one), box, maxfun=maxfun, **kwargs)
        moves.append((calls[0], len(seen)))
        return out

    bayesopt.maximize_direct = counted
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = ahmc_stan.tune_and_sample(model, "bandit", chains=1, warmup=1000, draws=1000,
                                            seed=seed, parallel=False, native=False,
                                            progress=False, diagnose=False)
    finally:
        bayesopt.maximize_direct = maximize
    m = np.array(moves, dtype=float)
    e = fit.efficiency()
    return {"moves": len(m), "points": float(np.median(m[:, 0])),
            "distinct": float(np.median(m[:, 1])), "distinct_range": (m[:, 1].min(), m[:, 1].max()),
            "gradients": e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="std10,neal100")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "direct_points"))
    args = ap.parse_args(argv)
    lines = ["# The bandit's DIRECT: points per move\n",
             f"`python benchmarks/direct_points.py --models {args.models} --seeds {args.seeds}` "
             "(one chain of 1000 + 1000 per model and seed, scipy's DIRECT with maxfun 2000).\n",
             "| model | seed | moves | DIRECT points per move (median) | distinct (L rounded), "
             "median | range | gradients in the chain |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in args.models.split(","):
        model = load(name)
        for seed in (int(s) for s in args.seeds.split(",")):
            r = count_moves(model, seed)
            lo, hi = r["distinct_range"]
            lines.append(f"| {name} | {seed} | {r['moves']} | {r['points']:.0f} | "
                         f"{r['distinct']:.0f} | {lo:.0f}–{hi:.0f} | {r['gradients']:.0f} |")
            print(lines[-1], flush=True)
    out = Path(args.out).with_suffix(".md")
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
