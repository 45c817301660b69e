from pathlib import Path

import numpy as np
import pytest

from ahmc_stan.stan_models import stan_file


def stan_model_path(name: str) -> Path:
    """A bundled model, found as the installed package finds it (importlib.resources)."""
    return stan_file(name)


@pytest.fixture(scope="session")
def mvn_data():
    """A 3-d Gaussian with a full covariance."""
    a = np.array([[1.0, 0.3, -0.2], [0.0, 0.8, 0.5], [0.0, 0.0, 0.6]])
    return {"D": 3, "mu": np.array([0.5, -1.0, 2.0]), "Sigma": a.T @ a + 0.1 * np.eye(3)}


@pytest.fixture(scope="session")
def mvn_model(mvn_data):
    from ahmc_stan import StanModel

    return StanModel(stan_model_path("mvn"), mvn_data)


@pytest.fixture(scope="session")
def constrained_model():
    from ahmc_stan import StanModel

    return StanModel(stan_model_path("constrained"), {"rate": 2.0})


@pytest.fixture(scope="session")
def logistic_data():
    rng = np.random.default_rng(20261122)
    n, k = 200, 5
    X = rng.normal(size=(n, k))
    beta = rng.normal(size=k)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(0.3 + X @ beta)))).astype(int)
    return {"N": n, "K": k, "X": X, "y": y, "prior_sd": 10.0}


@pytest.fixture(scope="session")
def logistic_model(logistic_data):
    from ahmc_stan import StanModel

    return StanModel(stan_model_path("logistic"), logistic_data)


#: The papers' 2-d Gaussian (correlation 0.99) and Neal's diagonal Gaussian's sds.
RHO = 0.99
SIGMA_2D = np.array([[1.0, RHO], [RHO, 1.0]])
SDS_100 = np.arange(1, 101) / 100


@pytest.fixture(scope="session")
def gauss2d():
    from ahmc_stan import StanModel

    return StanModel(stan_model_path("mvn"), {"D": 2, "mu": [0.0, 0.0], "Sigma": SIGMA_2D})


@pytest.fixture(scope="session")
def gauss100():
    from ahmc_stan import StanModel

    return StanModel(stan_model_path("diag_normal"), {"D": 100, "sigma": SDS_100})


def run_with_env(script: str, model: str, **env: str) -> np.ndarray:
    """Run ``script`` (``python -c``, the path of the bundled ``model`` as its argument,
    printing a list as its last line) with the environment variables ``env`` set; its
    list."""
    import ast
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", script, str(stan_model_path(model))],
                         capture_output=True, text=True, check=True, env={**os.environ, **env})
    return np.array(ast.literal_eval(out.stdout.strip().splitlines()[-1]))


def cpu_flags() -> str:
    return Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""


def with_and_without_avx2(script: str, model: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """Run ``script`` (:func:`run_with_env`) on the AVX2 loops of the C layer and on the
    baseline ones (``AHMC_NO_AVX2=1``); returns both lists and whether the CPU has AVX2
    and FMA, so that the two runs took different paths."""
    ends = [run_with_env(script, model, AHMC_NO_AVX2=off) for off in ("", "1")]
    flags = cpu_flags()
    return ends[0], ends[1], " avx2" in flags and " fma" in flags
