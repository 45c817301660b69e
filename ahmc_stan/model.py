"""A Stan model with data: log density, derivatives and parameter transforms.

``StanModel`` compiles (or loads from the cache) the model's shared library, which exports
the BridgeStan C API, and loads it with the unmodified ``bridgestan.StanModel``.  Samplers
use :class:`DensityKernel` (``model.kernel``), a lower-overhead path through ahmc-stan's own
entry points in the same library.

Errors.  Constructing with missing or mis-shaped data raises ``ValueError`` carrying
Stan's message, which names the variable.  The user-facing density methods
(``log_density``, ``log_density_gradient``, ``log_density_hessian``, ``log_density_hvp``)
raise :class:`DensityError` with Stan's message where the model throws (a ``reject``
statement, an argument outside a distribution's support).  The sampler path
(``model.kernel``) never raises for that: such a point has log density ``-inf`` and a
proposal there is rejected.
"""

from __future__ import annotations

import ctypes
import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .compiler import compile_model, invalidate

__all__ = ["StanModel", "DensityError", "DensityKernel"]

DataArg = Mapping[str, Any] | str | os.PathLike | None


class DensityError(RuntimeError):
    """The Stan model threw while evaluating the log density (Stan's message inside)."""


def _data_json(data: DataArg) -> str:
    """Stan JSON text for ``data``: a dict, a path to a JSON file, or JSON text."""
    if data is None:
        return ""
    if isinstance(data, Mapping):
        import stanio

        return stanio.dump_stan_json(dict(data))
    text = os.fspath(data)
    if text.lstrip().startswith("{"):
        json.loads(text)  # a clear error for malformed JSON text
        return text
    path = Path(text)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    return path.read_text()


def _names(joined: list[str]) -> list[str]:
    return [] if joined == [""] else joined


class StanModel:
    """A compiled Stan program conditioned on data.

    Parameters
    ----------
    stan_file : path to the ``.stan`` program.
    data : dict, path to a JSON data file, or JSON text (Stan's JSON conventions).
    seed : seed of the RNG used by the ``transformed data`` block.
    stanc_args, include_paths : passed to stanc (part of the cache key).
    """

    def __init__(self, stan_file: str | os.PathLike, data: DataArg = None, *,
                 seed: int = 1234, stanc_args: list[str] = (),
                 include_paths: list[str | os.PathLike] = ()):
        import bridgestan

        self.stan_file = Path(stan_file).resolve()
        self.data_json = _data_json(data)
        self._init_args = (seed, list(stanc_args), [str(p) for p in include_paths])
        self._int_variables: list[str] | None = None
        for attempt in range(2):
            self.lib_path = compile_model(self.stan_file, stanc_args=stanc_args,
                                          include_paths=include_paths)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # re-loading one library for other data
                try:
                    self.bridge = bridgestan.StanModel(str(self.lib_path), self.data_json,
                                                       seed=seed, warn=False)
                    break
                except RuntimeError as err:
                    raise ValueError(f"data for {self.stan_file.name}: {err}") from None
                except OSError:  # the cached library does not load: rebuild it once
                    if attempt:
                        raise
                    invalidate(self.lib_path)
        self.name = self.bridge.name()
        self.dims = self.bridge.param_unc_num()
        self.kernel = DensityKernel(self)

    @property
    def build_log(self) -> Path:
        """The compile log of this model's cache entry (stanc warnings, and why a
        derivative snippet was left out)."""
        return self.lib_path.parent.parent / "build.log"

    def int_variables(self) -> list[str]:
        """The transformed parameters and generated quantities declared ``int`` (stanc's
        ``--info``), whose draws are integers."""
        if self._int_variables is None:
            from .compiler import stanc_info

            info = stanc_info(self.stan_file, self._init_args[2])
            self._int_variables = [
                name for block in ("transformed parameters", "generated quantities")
                for name, v in info.get(block, {}).items() if v.get("type") == "int"]
        return list(self._int_variables)

    @property
    def hessian_method(self) -> str:
        """How :meth:`log_density_hessian`, :meth:`log_density_hvp` and the Riemannian
        samplers get second derivatives: ``"autodiff"`` (forward-over-reverse), or
        ``"finite_differences"`` (central differences of autodiff gradients) for models
        whose functions have no forward-mode instances, such as Stan's ODE and
        algebraic solvers; :attr:`build_log` says why."""
        return "autodiff" if self.kernel.hessian_autodiff else "finite_differences"

    def __reduce__(self):
        """Pickled as its constructor arguments: a worker process reloads the library
        from the compile cache."""
        seed, stanc_args, include_paths = self._init_args
        return (_rebuild_model, (str(self.stan_file), self.data_json, seed, stanc_args,
                                 include_paths))

    @property
    def data(self) -> dict:
        """The data as a dict (parsed from the Stan JSON)."""
        return json.loads(self.data_json) if self.data_json.strip() else {}

    def __repr__(self) -> str:
        return f"StanModel({str(self.stan_file)!r}, dims={self.dims})"

    # ---- names and transforms -------------------------------------------------------

    def param_names(self, *, include_tp: bool = False, include_gq: bool = False) -> list[str]:
        """Constrained names (``a.1.2`` for ``a[1, 2]``), column-major as in Stan."""
        return _names(self.bridge.param_names(include_tp=include_tp, include_gq=include_gq))

    def param_unc_names(self) -> list[str]:
        """Names of the unconstrained coordinates."""
        return _names(self.bridge.param_unc_names())

    def constrain(self, x: np.ndarray, *, include_tp: bool = False,
                  include_gq: bool = False, rng: np.random.Generator | int | None = None
                  ) -> np.ndarray:
        """Constrained values of the unconstrained point ``x``; a 2-d ``x`` maps row by row.

        Generated quantities need ``rng`` (a numpy Generator or an int seed).
        """
        x = np.asarray(x, dtype=float)
        seed = 0
        if include_gq:
            if rng is None:
                raise ValueError("generated quantities need an rng (Generator or seed)")
            seed = int(rng if isinstance(rng, (int, np.integer)) else rng.integers(2**31))
        if x.ndim == 2 and self.kernel.native:  # every row in one C++ call
            return self._constrain_rows(x, include_tp, include_gq, seed)
        stan_rng = self.bridge.new_rng(seed) if include_gq else None
        call = lambda row: self._call(self.bridge.param_constrain, np.ascontiguousarray(row),
                                      include_tp=include_tp, include_gq=include_gq,
                                      rng=stan_rng)
        if x.ndim == 1:
            return call(x)
        n_out = len(self.param_names(include_tp=include_tp, include_gq=include_gq))
        return np.array([call(row) for row in x]).reshape(len(x), n_out)

    def _constrain_rows(self, x: np.ndarray, include_tp: bool, include_gq: bool,
                        seed: int) -> np.ndarray:
        """All rows in one C++ call (``ahmc_param_constrain_rows``), generated quantities
        drawing from one Stan RNG seeded with ``seed``."""
        fn = self.kernel._entry("ahmc_param_constrain_rows", [
            _ptr, ctypes.c_bool, ctypes.c_bool, ctypes.c_int, _ptr, ctypes.c_uint, _ptr,
            ctypes.POINTER(ctypes.c_char_p)])
        x = np.ascontiguousarray(x, dtype=float)
        if x.shape[1:] != (self.dims,):
            raise ValueError(f"expected rows of {self.dims} unconstrained values, got {x.shape}")
        out = np.empty((len(x), len(self.param_names(include_tp=include_tp,
                                                     include_gq=include_gq))))
        err = ctypes.c_char_p()
        if fn(self.bridge.model, include_tp, include_gq, len(x), x.ctypes.data, seed,
              out.ctypes.data, ctypes.byref(err)):
            message = err.value.decode(errors="replace") if err.value else "unknown error"
            self.bridge.stanlib.bs_free_error_msg(err)
            raise DensityError(message)
        return out

    def unconstrain(self, theta: np.ndarray | Mapping[str, Any]) -> np.ndarray:
        """Unconstrained point from constrained values: a flat array in ``param_names()``
        order, or a dict of Stan variables."""
        if isinstance(theta, Mapping):
            import stanio

            return self._call(self.bridge.param_unconstrain_json,
                              stanio.dump_stan_json(dict(theta)))
        return self._call(self.bridge.param_unconstrain,
                          np.ascontiguousarray(theta, dtype=float))

    def initial_point(self, rng: np.random.Generator, init: Mapping[str, Any] | None = None,
                      *, radius: float = 2.0, max_tries: int = 100) -> np.ndarray:
        """Stan's initialisation: values not in ``init`` are uniform(-radius, radius) on the
        unconstrained scale, redrawn until log density and gradient are finite."""
        import stanio

        stan_rng = self.bridge.new_rng(int(rng.integers(2**31)))
        theta = stanio.dump_stan_json(dict(init)) if init else None
        try:
            return self.bridge.param_initialize(stan_rng, theta, init_radius=radius,
                                                max_tries=max_tries)
        except RuntimeError as err:
            raise RuntimeError(f"{self.stan_file.name}: {err}") from None

    # ---- log density and derivatives -------------------------------------------------

    def _call(self, method, *args, **kwargs):
        try:
            return method(*args, **kwargs)
        except RuntimeError as err:
            raise DensityError(str(err)) from None

    def _point(self, x) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=float)
        if x.shape != (self.dims,):
            raise ValueError(f"expected an unconstrained point of shape ({self.dims},), "
                             f"got {x.shape}")
        return x

    def log_density(self, x, *, propto: bool = True, jacobian: bool = True) -> float:
        """log p(x) on the unconstrained scale; ``propto`` drops constants, ``jacobian``
        adds the log absolute Jacobian of the constraining transform."""
        return self._call(self.bridge.log_density, self._point(x), propto=propto,
                          jacobian=jacobian)

    def log_density_gradient(self, x, *, propto: bool = True, jacobian: bool = True
                             ) -> tuple[float, np.ndarray]:
        """(log density, gradient) by reverse-mode automatic differentiation."""
        return self._call(self.bridge.log_density_gradient, self._point(x),
                          propto=propto, jacobian=jacobian)

    def log_density_hessian(self, x, *, propto: bool = True, jacobian: bool = True
                            ) -> tuple[float, np.ndarray, np.ndarray]:
        """(log density, gradient, Hessian) by forward-over-reverse autodiff."""
        return self._call(self.bridge.log_density_hessian, self._point(x),
                          propto=propto, jacobian=jacobian)

    def log_density_hvp(self, x, v, *, propto: bool = True, jacobian: bool = True
                        ) -> tuple[float, np.ndarray]:
        """(log density, Hessian @ v) by forward-over-reverse autodiff, O(cost of a gradient)."""
        return self._call(self.bridge.log_density_hessian_vector_product, self._point(x),
                          self._point(v), propto=propto, jacobian=jacobian)

    def log_density_tr_hessian_grad(self, x, M, method: str = "auto") -> np.ndarray:
        """Gradient of ``x ↦ tr(M ∇²log p(x))``: ``g_i = tr(M ∂(∇²log p)/∂x_i)``, the third
        derivative contraction of Riemann-manifold HMC (Girolami & Calderhead 2011, eq. 15;
        Betancourt 2013, SoftAbs gradient).  Jacobian included; third-order autodiff
        where the library has it (:meth:`DensityKernel.tr_hessian_grad`)."""
        x = self._point(x)
        M = np.ascontiguousarray(M, dtype=float)
        if M.shape != (self.dims, self.dims):
            raise ValueError(f"M must have shape ({self.dims}, {self.dims}), got {M.shape}")
        out = np.empty(self.dims)
        if not self.kernel.tr_hessian_grad(x, M, out, method):
            raise DensityError("the model threw or a derivative is not finite near this point")
        return out

    def log_density_third_derivatives(self, x, method: str = "auto") -> np.ndarray:
        """The symmetric tensor ``T[l, j, k] = ∂³log p / ∂x_l ∂x_j ∂x_k`` (Jacobian
        included), by third-order autodiff where the library has it, else differences of
        exact Hessians or gradients (:meth:`DensityKernel.third_derivatives`)."""
        x = self._point(x)
        out = np.empty((self.dims,) * 3)
        if not self.kernel.third_derivatives(x, out, method):
            raise DensityError("the model threw or a derivative is not finite near this point")
        return out


def _rebuild_model(stan_file, data_json, seed, stanc_args, include_paths) -> StanModel:
    return StanModel(stan_file, data_json or None, seed=seed, stanc_args=stanc_args,
                     include_paths=include_paths)


_ptr = ctypes.c_void_p


def _metric_args(inv_metric: np.ndarray | None) -> tuple[int, int | None]:
    """(kind, pointer) of an inverse metric for the C layer: 0 identity (None), 1 diagonal
    (a vector), 2 dense (a C-contiguous matrix)."""
    if inv_metric is None:
        return 0, None
    return (1 if inv_metric.ndim == 1 else 2), inv_metric.ctypes.data


class DensityKernel:
    """The samplers' path to a model's density: ctypes calls with preallocated buffers into
    ahmc-stan's entry points (``ahmc_*`` in ``csrc/ahmc_bridge.cpp``).

    Log density and gradient include the Jacobian and drop constants.  A point where the
    model throws or the result is not finite has log density ``-inf``.
    """

    def __init__(self, model: StanModel):
        self.dims = model.dims
        self._model = model  # keeps the library and the C model alive
        lib, handle = model.bridge.stanlib, model.bridge.model
        self.native = hasattr(lib, "ahmc_log_density_gradient")
        self._lp = ctypes.c_double()
        if not self.native:  # built by bridgestan.compile_model: no ahmc entry points
            return
        self._handle = handle
        self._grad = lib.ahmc_log_density_gradient
        self._grad.restype = ctypes.c_int
        self._grad.argtypes = [_ptr, ctypes.c_bool, ctypes.c_bool, _ptr, _ptr, _ptr]
        self._leapfrog = lib.ahmc_leapfrog
        self._leapfrog.restype = ctypes.c_int
        self._leapfrog.argtypes = [_ptr, ctypes.c_int, ctypes.c_double, ctypes.c_int,
                                   _ptr, _ptr, _ptr, _ptr, _ptr]
        self._hmc_block = lib.ahmc_hmc_block
        self._hmc_block.restype = ctypes.c_int
        self._hmc_block.argtypes = [
            _ptr, ctypes.c_int, ctypes.c_double, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            _ptr, ctypes.c_uint64, ctypes.c_double, *[_ptr] * 11]
        self._draw_momenta = lib.ahmc_draw_momenta
        self._draw_momenta.restype = ctypes.c_int
        self._draw_momenta.argtypes = [ctypes.c_int, _ptr, ctypes.c_int, ctypes.c_uint64,
                                       ctypes.c_int, _ptr]
        self._seconds = lib.ahmc_gradient_seconds
        self._seconds.restype = ctypes.c_double
        self._seconds.argtypes = [_ptr, _ptr, ctypes.c_int]
        self._lp_ptr = ctypes.addressof(self._lp)

    def log_density_gradient(self, x: np.ndarray, grad_out: np.ndarray) -> float:
        """Write the gradient at ``x`` into ``grad_out`` (both C-contiguous float64 of
        length ``dims``) and return the log density (``-inf`` where not finite)."""
        if not self.native:
            try:
                lp, _ = self._model.bridge.log_density_gradient(x, out=grad_out)
            except RuntimeError:
                return -np.inf
            return lp if np.isfinite(lp) and np.all(np.isfinite(grad_out)) else -np.inf
        if self._grad(self._handle, True, True, x.ctypes.data, self._lp_ptr,
                      grad_out.ctypes.data):
            return -np.inf
        return self._lp.value

    def leapfrog(self, n_steps: int, step_size: float, inv_metric: np.ndarray | None,
                 x: np.ndarray, p: np.ndarray, grad: np.ndarray, lp: float) -> tuple[float, int]:
        """``n_steps`` leapfrog steps from (x, p), updating ``x``, ``p`` and ``grad`` in
        place; returns (log density at the end, gradient evaluations made).  The log
        density is ``-inf`` if the trajectory met a point where it is not finite.

        ``inv_metric`` is None (identity), a vector (diagonal) or a matrix (dense).
        """
        if not self.native:
            return self._leapfrog_python(n_steps, step_size, inv_metric, x, p, grad)
        self._lp.value = lp
        n = self._leapfrog(self._handle, n_steps, step_size, *_metric_args(inv_metric),
                           x.ctypes.data, p.ctypes.data, grad.ctypes.data, self._lp_ptr)
        return self._lp.value, n

    _BLOCK_OUTPUTS = (("draws", float), ("accept_prob", float), ("accepted", np.intc),
                      ("divergent", np.intc), ("energy", float), ("lp", float),
                      ("n_grad", np.intc))

    def hmc_block(self, step_size: float, max_steps: int, jitter: bool,
                  inv_metric: np.ndarray | None, seed: int, n_iter: int,
                  max_energy_error: float, x: np.ndarray, grad: np.ndarray, lp: float
                  ) -> tuple[float, dict]:
        """``n_iter`` HMC iterations in one C++ call (``ahmc_hmc_block``), their momenta,
        ``L_r ~ U{1..max_steps}`` (or ``max_steps`` without ``jitter``) and Metropolis
        uniforms drawn in C++ from the 64-bit ``seed`` (xoshiro256++, Boost's ziggurat
        normals).  Updates ``x`` and ``grad`` in place; returns (log density of the final
        state, per-iteration arrays ``draws``, ``accept_prob``, ``accepted``,
        ``divergent``, ``energy``, ``lp``, ``n_grad``, ``n_steps``)."""
        if not self.native:
            raise RuntimeError("HMC needs a library built by ahmc-stan (unset BRIDGESTAN)")
        out = {k: np.empty((n_iter, self.dims) if k == "draws" else n_iter, dtype)
               for k, dtype in self._BLOCK_OUTPUTS}
        out["n_steps"] = np.empty(n_iter, np.intc)
        self._lp.value = lp
        if self._hmc_block(
                self._handle, n_iter, step_size, int(max_steps), int(bool(jitter)),
                *_metric_args(inv_metric), seed, max_energy_error, x.ctypes.data,
                grad.ctypes.data, self._lp_ptr, out["n_steps"].ctypes.data,
                *(out[k].ctypes.data for k, _ in self._BLOCK_OUTPUTS)):
            raise ValueError("the dense inverse metric is not positive definite")
        return self._lp.value, out

    def draw_momenta(self, inv_metric: np.ndarray | None, seed: int, n: int) -> np.ndarray:
        """``n`` momenta from N(0, M) drawn exactly as :meth:`hmc_block` draws them
        (``ahmc_draw_momenta``)."""
        out = np.empty((n, self.dims))
        if self._draw_momenta(*_metric_args(inv_metric), self.dims, seed, n,
                              out.ctypes.data):
            raise ValueError("the dense inverse metric is not positive definite")
        return out

    def _leapfrog_python(self, n_steps, step_size, inv_metric, x, p, grad):
        lp = -np.inf
        for step in range(n_steps):
            p += 0.5 * step_size * grad
            if inv_metric is None:
                x += step_size * p
            elif inv_metric.ndim == 1:
                x += step_size * inv_metric * p
            else:
                x += step_size * inv_metric @ p
            lp = self.log_density_gradient(x, grad)
            if not np.isfinite(lp):
                return -np.inf, step + 1
            p += 0.5 * step_size * grad
        return lp, n_steps

    def gradient_seconds(self, x: np.ndarray, n_reps: int = 10000) -> float:
        """Seconds per gradient measured inside the C++ library (no Python overhead)."""
        if not self.native:
            raise RuntimeError("this library was not built by ahmc-stan")
        x = np.ascontiguousarray(x, dtype=float)
        return self._seconds(self._handle, x.ctypes.data, n_reps)

    # ---- second and third derivatives (Riemann-manifold HMC) -----------------------------

    #: Relative steps of the finite differences behind the third derivatives of models
    #: without third-order autodiff (``ahmc_bridge.cpp``): of exact Hessians,
    #: ≈ eps^(1/3), error ≈ 1e-10 relative; of exact gradients (second differences),
    #: ≈ eps^(1/4), error ≈ 1e-7 relative.
    third_derivative_steps = {"hessian": 6e-6, "gradient": 1.2e-4, "autodiff": 0.0}
    _third_methods = {"hessian": 0, "gradient": 1, "autodiff": 2}

    @property
    def hessian_autodiff(self) -> bool:
        """Whether Hessians are exact autodiff (``csrc/ahmc_second_order.hpp``) rather
        than central differences of autodiff gradients."""
        if "_hessian_autodiff" not in self.__dict__:
            fn = self._entry("ahmc_hessian_autodiff", [])
            self.__dict__["_hessian_autodiff"] = bool(fn())
        return self.__dict__["_hessian_autodiff"]

    def _third_step(self, method: str) -> float:
        """Relative finite-difference step of a third-derivative method: differences of
        Hessians that are themselves differences of gradients take the gradient step,
        which balances their larger error against truncation."""
        if method == "hessian" and not self.hessian_autodiff:
            return self.third_derivative_steps["gradient"]
        return self.third_derivative_steps[method]

    @property
    def third_order_available(self) -> bool:
        """Whether the library has exact third-order autodiff (``fvar<fvar<var>>``, see
        ``csrc/ahmc_third_order.hpp``); models whose functions lack those instances are
        built without it."""
        if "_third_order" not in self.__dict__:
            fn = self._entry("ahmc_third_order_available", [])
            self.__dict__["_third_order"] = bool(fn())
        return self.__dict__["_third_order"]

    def resolve_third_method(self, method: str, choices=("autodiff", "gradient", "hessian"),
                      fallback: str = "gradient") -> str:
        """The method ``method`` names: ``"auto"`` is autodiff where the library has it,
        else ``fallback``."""
        if method == "auto":
            method = "autodiff" if self.third_order_available else fallback
        if method not in choices:
            raise ValueError(f"unknown third-derivative method {method!r}; expected "
                             f"'auto' or one of {', '.join(map(repr, choices))}")
        if method == "autodiff" and not self.third_order_available:
            raise RuntimeError("this model library was built without third-order autodiff "
                               "(its build log says why); use 'gradient' or 'hessian'")
        return method

    def _entry(self, name: str, argtypes: list):
        """A ctypes entry point of the C layer (returning int), bound on first use."""
        cache = self.__dict__.setdefault("_entries", {})
        if name not in cache:
            if not self.native:
                raise RuntimeError(f"{name} needs a library built by ahmc-stan "
                                   "(unset BRIDGESTAN)")
            fn = getattr(self._model.bridge.stanlib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = argtypes
            cache[name] = fn
        return cache[name]

    def log_density_hessian(self, x: np.ndarray, grad_out: np.ndarray,
                            hess_out: np.ndarray) -> float:
        """Write the gradient and the Hessian (C-contiguous ``(dims, dims)``) at ``x`` into
        the buffers and return the log density (``ahmc_log_density_hessian``: one autodiff
        pass, or differences of gradients, see :attr:`hessian_autodiff`); ``-inf`` where
        the model throws or a result is not finite."""
        fn = self._entry("ahmc_log_density_hessian", [_ptr] * 5)
        if fn(self._handle, x.ctypes.data, self._lp_ptr, grad_out.ctypes.data,
              hess_out.ctypes.data):
            return -np.inf
        return self._lp.value

    def third_derivatives(self, x: np.ndarray, out: np.ndarray, method: str = "auto"
                          ) -> bool:
        """Write ``T[l, j, k] = ∂³log p/∂x_l∂x_j∂x_k`` (C-contiguous ``(dims,)*3``) into
        ``out``; False where the model throws or a result is not finite.  ``method``:
        ``"autodiff"``, exact (``stan::math::grad_hessian``: dims(dims+1)/2
        ``fvar<fvar<var>>`` sweeps); for libraries without it ``"hessian"``, central
        differences of autodiff Hessians (2·dims Hessians, ~1e-10 relative error), or
        ``"gradient"``, second differences of autodiff gradients (2·dims² + 1 gradients,
        ~1e-7); ``"auto"`` (default) is autodiff where available, else "gradient"."""
        fn = self._entry("ahmc_third_derivatives",
                                 [_ptr, _ptr, ctypes.c_int, ctypes.c_double, _ptr])
        method = self.resolve_third_method(method)
        return fn(self._handle, x.ctypes.data, self._third_methods[method],
                  self._third_step(method), out.ctypes.data) == 0

    def tr_hessian_grad(self, x: np.ndarray, M: np.ndarray, out: np.ndarray,
                        method: str = "auto") -> bool:
        """Write ``tr(M ∂(∇²log p)/∂x_l)`` for every l into ``out`` (``M`` C-contiguous
        ``(dims, dims)``); False where the model throws or a result is not finite.
        ``method``: ``"autodiff"`` (``stan::math::grad_tr_mat_times_hessian``, dims
        ``fvar<fvar<var>>`` sweeps) or ``"hessian"`` (differences of autodiff Hessians);
        ``"auto"`` is autodiff where available."""
        fn = self._entry("ahmc_log_density_tr_hessian_grad",
                                 [_ptr, _ptr, _ptr, ctypes.c_int, ctypes.c_double, _ptr])
        method = self.resolve_third_method(method, ("autodiff", "hessian"), fallback="hessian")
        return fn(self._handle, x.ctypes.data, M.ctypes.data, self._third_methods[method],
                  self._third_step(method), out.ctypes.data) == 0
