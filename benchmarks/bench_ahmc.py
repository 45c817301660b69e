"""AHMC speed: wall time per leapfrog step against the bare C++ gradient, and the tuner's
share of wall time (issue 14: at most 5 % on every suite model).

    python benchmarks/bench_ahmc.py [--models std10,logistic100,gauss2d,...]
                                    [--warmup 1000] [--draws 1000]

For each model (a 10-d standard Gaussian, where per-iteration overhead dominates; a
logistic regression with 100 parameters; the suite's models) runs one AHMC chain in this
process and reports, from the same run: the bare C++ gradient time (timed inside the
library), the wall time per leapfrog step of the sampling phase with and without the
tuner's own time, and the tuner's share of the chain's wall time (warmup included) — with
the paper's infinite adaptation and with the tuner frozen after warmup.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ahmc_stan, also for A/B copies

import numpy as np  # noqa: E402

import ahmc_stan  # noqa: E402
from ahmc_stan.samplers.chain import ChainRecorder  # noqa: E402
from ahmc_stan.tuning import BayesOptTuner  # noqa: E402


class TunerClock:
    """Times every BayesOptTuner.update_many call (the GP and the acquisition; ``update``
    goes through it) and notes when the chain's sampling phase starts, so the tuner's time
    in sampling is known."""

    def __init__(self):
        self.calls: list[tuple[float, float]] = []   # (start, seconds)
        self.sampling_start = float("inf")
        self._name = "update_many" if hasattr(BayesOptTuner, "update_many") else "update"
        self._update = getattr(BayesOptTuner, self._name)
        self._mark = ChainRecorder.mark_sampling_start

    def __enter__(self):
        clock = self

        def timed(tuner, gamma, rewards):
            t = time.perf_counter()
            try:
                return clock._update(tuner, gamma, rewards)
            finally:
                clock.calls.append((t, time.perf_counter() - t))

        def mark(recorder, chain_start):
            clock.sampling_start = time.perf_counter()
            return clock._mark(recorder, chain_start)

        setattr(BayesOptTuner, self._name, timed)
        ChainRecorder.mark_sampling_start = mark
        return self

    def __exit__(self, *exc):
        setattr(BayesOptTuner, self._name, self._update)
        ChainRecorder.mark_sampling_start = self._mark

    def seconds(self, after: float = -float("inf")) -> float:
        return sum(d for t, d in self.calls if t >= after)


def measure(name: str, model: ahmc_stan.StanModel, warmup: int, draws: int,
            adapt_during_sampling: bool) -> dict:
    x = model.initial_point(np.random.default_rng(0))
    bare_us = model.density.gradient_seconds(x, 20000) * 1e6
    with TunerClock() as clock:
        fit = ahmc_stan.tune_and_sample(model, chains=1, warmup=warmup, draws=draws,
                                        seed=1, progress=False, parallel=False,
                                        diagnose=False,
                                        adapt_during_sampling=adapt_during_sampling)
    total = fit.time_warmup + fit.time_sampling  # the chain's own clock
    tuner_sampling = clock.seconds(after=clock.sampling_start)
    steps = fit.n_grad_sampling
    per_step = fit.time_sampling / steps * 1e6
    return {
        "model": name, "tuner in sampling": "runs" if adapt_during_sampling else "frozen",
        "dims": model.dims, "bare C++ gradient µs": bare_us,
        "sampling wall µs / leapfrog step": per_step,
        "ratio to bare": per_step / bare_us,
        "ratio excluding tuner": (fit.time_sampling - tuner_sampling) / steps * 1e6 / bare_us,
        "tuner share of chain wall time": clock.seconds() / total,
        "mean L_r": float(np.mean(fit.sampler_stats["num_steps"])),
    }


def main(argv=None) -> None:
    import argparse

    from bench_samplers import load  # the same models as the samplers' benchmark

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="std10,logistic100,gauss2d,neal100,gp51,pima,"
                                        "ripley,breast_cancer")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=1000)
    args = ap.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        model = load(name)
        rows += [measure(name, model, args.warmup, args.draws, adapt) for adapt in (True, False)]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                                for k in keys) + " |", flush=True)


if __name__ == "__main__":
    main()
