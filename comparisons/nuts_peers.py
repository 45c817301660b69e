"""AHMC against the best NUTS: CmdStan's NUTS, nutpie (diagonal) and nutpie (low rank),
side by side in one run (issue "Beat the best NUTS"):

    python comparisons/nuts_peers.py [--seeds 1,2,3] [--models gauss2d,neal100,...]
                                     [--chains 4] [--warmup 1000 | --own-warmup]
                                     [--draws 1000] [--peers nuts,nutpie,nutpie_lowrank]
    python comparisons/nuts_peers.py --merge RUN1.json,RUN2.json --out OUT

Models: the suite's (``ahmc_stan.suite.EXPERIMENTS``: 2-d ρ = 0.99, Neal's 100-d, the
51-d GP covariance, Pima, Ripley, breast cancer, Caravan, SV, LGCP), the two latent fields
at other sizes (``sv<T>``, ``lgcp<d>``: e.g. ``sv150``, ``lgcp16``) and two real
regressions on an uncentred predictor (``linear_regression.stan``: New Haven temperature
on the year, child on mid-parent height; intercept–slope correlation > 0.99); any model
of the robustness suite by its name there (``comparisons/robustness/models.py``).  Samplers:
AHMC with each metric (``ahmc_low_rank``: the default as a user gets it, ``metric="auto"``
with its metric rerun, which is ``low_rank`` up to 200 parameters at 1000 warmup
iterations and Stan's ``diag`` beyond; ``ahmc_low_rank_no_rerun``: ``low_rank`` named,
so without the rerun; ``fisher``: from draws and gradients;
``diag``: Stan's, from draws; ``ahmc_diag_095``: the same, its dual averaging aiming at
an acceptance statistic of 0.95; ``ahmc_grad_init``: ``low_rank`` whose first window runs
in ``1/|∇ log p(x₀)|``, ``grad_init=True``; ``ahmc_no_extend``: the default without
its extension, ``extend=False``; ``ahmc_unchecked``: the default without any of the
decisions after its chains, the slow-chain rule, the metric rerun and the extension,
which measures what they cost a call), CmdStan NUTS, nutpie, nutpie low-rank; same
chains, iterations and seeds; with ``--own-warmup`` each at its own default number of
warmup iterations instead (AHMC's ``ahmc_stan.sampling.STAN_WARMUP``, or 500 where its first
chain finds the posterior Gaussian, ``ahmc_stan.tuning.fast_warmup``; CmdStan's 1000,
nutpie's own).  For each model and
sampler the median over seeds of min bulk ESS per gradient *warmup included* and per
second (warmup included: of the call's wall time, what the user waits, and of the chains'
own time, chain-seconds; ``report`` says what each leaves out), their ratio to the best of
the three NUTS, and the worst R-hat;
also min tail and folded ESS per gradient, the spread's counterparts, and for our
samplers a bootstrap interval of the ratios per gradient and per call second
(:func:`interval`: how far the seeds alone move them); the min bulk ESS per draw kept
and the call's wall time, the two factors of the ratio per call second.
Writes ``comparisons/results/nuts_peers.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np

import ahmc_stan
from ahmc_stan import datasets, workers
from ahmc_stan.comparison import to_markdown
from ahmc_stan.peers import run_peer
from ahmc_stan.sampling import STAN_WARMUP
from ahmc_stan.tuning.fast_warmup import WARMUP as FAST_WARMUP
from ahmc_stan.suite import EXPERIMENTS

sys.path.insert(0, str(Path(__file__).resolve().parent))
import robustness  # noqa: E402  (comparisons/robustness.py: its models and fallback count)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "comparisons" / "results"
SUITE = ["gauss2d", "neal100", "gp51", "pima", "ripley", "breast_cancer", "caravan", "sv",
         "lgcp"]
REGRESSIONS = {"nhtemp": "New Haven temperature on the year (1912–1971)",
               "galton": "child on mid-parent height, inches (Galton)"}
#: ``ahmc_low_rank`` is AHMC's default as a user gets it: its metric is ``auto`` (``low_rank``
#: where the last metric window has as many draws as parameters, else ``diag``) and,
#: since the call does not name one, the metric rerun applies to its ``low_rank`` fits
#: (naming the metric would turn it off; ``ahmc_low_rank_no_rerun`` measures that).
OURS = {"ahmc_diag": {"metric": "diag"}, "ahmc_fisher": {"metric": "fisher"},
        "ahmc_diag_095": {"metric": "diag", "adapt_delta": 0.95},
        "ahmc_low_rank": {}, "ahmc_low_rank_no_rerun": {"metric": "low_rank"},
        "ahmc_grad_init": {"metric": "low_rank", "grad_init": True},
        "ahmc_no_extend": {"extend": False},
        "ahmc_unchecked": {"extend": False, "metric_rerun": False, "chain_rerun": False},
        "ahmc_pooled": {"pool_windows": True},
        "ahmc_low_rank_forked": {}}
#: Ours run with chain workers forked for every call (``ahmc_stan.workers.KEEP = False``),
#: as before stop 68, to measure what keeping them gains side by side.
FORKED = {"ahmc_low_rank_forked"}
PEERS = ["nuts", "nutpie", "nutpie_lowrank"]


def sized(name: str):
    """``sv<T>`` (SV on a simulated series of length T: T + 3 parameters) or ``lgcp<d>``
    (the LGCP on a d × d grid: d² parameters), the suite's two latent fields at other
    sizes, or None."""
    match = re.fullmatch(r"(sv|lgcp)(\d+)", name)
    if match is None:
        return None
    size = int(match.group(2))
    if match.group(1) == "sv":
        return ("stochastic_volatility.stan", datasets.stochastic_volatility_data(T=size, seed=1))
    return ("lgcp.stan", datasets.lgcp_data(d=size, seed=1))


def load(name: str):
    other_size = sized(name)
    if other_size is not None:
        stan_file, data = other_size
        return ahmc_stan.StanModel(ROOT / "stan_models" / stan_file, data)
    if name in REGRESSIONS:
        return ahmc_stan.StanModel(ROOT / "stan_models" / "linear_regression.stan",
                                   datasets.uncentred_regression_data(name))
    if name not in EXPERIMENTS:  # a model of the robustness suite (comparisons/robustness/)
        entry = robustness.load_registry().BY_NAME[name]
        return ahmc_stan.StanModel(entry.stan_file, entry.data())
    exp = EXPERIMENTS[name]
    return ahmc_stan.StanModel(ROOT / "stan_models" / exp.stan_file, exp.data(False))


def run_one(model, sampler: str, run: dict) -> dict:
    start = time.perf_counter()
    run = {k: v for k, v in run.items() if v is not None}  # warmup None: the sampler's own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if sampler in OURS:
            keep, workers.KEEP = workers.KEEP, sampler not in FORKED
            try:
                fit = ahmc_stan.tune_and_sample(model, progress=False, diagnose=False,
                                                **OURS[sampler], **run)
            finally:
                workers.KEEP = keep
        else:
            fit = run_peer(sampler, model, diagnose=False, **run)
    call = time.perf_counter() - start  # the seconds the user waits for the Fit
    fit.summary()  # what a user of cmdstanpy calls next: ESS, R-hat, MCSE of every column
    checked = time.perf_counter() - start  # ... and for that table
    e = fit.efficiency()
    grads = e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]
    folded = float(np.min(az.ess(az.convert_to_dataset({"x": fit.params}),
                                 method="folded")["x"].values))
    return {"min_ess": e["min_ess_bulk"], "per_grad": e["min_ess_per_grad_total"],
            "per_s": e["min_ess_per_s_total"], "max_rhat": e["max_rhat"],
            "call_seconds": call, "per_call_s": e["min_ess_bulk"] / call,
            "summary_seconds": checked - call, "per_checked_s": e["min_ess_bulk"] / checked,
            "min_ess_tail": e["min_ess_tail"],
            "per_grad_tail": e["min_ess_tail"] / grads if grads else math.nan,
            "min_ess_folded": folded,
            "per_grad_folded": folded / grads if grads else math.nan,
            # kept draws, all chains (an extended AHMC fit keeps twice the draws)
            "per_draw": e["min_ess_bulk"] / (fit.params.shape[0] * fit.params.shape[1]),
            "warmup_share": e["n_grad_equiv_warmup"] / grads if grads else math.nan,
            "extended": float(fit.metadata.get("extension", {}).get("extended", False)),
            # AHMC's metric rerun (a discarded run, charged to warmup) and its chains'
            # metric fallbacks (a scale phase run again); 0 for the NUTS
            "metric_rerun": float(bool((fit.metadata.get("metric_rerun") or {}).get("ran"))),
            "metric_fallbacks": float(robustness.metric_fallbacks(fit.metadata)),
            # AHMC's slow chains sampled again in another chain's parameters; 0 for NUTS
            "slow_chains": float(sum(e["adopted"] for e in (
                fit.metadata.get("slow_chains") or {}).get("runs", []))),
            "wall": time.perf_counter() - start}


def summarise(runs: dict, peers: list) -> dict:
    """Each sampler's medians over its ``runs`` (a list per sampler, one per seed; the
    R-hat the worst), and the best of the ``peers``' medians by each measure."""
    med = {s: {k: float(np.median([r[k] for r in rs])) for k in rs[0]
               if all(k in r for r in rs)}  # runs of older code lack newer measures
           for s, rs in runs.items()}
    for s, rs in runs.items():
        med[s]["max_rhat"] = float(max(r["max_rhat"] for r in rs))
    best = {k: max(med[p][k] for p in peers)
            for k in ("per_grad", "per_s", "per_call_s", "per_checked_s", "per_grad_tail",
                      "per_grad_folded")
            if all(k in med[p] for p in peers)}  # runs of older code lack newer measures
    return {"runs": runs, "median": med, "best_nuts": best}


#: Resamples and level of :func:`interval`.
BOOTSTRAP, LEVEL = 2000, 0.9


def interval(runs: dict, sampler: str, peers: list, key: str, seed: int = 0
             ) -> tuple[float, float]:
    """The ``LEVEL`` bootstrap interval of ``sampler``'s median of ``key`` over its runs ÷
    the best of the ``peers``' medians, the seeds resampled together (a seed's samplers
    ran back to back, so a slow spell of the machine falls on all of them); the runs of
    each sampler resampled on their own where their numbers differ.  Fixed ``seed``: the
    same runs give the same interval."""
    rng = np.random.default_rng(seed)
    values = {s: np.array([r[key] for r in runs[s]], dtype=float) for s in [sampler, *peers]}
    n = {s: len(v) for s, v in values.items()}
    paired = len(set(n.values())) == 1
    ratios = np.empty(BOOTSTRAP)
    for b in range(BOOTSTRAP):
        idx = rng.integers(0, n[sampler], n[sampler]) if paired else None
        med = {s: np.median(v[idx if paired else rng.integers(0, n[s], n[s])])
               for s, v in values.items()}
        ratios[b] = med[sampler] / max(med[p] for p in peers)
    low, high = np.quantile(ratios, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high)


def merge(files: list[Path]) -> dict:
    """The models of earlier runs' ``files``, each model's runs at all their seeds
    together (its chains, warmup and draws must agree; the samplers and NUTS those that
    every file ran), summarised again (:func:`summarise`)."""
    parts: dict[str, list[dict]] = {}
    for f in files:
        for name, row in json.loads(f.read_text())["models"].items():
            parts.setdefault(name, []).append(row)
    rows = {}
    for name, found in parts.items():
        settings = [{k: v for k, v in r["settings"].items() if k not in ("seeds", "peers")}
                    for r in found]
        if any(s != settings[0] for s in settings):
            raise SystemExit(f"{name}: the runs differ in their settings: {settings}")
        samplers = [s for s in found[0]["runs"] if all(s in r["runs"] for r in found)]
        peers = [p for p in PEERS if p in samplers]
        seeds = [seed for r in found for seed in r["settings"]["seeds"]]
        if len(set(seeds)) < len(seeds):
            raise SystemExit(f"{name}: a seed is in more than one run: {seeds}")
        runs = {s: [x for r in found for x in r["runs"][s]] for s in samplers}
        rows[name] = {"dims": found[0]["dims"], **summarise(runs, peers),
                      "settings": {**settings[0], "seeds": seeds,
                                   **({} if peers == PEERS else {"peers": peers})},
                      "wall_seconds": sum(r.get("wall_seconds", 0.0) for r in found)}
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--models", default=",".join(SUITE + list(REGRESSIONS)))
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--own-warmup", action="store_true",
                        help="each sampler at its own default warmup (not --warmup)")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--samplers", default=",".join(list(OURS) + PEERS),
                        help="which of ours to run")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="which NUTS to run, the best of which the ratios are over "
                             "(default all three; fewer only where the others are known "
                             "to lose, as nutpie's two on Caravan)")
    parser.add_argument("--out", default=str(RESULTS / "nuts_peers"))
    parser.add_argument("--merge", default="",
                        help="instead of running: the .json files of earlier runs (one "
                             "model at other seeds each, as runs made seed by seed), "
                             "comma-separated, merged and written to --out")
    args = parser.parse_args(argv)
    if args.merge:
        rows = merge([Path(f) for f in args.merge.split(",") if f.strip()])
        write(Path(args.out), rows)
        print(report(rows))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    chosen = {x.strip() for x in args.samplers.split(",")}
    peers = [p for p in PEERS if p in {x.strip() for x in args.peers.split(",")}]
    if not peers:
        parser.error(f"--peers: none of {PEERS}")
    samplers = [x for x in OURS if x in chosen] + peers
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(out.with_suffix(".json").read_text()) \
        if out.with_suffix(".json").exists() else {"models": {}}
    rows = previous["models"]  # models run before (with their own settings) are kept
    warmup = None if args.own_warmup else args.warmup  # None: each sampler's own
    for name in models:
        start = time.perf_counter()
        model = load(name)
        runs = {s: [] for s in samplers}
        for seed in seeds:  # the samplers in turn at each seed: a slow spell of the shared
            for s in samplers:  # machine falls on all of them, not on one's seeds
                runs[s].append(run_one(model, s, dict(chains=args.chains, warmup=warmup,
                                                      draws=args.draws, seed=seed)))
        rows[name] = {"dims": model.dims, **summarise(runs, peers),
                      "settings": {"chains": args.chains,
                                   "warmup": "own" if args.own_warmup else args.warmup,
                                   "draws": args.draws, "seeds": seeds,
                                   **({} if peers == PEERS else {"peers": peers})},
                      "wall_seconds": time.perf_counter() - start}
        med, best = rows[name]["median"], rows[name]["best_nuts"]
        print(f"{name}: " + ", ".join(
            f"{s} {med[s]['per_grad'] / best['per_grad']:.2f}×/grad "
            f"{med[s]['per_s'] / best['per_s']:.2f}×/chain-s "
            f"{med[s]['per_call_s'] / best['per_call_s']:.2f}×/s of the call "
            f"{med[s]['per_checked_s'] / best['per_checked_s']:.2f}×/s with summary() "
            f"R-hat {med[s]['max_rhat']:.3f}" for s in samplers), flush=True)
        write(out, rows)
    print(report(rows))


def write(out: Path, rows: dict) -> None:
    """``rows`` to ``out``'s .json and, as :func:`report`, its .md."""
    out.with_suffix(".json").write_text(json.dumps({"models": rows}, indent=1))
    out.with_suffix(".md").write_text(report(rows))


def _peers(row: dict) -> list:
    """The NUTS a model's ratios are over (its settings' ``peers``, else all three)."""
    return row.get("settings", {}).get("peers", PEERS)


def report(rows: dict) -> str:
    import pandas as pd

    lines = ["# AHMC against the best NUTS\n",
             "Command: `python comparisons/nuts_peers.py --models M --seeds S --warmup W "
             "--draws D` (each model's chains, iterations and seeds in the last table; warmup "
             "\"own\": `--own-warmup`, each sampler at its own default: AHMC "
             f"{STAN_WARMUP}, or {FAST_WARMUP} where its first chain finds the posterior "
             "Gaussian; CmdStan 1000; nutpie 400, low rank 800). Min bulk ESS "
             "per gradient and per second, warmup included, as ratios to the best of CmdStan "
             "NUTS, nutpie and nutpie low-rank on that model (1 = the best NUTS; a model "
             "run with `--peers` is over those its settings name); medians "
             "over seeds; worst R-hat over seeds. Two kinds of seconds, both measured side "
             "by side in one run on the shared 2-core machine: the call's wall time (from "
             "calling `tune_and_sample`, cmdstanpy's `sample` or `nutpie.sample` to holding "
             "the Fit: what the user waits, the sampler's fixed costs of a call included: "
             "worker processes, AHMC's decisions between its runs, CmdStan's processes and "
             "CSV files) and chain-seconds (each chain's own time, summed: AHMC's and "
             "CmdStan's as they measure them, which leave out those fixed costs; nutpie "
             "reports none, so its chain-seconds are its call's wall time times the chains "
             "run at once, its fixed costs included, which favours the others on small "
             "models). For the spread, the tail ESS "
             "(ArviZ's, as cmdstanpy's summary reports it: of the 5 % and 95 % quantiles) "
             "and the folded ESS (of |x − median|, whose split R-hat is half of the R-hat "
             "ArviZ reports), each against the best NUTS by that measure; the R-hat of a "
             "fixed number of draws follows the folded ESS itself, not per gradient.\n"]
    samplers = list(dict.fromkeys(s for row in rows.values() for s in row["median"]))

    def section(title: str, cell, floatfmt: str = ".3g") -> None:
        """One table: a row per model, ``cell(name, row)`` its columns."""
        df = pd.DataFrame.from_dict({name: cell(name, row) for name, row in rows.items()},
                                    orient="index")
        df.index.name = "model"
        for listed in ("seeds", "peers"):
            if listed in df:
                df[listed] = df[listed].astype(str)
        lines.extend([f"\n## {title}\n", to_markdown(df, floatfmt=floatfmt)])

    def per_sampler(field: str, scale: float = 1.0):
        return lambda name, row: {s: scale * row["median"].get(s, {}).get(field, float("nan"))
                                  for s in samplers}

    for title, key in (("Min ESS per gradient (warmup included)", "per_grad"),
                       ("Min ESS per second of the call's wall time (warmup included)",
                        "per_call_s"),
                       ("Min ESS per second of the call and `summary()` after it",
                        "per_checked_s"),
                       ("Min ESS per chain-second (warmup included)", "per_s"),
                       ("Min tail ESS per gradient (warmup included)", "per_grad_tail"),
                       ("Min folded ESS per gradient (warmup included)",
                        "per_grad_folded")):
        if not any(key in row["best_nuts"] for row in rows.values()):
            continue  # runs from before the tail ESS was recorded
        section(f"{title} ÷ best NUTS", lambda name, row, key=key: {
            "dims": row["dims"], **{s: row["median"][s][key] / row["best_nuts"][key]
                                    if s in row["median"] and key in row["best_nuts"]
                                    else float("nan") for s in samplers}})
    ours = [s for s in samplers if s not in PEERS]
    for title, key in (("per gradient", "per_grad"), ("per second of the call", "per_call_s")):
        section(f"{100 * LEVEL:.0f} % bootstrap interval of the min ESS {title} ÷ best NUTS "
                "(the seeds resampled)", lambda name, row, key=key: {
                    s: "%.3g–%.3g" % interval(row["runs"], s, _peers(row), key)
                    if s in row["runs"] and all(key in r for r in row["runs"][s])
                    and all(key in r for p in _peers(row) for r in row["runs"][p])
                    else "" for s in ours})
    section("Worst R-hat", per_sampler("max_rhat"), ".3f")
    if any("min_ess_folded" in r for row in rows.values() for r in row["median"].values()):
        section("Min folded ESS (median over seeds; the R-hat follows it)",
                per_sampler("min_ess_folded"), ".0f")
    if any("per_draw" in r for row in rows.values() for r in row["median"].values()):
        section("Min bulk ESS per draw kept (median over seeds; all chains' draws: an "
                "extended AHMC fit keeps twice those asked for)", per_sampler("per_draw"),
                ".2f")
        section("The call's wall time (ms, median over seeds)",
                per_sampler("call_seconds", 1e3), ".0f")
    section("Share of gradients spent in warmup", per_sampler("warmup_share"), ".2f")
    section("Settings", lambda name, row: {
        "dims": row["dims"], **row.get("settings", {}),
        "minutes": row.get("wall_seconds", float("nan")) / 60})
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
