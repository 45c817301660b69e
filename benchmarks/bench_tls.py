"""The cost of STAN_THREADS's thread-local autodiff tape in our libraries: the bare C++
gradient of each model built with the default TLS access (global-dynamic: a call to
``__tls_get_addr`` per access) and with TLS descriptors (``-mtls-dialect=gnu2``, what
``ahmc_stan.compiler`` uses on x86-64), and without STAN_THREADS (not thread-safe, for
reference), with CmdStan NUTS's wall time per leapfrog step on the same model alongside.

    python benchmarks/bench_tls.py [--models sv,lgcp,pima,neal100] [--cache DIR]
        [--variants tls | march | stanc] [--no-nuts]

Each variant is built (once; ``--cache``, default ``benchmarks/.tls-cache``, keeps the
builds, a few minutes the first time) and timed in its own process, in turns, five times
each; the gradients of the TLS variants at the same points must agree to the last bit.
``--variants march`` times the compiler's flags as they are against the same with
``-march=x86-64-v3`` (AVX2, FMA) and ``-march=x86-64-v4`` (AVX-512), whose gradients
round differently (README, "How models are built").  ``--variants stanc`` times the models
translated by stanc at ``--O0`` against ``--O1`` (the default since stop 58), the C++
flags as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ahmc_stan, also for A/B copies

GNU2 = "-mtls-dialect=gnu2"
TLS_VARIANTS = {  # from the compiler's flags (which have GNU2 on x86-64)
    "global-dynamic": lambda flags: [f for f in flags if f != GNU2],
    "TLS descriptors": lambda flags: flags if GNU2 in flags else flags + [GNU2],
    "no STAN_THREADS": lambda flags: [f for f in flags if f not in (GNU2, "-DSTAN_THREADS")],
}
MARCH_VARIANTS = {
    "as built": lambda flags: flags,
    "x86-64-v3": lambda flags: flags + ["-march=x86-64-v3"],
    "x86-64-v4": lambda flags: flags + ["-march=x86-64-v4"],
}
#: stanc's optimisation level (``compiler.DEFAULT_STANC_OPT``), the C++ flags unchanged.
STANC_VARIANTS = {"stanc --O0": "--O0", "stanc --O1": "--O1"}
VARIANTS = {**TLS_VARIANTS, **MARCH_VARIANTS,
            **{v: (lambda flags: flags) for v in STANC_VARIANTS}}


def measure(variant: str, name: str, repeats: int) -> dict:
    """In this process: build ``name`` with ``variant``'s flags, time its gradient."""
    import numpy as np

    from ahmc_stan import compiler

    compiler._CXXFLAGS = VARIANTS[variant](list(compiler._CXXFLAGS))
    compiler.DEFAULT_STANC_OPT = STANC_VARIANTS.get(variant, compiler.DEFAULT_STANC_OPT)
    compiler.toolchain.cache_clear()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_samplers import load

    model = load(name)
    rng = np.random.default_rng(0)
    points = [model.initial_point(rng) for _ in range(3)]
    grads = []
    for x in points:
        g = np.empty_like(x)
        lp = model.density.log_density_gradient(x, g)
        grads.append([lp, *g.tolist()])
    us = [model.density.gradient_seconds(points[0], 3000) * 1e6 for _ in range(repeats)]
    return {"us": us, "grads": grads}


def nuts_us_per_step(name: str) -> float:
    import logging
    import warnings

    for logger in ("cmdstanpy", "arviz"):
        logging.getLogger(logger).setLevel(logging.ERROR)

    import ahmc_stan
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_samplers import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ahmc_stan.run_nuts(load(name), chains=1, warmup=1000, draws=1000, seed=1,
                                 diagnose=False)
    e = fit.efficiency()
    return (e["time_warmup"] + e["time_sampling"]) / (
        e["n_grad_warmup"] + e["n_grad_sampling"]) * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="sv,lgcp,pima,neal100")
    ap.add_argument("--cache", default=str(ROOT / "benchmarks" / ".tls-cache"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", choices=("tls", "march", "stanc"), default="tls")
    ap.add_argument("--no-nuts", action="store_true", help="skip CmdStan NUTS's timing")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child[0], args.child[1], 1)))
        return
    variants = list({"tls": TLS_VARIANTS, "march": MARCH_VARIANTS,
                     "stanc": STANC_VARIANTS}[args.variants])
    env = {**os.environ, "AHMC_STAN_CACHE": args.cache}
    rows = []
    for name in args.models.split(","):
        times = {v: [] for v in variants}
        grads = {}
        for _ in range(args.rounds):  # in turns, so that load changes hit all alike
            for v in variants:
                out = subprocess.run([sys.executable, __file__, "--child", v, name],
                                     env=env, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"{v} on {name} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                times[v] += r["us"]
                grads[v] = r["grads"]
        same = all(g == grads[variants[0]] for g in grads.values())
        med = {v: sorted(t)[len(t) // 2] for v, t in times.items()}
        nuts = float("nan") if args.no_nuts else nuts_us_per_step(name)
        rows.append((name, med, same, nuts))
        print(f"{name}: " + ", ".join(f"{v} {m:.3g} µs" for v, m in med.items())
              + f"; identical gradients: {same}; CmdStan NUTS {nuts:.3g} µs per leapfrog step",
              flush=True)
    first = variants[0]
    print("\n| model | " + " | ".join(f"{v} µs" for v in variants) + " | "
          + " | ".join(f"{first} ÷ {v}" for v in variants[1:])
          + " | identical gradients | CmdStan NUTS µs per step |")
    print("|---|" + "---:|" * (2 * len(variants) - 1) + "---|---:|")
    for name, med, same, nuts in rows:
        print(f"| {name} | " + " | ".join(f"{med[v]:.3g}" for v in variants) + " | "
              + " | ".join(f"{med[first] / med[v]:.2f}×" for v in variants[1:])
              + f" | {'yes' if same else 'NO'} | {nuts:.3g} |")


if __name__ == "__main__":
    main()
