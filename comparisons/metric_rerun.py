"""AHMC's reruns on the robustness suite.  The metric rerun
(``tune_and_sample(metric_rerun=True)``, the default): a fit of the default metric
(``auto``) that ran ``low_rank`` and fails the tail-rejection check, or both the R-hat and an ESS check, is run
again with ``metric="diag"`` (and, if that fails the tail-rejection check or has
divergent transitions, with ``adapt_delta=0.95`` as well), and the first converged fit
without divergences returned (else the converged one with the fewest, else the one with
the largest min ESS).  The chain rerun (``chain_rerun=True``, the default,
:mod:`ahmc_stan.chain_rerun`): a chain strayed into a region of negligible mass is run
again with a new seed; the table counts chains rerun and reruns adopted, and the slow
chains sampled again in the best chain's parameters (and adopted).  The extension
(``extend=True``, the default): a fit whose R-hat or ESS is flagged while its chains mix
(every ESS at least 50 per chain, no low E-BFMI, tail rejection, divergences past 1 % or
stuck chain) gets as many draws again; the table counts the fits extended.
Against the old default (``ahmc:metric=low_rank``) and CmdStan's NUTS, per model: runs
that pass the reference (all |z| ≤ 5), that converged (``Fit.diagnose()``), silent
failures (not passing, no warning), reruns made and adopted, tail rejections not rerun
because the E-BFMI was low too, and the medians of min bulk ESS, per gradient and per
chain-second (warmup and a discarded run included); each run's numbers in a JSON file
beside the table.

    python comparisons/metric_rerun.py --seeds 1-2
    python comparisons/metric_rerun.py --models garch11,ucb_admissions --seeds 1-4

Each run is one job of ``comparisons/robustness.py`` (4 chains × (1000 + 1000)) in this
process; samplers as ``comparisons/tail_rejection.py`` takes them.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import robustness  # noqa: E402
from tail_rejection import run, suite_arguments  # noqa: E402

DEFAULT_OUT = robustness.ROOT / "comparisons" / "results" / "metric_rerun.md"
#: What the JSON file beside the table keeps of each run.
KEPT = ("model", "sampler", "seed", "status", "pass", "not_converged", "silent_failure",
        "problems", "max_abs_z_mean", "max_abs_z_sd", "n_grad", "time_seconds",
        "metric_rerun", "chain_rerun", "slow_chains", "extension", "metric_fallbacks")


def _median(values, fmt: str) -> str:
    return format(statistics.median(values), fmt) if values else "—"


def main(argv=None) -> int:
    args = suite_arguments(__doc__, "ahmc,ahmc:metric=low_rank,nuts", "1-2", DEFAULT_OUT,
                           argv)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    table = ["| model | sampler | runs | pass | converged | silent failures | reruns "
             "(adopted) | not rerun: E-BFMI | chain reruns (adopted) | slow chains (adopted) | "
             "extended | min ESS | min ESS per gradient | min ESS per chain-second |",
             "|---|---|" + "---:|" * 12]
    totals: dict[str, list] = {}
    kept: list[dict] = []
    for name in args.names:
        for spec in args.samplers.split(","):
            rows = []
            for seed in args.seed_list:
                row = run(name, spec, seed, args)
                if row.get("status") != "ok":
                    print(f"{name} {spec} seed {seed}: {row.get('error')}", flush=True)
                    continue
                rows.append(row)
                rerun = row.get("metric_rerun")
                print(f"{name} {spec} seed {seed}: {'; '.join(row['problems']) or 'none'}; "
                      f"pass {row['pass']}; min ESS {row['min_ess_bulk']:.0f}, "
                      f"{row['n_grad']} gradients, {row['time_seconds']:.2f} chain-s"
                      + (f"; rerun: {rerun['note']}" if rerun else "")
                      + (f"; {row['chain_rerun']['note']}" if row.get("chain_rerun") else "")
                      + (f"; {row['slow_chains']['note']}" if row.get("slow_chains") else "")
                      + (f"; {row['extension']['note']}" if row.get("extension") else "")
                      + (f"; metric fallback in {row['metric_fallbacks']} chains"
                         if row.get("metric_fallbacks") else ""),
                      flush=True)
            records = [r["metric_rerun"] for r in rows if r.get("metric_rerun")]
            reruns = [r for r in records if r["ran"]]
            counts = (len(rows), sum(r["pass"] for r in rows),
                      sum(r["not_converged"] is False for r in rows),
                      sum(r["silent_failure"] for r in rows), len(reruns),
                      sum(r["adopted"] for r in reruns), len(records) - len(reruns),
                      sum(len(r["chain_rerun"]["runs"]) for r in rows if r.get("chain_rerun")),
                      sum(e["adopted"] for r in rows if r.get("chain_rerun")
                          for e in r["chain_rerun"]["runs"]),
                      sum((r.get("extension") or {}).get("extended", False) for r in rows),
                      sum(len(r["slow_chains"]["runs"]) for r in rows if r.get("slow_chains")),
                      sum(e["adopted"] for r in rows if r.get("slow_chains")
                          for e in r["slow_chains"]["runs"]))
            ess = [r["min_ess_bulk"] for r in rows]
            table.append(
                f"| {name} | {spec} | {counts[0]} | {counts[1]} | {counts[2]} | {counts[3]} | "
                f"{counts[4]} ({counts[5]}) | {counts[6]} | {counts[7]} ({counts[8]}) | "
                f"{counts[10]} ({counts[11]}) | {counts[9]} | "
                f"{_median(ess, '.0f')} | "
                f"{_median([e / r['n_grad'] for e, r in zip(ess, rows)], '.3g')} | "
                f"{_median([e / r['time_seconds'] for e, r in zip(ess, rows)], '.4g')} |")
            t = totals.setdefault(spec, [0] * 13 + [0.0])
            for i, v in enumerate(counts):
                t[i] += v
            t[12] += sum(r["n_grad"] for r in rows)
            t[13] += sum(r["time_seconds"] for r in rows)
            kept.extend({"spec": spec, "min_ess": e, **{k: r.get(k) for k in KEPT}}
                        for e, r in zip(ess, rows))
    lines = ["# AHMC's metric and chain reruns on the robustness suite", "",
             f"`python {' '.join(['comparisons/metric_rerun.py', *(argv or sys.argv[1:])])}`"
             f" (started {started}; seeds {args.seeds}; 4 chains × ({args.warmup_text} + "
             f"{args.draws})). "
             "Gradients and chain-seconds include warmup and, for a rerun, the run not "
             "returned.", "", *table, "",
             "| sampler | runs | pass | converged | silent failures | reruns | adopted | "
             "not rerun: E-BFMI | chain reruns | adopted | extended | slow chains | "
             "adopted | gradients | chain-seconds |", "|---|" + "---:|" * 14]
    lines += [f"| {spec} | {' | '.join(map(str, t[:13]))} | {t[13]:.0f} |"
              for spec, t in totals.items()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(kept, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
