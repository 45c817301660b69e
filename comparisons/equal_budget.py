"""AHMC against CmdStan's NUTS at the same number of gradients, not the same number of draws.

At equal draws (4 chains × 1000 + 1000) AHMC misses R-hat ≤ 1.01 on the stochastic
volatility model where CmdStan's NUTS reaches it, yet it spends a fraction of NUTS's
gradients: its tuned paths are shorter.  R-hat and ESS depend on how much sampling was
done, so this script gives AHMC NUTS's gradient budget.  Per model and seed:

1. CmdStan NUTS, ``chains × (warmup + draws)``: its gradients G (warmup included);
2. AHMC with the same chains, warmup and draws: its warmup gradients W and gradients per
   sampling iteration g;
3. AHMC again with the same seed and ``round((G − W) / g / chains)`` draws per chain (at
   least ``draws``), so that its whole run costs about G gradients.

Reported: gradients, min bulk ESS, ESS per gradient and per second (warmup included) and
worst R-hat of each, and AHMC ÷ NUTS.  One command:
``python comparisons/equal_budget.py --models sv --seeds 1,2,3,4,5`` (results in
``comparisons/results/equal_budget.{json,md}``).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

import ahmc_stan
from ahmc_stan.comparison import to_markdown

from nuts_peers import RESULTS, load


def measure(fit) -> dict:
    e = fit.efficiency()
    return {"grads": float(e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]),
            "warmup_grads": float(e["n_grad_equiv_warmup"]),
            "sampling_grads": float(e["n_grad_equiv_sampling"]),
            "draws": int(fit.n_draws), "min_ess": float(e["min_ess_bulk"]),
            "per_grad": float(e["min_ess_per_grad_total"]),
            "per_s": float(e["min_ess_per_s_total"]), "max_rhat": float(e["max_rhat"])}


def one_seed(model, seed: int, chains: int, warmup: int, draws: int) -> dict:
    run = dict(chains=chains, warmup=warmup, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nuts = measure(ahmc_stan.run_nuts(model, draws=draws, diagnose=False, **run))
        short = measure(ahmc_stan.tune_and_sample(model, draws=draws, progress=False,
                                                  diagnose=False, **run))
        per_iter = short["sampling_grads"] / (chains * short["draws"])
        budget_draws = max(draws, int(round((nuts["grads"] - short["warmup_grads"])
                                            / per_iter / chains)))
        equal = measure(ahmc_stan.tune_and_sample(model, draws=budget_draws, progress=False,
                                                  diagnose=False, **run))
    return {"nuts": nuts, "ahmc_same_draws": short, "ahmc_same_grads": equal}


def report(rows: dict) -> str:
    import pandas as pd

    lines = ["# AHMC against CmdStan NUTS at the same gradient budget", "",
             "Command: `python comparisons/equal_budget.py --models M --seeds S` "
             "(`comparisons/equal_budget.py`'s docstring).  Per gradient and per second "
             "with warmup included; seconds are chain-seconds, the three runs one after "
             "another in one process.", ""]
    for name, row in rows.items():
        table = []
        for seed, runs in row["seeds"].items():
            for label, r in runs.items():
                table.append({"seed": seed, "run": label, "draws": r["draws"],
                              "gradients": f"{r['grads']:.3g}", "min_ess": round(r["min_ess"]),
                              "per_grad": r["per_grad"], "per_s": r["per_s"],
                              "max_rhat": f"{r['max_rhat']:.3f}",
                              "per grad / NUTS": r["per_grad"] / runs["nuts"]["per_grad"],
                              "per s / NUTS": r["per_s"] / runs["nuts"]["per_s"]})
        settings = row["settings"]
        lines += [f"## {name}: {settings['chains']} chains, {settings['warmup']} warmup, "
                  f"NUTS {settings['draws']} draws ({row['wall_seconds'] / 60:.0f} min)", "",
                  to_markdown(pd.DataFrame(table), floatfmt=".3g", index=False), ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="sv")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--out", default=str(RESULTS / "equal_budget"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    rows = json.loads(out.with_suffix(".json").read_text()) \
        if out.with_suffix(".json").exists() else {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        start = time.perf_counter()
        model = load(name)
        seeds = {}
        for seed in [int(s) for s in args.seeds.split(",")]:
            seeds[str(seed)] = r = one_seed(model, seed, args.chains, args.warmup, args.draws)
            print(f"{name} seed {seed}: NUTS {r['nuts']['grads']:.3g} grads R-hat "
                  f"{r['nuts']['max_rhat']:.3f}; AHMC same draws {r['ahmc_same_draws']['grads']:.3g}"
                  f" R-hat {r['ahmc_same_draws']['max_rhat']:.3f}; same grads "
                  f"{r['ahmc_same_grads']['grads']:.3g} ({r['ahmc_same_grads']['draws']} draws) "
                  f"R-hat {r['ahmc_same_grads']['max_rhat']:.3f}", flush=True)
        rows[name] = {"seeds": seeds, "wall_seconds": time.perf_counter() - start,
                      "settings": {"chains": args.chains, "warmup": args.warmup,
                                   "draws": args.draws}}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
        out.with_suffix(".md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
