"""The best ESS per gradient HMC can reach on Neal's 100-d Gaussian, by how it draws L_r.

    python benchmarks/jitter_ceiling.py [--draws 2000] [--out FILE.md]

AHMC draws each iteration's number of leapfrog steps ``L_r ~ Uniform{1..L}`` (Wang,
Mohamed & de Freitas 2013, section 2).  On a Gaussian whose metric is exact (the
draws-and-gradients metric is exact on Neal's target, ``tuning/fast_warmup.py``), every
coordinate is then a standard normal that each leapfrog step rotates by the same angle,
and the best (ε, L) is a matter of that rotation alone.  This script runs plain HMC in
numpy on the 100-d standard normal, 4 chains of ``--draws`` from the stationary
distribution, over a grid of ε and L for three ways of drawing L_r: AHMC's
``Uniform{1..L}``, ``Uniform{ceil(L/2)..L}`` and a fixed ``L``.  For each it reports the
(ε, L) with the largest min bulk ESS per gradient, and at it the min tail ESS and the
min bulk ESS of x² per gradient (ArviZ's estimators), and the (ε, L) AHMC's reward,
ESJD / sqrt(L), prefers; and the (ε, L) with the largest min bulk ESS per draw, which
bounds the ESS a call of a fixed number of draws can return whatever its gradients cost.
Gradients count the sampling iterations only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import arviz as az
import numpy as np

DIMS, CHAINS = 100, 4
STEPS = (0.25, 0.35, 0.45, 0.55, 0.65, 0.75)
LENGTHS = range(2, 21)
WINDOWS = {"Uniform{1..L} (AHMC)": lambda L: 1,
           "Uniform{ceil(L/2)..L}": lambda L: (L + 1) // 2,
           "fixed L": lambda L: L}


def run(eps: float, length: int, lowest, draws: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((CHAINS, DIMS))
    out = np.empty((CHAINS, draws, DIMS))
    grads = jump = 0.0
    for i in range(draws):
        p = rng.standard_normal((CHAINS, DIMS))
        steps = int(rng.integers(lowest(length), length + 1))
        h0 = 0.5 * (x * x).sum(1) + 0.5 * (p * p).sum(1)
        q, r = x.copy(), p - 0.5 * eps * x
        for j in range(steps):
            q = q + eps * r
            if j < steps - 1:
                r = r - eps * q
        r = r - 0.5 * eps * q
        h1 = 0.5 * (q * q).sum(1) + 0.5 * (r * r).sum(1)
        accept = np.log(rng.random(CHAINS)) < h0 - h1
        moved = np.where(accept[:, None], q, x)
        jump += ((moved - x) ** 2).sum()
        x = out[:, i] = moved
        grads += steps * CHAINS
    data = az.convert_to_dataset(out)
    least = lambda ds, **kw: float(az.ess(ds, **kw).to_array().values.min())  # noqa: E731
    bulk = least(data)
    return {"eps": eps, "L": length, "reward": jump / (draws * CHAINS) / np.sqrt(length),
            "bulk": bulk / grads, "draw": bulk / (draws * CHAINS),
            "tail": least(data, method="tail") / grads,
            "square": least(az.convert_to_dataset(out ** 2)) / grads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"Plain HMC on the {DIMS}-d standard normal (an exact metric), {CHAINS} chains "
             f"of {args.draws} draws; ESS per sampling gradient (ArviZ), min over the "
             "coordinates (bulk, tail, bulk of x²); the last column is the min bulk ESS per "
             "draw.", "",
             "| L_r drawn | chosen by | ε | L | bulk | tail | bulk of x² | bulk per draw |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, lowest in WINDOWS.items():
        rows = [run(e, n, lowest, args.draws) for e in STEPS for n in LENGTHS]
        for label, key in (("best bulk ESS", "bulk"), ("ESJD / sqrt(L)", "reward"),
                           ("best bulk ESS per draw", "draw")):
            r = max(rows, key=lambda row: row[key])
            lines.append(f"| {name} | {label} | {r['eps']:.2f} | {r['L']} | {r['bulk']:.3f} "
                         f"| {r['tail']:.3f} | {r['square']:.3f} | {r['draw']:.2f} |")
        print("\n".join(lines[-3:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
