"""Why AHMC's default box starts at L = 2: the reward ESJD/√L (Wang, Mohamed & de Freitas
2013) of HMC with ``L_r ~ Uniform{1..L}`` against its min ESS per gradient, on a d-dim
standard Gaussian in an exact leapfrog simulation (no model, no tuner):

    python comparisons/min_steps.py [--dims 3] [--iterations 200000] [--seed 0]

L = 1 is one leapfrog step (MALA).  Prints one row per (ε, L): the mean reward, the
acceptance rate and the min over coordinates of ArviZ's bulk ESS per gradient.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from path_length_spread import run  # noqa: E402  (the exact leapfrog simulation)

GRID = [(1.33, 1), (1.15, 1), (1.0, 2), (1.15, 2), (1.33, 2), (1.0, 3), (0.8, 3)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"{args.dims}-d standard Gaussian, {args.iterations} iterations per row\n")
    print("| ε | L | reward ESJD/√L | acceptance | min ESS per gradient |")
    print("|---:|---:|---:|---:|---:|")
    for eps, num_steps in GRID:
        reward, acc, per_grad, _ = run(rng, np.ones(args.dims), eps, num_steps,
                                       args.iterations)
        print(f"| {eps} | {num_steps} | {reward:.2f} | {acc:.2f} | {per_grad:.3f} |")


if __name__ == "__main__":
    main()
