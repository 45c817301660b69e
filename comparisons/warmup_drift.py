"""Does a chain's own drift at the end of warmup tell a warmup that was long enough from
one that was not?  Per seed: the bias of AHMC's fit against the suite's reference (the
largest |z| of a parameter's mean or sd, as ``seed_bias.py`` computes it) and, per chain,
the largest over the parameters of a split-half drift statistic over the last ``--tail``
warmup iterations (difference of the halves' means over their MCSEs, ArviZ's).  One JSON
line per seed.

    python comparisons/warmup_drift.py ucb_admissions --seeds 15-64 \\
        --options '{"warmup": 700, "scale_fraction": 0.7142857}'
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import arviz as az
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import robustness  # noqa: E402
from seed_bias import reference_z, seeds_of  # noqa: E402

import ahmc_stan  # noqa: E402


def drift(warm: np.ndarray, tail: int) -> float:
    """The largest |z| over the columns of ``warm`` (one chain's warmup draws) between the
    halves of its last ``tail`` rows, each half's mean with ArviZ's MCSE."""
    seg = warm[-tail:]
    a, b = seg[:tail // 2], seg[tail // 2:]
    se = np.hypot(*(np.array([float(az.mcse(h[:, j], method="mean"))
                              for j in range(seg.shape[1])]) for h in (a, b)))
    z = np.abs(b.mean(axis=0) - a.mean(axis=0)) / np.where(se > 0, se, np.inf)
    return float(z.max())


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
        z = [abs(v) for pair in reference_z(fit, ref) for v in pair]
        warm = fit.warmup_draws[:, :, :p]
        print(json.dumps({"seed": seed, "bias": round(max(z), 2),
                          "drift": [round(drift(w, args.tail), 2) for w in warm],
                          "rerun": bool((fit.metadata.get("metric_rerun") or {}).get("ran"))}),
              flush=True)


if __name__ == "__main__":
    main()
