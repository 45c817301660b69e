"""Run again a chain that strayed into a region of negligible probability mass.

A chain can spend its whole run where the other chains never go: in a minor mode of the
posterior, or crawling in from a far-out initial point (Lotka–Volterra's ODE posterior
has both).  The diagnosis flags it (its mean ``lp`` far below the others'), and the
remedy a user would apply is to run that chain again from another initial point.  Here
that happens automatically when, in addition, the region the chain covers holds a
negligible share of the probability mass compared with the chain that covers the most.
The mass is a Laplace estimate: for a Gaussian region of covariance Σ, the mean of lp is
``lp_max − d/2`` and the mass ``exp(lp_max) · det(2πΣ)^½``, so ``mean lp + ½ log det
Σ`` (Σ the draws' covariance on the unconstrained scale) ranks the regions' masses, up
to a constant shared by all chains.  A region whose lower density is made up for by its
volume (a wide second mode) is left alone, and the diagnosis still reports it.

The rerun has a new seed, hence a new initial point by Stan's rule (the same ``init``
when one was given).  It is adopted when it no longer strays; otherwise the first chain
is kept.  Either way the discarded chain's evaluations are charged to the kept chain's
first iteration and its seconds to the kept chain's warmup, so ESS per gradient and per
second count them."""

from __future__ import annotations

import math
import sys
from typing import Callable, Sequence

import numpy as np

from .convergence import lp_gap_allowed
from .costs import COST_STATS
from .samplers.chain import ChainResult

__all__ = ["rerun_stray_chains", "stray_chains", "log_mass", "STRAY_MASS_MAX",
           "RERUN_ATTEMPTS"]

#: A chain flagged by the lp gap whose region's estimated mass is below this fraction of
#: the best chain's is a stray (one chain of c carries 1/c of the draws: a region under
#: 1 % of the mass is then over-weighted at least 25-fold with 4 chains) ...
STRAY_MASS_MAX = 1e-2
#: ... and is run again at most this many times.
RERUN_ATTEMPTS = 2


def log_mass(x: np.ndarray, lp: np.ndarray) -> float:
    """Laplace estimate of the log probability mass of the region covered by a chain's
    unconstrained draws ``x`` (n × d) with log densities ``lp``, up to a constant shared
    by every chain of the model: ``mean(lp) + ½ log det Σ``, Σ the draws' covariance (its
    diagonal when there are fewer than ``2d + 2`` draws); −inf for a chain that did not
    move in some coordinate."""
    x = np.asarray(x, dtype=float)
    n, d = x.shape
    if n < 2 or not np.all(np.ptp(x, axis=0) > 0):
        return -math.inf
    if n >= 2 * d + 2:
        sign, logdet = np.linalg.slogdet(np.atleast_2d(np.cov(x, rowvar=False)))
        if sign > 0:
            return float(np.mean(lp) + 0.5 * logdet)
    return float(np.mean(lp) + 0.5 * np.sum(np.log(x.var(axis=0, ddof=1))))


def stray_chains(results: Sequence[ChainResult], warmup: int) -> list[dict]:
    """The chains of ``results`` that stray, compared with the chain whose region has the
    largest estimated mass (:func:`log_mass`, post-warmup draws): a chain whose mean
    ``lp`` lies more than the diagnosis's allowed gap
    (:func:`~ahmc_stan.convergence.lp_gap_allowed`) below that chain's and whose region's
    mass is below :data:`STRAY_MASS_MAX` of that chain's.  ``{"chain", "lp_gap",
    "log_mass_ratio"}`` each (chain 0-based).  The reference is the best chain, not the
    others' median, so that one chain in the main mode and three in a minor one also
    get the three run again."""
    if len(results) < 2 or any("lp" not in r.stats for r in results):
        return []
    n = min(r.n_sampling for r in results)
    if n < 2:
        return []
    rows = slice(warmup, warmup + n)
    lp = np.array([r.stats["lp"][rows] for r in results])
    if not np.isfinite(lp).all():
        return []
    mass = np.array([log_mass(r.positions[rows], r.stats["lp"][rows]) for r in results])
    best = int(np.argmax(mass))
    means, gap = lp.mean(axis=1), lp_gap_allowed(lp)
    out = []
    for c in range(len(results)):
        ratio = float(mass[c] - mass[best])
        if means[c] < means[best] - gap and ratio < math.log(STRAY_MASS_MAX):
            out.append({"chain": c, "lp_gap": float(means[best] - means[c]),
                        "log_mass_ratio": ratio})
    return out


def charge(kept: ChainResult, discarded: ChainResult) -> dict:
    """Add ``discarded``'s evaluations to ``kept``'s first iteration and its seconds to
    ``kept``'s warmup; returns what was charged (``n_grad``, ``seconds``)."""
    done = discarded.n_warmup + discarded.n_sampling
    for stat in COST_STATS:
        if stat in discarded.stats and stat in kept.stats and len(kept.stats[stat]):
            kept.stats[stat][0] += float(np.sum(discarded.stats[stat][:done]))
    seconds = discarded.time_warmup + discarded.time_sampling
    kept.time_warmup += seconds
    return {"n_grad": int(np.sum(discarded.stats.get("n_grad", np.zeros(0))[:done])),
            "seconds": float(seconds)}


def _entry(stray: dict, attempt: int) -> dict:
    return {"chain": stray["chain"] + 1, "attempt": attempt,
            "lp_gap": round(stray["lp_gap"], 3),
            "log_mass_ratio": round(stray["log_mass_ratio"], 3), "adopted": False}


def rerun_stray_chains(results: list[ChainResult], warmup: int,
                       rerun: Callable[[list[int], int], tuple[list, bool]],
                       progress: bool = False, label: str = ""
                       ) -> tuple[list[ChainResult], dict | None]:
    """Run each stray chain (:func:`stray_chains`) again, up to :data:`RERUN_ATTEMPTS`
    times: ``rerun(chains, attempt)`` runs the listed chains with new seeds and returns
    ``(results, interrupted)``.  A rerun chain replaces its stray when it no longer strays
    among the others.  Returns the chains and a record for ``fit.metadata["chain_rerun"]``
    (``None`` when no chain strayed): ``runs``, one entry per rerun, and a ``note``."""
    results = list(results)
    runs: list[dict] = []
    for attempt in range(1, RERUN_ATTEMPTS + 1):
        strays = stray_chains(results, warmup)
        if not strays:
            break
        ids = [s["chain"] for s in strays]
        if progress:
            print(f"{label}: chain{'s' if len(ids) > 1 else ''} "
                  f"{', '.join(str(c + 1) for c in ids)} strayed into a region of "
                  f"negligible mass; running again with a new seed (attempt {attempt})",
                  file=sys.stderr, flush=True)
        try:
            fresh, interrupted = rerun(ids, attempt)
        except Exception as err:  # noqa: BLE001 — e.g. StuckChainError: keep the chains
            runs.extend({**_entry(stray, attempt), "error": f"{type(err).__name__}: {err}"}
                        for stray in strays)
            break
        for stray, new in zip(strays, fresh):
            c = stray["chain"]
            entry = _entry(stray, attempt)
            complete = new is not None and not new.interrupted and \
                new.n_sampling == results[c].n_sampling
            if complete:
                trial = results[:c] + [new] + results[c + 1:]
                entry["adopted"] = all(s["chain"] != c for s in stray_chains(trial, warmup))
            if entry["adopted"]:
                entry["charged"] = charge(new, results[c])
                results[c] = new
            elif new is not None:
                entry["charged"] = charge(results[c], new)
            runs.append(entry)
        if interrupted:
            break
    if not runs:
        return results, None
    adopted = sorted({e["chain"] for e in runs if e["adopted"]})
    errors = [e for e in runs if "error" in e]
    failed = sorted({e["chain"] for e in runs} - set(adopted) - {e["chain"] for e in errors})
    parts = []
    if adopted:
        parts.append(f"chain{'s' if len(adopted) > 1 else ''} "
                     f"{', '.join(map(str, adopted))} replaced by a rerun with a new seed")
    if failed:
        parts.append(f"chain{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} "
                     "kept: the reruns strayed as well")
    if errors:
        parts.append(f"a rerun failed ({errors[0]['error']}): the chains kept")
    worst = max(runs, key=lambda e: e["lp_gap"])
    note = (f"{len(runs)} chain rerun{'s' if len(runs) > 1 else ''}: "
            + "; ".join(parts)
            + f" (a stray's mean lp was up to {worst['lp_gap']:.3g} below the chain "
            f"covering the most mass, its region holding about "
            f"e^{worst['log_mass_ratio']:.3g} of that chain's by a Laplace estimate); the "
            "discarded chains' gradients and seconds are counted in warmup")
    return results, {"runs": runs, "note": note}
