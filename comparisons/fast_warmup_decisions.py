"""The fast-warmup decision (``ahmc_stan.tuning.fast_warmup``) a default AHMC fit makes on
a model, seed by seed: each chain run exactly as ``tune_and_sample`` runs it (its seed, its
initial point, single-threaded BLAS), up to the
decision at iteration 250 of its scale phase, and stopped there; the first chain's window
misfit decides, and each chain's own misfit is listed beside it.

    python comparisons/fast_warmup_decisions.py ucb_admissions --seeds 15-64 [--chains 4]

Models are those of ``nuts_peers.py`` (the paper's suite, the two regressions and the
robustness suite).  A chain costs about a quarter of a default fit's warmup."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nuts_peers import load  # noqa: E402
from seed_bias import seeds_of  # noqa: E402

from ahmc_stan.blas import threadpools  # noqa: E402
from ahmc_stan.samplers.ahmc import run_chain  # noqa: E402
from ahmc_stan.tuning import fast_warmup as fw  # noqa: E402


class _Decided(Exception):
    pass


class _StopAtDecision(fw.FastWarmupMember):
    """A chain's member that ends the chain once it has its decision."""

    def __call__(self, draws, grads, divergent, rule):
        super().__call__(draws, grads, divergent, rule)
        self.own_misfit = fw.window_misfit(draws, grads)  # the first chain's, or its own
        raise _Decided


def decisions(model, seed: int, chains: int) -> tuple[bool | None, list[float | None]]:
    """The fit's decision at ``seed`` and each chain's own window misfit (``None`` for a
    chain that never reached the decision: a metric without gradients)."""
    shared = fw.FastWarmup()
    own = []
    for c, seed_c in enumerate(np.random.SeedSequence(seed).spawn(chains)):
        rng = np.random.default_rng(seed_c)  # as sampling._run_chain draws it
        x0 = model.initial_point(rng, None, radius=2.0)
        member = _StopAtDecision(shared, c)
        try:  # single-threaded BLAS, as in tune_and_sample's chains (its rounding)
            with warnings.catch_warnings(), threadpools().limit(limits=1, user_api="blas"):
                warnings.simplefilter("ignore")
                run_chain(model, rng, x0, 1000, 1000, lambda n: None, fast_warmup=member)
        except _Decided:
            pass
        if c == 0 and shared.decision is None:
            member.leave()
        own.append(member.own_misfit)
    return shared.decision, own


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--chains", type=int, default=4)
    args = ap.parse_args(argv)
    model = load(args.model)
    short = 0
    seeds = seeds_of(args.seeds)
    for seed in seeds:
        decision, own = decisions(model, seed, args.chains)
        short += bool(decision)
        text = " ".join("-" if m is None else f"{m:.3g}" for m in own)
        print(f"{args.model} (d={model.dims}) seed {seed}: "
              f"{'short' if decision else 'full'}; chains' misfits {text}", flush=True)
    print(f"{args.model}: short at {short} of {len(seeds)} seeds (threshold {fw.MISFIT})")


if __name__ == "__main__":
    main()
