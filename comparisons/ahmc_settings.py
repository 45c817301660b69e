"""AHMC under different settings, side by side: min bulk ESS per gradient (warmup
included), per second, worst R-hat and the share of gradients spent in warmup, as medians
over seeds and ratios to the first setting, how many runs have an R-hat above 1.01 and how
many were extended (``tune_and_sample``'s ``extend``: twice the draws, so the warmup's
share falls; ``extend=false`` in a setting compares the warmups alone).

    python comparisons/ahmc_settings.py --settings "warmup=null" \\
        "warmup=700,scale_fraction=0.7143" [--models gauss2d,neal100,...] [--seeds 1,2,3]
        [--chains 4] [--draws 1000]

A setting is ``key=value`` pairs (values read as JSON, else strings) passed to
``tune_and_sample`` (``warmup``, ``scale_fraction``, ``metric``, ...); without ``warmup``
(or with ``warmup=null``) AHMC runs its own default.  A key with a dot names a module
constant of ``ahmc_stan`` instead (``ahmc_stan.tuning.hmc_warmup.EARLY_WINDOW_MAX_DIMS=99``),
set for that setting's runs and restored after them (the kept chain workers see the
change and are forked again).  Models are those of
``comparisons/nuts_peers.py`` (the suite's and the two uncentred regressions).  No NUTS
runs here: ``nuts_peers.py`` compares with it.  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_peers import REGRESSIONS, SUITE, load  # noqa: E402

import ahmc_stan  # noqa: E402


def parse_setting(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value.strip()
    return out


@contextlib.contextmanager
def constants(setting: dict):
    """The setting's module constants (keys with a dot) set, restored on leaving."""
    saved = []
    try:
        for key, value in setting.items():
            if "." in key:
                module, _, name = key.rpartition(".")
                if not module.startswith("ahmc_stan"):
                    raise ValueError(f"{key}: not a constant of ahmc_stan")
                target = importlib.import_module(module)
                saved.append((target, name, getattr(target, name)))
                setattr(target, name, value)
        yield
    finally:
        for target, name, value in reversed(saved):
            setattr(target, name, value)


def run(model, setting: dict, seed: int, chains: int, draws: int) -> dict:
    options = {"warmup": None, "draws": draws,
               **{k: v for k, v in setting.items() if "." not in k}}
    with warnings.catch_warnings(), constants(setting):
        warnings.simplefilter("ignore")
        fit = ahmc_stan.tune_and_sample(model, chains=chains, seed=seed, progress=False,
                                        diagnose=False, **options)
    e = fit.efficiency()
    grads = e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]
    extended = bool((fit.metadata.get("extension") or {}).get("extended"))
    rerun = bool((fit.metadata.get("metric_rerun") or {}).get("ran"))  # not if E-BFMI low
    return {"per_grad": e["min_ess_per_grad_total"], "per_s": e["min_ess_per_s_total"],
            "rhat": e["max_rhat"], "warmup_share": e["n_grad_equiv_warmup"] / grads,
            "extended": float(extended), "rerun": float(rerun)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", required=True)
    ap.add_argument("--models", default=",".join(m for m in SUITE + list(REGRESSIONS)
                                                 if m not in ("caravan", "sv", "lgcp")))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--draws", type=int, default=1000)
    args = ap.parse_args(argv)
    settings = [parse_setting(s) for s in args.settings]
    seeds = [int(s) for s in args.seeds.split(",")]
    print("| model | " + " | ".join(args.settings) + " |")
    print("|---|" + "---:|" * len(settings))
    ratios, every_run = [[] for _ in settings], []
    for name in args.models.split(","):
        model = load(name)
        cells, base = [], None
        for j, setting in enumerate(settings):
            runs = [run(model, setting, seed, args.chains, args.draws) for seed in seeds]
            every_run += [(name, args.settings[j], seed, r) for seed, r in zip(seeds, runs)]
            med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
            base = base or med
            ratios[j].append(med["per_grad"] / base["per_grad"])
            cells.append(f"{med['per_grad']:.3g} ({med['per_grad'] / base['per_grad']:.2f}×) "
                         f"/ {med['per_s']:.3g} / R̂ {max(r['rhat'] for r in runs):.3f} "
                         f"({sum(r['rhat'] > 1.01 for r in runs)} > 1.01) / "
                         f"{med['warmup_share']:.2f} / "
                         f"{sum(r['extended'] > 0 for r in runs)} ext.")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print("| geometric mean of the ratios | " + " | ".join(
        f"{np.exp(np.mean(np.log(r))):.2f}×" for r in ratios) + " |")
    print("\nCells: min ESS per gradient, warmup included (÷ the first setting) / per second "
          "/ worst R-hat (runs above 1.01) / warmup's share of gradients / runs extended "
          "(twice the draws, over which the warmup is then spread; `extend=false` leaves "
          "them out); medians over seeds " + args.seeds)
    print("\nEach run: model / setting / seed: min ESS per gradient, R-hat, warmup's share, "
          "extended, metric rerun")
    for name, setting, seed, r in every_run:
        print(f"- {name} / {setting} / {seed}: {r['per_grad']:.3g}, {r['rhat']:.3f}, "
              f"{r['warmup_share']:.2f}, {'yes' if r['extended'] else 'no'}, "
              f"{'yes' if r['rerun'] else 'no'}")


if __name__ == "__main__":
    main()
