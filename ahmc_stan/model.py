"""A Stan model with data: log density, derivatives and parameter transforms.

``StanModel`` compiles (or loads from the cache) the model's shared library, which exports
the BridgeStan C API, and loads it with the unmodified ``bridgestan.StanModel``.  Samplers
use :class:`~ahmc_stan.native.NativeDensity` (``model.density``), a lower-overhead path
through ahmc-stan's own entry points in the same library.

Errors.  Constructing with missing or mis-shaped data raises ``ValueError`` carrying
Stan's message, which names the variable.  The user-facing density methods
(``log_density``, ``log_density_gradient``, ``log_density_hessian``, ``log_density_hvp``)
raise :class:`DensityError` with Stan's message where the model throws (a ``reject``
statement, an argument outside a distribution's support).  The sampler path
(``model.density``) never raises for that: such a point has log density ``-inf`` and a
proposal there is rejected.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .compiler import compile_model, invalidate
from .native import NativeDensity

__all__ = ["StanModel", "DensityError"]

DataArg = Mapping[str, Any] | str | os.PathLike | None

#: :meth:`StanModel.constrain_each` uses threads from this many values on (below it,
#: starting them costs more than they save).
CONSTRAIN_IN_THREADS = 100_000


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
    stanc_args, include_paths : passed to stanc (part of the cache key); stanc runs at
        ``--O1`` unless ``stanc_args`` choose another ``--O`` level.
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
        self.density = NativeDensity(self)

    def settle(self) -> None:
        """Fill now what a run fills on first use: :meth:`int_variables` and
        :attr:`constrains_to_itself` (cached once known), so that processes forked now
        (:mod:`ahmc_stan.workers`' kept workers) hold this model as the run leaves it."""
        self.int_variables()
        self.constrains_to_itself  # noqa: B018  (a cached property: computed once)

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
        return "autodiff" if self.density.hessian_autodiff else "finite_differences"

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

    @functools.cached_property
    def constrains_to_itself(self) -> bool:
        """Whether the parameters are the unconstrained coordinates themselves, value for
        value (no declared bounds or structure: ``vector[n] x``), judged once on a random
        point: a transform (``exp``, a simplex's, ...) moves it."""
        if not self.dims or len(self.param_names()) != self.dims:
            return False
        u = np.random.default_rng(0).standard_normal(self.dims)
        try:
            return bool(np.array_equal(self.constrain(u), u))
        except Exception:  # noqa: BLE001  (a point the model rejects: not judged)
            return False

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
        if x.ndim == 2 and self.density.native:  # every row in one C++ call
            return self._constrain_rows(x, include_tp, include_gq, seed)
        stan_rng = self.bridge.new_rng(seed) if include_gq else None
        call = lambda row: self._call(self.bridge.param_constrain, np.ascontiguousarray(row),
                                      include_tp=include_tp, include_gq=include_gq,
                                      rng=stan_rng)
        if x.ndim == 1:
            return call(x)
        n_out = len(self.param_names(include_tp=include_tp, include_gq=include_gq))
        return np.array([call(row) for row in x]).reshape(len(x), n_out)

    def constrain_each(self, xs, rngs, *, include_tp: bool = False,
                       include_gq: bool = False) -> list[np.ndarray]:
        """:meth:`constrain` of each 2-d array of ``xs`` with its own ``rngs`` entry (a
        chain's draws and its generated quantities' random numbers), as many at once as
        there are cores: the C++ calls release the GIL and share nothing but the model, so
        the results are those of one call after another."""
        jobs = list(zip(xs, rngs))
        one = lambda job: self.constrain(job[0], include_tp=include_tp,  # noqa: E731
                                         include_gq=include_gq, rng=job[1])
        workers = min(len(jobs), os.cpu_count() or 1)
        if workers < 2 or not self.density.native or \
                sum(np.size(x) for x in xs) < CONSTRAIN_IN_THREADS:
            return [one(job) for job in jobs]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(one, jobs))

    def _constrain_rows(self, x: np.ndarray, include_tp: bool, include_gq: bool,
                        seed: int) -> np.ndarray:
        """All rows in one C++ call (``ahmc_param_constrain_rows``), generated quantities
        drawing from one Stan RNG seeded with ``seed``."""
        fn = self.density.entry("ahmc_param_constrain_rows")
        x = np.ascontiguousarray(x, dtype=float)
        if x.shape[1:] != (self.dims,):
            raise ValueError(f"expected rows of {self.dims} unconstrained values, got {x.shape}")
        out = np.empty((len(x), len(self.param_names(include_tp=include_tp,
                                                     include_gq=include_gq))))
        err = ctypes.c_char_p()
        if fn(self.bridge.model, include_tp, include_gq, len(x), x.ctypes.data, seed,
              out.ctypes.data, ctypes.byref(err)):
            message = err.value.decode(errors="replace") if err.value else "unknown error"
            self.density.entry("bs_free_error_msg")(err)
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
        where the library has it (:meth:`~ahmc_stan.native.NativeDensity.tr_hessian_grad`)."""
        x = self._point(x)
        M = np.ascontiguousarray(M, dtype=float)
        if M.shape != (self.dims, self.dims):
            raise ValueError(f"M must have shape ({self.dims}, {self.dims}), got {M.shape}")
        out = np.empty(self.dims)
        if not self.density.tr_hessian_grad(x, M, out, method):
            raise DensityError("the model threw or a derivative is not finite near this point")
        return out

    def log_density_third_derivatives(self, x, method: str = "auto") -> np.ndarray:
        """The symmetric tensor ``T[l, j, k] = ∂³log p / ∂x_l ∂x_j ∂x_k`` (Jacobian
        included), by third-order autodiff where the library has it, else differences of
        exact Hessians or gradients (:meth:`~ahmc_stan.native.NativeDensity.third_derivatives`)."""
        x = self._point(x)
        out = np.empty((self.dims,) * 3)
        if not self.density.third_derivatives(x, out, method):
            raise DensityError("the model threw or a derivative is not finite near this point")
        return out


def _rebuild_model(stan_file, data_json, seed, stanc_args, include_paths) -> StanModel:
    return StanModel(stan_file, data_json or None, seed=seed, stanc_args=stanc_args,
                     include_paths=include_paths)
