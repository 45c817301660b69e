"""The robustness suite (issue 13): every model of ``comparisons/robustness/`` × every
sampler, checked against reference moments from long CmdStan NUTS runs.

    .venv/bin/python comparisons/robustness.py                      # everything
    .venv/bin/python comparisons/robustness.py --models eight_schools_cp,funnel \\
        --samplers ahmc,nuts --seed 1 --out comparisons/results/robustness.md
    .venv/bin/python comparisons/robustness.py --reference-only     # only the references
    .venv/bin/python comparisons/robustness.py --list               # the models

For each model × sampler, one run of 4 chains × (1000 warmup + 1000 draws) (``--chains``,
``--warmup``, ``--draws``).  For every parameters-block column, the run's mean and sd are
compared with the reference's: z = (est − ref) / sqrt(mcse_est² + mcse_ref²), with the
MCSEs of ArviZ (``Fit.summary()``).  A run **passes** when every |z| ≤ 5 (``--z-max``).
It **warned** when ``ahmc_stan`` raised a ``ConvergenceWarning`` or ``fit.diagnose()``
found a problem.  A **silent failure** is a run that did not pass and did not warn.  A run that
fails to compile or crashes is an error row; a run longer than ``--timeout`` seconds is
killed and is an error row too.

References (``comparisons/robustness/reference/<model>.json``) are computed when missing
(``--rebuild-reference`` recomputes them): CmdStan NUTS, 10 chains × (1000 warmup +
10000 draws), adapt_delta 0.95 (5000 draws for the solver models, adapt_delta 0.99 for
the stochastic volatility model: see ``models.py``); the
centred hierarchical models take the moments of their non-centred twin; Neal's funnel has
exact moments.  Each reference records its settings and whether it converged.

Jobs run one at a time, each in its own process (a crash in the C layer is an error row,
not the end of the suite); a job's chains use both cores.  ``--workers 2`` runs two jobs at
once with their chains one after another.  Results are written after every job:
``--out`` (markdown) and the same path with ``.json`` (raw numbers, every column's z).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import multiprocessing
import os
import platform
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from ahmc_stan.sampling import metric_fallbacks  # noqa: F401 (also for the scripts beside)

ROOT = Path(__file__).resolve().parent.parent
SUITE_DIR = Path(__file__).resolve().parent / "robustness"
REF_DIR = SUITE_DIR / "reference"
DEFAULT_OUT = ROOT / "comparisons" / "results" / "robustness.md"
DEFAULT_SAMPLERS = ("ahmc", "gadmala", "nuts")

#: A reference counts as converged with R-hat ≤ this, ESS ≥ REF_ESS_MIN and no divergence.
REF_RHAT_MAX = 1.01
REF_ESS_MIN = 1000


def load_registry():
    """``comparisons/robustness/models.py`` as a module (no package needed)."""
    name = "robustness_models"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SUITE_DIR / "models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _log(msg: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


def _finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


# ---- models that our library cannot build ------------------------------------------------

class CmdStanOnlyModel:
    """Enough of a ``StanModel`` for ``run_nuts`` when our library cannot compile the
    program: the column names come from a one-draw ``fixed_param`` run of the CmdStan
    executable and the blocks from stanc's ``--info``."""

    def __init__(self, stan_file: Path, data: dict):
        import tempfile

        from ahmc_stan.model import _data_json
        from ahmc_stan.fit import flat_name
        from ahmc_stan.nuts import compile_cmdstan_model

        self.stan_file = Path(stan_file).resolve()
        self.data_json = _data_json(data)
        self.name = self.stan_file.stem
        exe, _ = compile_cmdstan_model(self.stan_file)
        info = exe.src_info()
        with tempfile.TemporaryDirectory() as tmp:
            data_file = Path(tmp) / "data.json"
            data_file.write_text(self.data_json)
            run = exe.sample(data=str(data_file), chains=1, iter_warmup=0, iter_sampling=1,
                             fixed_param=True, output_dir=tmp, show_progress=False, seed=1)
            columns = [flat_name(c) for c in run.column_names]
        blocks = {b: set(info.get(b, {})) for b in
                  ("parameters", "transformed parameters", "generated quantities")}

        def base(c):
            return c.split(".")[0]

        self._block = [c for c in columns if base(c) in blocks["parameters"]]
        self._all = self._block + [
            c for c in columns if base(c) in blocks["transformed parameters"]] + [
            c for c in columns if base(c) in blocks["generated quantities"]]

    def param_names(self, *, include_tp: bool = False, include_gq: bool = False):
        if include_tp or include_gq:
            return list(self._all)
        return list(self._block)


def build_model(entry, data: dict, cmdstan_fallback: bool = False):
    """Our ``StanModel`` of ``entry``; with ``cmdstan_fallback``, a
    :class:`CmdStanOnlyModel` if our library cannot compile it."""
    from ahmc_stan import StanModel

    try:
        return StanModel(entry.stan_file, data)
    except Exception as err:  # noqa: BLE001 - any compile failure
        if not cmdstan_fallback:
            raise
        _log(f"  our library cannot build {entry.name} ({type(err).__name__}: "
             f"{str(err).strip().splitlines()[-1][:200] if str(err).strip() else ''}); "
             "using CmdStan's column names")
        return CmdStanOnlyModel(entry.stan_file, data)


# ---- references ---------------------------------------------------------------------------

def reference_path(name: str) -> Path:
    return REF_DIR / f"{name}.json"


def _summary_columns(fit) -> dict:
    """Summary rows keyed by our column names (``theta.1``), as the references are."""
    s = fit.summary()
    out = {}
    for name, (_, row) in zip(fit.columns, s.iterrows()):
        out[name] = {k: _finite(row[k]) for k in
                     ("mean", "sd", "mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")}
    return out


def _reference_checks(columns: dict, block: list[str], divergences: int,
                      treedepth_hits: int) -> dict:
    varying = [c for c in block if (columns[c]["sd"] or 0) > 0]
    rhats = [columns[c]["r_hat"] for c in varying]
    ess_b = [columns[c]["ess_bulk"] for c in varying]
    ess_t = [columns[c]["ess_tail"] for c in varying]
    max_rhat = max((r if r is not None else math.inf) for r in rhats) if rhats else None
    min_bulk = min((e if e is not None else 0.0) for e in ess_b) if ess_b else None
    min_tail = min((e if e is not None else 0.0) for e in ess_t) if ess_t else None
    converged = (max_rhat is not None and max_rhat <= REF_RHAT_MAX
                 and min_bulk >= REF_ESS_MIN and min_tail >= REF_ESS_MIN
                 and divergences == 0)
    return {"max_rhat": max_rhat, "min_ess_bulk": min_bulk, "min_ess_tail": min_tail,
            "divergences": int(divergences), "max_treedepth_hits": int(treedepth_hits),
            "converged": bool(converged),
            "criteria": f"R-hat <= {REF_RHAT_MAX}, bulk and tail ESS >= {REF_ESS_MIN}, "
                        "no divergence (parameters-block columns)"}


def compute_reference(entry, registry) -> dict:
    """Run the reference NUTS of ``entry`` and return its JSON record."""
    from ahmc_stan import run_nuts

    settings = dict(registry.REFERENCE)
    settings["draws"] = entry.reference_draws
    settings["warmup"] = entry.reference_warmup
    settings["adapt_delta"] = entry.reference_adapt_delta
    data = entry.data()
    model = build_model(entry, data, cmdstan_fallback=True)
    _log(f"reference {entry.name}: CmdStan NUTS {settings['chains']} chains x "
         f"({settings['warmup']} + {settings['draws']}), adapt_delta "
         f"{settings['adapt_delta']}")
    start = time.perf_counter()
    kwargs = dict(chains=settings["chains"], warmup=settings["warmup"],
                  draws=settings["draws"], seed=settings["seed"],
                  adapt_delta=settings["adapt_delta"],
                  max_treedepth=settings["max_treedepth"], diagnose=False)
    fit = run_nuts(model, **kwargs)
    wall = time.perf_counter() - start
    columns = _summary_columns(fit)
    block = fit.columns[: fit.n_params]
    div = int(np.sum(fit.sampler_stats["divergent"]))
    hits = int(np.sum(fit.sampler_stats.get("treedepth", np.zeros(1)) >=
                      settings["max_treedepth"]))
    checks = _reference_checks(columns, block, div, hits)
    checks["diagnose"] = fit.diagnose().to_dict()
    ref = {
        "model": entry.name, "stan_file": entry.stan_file.name, "source": "nuts",
        "settings": settings, "engine": fit.metadata.get("engine", ""),
        "data_sha256": fit.metadata.get("data_sha256", ""),
        "wall_seconds": wall, "time_warmup": fit.time_warmup,
        "time_sampling": fit.time_sampling, "n_grad": fit.n_grad_warmup + fit.n_grad_sampling,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "block_columns": block, "checks": checks, "columns": columns,
    }
    _log(f"reference {entry.name}: {wall:.0f} s; max R-hat {checks['max_rhat']}, "
         f"min ESS bulk/tail {checks['min_ess_bulk']}/{checks['min_ess_tail']}, "
         f"{div} divergences, {hits} at max treedepth -> "
         f"{'converged' if checks['converged'] else 'NOT CONVERGED'}")
    return ref


def analytic_reference(entry) -> dict:
    data = entry.data()
    moments = entry.analytic(data)
    columns = {c: {"mean": m, "sd": s, "mcse_mean": 0.0, "mcse_sd": 0.0, "ess_bulk": None,
                   "ess_tail": None, "r_hat": None} for c, (m, s) in moments.items()}
    return {"model": entry.name, "stan_file": entry.stan_file.name, "source": "analytic",
            "settings": {}, "block_columns": list(moments),
            "checks": {"converged": True, "note": "exact moments"},
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
            "columns": columns}


def get_reference(entry, registry, rebuild: bool = False, _seen=()) -> dict:
    """The reference record of ``entry``: loaded, or computed and saved."""
    path = reference_path(entry.name)
    if path.is_file() and not rebuild:
        return json.loads(path.read_text())
    if entry.analytic is not None:
        ref = analytic_reference(entry)
    elif entry.reference_from:
        if entry.reference_from in _seen:
            raise ValueError(f"reference_from cycle at {entry.name}")
        src_entry = registry.BY_NAME[entry.reference_from]
        src = get_reference(src_entry, registry, rebuild=False,
                            _seen=(*_seen, entry.name))
        names = block_columns_of(entry)
        missing = [n for n in names if n not in src["columns"]]
        if missing:
            raise ValueError(f"{entry.reference_from}'s reference lacks {missing} "
                             f"needed by {entry.name}")
        ref = {k: v for k, v in src.items() if k not in ("columns", "block_columns")}
        ref.update(model=entry.name, stan_file=entry.stan_file.name,
                   source=f"from {entry.reference_from}", block_columns=names,
                   columns={n: src["columns"][n] for n in names},
                   created=datetime.datetime.now().isoformat(timespec="seconds"))
    else:
        ref = compute_reference(entry, registry)
    REF_DIR.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(ref, indent=1, allow_nan=False))
    os.replace(tmp, path)
    return ref


def block_columns_of(entry) -> list[str]:
    """The parameters-block column names of ``entry``'s program (from our library, else
    from CmdStan)."""
    model = build_model(entry, entry.data(), cmdstan_fallback=True)
    return list(model.param_names())


# ---- one job ------------------------------------------------------------------------------

def _z(est: float, ref: float, se_est: float, se_ref: float) -> float:
    if est is None or ref is None or not math.isfinite(est):
        return math.inf
    diff = est - ref
    se_est = se_est if se_est is not None and math.isfinite(se_est) else math.nan
    se_ref = se_ref if se_ref is not None and math.isfinite(se_ref) else 0.0
    denom = math.sqrt(se_est ** 2 + se_ref ** 2) if math.isfinite(se_est) else math.nan
    if abs(diff) <= 1e-9 * (1 + abs(ref)):
        return 0.0  # constant columns (e.g. the diagonal of a cholesky_factor_corr)
    if not denom > 0:
        return math.inf
    return diff / denom


def run_job(model_name: str, sampler: str, settings: dict) -> dict:
    """One sampler on one model, reduced to numbers (runs in a worker process);
    ``settings["options"]`` (optional) are passed to ``tune_and_sample``."""
    registry = load_registry()
    entry = registry.BY_NAME[model_name]
    ref = json.loads(reference_path(model_name).read_text())
    row = {"model": model_name, "sampler": sampler, "seed": settings["seed"],
           "chains": settings["chains"], "warmup": settings["warmup"],
           "draws": settings["draws"]}
    t0 = time.perf_counter()
    stage = "compile"
    try:
        from ahmc_stan import run_nuts, tune_and_sample
        from ahmc_stan.fit import stan_name

        data = entry.data()
        # NUTS needs only CmdStan: it runs even when our library cannot build the model
        model = build_model(entry, data, cmdstan_fallback=sampler == "nuts")
        row["compile_seconds"] = time.perf_counter() - t0
        stage = "sample"
        t1 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if sampler == "nuts":
                fit = run_nuts(model, chains=settings["chains"], warmup=settings["warmup"],
                               draws=settings["draws"], seed=settings["seed"],
                               parallel_chains=settings["parallel"])
            else:
                fit = tune_and_sample(model, sampler, chains=settings["chains"],
                                      warmup=settings["warmup"], draws=settings["draws"],
                                      seed=settings["seed"], progress=False,
                                      parallel=settings["parallel"],
                                      **settings.get("options", {}))
        row["sample_seconds"] = time.perf_counter() - t1
        stage = "evaluate"
        conv = [w for w in caught if "Convergence" in type(w.message).__name__
                or "Convergence" in getattr(w.category, "__name__", "")]
        row["convergence_warnings"] = [str(w.message)[:2000] for w in conv]
        row["other_warnings"] = sorted({f"{w.category.__name__}: {str(w.message)[:200]}"
                                        for w in caught if w not in conv})[:10]
        d = fit.diagnose()
        row["diagnosis"] = d.to_dict()
        row["problems"] = [p.short for p in d.problems]
        row["not_converged"] = not d.converged
        row["warned"] = (not d.ok) or bool(conv)
        s = fit.summary()
        names = fit.columns[: fit.n_params]
        cols = {}
        for c in names:
            r = ref["columns"].get(c)
            if r is None:
                raise KeyError(f"the reference of {model_name} has no column {c!r}")
            e = s.loc[stan_name(c)]
            cols[c] = {
                "mean": _finite(e["mean"]), "sd": _finite(e["sd"]),
                "mcse_mean": _finite(e["mcse_mean"]), "mcse_sd": _finite(e["mcse_sd"]),
                "r_hat": _finite(e["r_hat"]), "ess_bulk": _finite(e["ess_bulk"]),
                "z_mean": _z(e["mean"], r["mean"], e["mcse_mean"], r["mcse_mean"]),
                "z_sd": _z(e["sd"], r["sd"], e["mcse_sd"], r["mcse_sd"]),
            }
        zm = max((abs(v["z_mean"]) for v in cols.values()), default=0.0)
        zs = max((abs(v["z_sd"]) for v in cols.values()), default=0.0)
        row["max_abs_z_mean"] = zm
        row["max_abs_z_sd"] = zs
        row["worst_mean"] = max(cols, key=lambda c: abs(cols[c]["z_mean"])) if cols else ""
        row["worst_sd"] = max(cols, key=lambda c: abs(cols[c]["z_sd"])) if cols else ""
        row["pass"] = bool(zm <= settings["z_max"] and zs <= settings["z_max"])
        row["silent_failure"] = bool(not row["pass"] and not row["warned"])
        row["divergences"] = int(np.sum(fit.sampler_stats["divergent"]))
        row["n_grad"] = int(fit.n_grad_warmup + fit.n_grad_sampling)
        row["incomplete"] = bool(fit.incomplete)
        row["metric_rerun"] = fit.metadata.get("metric_rerun")
        row["chain_rerun"] = fit.metadata.get("chain_rerun")
        row["slow_chains"] = fit.metadata.get("slow_chains")
        row["extension"] = fit.metadata.get("extension")
        row["metric_fallbacks"] = metric_fallbacks(fit.metadata)
        row["time_seconds"] = float(fit.time_warmup + fit.time_sampling)
        row["min_ess_bulk"] = float(fit.efficiency()["min_ess_bulk"])
        row["columns"] = cols
        row["status"] = "ok"
    except Exception as err:  # noqa: BLE001 - an error row, not a crash
        row["status"] = "error"
        row["error_stage"] = stage
        row["error"] = f"{type(err).__name__}: {err}"[-3000:]
        row["traceback"] = traceback.format_exc()[-4000:]
    row["wall_seconds"] = time.perf_counter() - t0
    return row


def _job_main(conn, model_name, sampler, settings):
    os.setsid()  # its own process group: a timeout ends the job with its children
    try:
        row = run_job(model_name, sampler, settings)
    except BaseException as err:  # noqa: BLE001
        row = {"model": model_name, "sampler": sampler, "status": "error",
               "error": f"{type(err).__name__}: {err}", "error_stage": "worker"}
    conn.send(row)
    conn.close()


class JobRunner:
    """At most ``workers`` jobs at once, each in its own process (fork)."""

    def __init__(self, workers: int, timeout: float):
        self.ctx = multiprocessing.get_context("fork")
        self.workers = workers
        self.timeout = timeout
        self.running = []  # (proc, conn, key, start)

    def submit(self, key, settings):
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_job_main, args=(child, *key, settings))
        proc.start()
        child.close()
        self.running.append((proc, parent, key, time.perf_counter()))

    def full(self) -> bool:
        return len(self.running) >= self.workers

    def _kill(self, proc):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()

    def poll(self):
        """Finished rows (blocks briefly)."""
        done = []
        while not done and self.running:
            for item in list(self.running):
                proc, conn, key, start = item
                elapsed = time.perf_counter() - start
                if conn.poll(0.5 / max(1, len(self.running))):
                    try:
                        row = conn.recv()
                    except EOFError:
                        row = None
                    proc.join(30)
                    if proc.is_alive():
                        self._kill(proc)
                        proc.join()
                elif not proc.is_alive():
                    proc.join()
                    row = None
                elif elapsed > self.timeout:
                    self._kill(proc)
                    proc.join()
                    row = {"model": key[0], "sampler": key[1], "status": "error",
                           "error_stage": "timeout",
                           "error": f"killed after the {self.timeout:.0f} s timeout"}
                else:
                    continue
                if row is None:
                    row = {"model": key[0], "sampler": key[1], "status": "error",
                           "error_stage": "worker",
                           "error": f"the worker process died (exit code {proc.exitcode})"}
                row.setdefault("wall_seconds", elapsed)
                conn.close()
                self.running.remove(item)
                done.append(row)
        return done

    def kill_all(self):
        for proc, conn, _, _ in self.running:
            self._kill(proc)
            proc.join()
        self.running = []


# ---- report -------------------------------------------------------------------------------

def _fmt_z(z) -> str:
    if z is None:
        return ""
    return "inf" if not math.isfinite(z) else f"{z:.2f}"


def _yes(b) -> str:
    return "yes" if b else "no"


def write_report(rows: list[dict], refs: dict, meta: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    registry = load_registry()
    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    lines = ["# Robustness suite (issue 13)", "",
             f"Generated {meta['finished'] or meta['started']} by `{meta['command']}`"
             f"{' (partial: still running)' if not meta['finished'] else ''}.", "",
             f"Each run: {meta['chains']} chains × ({meta['warmup']} warmup + "
             f"{meta['draws']} draws), seed {meta['seed']}.  **pass**: every "
             f"parameters-block column's mean and sd within |z| ≤ {meta['z_max']} of the "
             "reference, z = (est − ref) / sqrt(mcse_est² + mcse_ref²) (ArviZ MCSE).  "
             "**warned**: a ConvergenceWarning or a problem found by `Fit.diagnose()`; "
             "a run that passes with few effective draws has "
             "wide MCSEs, so *pass, no warning* counts the runs that are both.  "
             "**silent**: did not pass and did not warn.  "
             "Wall time includes compiling (cached after the first run).", "",
             "## Summary", "",
             "| sampler | runs | pass | pass, no warning | warned | silent failures | errors "
             "| wall time (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for s in samplers:
        rs = [r for r in rows if r["sampler"] == s]
        ok = [r for r in rs if r.get("status") == "ok"]
        lines.append(
            f"| {s} | {len(rs)} | {sum(r['pass'] for r in ok)} | "
            f"{sum(r['pass'] and not r['warned'] for r in ok)} | "
            f"{sum(r['warned'] for r in ok)} | {sum(r['silent_failure'] for r in ok)} | "
            f"{len(rs) - len(ok)} | {sum(r.get('wall_seconds', 0) for r in rs):.0f} |")
    lines += ["", "## Runs", "",
              "| model | sampler | pass | max abs z mean (column) | max abs z sd (column) | "
              "warned | problems | silent failure | divergences | wall (s) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    order = {m.name: i for i, m in enumerate(registry.MODELS)}
    for r in sorted(rows, key=lambda r: (order.get(r["model"], 999),
                                         samplers.index(r["sampler"]))):
        if r.get("status") != "ok":
            err = r.get("error", "").strip().splitlines()
            msg = (err[-1] if err else "")[:160].replace("|", "/")
            lines.append(f"| {r['model']} | {r['sampler']} | ERROR ({r.get('error_stage')}) "
                         f"| | | | {msg} | | | {r.get('wall_seconds', 0):.0f} |")
            continue
        probs = "; ".join(r.get("problems", []))[:160].replace("|", "/")
        lines.append(
            f"| {r['model']} | {r['sampler']} | {'PASS' if r['pass'] else 'FAIL'} | "
            f"{_fmt_z(r['max_abs_z_mean'])} ({r['worst_mean']}) | "
            f"{_fmt_z(r['max_abs_z_sd'])} ({r['worst_sd']}) | {_yes(r['warned'])} | "
            f"{probs} | {'**SILENT**' if r['silent_failure'] else 'no'} | "
            f"{r['divergences']} | {r['wall_seconds']:.0f} |")
    lines += ["", "## Models and references", "",
              "| model | type | data | reference | converged | max R-hat | min ESS bulk / tail "
              "| divergences |", "|---|---|---|---|---|---|---|---|"]
    for m in registry.MODELS:
        ref = refs.get(m.name)
        if ref is None:
            continue
        c = ref.get("checks", {})
        st = ref.get("settings", {})
        how = (f"{ref['source']}" if ref["source"] != "nuts" else
               f"NUTS {st.get('chains')}×({st.get('warmup')}+{st.get('draws')}), "
               f"adapt_delta {st.get('adapt_delta')}")
        if ref["source"].startswith("from"):
            how += (f" (NUTS {st.get('chains')}×({st.get('warmup')}+{st.get('draws')}), "
                    f"adapt_delta {st.get('adapt_delta')})")

        def f(x, fmt):
            return "" if x is None else format(x, fmt)
        lines.append(f"| {m.name} | {m.kind} | {m.source} | {how} | "
                     f"{_yes(c.get('converged'))} | {f(c.get('max_rhat'), '.4f')} | "
                     f"{f(c.get('min_ess_bulk'), '.0f')} / {f(c.get('min_ess_tail'), '.0f')} "
                     f"| {c.get('divergences', '')} |")
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(
        _clean({"meta": meta, "rows": rows}), indent=1, default=lambda o: None))


def _clean(obj):
    """Strict JSON: non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else str(x)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


# ---- main ---------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="", help="comma-separated names (default: all)")
    p.add_argument("--samplers", default=",".join(DEFAULT_SAMPLERS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--z-max", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--workers", type=int, default=1, choices=(1, 2),
                   help="jobs at once (2: each job's chains run one after another)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per job")
    p.add_argument("--rebuild-reference", action="store_true")
    p.add_argument("--reference-only", action="store_true")
    p.add_argument("--list", action="store_true", help="list the models and exit")
    args = p.parse_args(argv)

    registry = load_registry()
    names = [n.strip() for n in args.models.split(",") if n.strip()] or \
        [m.name for m in registry.MODELS]
    unknown = [n for n in names if n not in registry.BY_NAME]
    if unknown:
        p.error(f"unknown models {unknown}; choose from {list(registry.BY_NAME)}")
    if args.list:
        for m in registry.MODELS:
            print(f"{m.name:24s} {m.kind:55s} {m.source}")
        return 0
    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()]
    from ahmc_stan.sampling import SAMPLERS

    bad = [s for s in samplers if s != "nuts" and s not in SAMPLERS]
    if bad:
        p.error(f"unknown samplers {bad}; choose from nuts, {sorted(SAMPLERS)}")

    # references first (in this process; CmdStan runs its chains 2 at a time)
    refs = {}
    for i, n in enumerate(names, 1):
        entry = registry.BY_NAME[n]
        have = reference_path(n).is_file() and not args.rebuild_reference
        if not have:
            _log(f"[ref {i}/{len(names)}] {n}: computing")
        try:
            refs[n] = get_reference(entry, registry, rebuild=args.rebuild_reference)
        except Exception as err:  # noqa: BLE001
            _log(f"[ref {i}/{len(names)}] {n}: reference FAILED: {type(err).__name__}: "
                 f"{str(err)[-500:]}")
    if args.reference_only:
        bad_refs = [n for n, r in refs.items() if not r.get("checks", {}).get("converged")]
        _log(f"references: {len(refs)}/{len(names)} available; not converged: "
             f"{bad_refs or 'none'}")
        return 0 if len(refs) == len(names) else 1

    settings = {"seed": args.seed, "chains": args.chains, "warmup": args.warmup,
                "draws": args.draws, "z_max": args.z_max,
                "parallel": 1 if args.workers > 1 else min(2, os.cpu_count() or 1)}
    meta = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "finished": "", "machine": f"{platform.node()} ({os.cpu_count()} cores)",
            "samplers": samplers, "models": names, **settings}
    jobs = [(n, s) for n in names for s in samplers]
    rows: list[dict] = []
    for n in names:
        if n not in refs:
            for s in samplers:
                rows.append({"model": n, "sampler": s, "status": "error",
                             "error_stage": "reference", "error": "no reference",
                             "wall_seconds": 0.0})
    jobs = [j for j in jobs if j[0] in refs]
    runner = JobRunner(args.workers, args.timeout)
    t0 = time.perf_counter()
    pending = list(jobs)
    k = 0
    try:
        while pending or runner.running:
            while pending and not runner.full():
                key = pending.pop(0)
                _log(f"start {key[0]} × {key[1]}")
                runner.submit(key, settings)
            for row in runner.poll():
                k += 1
                rows.append(row)
                if row.get("status") == "ok":
                    verdict = "PASS" if row["pass"] else "FAIL"
                    extra = (f"max|z| mean {_fmt_z(row['max_abs_z_mean'])}, sd "
                             f"{_fmt_z(row['max_abs_z_sd'])}; "
                             f"{'warned: ' + '; '.join(row['problems'])[:120] if row['warned'] else 'no warning'}"
                             f"{' -> SILENT FAILURE' if row['silent_failure'] else ''}")
                else:
                    verdict = "ERROR"
                    extra = (row.get("error", "").strip().splitlines() or [""])[-1][:200]
                _log(f"[{k}/{len(jobs)}] {row['model']} × {row['sampler']}: {verdict} "
                     f"({row.get('wall_seconds', 0):.0f} s) {extra}")
                write_report(rows, refs, meta, args.out)
    except KeyboardInterrupt:
        runner.kill_all()
        _log("interrupted; writing what finished")
    meta["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    meta["wall_seconds"] = time.perf_counter() - t0
    write_report(rows, refs, meta, args.out)
    _log(f"wrote {args.out} and {args.out.with_suffix('.json')} "
         f"({meta['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
