"""What a user waits for: the wall time of one call of each sampler, side by side:

    python benchmarks/bench_wall.py [--models std10,pima,neal100,gp51] [--repeats 3]

In one Python process, per model and repeat (the samplers' order rotating): the wall time
of ``tune_and_sample(model, seed=...)`` (AHMC, its defaults), ``run_nuts`` (CmdStan's
NUTS through cmdstanpy: the executable's start, its CSV files read back) and
``run_nutpie`` (nutpie on the same library, default and low-rank), each with 4 chains ×
(1000 + 1000); the chains' own seconds (warmup + sampling, summed over chains) and min
bulk ESS per second of wall time.  Every sampler ran once per model before the timed
repeats (the CmdStan executable built, nutpie's library loaded).  Writes
``benchmarks/results/bench_wall.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.comparison import to_markdown  # noqa: E402
from ahmc_stan.peers import run_nutpie  # noqa: E402
from bench_samplers import load  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

SAMPLERS = {
    "ahmc": lambda m, s: ahmc_stan.tune_and_sample(m, seed=s, progress=False),
    "cmdstan nuts": lambda m, s: ahmc_stan.run_nuts(m, seed=s),
    "nutpie": lambda m, s: run_nutpie(m, seed=s),
    "nutpie low-rank": lambda m, s: run_nutpie(m, seed=s, low_rank=True),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="std10,pima,neal100,gp51")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    warnings.simplefilter("ignore")
    for name in args.models.split(","):
        model = load(name)
        for run in SAMPLERS.values():
            run(model, 1000)  # built, loaded, imported
        names = list(SAMPLERS)
        for r in range(args.repeats):
            for sampler in names[r % len(names):] + names[:r % len(names)]:
                start = time.perf_counter()
                fit = SAMPLERS[sampler](model, r + 1)
                wall = time.perf_counter() - start
                e = fit.efficiency()
                rows.append({"model": name, "sampler": sampler, "repeat": r + 1,
                             "wall s": wall,
                             "chains' own s": float(fit.time_warmup + fit.time_sampling),
                             "min ESS": e["min_ess_bulk"],
                             "min ESS per wall s": e["min_ess_bulk"] / wall})
                print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    med = df.groupby(["model", "sampler"], sort=False).median(numeric_only=True).reset_index()
    med = med.drop(columns="repeat")
    print(to_markdown(med))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_wall"
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    command = "python benchmarks/bench_wall.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    out.with_suffix(".md").write_text(
        "# What a user waits for: one call's wall time\n\n"
        f"`{command.strip()}`, {time.strftime('%Y-%m-%d')}; medians of "
        f"{args.repeats} repeats\n\n" + to_markdown(med) + "\n\n## Every run\n\n"
        + to_markdown(df) + "\n")


if __name__ == "__main__":
    main()
