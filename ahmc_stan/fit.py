"""The result of a sampler run: one ``Fit`` type for CmdStan's NUTS and every sampler of ours.

Layout
------
``draws`` has shape ``(chains, draws, columns)`` on the constrained scale.  The first
``n_params`` columns are the ``parameters`` block, exactly the columns of
``StanModel.param_names()`` in that order (column-major); any further columns are
transformed parameters / generated quantities.  ``param_names`` names every column as
Stan does (``M[1,2]``), ``columns`` as BridgeStan does (``M.1.2``).

``sampler_stats`` maps a statistic's name to an array ``(chains, draws)`` with one value
per iteration.  Every sampler records ``accept_stat``, ``step_size``, ``n_grad`` (gradient
evaluations made in that iteration) and ``divergent``; sampler-specific statistics
(``treedepth``, ``energy``, ``lp``, ``path_length``, ...) may follow, among them the
counts of the other kinds of evaluation (:data:`ahmc_stan.costs.COST_STATS`):
``n_density`` (density only), ``n_hvp`` (Hessian-vector products), ``n_hessian``,
``n_third`` (third-derivative tensors).  ``warmup_draws`` and
``warmup_sampler_stats`` hold the same for the warmup iterations when a sampler keeps them.

Efficiency
----------
``Fit.efficiency()`` computes ESS as ``arviz.ess`` does (methods ``"bulk"`` and
``"tail"``; :mod:`.rank_diagnostics` runs ArviZ's estimators on all columns at once) on
the ``(chain, draw)`` array of every parameters-block column, identically for every
sampler, and divides the smallest bulk-ESS by the *gradient-equivalents* and the seconds
spent (sampling only, and warmup + sampling).

Gradient-equivalents: ``n_grad_equiv = Σ_kind cost_units[kind] · n_eval[kind]``, the
evaluations of every kind (``n_eval_warmup`` / ``n_eval_sampling``: ``gradient``,
``density``, ``hvp``, ``hessian``, ``third``) each weighted by its cost in gradients as
measured on the model (``cost_units``, :func:`ahmc_stan.costs.cost_units`; a gradient
is 1).  For NUTS and every gradient-only sampler it is the number of gradients.  A kind
that was used but has no cost unit makes the equivalents, and the ESS per gradient,
``nan``.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

__all__ = ["Fit", "Deferred", "load_fit", "REQUIRED_STATS", "ARVIZ_STAT_NAMES"]

#: Statistics every sampler records, one value per iteration.
REQUIRED_STATS = ("accept_stat", "step_size", "n_grad", "divergent")

#: Our statistic names → ArviZ's standard ``sample_stats`` names.
ARVIZ_STAT_NAMES = {
    "accept_stat": "acceptance_rate",
    "step_size": "step_size",
    "n_grad": "n_steps",
    "divergent": "diverging",
    "treedepth": "tree_depth",
    "energy": "energy",
    "lp": "lp",
}

#: The quantiles :meth:`Fit.summary` reports (cmdstanpy's 5 %, 50 %, 95 %).
SUMMARY_PROBS = (0.05, 0.5, 0.95)
#: The quantiles a call keeps of the parameters with their diagnostics (one sort of each
#: column serves both): the summary's and the diagnosis's tail check's
#: (:data:`ahmc_stan.tuning.tail_rejection.REGION_PROBS`).
QUANTILE_PROBS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)

_FORMAT_VERSION = 1


def _arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # arviz's import-time notice
        import arviz

    return arviz


def _diagnostics(values: np.ndarray, keys=None) -> dict[str, np.ndarray]:
    """ArviZ's diagnostics of every column of a ``(chain, draw, column)`` array:
    ``arviz.ess(values[:, :, j], method=...)``, ``arviz.rhat`` and ``arviz.mcse`` per
    column (or those named in ``keys``), computed for all columns at once
    (:mod:`.rank_diagnostics`, equal to ArviZ's to rounding)."""
    from .rank_diagnostics import KEYS, diagnostics

    return diagnostics(values, KEYS if keys is None else keys)


def _as_stats(stats: Mapping[str, Any] | None, shape: tuple[int, int], what: str
              ) -> dict[str, np.ndarray]:
    out = {}
    for name, value in (stats or {}).items():
        arr = np.asarray(value)
        if arr.shape != shape:
            raise ValueError(f"{what}[{name!r}] has shape {arr.shape}; expected {shape} "
                             "(chains, draws)")
        out[str(name)] = arr
    return out


class Deferred:
    """An array of known ``shape`` that ``make()`` computes when first needed (a Fit's
    :attr:`Fit.warmup_draws`)."""

    __slots__ = ("shape", "make")

    def __init__(self, shape: tuple[int, ...], make: Callable[[], np.ndarray]):
        self.shape, self.make = tuple(int(n) for n in shape), make


class Fit:
    """Draws, per-iteration sampler statistics and cost of one sampler run.

    Parameters
    ----------
    draws : ``(chains, draws, columns)`` constrained draws; parameters-block columns first.
    param_names : one name per column (``StanModel.param_names()`` names, then any
        transformed parameters / generated quantities), in BridgeStan's form (``L.2.1``)
        or Stan's (``L[2,1]``).
    sampler_stats : name → ``(chains, draws)``; must contain ``accept_stat``,
        ``step_size``, ``n_grad`` and ``divergent``.
    n_params : number of parameters-block columns (default: all columns); diagnostics
        of efficiency use only these.
    warmup_draws, warmup_sampler_stats : the same for the warmup iterations (optional;
        the draws may be :class:`Deferred`, computed when first read).
    n_grad_warmup, n_grad_sampling : total gradient evaluations over all chains; default
        to the sums of the ``n_grad`` statistic (warmup: 0 when warmup stats are absent).
    n_eval_warmup, n_eval_sampling : kind → total evaluations of the other kinds
        (``density``, ``hvp``, ``hessian``, ``third``); default to the sums of their
        statistics (:data:`~ahmc_stan.costs.COST_STATS`), entries given here override.
    cost_units : kind → cost of one evaluation in gradients (``gradient`` is 1); what
        converts the evaluations into gradient-equivalents.
    time_warmup, time_sampling : seconds, summed over chains (``nan`` if unknown).
    sampler : the sampler's name (``"nuts"`` for CmdStan's NUTS).
    metadata : JSON-serialisable dict (numpy arrays and scalars are allowed too).
    incomplete : True if the run was interrupted and the draws are a prefix.
    """

    def __init__(self, draws: np.ndarray, param_names: list[str],
                 sampler_stats: Mapping[str, Any], *, n_params: int | None = None,
                 warmup_draws: np.ndarray | None = None,
                 warmup_sampler_stats: Mapping[str, Any] | None = None,
                 n_grad_warmup: int | None = None, n_grad_sampling: int | None = None,
                 n_eval_warmup: Mapping[str, int] | None = None,
                 n_eval_sampling: Mapping[str, int] | None = None,
                 cost_units: Mapping[str, float] | None = None,
                 time_warmup: float = math.nan, time_sampling: float = math.nan,
                 sampler: str = "", metadata: Mapping[str, Any] | None = None,
                 incomplete: bool = False):
        draws = np.asarray(draws, dtype=float)
        if draws.ndim != 3:
            raise ValueError(f"draws must be (chains, draws, columns); got shape {draws.shape}")
        self.draws = draws
        self.columns = [flat_name(str(n)) for n in param_names]
        if len(self.columns) != draws.shape[2]:
            raise ValueError(f"{len(self.columns)} names for {draws.shape[2]} columns")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError("column names are not unique")
        self.n_params = draws.shape[2] if n_params is None else int(n_params)
        if not 0 <= self.n_params <= draws.shape[2]:
            raise ValueError(f"n_params={n_params} outside 0..{draws.shape[2]}")
        chains, n_draws = draws.shape[:2]
        self.sampler_stats = _as_stats(sampler_stats, (chains, n_draws), "sampler_stats")
        missing = [k for k in REQUIRED_STATS if k not in self.sampler_stats]
        if missing:
            raise ValueError(f"sampler_stats lacks the required statistics {missing}")

        if warmup_draws is not None:
            if not isinstance(warmup_draws, Deferred):
                warmup_draws = np.asarray(warmup_draws, dtype=float)
            shape = tuple(warmup_draws.shape)
            if len(shape) != 3 or shape[0] != chains or shape[2] != draws.shape[2]:
                raise ValueError(f"warmup_draws has shape {shape}; expected "
                                 f"({chains}, warmup, {draws.shape[2]})")
        self._warmup_draws = warmup_draws
        if warmup_sampler_stats is not None:
            first = next(iter(warmup_sampler_stats.values()), None)
            n_warm = (warmup_draws.shape[1] if warmup_draws is not None
                      else np.shape(first)[1] if first is not None else 0)
            self.warmup_sampler_stats = _as_stats(warmup_sampler_stats, (chains, n_warm),
                                                  "warmup_sampler_stats")
        else:
            self.warmup_sampler_stats = None

        if n_grad_sampling is None:
            n_grad_sampling = int(np.sum(self.sampler_stats["n_grad"]))
        if n_grad_warmup is None:
            ws = self.warmup_sampler_stats or {}
            n_grad_warmup = int(np.sum(ws["n_grad"])) if "n_grad" in ws else 0
        self.n_grad_warmup = int(n_grad_warmup)
        self.n_grad_sampling = int(n_grad_sampling)
        self.n_eval_sampling = _evaluations(self.sampler_stats, self.n_grad_sampling,
                                            n_eval_sampling)
        self.n_eval_warmup = _evaluations(self.warmup_sampler_stats or {},
                                          self.n_grad_warmup, n_eval_warmup)
        self.cost_units = {"gradient": 1.0, **{str(k): float(v) for k, v in
                                               (cost_units or {}).items()}}
        self.time_warmup = float(time_warmup)
        self.time_sampling = float(time_sampling)
        self.sampler = str(sampler)
        self.metadata = dict(metadata or {})
        self.incomplete = bool(incomplete)
        self._diag_cache: dict[str, np.ndarray] | None = None
        self._param_diag_cache: dict[str, np.ndarray] | None = None
        #: the parameters-block columns' quantiles at :data:`QUANTILE_PROBS`, ``(prob,
        #: column)``, where the call computed them with their diagnostics (one sort)
        self._param_quantiles: np.ndarray | None = None
        #: results of the diagnosis's costlier checks on these draws (:mod:`.convergence`)
        self._check_cache: dict[str, Any] = {}

    # ---- shape -----------------------------------------------------------------------

    @property
    def param_names(self) -> list[str]:
        """Stan's name of every column (``theta[1]``, ``L[2,1]``), as cmdstanpy's
        ``column_names``; :attr:`columns` has the same in BridgeStan's form (``L.2.1``)."""
        return [stan_name(n) for n in self.columns]

    @property
    def chains(self) -> int:
        return self.draws.shape[0]

    @property
    def n_draws(self) -> int:
        """Sampling draws per chain."""
        return self.draws.shape[1]

    @property
    def warmup_draws(self) -> np.ndarray | None:
        """The warmup iterations' draws ``(chains, warmup, columns)``, or None.  A sampler
        may hand them over :class:`Deferred` (constraining them costs as much as the
        sampling draws'): they are then computed on first use, the same values."""
        warm = self._warmup_draws
        if isinstance(warm, Deferred):
            values = np.asarray(warm.make(), dtype=float)
            if values.shape != warm.shape:
                raise ValueError(f"deferred warmup_draws came with shape {values.shape}; "
                                 f"announced {warm.shape}")
            self._warmup_draws = warm = values
        return warm

    @property
    def n_warmup(self) -> int:
        """Saved warmup iterations per chain (0 if none were kept)."""
        return 0 if self._warmup_draws is None else self._warmup_draws.shape[1]

    def __getstate__(self) -> dict:
        """Pickled and copied with the warmup draws computed (no deferred work)."""
        self.warmup_draws  # noqa: B018  (computes them)
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        if "warmup_draws" in state:  # pickled before the warmup draws could be deferred
            state["_warmup_draws"] = state.pop("warmup_draws")
        self.__dict__.update(state)

    @property
    def params(self) -> np.ndarray:
        """The parameters-block columns: ``(chains, draws, n_params)``."""
        return self.draws[:, :, : self.n_params]

    def __repr__(self) -> str:
        flag = ", incomplete" if self.incomplete else ""
        return (f"Fit(sampler={self.sampler!r}, chains={self.chains}, draws={self.n_draws}, "
                f"columns={len(self.columns)}, n_params={self.n_params}{flag})")

    def _equivalents(self, counts: Mapping[str, int]) -> float:
        total = 0.0
        for kind, n in counts.items():
            if n:
                total += self.cost_units.get(kind, math.nan) * n
        return total

    def _gradients_only(self) -> bool:
        return not any(n for k, n in {**self.n_eval_warmup, **self.n_eval_sampling}.items()
                       if k != "gradient")

    @property
    def n_grad_equiv_warmup(self) -> float:
        """Warmup evaluations of every kind in gradients (module docstring)."""
        return self._equivalents(self.n_eval_warmup)

    @property
    def n_grad_equiv_sampling(self) -> float:
        """Sampling evaluations of every kind in gradients (module docstring)."""
        return self._equivalents(self.n_eval_sampling)

    @property
    def step_size(self) -> np.ndarray:
        """Each chain's step size at its last draw (``nan`` where the sampler records
        none), as cmdstanpy's ``step_size``."""
        values = self.sampler_stats["step_size"]
        if values.shape[1] == 0:
            return np.full(self.chains, math.nan)
        return np.asarray(values[:, -1], dtype=float)

    @property
    def inv_metric(self) -> list[np.ndarray | None] | None:
        """Each chain's adapted inverse metric (a vector: diagonal; a matrix: dense;
        ``None``: identity or a sampler without one), as cmdstanpy's ``metric``; ``None``
        if the fit does not record it."""
        if "inv_metric" in self.metadata:  # CmdStan's NUTS: one row (or matrix) per chain
            return [np.asarray(m, dtype=float) for m in self.metadata["inv_metric"]]
        chains = self.metadata.get("chains")
        if not chains:
            return None
        def dense(m):
            if isinstance(m, Mapping):  # a diagonal-plus-low-rank metric's factors
                from .metric import LowRankInvMetric

                return LowRankInvMetric(**{k: np.asarray(v, float) for k, v in m.items()}
                                        ).to_dense()
            return None if m is None else np.asarray(m, float)

        return [dense(c.get("inv_metric")) for c in chains]

    def column(self, name: str) -> np.ndarray:
        """The ``(chains, draws)`` draws of one column, by name: ``M.1.2`` or Stan's
        ``M[1,2]``."""
        try:
            return self.draws[:, :, self.columns.index(flat_name(name))]
        except ValueError:
            raise KeyError(f"no column {name!r}") from None

    def chain_draws(self, chain: int) -> np.ndarray:
        """All post-warmup draws ``(n, columns)`` of one chain (0-based), those beyond
        the common length of an interrupted run's chains included
        (``metadata["extra_draws"]``); ``draws`` and every summary use the common
        length."""
        extra = self.metadata.get("extra_draws")
        own = self.draws[chain]
        if not extra:
            return own
        return np.concatenate([own, np.asarray(extra[chain], float).reshape(-1, own.shape[1])])

    def stan_variables(self) -> dict[str, np.ndarray]:
        """Every variable as an array ``(chains, draws, *dims)`` (the columns ``a.i.j``
        gathered into ``a[i-1, j-1]``, as in :meth:`to_arviz`)."""
        return _gather(self.draws, self.columns)

    def stan_variable(self, name: str) -> np.ndarray:
        """One variable's draws shaped ``(chains, draws, *dims)``, as cmdstanpy's
        ``stan_variable`` but keeping the chain axis."""
        variables = self.stan_variables()
        if name not in variables:
            raise KeyError(f"no variable {name!r}; the fit has {', '.join(variables)}")
        return variables[name]

    def draws_pd(self) -> "pandas.DataFrame":  # noqa: F821
        """The post-warmup draws as one table, as cmdstanpy's ``draws_pd``: ``chain__``,
        ``iter__`` (1-based, within the chain), ``draw__`` (1-based, over all chains), the
        sampler statistics (``name__``) and the columns under Stan's names
        (``theta[1]``, ``L[2,1]``)."""
        import pandas as pd

        chains, n = self.chains, self.n_draws
        table = {"chain__": np.repeat(np.arange(1, chains + 1), n),
                 "iter__": np.tile(np.arange(1, n + 1), chains),
                 "draw__": np.arange(1, chains * n + 1)}
        for stat, values in self.sampler_stats.items():
            table[f"{stat}__"] = np.asarray(values).reshape(-1)
        for j, name in enumerate(self.param_names):
            table[name] = self.draws[:, :, j].reshape(-1)
        return pd.DataFrame(table)

    def diagnose(self) -> "Diagnosis":  # noqa: F821
        """Stan-grade convergence checks (R-hat, ESS, divergences, stuck chains, E-BFMI,
        max tree depth / steps, step-size spread, interruption) of the parameters-block
        columns: a :class:`~ahmc_stan.convergence.Diagnosis` (``.ok``, ``.converged``,
        ``.problems``; ``str()`` is the report)."""
        from .convergence import diagnose

        return diagnose(self)

    # ---- diagnostics -------------------------------------------------------------------

    def _diagnostics(self, params_only: bool = False) -> dict[str, np.ndarray]:
        """The diagnostics of every column (:func:`_diagnostics`), computed once; with
        ``params_only`` at least the bulk and tail ESS and R-hat of the parameters-block
        columns, the first :attr:`n_params` (what convergence is judged by: the
        transformed parameters and generated quantities, often as many again, and the
        MCSEs wait until :meth:`summary` asks for them)."""
        if self._diag_cache is None and params_only:
            if self._param_diag_cache is None:
                from .rank_diagnostics import CONVERGENCE_KEYS

                self._param_diag_cache = _diagnostics(self.draws[:, :, :self.n_params],
                                                      CONVERGENCE_KEYS)
            return self._param_diag_cache
        if self._diag_cache is None:
            self._diag_cache = self._all_diagnostics()
        return self._diag_cache

    def _all_diagnostics(self) -> dict[str, np.ndarray]:
        """:func:`_diagnostics` of every column; those of the parameters-block columns
        already computed (:meth:`_diagnostics` with ``params_only``) are kept, not
        computed again (each column's are its own, whatever the others)."""
        from .rank_diagnostics import KEYS

        kept, k = self._param_diag_cache, self.n_params
        if kept is None or k == 0:
            return _diagnostics(self.draws)
        params = _diagnostics(self.draws[:, :, :k], [key for key in KEYS if key not in kept])
        rest = _diagnostics(self.draws[:, :, k:])
        return {key: np.concatenate([kept[key] if key in kept else params[key], rest[key]])
                for key in KEYS}

    def summary(self) -> "pandas.DataFrame":  # noqa: F821
        """Per-column mean, sd, MCSE, bulk/tail ESS and rank-normalised split R-hat
        (ArviZ), and the 5 %, 50 % and 95 % quantiles (as cmdstanpy's summary).

        Indexed by Stan's names (``theta[1]``, ``L[2,1]``); columns ``mean, sd,
        mcse_mean, mcse_sd, ess_bulk, ess_tail, r_hat, 5%, 50%, 95%``.
        """
        import pandas as pd

        from .rank_diagnostics import row_quantiles

        d = self._diagnostics()
        flat = self.draws.reshape(-1, self.draws.shape[2])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            sd = flat.std(axis=0, ddof=1) if flat.shape[0] > 1 else np.full(flat.shape[1], np.nan)
        kept, k = self._kept_quantiles(SUMMARY_PROBS), self.n_params
        if kept is not None:
            q = np.concatenate([kept, row_quantiles(flat[:, k:].T, SUMMARY_PROBS)], axis=1)
        elif flat.shape[0]:
            q = row_quantiles(flat.T, SUMMARY_PROBS)
        else:
            q = np.full((len(SUMMARY_PROBS), flat.shape[1]), np.nan)
        return pd.DataFrame({
            "mean": flat.mean(axis=0), "sd": sd, "mcse_mean": d["mcse_mean"],
            "mcse_sd": d["mcse_sd"], "ess_bulk": d["ess_bulk"], "ess_tail": d["ess_tail"],
            "r_hat": d["r_hat"], "5%": q[0], "50%": q[1], "95%": q[2],
        }, index=pd.Index(self.param_names, name="param"))

    def _kept_quantiles(self, probs) -> np.ndarray | None:
        """The parameters-block columns' quantiles at ``probs`` (each one of
        :data:`QUANTILE_PROBS`), ``(prob, column)``, where the call kept them (numpy's
        default method over all chains' draws); else None."""
        if self._param_quantiles is None or not set(probs) <= set(QUANTILE_PROBS):
            return None
        return self._param_quantiles[[QUANTILE_PROBS.index(p) for p in probs]]

    def efficiency(self) -> dict[str, float]:
        """ESS over the parameters-block columns and its cost in gradients and seconds.

        ``min_ess_per_grad`` = min bulk-ESS / sampling gradient-equivalents
        (``n_grad_equiv_sampling``: evaluations of every kind weighted by their
        ``cost_units``, see the module docstring), ``..._total`` divides by warmup +
        sampling gradient-equivalents; ``n_grad_warmup`` / ``n_grad_sampling`` count the
        gradients alone; ``min_ess_per_s`` uses ``time_sampling``,
        ``..._total`` warmup + sampling time.  Zero gradients or an unknown time make the
        corresponding ratio ``nan``.  (ArviZ gives a column whose draws are all equal an
        ESS of the number of draws; its R-hat, and so ``max_rhat``, is then ``nan``.)
        """
        d = self._diagnostics(params_only=True)
        k = self.n_params
        bulk, tail, rhat = d["ess_bulk"][:k], d["ess_tail"][:k], d["r_hat"][:k]

        def stat(f, a):
            return float(f(a)) if a.size else math.nan

        def ratio(a, b):
            return a / b if b and b > 0 and np.isfinite(b) else math.nan

        min_bulk = stat(np.min, bulk)
        equiv_warmup, equiv_sampling = self.n_grad_equiv_warmup, self.n_grad_equiv_sampling
        grads_total = equiv_warmup + equiv_sampling
        time_total = self.time_warmup + self.time_sampling
        st = self.sampler_stats
        return {
            "min_ess_bulk": min_bulk,
            "median_ess_bulk": stat(np.median, bulk),
            "max_ess_bulk": stat(np.max, bulk),
            "min_ess_tail": stat(np.min, tail),
            "n_grad_warmup": self.n_grad_warmup,
            "n_grad_sampling": self.n_grad_sampling,
            "n_grad_equiv_warmup": equiv_warmup,
            "n_grad_equiv_sampling": equiv_sampling,
            "min_ess_per_grad": ratio(min_bulk, equiv_sampling),
            "min_ess_per_grad_total": ratio(min_bulk, grads_total),
            "min_ess_per_s": ratio(min_bulk, self.time_sampling),
            "min_ess_per_s_total": ratio(min_bulk, time_total),
            "time_warmup": self.time_warmup,
            "time_sampling": self.time_sampling,
            "max_rhat": stat(np.max, rhat[~np.isnan(rhat)]),
            "divergences": int(np.sum(np.asarray(st["divergent"]) != 0)),
            "accept_rate": float(np.mean(st["accept_stat"])) if st["accept_stat"].size
            else math.nan,
            "chains": self.chains,
            "draws": self.n_draws,
        }

    def efficiency_line(self) -> str:
        """``efficiency()`` as one human-readable line."""
        e = self.efficiency()
        return (f"{self.sampler or 'sampler'}: min ESS bulk {e['min_ess_bulk']:.0f} "
                f"(median {e['median_ess_bulk']:.0f}), tail {e['min_ess_tail']:.0f}; "
                + (f"{e['n_grad_sampling']} grads sampling + {e['n_grad_warmup']} warmup; "
                   if self._gradients_only() else
                   f"{e['n_grad_equiv_sampling']:.0f} gradient-equivalents sampling + "
                   f"{e['n_grad_equiv_warmup']:.0f} warmup; ")
                + f"min ESS/grad {e['min_ess_per_grad']:.4g} "
                f"(incl. warmup {e['min_ess_per_grad_total']:.4g}); "
                f"min ESS/s {e['min_ess_per_s']:.4g} "
                f"(incl. warmup {e['min_ess_per_s_total']:.4g}); "
                f"max R-hat {e['max_rhat']:.3f}; {e['divergences']} divergences; "
                f"accept {e['accept_rate']:.3f}; {e['chains']}x{e['draws']} draws"
                + (" [INCOMPLETE]" if self.incomplete else ""))

    # ---- ArviZ -----------------------------------------------------------------------

    def to_arviz(self, observed_data: Mapping[str, Any] | None = None,
                 log_likelihood: str | None = "log_lik") -> "arviz.InferenceData":  # noqa: F821
        """InferenceData with ``posterior`` and ``sample_stats`` (and their warmup groups);
        a variable named ``log_likelihood`` (default ``log_lik``, Stan's convention), if the
        fit has one, is also the ``log_likelihood`` group, so that ``arviz.loo`` and
        ``arviz.waic`` work; ``observed_data`` (e.g. the model's data dict) becomes that
        group.

        Flat columns ``a.i.j`` are gathered into one variable ``a`` with dims
        ``a_dim_0, a_dim_1`` (sizes from the largest index), ``a[i, j]`` = column
        ``a.i.j``; names that are not ``base.int.int...`` (tuples, complex numbers) stay
        flat variables named by the column.  Statistics use ArviZ's names
        (:data:`ARVIZ_STAT_NAMES`; ``diverging`` is boolean); others keep their names.
        """
        az = _arviz()
        kw = {}
        posterior = _integers(_gather(self.draws, self.columns),
                              self.metadata.get("int_variables") or ())
        stats = _arviz_stats(self.sampler_stats)
        if self.warmup_draws is not None:
            kw["warmup_posterior"] = _gather(self.warmup_draws, self.columns)
        if self.warmup_sampler_stats is not None:
            kw["warmup_sample_stats"] = _arviz_stats(self.warmup_sampler_stats)
        if log_likelihood and log_likelihood in posterior:
            kw["log_likelihood"] = {log_likelihood: posterior[log_likelihood]}
        if observed_data is not None:
            kw["observed_data"] = {k: np.asarray(v) for k, v in observed_data.items()}
        attrs = {"sampler": self.sampler, "incomplete": int(self.incomplete)}
        return az.from_dict(posterior=posterior, sample_stats=stats,
                            save_warmup="warmup_posterior" in kw
                            or "warmup_sample_stats" in kw, attrs=attrs, **kw)

    # ---- persistence -------------------------------------------------------------------

    def plot_tuning(self, chain: int = 0, path=None):
        """The tuner's GP reward surface over Γ with the tried points, and the reward
        trace (see :func:`ahmc_stan.plots.plot_tuning`)."""
        from .plots import plot_tuning

        return plot_tuning(self, chain, path)

    def plot_trace(self, var_names=None, kind: str = "trace", path=None):
        """ArviZ trace or rank plot (``kind="rank_bars"``)."""
        from .plots import plot_trace

        return plot_trace(self, var_names, kind, path)

    def save(self, path: str | os.PathLike) -> Path:
        """Write everything (draws, statistics, totals, times, metadata) to one ``.npz``
        (the suffix is added if missing).  :func:`load_fit` reads it back."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        arrays: dict[str, np.ndarray] = {"draws": self.draws}
        if self.warmup_draws is not None:
            arrays["warmup_draws"] = self.warmup_draws
        for name, value in self.sampler_stats.items():
            arrays[f"stat/{name}"] = value
        for name, value in (self.warmup_sampler_stats or {}).items():
            arrays[f"warmup_stat/{name}"] = value
        header = {
            "format": "ahmc_stan.Fit", "version": _FORMAT_VERSION,
            "param_names": self.columns, "n_params": self.n_params,
            "stat_names": list(self.sampler_stats),
            "warmup_stat_names": (None if self.warmup_sampler_stats is None
                                  else list(self.warmup_sampler_stats)),
            "n_grad_warmup": self.n_grad_warmup, "n_grad_sampling": self.n_grad_sampling,
            "n_eval_warmup": self.n_eval_warmup, "n_eval_sampling": self.n_eval_sampling,
            "cost_units": self.cost_units,
            "time_warmup": self.time_warmup, "time_sampling": self.time_sampling,
            "sampler": self.sampler, "incomplete": self.incomplete,
            "metadata": _to_json(self.metadata),
        }
        arrays["header"] = np.array(json.dumps(header))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, **arrays)
        os.replace(tmp, path)
        return path


def load_fit(path: str | os.PathLike) -> Fit:
    """Read a :class:`Fit` written by :meth:`Fit.save`."""
    path = Path(path)
    if not path.exists() and path.with_name(path.name + ".npz").exists():
        path = path.with_name(path.name + ".npz")
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["header"]))
        if header.get("format") != "ahmc_stan.Fit":
            raise ValueError(f"{path} is not a saved ahmc_stan Fit")
        stats = {n: z[f"stat/{n}"] for n in header["stat_names"]}
        wnames = header["warmup_stat_names"]
        wstats = None if wnames is None else {n: z[f"warmup_stat/{n}"] for n in wnames}
        return Fit(
            z["draws"], header["param_names"], stats, n_params=header["n_params"],
            warmup_draws=z["warmup_draws"] if "warmup_draws" in z.files else None,
            warmup_sampler_stats=wstats, n_grad_warmup=header["n_grad_warmup"],
            n_grad_sampling=header["n_grad_sampling"],
            n_eval_warmup=header.get("n_eval_warmup"),
            n_eval_sampling=header.get("n_eval_sampling"),
            cost_units=header.get("cost_units"), time_warmup=header["time_warmup"],
            time_sampling=header["time_sampling"], sampler=header["sampler"],
            metadata=_from_json(header["metadata"]), incomplete=header["incomplete"],
        )


# ---- helpers ---------------------------------------------------------------------------

def _evaluations(stats: Mapping[str, np.ndarray], n_grad: int,
                 given: Mapping[str, int] | None) -> dict[str, int]:
    """Kind → total evaluations: gradients, the sums of the other count statistics, then
    ``given``."""
    from .costs import COST_STATS

    out = {"gradient": int(n_grad)}
    for stat, kind in COST_STATS.items():
        if kind != "gradient" and stat in stats:
            out[kind] = int(np.sum(stats[stat]))
    out.update({str(k): int(v) for k, v in (given or {}).items() if k != "gradient"})
    return out


def _to_json(obj: Any) -> Any:
    """A JSON-compatible copy; numpy arrays become tagged dicts that :func:`_from_json`
    turns back into arrays (dtype and shape kept); non-finite floats survive as strings."""
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": _to_json(obj.tolist()), "dtype": obj.dtype.str,
                "shape": list(obj.shape)}
    if isinstance(obj, Mapping):
        return {str(k): _to_json(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return {"__tuple__": [_to_json(v) for v in obj]}
    if isinstance(obj, list):
        return [_to_json(v) for v in obj]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (str, int)):
        return obj
    raise TypeError(f"metadata value {obj!r} of type {type(obj).__name__} is not "
                    "JSON-serialisable")


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.array(_from_json(obj["__ndarray__"]),
                            dtype=np.dtype(obj["dtype"])).reshape(obj["shape"])
        if "__tuple__" in obj:
            return tuple(_from_json(v) for v in obj["__tuple__"])
        if "__float__" in obj and len(obj) == 1:
            return float(obj["__float__"])
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj


_INDEXED = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)((?:\.\d+)+)$")


def stan_name(name: str) -> str:
    """Stan's name of a column: ``L.2.1`` → ``L[2,1]`` (others unchanged)."""
    m = _INDEXED.match(name)
    return name if m is None else f"{m.group(1)}[{m.group(2)[1:].replace('.', ',')}]"


def flat_name(name: str) -> str:
    """Our column name of Stan's: ``M[1,2]`` (cmdstanpy, Stan) or ``M.1.2`` → ``M.1.2``."""
    m = re.fullmatch(r"(.+?)\[([\d,\s]+)\]", name)
    if m:
        return m.group(1) + "." + ".".join(i.strip() for i in m.group(2).split(","))
    return name


def _integers(variables: dict[str, np.ndarray], names) -> dict[str, np.ndarray]:
    """The variables declared ``int`` (``names``) as integer arrays (when every draw is a
    finite integer value)."""
    out = dict(variables)
    for name in names:
        v = out.get(name)
        if v is not None and np.all(np.isfinite(v)) and np.all(v == np.round(v)):
            out[name] = v.astype(np.int64)
    return out


def _gather(values: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """``(chain, draw, column)`` → ArviZ dict: ``a.i.j`` columns into arrays ``a[i-1, j-1]``."""
    groups: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    flat: dict[str, int] = {}
    for col, name in enumerate(names):
        m = _INDEXED.match(name)
        if m:
            idx = tuple(int(i) - 1 for i in m.group(2)[1:].split("."))
            groups.setdefault(m.group(1), []).append((col, idx))
        else:
            flat[name] = col
    out: dict[str, np.ndarray] = {}
    for base, cols in groups.items():
        ranks = {len(idx) for _, idx in cols}
        shape = tuple(max(idx[d] for _, idx in cols) + 1 for d in range(min(ranks)))
        if base in flat or len(ranks) != 1 or math.prod(shape) != len(cols) \
                or len({idx for _, idx in cols}) != len(cols):
            for col, _ in cols:  # not a full grid: keep the columns flat
                out[names[col]] = values[:, :, col]
            continue
        arr = np.empty(values.shape[:2] + shape)
        for col, idx in cols:
            arr[(slice(None), slice(None)) + idx] = values[:, :, col]
        out[base] = arr
    for name, col in flat.items():
        out[name] = values[:, :, col]
    return out


def _arviz_stats(stats: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in stats.items():
        new = ARVIZ_STAT_NAMES.get(name, name)
        if new != name and new in stats:  # a sampler's own statistic already has that name
            new = name
        out[new] = np.asarray(value).astype(bool) if new == "diverging" else value
    return out
