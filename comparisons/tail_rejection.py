"""The tail-rejection check (``ahmc_stan.convergence``, kind ``tail_rejection``) on the
robustness suite: which runs it flags, which of those nothing else flagged, and the silent
failures (a run with some |z| > 5 against the reference and no warning) with and without it.

    python comparisons/tail_rejection.py --seeds 1-4 --samplers ahmc,nuts
    python comparisons/tail_rejection.py --models garch11 --seeds 1-20 \\
        --samplers ahmc,ahmc:metric=diag,nuts --out comparisons/results/tail_rejection_garch.md

A sampler is ``nuts`` (CmdStan), a name of ``tune_and_sample`` or ``name:key=value,...``
(options as JSON values where they parse, e.g. ``ahmc:metric=diag,adapt_delta=0.95``).
Each run is one job of ``comparisons/robustness.py`` (4 chains × (1000 + 1000), or
``--warmup``/``--draws``; its references and z's), here in this process.  Per model and
sampler the table gives the runs, the runs the check flags, those of them with no other
problem, the largest |z| of an sd among the runs with no problem, and the silent
failures before the check (its problem ignored) and with it.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import robustness  # noqa: E402
from ahmc_settings import parse_setting  # noqa: E402
from seed_bias import seeds_of  # noqa: E402

DEFAULT_OUT = robustness.ROOT / "comparisons" / "results" / "tail_rejection.md"


def parse_sampler(spec: str) -> tuple[str, dict]:
    """``"ahmc:metric=diag"`` → (``"ahmc"``, ``{"metric": "diag"}``)."""
    name, _, rest = spec.partition(":")
    return name, parse_setting(rest)


def suite_arguments(doc: str, samplers: str, seeds: str, out: Path, argv=None
                    ) -> argparse.Namespace:
    """The command line of a script that runs samplers over the robustness suite's models
    and seeds; ``args.names`` and ``args.seed_list`` resolved."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated (default: all)")
    ap.add_argument("--samplers", default=samplers)
    ap.add_argument("--seeds", default=seeds)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--own-warmup", action="store_true",
                    help="each of our samplers at its own default warmup, as a user gets it "
                         "(ahmc_stan.sampling.STAN_WARMUP; NUTS 1000), not --warmup")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=out)
    args = ap.parse_args(argv)
    args.warmup_text = "default" if args.own_warmup else str(args.warmup)
    args.names = ([n for n in args.models.split(",") if n]
                  or [m.name for m in robustness.load_registry().MODELS])
    args.seed_list = seeds_of(args.seeds)
    return args


def run(name: str, spec: str, seed: int, args: argparse.Namespace) -> dict:
    """One job of ``robustness.run_job``: 4 chains × (args.warmup + args.draws), 2 workers."""
    sampler, options = parse_sampler(spec)
    warmup = args.warmup
    if getattr(args, "own_warmup", False):
        warmup = 1000 if sampler == "nuts" else None  # None: tune_and_sample's default
    return robustness.run_job(name, sampler, {
        "seed": seed, "chains": 4, "warmup": warmup, "draws": args.draws,
        "z_max": 5.0, "parallel": 2, "options": options})


def main(argv=None) -> int:
    args = suite_arguments(__doc__, "ahmc,nuts", "1-4", DEFAULT_OUT, argv)
    names, seeds = args.names, args.seed_list
    started = datetime.datetime.now().isoformat(timespec="seconds")
    table = ["| model | sampler | runs | flagged | flagged, nothing else | largest sd z, "
             "runs with no problem | silent failures without the check | with it |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    totals = {}
    for name in names:
        for spec in args.samplers.split(","):
            n = flagged = alone = silent_before = silent_after = 0
            zmax, clean = 0.0, 0  # over the runs with no problem
            for seed in seeds:
                row = run(name, spec, seed, args)
                if row.get("status") != "ok":
                    print(f"{name} {spec} seed {seed}: {row.get('error')}", flush=True)
                    continue
                kinds = [p["kind"] for p in row["diagnosis"]["problems"]]
                tail = "tail_rejection" in kinds
                others = [k for k in kinds if k != "tail_rejection"]
                n += 1
                flagged += tail
                alone += tail and not others
                silent_before += (not row["pass"]) and not others
                silent_after += (not row["pass"]) and not kinds
                if not kinds:
                    clean += 1
                    zmax = max(zmax, row["max_abs_z_sd"])
                print(f"{name} {spec} seed {seed}: {'; '.join(row['problems']) or 'none'}; "
                      f"max|z| mean {row['max_abs_z_mean']:.2f} sd {row['max_abs_z_sd']:.2f}",
                      flush=True)
            largest = f"{zmax:.2f}" if clean else "—"
            table.append(f"| {name} | {spec} | {n} | {flagged} | {alone} | {largest} | "
                         f"{silent_before} | {silent_after} |")
            t = totals.setdefault(spec, [0] * 5)
            for i, v in enumerate((n, flagged, alone, silent_before, silent_after)):
                t[i] += v
    lines = ["# The tail-rejection check on the robustness suite", "",
              f"`python {' '.join(['comparisons/tail_rejection.py', *(argv or sys.argv[1:])])}`"
              f" (started {started}; seeds {args.seeds}; 4 chains × ({args.warmup_text} + "
              f"{args.draws})).", "",
              *table, "", "| sampler | runs | flagged | flagged, nothing else | silent "
              "failures without the check | with it |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {spec} | {' | '.join(map(str, t))} |" for spec, t in totals.items()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
