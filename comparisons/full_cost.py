"""The full mode's cost, estimated: ``python comparisons/full_cost.py``.

Prints one row per (experiment × sampler) of the full configuration
(``ahmc_stan.suite.registry.FULL``): chains, iterations, repeats and the estimated
seconds, then the total and the wall time on ``--workers`` processes (the suite's own
order: costliest jobs first, each worker taking the next job).

The estimate extrapolates short measured runs (one chain each, in this process, one after
another), kept in ``results/full_cost.json``: seconds per warmup and per sampling
iteration, and the rest of a chain's job (start, efficiency, CmdStan's start and output),
split by a second run with 4× the draws into a fixed part and a part per draw; each
scaled by the run's share of a core (CPU time ÷ wall time, at most 1), so that a
measurement on a busy machine estimates an idle one.
``--measure`` measures the rows missing from that file (``--remeasure``: every row, or
those of ``--experiments``/``--samplers``; ``--rest``: only the second runs).
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from ahmc_stan.suite.registry import (FULL, available_specs, experiments,  # noqa: E402
                                      full_runs)

STORE = HERE / "results" / "full_cost.json"

#: Iterations (warmup, draws) of a measurement run: one chain.
SHORT = {"hmc": (200, 200), "mh": (2000, 2000)}


#: Shorter still where an iteration takes seconds.
SHORTER = {("lgcp", "armhmc"): (30, 30)}


def _short(name: str, label: str) -> tuple[int, int]:
    return SHORTER.get((name, label)) or \
        SHORT["mh" if available_specs()[label].iteration_factor > 1 else "hmc"]


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (CmdStan)."""
    import resource

    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def measure(name: str, label: str, log=print) -> dict:
    """One chain of ``label`` on experiment ``name`` (the full mode's data), short."""
    from ahmc_stan.stan_models import stan_file
    from ahmc_stan.suite.jobs import Job, _ess_columns, run_job
    from ahmc_stan.model import StanModel
    from ahmc_stan.nuts import compile_cmdstan_model

    exp = experiments()[name]
    start = time.perf_counter()
    model = StanModel(stan_file(exp.stan_file), exp.data(FULL[name]["data"] == "full"))
    compile_cmdstan_model(model.stan_file)
    prepare = time.perf_counter() - start
    warmup, draws = _short(name, label)
    job = Job(name, exp.group, available_specs()[label], 0, 1, 1, warmup, draws, model,
              _ess_columns(model, exp.ess_prefixes))
    cpu = _cpu_seconds()
    row = run_job(job)["row"]
    cpu = _cpu_seconds() - cpu
    if row["error"]:
        raise RuntimeError(f"{name} {label}: {row['error']}")
    # on a shared machine the run gets part of a core: scale its times to a core of its own
    busy = min(cpu / row["wall_seconds"], 1.0)
    tw, ts = busy * float(row["time_warmup"]), busy * float(row["time_sampling"])
    if label == "bandit":  # a super-transition straddles the end of warmup: time it whole
        per = (tw + ts) / (warmup + draws)
        tw, ts = per * warmup, per * draws
    out = {"warmup": warmup, "draws": draws, "dims": model.dims,
           "s_per_warmup_iter": tw / warmup, "s_per_draw": ts / draws,
           "rest_seconds": max(busy * row["wall_seconds"] - tw - ts, 0.0),
           "wall_seconds": row["wall_seconds"], "cpu_share": busy,
           "prepare_seconds": prepare,
           "load_average": os.getloadavg()[0],
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    log(f"  {name:>13} {label:>13}: {row['wall_seconds']:.1f} s "
        f"({1e3 * out['s_per_warmup_iter']:.3g} / {1e3 * out['s_per_draw']:.3g} ms per "
        f"warmup / sampling iteration)")
    return out


#: A second run, with 4× the draws, measures how the rest grows with the draws, unless
#: its sampling would take longer than this (then the rest is taken as per draw).
REST_RUN_SECONDS = 90.0


def measure_rest(name: str, label: str, m: dict, log=print) -> dict:
    """Split ``m["rest_seconds"]`` into a fixed part and a part per draw (ESS over the
    measured columns, CmdStan's output) from a second run of the same warmup and 4× the
    draws; where that run would be long, the whole rest counts per draw."""
    from ahmc_stan.stan_models import stan_file
    from ahmc_stan.suite.jobs import Job, _ess_columns, run_job
    from ahmc_stan.model import StanModel

    warmup, draws = m["warmup"], 4 * m["draws"]
    cost = warmup * m["s_per_warmup_iter"] + draws * m["s_per_draw"]
    rest = m["rest_seconds"]
    if cost > REST_RUN_SECONDS:
        return {**m, "rest_fixed": 0.0, "rest_per_draw": rest / m["draws"]}
    exp = experiments()[name]
    model = StanModel(stan_file(exp.stan_file), exp.data(FULL[name]["data"] == "full"))
    job = Job(name, exp.group, available_specs()[label], 0, 1, 1, warmup, draws, model,
              _ess_columns(model, exp.ess_prefixes))
    cpu = _cpu_seconds()
    row = run_job(job)["row"]
    busy = min((_cpu_seconds() - cpu) / row["wall_seconds"], 1.0)
    rest4 = max(busy * (row["wall_seconds"] - row["time_warmup"] - row["time_sampling"]),
                0.0)
    slope = max((rest4 - rest) / (draws - m["draws"]), 0.0)
    log(f"  {name:>13} {label:>13}: rest {rest:.2f} s at {m['draws']} draws, "
        f"{rest4:.2f} s at {draws}")
    return {**m, "rest_fixed": max(rest - slope * m["draws"], 0.0), "rest_per_draw": slope,
            "rest_draws4_seconds": rest4}


def job_seconds(m: dict, chains: int, warmup: int, draws: int) -> float:
    """One job (``chains`` chains, one after another) from a measurement ``m``."""
    fixed, per_draw = m.get("rest_fixed", m["rest_seconds"]), m.get("rest_per_draw", 0.0)
    return chains * (warmup * m["s_per_warmup_iter"] + draws * m["s_per_draw"]
                     + fixed + draws * per_draw)


def schedule(costs: list[float], workers: int) -> float:
    """Wall time of jobs taken in this order by ``workers`` processes."""
    free = [0.0] * workers
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def estimate(store: dict, workers: int = 2) -> dict:
    """Rows (experiment, sampler, chains, warmup, draws, repeats, seconds) and totals."""
    rows, missing = [], []
    for name, label, chains, warmup, draws, repeats in full_runs():
        m = store.get(name, {}).get(label)
        if m is None:
            missing.append((name, label))
            continue
        one = job_seconds(m, chains, warmup, draws)
        rows.append({"experiment": name, "sampler": label, "chains": chains,
                     "warmup": warmup, "draws": draws, "repeats": repeats,
                     "job_seconds": one, "seconds": one * repeats, "dims": m["dims"]})
    # the suite submits the costliest jobs first by its own rough measure (jobs._cost)
    factor = {label: s.iteration_factor for label, s in available_specs().items()}
    jobs = sorted(((r["dims"] * r["chains"] * (r["warmup"] + r["draws"])
                    / factor[r["sampler"]], r["job_seconds"])
                   for r in rows for _ in range(r["repeats"])), key=lambda t: -t[0])
    prepare = sum(max(m["prepare_seconds"] for m in store[n].values()) for n in FULL
                  if store.get(n))
    total = sum(r["seconds"] for r in rows)
    return {"rows": rows, "missing": missing, "job_seconds": total,
            "prepare_seconds": prepare,
            "wall_seconds": schedule([c for _, c in jobs], workers) + prepare / workers,
            "longest_job": max((c for _, c in jobs), default=0.0), "workers": workers}


def _hms(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 \
        else f"{s:.0f} s"


def print_table(est: dict) -> None:
    print("| experiment | sampler | chains | warmup + draws | repeats | est. seconds |")
    print("|---|---|---:|---:|---:|---:|")
    for r in est["rows"]:
        print(f"| {r['experiment']} | {r['sampler']} | {r['chains']} | "
              f"{r['warmup']} + {r['draws']} | {r['repeats']} | {r['seconds']:.0f} |")
    print()
    print(f"| experiment | jobs | one core | alone on {est['workers']} workers | longest job |")
    print("|---|---:|---:|---:|---:|")
    for name in dict.fromkeys(r["experiment"] for r in est["rows"]):
        costs = sorted((r["job_seconds"] for r in est["rows"] if r["experiment"] == name
                        for _ in range(r["repeats"])), reverse=True)
        print(f"| {name} | {len(costs)} | {_hms(sum(costs))} | "
              f"{_hms(schedule(costs, est['workers']))} | {_hms(costs[0])} |")
    print()
    print(f"jobs: {est['job_seconds']:.0f} s ({_hms(est['job_seconds'])}) of one core; "
          f"models prepared: {est['prepare_seconds']:.0f} s; longest job "
          f"{_hms(est['longest_job'])}")
    print(f"estimated wall time on {est['workers']} workers: {est['wall_seconds']:.0f} s "
          f"({_hms(est['wall_seconds'])})")
    if est["missing"]:
        print(f"not measured: {est['missing']} (python comparisons/full_cost.py --measure)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measure", action="store_true",
                   help="measure the rows missing from results/full_cost.json")
    p.add_argument("--remeasure", action="store_true",
                   help="measure again the selected rows (default: all)")
    p.add_argument("--rest", action="store_true",
                   help="measure again only how each selected row's rest grows with draws")
    p.add_argument("--experiments", default=None, metavar="A,B")
    p.add_argument("--samplers", default=None, metavar="A,B")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    store = json.loads(STORE.read_text()) if STORE.exists() else {}
    pick = lambda text: set(text.split(",")) if text else None  # noqa: E731
    exps, samplers = pick(args.experiments), pick(args.samplers)
    if args.measure or args.remeasure:
        for name, label, *_ in full_runs():
            if (exps and name not in exps) or (samplers and label not in samplers):
                continue
            if label in store.get(name, {}) and not args.remeasure:
                continue
            store.setdefault(name, {})[label] = measure(name, label)
            STORE.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    if args.measure or args.remeasure or args.rest:
        for name, label, *_ in full_runs():
            m = store.get(name, {}).get(label)
            if m is None or ("rest_per_draw" in m and not args.rest):
                continue
            if (exps and name not in exps) or (samplers and label not in samplers):
                continue
            store[name][label] = measure_rest(name, label, m)
            STORE.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    print_table(estimate(store, args.workers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
