"""The README's main job on a bundled model: ``python -m ahmc_stan.demo [OUT_DIR]``.

Compiles the bundled logistic regression (synthetic data, fixed seed), prints its
parameters and the cost of a gradient, tunes and samples it with AHMC, runs CmdStan's NUTS
on the same model and data, prints the comparison table and writes the tuner's figure to
``OUT_DIR`` (default ``demo_output``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from .model import StanModel
from .stan_models import stan_file


def logistic_data(n: int = 500, k: int = 9, seed: int = 1) -> dict:
    """Synthetic logistic-regression data with standardised covariates."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    beta = rng.normal(size=k)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(0.5 + X @ beta)))).astype(int)
    return {"N": n, "K": k, "X": X, "y": y, "prior_sd": 10.0}


def main() -> None:
    start = time.perf_counter()
    model = StanModel(stan_file("logistic.stan"), logistic_data())
    print(f"{model.name}: compiled or loaded in {time.perf_counter() - start:.1f} s "
          f"({model.lib_path})")
    print(f"{model.dims} unconstrained parameters: {', '.join(model.param_names())}")
    x = model.initial_point(np.random.default_rng(0))
    grad = np.empty(model.dims)
    lp = model.density.log_density_gradient(x, grad)
    print(f"log density at a Stan-style initial point: {lp:.3f}")
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        model.log_density_gradient(x)
    python_us = (time.perf_counter() - t) / n * 1e6
    bare_us = model.density.gradient_seconds(x, n) * 1e6
    print(f"gradient: {bare_us:.2f} µs in C++, {python_us:.2f} µs per call from Python")

    from .comparison import compare, to_markdown
    from .nuts import run_nuts
    from .sampling import STAN_WARMUP, tune_and_sample

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "demo_output")
    out.mkdir(parents=True, exist_ok=True)
    print(f"\nAHMC (4 chains, its default warmup of {STAN_WARMUP} "
          "iterations + 1000 draws):")
    ahmc = tune_and_sample(model, sampler="ahmc", chains=4, draws=1000, seed=1)
    print(ahmc.efficiency_line())
    print("\nCmdStan NUTS (same model, data and chains; its default 1000 warmup + 1000 "
          "draws):")
    nuts = run_nuts(model, chains=4, warmup=1000, draws=1000, seed=1)
    print(nuts.efficiency_line())
    table = compare({"ahmc": ahmc, "nuts": nuts})
    print()
    print(to_markdown(table, columns=["min_ess_bulk", "min_ess_per_grad",
                                      "min_ess_per_grad_total", "min_ess_per_s",
                                      "min_ess_per_grad / NUTS", "min_ess_per_s / NUTS",
                                      "max_rhat", "divergences"]))
    figure = out / "ahmc_tuning.png"
    ahmc.plot_tuning(path=figure)
    table.to_csv(out / "comparison.csv")
    print(f"\nwrote {figure} and {out / 'comparison.csv'}")


if __name__ == "__main__":
    main()
