"""The README's main job on a bundled model: ``python -m ahmc_stan.demo``.

Compiles the bundled logistic regression (synthetic data, fixed seed), prints its
parameters and the cost of a gradient by each path.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .model import StanModel

STAN_MODELS = Path(__file__).resolve().parent.parent / "stan_models"


def logistic_data(n: int = 500, k: int = 9, seed: int = 1) -> dict:
    """Synthetic logistic-regression data with standardised covariates."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    beta = rng.normal(size=k)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(0.5 + X @ beta)))).astype(int)
    return {"N": n, "K": k, "X": X, "y": y, "prior_sd": 10.0}


def main() -> None:
    start = time.perf_counter()
    model = StanModel(STAN_MODELS / "logistic.stan", logistic_data())
    print(f"{model.name}: compiled or loaded in {time.perf_counter() - start:.1f} s "
          f"({model.lib_path})")
    print(f"{model.dims} unconstrained parameters: {', '.join(model.param_names())}")
    x = model.initial_point(np.random.default_rng(0))
    grad = np.empty(model.dims)
    lp = model.kernel.log_density_gradient(x, grad)
    print(f"log density at a Stan-style initial point: {lp:.3f}")
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        model.log_density_gradient(x)
    python_us = (time.perf_counter() - t) / n * 1e6
    bare_us = model.kernel.gradient_seconds(x, n) * 1e6
    print(f"gradient: {bare_us:.2f} µs in C++, {python_us:.2f} µs per call from Python")


if __name__ == "__main__":
    main()
