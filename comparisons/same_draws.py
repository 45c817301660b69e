"""Which of AHMC's fits a change of code touched: AHMC's default
(``tune_and_sample(model, chains=4, seed=s)``, as ``nuts_peers.py --own-warmup`` runs it)
on the models and seeds given, each fit's min ESS per gradient against the same seed's in
an earlier ``nuts_peers.py`` JSON (``SAME`` to 12 digits, else ``CHANGED``), with the
chains it continued as slow (``slow``), its R-hat and whether it was extended.  No NUTS
is run: their draws do not depend on our code.

    python comparisons/same_draws.py caravan 1,3,4 comparisons/results/nuts_peers_caravan_stop63_seeds1_5.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nuts_peers  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    models, seeds, earlier = argv[0].split(","), [int(s) for s in argv[1].split(",")], argv[2]
    before = json.loads(Path(earlier).read_text())["models"]
    changed = 0
    for name in models:
        model = nuts_peers.load(name)
        row = before.get(name, {})
        runs = dict(zip(row.get("settings", {}).get("seeds", []),
                        row.get("runs", {}).get("ahmc_low_rank", [])))
        for seed in seeds:
            now = nuts_peers.run_one(model, "ahmc_low_rank", {
                "chains": 4, "warmup": None, "draws": 1000, "seed": seed})
            old = runs.get(seed, {}).get("per_grad", math.nan)
            same = abs(old - now["per_grad"]) <= 1e-12 * now["per_grad"]
            changed += not same
            print(f"{name} seed {seed}: min ESS per gradient {now['per_grad']:.4g} "
                  f"(before {old:.4g}) {'SAME' if same else 'CHANGED'}; slow "
                  f"{now['slow_chains']:.0f}; R-hat {now['max_rhat']:.4f}; extended "
                  f"{now['extended']:.0f}; {now['wall']:.1f} s", flush=True)
    print(f"{changed} fit(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
