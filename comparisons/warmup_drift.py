"""Does a chain's own drift at the end of warmup tell a warmup that was long enough from
one that was not?  Per seed: the bias of AHMC's fit against the suite's reference (the
largest |z| of a parameter's mean or sd, as ``seed_bias.py`` computes it) and, per chain,
the largest over the parameters of a split-half drift statistic over the last ``--tail``
warmup iterations (difference of the halves' means over its batch-means standard error,
5 batches a half).  One JSON line per seed.

    python comparisons/warmup_drift.py ucb_admissions --seeds 15-64 \\
        --options '{"warmup": 700, "scale_fraction": 0.7142857}'
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
from seed_bias import seeds_of  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.fit import stan_name  # noqa: E402


def batch_var(x: np.ndarray, batches: int = 5) -> float:
    """The variance of ``x``'s mean from ``batches`` batch means."""
    n = len(x) // batches * batches
    means = x[:n].reshape(batches, -1).mean(axis=1)
    return float(means.var(ddof=1) / batches)


def drift(warm: np.ndarray, tail: int) -> float:
    """The largest |z| over the columns of ``warm`` (one chain's warmup draws) between the
    halves of its last ``tail`` rows."""
    seg = warm[-tail:]
    a, b = seg[:tail // 2], seg[tail // 2:]
    z = [abs(b[:, j].mean() - a[:, j].mean()) / s if (s := np.sqrt(
        batch_var(a[:, j]) + batch_var(b[:, j]))) > 0 else 0.0 for j in range(seg.shape[1])]
    return float(max(z))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--seeds", default="1-20")
    ap.add_argument("--options", default="{}", help="JSON options for tune_and_sample")
    ap.add_argument("--tail", type=int, default=200)
    args = ap.parse_args(argv)
    entry = robustness.load_registry().BY_NAME[args.model]
    ref = json.loads(robustness.reference_path(args.model).read_text())
    model = robustness.build_model(entry, entry.data())
    p = len(model.param_names())
    for seed in seeds_of(args.seeds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = ahmc_stan.tune_and_sample(model, chains=4, seed=seed, progress=False,
                                            diagnose=False, **json.loads(args.options))
        s = fit.summary()
        z = [abs(robustness._z(s.loc[stan_name(c)][k], ref["columns"][c][k],
                               s.loc[stan_name(c)][f"mcse_{k}"], ref["columns"][c][f"mcse_{k}"]))
             for c in ref["block_columns"] for k in ("mean", "sd")]
        warm = fit.warmup_draws[:, :, :p]
        print(json.dumps({"seed": seed, "bias": round(max(z), 2),
                          "drift": [round(drift(w, args.tail), 2) for w in warm],
                          "rerun": bool((fit.metadata.get("metric_rerun") or {}).get("ran"))}),
              flush=True)


if __name__ == "__main__":
    main()
