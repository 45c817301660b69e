"""The NUTS implementations our samplers are measured against, behind one call.

``run_peer(name, model, ...)`` runs CmdStan's NUTS (``"nuts"``,
:func:`ahmc_stan.nuts.run_nuts`) or nutpie (``"nutpie"``: diagonal mass matrix adapted
from draws and gradients; ``"nutpie_lowrank"``: low-rank modified mass matrix; Seyboldt,
Carlson & Carpenter 2026) and returns our :class:`~ahmc_stan.fit.Fit`, so that ESS per
gradient and per second are computed the same way for every sampler.

nutpie samples the shared library our compiler builds (it speaks BridgeStan's C ABI);
nothing is compiled or downloaded for it.  It is an optional dependency
(``pip install ahmc-stan[peers]``; the tests install it).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np

from .fit import Deferred, Fit

__all__ = ["PEERS", "run_peer", "run_nutpie"]

#: Peer name → (runner, fixed options).
PEERS = {"nuts": ("nuts", {}), "nutpie": ("nutpie", {}),
         "nutpie_lowrank": ("nutpie", {"low_rank": True})}


def run_peer(name: str, model, **run) -> Fit:
    """Run peer ``name`` (:data:`PEERS`) on ``model`` with ``chains``, ``warmup``,
    ``draws``, ``seed``, ``diagnose`` and its own options."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")
    runner, fixed = PEERS[name]
    if runner == "nuts":
        from .nuts import run_nuts

        return run_nuts(model, **run, **fixed)
    return run_nutpie(model, **run, **fixed)


def _nutpie():
    try:
        import nutpie
        from nutpie import _lib
        from nutpie.compile_stan import CompiledStanModel
    except ImportError as err:
        raise ImportError("nutpie is not installed: pip install 'ahmc-stan[peers]' "
                          f"(or pip install nutpie) ({err})") from None
    return nutpie, _lib, CompiledStanModel


def run_nutpie(model, chains: int = 4, warmup: int | None = None, draws: int = 1000,
               seed: int | None = None, *, low_rank: bool = False,
               adapt_delta: float | None = None, max_treedepth: int | None = None,
               cores: int | None = None, progress: bool = False, diagnose: bool = True,
               **options: Any) -> Fit:
    """Sample ``model`` (a :class:`~ahmc_stan.model.StanModel`) with nutpie's NUTS.
    ``warmup``: nutpie's tuning iterations, by default nutpie's own (400 with its diagonal
    mass matrix, 800 with the low-rank one in nutpie 0.16; ``metadata["warmup"]`` holds
    the number run).

    ``low_rank``: nutpie's low-rank modified mass matrix (default: its diagonal one, from
    draws and gradients).  ``adapt_delta`` and ``max_treedepth`` are Stan's names of
    nutpie's ``target_accept`` and ``maxdepth``; other ``options`` go to
    ``nutpie.sample`` unchanged.  ``cores``: chains run at once (default: all cores,
    at most ``chains``).

    The Fit holds the warmup and sampling draws (constrained from nutpie's unconstrained
    draws by the model, generated quantities drawn from ``seed``), ``n_grad`` = nutpie's
    ``n_steps`` (leapfrog steps: one gradient each), ``accept_stat``, ``step_size``,
    ``treedepth``, ``energy``, ``lp``, ``divergent``.  nutpie reports no per-chain
    times: ``time_warmup + time_sampling`` is the call's wall time times the chains
    run at once (chain-seconds, as summed for the other samplers), split between warmup
    and sampling in proportion to their leapfrog steps.
    """
    nutpie, lib_mod, CompiledStanModel = _nutpie()
    import os

    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**32)
    cores = max(1, min(chains, cores or os.cpu_count() or 1))
    library = lib_mod.StanLibrary(str(model.lib_path))
    data = json.loads(model.data_json) if model.data_json.strip() else {}
    compiled = CompiledStanModel(code=model.stan_file.read_text(), library=library,
                                 dims={}, _coords={}, model_name=model.name, model=None,
                                 data=None).with_data(**data)
    kwargs = dict(options)
    if adapt_delta is not None:
        kwargs["target_accept"] = adapt_delta
    if max_treedepth is not None:
        kwargs["maxdepth"] = max_treedepth
    start = time.perf_counter()
    trace = nutpie.sample(compiled, draws=draws, tune=warmup, chains=chains, cores=cores,
                          seed=seed, save_warmup=True, progress_bar=progress,
                          low_rank_modified_mass_matrix=low_rank,
                          store_unconstrained=True, **kwargs)
    wall = time.perf_counter() - start
    return _fit_from_trace(model, trace, seed, warmup, draws, wall * cores, low_rank,
                           kwargs, diagnose)


#: nutpie's sample statistic → ours.
_STATS = {"mean_tree_accept": "accept_stat", "step_size": "step_size", "n_steps": "n_grad",
          "diverging": "divergent", "depth": "treedepth", "energy": "energy", "logp": "lp"}


def _fit_from_trace(model, trace, seed: int, warmup: int, draws: int, chain_seconds: float,
                    low_rank: bool, options: dict, diagnose: bool) -> Fit:
    names = model.param_names(include_tp=True, include_gq=True)
    gq_seeds = np.random.SeedSequence([seed, 1]).spawn(2)

    def group(stats_group) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        unc = np.asarray(stats_group["unconstrained_draw"])  # (chain, draw, dims)
        chains, n = unc.shape[:2]
        rows = unc.reshape(chains * n, -1)
        return rows, {ours: np.asarray(stats_group[theirs])
                      for theirs, ours in _STATS.items() if theirs in stats_group}

    def constrain(rows, shape, gq_seed):  # a chain at a time, each with its own generated
        chains = shape[0]                  # quantities' random numbers, in threads
        values = model.constrain_each(
            np.split(rows, chains), [np.random.default_rng(s) for s in gq_seed.spawn(chains)],
            include_tp=True, include_gq=True)
        return np.array(values).reshape(*shape, len(names))

    samp_rows, samp_stats = group(trace.sample_stats)
    warm_rows, warm_stats = group(trace.warmup_sample_stats)
    chains, warmup = samp_stats["n_grad"].shape[0], warm_stats["n_grad"].shape[1]
    for stats in (samp_stats, warm_stats):
        stats["n_grad"] = stats["n_grad"].astype(np.int64)
        stats["divergent"] = stats["divergent"].astype(np.int64)
    grads_w, grads_s = warm_stats["n_grad"].sum(), samp_stats["n_grad"].sum()
    share = grads_w / (grads_w + grads_s) if grads_w + grads_s else 0.5
    fit = Fit(constrain(samp_rows, (chains, -1), gq_seeds[0]), names, samp_stats,
              n_params=len(model.param_names()),
              warmup_draws=Deferred((chains, warmup, len(names)),  # when first used
                                    lambda: constrain(warm_rows, (chains, -1), gq_seeds[1])),
              warmup_sampler_stats=warm_stats,
              time_warmup=chain_seconds * share, time_sampling=chain_seconds * (1 - share),
              sampler="nutpie_lowrank" if low_rank else "nutpie",
              metadata={"seed": seed, "warmup": warmup, "draws": draws,
                        "engine": f"nutpie {_version()}", "low_rank": low_rank,
                        "options": {k: v for k, v in options.items()
                                    if isinstance(v, (int, float, str, bool))},
                        "int_variables": model.int_variables(),
                        "time_estimated": True})
    if diagnose:
        from .convergence import warn_if_problems

        warn_if_problems(fit, stacklevel=4)
    return fit


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("nutpie")
    except Exception:  # noqa: BLE001
        return "?"
