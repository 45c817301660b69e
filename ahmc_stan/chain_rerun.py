"""Run again a chain that strayed into a region of negligible probability mass, or whose
adaptation failed.

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

A chain whose adaptation failed (:func:`failed_chains`) is run again too: divergent in
more than 1 % of its post-warmup iterations (the bound above which the diagnosis says
"not converged") while the other chains' median is within it, and mixing far slower than
they do (the diagnosis's ``slow_chain`` rule on the unconstrained coordinates).  Its step
size and metric do not fit the region it samples (on Lotka–Volterra: 11–43 % divergent,
acceptance 0.09 against the others' 0.68–0.79, a bulk ESS 0.3–0.4 % of theirs, its lp
like theirs); a user's remedy is again another seed.  A chain whose lp differs from the
others' (in a funnel's neck, say) is not concerned: its divergences may be the
posterior's.  Nor is one whose draws spread wider than the others', beyond its own
sampling error, or lie outside their range more than 15 % of the time while spreading
at least as wide (:func:`reaches_further`): it may be the only chain sampling a tail the
others' adaptation shuts out, and replacing it would turn a flagged fit into a wrong one
that looks right.  Only the HMC family records divergences, so only it is concerned.

The rerun has a new seed, hence a new initial point by Stan's rule (the same ``init``
when one was given).  It is adopted when it no longer strays or fails among the others;
otherwise the first chain is kept.  Either way the discarded chain's evaluations are
charged to the kept chain's first iteration and its seconds to the kept chain's warmup,
so ESS per gradient and per second count them.

A chain that only mixes far slower than the others (the diagnosis's ``slow_chain`` rule)
while it samples where they do, as cleanly (its lp, at most 1 % divergent), spreads no
wider, and no chain's E-BFMI is low, is not run again but continued
(:func:`continue_slow_chains`): from its last draw, in the step size, number of steps
and metric of the chain that mixes best per gradient, for as many draws, its first
draws counted as warmup.  Its adaptation, not its region, is what failed, so another
chain's adaptation to the same posterior serves it (cross-chain adaptation, as in
ChEES: Hoffman, Radul & Sountsov 2021), and its kernel is still fixed before the draws
it keeps.  Only samplers that can continue a chain (AHMC) are concerned."""

from __future__ import annotations

import math
import sys
from typing import Callable, Sequence

import numpy as np

from .convergence import (DIVERGENCE_UNCONVERGED_FRACTION, low_ebfmi, lp_gap_allowed,
                          slow_chains)
from .costs import COST_STATS
from .samplers.chain import ChainResult

__all__ = ["rerun_stray_chains", "stray_chains", "failed_chains", "reaches_further",
           "log_mass", "continue_slow_chains", "slow_chain_cases", "donor_start", "last_state",
           "restart_sampling", "STRAY_MASS_MAX", "RERUN_ATTEMPTS", "REACH_Z"]

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


def _common_rows(results: Sequence[ChainResult], warmup: int, min_chains: int,
                 min_draws: int) -> slice | None:
    """The post-warmup rows every chain has, if there are enough chains and draws."""
    if len(results) < min_chains:
        return None
    n = min(r.n_sampling for r in results)
    return slice(warmup, warmup + n) if n >= min_draws else None


def _finite_lp(results: Sequence[ChainResult], rows: slice) -> np.ndarray | None:
    """The chains' ``lp`` in ``rows`` (chains × draws), ``None`` if one is missing or not
    finite."""
    if any("lp" not in r.stats for r in results):
        return None
    lp = np.array([r.stats["lp"][rows] for r in results])
    return lp if np.isfinite(lp).all() else None


def stray_chains(results: Sequence[ChainResult], warmup: int) -> list[dict]:
    """The chains of ``results`` that stray, compared with the chain whose region has the
    largest estimated mass (:func:`log_mass`, post-warmup draws): a chain whose mean
    ``lp`` lies more than the diagnosis's allowed gap
    (:func:`~ahmc_stan.convergence.lp_gap_allowed`) below that chain's and whose region's
    mass is below :data:`STRAY_MASS_MAX` of that chain's.  ``{"chain", "lp_gap",
    "log_mass_ratio"}`` each (chain 0-based).  The reference is the best chain, not the
    others' median, so that one chain in the main mode and three in a minor one also
    get the three run again."""
    rows = _common_rows(results, warmup, 2, 2)
    lp = None if rows is None else _finite_lp(results, rows)
    if lp is None:
        return []
    means, gap = lp.mean(axis=1), lp_gap_allowed(lp)
    if means.min() >= means.max() - gap:  # none below any chain's mean by the gap
        return []
    mass = np.array([log_mass(r.positions[rows], r.stats["lp"][rows]) for r in results])
    best = int(np.argmax(mass))
    out = []
    for c in range(len(results)):
        ratio = float(mass[c] - mass[best])
        if means[c] < means[best] - gap and ratio < math.log(STRAY_MASS_MAX):
            out.append({"chain": c, "lp_gap": float(means[best] - means[c]),
                        "log_mass_ratio": ratio})
    return out


def failed_chains(results: Sequence[ChainResult], warmup: int) -> list[dict]:
    """The chains of ``results`` whose adaptation failed: divergent in more than
    :data:`~ahmc_stan.convergence.DIVERGENCE_UNCONVERGED_FRACTION` of their post-warmup
    iterations while the other chains' median rate is at most that, and slow by the
    diagnosis's rule (:func:`~ahmc_stan.convergence.slow_chains`) on the unconstrained
    coordinates — in the same region as the others by its lp (mean lp within
    the diagnosis's allowed gap of their median, either way), so that a chain whose
    divergences come from a region of the posterior the others miss (a funnel's neck)
    is left to the diagnosis, as is a chain whose draws spread wider than the others'
    (:func:`reaches_further`).  ``{"chain", "divergent", "ess_ratio"}`` each (chain
    0-based; the chain's divergent fraction and its smallest ESS ratio to the others')."""
    rows = _common_rows(results, warmup, 3, 20)
    if rows is None or any("divergent" not in r.stats for r in results):
        return []
    rate = np.array([np.mean(r.stats["divergent"][rows] != 0) for r in results])
    bound = DIVERGENCE_UNCONVERGED_FRACTION
    suspects = [c for c in range(len(results))
                if rate[c] > bound and np.median(np.delete(rate, c)) <= bound]
    if suspects:
        # the same region as the others by its lp: a chain in a funnel's neck, whose
        # divergences are the posterior's and not its adaptation's, has a higher lp
        lp = _finite_lp(results, rows)
        if lp is None:
            return []
        means, gap = lp.mean(axis=1), lp_gap_allowed(lp)
        suspects = [c for c in suspects
                    if abs(means[c] - np.median(np.delete(means, c))) <= gap]
    if not suspects:
        return []
    x = np.array([r.positions[rows] for r in results])            # chains × n × d
    if not np.isfinite(x).all():
        return []
    slow = {c: (cols, ess, ref) for c, cols, ess, ref in slow_chains(x)}
    return [{"chain": c, "divergent": float(rate[c]),
             "ess_ratio": float(np.min(slow[c][1] / slow[c][2]))}
            for c in suspects if c in slow and not reaches_further(x, c, *slow[c][:2])]


#: :func:`reaches_further`: standard errors by which a chain's sd must exceed the others'.
REACH_Z = 2.0
#: :func:`reaches_further`: the share of a chain's draws outside the other chains'
#: central 99 % (1 % when it samples what they sample) above which it reaches further.
REACH_OUTSIDE = 0.15


def reaches_further(x: np.ndarray, chain: int, columns, ess) -> bool:
    """Whether ``chain``'s draws (``x``: chains × draws × coordinates) spread wider than
    the other chains' in any of ``columns`` (where it is slow, its bulk ESS ``ess``
    there): the log of its sd over the others' median sd above :data:`REACH_Z` standard
    errors of its own log sd, ``1/sqrt(2(ESS - 1))``; or more than
    :data:`REACH_OUTSIDE` of its draws outside the others' central 99 % with an sd at
    least theirs (the sd test is weak when the chain's ESS is a handful: on the
    non-centred eight schools a chain with 21 % of its log τ beyond the others' 99.5 %
    quantile, its sd 1.6× theirs; a chain stuck in one spot outside their range spreads
    less than they do, and is run again).  Such a chain, however slow and divergent,
    may be the only one that samples a tail the others' adaptation shuts out (GARCH's
    skewed variance parameters, the eight schools' τ); discarding it would hide the
    evidence, so it is left to the diagnosis.  A chain that mixes slowly in the others'
    region has, if anything, a smaller sd than theirs (its few effective draws
    under-state it) and few draws outside their range."""
    others = np.delete(x, chain, axis=0)[:, :, columns]
    own = x[chain][:, columns]
    sd = own.std(axis=0)
    sd_others = np.median(others.std(axis=1), axis=0)
    ess = np.maximum(np.asarray(ess, dtype=float), 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        wider = np.log(sd / sd_others) > REACH_Z / np.sqrt(2 * (ess - 1))
    lo, hi = np.quantile(others.reshape(-1, own.shape[1]), [0.005, 0.995], axis=0)
    share = np.mean((own < lo) | (own > hi), axis=0)
    outside = (share > REACH_OUTSIDE) & (sd >= sd_others)
    return bool(np.any(wider) or np.any(outside))


def _to_rerun(results: Sequence[ChainResult], warmup: int) -> list[dict]:
    """Strays (``reason`` "stray") and failed chains ("failed"), by chain."""
    strays = [{**s, "reason": "stray"} for s in stray_chains(results, warmup)]
    seen = {s["chain"] for s in strays}
    failed = [{**f, "reason": "failed"} for f in failed_chains(results, warmup)
              if f["chain"] not in seen]
    return sorted(strays + failed, key=lambda e: e["chain"])


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


def _entry(case: dict, attempt: int) -> dict:
    keys = (("lp_gap", "log_mass_ratio") if case["reason"] == "stray"
            else ("divergent", "ess_ratio"))
    return {"chain": case["chain"] + 1, "attempt": attempt, "reason": case["reason"],
            **{k: round(case[k], 4 if k == "ess_ratio" else 3) for k in keys},
            "adopted": False}


def rerun_stray_chains(results: list[ChainResult], warmup: int,
                       rerun: Callable[[list[int], int], tuple[list, bool]],
                       progress: bool = False, label: str = ""
                       ) -> tuple[list[ChainResult], dict | None]:
    """Run each stray chain (:func:`stray_chains`) and each failed one
    (:func:`failed_chains`) again, up to :data:`RERUN_ATTEMPTS` times: ``rerun(chains,
    attempt)`` runs the listed chains with new seeds and returns ``(results,
    interrupted)``.  A rerun chain replaces the first when it neither strays nor fails
    among the others.  Returns the chains and a record for ``fit.metadata["chain_rerun"]``
    (``None`` when no chain was rerun): ``runs``, one entry per rerun (``reason`` "stray"
    with ``lp_gap`` and ``log_mass_ratio``, or "failed" with ``divergent`` and
    ``ess_ratio``), and a ``note``."""
    results = list(results)
    runs: list[dict] = []
    for attempt in range(1, RERUN_ATTEMPTS + 1):
        cases = _to_rerun(results, warmup)
        if not cases:
            break
        ids = [s["chain"] for s in cases]
        if progress:
            print(f"{label}: chain{'s' if len(ids) > 1 else ''} "
                  f"{', '.join(str(c + 1) for c in ids)} strayed into a region of "
                  f"negligible mass or failed to adapt; running again with a new seed "
                  f"(attempt {attempt})", file=sys.stderr, flush=True)
        try:
            fresh, interrupted = rerun(ids, attempt)
        except Exception as err:  # noqa: BLE001 — e.g. StuckChainError: keep the chains
            runs.extend({**_entry(case, attempt), "error": f"{type(err).__name__}: {err}"}
                        for case in cases)
            break
        for case, new in zip(cases, fresh):
            c = case["chain"]
            entry = _entry(case, attempt)
            complete = new is not None and not new.interrupted and \
                new.n_sampling == results[c].n_sampling
            if complete:
                trial = results[:c] + [new] + results[c + 1:]
                entry["adopted"] = all(e["chain"] != c for e in _to_rerun(trial, warmup))
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
    return results, {"runs": runs, "note": _note(runs)}


def _chain_list(chains) -> str:
    return f"chain{'s' if len(chains) > 1 else ''} {', '.join(map(str, chains))}"


#: Per reason, the entry that speaks for the others and what the note says of them.
_WHY = {
    "stray": ("lp_gap", lambda worst, runs: (
        f"a stray's mean lp was up to {worst['lp_gap']:.3g} below the chain covering the "
        f"most mass, its region holding about e^{worst['log_mass_ratio']:.3g} of that "
        "chain's by a Laplace estimate")),
    "failed": ("divergent", lambda worst, runs: (
        f"a chain whose adaptation failed was divergent in up to "
        f"{100 * worst['divergent']:.2g}% of its iterations and mixed "
        f"{min(e['ess_ratio'] for e in runs):.2g}x as fast as the others")),
}


def _note(runs: list[dict]) -> str:
    adopted = sorted({e["chain"] for e in runs if e["adopted"]})
    errors = [e for e in runs if "error" in e]
    kept = {e["chain"] for e in runs} - set(adopted) - {e["chain"] for e in errors}
    parts = []
    if adopted:
        parts.append(f"{_chain_list(adopted)} replaced by a rerun with a new seed")
    reason_of = {e["chain"]: e["reason"] for e in runs}
    for reason, why in (("stray", "the reruns strayed as well"),
                        ("failed", "the reruns failed to adapt as well")):
        these = sorted(c for c in kept if reason_of[c] == reason)
        if these:
            parts.append(f"{_chain_list(these)} kept: {why}")
    if errors:
        parts.append(f"a rerun failed ({errors[0]['error']}): the chains kept")
    why = []
    for reason, (key, text) in _WHY.items():
        these = [e for e in runs if e["reason"] == reason]
        if these:
            why.append(text(max(these, key=lambda e: e[key]), these))
    return (f"{len(runs)} chain rerun{'s' if len(runs) > 1 else ''}: " + "; ".join(parts)
            + f" ({'; '.join(why)}); the discarded chains' gradients and seconds are "
            "counted in warmup")


# ---- slow chains: sampled again with the parameters of the chain that mixes best --------

def _among_others(results: Sequence[ChainResult], rows: slice, chain: int) -> bool:
    """Whether ``chain`` samples where the others do and as cleanly: its mean lp within
    the diagnosis's allowed gap of their median (either way: a chain in a funnel's neck
    has a higher lp) and divergent in at most
    :data:`~ahmc_stan.convergence.DIVERGENCE_UNCONVERGED_FRACTION` of its iterations."""
    lp = _finite_lp(results, rows)
    if lp is None:
        return False
    means = lp.mean(axis=1)
    if abs(means[chain] - np.median(np.delete(means, chain))) > lp_gap_allowed(lp):
        return False
    divergent = results[chain].stats.get("divergent")
    return divergent is None or float(np.mean(divergent[rows] != 0)) <= \
        DIVERGENCE_UNCONVERGED_FRACTION


def _geometry(results: Sequence[ChainResult], rows: slice) -> bool:
    """Whether some chain's E-BFMI is low (:func:`~ahmc_stan.convergence.low_ebfmi`): the
    momenta cannot explore the energy, a funnel-like geometry that slows chains whatever
    their parameters, as the metric rerun also takes it (:mod:`ahmc_stan.sampling`)."""
    if any("energy" not in r.stats for r in results):
        return False
    return bool(low_ebfmi(np.array([r.stats["energy"][rows] for r in results]))[1].size)


def _slow(results: Sequence[ChainResult], rows: slice, rule=None):
    """The diagnosis's slow chains (:func:`~ahmc_stan.convergence.slow_chains`) on the
    unconstrained coordinates of ``rows``, and those coordinates (chains × draws × d),
    or ``None`` when a draw is not finite.  ``rule(x)``, if given, applies that rule to
    the coordinates (the caller's way to keep what it computes on them)."""
    x = np.array([r.positions[rows] for r in results])
    if not np.isfinite(x).all():
        return None
    return (slow_chains if rule is None else rule)(x), x


def slow_chain_cases(results: Sequence[ChainResult], warmup: int, rule=None
                     ) -> list[dict]:
    """The chains of ``results`` that mix far slower than the others by the diagnosis's
    rule (:func:`~ahmc_stan.convergence.slow_chains`, on the unconstrained coordinates of
    the post-warmup draws), each with its donor: of the chains that are not slow, the one
    with the largest bulk ESS per gradient in the slow chain's columns (its smallest over
    them).  Only a chain that samples where the others do, as cleanly (its lp, few
    divergences: :func:`_among_others`), and spreads no wider (:func:`reaches_further`)
    is concerned, and none where a chain's E-BFMI is low (:func:`_geometry`): anything
    else may be the posterior's, and is left to the diagnosis.
    ``{"chain", "donor", "ess_ratio"}`` each (0-based; the slow chain's smallest ESS
    ratio to the others' median).  ``rule`` as :func:`_slow` takes it."""
    from .rank_diagnostics import ess_bulk

    rows = _common_rows(results, warmup, 3, 20)
    found = None if rows is None else _slow(results, rows, rule)
    if not found or not found[0] or _geometry(results, rows):
        return []
    slow, x = found
    fast = [d for d in range(len(results)) if d not in {s[0] for s in slow}]
    cost = np.array([float(np.sum(r.stats["n_grad"][rows])) if "n_grad" in r.stats
                     else 1.0 for r in results])
    out = []
    for c, columns, ess, ref in slow:
        if not fast or reaches_further(x, c, columns, ess) or \
                not _among_others(results, rows, c):
            continue
        per_grad = [float(np.min(ess_bulk(x[d:d + 1][:, :, columns]))) / max(cost[d], 1.0)
                    for d in fast]
        out.append({"chain": c, "donor": fast[int(np.argmax(per_grad))],
                    "ess_ratio": float(np.min(ess / ref))})
    return out


def _mended(results: Sequence[ChainResult], warmup: int, chain: int) -> bool:
    """Whether ``chain`` of ``results`` (with its continuation in place) is no longer slow
    and still samples among the others as cleanly (:func:`_among_others`)."""
    rows = _common_rows(results, warmup, 3, 20)
    found = None if rows is None else _slow(results, rows)
    return bool(found) and all(s[0] != chain for s in found[0]) and \
        _among_others(results, rows, chain)


def last_state(own: ChainResult, parameters: ChainResult) -> ChainResult:
    """The one-iteration chain a continuation resumes (the sampler's ``continue_chain``):
    ``own``'s last position with ``parameters``'s last statistics (step size, number of
    steps) and records (metric)."""
    return ChainResult(own.positions[-1:], {k: v[-1:] for k, v in parameters.stats.items()},
                       0, 1, 0.0, 0.0, extras=parameters.extras)


def donor_start(results: Sequence[ChainResult], case: dict) -> ChainResult:
    """What a continuation of ``case["chain"]`` resumes: its own last position in the
    donor's parameters (:func:`last_state`)."""
    return last_state(results[case["chain"]], results[case["donor"]])


def restart_sampling(first: ChainResult, more: ChainResult, donor: ChainResult,
                     donor_chain: int) -> ChainResult:
    """``first`` with its sampling iterations turned into warmup and ``more`` (its
    continuation in ``donor``'s parameters, no warmup) as its draws: the positions and
    statistics of ``first``'s warmup, then ``more``'s; the evaluations of ``first``'s
    sampling iterations charged to its first iteration and their seconds to its warmup.
    The records are ``first``'s, with the donor's metric and a ``slow_chain`` entry."""
    w, s = first.n_warmup, first.n_sampling
    stats = {}
    for name, values in first.stats.items():
        tail = more.stats.get(name)
        if tail is None:
            tail = np.full(more.n_sampling, np.nan)
        stats[name] = np.concatenate([values[:w], tail[:more.n_sampling]])
        if name in COST_STATS and len(stats[name]):
            stats[name][0] += float(np.sum(values[w:w + s]))
    extras = {**first.extras, "inv_metric": donor.extras.get("inv_metric"),
              "slow_chain": {"parameters_of_chain": donor_chain + 1,
                             **(more.extras.get("continued") or {}),
                             "draws_discarded": s}}
    return ChainResult(np.concatenate([first.positions[:w], more.positions]), stats, w,
                       more.n_sampling, first.time_warmup + first.time_sampling,
                       more.time_sampling + more.time_warmup, more.interrupted, extras)


def continue_slow_chains(results: list[ChainResult], warmup: int,
                         resume: Callable[[list[tuple], int], tuple[list, bool]],
                         progress: bool = False, label: str = "", rule=None
                         ) -> tuple[list[ChainResult], dict | None]:
    """Sample each slow chain (:func:`slow_chain_cases`) again from its last draw in the
    parameters (step size, number of steps, metric) of the chain that mixes best, its
    first draws counted as warmup: ``resume(starts, round)`` runs the continuations,
    one per ``(chain, start)`` (:func:`donor_start`, from the chains as they stand,
    mended ones included), and returns ``(results, interrupted)``.  The continuation
    replaces the chain's draws (:func:`restart_sampling`) when the chain is no longer
    slow and still samples among the others as cleanly (:func:`_mended`); otherwise the
    first draws are kept and the continuation's cost charged to them.  A chain mended
    raises the others' median, by which another chain may now be slow: up to
    :data:`RERUN_ATTEMPTS` rounds, each chain continued at most once.  The failure this
    mends is a chain's own adaptation, not the posterior: on Caravan single chains end
    their warmup with Stan's diagonal far below a collinear pair's variance, or with a
    step size cut by a false tail find, and keep R-hat above 1.01 through twice the draws
    (README, "Slow chains").  Returns the chains and a record for
    ``fit.metadata["slow_chains"]`` (``None`` when no chain was slow).  ``rule`` as
    :func:`_slow` takes it."""
    results, runs, tried = list(results), [], set()
    for round_ in range(1, RERUN_ATTEMPTS + 1):
        cases = [k for k in slow_chain_cases(results, warmup, rule)
                 if k["chain"] not in tried]
        if not cases:
            break
        ids = [k["chain"] + 1 for k in cases]
        tried.update(k["chain"] for k in cases)
        if progress:
            print(f"{label}: {_chain_list(ids)} mixed far slower than the others; "
                  f"sampling {'them' if len(ids) > 1 else 'it'} again from the last draw "
                  "with the parameters of the chain that mixes best", file=sys.stderr,
                  flush=True)
        try:
            fresh, interrupted = resume([(k["chain"], donor_start(results, k))
                                         for k in cases], round_)
        except Exception as err:  # noqa: BLE001 — keep the chains as they are
            runs.extend({"chain": k["chain"] + 1, "round": round_, "adopted": False,
                         "error": f"{type(err).__name__}: {err}"} for k in cases)
            break
        for case, new in zip(cases, fresh):
            c, d = case["chain"], case["donor"]
            entry = {"chain": c + 1, "round": round_, "parameters_of_chain": d + 1,
                     "ess_ratio": round(case["ess_ratio"], 4), "adopted": False}
            old = results[c]
            if new is not None and not new.interrupted and new.n_sampling == old.n_sampling:
                joined = restart_sampling(old, new, results[d], d)
                trial = results[:c] + [joined] + results[c + 1:]
                entry["adopted"] = _mended(trial, warmup, c)
                if entry["adopted"]:
                    entry["charged"] = {"n_grad": int(np.sum(
                        old.stats.get("n_grad", np.zeros(0))[old.n_warmup:])),
                        "seconds": float(old.time_sampling)}
                    results[c] = joined
            if not entry["adopted"] and new is not None:
                entry["charged"] = charge(old, new)
            runs.append(entry)
        if interrupted:
            break
    if not runs:
        return results, None
    return results, {"runs": runs, "note": _slow_note(runs)}


def _slow_note(runs: list[dict]) -> str:
    errors = [e for e in runs if "error" in e]
    done = [e for e in runs if "error" not in e]
    adopted = [e for e in done if e["adopted"]]
    kept = [e["chain"] for e in done if not e["adopted"]]
    parts = [f"chain {e['chain']} sampled again in chain {e['parameters_of_chain']}'s "
             "parameters, its first draws counted as warmup" for e in adopted]
    if kept:
        parts.append(f"{_chain_list(kept)} kept: in the best chain's parameters still "
                     "slow, or divergent, or apart from the others")
    if errors:
        parts.append(f"a continuation failed ({errors[0]['error']}): "
                     f"{_chain_list([e['chain'] for e in errors])} kept")
    worst = ("" if not done else
             f" (ESS down to {min(e['ess_ratio'] for e in done):.2g}x the others')")
    return (f"{len(runs)} slow chain{'s' if len(runs) > 1 else ''}{worst}: "
            + "; ".join(parts) + "; the discarded draws' gradients and seconds are "
            "counted in warmup")
