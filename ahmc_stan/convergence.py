"""Stan-grade convergence diagnostics of a :class:`~ahmc_stan.fit.Fit`, for every sampler.

``diagnose(fit)`` (also :meth:`Fit.diagnose`; ``diagnose(fit, checks=...)`` runs only
the named ones of :data:`CHECKS`) runs the checks of CmdStan's ``diagnose``
and cmdstanpy's ``fit.diagnose()`` on the post-warmup draws of the parameters-block
columns (the first ``fit.n_params`` columns) and returns a :class:`Diagnosis`: a tuple of
:class:`Problem`, empty when all is well.  ``str(diagnosis)`` is the text report, one
paragraph per problem (``"No problems detected."`` when there is none).

Checks and their thresholds (module constants):

* ``rhat``: rank-normalised split R-hat (ArviZ) above :data:`RHAT_MAX` (1.01).  Columns
  whose draws are all equal (constant in every chain, e.g. the diagonal of a
  ``cholesky_factor_corr``) are skipped; an R-hat that cannot be computed for a varying
  column is reported.  ArviZ computes no R-hat from a single chain: one-chain fits get the
  ESS checks only.
* ``ess_bulk``, ``ess_tail``: bulk or tail ESS (ArviZ) below :data:`ESS_PER_CHAIN_MIN`
  (100) per chain, i.e. ``< 100 * chains``; the worst columns are named.
* ``divergences``: any divergent post-warmup transition (count and %).
* ``stuck_chain``: a chain that never moved (every post-warmup draw equal), a chain whose
  sd in a column is below :data:`STUCK_RELATIVE_SD` (1e-8) times the pooled sd while the
  column varies in another chain, or — when an ``lp`` statistic is recorded (NUTS'
  ``lp__`` and the HMC family's ``lp``) and there are at least two chains — a chain whose
  mean ``lp`` lies more than ``max(LP_GAP_SDS * s, LP_GAP_MIN)`` below the median of the
  other chains' means, ``s`` the median over chains of the within-chain sd of ``lp``
  (:data:`LP_GAP_SDS` = 4, :data:`LP_GAP_MIN` = 1 nat): a chain stuck in a minor mode.
* ``ebfmi``: per chain, for samplers that record ``energy`` (NUTS and the HMC family),
  E-BFMI = Σ(E_t − E_{t−1})² / Σ(E_t − Ē)² below :data:`EBFMI_MIN` (0.3).
* ``max_steps``: NUTS iterations whose ``treedepth`` reached the ``max_treedepth`` of the
  run (``metadata["cmdstan_args"]``, default :data:`DEFAULT_MAX_TREEDEPTH` = 10); for our
  samplers, iterations whose number of leapfrog steps in force (``num_steps_max``, else
  ``num_steps``) reached the sampler's ``max_num_steps`` cap — the option given to
  ``tune_and_sample`` (``metadata["options"]``) or else the default of the sampler's
  ``run_chain``; samplers without such a cap (or a cap that is not an integer, e.g.
  ARMHMC's ``None``) are not checked.
* ``step_size_spread``: max/min over chains of the per-chain median post-warmup
  ``step_size`` above :data:`STEP_SIZE_SPREAD_MAX` (10): the chains adapted to different
  regions (or one adaptation failed).
* ``slow_chain``: with at least 3 chains, in the parameters with the lowest pooled bulk
  ESS (up to 5), a chain whose own bulk ESS is below :data:`SLOW_CHAIN_FRACTION` (0.2) of
  the other chains' median and below :data:`ESS_PER_CHAIN_MIN`: one chain's adaptation
  (its step size and path length, named in the message) left it mixing far slower than
  the others, which is often the cause of a high R-hat.
* ``tail_rejection``: for samplers that record ``energy`` (NUTS and the HMC family), a
  parameter in one of whose tails (its lowest or highest :data:`TAIL_FRACTION` (10 %) of
  the pooled draws) the transitions starting there are rejected at a rate (1 − mean
  ``accept_stat``) of at least :data:`TAIL_REJECTION_MIN` (0.25) and at least
  :data:`TAIL_REJECTION_RATIO` (2.5) times the rate from its central half: the step size
  is too large for that region, which the chains then visit too rarely.  The chains can
  agree with each other (R-hat and ESS look fine) and still all under-state the spread
  of the parameter: on GARCH(1,1) with AHMC's low-rank metric, the sds of two parameters
  4–12 % low with no other warning (``comparisons/results/tail_rejection.md`` measures
  the rule on the robustness suite).  Not for thinned fits (``metadata["thin"] > 1``),
  whose kept draws do not record the move that leaves them.
* ``nongaussian``: the fit's low-rank chains' draws are far from Gaussian
  (``metadata["gaussian_misfit"]``, which :func:`~ahmc_stan.sampling.tune_and_sample`
  records on a fit some of whose chains ended with a low-rank metric, above
  :data:`~ahmc_stan.tuning.windows.NONGAUSSIAN_MISFIT`), and these are the draws
  returned: the metric rerun in Stan's diagonal did not converge and mixed slower, was
  not run (a low E-BFMI, or the call chose the metric or turned the rerun off) or was
  stopped.  Such chains can agree and all under-visit a skewed or long tail (the
  zero-inflated regression's intercept: its sd z −8.5 at R-hat 1.002 with nothing else
  flagged).
* ``incomplete``: the run was interrupted and the draws are a prefix.

Each :class:`Problem` says whether it means the draws have **not converged**
(``Problem.convergence``): R-hat, ESS, stuck chains, tail rejections (the chains have
not explored a tail, and their ESS overstates what they know: on GARCH the sds' z's have
a root mean square of 1.8–2), and divergences in more than
:data:`DIVERGENCE_UNCONVERGED_FRACTION` (1%) of the post-warmup iterations.  E-BFMI,
max-steps, step-size spread, a slow chain, draws far from Gaussian, an incomplete run
and rarer divergences are warnings that leave :attr:`Diagnosis.converged` true;
:func:`ahmc_stan.comparison.compare` ranks fits that have not converged last.

``tune_and_sample`` and ``run_nuts`` emit a :class:`ConvergenceWarning` with the report
when a fit has any problem (``diagnose=False`` switches it off).
"""

from __future__ import annotations

import inspect
import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import blas
from .rank_diagnostics import row_quantiles
from .tuning.tail_rejection import (REGION_PROBS, TAIL_FRACTION, TAIL_REJECTION_MIN,
                                    TAIL_REJECTION_RATIO, tail_rejections)
from .tuning.windows import NONGAUSSIAN_MISFIT

__all__ = ["diagnose", "CHECKS", "Diagnosis", "Problem", "ConvergenceWarning",
           "warn_if_problems", "RHAT_MAX", "ESS_PER_CHAIN_MIN",
           "DIVERGENCE_UNCONVERGED_FRACTION", "STUCK_RELATIVE_SD", "LP_GAP_SDS", "LP_GAP_MIN",
           "lp_gap_chains", "lp_gap_allowed", "slow_chains", "low_ebfmi", "EBFMI_MIN",
           "DEFAULT_MAX_TREEDEPTH", "STEP_SIZE_SPREAD_MAX", "SLOW_CHAIN_FRACTION",
           "TAIL_FRACTION", "TAIL_REJECTION_MIN", "TAIL_REJECTION_RATIO",
           "CONVERGENCE_KINDS"]

#: Split R-hat above this is a problem (Vehtari et al. 2021).
RHAT_MAX = 1.01
#: Bulk or tail ESS below this many per chain is a problem.
ESS_PER_CHAIN_MIN = 100
#: Divergences in more than this fraction of post-warmup iterations mean "not converged"
#: (fewer are still reported, as a warning).
DIVERGENCE_UNCONVERGED_FRACTION = 0.01
#: A chain's sd in a column below this times the pooled sd counts as no variation.
STUCK_RELATIVE_SD = 1e-8
#: A chain's mean lp this many within-chain sds below the other chains' is stuck ...
LP_GAP_SDS = 4.0
#: ... and at least this many nats below.
LP_GAP_MIN = 1.0
#: E-BFMI below this (per chain) suggests the momentum resampling explores the energy
#: distribution poorly (Betancourt 2016).
EBFMI_MIN = 0.3
#: CmdStan's default maximum tree depth.
DEFAULT_MAX_TREEDEPTH = 10
#: max/min over chains of the median step size above this is a problem.
STEP_SIZE_SPREAD_MAX = 10.0
#: A chain whose bulk ESS in one of the least-mixed parameters is below this fraction of
#: the other chains' median (and below ESS_PER_CHAIN_MIN) mixes far slower than they do.
SLOW_CHAIN_FRACTION = 0.2
#: Problem kinds that always mean the draws have not converged ("divergences" does
#: above DIVERGENCE_UNCONVERGED_FRACTION).
CONVERGENCE_KINDS = ("rhat", "ess_bulk", "ess_tail", "stuck_chain", "tail_rejection")

_WORST = 5  # columns named in a message


class ConvergenceWarning(UserWarning):
    """A fit failed one of :func:`diagnose`'s checks; the message is the report."""


@dataclass(frozen=True)
class Problem:
    """One failed check.

    ``kind``: ``"rhat"``, ``"ess_bulk"``, ``"ess_tail"``, ``"divergences"``,
    ``"stuck_chain"``, ``"slow_chain"``, ``"ebfmi"``, ``"max_steps"``,
    ``"step_size_spread"``, ``"tail_rejection"``, ``"nongaussian"`` or ``"incomplete"``;
    ``message``: the report's paragraph; ``columns``: the columns involved (worst first);
    ``chains``: the chains involved (0-based indices into ``fit.draws``; messages count
    from 1, like CmdStan); ``value``: the offending value (worst R-hat, smallest ESS,
    fraction divergent, smallest E-BFMI, the Gaussian misfit, ...); ``threshold``: the
    rule's threshold; ``convergence``: True when the problem means the draws have not
    converged (see the module docstring).
    """

    kind: str
    message: str
    columns: tuple[str, ...] = ()
    chains: tuple[int, ...] = ()
    value: float = math.nan
    threshold: float = math.nan
    convergence: bool = False

    @property
    def short(self) -> str:
        """A few words, e.g. ``"R-hat 1.86"``, ``"min ESS bulk 2.9"``."""
        v = self.value
        if self.kind == "rhat":
            return (f"R-hat {v:.3f}" if v < 100 else f"R-hat {v:.3g}") if math.isfinite(v) \
                else "R-hat undefined"
        if self.kind in ("ess_bulk", "ess_tail"):
            return (f"min ESS {self.kind[4:]} {v:.3g}" if math.isfinite(v)
                    else f"ESS {self.kind[4:]} undefined")
        if self.kind == "divergences":
            return f"{100 * v:.2g}% divergent"
        if self.kind == "stuck_chain":
            return "stuck chain" + ("s " if len(self.chains) > 1 else " ") + \
                ",".join(str(c + 1) for c in self.chains)
        if self.kind == "ebfmi":
            return f"E-BFMI {v:.2g}"
        if self.kind == "max_steps":
            return f"{100 * v:.2g}% at max steps"
        if self.kind == "step_size_spread":
            return f"step sizes differ {v:.3g}x"
        if self.kind == "slow_chain":
            return f"slow chain {self.chains[0] + 1} ({v:.2g}x the others' ESS)"
        if self.kind == "tail_rejection":
            return f"tail rejections {v:.2g}x ({self.columns[0]})"
        if self.kind == "nongaussian":
            return f"far from Gaussian (misfit {v:.3g})"
        if self.kind == "incomplete":
            return "incomplete"
        return self.kind


@dataclass(frozen=True)
class Diagnosis:
    """The problems :func:`diagnose` found (empty: none)."""

    problems: tuple[Problem, ...] = ()

    @property
    def ok(self) -> bool:
        """No problem at all (warnings included)."""
        return not self.problems

    @property
    def converged(self) -> bool:
        """No problem that means the draws have not converged (see the module doc)."""
        return not any(p.convergence for p in self.problems)

    def __bool__(self) -> bool:  # a Diagnosis is truthy when there is something to say
        return bool(self.problems)

    def __iter__(self):
        return iter(self.problems)

    def __len__(self) -> int:
        return len(self.problems)

    def kinds(self) -> tuple[str, ...]:
        return tuple(p.kind for p in self.problems)

    def get(self, kind: str) -> tuple[Problem, ...]:
        """The problems of one kind."""
        return tuple(p for p in self.problems if p.kind == kind)

    def summary(self) -> str:
        """Short text of the problems, ``"R-hat 1.86; min ESS bulk 2.9"`` ("" when ok)."""
        return "; ".join(p.short for p in self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "converged": self.converged,
                "problems": [dict(asdict(p), columns=list(p.columns), chains=list(p.chains))
                             for p in self.problems]}

    def __str__(self) -> str:
        if self.ok:
            return "No problems detected."
        return "\n\n".join(p.message for p in self.problems)


# ---- the checks ---------------------------------------------------------------------------

def diagnose(fit, checks=None) -> Diagnosis:
    """Run every check on ``fit`` (a :class:`~ahmc_stan.fit.Fit`), or those named in
    ``checks`` (keys of :data:`CHECKS`); see the module doc."""
    unknown = set(checks or ()) - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; choose from {list(CHECKS)}")
    problems: list[Problem] = []
    with blas.one_thread():  # the fit's small products: no BLAS pool rebuilt
        for name, check in CHECKS.items():
            if checks is None or name in checks:
                problems.extend(check(fit))
    return Diagnosis(tuple(problems))


def warn_if_problems(fit, stacklevel: int = 3) -> Diagnosis:
    """Diagnose ``fit`` and emit one :class:`ConvergenceWarning` with the report if it has
    problems — once per fit (a second call does not warn again)."""
    diagnosis = diagnose(fit)
    if diagnosis.problems and not getattr(fit, "_convergence_warned", False):
        fit._convergence_warned = True
        label = fit.sampler or "sampler"
        warnings.warn(f"{label}: {len(diagnosis)} problem(s) in the fit "
                      f"({fit.chains} chain{'s' if fit.chains != 1 else ''} x "
                      f"{fit.n_draws} draws):\n\n{diagnosis}",
                      ConvergenceWarning, stacklevel=stacklevel)
    return diagnosis


def _names(cols, fit) -> tuple[str, ...]:
    """Stan's names of the columns (``theta[1]``), as the user writes them."""
    names = fit.param_names  # built once: it converts every column's name
    return tuple(names[j] for j in cols)


def _rhat_text(v: float) -> str:
    return "undefined" if math.isnan(v) else f"{v:.4f}" if v < 100 else f"{v:.3g}"


def _listing(names, values, fmt) -> str:
    text = fmt if callable(fmt) else lambda v: format(v, fmt)
    shown = ", ".join(f"{n} ({text(v)})" for n, v in list(zip(names, values))[:_WORST])
    more = len(names) - _WORST
    return shown + (f" and {more} more" if more > 0 else "")


def _chains(chains) -> str:
    return ("chain " if len(chains) == 1 else "chains ") + ", ".join(str(c + 1) for c in chains)


def _check_incomplete(fit):
    if not fit.incomplete:
        return []
    why = (f"ran out of its time budget (max_seconds={fit.metadata['max_seconds']:g})"
           if fit.metadata.get("out_of_time") else "was interrupted")
    return [Problem("incomplete", f"The run {why}: the fit holds only the first "
                    f"{fit.n_draws} post-warmup draws of each chain.")]


def _varying(fit) -> np.ndarray:
    """Parameters-block columns whose draws are not all equal (computed once per fit:
    its draws do not change)."""
    cache = getattr(fit, "_check_cache", {})
    if "varying" not in cache:
        p = fit.params
        if p.size == 0:
            cache["varying"] = np.zeros(p.shape[2], dtype=bool)
        else:
            flat = p.reshape(-1, p.shape[2])
            with np.errstate(invalid="ignore"):
                cache["varying"] = ~np.all(flat == flat[:1], axis=0)
        cache["varying"].flags.writeable = False
    return cache["varying"]


def _check_rhat_ess(fit):
    k = fit.n_params
    if k == 0:
        return []
    if fit.n_draws < 4:
        return [Problem("ess_bulk", f"R-hat and ESS need at least 4 post-warmup draws per "
                        f"chain; this fit has {fit.n_draws}.", value=math.nan,
                        threshold=ESS_PER_CHAIN_MIN * fit.chains, convergence=True)]
    d = fit._diagnostics(params_only=True)
    cols = np.flatnonzero(_varying(fit))
    need = ESS_PER_CHAIN_MIN * fit.chains
    out = []
    rhat = d["r_hat"][:k][cols]
    # ArviZ computes no R-hat for a single chain (nan): the check then needs 2 chains
    bad = (np.isnan(rhat) & (fit.chains > 1)) | (rhat > RHAT_MAX)
    if bad.any():
        order = np.argsort(-np.where(np.isnan(rhat), np.inf, rhat)[bad], kind="stable")
        worst = cols[bad][order]
        values = d["r_hat"][worst]
        # chains that disagree have a low ESS too (the between-chain variance enters it);
        # where all mix, R-hat can be the noise of cheap draws: AHMC's at NUTS's draws
        # (README, "Neal's R-hat is a matter of draws"; at NUTS's gradients 1.002-1.005
        # on SV and LGCP)
        mixing = all(np.all(d[kind][:k][cols] >= need) for kind in ("ess_bulk", "ess_tail"))
        out.append(Problem(
            "rhat",
            f"The following parameters had split R-hat greater than {RHAT_MAX}: "
            f"{_listing(_names(worst, fit), values, _rhat_text)}. Such high values indicate "
            "incomplete mixing and biased estimation: the chains have not converged. "
            "Consider longer warmup, reparameterising the model or better priors."
            + (f" The bulk and tail ESS are above {ESS_PER_CHAIN_MIN} per chain, so the "
               "chains do mix: an R-hat this close to 1 can also be the noise of too few "
               "draws, which more draws (e.g. twice as many) would settle."
               if mixing else ""),
            columns=_names(worst, fit), value=float(np.nanmax(values)) if not np.isnan(
                values).all() else math.nan, threshold=RHAT_MAX, convergence=True))
    for kind, label in (("ess_bulk", "bulk"), ("ess_tail", "tail")):
        ess = d[kind][:k][cols]
        bad = np.isnan(ess) | (ess < need)
        if not bad.any():
            continue
        order = np.argsort(np.where(np.isnan(ess), -np.inf, ess)[bad], kind="stable")
        worst = cols[bad][order]
        values = d[kind][worst]
        out.append(Problem(
            kind,
            f"The following parameters had {label} ESS below {ESS_PER_CHAIN_MIN} per chain "
            f"(< {need} for {fit.chains} chain{'s' if fit.chains > 1 else ''}): "
            f"{_listing(_names(worst, fit), values, '.3g')}. Estimates of their "
            f"{'posterior means' if label == 'bulk' else 'tail quantiles'} are unreliable; "
            "run longer chains or improve the sampler's efficiency.",
            columns=_names(worst, fit),
            value=float(np.nanmin(values)) if not np.isnan(values).all() else math.nan,
            threshold=float(need), convergence=True))
    return out


def _check_divergences(fit):
    div = np.asarray(fit.sampler_stats["divergent"]) != 0
    n = int(div.sum())
    if n == 0:
        return []
    frac = n / div.size
    chains = tuple(int(c) for c in np.flatnonzero(div.any(axis=1)))
    serious = frac > DIVERGENCE_UNCONVERGED_FRACTION
    return [Problem(
        "divergences",
        f"{n} of {div.size} ({100 * frac:.2g}%) post-warmup transitions ended with a "
        f"divergence ({_chains(chains)}). These divergent "
        "transitions indicate that the sampler could not explore a region of high "
        "curvature, which biases the estimates"
        + (f"; above {100 * DIVERGENCE_UNCONVERGED_FRACTION:g}% the fit counts as not "
           "converged" if serious else "")
        + ". Try a smaller step size (a higher target acceptance, e.g. adapt_delta) or "
        "reparameterise the model (e.g. non-centred).",
        chains=chains, value=frac, threshold=DIVERGENCE_UNCONVERGED_FRACTION,
        convergence=serious)]


def _spreads(fit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each chain's sd of each parameter (chains × k), the pooled sd (k) and whether each
    chain's draws are all identical (chains): computed once per fit."""
    cache = getattr(fit, "_check_cache", {})
    if "spreads" not in cache:
        p = fit.params
        with warnings.catch_warnings(), np.errstate(invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            sd = p.std(axis=1)                                 # (chains, k)
            pooled = p.reshape(-1, p.shape[2]).std(axis=0)     # (k,)
        cache["spreads"] = (sd, pooled, np.all(p == p[:, :1], axis=(1, 2)))
    return cache["spreads"]


def _check_stuck(fit):
    p = fit.params
    chains, n, k = p.shape
    out = []
    if n >= 2 and k > 0:
        sd, pooled, never = _spreads(fit)                      # never: every draw identical
        flat = sd <= STUCK_RELATIVE_SD * pooled                # no variation in that chain
        varies = (pooled > 0) & ~flat                          # ... somewhere else it varies
        for c in range(chains):
            stuck_cols = np.flatnonzero(flat[c] & varies.any(axis=0))
            if never[c] and ((pooled > 0).any() or chains == 1):
                out.append(Problem(
                    "stuck_chain", f"Chain {c + 1} never moved: all its {n} post-warmup "
                    "draws are identical (no proposal was accepted). Its draws say nothing "
                    "about the posterior; check the initial values and the step size.",
                    chains=(c,), columns=_names(np.flatnonzero(pooled > 0), fit),
                    value=0.0, threshold=STUCK_RELATIVE_SD,
                    convergence=True))
            elif stuck_cols.size:
                names = _names(stuck_cols, fit)
                shown = ", ".join(names[:_WORST]) + (
                    f" and {len(names) - _WORST} more" if len(names) > _WORST else "")
                out.append(Problem(
                    "stuck_chain", f"Chain {c + 1} is stuck: its draws of {shown} do not "
                    "vary (sd below "
                    f"{STUCK_RELATIVE_SD:g} times the pooled sd) while other chains' do.",
                    chains=(c,), columns=names, value=float(np.max(
                        sd[c, stuck_cols] / pooled[stuck_cols])),
                    threshold=STUCK_RELATIVE_SD, convergence=True))
    lp = fit.sampler_stats.get("lp")
    stuck = {q.chains[0] for q in out}
    for c, mean, ref, gap in ([] if lp is None else lp_gap_chains(lp)):
        if c not in stuck:
            out.append(Problem(
                "stuck_chain", f"Chain {c + 1}'s mean lp ({mean:.4g}) is "
                f"{ref - mean:.3g} below the other chains' median ({ref:.4g}), "
                f"more than the allowed {gap:.3g} (max({LP_GAP_SDS:g} within-chain "
                f"sds, {LP_GAP_MIN:g})): it is probably stuck in a region of low "
                "posterior density (a minor mode or a local optimum), and its draws "
                "are not the posterior's.  Run again with init= values in the "
                "other chains' region (one of their draws), or with priors that "
                "exclude the region where the chain started.",
                chains=(c,), value=float(mean - ref), threshold=-gap,
                convergence=True))
    return out


def lp_gap_allowed(lp) -> float:
    """How far a chain's mean lp may lie below another's before it is flagged:
    ``max(LP_GAP_SDS * s, LP_GAP_MIN)``, ``s`` the median within-chain sd of ``lp``
    (chains × draws)."""
    return max(LP_GAP_SDS * float(np.median(np.std(lp, axis=1))), LP_GAP_MIN)


def lp_gap_chains(lp) -> list[tuple[int, float, float, float]]:
    """The chains of ``lp`` (chains × draws) whose mean lies more than
    :func:`lp_gap_allowed` below the median of the other chains' means:
    ``(chain, its mean, the others' median, the allowed gap)`` each (none with fewer than
    2 chains or 2 draws, or a non-finite lp)."""
    lp = np.asarray(lp, dtype=float)
    if lp.ndim != 2 or lp.shape[0] < 2 or lp.shape[1] < 2 or not np.isfinite(lp).all():
        return []
    means, gap = lp.mean(axis=1), lp_gap_allowed(lp)
    out = []
    for c in range(lp.shape[0]):
        ref = float(np.median(np.delete(means, c)))
        if means[c] < ref - gap:
            out.append((c, float(means[c]), ref, gap))
    return out


def low_ebfmi(energy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each chain's E-BFMI, Σ(E_t − E_{t−1})² / Σ(E_t − Ē)² (Betancourt 2016), from
    ``energy`` (chains × draws), and the chains where it is below :data:`EBFMI_MIN`."""
    energy = np.asarray(energy, dtype=float)
    num = np.sum(np.diff(energy, axis=1) ** 2, axis=1)
    den = np.sum((energy - energy.mean(axis=1, keepdims=True)) ** 2, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ebfmi = num / den
    return ebfmi, np.flatnonzero((den > 0) & np.isfinite(ebfmi) & (ebfmi < EBFMI_MIN))


def _check_ebfmi(fit):
    energy = fit.sampler_stats.get("energy")
    if energy is None or fit.n_draws < 3:
        return []
    ebfmi, bad = low_ebfmi(energy)
    if not bad.size:
        return []
    listing = ", ".join(f"chain {c + 1}: {ebfmi[c]:.3g}" for c in bad)
    return [Problem(
        "ebfmi", f"E-BFMI below {EBFMI_MIN} ({listing}). The momentum resampling explores "
        "the energy distribution poorly; the posterior may have heavy tails or a funnel, "
        "and a reparameterisation may help.",
        chains=tuple(int(c) for c in bad), value=float(ebfmi[bad].min()),
        threshold=EBFMI_MIN)]


def _step_cap(fit) -> tuple[str, np.ndarray, int, str] | None:
    """(statistic, values, cap, what) of the max-steps check, or None."""
    st, meta = fit.sampler_stats, fit.metadata
    if "treedepth" in st:
        args = meta.get("cmdstan_args") or {}
        cap = args.get("max_treedepth", DEFAULT_MAX_TREEDEPTH)
        if isinstance(cap, (int, np.integer)) and not isinstance(cap, bool):
            return ("treedepth", np.asarray(st["treedepth"]), int(cap),
                    "maximum tree depth")
        return None
    name = "num_steps_max" if "num_steps_max" in st else "num_steps" if "num_steps" in st \
        else None
    if name is None:
        return None
    options = meta.get("options") or {}
    cap = options.get("max_num_steps")
    if cap is None:
        cap = _default_max_num_steps(fit.sampler)
    if isinstance(cap, (int, np.integer)) and not isinstance(cap, bool) and cap > 0:
        return name, np.asarray(st[name]), int(cap), "maximum number of leapfrog steps"
    return None


def _default_max_num_steps(sampler: str):
    try:
        from .sampling import SAMPLERS

        param = inspect.signature(SAMPLERS[sampler]()).parameters.get("max_num_steps")
    except Exception:  # unknown sampler, import failure: no reliable cap
        return None
    return None if param is None else param.default


def _check_max_steps(fit):
    found = _step_cap(fit)
    if found is None:
        return []
    name, values, cap, what = found
    hit = values >= cap
    n = int(hit.sum())
    if n == 0:
        return []
    frac = n / hit.size
    chains = tuple(int(c) for c in np.flatnonzero(hit.any(axis=1)))
    return [Problem(
        "max_steps", f"{n} of {hit.size} ({100 * frac:.2g}%) post-warmup transitions hit "
        f"the {what} ({name} = {cap}). The trajectories were cut short, which costs "
        "efficiency (not validity); raise the limit"
        + (" (max_treedepth)" if name == "treedepth" else " (max_num_steps)")
        + " or reparameterise.",
        chains=chains, value=frac, threshold=float(cap))]


def _check_step_size(fit):
    steps = np.asarray(fit.sampler_stats["step_size"], dtype=float)
    if fit.chains < 2 or fit.n_draws == 0:
        return []
    med = np.median(steps, axis=1)
    if not (np.isfinite(med).all() and (med > 0).all()):
        return []
    ratio = float(med.max() / med.min())
    if ratio <= STEP_SIZE_SPREAD_MAX:
        return []
    lo, hi = int(np.argmin(med)), int(np.argmax(med))
    return [Problem(
        "step_size_spread", f"The chains' median step sizes differ by a factor of "
        f"{ratio:.3g} (chain {lo + 1}: {med[lo]:.3g}, chain {hi + 1}: {med[hi]:.3g}), more "
        f"than {STEP_SIZE_SPREAD_MAX:g}: the chains adapted to different regions of the "
        "posterior, or one adaptation failed.",
        chains=(lo, hi), value=ratio, threshold=STEP_SIZE_SPREAD_MAX)]


def _chain_setting(fit, c: int) -> str:
    """Chain ``c``'s median step size and path length (leapfrog steps, or NUTS's tree
    depth) beside the other chains' range, as far as the fit records them."""
    st, parts = fit.sampler_stats, []
    for name, label in (("step_size", "step size"), ("num_steps_max", "number of leapfrog "
                        "steps"), ("treedepth", "tree depth")):
        if name not in st:
            continue
        med = np.median(np.asarray(st[name], dtype=float), axis=1)
        others = np.delete(med, c)
        parts.append(f"median {label} {med[c]:.3g} (other chains {others.min():.3g}"
                     f"–{others.max():.3g})")
    return "; ".join(parts)


def slow_chains(x: np.ndarray, pooled: np.ndarray | None = None) -> list[tuple]:
    """The ``slow_chain`` rule on draws ``x`` (chains × draws × columns): in the columns
    of lowest pooled bulk ESS (``pooled``, ArviZ's when not given; up to 5), each chain
    whose own bulk ESS is below :data:`SLOW_CHAIN_FRACTION` of the other chains' median
    and below :data:`ESS_PER_CHAIN_MIN`.  One ``(chain, columns, ess, others' median)``
    per slow chain, the columns those where it is slow (indices into ``x``'s)."""
    from .rank_diagnostics import ess_bulk

    x = np.asarray(x, dtype=float)
    if pooled is None:
        pooled = ess_bulk(x)
    worst = np.argsort(np.where(np.isnan(pooled), np.inf, pooled), kind="stable")[:_WORST]
    own = np.array([ess_bulk(x[c:c + 1][:, :, worst])
                    for c in range(x.shape[0])])                       # (chains, columns)
    out = []
    for c in range(x.shape[0]):
        ref = np.median(np.delete(own, c, axis=0), axis=0)
        slow = (own[c] < SLOW_CHAIN_FRACTION * ref) & (own[c] < ESS_PER_CHAIN_MIN)
        if slow.any():
            out.append((c, worst[slow], own[c, slow], ref[slow]))
    return out


def seed_slow_chains(fit, found: list[tuple]) -> None:
    """Hand ``fit``'s slow-chain check the finding of :func:`slow_chains` on its
    parameters' draws with their own pooled bulk ESS, which the sampler's slow-chain rule
    computed on the same draws: the check's own inputs where every column varies."""
    if fit.n_params and _varying(fit).all():
        fit._check_cache["slow_chains"] = found


def _check_slow_chain(fit):
    k, chains = fit.n_params, fit.chains
    if k == 0 or chains < 3 or fit.n_draws < 20:
        return []
    cols = np.flatnonzero(_varying(fit))
    if cols.size == 0:
        return []
    out = []
    cache = getattr(fit, "_check_cache", {})  # the draws do not change: computed once
    if "slow_chains" not in cache:
        pooled = fit._diagnostics(params_only=True)["ess_bulk"][:k][cols]
        cache["slow_chains"] = slow_chains(fit.params[:, :, cols], pooled)
    for c, where, ess, ref in cache["slow_chains"]:
        names = _names(cols[where], fit)
        listing = ", ".join(f"{n} {e:.3g} (others' median {r:.3g})"
                            for n, e, r in zip(names, ess, ref))
        setting = _chain_setting(fit, c)
        out.append(Problem(
            "slow_chain", f"Chain {c + 1} mixes far slower than the others: its bulk ESS in "
            f"{listing}." + (f" Its adaptation: {setting}." if setting else "")
            + " Its draws dominate the uncertainty of these parameters; a longer warmup "
            "or another seed may adapt it better.",
            chains=(c,), columns=names, value=float(np.min(ess / ref)),
            threshold=SLOW_CHAIN_FRACTION))
    return out


def _check_tail_rejection(fit):
    st = fit.sampler_stats
    k = fit.n_params
    if "energy" not in st or k == 0 or fit.n_draws < 50 or fit.metadata.get("thin", 1) > 1:
        return []  # thinned: a kept draw's statistic is not the move from the one before
    cols = np.flatnonzero(_varying(fit))
    if cols.size == 0:
        return []
    rej = 1.0 - np.asarray(st["accept_stat"], dtype=float)[:, 1:].reshape(-1, 1)
    if not np.isfinite(rej).all():
        return []
    cache = getattr(fit, "_check_cache", {})  # the draws do not change: computed once
    if "tail_rejections" not in cache:
        # the transition that starts at draw t is recorded with draw t + 1; the regions
        # are those of all the draws (quantiles the call may have kept)
        x = fit.params[:, :-1, cols].reshape(-1, cols.size)
        q = fit._kept_quantiles(REGION_PROBS)
        q = (row_quantiles(fit.params[:, :, cols].reshape(-1, cols.size).T, REGION_PROBS)
             if q is None else q[:, cols])
        cache["tail_rejections"] = tail_rejections(x, rej, quantiles=q)
    found = cache["tail_rejections"]
    if not found:
        return []
    found = found[:_WORST]
    names = _names(cols[[f.column for f in found]], fit)
    listing = "; ".join(
        f"{name}'s {f.side} tail {100 * f.rate:.0f}% against {100 * f.mid_rate:.0f}%"
        for name, f in zip(names, found))
    return [Problem(
        "tail_rejection", f"Transitions starting in a tail of these parameters (their "
        f"lowest or highest {100 * TAIL_FRACTION:g}% of draws) were rejected far more often "
        f"than from their central half: {listing}. The step size is too large for that "
        "region, so the chains visit it too rarely: even with a good R-hat and ESS the "
        "spread and the tail quantiles of such parameters can be under-estimated. Try "
        "metric='diag' (AHMC: its smaller steps reach such tails), a higher adapt_delta "
        "(e.g. 0.95) or a reparameterisation.",
        columns=names, value=found[0].ratio, threshold=TAIL_REJECTION_RATIO,
        convergence=True)]


def _check_nongaussian(fit):
    record = fit.metadata.get("gaussian_misfit")
    misfit = record.get("misfit", math.nan) if isinstance(record, dict) else math.nan
    if not misfit > NONGAUSSIAN_MISFIT:
        return []
    rerun = fit.metadata.get("metric_rerun") or {}
    why = ("was not run (the call chose the metric or set metric_rerun=False)" if not rerun
           else "was not run (a low E-BFMI points to the geometry)" if rerun.get("ran") is False
           else "was stopped" if rerun.get("stopped") and not rerun.get("runs")
           else "did not converge and mixed slower")
    return [Problem(
        "nongaussian", f"The draws are far from Gaussian (misfit {misfit:.3g}, above "
        f"{NONGAUSSIAN_MISFIT:g}: the gradients at the draws are far from an affine "
        "function of them), and they were drawn with a low-rank metric, whose chains can "
        "agree and all under-visit a skewed or long tail: even with a good R-hat and ESS "
        "the spread and tail quantiles of such parameters can be under-estimated. The "
        f"rerun in Stan's diagonal {why} (fit.metadata['metric_rerun']), so these are "
        "the low-rank chains' draws. Compare with metric='diag' (and a higher "
        "adapt_delta), or reparameterise.",
        value=misfit, threshold=NONGAUSSIAN_MISFIT)]


#: The checks in the order :func:`diagnose` runs them (``rhat_ess`` gives the kinds
#: ``rhat``, ``ess_bulk`` and ``ess_tail``; every other check the kind of its name,
#: ``step_size`` the kind ``step_size_spread``, ``stuck`` ``stuck_chain``).
CHECKS = {"incomplete": _check_incomplete, "rhat_ess": _check_rhat_ess,
          "divergences": _check_divergences, "stuck": _check_stuck,
          "slow_chain": _check_slow_chain, "ebfmi": _check_ebfmi,
          "max_steps": _check_max_steps, "step_size": _check_step_size,
          "tail_rejection": _check_tail_rejection, "nongaussian": _check_nongaussian}
