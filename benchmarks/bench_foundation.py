"""Foundation benchmark: compile times and the cost of a gradient by each path.

    python benchmarks/bench_foundation.py [--skip-first-build]

Measures, in one run:
- the first-ever build in an empty cache (precompiled Stan headers + our C layer + model),
- a cold model compile with the toolchain cached (the usual case),
- a cache-hit load of a compiled model in a fresh process,
- microseconds per log-density gradient for logistic regressions with 10 and 100
  parameters: through ``bridgestan.StanModel``, through ``model.density`` (one ctypes call
  per gradient), per leapfrog step of ``model.density.leapfrog`` (the whole trajectory in
  C++), and the bare C++ gradient timed inside the library.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _timed_subprocess(code: str, env: dict | None = None) -> float:
    """Run ``code`` in a fresh interpreter; it prints the seconds it measured."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True,
                         capture_output=True, text=True, env=env).stdout
    return float(out.strip().splitlines()[-1])


def compile_times(skip_first_build: bool) -> dict[str, float]:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        stan = Path(tmp) / "bench_model.stan"
        stan.write_text(f"// {uuid.uuid4()}\n" + (ROOT / "stan_models/logistic.stan").read_text())
        code = f"""
            import time, ahmc_stan
            t = time.perf_counter(); ahmc_stan.compile_model({str(stan)!r})
            print(time.perf_counter() - t)
        """
        if not skip_first_build:
            env = dict(os.environ, AHMC_STAN_CACHE=str(Path(tmp) / "empty-cache"))
            results["first build, empty cache (s)"] = _timed_subprocess(code, env)
        results["cold model compile, toolchain cached (s)"] = _timed_subprocess(code)
        results["cache-hit compile_model (s)"] = _timed_subprocess(code)
        results["cache-hit StanModel load in a new process (s)"] = _timed_subprocess(f"""
            import time, ahmc_stan
            t = time.perf_counter()
            ahmc_stan.StanModel({str(stan)!r}, {{"N": 1, "K": 1, "X": [[1.0]], "y": [1],
                                                  "prior_sd": 1.0}})
            print(time.perf_counter() - t)
        """)
    return results


def _per_call_us(f, seconds: float = 1.0) -> float:
    f()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(200):
            f()
        n += 200
    return (time.perf_counter() - start) / n * 1e6


def gradient_costs(dims: int) -> dict[str, float]:
    from ahmc_stan import StanModel

    rng = np.random.default_rng(0)
    n, k = 500, dims - 1
    X = rng.normal(size=(n, k))
    y = (rng.uniform(size=n) < 0.5).astype(int)
    model = StanModel(ROOT / "stan_models/logistic.stan",
                      {"N": n, "K": k, "X": X, "y": y, "prior_sd": 10.0})
    x = rng.normal(size=dims) * 0.1
    grad = np.empty(dims)
    kernel = model.density
    steps = 100

    def trajectory():
        xx, p, g = x.copy(), np.zeros(dims), grad.copy()
        kernel.leapfrog(steps, 1e-4, None, xx, p, g, 0.0)

    kernel.log_density_gradient(x, grad)
    return {
        "bridgestan.StanModel": _per_call_us(lambda: model.bridge.log_density_gradient(x, out=grad)),
        "model.density, one call": _per_call_us(lambda: kernel.log_density_gradient(x, grad)),
        "model.density.leapfrog, per step": _per_call_us(trajectory) / steps,
        "bare C++ (inside the library)": kernel.gradient_seconds(x, 20000) * 1e6,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-first-build", action="store_true",
                        help="do not time a build into an empty cache (~40 s)")
    args = parser.parse_args(argv)
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}\n")
    print("| compile | seconds |\n|---|---:|")
    for name, value in compile_times(args.skip_first_build).items():
        print(f"| {name} | {value:.2f} |")
    costs = {d: gradient_costs(d) for d in (10, 100)}
    print("\n| µs per gradient (logistic regression, N=500) | 10 params | 100 params |")
    print("|---|---:|---:|")
    for path in costs[10]:
        print(f"| {path} | {costs[10][path]:.2f} | {costs[100][path]:.2f} |")
    bare = {d: costs[d]["bare C++ (inside the library)"] for d in costs}
    lf = {d: costs[d]["model.density.leapfrog, per step"] for d in costs}
    print("\nsampler path (leapfrog) minus bare C++: "
          + ", ".join(f"{d} params {lf[d] - bare[d]:+.2f} µs" for d in costs))


if __name__ == "__main__":
    main()
