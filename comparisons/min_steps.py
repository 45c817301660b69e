"""Why AHMC's default box starts at L = 2: the reward ESJD/√L (Wang, Mohamed & de Freitas
2013) of HMC with ``L_r ~ Uniform{1..L}`` against its min ESS per gradient, on a d-dim
standard Gaussian in an exact leapfrog simulation (no model, no tuner):

    python comparisons/min_steps.py [--dims 3] [--iterations 200000] [--seed 0]

L = 1 is one leapfrog step (MALA).  Prints one row per (ε, L): the mean reward, the
acceptance rate and the min over coordinates of ArviZ's bulk ESS per gradient.
"""

from __future__ import annotations

import argparse

import arviz as az
import numpy as np

GRID = [(1.33, 1), (1.15, 1), (1.0, 2), (1.15, 2), (1.33, 2), (1.0, 3), (0.8, 3)]


def run(rng, dims: int, n: int, eps: float, num_steps: int):
    """``n`` HMC iterations; returns (reward ESJD/√L, acceptance rate, min ESS/grad)."""
    x = rng.standard_normal(dims)
    draws, jumps, grads, accepted = np.empty((n, dims)), 0.0, 0, 0
    for t in range(n):
        steps = rng.integers(1, num_steps + 1)
        p = rng.standard_normal(dims)
        y, q = x.copy(), p.copy()
        for _ in range(steps):  # leapfrog for U(x) = |x|²/2
            q -= 0.5 * eps * y
            y += eps * q
            q -= 0.5 * eps * y
        grads += steps
        if np.log(rng.uniform()) < 0.5 * (x @ x + p @ p - y @ y - q @ q):
            jumps += np.sum((y - x) ** 2)
            x, accepted = y, accepted + 1
        draws[t] = x
    ess = min(float(az.ess(draws[:, i])) for i in range(dims))
    return jumps / n / np.sqrt(num_steps), accepted / n, ess / grads


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
        reward, acc, per_grad = run(rng, args.dims, args.iterations, eps, num_steps)
        print(f"| {eps} | {num_steps} | {reward:.2f} | {acc:.2f} | {per_grad:.3f} |")


if __name__ == "__main__":
    main()
