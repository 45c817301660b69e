"""Bias over seeds: a sampler run on one model of the robustness suite with many seeds,
each run's mean and sd of every parameter compared with the suite's reference,
z = (est − ref) / sqrt(mcse_est² + mcse_ref²) (ArviZ MCSE, as ``robustness.py``).

    python comparisons/seed_bias.py garch11 [--sampler ahmc] [--seeds 1-20]
        [--options '{"metric": "diag"}'] [--chains 4] [--warmup 1000 | --own-warmup]
        [--draws 1000]

One run's |z| above 5 may be bad luck or a bad run; over seeds, an unbiased sampler with
honest MCSEs gives z's of mean ≈ 0 (± 1/√seeds) and root mean square ≈ 1.  A mean far
from 0 is a bias that R-hat and ESS did not see; a root mean square well above 1 means the
MCSEs (and so the ESS) are over-optimistic.  Each seed's line also gives the run's min
bulk ESS per gradient and per second (``Fit.efficiency()``, warmup included).
``--sampler nuts`` runs CmdStan's NUTS, ``nutpie`` and ``nutpie_lowrank`` nutpie.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import robustness  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.fit import stan_name  # noqa: E402
from ahmc_stan.peers import PEERS, run_peer  # noqa: E402


def _warmup_run(fit) -> str:
    """The warmup the returned fit ran, and the first fit's where a metric rerun replaced
    it (AHMC's fast warmup: ``ahmc_stan.tuning.fast_warmup``)."""
    first = (fit.metadata.get("metric_rerun") or {}).get("first_warmup")
    return f"{fit.metadata.get('warmup')}" + ("" if first is None else f" (first fit {first})")


def seeds_of(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(v) for v in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(v) for v in text.split(",")]


def reference_z(fit, ref: dict) -> list[list[float]]:
    """Per column of the reference ``ref`` (``robustness.reference_path``'s JSON), the z's
    of ``fit``'s mean and sd against the reference's, over both MCSEs."""
    s = fit.summary()
    row = []
    for c in ref["block_columns"]:
        e, r = s.loc[stan_name(c)], ref["columns"][c]
        row.append([robustness._z(e["mean"], r["mean"], e["mcse_mean"], r["mcse_mean"]),
                    robustness._z(e["sd"], r["sd"], e["mcse_sd"], r["mcse_sd"])])
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--sampler", default="ahmc")
    ap.add_argument("--seeds", default="1-20")
    ap.add_argument("--options", default="{}", help="JSON options for tune_and_sample")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--own-warmup", action="store_true",
                    help="the sampler's own default warmup, as a user gets it (not --warmup)")
    ap.add_argument("--draws", type=int, default=1000)
    args = ap.parse_args(argv)
    if args.own_warmup:
        args.warmup = None
    entry = robustness.load_registry().BY_NAME[args.model]
    ref = json.loads(robustness.reference_path(args.model).read_text())
    model = robustness.build_model(entry, entry.data(), cmdstan_fallback=args.sampler == "nuts")
    options = json.loads(args.options)
    columns = ref["block_columns"]
    z = []
    for seed in seeds_of(args.seeds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if args.sampler in PEERS:
                fit = run_peer(args.sampler, model, chains=args.chains, warmup=args.warmup,
                               draws=args.draws, seed=seed, diagnose=False)
            else:
                fit = ahmc_stan.tune_and_sample(model, args.sampler, chains=args.chains,
                                                warmup=args.warmup, draws=args.draws,
                                                seed=seed, progress=False, diagnose=False,
                                                **options)
        row = reference_z(fit, ref)
        z.append(row)
        worst = max(abs(v) for pair in row for v in pair)
        e = fit.efficiency()
        print(f"seed {seed}: max |z| {worst:.2f}, min ESS {e['min_ess_bulk']:.0f} "
              f"({e['min_ess_per_grad_total']:.3g} per gradient, "
              f"{e['min_ess_per_s_total']:.3g} per s, warmup included), warmup "
              f"{_warmup_run(fit)}, problems: "
              f"{'; '.join(p.short for p in fit.diagnose().problems) or 'none'}", flush=True)
    z = np.array(z)  # seeds × columns × (mean, sd)
    print(f"\n{args.model}, {args.sampler} {args.options}, {len(z)} seeds")
    print("| column | mean z of the mean | mean z of the sd | rms z of the mean | rms z of the sd |")
    print("|---|---:|---:|---:|---:|")
    for j, c in enumerate(columns):
        m, r = z[:, j].mean(axis=0), np.sqrt((z[:, j] ** 2).mean(axis=0))
        print(f"| {c} | {m[0]:.2f} | {m[1]:.2f} | {r[0]:.2f} | {r[1]:.2f} |")


if __name__ == "__main__":
    main()
