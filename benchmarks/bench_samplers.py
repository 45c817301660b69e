"""Every sampler against CmdStan's NUTS, per second and per gradient, one run:

    python benchmarks/bench_samplers.py [--models std10,pima,logistic100,neal100]
        [--samplers ahmc,gadmala,...|all] [--warmup 1000] [--draws 1000]
        [--mh-factor 10] [--chains 4] [--seed 1] [--option KEY=VALUE ...]

Seed 003's Table 1 setting (Titsias & Dellaportas 2019, section 4.2) is
``--models neal100,caravan --samplers gadmala --warmup 20000 --draws 20000 --mh-factor 1``.

Each sampler runs ``warmup`` + ``draws`` iterations, the Metropolis-type ones (one
gradient or density per iteration) ``mh-factor`` times as many, capped at 2·10⁴ each, as
the suite runs them; CmdStan's NUTS runs with its defaults (1000 + 1000).  Same models,
chains and seed, the same ArviZ ESS.  Reports per sampler and model: min bulk ESS per
second and per gradient-equivalent, warmup included, and their ratio to NUTS; the wall
time per gradient-equivalent (warmup included) ÷ NUTS's wall time per leapfrog step; µs
per iteration; the bare C++ gradient; R-hat; the tuned samplers' tuner share of the
chain-seconds (the tuners' own clocks).  Models: ``std10`` (10-d standard normal),
``logistic100`` (logistic regression, 500 cases, 100 parameters) and the suite's
(``ahmc_stan.suite.EXPERIMENTS``).  Writes ``benchmarks/results/bench_samplers.md`` and
``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ahmc_stan, also for A/B copies

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.comparison import to_markdown  # noqa: E402
from ahmc_stan.suite import EXPERIMENTS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: Samplers that spend one gradient (or density) per iteration: run mh-factor × longer.
MH = {"gadmala", "gadmala_exact", "gadrwm", "rwm", "mala", "am"}
#: Options without which a sampler does not run.
OPTIONS = {"hmc": {"num_steps": 10}, "rmhmc": {"step_size": 0.5, "num_steps": 6}}


def load(name: str):
    if name == "std10":
        return ahmc_stan.StanModel(ROOT / "stan_models" / "std_normal.stan", {"D": 10})
    if name == "logistic100":
        rng = np.random.default_rng(0)
        n, k = 500, 99
        X = rng.normal(size=(n, k))
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-X @ rng.normal(size=k) * 0.3))).astype(int)
        return ahmc_stan.StanModel(ROOT / "stan_models" / "logistic.stan",
                                   {"N": n, "K": k, "X": X, "y": y, "prior_sd": 10.0})
    exp = EXPERIMENTS[name]
    return ahmc_stan.StanModel(ROOT / "stan_models" / exp.stan_file, exp.data(False))


def measure(model, sampler: str, chains: int, warmup: int, draws: int, seed: int,
            options: dict | None = None) -> dict:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if sampler == "nuts":
            fit = ahmc_stan.run_nuts(model, chains=chains, warmup=1000, draws=1000,
                                     seed=seed, diagnose=False)
        else:
            fit = ahmc_stan.tune_and_sample(model, sampler, chains=chains, warmup=warmup,
                                            draws=draws, seed=seed, progress=False,
                                            diagnose=False, **OPTIONS.get(sampler, {}),
                                            **(options or {}))
    e = fit.efficiency()
    grads = e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]
    seconds = e["time_warmup"] + e["time_sampling"]
    chains = fit.metadata.get("chains") if sampler != "nuts" else None
    tuner = [c.get("tuner_seconds") for c in chains or []]
    tuner = [t for t in tuner if t is not None]
    return {"min_ess": e["min_ess_bulk"], "per_s": e["min_ess_per_s_total"],
            "tuner_share": sum(tuner) / seconds if tuner else None,
            "per_grad": e["min_ess_per_grad_total"], "max_rhat": e["max_rhat"],
            "us_per_grad": 1e6 * seconds / grads, "chain_seconds": seconds,
            "us_per_iteration": 1e6 * seconds / (e["chains"] * (e["draws"] + (
                1000 if sampler == "nuts" else warmup))),
            "wall": time.perf_counter() - start}


def _option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="std10,pima,logistic100,neal100")
    ap.add_argument("--samplers", default="all")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--mh-factor", type=int, default=10)
    ap.add_argument("--riemann-max-dims", type=int, default=10,
                    help="run armhmc and rmhmc only on models of at most this many dims")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "bench_samplers"))
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option for every sampler but NUTS (VALUE read as JSON, else "
                         "a string), e.g. --option hvp=gradient")
    args = ap.parse_args(argv)
    options = dict(_option(o) for o in args.option)
    from ahmc_stan.sampling import SAMPLERS

    samplers = (list(SAMPLERS) if args.samplers == "all" else args.samplers.split(","))
    samplers = [s for s in samplers if s != "nuts"]
    rows = []
    for name in args.models.split(","):
        model = load(name)
        x = np.zeros(model.dims)
        bare = 1e6 * model.density.gradient_seconds(x, 2000)
        nuts = measure(model, "nuts", args.chains, args.warmup, args.draws, args.seed)
        print(name, "nuts", nuts, flush=True)
        for sampler in samplers:
            if sampler in ("armhmc", "rmhmc") and model.dims > args.riemann_max_dims:
                continue
            f = args.mh_factor if sampler in MH else 1
            warmup, draws = (min(f * n, max(n, 20000)) for n in (args.warmup, args.draws))
            r = measure(model, sampler, args.chains, warmup, draws, args.seed, options)
            print(name, sampler, r, flush=True)
            rows.append({"model": name, "dims": model.dims, "sampler": sampler,
                         "iterations": f"{warmup}+{draws}",
                         "min ESS/s": r["per_s"], "÷ NUTS /s": r["per_s"] / nuts["per_s"],
                         "min ESS/grad": r["per_grad"],
                         "÷ NUTS /grad": r["per_grad"] / nuts["per_grad"],
                         "µs/iteration": r["us_per_iteration"], "µs/grad": r["us_per_grad"],
                         "÷ NUTS µs/leapfrog": r["us_per_grad"] / nuts["us_per_grad"],
                         "bare µs/grad": bare, "R-hat": r["max_rhat"],
                         "NUTS R-hat": nuts["max_rhat"], "min ESS": r["min_ess"],
                         "NUTS min ESS": nuts["min_ess"], "chain s": r["chain_seconds"],
                         "tuner share": r["tuner_share"],
                         "NUTS chain s": nuts["chain_seconds"]})
    header = (f"# Samplers vs CmdStan NUTS\n\n"
              f"`python benchmarks/bench_samplers.py --models {args.models} --samplers "
              f"{args.samplers} --warmup {args.warmup} --draws {args.draws} --mh-factor "
              f"{args.mh_factor} --chains {args.chains} --seed {args.seed}"
              + "".join(f" --option {o}" for o in args.option) + "`; NUTS at "
              "CmdStan's defaults (1000 + 1000). "
              "Ratios measured in one run, warmup included; time is chain-seconds (summed "
              "over chains).\n\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    table = to_markdown(pd.DataFrame(rows), floatfmt=".3g", index=False)
    out.with_suffix(".md").write_text(header + table + "\n")
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
