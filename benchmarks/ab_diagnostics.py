"""The rank diagnostics of one version of ahmc-stan against another, side by side:

    git worktree add /tmp/before COMMIT
    python benchmarks/ab_diagnostics.py /tmp/before [--rounds 2]

Each round runs, in a fresh Python process per version, the versions taking turns,
``rank_diagnostics.diagnostics`` on 4 chains × 1000 draws of 100 and of 1000 AR(1)
columns (coefficient 0.5) and of Neal's 100-d model's draws (an AHMC fit, seed 3), for
the three statistics a run's checks use (bulk and tail ESS, R-hat) and for all five (the
MCSEs of the mean and sd too, as ``Fit.summary()`` asks): the median of 15 calls after
one.  Each version builds its own native library (``csrc/ahmc_diagnostics.cpp``; the
compile cache keys it by its source).  Prints the milliseconds and whether both
versions' values agree to 1e-12.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import sys, time, warnings
import numpy as np
root, out = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, root + "/comparisons"]
warnings.simplefilter("ignore")
from ahmc_stan import rank_diagnostics as R
assert R.__file__.startswith(root), R.__file__
cases = dict(np.load(out + "/draws.npz"))
values = {}
for name, x in cases.items():
    for keys in (R.CONVERGENCE_KEYS, R.KEYS):
        R.diagnostics(x, keys)
        times = []
        for _ in range(15):
            start = time.perf_counter()
            got = R.diagnostics(x, keys)
            times.append(time.perf_counter() - start)
        label = f"{name}, {'three' if keys == R.CONVERGENCE_KEYS else 'all five'}"
        print(f"{label}: {1e3 * np.median(times):.2f} ms")
        values.update({f"{label}/{k}": v for k, v in got.items()})
np.savez(out + "/" + sys.argv[3] + ".npz", **values)
"""

_DRAWS = """
import sys, warnings
import numpy as np
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/comparisons"]
warnings.simplefilter("ignore")
import ahmc_stan, nuts_peers
rng = np.random.default_rng(1)
def ar(k):
    e = rng.standard_normal((4, 1000, k))
    y = np.empty_like(e)
    y[:, 0] = e[:, 0]
    for t in range(1, 1000):
        y[:, t] = 0.5 * y[:, t - 1] + np.sqrt(0.75) * e[:, t]
    return y
fit = ahmc_stan.tune_and_sample(nuts_peers.load("neal100"), seed=3, progress=False,
                                diagnose=False)
np.savez(sys.argv[2] + "/draws.npz", **{"AR(1) 100": ar(100), "AR(1) 1000": ar(1000),
                                        "Neal 100-d": np.ascontiguousarray(fit.params[:, :1000])})
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-c", _DRAWS, str(ROOT), tmp], check=True)
        for r in range(1, args.rounds + 1):
            for tag, root in (("before", args.before.resolve()), ("this", ROOT)):
                print(f"round {r} {tag}:", flush=True)
                subprocess.run([sys.executable, "-c", _RUN, str(root), tmp, tag], check=True)
        a, b = np.load(f"{tmp}/before.npz"), np.load(f"{tmp}/this.npz")
        worst = max(float(np.nanmax(np.abs(a[k] - b[k]) / np.abs(a[k]))) for k in a.files)
        print(f"largest relative difference between the versions' values: {worst:.2g}")


if __name__ == "__main__":
    main()
