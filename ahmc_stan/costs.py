"""One cost unit for every sampler: what an evaluation of each kind costs, in gradients,
measured on the model itself.

Samplers count their evaluations by kind, one per-iteration statistic each
(:data:`COST_STATS`): ``n_grad`` gradients (log density and gradient by reverse-mode
autodiff), ``n_density`` density-only evaluations, ``n_hvp`` Hessian-vector products,
``n_hessian`` Hessians (their gradient comes with them) and ``n_third`` third-derivative
tensors.  :func:`cost_units` times one evaluation of each kind at a point of the model and
divides by the time of one gradient there; :class:`~ahmc_stan.fit.Fit` converts its counts
into *gradient-equivalents* with these ratios, so that ESS per gradient means the same for
every sampler.

Timing: each kind is called through ctypes with preallocated buffers, in loops long enough
(≥ 20 ms) to be read reliably, alternating with loops of gradients, the minimum over 5
rounds, in CPU time of the calling thread (so that other processes on a loaded machine do
not inflate one side of a ratio).  The gradient is also timed inside the C++ library
(:meth:`~ahmc_stan.native.NativeDensity.gradient_seconds`); the difference, the ctypes
call's own overhead, is subtracted from every kind's time, so the ratios are those of the
bare C++ evaluations.  The method matters and is part of what is
measured: a Hessian by autodiff or by differences of gradients
(:attr:`~ahmc_stan.model.StanModel.hessian_method`), a third-derivative tensor by
third-order autodiff or by differences (:meth:`~ahmc_stan.native.NativeDensity.resolve_third_method`).

Cache: the ratios are measured once per compiled library and data, kept in memory and in
``<compile cache>/costs/<key>.json`` (written atomically, under a lock file so that
concurrent processes measure a model once).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Iterable

import numpy as np

__all__ = ["COST_STATS", "KINDS", "cost_units", "clear_memory_cache"]

#: Per-iteration count statistic → the kind of evaluation it counts.
COST_STATS = {"n_grad": "gradient", "n_density": "density", "n_hvp": "hvp",
              "n_hessian": "hessian", "n_third": "third"}

#: Kinds :func:`cost_units` measures (``tr_third``: the contraction ``tr(M ∂∇²log p)``,
#: :meth:`~ahmc_stan.native.NativeDensity.tr_hessian_grad`, with M = I).
KINDS = ("density", "hvp", "hessian", "third", "tr_third")

_MEMORY: dict[tuple[str, str], dict] = {}

#: Timing: seconds per timed loop, repeats (the minimum is kept), and a cap per kind.
_LOOP_SECONDS, _REPEATS, _MAX_SECONDS = 0.02, 5, 10.0


def clear_memory_cache() -> None:
    """Forget the ratios held in memory (the files stay)."""
    _MEMORY.clear()


def _costs_dir() -> Path:
    from .compiler import cache_dir

    return cache_dir() / "costs"


def model_key(model) -> str:
    """Identifies the compiled library (path, size, modification time) and the data."""
    lib = Path(model.lib_path)
    try:
        st = lib.stat()
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = ""
    seed = model._init_args[0] if hasattr(model, "_init_args") else ""
    return hashlib.sha256("\0".join(
        [str(lib.resolve()), stamp, str(seed), model.data_json]).encode()).hexdigest()[:24]


def _hessian_by_differences(model, hessian_method: str) -> bool:
    """Whether Hessians are asked for as our differences of gradients where the library
    has autodiff ones (a library without them differences gradients itself)."""
    return model.density.resolve_hessian_method(hessian_method) == "gradient" and \
        model.density.hessian_autodiff


def _method(model, kind: str, third_method: str, hessian_method: str = "auto") -> str:
    """The entry name of ``kind``: the kind and the method that computes it."""
    kernel = model.density
    if kind == "hessian" and _hessian_by_differences(model, hessian_method):
        return "hessian/gradient"
    if kind in ("hvp", "hessian"):
        return f"{kind}/{model.hessian_method}"
    if kind == "third":
        return f"third/{kernel.resolve_third_method(third_method)}"
    if kind == "tr_third":
        return "tr_third/" + kernel.resolve_third_method(
            third_method if third_method in ("auto", "autodiff", "hessian") else "auto",
            ("autodiff", "hessian"), fallback="hessian")
    if kind == "density":
        return "density"
    raise ValueError(f"unknown cost kind {kind!r}; expected one of {', '.join(KINDS)}")


def _clock() -> float:
    """This thread's CPU seconds: time the machine's other processes take from it does not
    count (wall-clock timings on a loaded machine vary by tens of per cent)."""
    return time.thread_time()


def _loop_size(fn) -> int:
    """Calls of ``fn`` that take ≥ 20 ms (after a warm-up call: the tape, caches)."""
    fn()
    n = 1
    while True:
        t0 = _clock()
        for _ in range(n):
            fn()
        elapsed = _clock() - t0
        if elapsed >= _LOOP_SECONDS or elapsed * 2 > _MAX_SECONDS / _REPEATS:
            return n
        n = max(2 * n, int(n * 1.2 * _LOOP_SECONDS / max(elapsed, 1e-9)))


def _per_call(fn, n: int) -> float:
    t0 = _clock()
    for _ in range(n):
        fn()
    return (_clock() - t0) / n


class _Calls:
    """Zero-argument ctypes calls of each kind at one point, buffers preallocated."""

    def __init__(self, model, x: np.ndarray, third_method: str, hessian_method: str = "auto"):
        self.model, self.model_density = model, model.density
        n = model.dims
        self.x = np.ascontiguousarray(x, dtype=float)
        self.v = np.ascontiguousarray(np.linspace(-1.0, 1.0, n) if n > 1 else np.ones(n))
        self.grad, self.out = np.empty(n), np.empty(n)
        self.hess, self.eye = np.empty((n, n)), np.eye(n)
        self.third = np.empty((n,) * 3) if n <= 400 else None
        self.lp = ctypes.c_double()
        self.third_method, self.hessian_method = third_method, hessian_method
        handle = model.bridge.model
        xp, lpp, gp = self.x.ctypes.data, ctypes.addressof(self.lp), self.grad.ctypes.data
        vp, op = self.v.ctypes.data, self.out.ctypes.data
        entry = self.model_density.entry
        if self.model_density.native:
            g = entry("ahmc_log_density_gradient")
            self.gradient = lambda: g(handle, True, True, xp, lpp, gp)
        else:
            g = entry("bs_log_density_gradient")
            self.gradient = lambda: g(handle, True, True, xp, lpp, gp, None)
        d = entry("bs_log_density")
        self.density = lambda: d(handle, True, True, xp, lpp, None)
        h = entry("bs_log_density_hessian_vector_product")
        self.hvp = lambda: h(handle, True, True, xp, vp, lpp, op, None)

    def hessian(self):
        return 0 if np.isfinite(self.model_density.log_density_hessian(
            self.x, self.grad, self.hess, self.hessian_method)) else 1

    def call(self, kind: str):
        """The zero-argument call of ``kind``."""
        if kind in ("density", "hvp", "gradient"):
            return getattr(self, kind)
        if kind == "hessian":
            return self.hessian
        if kind == "third":
            if self.third is None:
                raise ValueError("third-derivative tensors are not timed above 400 dims")
            buf, method = self.third, self.third_method
            return lambda: 0 if self.model_density.third_derivatives(self.x, buf, method) else 1
        if kind == "tr_third":
            method = self.third_method if self.third_method in (
                "autodiff", "hessian") else "auto"
            return lambda: 0 if self.model_density.tr_hessian_grad(self.x, self.eye, self.out,
                                                            method) else 1
        raise ValueError(f"unknown cost kind {kind!r}")


def _measure(model, kinds: list[str], x: np.ndarray, third_method: str,
             hessian_method: str = "auto") -> dict[str, dict]:
    """Time ``kinds`` and the gradient at ``x``; entry name → record.  Each kind is timed
    in rounds alternating with the gradient (through ctypes and inside C++), so both see
    the same conditions; the minimum per call over the rounds is kept."""
    calls = _Calls(model, x, third_method, hessian_method)
    native = model.density.native
    n_grad = _loop_size(calls.gradient)
    grad_py, grad_c = [math.inf], [math.inf]

    def time_gradient():
        grad_py[0] = min(grad_py[0], _per_call(calls.gradient, n_grad))
        if native:
            t0 = _clock()
            model.density.gradient_seconds(calls.x, n_grad)
            grad_c[0] = min(grad_c[0], (_clock() - t0) / n_grad)

    timed = {}
    for kind in kinds:
        fn = calls.call(kind)
        failed = fn() != 0
        n, best, t0 = _loop_size(fn), math.inf, time.perf_counter()
        for _ in range(_REPEATS):
            time_gradient()
            best = min(best, _per_call(fn, n))
            if time.perf_counter() - t0 > _MAX_SECONDS:
                break
        timed[kind] = (best, failed)
    overhead = max(0.0, grad_py[0] - grad_c[0]) if native else 0.0
    grad = grad_c[0] if native else grad_py[0]
    out = {}
    for kind, (seconds_py, failed) in timed.items():
        seconds = max(seconds_py - overhead, 0.1 * seconds_py)
        out[_method(model, kind, third_method, hessian_method)] = {
            "ratio": seconds / grad, "seconds": seconds, "seconds_with_call": seconds_py,
            "gradient_seconds": grad, "call_overhead_seconds": overhead,
            "failed_at_point": bool(failed), "dims": model.dims, "clock": "thread CPU time",
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return out


def _point(model, x) -> np.ndarray:
    """``x`` if the gradient is finite there, else Stan's random initial points."""
    grad = np.empty(model.dims)
    if x is not None:
        x = np.ascontiguousarray(x, dtype=float)
        if np.isfinite(model.density.log_density_gradient(x, grad)):
            return x
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = np.ascontiguousarray(model.initial_point(rng), dtype=float)
        if np.isfinite(model.density.log_density_gradient(y, grad)):
            return y
    raise RuntimeError(f"{model.name}: no point with a finite gradient to time costs at")


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (``fcntl.flock``; no lock where unavailable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover — not POSIX
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def _write(path: Path, model, entries: dict) -> None:
    """Replace ``path`` atomically (a complete file or the old one, never a torn one)."""
    text = json.dumps({"model": model.name, "stan_file": str(model.stan_file),
                       "library": str(model.lib_path), "entries": entries}, indent=1)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def cost_units(model, kinds: Iterable[str], *, third_method: str = "auto",
               hessian_method: str = "auto", x: np.ndarray | None = None,
               refresh: bool = False) -> dict[str, float]:
    """Seconds of one evaluation of each of ``kinds`` (:data:`KINDS`) over seconds of one
    gradient, on ``model`` (a :class:`~ahmc_stan.model.StanModel`): ``{"gradient": 1.0,
    kind: ratio, ...}``.  ``third_method`` is the third-derivative method the sampler
    used (``"auto"``, ``"autodiff"``, ``"gradient"``, ``"hessian"``), ``hessian_method``
    its Hessians' (``"auto"``, ``"autodiff"``, ``"gradient"``).  Measured at ``x``
    (default, or where its gradient is not finite: one of Stan's random initial points)
    the first time a kind is asked for, then read from the cache (module docstring);
    ``refresh=True`` measures again."""
    units = {"gradient": 1.0}
    kinds = [k for k in dict.fromkeys(kinds) if k != "gradient"]
    if not kinds:
        return units
    names = {k: _method(model, k, third_method, hessian_method) for k in kinds}
    key = model_key(model)
    cached = {} if refresh else {n: _MEMORY[(key, n)] for n in names.values()
                                 if (key, n) in _MEMORY}
    missing = [k for k in kinds if names[k] not in cached]
    if missing:
        path = _costs_dir() / f"{key}.json"
        with _locked(path.with_suffix(".lock")):
            entries = _read(path)
            if not refresh:
                cached.update({n: entries[n] for n in names.values() if n in entries})
            todo = [k for k in kinds if names[k] not in cached]
            if todo:
                measured = _measure(model, todo, _point(model, x), third_method,
                                    hessian_method)
                entries.update(measured)
                cached.update(measured)
                _write(path, model, entries)
        for n in names.values():
            _MEMORY[(key, n)] = cached[n]
    units.update({k: float(cached[names[k]]["ratio"]) for k in kinds})
    return units
