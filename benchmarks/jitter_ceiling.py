"""The best ESS per gradient HMC can reach on Neal's 100-d Gaussian, by how it draws L_r.

    python benchmarks/jitter_ceiling.py [--draws 2000] [--windows 1,1/2,fixed]
                                        [--spread 0] [--out FILE.md]

AHMC draws each iteration's number of leapfrog steps ``L_r ~ Uniform{1..L}`` (Wang,
Mohamed & de Freitas 2013, section 2).  On a Gaussian whose metric is exact (the
draws-and-gradients metric is exact on Neal's target, ``tuning/fast_warmup.py``), every
coordinate is then a standard normal that each leapfrog step rotates by the same angle,
and the best (ε, L) is a matter of that rotation alone.  This script runs plain HMC in
numpy on the 100-d standard normal, 4 chains of ``--draws`` from the stationary
distribution, over a grid of ε and L for ways of drawing L_r (``--windows``): AHMC's
``Uniform{1..L}`` (``1``), ``Uniform{ceil(aL)..L}`` (``a`` = ``1/3``, ``1/2``, ``2/3``)
and a fixed ``L`` (``fixed``).  ``--spread`` s > 0 makes the metric inexact: coordinate
i's frequency in it is ω_i ~ U(1 − s, 1 + s) (its variance off by a factor ω_i⁻²), as
where the warmup's estimate is noisy.  For each way it reports the
(ε, L) with the largest min bulk ESS per gradient, and at it the min tail ESS and the
min bulk ESS of x² per gradient (ArviZ's estimators), and the (ε, L) AHMC's reward,
ESJD / sqrt(L), prefers; and the (ε, L) with the largest min bulk ESS per draw, which
bounds the ESS a call of a fixed number of draws can return whatever its gradients cost;
and the ranges of those ESS over the five (ε, L) the reward ranks highest, which a tuner
that found its maximum exactly would still choose among.  Gradients count the sampling
iterations only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import arviz as az
import numpy as np

DIMS, CHAINS = 100, 4
STEPS = (0.25, 0.35, 0.45, 0.55, 0.65, 0.75)
LENGTHS = range(2, 21)
WINDOWS = {"1": ("Uniform{1..L} (AHMC)", lambda L: 1),
           "1/3": ("Uniform{ceil(L/3)..L}", lambda L: -(-L // 3)),
           "1/2": ("Uniform{ceil(L/2)..L}", lambda L: (L + 1) // 2),
           "2/3": ("Uniform{ceil(2L/3)..L}", lambda L: -(-2 * L // 3)),
           "fixed": ("fixed L", lambda L: L)}


def frequencies(spread: float) -> np.ndarray:
    """Each coordinate's frequency in the metric: 1 (exact), or U(1 − s, 1 + s)."""
    if spread == 0:
        return np.ones(DIMS)
    return np.random.default_rng(5).uniform(1 - spread, 1 + spread, DIMS)


def run(eps: float, length: int, lowest, draws: int, seed: int = 0,
        omega: np.ndarray | None = None) -> dict:
    """HMC on the Gaussian whose coordinates have frequencies ``omega`` in the metric
    (default 1: the standard normal); the reward's jumps in the whitened coordinates."""
    w2 = 1.0 if omega is None else omega ** 2
    scale = 1.0 if omega is None else omega
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((CHAINS, DIMS)) / scale
    out = np.empty((CHAINS, draws, DIMS))
    grads = jump = 0.0
    for i in range(draws):
        p = rng.standard_normal((CHAINS, DIMS))
        steps = int(rng.integers(lowest(length), length + 1))
        h0 = 0.5 * (w2 * x * x).sum(1) + 0.5 * (p * p).sum(1)
        q, r = x.copy(), p - 0.5 * eps * w2 * x
        for j in range(steps):
            q = q + eps * r
            if j < steps - 1:
                r = r - eps * w2 * q
        r = r - 0.5 * eps * w2 * q
        h1 = 0.5 * (w2 * q * q).sum(1) + 0.5 * (r * r).sum(1)
        accept = np.log(rng.random(CHAINS)) < h0 - h1
        moved = np.where(accept[:, None], q, x)
        jump += (((moved - x) * scale) ** 2).sum()
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
    parser.add_argument("--windows", default="1,1/2,fixed",
                        help=f"how L_r is drawn, of {', '.join(WINDOWS)}")
    parser.add_argument("--spread", type=float, default=0.0,
                        help="the metric's error: frequencies U(1 - s, 1 + s)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    omega = frequencies(args.spread) if args.spread else None
    target = (f"the {DIMS}-d standard normal (an exact metric)" if omega is None else
              f"a {DIMS}-d Gaussian whose frequencies in the metric are U(1 ± {args.spread:g})")
    lines = [f"Plain HMC on {target}, {CHAINS} chains of {args.draws} draws; ESS per "
             "sampling gradient (ArviZ), min over the coordinates (bulk, tail, bulk of x²); "
             "the last column is the min bulk ESS per draw.", "",
             "| L_r drawn | chosen by | ε | L | bulk | tail | bulk of x² | bulk per draw |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    tops = ["", "Over the five (ε, L) with the largest ESJD / sqrt(L) (its top, in % of "
            "the largest): the ranges of the same ESS.", "",
            "| L_r drawn | reward's top | bulk | tail | bulk of x² | bulk per draw |",
            "|---|---:|---|---|---|---|"]
    for window in args.windows.split(","):
        name, lowest = WINDOWS[window.strip()]
        rows = [run(e, n, lowest, args.draws, omega=omega) for e in STEPS for n in LENGTHS]
        for label, key in (("best bulk ESS", "bulk"), ("ESJD / sqrt(L)", "reward"),
                           ("best bulk ESS per draw", "draw")):
            r = max(rows, key=lambda row: row[key])
            lines.append(f"| {name} | {label} | {r['eps']:.2f} | {r['L']} | {r['bulk']:.3f} "
                         f"| {r['tail']:.3f} | {r['square']:.3f} | {r['draw']:.2f} |")
        top = sorted(rows, key=lambda row: -row["reward"])[:5]
        span = lambda k, f: f"{min(r[k] for r in top):{f}}–{max(r[k] for r in top):{f}}"  # noqa: E731
        tops.append(f"| {name} | {100 * top[-1]['reward'] / top[0]['reward']:.0f} % | "
                    f"{span('bulk', '.3f')} | {span('tail', '.3f')} | "
                    f"{span('square', '.3f')} | {span('draw', '.2f')} |")
        print("\n".join(lines[-3:] + tops[-1:]), flush=True)
    text = "\n".join(lines + tops) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
