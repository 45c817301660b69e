"""The Fit's convergence diagnostics, vectorised against ArviZ, alone and in a user's run:

    python benchmarks/bench_diagnostics.py [--models std10,pima,neal100,gp51]
        [--columns 10,100,1000] [--repeats 3] [--seed 1] [--baseline REV]
        [--fits sv,lgcp] [--calls sv]

1. **Alone**: ``rank_diagnostics.diagnostics`` (bulk and tail ESS, rank-normalised
   R-hat, MCSE of mean and sd, every column at once) against ``arviz_diagnostics``
   (ArviZ's own functions, one column at a time) on the same AR(1) draws, 4 chains ×
   1000, at each number of columns: seconds of each (ArviZ warm, after one call) and the
   largest relative difference.  With ``--baseline REV`` (a git revision), also
   ``rank_diagnostics.diagnostics`` as it was at REV, timed alternately with today's on
   the same draws (the best of 7 calls each), on AR(1) draws and on AR(1) draws of which
   a fifth repeat the draw before, as a rejected proposal leaves them (ties), for the
   three statistics a run's checks use and for all five, with whether the two give the
   same values bit for bit and their largest relative difference.
2. **A new user's first run**: in a fresh Python process per run, ``import ahmc_stan``,
   the (cached) model, then ``tune_and_sample(model, seed=...)`` with its defaults.
   Reported: that call's wall time, the chains' own seconds (warmup + sampling, summed
   over chains), and the wall time of the whole process from the import on.  Each run
   is done twice, alternately, once as shipped and once with the Fit's diagnostics
   computed by ArviZ as before (``ahmc_stan.fit._diagnostics`` replaced by
   ``arviz_diagnostics`` in that process), ``--repeats`` times.

3. **A large fit's whole diagnosis** (with ``--baseline REV``): one AHMC fit (defaults,
   ``--seed``) of each of ``--fits`` (models of ``comparisons/nuts_peers.py``; default
   the suite's two latent fields, SV with 1003 parameters and the LGCP with 1024),
   pickled; then ``fit.diagnose()`` on it, its cache cleared, in a fresh process of
   today's code, of today's code on one thread and of REV's (a git worktree), in turn,
   ``--repeats`` times each:
   the seconds of the process's first call (as a run diagnoses its fit once, on fresh
   memory) and of the best of its 3 calls, and whether the two reports agree.

4. **A whole call, as a user waits for it** (with ``--baseline REV``):
   ``tune_and_sample(model, seed=--seed)`` of each of ``--calls`` (default SV) in a
   fresh process of today's code and of REV's, alternately, ``--repeats`` times each:
   the call's wall time, the chains' own seconds, the wall time less the chains' share
   of it (chain-seconds over the cores), and whether both gave the same draws.

Writes ``benchmarks/results/bench_diagnostics.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ahmc_stan.comparison import to_markdown  # noqa: E402
from ahmc_stan.rank_diagnostics import (  # noqa: E402
    CONVERGENCE_KEYS, KEYS, _threads, arviz_diagnostics, diagnostics)

RESULTS = ROOT / "benchmarks" / "results"

#: Run in a fresh process: argv = model name, seed, "vectorised" or "arviz".
CHILD = r"""
import json, sys, time, warnings
start = time.perf_counter()
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
import ahmc_stan
if sys.argv[3] == "arviz":
    import ahmc_stan.fit
    from ahmc_stan.rank_diagnostics import arviz_diagnostics
    ahmc_stan.fit._diagnostics = arviz_diagnostics
from bench_samplers import load
model = load(sys.argv[1])
t = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    fit = ahmc_stan.tune_and_sample(model, seed=int(sys.argv[2]), progress=False)
end = time.perf_counter()
print(json.dumps({{"call_s": end - t, "process_s": end - start,
                  "chain_s": float(fit.time_warmup + fit.time_sampling),
                  "min_ess_bulk": float(fit.efficiency()["min_ess_bulk"]),
                  "draws_sum": float(fit.draws.sum()),
                  "params": int(fit.n_params)}}))
"""


def ar1_draws(rng, chains: int, draws: int, columns: int) -> np.ndarray:
    x = rng.standard_normal((chains, draws, columns))
    phi = rng.uniform(-0.5, 0.95, size=columns)
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + np.sqrt(1 - phi ** 2) * x[:, t]
    return x


def alone(columns: list[int], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    arviz_diagnostics(ar1_draws(rng, 4, 100, 2))  # ArviZ's import and first call
    for k in columns:
        x = ar1_draws(rng, 4, 1000, k)
        t0 = time.perf_counter()
        ref = arviz_diagnostics(x)
        t1 = time.perf_counter()
        new = diagnostics(x)
        t2 = time.perf_counter()
        diff = max(float(np.nanmax(np.abs(new[key] - ref[key]) / np.abs(ref[key])))
                   for key in ref)
        rows.append({"columns": k, "arviz_s": t1 - t0, "vectorised_s": t2 - t1,
                     "speed-up": (t1 - t0) / (t2 - t1), "max rel. difference": diff})
    return rows


def with_repeats(rng, x: np.ndarray, fraction: float) -> np.ndarray:
    """``x`` with a ``fraction`` of its draws repeating the draw before (rejections)."""
    x = x.copy()
    for t in np.arange(1, x.shape[1]):
        keep = rng.uniform(size=(x.shape[0], x.shape[2])) < fraction
        x[:, t] = np.where(keep, x[:, t - 1], x[:, t])
    return x


def baseline_module(rev: str):
    """``ahmc_stan/rank_diagnostics.py`` as it was at git revision ``rev``."""
    import importlib.util
    import tempfile

    text = subprocess.run(["git", "show", f"{rev}:ahmc_stan/rank_diagnostics.py"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "rank_diagnostics_baseline.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("rank_diagnostics_baseline", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "ahmc_stan"  # its relative imports: today's package
    spec.loader.exec_module(module)
    return module


def against_baseline(columns: list[int], seed: int, rev: str) -> list[dict]:
    old = baseline_module(rev).diagnostics
    rng = np.random.default_rng(seed)
    rows = []
    for k in columns:
        x = ar1_draws(rng, 4, 1000, k)
        for label, draws in (("AR(1)", x), ("AR(1), 20 % repeated", with_repeats(rng, x, 0.2))):
            for which, keys in (("bulk, tail ESS, R-hat", CONVERGENCE_KEYS),
                                ("all five", KEYS)):
                a, b = old(draws, keys), diagnostics(draws, keys)
                with np.errstate(all="ignore"):
                    diff = max(float(np.nanmax(np.abs(b[key] / a[key] - 1), initial=0.0))
                               for key in a)
                t_old, t_new = [], []
                for _ in range(7):
                    t0 = time.perf_counter()
                    old(draws, keys)
                    t1 = time.perf_counter()
                    diagnostics(draws, keys)
                    t2 = time.perf_counter()
                    t_old.append(t1 - t0)
                    t_new.append(t2 - t1)
                rows.append({"columns": k, "draws": label, "statistics": which,
                             f"{rev} s": min(t_old), "now s": min(t_new),
                             "speed-up": min(t_old) / min(t_new),
                             "same values": all(np.array_equal(a[key], b[key], equal_nan=True)
                                                for key in a),
                             "max rel. difference": diff})
    return rows


#: Run in a fresh process: argv = the pickled fit, "1" for one thread.  Prints seconds
#: and the report.
DIAGNOSE = r"""
import json, pickle, sys, time, warnings
sys.path.insert(0, {root!r})
import ahmc_stan
import ahmc_stan.convergence, ahmc_stan.rank_diagnostics  # imported before the clock starts
if sys.argv[2] == "1":  # today's code on one thread
    ahmc_stan.rank_diagnostics._threads = lambda: 1
fit = pickle.load(open(sys.argv[1], "rb"))
times = []
for _ in range(3):
    fit._diag_cache = None
    t = time.perf_counter()
    report = fit.diagnose()
    times.append(time.perf_counter() - t)
print(json.dumps({{"first_s": times[0], "best_s": min(times), "report": str(report)}}))
"""


#: Run in a fresh process: argv = model name, seed.  Prints the call's seconds.
CALL = r"""
import json, sys, time, warnings
sys.path.insert(0, {root!r}); sys.path.insert(0, {root!r} + "/comparisons")
warnings.simplefilter("ignore")
import ahmc_stan
import ahmc_stan.convergence, ahmc_stan.rank_diagnostics  # imported before the clock starts
from nuts_peers import load
model = load(sys.argv[1])
t = time.perf_counter()
fit = ahmc_stan.tune_and_sample(model, seed=int(sys.argv[2]), progress=False)
wall = time.perf_counter() - t
print(json.dumps({{"wall_s": wall, "chain_s": float(fit.time_warmup + fit.time_sampling),
                  "draws_sum": float(fit.draws.sum())}}))
"""


@contextlib.contextmanager
def worktree(rev: str):
    """A git worktree of ``rev`` in a temporary folder, removed afterwards."""
    import tempfile

    tree = Path(tempfile.mkdtemp()) / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT,
                   capture_output=True, check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       capture_output=True)


def child(code: str, root: Path, *args: str) -> dict:
    """Run ``code`` (formatted with ``root``) in a fresh Python; its last line's JSON."""
    out = subprocess.run([sys.executable, "-c", code.format(root=str(root)), *args],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def whole_calls(models: list[str], seed: int, rev: str, repeats: int) -> list[dict]:
    cores = os.cpu_count() or 1
    rows = []
    with worktree(rev) as tree:
        for name in models:
            for r in range(repeats):
                for label, root in ((("now", ROOT), (rev, tree)) if r % 2 == 0
                                    else ((rev, tree), ("now", ROOT))):
                    got = child(CALL, root, name, str(seed))
                    rows.append({"model": name, "repeat": r + 1, "code": label, **got,
                                 "wall less chains s":
                                     got["wall_s"] - got["chain_s"] / min(cores, 4)})
                    print(rows[-1], flush=True)
    summary = []
    for name in models:
        mine = [r for r in rows if r["model"] == name]
        row = {"model": name}
        for key in ("wall_s", "chain_s", "wall less chains s"):
            for label in (rev, "now"):
                row[f"{key} ({label})"] = float(np.median(
                    [r[key] for r in mine if r["code"] == label]))
        row["same draws"] = len({r["draws_sum"] for r in mine}) == 1
        summary.append(row)
    return summary


def whole_diagnosis(models: list[str], seed: int, rev: str, repeats: int) -> list[dict]:
    import pickle
    import tempfile
    import warnings

    sys.path.insert(0, str(ROOT / "comparisons"))
    import ahmc_stan
    from nuts_peers import load

    tmp = Path(tempfile.mkdtemp())
    rows = []
    with worktree(rev) as tree:
        for name in models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = ahmc_stan.tune_and_sample(load(name), seed=seed, progress=False,
                                                diagnose=False)
            path = tmp / f"{name}.pkl"
            path.write_bytes(pickle.dumps(fit))
            variants = [("now", ROOT, "0"), ("now, one thread", ROOT, "1"), (rev, tree, "0")]
            for r in range(repeats):
                for label, root, one in variants[r % 3:] + variants[:r % 3]:
                    got = child(DIAGNOSE, root, str(path), one)
                    rows.append({"model": name, "columns": fit.draws.shape[2],
                                 "repeat": r + 1, "code": label,
                                 "first s": got["first_s"], "best s": got["best_s"],
                                 "report": got["report"]})
                    print({k: v for k, v in rows[-1].items() if k != "report"}, flush=True)
    summary = []
    for name in models:
        mine = [r for r in rows if r["model"] == name]
        row = {"model": name, "columns": mine[0]["columns"]}
        for key in ("first s", "best s"):
            then = np.median([r[key] for r in mine if r["code"] == rev])
            row[f"{key[:-2]}: {rev} s"] = float(then)
            for label in ("now", "now, one thread"):
                now = np.median([r[key] for r in mine if r["code"] == label])
                row[f"{key[:-2]}: {label} s"] = float(now)
                row[f"{key[:-2]}: speed-up ({label})"] = float(then / now)
        row["same report"] = len({r["report"] for r in mine}) == 1
        summary.append(row)
    return summary


def user_run(model: str, seed: int, how: str) -> dict:
    code = CHILD.format(root=str(ROOT), bench=str(ROOT / "benchmarks"))
    out = subprocess.run([sys.executable, "-c", code, model, str(seed), how],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="std10,pima,neal100,gp51")
    ap.add_argument("--columns", default="10,100,1000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--baseline", default=None,
                    help="a git revision whose diagnostics to time beside today's")
    ap.add_argument("--fits", default="sv,lgcp",
                    help="models whose whole diagnosis to time (with --baseline)")
    ap.add_argument("--calls", default="sv",
                    help="models whose whole tune_and_sample to time (with --baseline)")
    args = ap.parse_args(argv)
    first = alone([int(c) for c in args.columns.split(",")], args.seed)
    print(to_markdown(pd.DataFrame(first)))
    before = []
    if args.baseline:
        before = against_baseline([int(c) for c in args.columns.split(",")], args.seed,
                                  args.baseline)
        print(to_markdown(pd.DataFrame(before)))
    whole = []
    if args.baseline and args.fits:
        whole = whole_diagnosis(args.fits.split(","), args.seed, args.baseline,
                                args.repeats)
        print(to_markdown(pd.DataFrame(whole)))
    calls = []
    if args.baseline and args.calls:
        calls = whole_calls(args.calls.split(","), args.seed, args.baseline, args.repeats)
        print(to_markdown(pd.DataFrame(calls)))
    runs = []
    for model in [m for m in args.models.split(",") if m]:
        for r in range(args.repeats):
            for how in ("vectorised", "arviz") if r % 2 == 0 else ("arviz", "vectorised"):
                row = {"model": model, "repeat": r + 1, "diagnostics": how,
                       **user_run(model, args.seed, how)}
                print(row, flush=True)
                runs.append(row)
    summary = []
    for model in [m for m in args.models.split(",") if m]:
        mine = {how: [r for r in runs if r["model"] == model and r["diagnostics"] == how]
                for how in ("vectorised", "arviz")}
        med = {how: {k: float(np.median([r[k] for r in rs]))
                     for k in ("call_s", "process_s", "chain_s")} for how, rs in mine.items()}
        summary.append({"model": model, "parameters": mine["vectorised"][0]["params"],
                        "call s (vectorised)": med["vectorised"]["call_s"],
                        "call s (ArviZ)": med["arviz"]["call_s"],
                        "process s (vectorised)": med["vectorised"]["process_s"],
                        "process s (ArviZ)": med["arviz"]["process_s"],
                        "chains' own s": med["vectorised"]["chain_s"],
                        "same draws": all(a["draws_sum"] == b["draws_sum"] for a, b in
                                          zip(mine["vectorised"], mine["arviz"]))})
    print(to_markdown(pd.DataFrame(summary)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_diagnostics"
    out.with_suffix(".json").write_text(json.dumps(
        {"alone": first, "baseline": before, "whole": whole, "calls": calls, "runs": runs,
         "summary": summary}, indent=1))
    command = "python benchmarks/bench_diagnostics.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    out.with_suffix(".md").write_text(
        "# The Fit's diagnostics vectorised, against ArviZ\n\n"
        f"`{command.strip()}`, {time.strftime('%Y-%m-%d')}\n\n"
        "## The five diagnostics alone (4 chains × 1000 AR(1) draws)\n\n"
        + to_markdown(pd.DataFrame(first))
        + (f"\n\n## Against {args.baseline}'s, alternately (best of 7 calls; "
           f"{_threads()} threads now)\n\n" + to_markdown(pd.DataFrame(before))
           if before else "")
        + (f"\n\n## A large fit's `diagnose()`, {args.baseline}'s code against now "
           f"(fresh processes, medians of {args.repeats})\n\n"
           + to_markdown(pd.DataFrame(whole)) if whole else "")
        + (f"\n\n## A whole `tune_and_sample`, {args.baseline}'s code against now "
           f"(fresh processes, alternating, medians of {args.repeats}; the chains' share "
           "of the wall time taken as chain-seconds over min(cores, 4))\n\n"
           + to_markdown(pd.DataFrame(calls)) if calls else "")
        + "\n\n## A new user's first run, medians (fresh process each)\n\n"
        + to_markdown(pd.DataFrame(summary)) + "\n\n## Every run\n\n"
        + to_markdown(pd.DataFrame(runs)) + "\n")


if __name__ == "__main__":
    main()
