"""The baseline: CmdStan's NUTS through cmdstanpy, returned as a :class:`~ahmc_stan.fit.Fit`.

The CmdStan executable of a model is built once per (Stan code, CmdStan version) in
``cache_dir() / "cmdstan" / "cmdstan-<version>" / "<name>-<key>"``: the ``.stan`` file is
copied there, so cmdstanpy's executable (which it writes next to the ``.stan`` file) never
lands next to the user's or the package's files.  The key hashes the Stan code, every
file it ``#include``s and the CmdStan installation's identity (a reinstall rebuilds).

CmdStan 2.27's stanc is older than the stanc that compiles our own samplers' models
(httpstan's); a program using newer syntax raises :class:`CmdStanCompileError`, a
``ValueError`` that names the CmdStan version and quotes stanc.

Columns are matched to ``model.param_names()`` by name (CmdStan's ``M[1,2]`` is our
``M.1.2``), so the parameters-block columns of the Fit are exactly ``StanModel``'s.  A
gradient evaluation is a leapfrog step: the ``n_grad`` statistic is ``n_leapfrog__``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .compiler import StanCompileError, _sha256, _stan_sources, cache_dir
from .fit import Fit, flat_name
from .samplers.chain import thin_stats

__all__ = ["run_nuts", "compile_cmdstan_model", "CmdStanCompileError", "cmdstan_version"]

#: CmdStan CSV statistic columns → Fit statistic names.
STAT_COLUMNS = {
    "accept_stat__": "accept_stat",
    "stepsize__": "step_size",
    "treedepth__": "treedepth",
    "n_leapfrog__": "n_grad",
    "divergent__": "divergent",
    "energy__": "energy",
    "lp__": "lp",
}
_INT_STATS = ("treedepth", "n_grad", "divergent")


class CmdStanCompileError(StanCompileError):
    """CmdStan's (older) stanc rejected a Stan program that the baseline must compile."""

    def __init__(self, stan_file: Path, message: str, version: str):
        self.stan_file = Path(stan_file)
        self.stanc_message = message
        self.cmdstan_version = version
        short = ".".join(version.split(".")[:2])
        ValueError.__init__(
            self,
            f"CmdStan {version}'s stanc rejected {self.stan_file}; the baseline needs Stan "
            f"syntax accepted by stanc {short} (the NUTS baseline runs CmdStan {version}, "
            f"whose stanc predates features such as tuples or newer functions that "
            f"ahmc-stan's own samplers accept). stanc {short} said:\n{message}")


# ---- CmdStan and compilation -------------------------------------------------------------

def _cmdstan_path() -> Path:
    """CmdStan's directory, installed first if needed (which reports its progress)."""
    import cmdstanpy

    from .cmdstan_setup import ensure_cmdstan

    path = Path(ensure_cmdstan(verbose=True))
    cmdstanpy.set_cmdstan_path(str(path))
    return path


def cmdstan_version(path: str | os.PathLike) -> str:
    """``"2.27.0"`` from CmdStan's makefile (or the directory name)."""
    path = Path(path)
    try:
        m = re.search(r"^CMDSTAN_VERSION\s*:?=\s*(\S+)", (path / "makefile").read_text(),
                      re.MULTILINE)
        if m:
            return m.group(1)
    except OSError:
        pass
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", path.name)
    return m.group(1) if m else "unknown"


def _not_cmdstanpy_diagnostics(record: logging.LogRecord) -> bool:
    """Drops cmdstanpy's "Some chains may have failed to converge" summary: run_nuts
    reports divergences and max tree depth with the rest of its own diagnosis
    (:mod:`ahmc_stan.convergence`), so they are not reported twice."""
    return not str(record.msg).startswith("Some chains may have failed to converge")


@contextlib.contextmanager
def _quiet_cmdstanpy():
    """cmdstanpy's INFO chatter off (warnings stay, except its divergence/treedepth
    summary, see :func:`_not_cmdstanpy_diagnostics`) for the duration, then as it was."""
    from cmdstanpy.utils import get_logger

    logger = get_logger()  # installs cmdstanpy's default handler if there is none
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    logger.addFilter(_not_cmdstanpy_diagnostics)
    try:
        yield
    finally:
        logger.removeFilter(_not_cmdstanpy_diagnostics)
        logger.setLevel(level)


def compile_cmdstan_model(stan_file: str | os.PathLike, *,
                          include_paths: Sequence[str | os.PathLike] = (),
                          verbose: bool = False) -> "tuple[Any, float]":
    """The cached ``cmdstanpy.CmdStanModel`` of ``stan_file`` and the seconds spent
    compiling it now (0 when the executable was cached)."""
    import cmdstanpy
    import filelock

    stan_file = Path(stan_file).resolve()
    if not stan_file.is_file():
        raise FileNotFoundError(f"no Stan file at {stan_file}")
    home = _cmdstan_path()
    version = cmdstan_version(home)
    includes = [stan_file.parent, *(Path(p).resolve() for p in include_paths)]
    sources = _stan_sources(stan_file, includes[1:])
    key = _sha256("cmdstan", version, str(home), _install_id(home),
                  *(c for _, c in sorted(sources)))[:16]
    stem = re.sub(r"\W", "_", stan_file.stem) or "model"
    if stem[0].isdigit():
        stem = "m_" + stem
    entry = cache_dir() / "cmdstan" / f"cmdstan-{version}" / f"{stem}-{key}"
    entry.mkdir(parents=True, exist_ok=True)
    target = entry / f"{stem}.stan"
    exe = entry / stem
    stanc_options = {"include-paths": [str(p) for p in includes]}
    with filelock.FileLock(str(entry) + ".lock"), _quiet_cmdstanpy():
        if not target.exists():
            tmp = entry / f".{stem}.stan.tmp"
            shutil.copyfile(stan_file, tmp)
            os.replace(tmp, target)
        if exe.is_file() and exe.stat().st_mtime >= target.stat().st_mtime:
            return cmdstanpy.CmdStanModel(stan_file=str(target), exe_file=str(exe),
                                          stanc_options=stanc_options), 0.0
        _check_stanc(home, version, stan_file, includes)
        if verbose:
            print(f"compiling {stan_file.name} with CmdStan {version}...", flush=True)
        start = time.perf_counter()
        try:
            model = cmdstanpy.CmdStanModel(stan_file=str(target),
                                           stanc_options=stanc_options)
        except ValueError as err:
            raise RuntimeError(f"CmdStan {version} could not build {stan_file}:\n"
                               + _tail(str(err), 40)) from None
        seconds = time.perf_counter() - start
        if verbose:
            print(f"compiled {stan_file.name} in {seconds:.1f} s", flush=True)
        return model, seconds


def _install_id(home: Path) -> str:
    """Changes when CmdStan is reinstalled, so executables built against an earlier
    installation (its libraries, its precompiled header) are rebuilt."""
    for name in (".ahmc_stan_install_complete", "makefile"):
        path = home / name
        try:
            return f"{name}:{path.read_text() if name.startswith('.') else path.stat().st_mtime}"
        except OSError:
            continue
    return ""


def _tail(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[-n:])


def _check_stanc(home: Path, version: str, stan_file: Path, includes: list[Path]) -> None:
    """Run CmdStan's own stanc so that a syntax it rejects gives a clear error."""
    stanc = home / "bin" / ("stanc.exe" if os.name == "nt" else "stanc")
    if not stanc.is_file():
        return  # cmdstanpy will report it
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [str(stanc), f"--include-paths={','.join(map(str, includes))}",
             f"--o={Path(tmp) / 'check.hpp'}", str(stan_file)],
            capture_output=True, text=True)
    if proc.returncode != 0:
        raise CmdStanCompileError(stan_file, (proc.stderr + proc.stdout).strip(), version)


# ---- running ----------------------------------------------------------------------------

def run_nuts(model, chains: int = 4, warmup: int | None = 1000, draws: int = 1000,
             seed: int | None = None, show_progress: bool = False, *,
             verbose: bool = False, diagnose: bool = True, thin: int = 1,
             **cmdstan_args) -> Fit:
    """Sample ``model`` (a :class:`~ahmc_stan.model.StanModel`) with CmdStan's NUTS.

    Adaptation is CmdStan's default (diagonal metric, ``adapt_delta`` 0.8) unless
    ``cmdstan_args`` (passed to ``cmdstanpy.CmdStanModel.sample``: ``adapt_delta``,
    ``max_treedepth``, ``metric``, ``inits``, ``output_dir``, ``sig_figs``, ...) says
    otherwise.  Warmup iterations are kept (``warmup_draws``, ``warmup_sampler_stats``);
    ``warmup=None`` is CmdStan's default, 1000.  ``seed`` None draws one; it is recorded in ``metadata["seed"]``.

    Times are CmdStan's per-chain "Elapsed Time" (millisecond resolution), summed.

    Ctrl-C returns the draws written so far as a Fit with ``incomplete=True`` (all chains
    cut to the shortest; times ``nan``, as a killed chain never writes them), or
    re-raises if no sampling draw exists yet.  A terminal's Ctrl-C signals CmdStan's
    processes too; a SIGINT sent to Python alone leaves them running to completion.

    ``thin`` as CmdStan's: every ``thin``-th sampling draw is kept.  CmdStan is run
    without thinning and the draws thinned here, so that a kept draw's ``n_grad`` counts
    the leapfrog steps of every iteration it stands for (CmdStan's own thinning drops
    them, and with them the cost).

    ``diagnose``: run :func:`ahmc_stan.convergence.diagnose` on the fit and emit a
    :class:`~ahmc_stan.convergence.ConvergenceWarning` with its report (like CmdStan's
    ``diagnose``) if it finds problems.
    """
    import cmdstanpy

    if isinstance(thin, bool) or not isinstance(thin, (int, np.integer)) or thin < 1:
        raise ValueError(f"thin must be an integer >= 1, not {thin!r}")
    if warmup is None:
        warmup = 1000
    if seed is None:
        seed = int(np.random.default_rng().integers(1, 2**31 - 1))
    exe_model, compile_seconds = compile_cmdstan_model(model.stan_file, verbose=verbose)
    home = Path(cmdstanpy.cmdstan_path())
    version = cmdstan_version(home)

    user_dir = cmdstan_args.pop("output_dir", None)
    out_dir = Path(user_dir) if user_dir else Path(tempfile.mkdtemp(prefix="ahmc-nuts-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    data_file = None
    if model.data_json.strip():
        data_file = out_dir / "data.json"
        data_file.write_text(model.data_json)
    args = dict(cmdstan_args)
    args.setdefault("parallel_chains", max(1, min(chains, os.cpu_count() or 1)))
    args.setdefault("show_console", False)
    recorded_args = {k: v if isinstance(v, (int, float, str, bool, type(None)))
                     else repr(v)[:500] for k, v in cmdstan_args.items()}
    metadata = {
        "sampler": "nuts", "engine": f"CmdStan {version} via cmdstanpy",
        "cmdstan_version": version, "cmdstan_path": str(home),
        "cmdstanpy_version": cmdstanpy.__version__, "exe_file": str(exe_model.exe_file),
        "stan_file": str(model.stan_file), "model_name": getattr(model, "name", ""),
        "seed": int(seed), "chains": int(chains), "warmup": int(warmup),
        "draws": int(draws), "thin": int(thin),
        "parallel_chains": int(args["parallel_chains"]),
        "cmdstan_args": recorded_args, "compile_seconds": float(compile_seconds),
        "data_sha256": _sha256(model.data_json)[:16],
    }
    try:
        with _quiet_cmdstanpy():
            try:
                mcmc = exe_model.sample(
                    data=str(data_file) if data_file else None, chains=chains,
                    iter_warmup=warmup, iter_sampling=draws, save_warmup=True, seed=seed,
                    output_dir=str(out_dir), show_progress=show_progress, **args)
            except KeyboardInterrupt:
                fit = _partial_fit(model, out_dir, warmup, metadata, draws=draws, thin=thin)
                if fit is None:
                    raise
                return _checked(fit, diagnose)
        return _checked(_fit_from_cmdstanpy(model, mcmc, warmup, metadata,
                                            keep_csv=user_dir is not None, thin=thin),
                        diagnose)
    finally:
        if not user_dir:
            shutil.rmtree(out_dir, ignore_errors=True)


def _checked(fit: Fit, diagnose: bool) -> Fit:
    """``fit``, after a ConvergenceWarning if ``diagnose`` and it has problems."""
    if diagnose:
        from .convergence import warn_if_problems

        warn_if_problems(fit, stacklevel=4)
    return fit


def _fit_from_cmdstanpy(model, mcmc, warmup: int, metadata: dict, keep_csv: bool,
                        thin: int = 1) -> Fit:
    columns = list(mcmc.column_names)
    values = np.asarray(mcmc.draws(inc_warmup=True))  # (iterations, chains, columns)
    values = np.transpose(values, (1, 0, 2))
    n_warm = int(getattr(mcmc, "num_draws_warmup", warmup))
    times = _chain_times(mcmc)
    meta = dict(metadata)
    meta["time_per_chain"] = times
    meta["metric_type"] = mcmc.metric_type
    # ``inv_metric`` in cmdstanpy >= 1.3, ``metric`` before
    inv_metric = mcmc.inv_metric if hasattr(type(mcmc), "inv_metric") else mcmc.metric
    if inv_metric is not None:
        meta["inv_metric"] = np.asarray(inv_metric, dtype=float)
    if mcmc.step_size is not None:
        meta["step_size_adapted"] = np.asarray(mcmc.step_size, dtype=float)
    if keep_csv:
        meta["csv_files"] = [str(p) for p in mcmc.runset.csv_files]
    return _build_fit(model, columns, values[:, :n_warm], values[:, n_warm:], times, meta,
                      incomplete=False, thin=thin)


def _chain_times(mcmc) -> list[dict[str, float]]:
    times = getattr(mcmc, "time", None)
    if times and all("warmup" in t and "sampling" in t for t in times):
        return [{k: float(v) for k, v in t.items()} for t in times]
    return [_csv_times(Path(p).read_text()) for p in mcmc.runset.csv_files]


def _csv_times(text: str) -> dict[str, float]:
    """``{"warmup": s, "sampling": s, "total": s}`` from a CmdStan CSV's comment lines."""
    out = {}
    names = {"warm-up": "warmup", "sampling": "sampling", "total": "total"}
    for m in re.finditer(r"^#.*?([\d.eE+-]+) seconds \(([^)]+)\)", text, re.MULTILINE):
        key = names.get(m.group(2).strip().lower())
        if key:
            out[key] = float(m.group(1))
    return out


def _build_fit(model, columns: list[str], warm: np.ndarray, samp: np.ndarray,
               times: list[dict[str, float]], metadata: dict, incomplete: bool,
               thin: int = 1) -> Fit:
    index = {flat_name(c): i for i, c in enumerate(columns)}
    block = model.param_names()
    everything = model.param_names(include_tp=True, include_gq=True)
    names = block + [n for n in everything if n not in set(block)]
    missing = [n for n in names if n not in index]
    if missing:
        raise RuntimeError(f"CmdStan's output lacks the columns {missing[:10]} of "
                           f"{model.stan_file.name} (has {columns[:10]}...)")
    cols = [index[n] for n in names]

    def stats(values):
        out = {}
        for csv_name, name in STAT_COLUMNS.items():
            if csv_name in index:
                col = values[:, :, index[csv_name]]
                out[name] = col.astype(np.int64) if name in _INT_STATS else col
        return out

    samp_stats, warm_stats = thin_stats(stats(samp), thin), stats(warm)
    samp = samp[:, ::thin]
    if hasattr(model, "int_variables"):
        metadata = {**metadata, "int_variables": model.int_variables()}
    return Fit(
        samp[:, :, cols], names, samp_stats, n_params=len(block),
        warmup_draws=warm[:, :, cols], warmup_sampler_stats=warm_stats,
        n_grad_warmup=int(warm_stats["n_grad"].sum()),
        n_grad_sampling=int(samp_stats["n_grad"].sum()),
        time_warmup=float(sum(t.get("warmup", np.nan) for t in times)),
        time_sampling=float(sum(t.get("sampling", np.nan) for t in times)),
        sampler="nuts", metadata=metadata, incomplete=incomplete,
    )


# ---- interrupted runs -------------------------------------------------------------------

def read_partial_csv(path: str | os.PathLike) -> tuple[list[str], np.ndarray, str]:
    """Header, complete numeric rows and the text of a (possibly truncated) CmdStan CSV."""
    text = Path(path).read_text(errors="replace")
    header: list[str] | None = None
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split(",")
        if header is None:
            header = fields
            continue
        if len(fields) != len(header):
            continue  # the line being written when the run stopped
        try:
            rows.append([float(f) for f in fields])
        except ValueError:
            continue
    if header is None:
        return [], np.zeros((0, 0)), text
    return header, np.array(rows, dtype=float).reshape(-1, len(header)), text


def _partial_fit(model, out_dir: Path, warmup: int, metadata: dict,
                 draws: int | None = None, thin: int = 1) -> Fit | None:
    """A Fit from the CSVs of an interrupted run (chains cut to the shortest), or None.

    ``incomplete`` is set unless every chain has all ``draws`` (an interrupt that arrived
    after CmdStan finished)."""
    files = sorted(out_dir.glob("*.csv"))
    parsed = [read_partial_csv(p) for p in files]
    parsed = [p for p in parsed if p[0]]
    if not parsed:
        return None
    header = parsed[0][0]
    parsed = [p for p in parsed if p[0] == header]
    n_samp = min(max(p[1].shape[0] - warmup, 0) for p in parsed)
    if n_samp == 0:
        return None
    values = np.stack([p[1][: warmup + n_samp] for p in parsed])
    times = [_csv_times(p[2]) for p in parsed]
    # An interrupted chain never writes its elapsed times: the times are then nan.
    meta = dict(metadata, time_per_chain=times, interrupted_after_draws=n_samp)
    complete = draws is not None and n_samp >= draws and all("sampling" in t for t in times)
    return _build_fit(model, header, values[:, :warmup], values[:, warmup:], times, meta,
                      incomplete=not complete, thin=thin)
