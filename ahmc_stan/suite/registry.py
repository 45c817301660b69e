"""The registry: the papers' experiments (model, data, iterations, measured columns), the
sampler specs (table rows) and the quick and full configurations.

The experiments are those of Wang, Mohamed & de Freitas (2013), Titsias & Dellaportas
(2019), Alfaki, Subbey & Haugland (2008) and Wang (2012, the robot arm); their ``.stan``
files are the bundled models (package data ``ahmc_stan.stan_models``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .. import datasets
from ..stan_models import directory

#: The folder of the bundled models, read through ``importlib.resources``.
STAN_MODELS = directory()


# ---- experiments -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Experiment:
    """A model with its data, iterations per chain and the columns whose ESS is reported.

    ``data(full)`` returns the Stan data; ``iterations`` maps ``"quick"``/``"full"`` to
    ``(warmup, draws)``; ``ess_prefixes`` (column-name prefixes) selects the measured
    columns (empty: the parameters block)."""

    name: str
    group: str
    stan_file: str
    data: Callable[[bool], dict]
    iterations: dict
    source: str
    ess_prefixes: tuple[str, ...] = ()


def _sv_data(full: bool) -> dict:
    return datasets.stochastic_volatility_data(T=2000 if full else 1000, seed=1)


def _lgcp_grid(full: bool) -> int:
    return 64 if full else 32


def _lgcp_data(full: bool) -> dict:
    return datasets.lgcp_data(d=_lgcp_grid(full), seed=1)


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in [
    Experiment("gauss2d", "gaussian", "mvn.stan",
               lambda full: datasets.correlated_gaussian_data(0.99),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "2-d Gaussian, correlation 0.99 (Wang et al. 2013 §2 Fig. 1; "
               "Titsias & Dellaportas §4.1)"),
    Experiment("neal100", "gaussian", "diag_normal.stan",
               lambda full: datasets.neal_gaussian_data(100),
               {"quick": (1000, 1000), "full": (20000, 20000)},
               "Neal's 100-d Gaussian, sds 0.01…1.00 (Titsias & Dellaportas §4.2 Table 1)"),
    Experiment("gp51", "gaussian", "mvn.stan",
               lambda full: datasets.gp_grid_gaussian_data(51),
               {"quick": (1000, 1000), "full": (20000, 20000)},
               "51-d squared-exponential covariance on [0, 4] (Titsias & Dellaportas §4.1)"),
    Experiment("std64", "gaussian", "std_normal.stan", lambda full: datasets.std_normal_data(64),
               {"quick": (500, 1000), "full": (1000, 2000)},
               "64-d standard normal (Alfaki et al. 2008, numerical results)"),
    Experiment("std128", "gaussian", "std_normal.stan",
               lambda full: datasets.std_normal_data(128),
               {"quick": (500, 1000), "full": (1000, 2000)},
               "128-d standard normal (Alfaki et al. 2008, numerical results)"),
    Experiment("pima", "logistic", "logistic.stan", lambda full: datasets.pima_data(),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "Pima Indians, MASS (Wang et al. 2013 §5.1 Fig. 2)"),
    Experiment("ripley", "logistic", "logistic.stan", lambda full: datasets.ripley_data(),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "Ripley synth.tr, MASS (Wang et al. 2013 §5.1 Fig. 2)"),
    Experiment("breast_cancer", "logistic", "logistic.stan",
               lambda full: datasets.breast_cancer_data(),
               {"quick": (500, 1000), "full": (1000, 5000)},
               "Wisconsin breast cancer, scikit-learn (in place of the UCI sets no package "
               "ships)"),
    Experiment("caravan", "logistic", "logistic.stan", lambda full: datasets.caravan_data(),
               {"quick": (500, 500), "full": (20000, 20000)},
               "Caravan, ISLR (Titsias & Dellaportas §4.2 Table 1)"),
    Experiment("sv", "sv", "stochastic_volatility.stan", _sv_data,
               {"quick": (500, 500), "full": (10000, 20000)},
               "Stochastic volatility, T = 1000 (full: 2000) (Wang et al. 2013 §5.3 Table 1)",
               ess_prefixes=("beta", "phi", "sigma2", "x.")),
    Experiment("lgcp", "lgcp", "lgcp.stan", _lgcp_data,
               {"quick": (300, 300), "full": (1000, 5000)},
               "Log-Gaussian Cox process, 32×32 grid (data(True): the paper's 64×64) "
               "(Wang et al. 2013 §5.2 Figs. 3–4)", ess_prefixes=("x.",)),
    Experiment("robot_arm", "bnn", "robot_arm.stan", lambda full: datasets.robot_arm_data(),
               {"quick": (150, 150), "full": (2000, 5000)},
               "Robot-arm BNN, 16 hidden units (Wang 2012 §4.1 Table 4.1)"),
]}


def experiments() -> dict[str, Experiment]:
    """Every experiment (a copy of :data:`EXPERIMENTS`)."""
    return dict(EXPERIMENTS)


# ---- samplers --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SamplerSpec:
    """A table row: a registered sampler with options; ``max_dims`` skips models too large
    for samplers that form Hessians; ``iteration_factor`` multiplies the iterations of
    samplers that spend one gradient (or none) per iteration (capped at the gad paper's
    2·10⁴ warmup and draws)."""

    label: str
    sampler: str
    options: dict = field(default_factory=dict)
    max_dims: int | None = None
    iteration_factor: int = 1


_differences = {"hessian": "gradient", "third_derivatives": "gradient"}


def _specs() -> dict[str, SamplerSpec]:
    mh = dict(iteration_factor=10)
    return {s.label: s for s in [
        SamplerSpec("ahmc", "ahmc"),
        SamplerSpec("gadmala", "gadmala", **mh),
        SamplerSpec("gadmala_exact", "gadmala_exact", **mh),
        SamplerSpec("gadrwm", "gadrwm", **mh),
        SamplerSpec("am", "am", **mh),
        SamplerSpec("rwm", "rwm", **mh),
        SamplerSpec("mala", "mala", **mh),
        SamplerSpec("hmc-5", "hmc", {"num_steps": 5}),
        SamplerSpec("hmc-10", "hmc", {"num_steps": 10}),
        SamplerSpec("hmc-20", "hmc", {"num_steps": 20}),
        # Hessians and third derivatives by differences of gradients (faster than
        # autodiff on the logistic regressions; README, "ARMHMC")
        SamplerSpec("armhmc", "armhmc", _differences, max_dims=200),
        # Girolami & Calderhead's (2011) logistic-regression setting, fixed L
        SamplerSpec("rmhmc", "rmhmc", {"step_size": 0.5, "num_steps": 6, **_differences},
                    max_dims=200),
        SamplerSpec("ohmc", "ohmc"),
        SamplerSpec("svhmc", "svhmc"),
        SamplerSpec("osvhmc", "osvhmc"),
        # the thesis's cross-validation reward needs per-model folds: ESJD everywhere
        SamplerSpec("bandit", "bandit", {"reward": "esjd"}),
    ]}


#: Table label → how to run it.  Registered samplers missing here run with defaults.
SAMPLER_SPECS = _specs()


def available_specs() -> dict[str, SamplerSpec]:
    """Every registered sampler as a spec (``hmc`` as HMC-5/10/20), then ``nuts``."""
    from ..sampling import SAMPLERS

    out = {label: s for label, s in SAMPLER_SPECS.items() if s.sampler in SAMPLERS}
    known = {s.sampler for s in SAMPLER_SPECS.values()}
    out.update({name: SamplerSpec(name, name) for name in SAMPLERS if name not in known})
    out["nuts"] = SamplerSpec("nuts", "nuts")
    return out


# ---- configuration ---------------------------------------------------------------------------

#: What ``quick=True`` runs: 2 chains per job, the iterations of ``Experiment.iterations
#: ["quick"]``, these experiments and these samplers (those that are registered), NUTS;
#: Metropolis-type samplers (dense O(n²) proposals, ``iteration_factor`` > 1) skip models
#: of more than ``mh_max_dims`` dimensions (gadMALA took 6–9 minutes on the 1000-d ones).
QUICK = {
    "experiments": ["gauss2d", "neal100", "pima", "ripley", "sv", "lgcp", "robot_arm"],
    "samplers": ["ahmc", "gadmala"],
    "chains": 2,
    "mh_max_dims": 200,
}
#: Chains per job of an experiment that FULL does not list.
FULL_CHAINS = 4

_TD = (20000, 20000)            # Titsias & Dellaportas: 2·10⁴ burn-in + 2·10⁴ draws
_TD_NUTS = (500, 20000)         # ... and NUTS's 500 burn-in
_WMDF = (1000, 5000)            # Wang et al. 2013 §5.1–5.2: 1000 burn-in + 5000 draws

#: What ``quick=False`` runs, per experiment: ``chains`` per job, ``data`` (``"full"``
#: or ``"quick"``: which of the experiment's data sets) and ``runs``, table label →
#: ``(warmup, draws, repeats)``.  Only the samplers that make each paper's claim run
#: (``comparisons/README.md``, "Full mode", gives the reasons and the cost of each row;
#: ``comparisons/full_cost.py`` estimates it).
FULL: dict[str, dict] = {
    # Wang et al. 2013 Fig. 1, Titsias & Dellaportas Fig. 1 (illustrations)
    "gauss2d": {"chains": 4, "data": "full", "runs": {
        "ahmc": (*_WMDF, 1), "gadmala": (*_TD, 1), "gadrwm": (*_TD, 1), "nuts": (*_WMDF, 1)}},
    # Titsias & Dellaportas Table 1: ten repeats, three for the samplers whose chains do
    # not mix (their draws' reduction costs more than their sampling)
    "neal100": {"chains": 4, "data": "full", "runs": {
        "gadmala": (*_TD, 10), "gadmala_exact": (*_TD, 10), "gadrwm": (*_TD, 3),
        "rwm": (*_TD, 3), "mala": (*_TD, 3), "am": (*_TD, 3), "hmc-5": (*_TD, 10),
        "hmc-10": (*_TD, 10), "hmc-20": (*_TD, 10), "nuts": (*_TD_NUTS, 10)}},
    # Titsias & Dellaportas §4.1 (illustration)
    "gp51": {"chains": 4, "data": "full", "runs": {
        "gadmala": (*_TD, 1), "gadrwm": (*_TD, 1), "am": (*_TD, 1), "nuts": (*_TD_NUTS, 1)}},
    # Alfaki, Subbey & Haugland 2008: N = 2000
    "std64": {"chains": 4, "data": "full", "runs": {
        "ohmc": (1000, 2000, 1), "svhmc": (1000, 2000, 1), "osvhmc": (1000, 2000, 1),
        "hmc-20": (1000, 2000, 1), "nuts": (1000, 2000, 1)}},
    "std128": {"chains": 4, "data": "full", "runs": {
        "ohmc": (1000, 2000, 1), "svhmc": (1000, 2000, 1), "osvhmc": (1000, 2000, 1),
        "hmc-20": (1000, 2000, 1), "nuts": (1000, 2000, 1)}},
    # Wang et al. 2013 §5.1 Fig. 2: 10 runs
    "pima": {"chains": 4, "data": "full", "runs": {
        "ahmc": (*_WMDF, 10), "armhmc": (*_WMDF, 1), "nuts": (*_WMDF, 10)}},
    "ripley": {"chains": 4, "data": "full", "runs": {
        "ahmc": (*_WMDF, 10), "armhmc": (*_WMDF, 1), "nuts": (*_WMDF, 10)}},
    "breast_cancer": {"chains": 4, "data": "full", "runs": {
        "ahmc": (*_WMDF, 10), "nuts": (*_WMDF, 10)}},
    # Titsias & Dellaportas Table 1, reduced where an iteration costs many gradients:
    # gadMALAe's warmup (an autodiff HVP), HMC-L, NUTS (deep trees along the ridge)
    "caravan": {"chains": 4, "data": "full", "runs": {
        "gadmala": (*_TD, 1), "gadmala_exact": (2000, 20000, 1), "gadrwm": (*_TD, 1),
        "rwm": (*_TD, 1), "mala": (*_TD, 1), "am": (*_TD, 1), "hmc-5": (2000, 10000, 1),
        "hmc-10": (2000, 10000, 1), "hmc-20": (2000, 10000, 1), "nuts": (500, 500, 1)}},
    # Wang et al. 2013 §5.3 Table 1: T = 2000 (their 10⁴ + 2·10⁴ iterations reduced)
    "sv": {"chains": 4, "data": "full", "runs": {
        "ahmc": (5000, 10000, 1), "nuts": (5000, 10000, 1)}},
    # Wang et al. 2013 §5.2 Figs. 3–4, on the 32 × 32 grid (64 × 64 is beyond the budget)
    "lgcp": {"chains": 4, "data": "quick", "runs": {
        "ahmc": (*_WMDF, 1), "nuts": (*_WMDF, 1)}},
    # Wang 2012 §4.1 Table 4.1 (NUTS, the reference, reduced: deep trees)
    "robot_arm": {"chains": 4, "data": "full", "runs": {
        "bandit": (2000, 5000, 1), "nuts": (1000, 1000, 1)}},
}


def full_runs() -> list[tuple[str, str, int, int, int, int]]:
    """The full configuration as rows ``(experiment, label, chains, warmup, draws,
    repeats)``."""
    return [(name, label, cfg["chains"], *run) for name, cfg in FULL.items()
            for label, run in cfg["runs"].items()]


@dataclass(frozen=True)
class PlannedRun:
    """One (experiment, sampler) of a suite run: ``repeats`` jobs of ``chains`` chains;
    ``full_data``: the experiment's full data set; ``chosen``: named by :data:`FULL`."""

    experiment: str
    label: str
    chains: int
    warmup: int
    draws: int
    repeats: int
    full_data: bool
    chosen: bool


def plan_runs(quick: bool = False, samplers=None, repeats: int | None = None, only=None,
              iterations: tuple[int, int] | None = None,
              chains: int | None = None) -> list[PlannedRun]:
    """What :func:`~.run.run_suite` runs with these arguments (before skipping samplers
    too costly for a model's dimension).  Quick: :data:`QUICK`; full: :data:`FULL`, where
    ``samplers`` (table labels; NUTS always runs) replaces each experiment's samplers and
    a sampler FULL does not name there gets the experiment's full iterations (×
    ``iteration_factor``, capped); ``repeats``, ``iterations`` and ``chains`` override."""
    available = experiments()
    names = list(only) if only else list(QUICK["experiments"] if quick else FULL)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"unknown experiments {unknown}; choose from {sorted(available)}")
    specs = available_specs()
    missing = [s for s in samplers or () if s not in specs]
    if missing:
        raise ValueError(f"samplers {missing} are not registered; choose from "
                         f"{sorted(specs)}")
    mode = "quick" if quick else "full"
    out = []
    for n in names:
        cfg = {} if quick else FULL.get(n, {"chains": FULL_CHAINS, "data": "full"})
        runs = cfg.get("runs", {})
        chosen = samplers or (QUICK["samplers"] if quick else list(runs))
        labels = [s for s in chosen if s in specs and s != "nuts"] + ["nuts"]
        for label in labels:
            warmup, draws = iterations or _iterations(available[n], specs[label], mode)
            out.append(PlannedRun(
                n, label, chains or (QUICK["chains"] if quick else cfg["chains"]),
                warmup, draws, repeats if repeats is not None else
                runs.get(label, (0, 0, 1))[2], not quick and cfg["data"] == "full",
                label in runs))
    return out


def _iterations(exp: Experiment, spec: SamplerSpec, mode: str) -> tuple[int, int]:
    """Iterations per chain: the full configuration's for a sampler it names, else the
    experiment's (× ``iteration_factor``, capped at 2·10⁴)."""
    if mode == "full" and spec.label in FULL.get(exp.name, {}).get("runs", {}):
        return FULL[exp.name]["runs"][spec.label][:2]
    warmup, draws = exp.iterations[mode]
    f = spec.iteration_factor
    cap = lambda n: min(f * n, max(n, 20000))  # noqa: E731
    return cap(warmup), cap(draws)
