"""AHMC with and without the chains' tail check (``tail_check``), side by side.

Each model and seed runs ``tune_and_sample(model, chains=4, seed=s)`` twice, with the
default ``tail_check=True`` and with ``tail_check=False`` (the code before the check: a
chain in which the check finds nothing makes the same draws either way), and reports min
bulk ESS per gradient (warmup and every rerun counted), the worst R-hat, how many chains
re-adapted, whether the fit was rerun or extended, and warmup's share of the gradients.

    python comparisons/tail_check.py --models sv --seeds 1-10
    python comparisons/tail_check.py --models gauss2d,neal100,gp51,pima,ripley,breast_cancer,nhtemp,galton,lgcp --seeds 1-3
    python comparisons/tail_check.py --models sv --seeds 1-10 --reuse-off comparisons/results/tail_check_one_stratum.json

Models are those of ``comparisons/nuts_peers.py`` (the suite, the uncentred regressions,
``sv<T>``/``lgcp<d>`` and the robustness suite's names).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "comparisons"))

import ahmc_stan  # noqa: E402
import nuts_peers  # noqa: E402
from ahmc_stan.tuning.tail_rejection import tail_rejections  # noqa: E402
from seed_bias import seeds_of  # noqa: E402

RESULTS = ROOT / "comparisons" / "results"


def run(model, seed: int, tail_check: bool) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ahmc_stan.tune_and_sample(model, seed=seed, progress=False, diagnose=False,
                                        tail_check=tail_check)
    return summarise(fit)


def summarise(fit) -> dict:
    """One run's row; ``sampling_tails``: per chain, whether it re-adapted and how many
    columns its own kept draws reject in a tail at the diagnosis's ratio (the tuning
    phase's test, on the chain's draws at its final tuning)."""
    e = fit.efficiency()
    grads = e["n_grad_equiv_warmup"] + e["n_grad_equiv_sampling"]
    chains = fit.metadata["chains"]
    tails = [[bool(c.get("tail_check")),
              len(tail_rejections(fit.draws[i, :-1, :fit.n_params],
                                  1 - fit.sampler_stats["accept_stat"][i, 1:]))]
             for i, c in enumerate(chains)]
    return {"per_grad": e["min_ess_per_grad_total"], "max_rhat": e["max_rhat"],
            "rerun": "metric_rerun" in fit.metadata,
            "extended": bool(fit.metadata.get("extension", {}).get("extended")),
            "warmup_share": e["n_grad_equiv_warmup"] / grads, "sampling_tails": tails}


def report(rows: dict) -> str:
    lines = ["# AHMC with and without the chains' tail check", "",
             "Command: `python comparisons/tail_check.py --models M --seeds S` (4 chains, "
             "1000 + 1000, the default options but `tail_check`). Min bulk ESS per gradient "
             "with warmup and reruns counted, median over the seeds (per seed: off → on); "
             "worst R-hat; chains that re-adapted (of 4 per seed); fits rerun or extended; "
             "chains whose own kept draws reject in a tail (the fit diagnosis's ratio, "
             "2.5). "
             "The runs without the check do not depend on its rule: `--reuse-off JSON` "
             "takes them from an earlier result.",
             "", "| model | seeds | per gradient, off → on (median) | ratio | per seed | "
             "worst R-hat, off → on | chains re-adapted | rerun off / on | extended off / on "
             "| warmup share, off → on | chains whose own draws reject in a tail, off; on: "
             "not re-adapted / re-adapted |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        off, on = r["off"], r["on"]
        med = lambda runs, k: float(np.median([x[k] for x in runs]))  # noqa: E731
        lines.append(
            f"| {name} | {r['seeds'][0]}–{r['seeds'][-1]} | {med(off, 'per_grad'):.4g} → "
            f"{med(on, 'per_grad'):.4g} | {med(on, 'per_grad') / med(off, 'per_grad'):.2f} | "
            + ", ".join(f"{a['per_grad']:.3g} → {b['per_grad']:.3g}" for a, b in zip(off, on))
            + f" | {max(x['max_rhat'] for x in off):.4f} → {max(x['max_rhat'] for x in on):.4f}"
            f" | {sum(again for x in on for again, _ in x['sampling_tails'])} of {4 * len(on)}"
            f" | {sum(x['rerun'] for x in off)} / {sum(x['rerun'] for x in on)}"
            f" | {sum(x['extended'] for x in off)} / {sum(x['extended'] for x in on)}"
            f" | {med(off, 'warmup_share'):.2f} → {med(on, 'warmup_share'):.2f} | "
            f"{_tailed(off)}; {_tailed(on, False)} / {_tailed(on, True)} |")
    return "\n".join(lines) + "\n"


def _tailed(runs: list, readapted: bool | None = None) -> str:
    """"k of n": chains (re-adapted or not, or all) whose kept draws show a tail."""
    if not all("sampling_tails" in r for r in runs):
        return "–"
    chains = [found for r in runs for again, found in r["sampling_tails"]
              if readapted is None or again == readapted]
    return f"{sum(1 for found in chains if found)} of {len(chains)}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="sv")
    parser.add_argument("--seeds", default="1-3")
    parser.add_argument("--out", default=str(RESULTS / "tail_check"))
    parser.add_argument("--reuse-off", default=None, metavar="JSON",
                        help="take the runs without the check from this earlier result "
                             "where it has the model at the same seeds (they do not "
                             "depend on the check's rule)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    rows = json.loads(out.with_suffix(".json").read_text()) \
        if out.with_suffix(".json").exists() else {}
    earlier = json.loads(Path(args.reuse_off).read_text()) if args.reuse_off else {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        model, seeds = nuts_peers.load(name), seeds_of(args.seeds)
        old = earlier.get(name, {})
        off = old["off"] if old.get("seeds") == seeds else [run(model, s, False)
                                                            for s in seeds]
        rows[name] = {"seeds": seeds, "off": off, "on": [run(model, s, True) for s in seeds]}
        print(report({name: rows[name]}).splitlines()[-1], flush=True)
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
        out.with_suffix(".md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
