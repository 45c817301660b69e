"""Every call from Python into a compiled library, declared in one place.

:data:`SIGNATURES` names each C function we call and its ctypes types: the BridgeStan C
API functions used where bridgestan's own wrapper costs more per call, ahmc-stan's
entry points (``ahmc_*`` in ``csrc/ahmc_bridge.cpp``) and the native diagnostics
(``csrc/ahmc_diagnostics.cpp``, :func:`rank_diagnostics_entry`).  :func:`bind` returns a
library's function with its declared types (a function object of our own, so
bridgestan's declarations of the same symbols are untouched).  :class:`NativeDensity`
(``model.density``) is the samplers' path to a model's density and derivatives.
"""

from __future__ import annotations

import ctypes
import functools
import math
import subprocess

import numpy as np

__all__ = ["SIGNATURES", "bind", "NativeDensity", "metric_args", "rank_diagnostics_entry"]

_ptr = ctypes.c_void_p
_int, _bool, _double = ctypes.c_int, ctypes.c_bool, ctypes.c_double

#: C function name → (return type, argument types).
SIGNATURES: dict[str, tuple] = {
    # BridgeStan C API
    "bs_log_density": (_int, [_ptr, _bool, _bool, _ptr, _ptr, _ptr]),
    "bs_log_density_gradient": (_int, [_ptr, _bool, _bool, _ptr, _ptr, _ptr, _ptr]),
    "bs_log_density_hessian_vector_product": (
        _int, [_ptr, _bool, _bool, _ptr, _ptr, _ptr, _ptr, _ptr]),
    "bs_free_error_msg": (None, [ctypes.c_char_p]),
    # ahmc-stan's entry points
    "ahmc_log_density_gradient": (_int, [_ptr, _bool, _bool, _ptr, _ptr, _ptr]),
    "ahmc_param_constrain_rows": (_int, [_ptr, _bool, _bool, _int, _ptr, ctypes.c_uint,
                                         _ptr, ctypes.POINTER(ctypes.c_char_p)]),
    "ahmc_gradient_seconds": (_double, [_ptr, _ptr, _int]),
    "ahmc_log_density_gradient_rows": (_int, [_ptr, _int, _ptr, _ptr, _ptr]),
    "ahmc_leapfrog": (_int, [_ptr, _int, _double, _int, _ptr, _ptr, _ptr, _ptr, _ptr]),
    "ahmc_hmc_block": (_int, [_ptr, _int, _double, _int, _int, _int, _ptr, ctypes.c_uint64,
                              _double, *[_ptr] * 11]),
    "ahmc_init_stepsize": (_int, [_ptr, _double, _double, _int, _ptr, _ptr, _int, _double,
                                  _ptr, _ptr, _double, _ptr]),
    "ahmc_hmc_adapt_block": (_int, [_ptr, _int, _double, _ptr, _double, _int, _int,
                                    _double, _int, _ptr, ctypes.c_uint64, _double, _double,
                                    *[_ptr] * 17]),
    "ahmc_tuned_hmc_block": (_int, [_ptr, _ptr, _int, _int, _double, _int, _ptr,
                                    ctypes.c_uint64, _double, *[_ptr] * 14]),
    "ahmc_tuned_ghmc_block": (_int, [_ptr, _ptr, _int, _int, _double, _int, _ptr, _int,
                                     _ptr, ctypes.c_uint64, _double, *[_ptr] * 16]),
    "ahmc_bo_new": (_ptr, [_int, _ptr, _ptr, _ptr, _int, _ptr, _ptr, _ptr, _ptr]),
    "ahmc_bo_free": (None, [_ptr]),
    "ahmc_bo_update": (_int, [_ptr, _ptr, _int, _ptr, _ptr]),
    "ahmc_bo_state": (None, [_ptr, _ptr, _ptr]),
    "ahmc_bo_history": (None, [_ptr, _int, _int, _ptr]),
    "ahmc_bo_set": (None, [_ptr, _ptr, _int]),
    "ahmc_bo_predict": (None, [_ptr, _ptr, _ptr]),
    "ahmc_direct_minimise": (_int, [_int, ctypes.CFUNCTYPE(_double, _ptr, _ptr), _ptr, _int,
                                    _ptr]),
    "ahmc_draw_momenta": (_int, [_int, _ptr, _int, ctypes.c_uint64, _int, _ptr]),
    "ahmc_ghmc_block": (_int, [_ptr, _int, _double, _int, _int, _int, _ptr, _int, _ptr,
                               ctypes.c_uint64, _double, *[_ptr] * 14]),
    "ahmc_mh_block": (_int, [_ptr, _int, _int, _int, _int, _int, _int, ctypes.c_uint64,
                             *[_ptr] * 11]),
    "ahmc_hessian_autodiff": (_int, []),
    "ahmc_third_order_available": (_int, []),
    "ahmc_log_density_hessian": (_int, [_ptr] * 5),
    "ahmc_third_derivatives": (_int, [_ptr, _ptr, _int, _double, _ptr]),
    "ahmc_log_density_tr_hessian_grad": (_int, [_ptr, _ptr, _ptr, _int, _double, _ptr]),
    "ahmc_rmhmc_geometry": (_int, [_ptr] * 5),
    "ahmc_rmhmc_integrate": (_int, [_ptr, _ptr, _double, _int, *[_ptr] * 4]),
    "ahmc_rmhmc_block": (_int, [_ptr, _ptr, _int, _double, _int, _int, ctypes.c_uint64,
                                *[_ptr] * 4]),
    # the native diagnostics' library
    "ahmc_rank_diagnostics": (_int, [_ptr, _int, _int, _int, _ptr, _int, *[_ptr] * 8,
                                      _int, _ptr]),
}


def bind(lib: ctypes.CDLL, name: str):
    """``lib``'s function ``name`` typed as :data:`SIGNATURES` declares it."""
    fn = lib[name]
    fn.restype, fn.argtypes = SIGNATURES[name]
    return fn


@functools.lru_cache(maxsize=None)
def rank_diagnostics_entry():
    """``ahmc_rank_diagnostics`` of the native diagnostics' library
    (:func:`ahmc_stan.compiler.diagnostics_library`, built on first use), or None where
    it cannot be built or loaded (no C++ compiler): :mod:`ahmc_stan.rank_diagnostics`
    then computes with numpy alone, to the same values."""
    from .compiler import CompileError, diagnostics_library

    try:
        return bind(ctypes.CDLL(str(diagnostics_library())), "ahmc_rank_diagnostics")
    except (OSError, CompileError, subprocess.SubprocessError):
        return None


def metric_args(inv_metric: np.ndarray | None) -> tuple[int, int | None]:
    """(kind, pointer) of an inverse metric for the C layer: 0 identity (None), 1 diagonal
    (a vector), 2 dense (a C-contiguous matrix), 3 diagonal plus low rank
    (:class:`~ahmc_stan.metric.LowRankInvMetric`, its packed array)."""
    if inv_metric is None:
        return 0, None
    packed = getattr(inv_metric, "packed", None)  # a LowRankInvMetric
    if packed is not None:
        return 3, packed.ctypes.data
    return (1 if inv_metric.ndim == 1 else 2), inv_metric.ctypes.data


class NativeDensity:
    """The samplers' path to a model's density: ctypes calls with preallocated buffers into
    ahmc-stan's entry points (``ahmc_*`` in ``csrc/ahmc_bridge.cpp``).

    Log density and gradient include the Jacobian and drop constants.  A point where the
    model throws or the result is not finite has log density ``-inf``.
    """

    def __init__(self, model):
        self.dims = model.dims
        self._model = model  # keeps the library and the C model alive
        self._lib, self._handle = model.bridge.stanlib, model.bridge.model
        self.native = hasattr(self._lib, "ahmc_log_density_gradient")
        self._lp = ctypes.c_double()
        self._lp_ptr = ctypes.addressof(self._lp)
        if not self.native:  # built by bridgestan.compile_model: no ahmc entry points
            return
        for name in SIGNATURES:  # bound now, not on first use: a kept worker forked
            if name.startswith("ahmc_") and hasattr(self._lib, name):  # now has them all
                self.entry(name)
        self._grad = self.entry("ahmc_log_density_gradient")
        self._leapfrog = self.entry("ahmc_leapfrog")
        self._hmc_block = self.entry("ahmc_hmc_block")
        self._adapt_block = self.entry("ahmc_hmc_adapt_block")
        self._init_stepsize = self.entry("ahmc_init_stepsize")
        self._draw_momenta = self.entry("ahmc_draw_momenta")
        self._seconds = self.entry("ahmc_gradient_seconds")

    def entry(self, name: str):
        """The library's function ``name`` with its :data:`SIGNATURES`, bound on first use;
        ahmc-stan's own entry points need a library built by ahmc-stan."""
        cache = self.__dict__.setdefault("_entries", {})
        if name not in cache:
            if name.startswith("ahmc_") and not self.native:
                raise RuntimeError(f"{name} needs a library built by ahmc-stan "
                                   "(unset BRIDGESTAN)")
            cache[name] = bind(self._lib, name)
        return cache[name]

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

    def log_density_gradient_rows(self, x: np.ndarray, grad_out: np.ndarray) -> np.ndarray:
        """:meth:`log_density_gradient` at each row of ``x`` (n × dims), the gradients
        written to the rows of ``grad_out``, in one C++ call where the library is
        ahmc-stan's; returns the log densities (``-inf`` where not finite)."""
        x = np.ascontiguousarray(x, dtype=float)
        if not self.native or not grad_out.flags.c_contiguous:
            return np.array([self.log_density_gradient(x[i], grad_out[i])
                             for i in range(len(x))], dtype=float)
        lp = np.empty(len(x))
        if self.entry("ahmc_log_density_gradient_rows")(
                self._handle, len(x), x.ctypes.data, lp.ctypes.data, grad_out.ctypes.data):
            lp[~(np.isfinite(lp) & np.isfinite(grad_out).all(axis=1))] = -np.inf
        return lp

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
        n = self._leapfrog(self._handle, n_steps, step_size, *metric_args(inv_metric),
                           x.ctypes.data, p.ctypes.data, grad.ctypes.data, self._lp_ptr)
        return self._lp.value, n

    _BLOCK_OUTPUTS = (("draws", float), ("accept_prob", float), ("accepted", np.intc),
                      ("divergent", np.intc), ("energy", float), ("lp", float),
                      ("n_grad", np.intc))

    def _block_outputs(self, n_iter: int) -> dict[str, np.ndarray]:
        """The per-iteration arrays an HMC block fills (:meth:`hmc_block`)."""
        if not self.native:
            raise RuntimeError("HMC needs a library built by ahmc-stan (unset BRIDGESTAN)")
        out = {k: np.empty((n_iter, self.dims) if k == "draws" else n_iter, dtype)
               for k, dtype in self._BLOCK_OUTPUTS}
        out["n_steps"] = np.empty(n_iter, np.intc)
        return out

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
        out = self._block_outputs(n_iter)
        self._lp.value = lp
        if self._hmc_block(
                self._handle, n_iter, step_size, int(max_steps), int(bool(jitter)),
                *metric_args(inv_metric), seed, max_energy_error, x.ctypes.data,
                grad.ctypes.data, self._lp_ptr, out["n_steps"].ctypes.data,
                *(out[k].ctypes.data for k, _ in self._BLOCK_OUTPUTS)):
            raise ValueError("the dense inverse metric is not positive definite")
        return self._lp.value, out

    def init_stepsize(self, step_size: float, target: float,
                      inv_metric: np.ndarray | None, seeds: np.ndarray,
                      max_energy_error: float, x: np.ndarray, grad: np.ndarray,
                      lp: float) -> tuple[float, int]:
        """Stan's first step size in one C++ call (``ahmc_init_stepsize``): from
        ``step_size``, doubled or halved until the acceptance probability of one leapfrog
        step from (``x``, ``grad``, ``lp``) crosses ``target``, trial k an iteration of
        :meth:`hmc_block` (one step, no jitter) seeded by ``seeds[k]`` (uint64).  Returns
        (step size, trials made)."""
        if not self.native:
            raise RuntimeError("HMC needs a library built by ahmc-stan (unset BRIDGESTAN)")
        eps = ctypes.c_double()
        seeds = np.ascontiguousarray(seeds, dtype=np.uint64)
        trials = self._init_stepsize(
            self._handle, step_size, target, *metric_args(inv_metric), seeds.ctypes.data,
            len(seeds), max_energy_error, x.ctypes.data, grad.ctypes.data, lp,
            ctypes.addressof(eps))
        if trials < 0:
            raise ValueError("the dense inverse metric is not positive definite")
        return eps.value, trials

    def hmc_adapt_block(self, path_length: float, max_steps, jitter: bool,
                        inv_metric: np.ndarray | None, seed: int, n_iter: int,
                        max_energy_error: float, min_step_size: float, state: np.ndarray,
                        params: np.ndarray, x: np.ndarray, grad: np.ndarray, lp: float,
                        want_grads: bool = False, step_jitter: float = 0.0,
                        max_grads: float = math.inf,
                        max_divergent: int = 0) -> tuple[float, dict]:
        """Up to ``n_iter`` warmup iterations with dual averaging of ε inside one C++ call
        (``ahmc_hmc_adapt_block``): the averaging ``state`` ``[mu, counter, s_bar, x_bar,
        log ε]`` (updated in place) towards ``params`` ``[target, gamma, t0, kappa]``,
        ``L_r ~ U{1..clamp(round(path_length/ε), 1, max_steps)}`` (``max_steps``: a number
        or one per iteration); stops after an update takes ε below ``min_step_size``, or
        after the iteration in which the gradients reach ``max_grads`` or (``max_divergent``
        > 0) the divergent transitions reach ``max_divergent``; ``step_jitter`` = j > 0
        uses ε·U(1 − j, 1 + j).
        Returns (log density of the final state, the
        per-iteration arrays of :meth:`hmc_block` for the iterations made, plus
        ``step_size``, ``num_steps_max`` (the L of each iteration) and, with
        ``want_grads``, ``grads``)."""
        out = self._block_outputs(n_iter)
        out["step_size"] = np.empty(n_iter)
        out["num_steps_max"] = np.empty(n_iter, np.intc)
        grads = np.empty((n_iter, self.dims)) if want_grads else None
        n_done = ctypes.c_int()
        state = np.ascontiguousarray(state, dtype=float)
        params = np.ascontiguousarray(params, dtype=float)
        caps = np.ascontiguousarray(np.broadcast_to(max_steps, (n_iter,)), dtype=np.intc)
        self._lp.value = lp
        if self._adapt_block(
                self._handle, n_iter, path_length, caps.ctypes.data, float(max_grads),
                int(max_divergent), int(bool(jitter)),
                float(step_jitter), *metric_args(inv_metric), seed, max_energy_error, min_step_size,
                state.ctypes.data, params.ctypes.data, x.ctypes.data, grad.ctypes.data,
                self._lp_ptr, ctypes.addressof(n_done), out["step_size"].ctypes.data,
                out["num_steps_max"].ctypes.data, out["n_steps"].ctypes.data,
                out["draws"].ctypes.data,
                None if grads is None else grads.ctypes.data,
                *(out[k].ctypes.data for k, _ in self._BLOCK_OUTPUTS if k != "draws")):
            raise ValueError("the dense inverse metric is not positive definite")
        n = n_done.value
        out = {k: v[:n] for k, v in out.items()}
        if grads is not None:
            out["grads"] = grads[:n]
        return self._lp.value, out

    def tuned_hmc_block(self, tuner: int, block_size: int, n_iter: int, max_grads: float,
                        inv_metric: np.ndarray | None, seed: int, max_energy_error: float,
                        x: np.ndarray, grad: np.ndarray, lp: float) -> tuple[float, dict]:
        """Up to ``n_iter`` AHMC iterations in one C++ call (``ahmc_tuned_hmc_block``):
        blocks of ``block_size`` at the C++ tuner ``tuner``'s γ (a handle of
        :class:`~ahmc_stan.tuning.native_tuner.NativeBayesOptTuner`), each block's reward
        given to it; stops after the block in which the gradients reach ``max_grads``.
        Updates ``x`` and ``grad`` in place; returns (log density of the final state, the
        per-iteration arrays of :meth:`hmc_block` for the iterations made, plus
        ``step_size`` and ``num_steps_max``)."""
        out = self._block_outputs(n_iter)
        out["step_size"] = np.empty(n_iter)
        out["num_steps_max"] = np.empty(n_iter, np.intc)
        n_done = ctypes.c_int()
        self._lp.value = lp
        status = self.entry("ahmc_tuned_hmc_block")(
            self._handle, tuner, int(block_size), int(n_iter), float(max_grads),
            *metric_args(inv_metric), seed, max_energy_error, x.ctypes.data,
            grad.ctypes.data, self._lp_ptr, ctypes.addressof(n_done),
            out["step_size"].ctypes.data, out["num_steps_max"].ctypes.data,
            out["n_steps"].ctypes.data, *(out[k].ctypes.data for k, _ in self._BLOCK_OUTPUTS))
        if status == 1:
            raise ValueError("the dense inverse metric is not positive definite")
        if status == 2:
            raise ValueError("reward must be finite: a block's mean squared jump is not")
        n = n_done.value
        return self._lp.value, {k: v[:n] for k, v in out.items()}

    def ghmc_block(self, step_size: float, max_steps: int, jitter: bool,
                   inv_metric: np.ndarray | None, num_candidates: int, seed: int,
                   n_iter: int, max_energy_error: float, x: np.ndarray, grad: np.ndarray,
                   lp: float, p: np.ndarray,
                   verlet: tuple[float, float, float, int] | None = None,
                   want_noise: bool = False) -> tuple[float, dict, np.ndarray | None]:
        """``n_iter`` generalised-HMC iterations in one C++ call (``ahmc_ghmc_block``;
        identity or diagonal metric), random numbers drawn in C++ from ``seed``: the
        momentum updated by ordered overrelaxation with ``num_candidates`` (K) values, or
        drawn afresh with K = 0; the leapfrog, or with ``verlet`` = (G_ref, a, s, method)
        SVHMC's adaptive Störmer–Verlet (:class:`~ahmc_stan.ghmc.NativeIntegrator`).
        Updates ``x``, ``grad`` and ``p`` in place; returns (log density of the final
        state, the per-iteration arrays of :meth:`hmc_block` and ``n_hvp``, and with
        ``want_noise`` each iteration's L_r, normals, ρ₀'s normal (with ``verlet``) and
        u)."""
        out = self._block_outputs(n_iter)
        out["n_hvp"] = np.zeros(n_iter, np.intc)
        n_cand = int(num_candidates)
        width = max(n_cand, 1) * self.dims + 2 + (verlet is not None)
        noise = np.empty((n_iter, width)) if want_noise else None
        kind, ptr = metric_args(inv_metric)
        if kind > 1:
            raise ValueError("generalised HMC here needs an identity or diagonal metric")
        options = None if verlet is None else np.array(verlet, dtype=float)
        self._lp.value = lp
        self.entry("ahmc_ghmc_block")(
            self._handle, n_iter, step_size, int(max_steps), int(bool(jitter)), kind, ptr,
            n_cand, None if options is None else options.ctypes.data, seed, max_energy_error,
            x.ctypes.data, grad.ctypes.data, self._lp_ptr, p.ctypes.data,
            out["n_steps"].ctypes.data, *(out[k].ctypes.data for k, _ in self._BLOCK_OUTPUTS),
            out["n_hvp"].ctypes.data, None if noise is None else noise.ctypes.data)
        return self._lp.value, out, noise

    def tuned_ghmc_block(self, tuner: int, block_size: int, n_iter: int, max_grads: float,
                         inv_metric: np.ndarray | None, num_candidates: int, seed: int,
                         max_energy_error: float, x: np.ndarray, grad: np.ndarray,
                         lp: float, p: np.ndarray,
                         verlet: tuple[float, float, float, int] | None = None
                         ) -> tuple[float, dict]:
        """:meth:`tuned_hmc_block` over generalised HMC (``ahmc_tuned_ghmc_block``; the
        iterations of :meth:`ghmc_block`, the momentum ``p`` updated in place); the
        per-iteration arrays also hold ``n_hvp``."""
        out = self._block_outputs(n_iter)
        out["step_size"] = np.empty(n_iter)
        out["num_steps_max"] = np.empty(n_iter, np.intc)
        out["n_hvp"] = np.zeros(n_iter, np.intc)
        kind, ptr = metric_args(inv_metric)
        if kind > 1:
            raise ValueError("generalised HMC here needs an identity or diagonal metric")
        options = None if verlet is None else np.array(verlet, dtype=float)
        n_done = ctypes.c_int()
        self._lp.value = lp
        status = self.entry("ahmc_tuned_ghmc_block")(
            self._handle, tuner, int(block_size), int(n_iter), float(max_grads), kind, ptr,
            int(num_candidates), None if options is None else options.ctypes.data, seed,
            max_energy_error, x.ctypes.data, grad.ctypes.data, self._lp_ptr, p.ctypes.data,
            ctypes.addressof(n_done), out["step_size"].ctypes.data,
            out["num_steps_max"].ctypes.data, out["n_steps"].ctypes.data,
            *(out[k].ctypes.data for k, _ in self._BLOCK_OUTPUTS), out["n_hvp"].ctypes.data)
        if status == 2:
            raise ValueError("reward must be finite: a block's mean squared jump is not")
        n = n_done.value
        return self._lp.value, {k: v[:n] for k, v in out.items()}

    #: Columns of the statistics of :meth:`mh_block`, in ``ahmc_mh_block``'s order.
    MH_STATS = ("accept_stat", "accepted", "n_grad", "n_density", "n_hvp", "lp", "step_size",
                "beta")

    def mh_block(self, n_rows: int, steps_per_draw: int, block, seed: int, x: np.ndarray,
                 grad: np.ndarray, lp: float, want_noise: bool = False
                 ) -> tuple[float, np.ndarray, dict, np.ndarray | None]:
        """``n_rows`` rows of ``steps_per_draw`` Metropolis–Hastings iterations in one C++
        call (``ahmc_mh_block``), the proposal and its adaptation described by ``block``
        (a :class:`~ahmc_stan.mh.MHParameters`, whose arrays are updated
        in place); the noise and uniforms drawn in C++ from ``seed``.  Updates ``x`` and
        ``grad`` in place; returns (log density of the final state, rows, the
        per-row statistics :data:`MH_STATS`, and with ``want_noise`` each iteration's
        normals and log u)."""
        if not self.native:
            raise RuntimeError("ahmc_mh_block needs a library built by ahmc-stan")
        draws = np.empty((n_rows, self.dims))
        stats = np.empty((n_rows, len(self.MH_STATS)))
        n_noise = (2 if block.am else 1) * self.dims
        noise = (np.empty((n_rows * steps_per_draw, n_noise + 1)) if want_noise else None)
        ptr = lambda a: None if a is None else a.ctypes.data
        self._lp.value = lp
        self.entry("ahmc_mh_block")(
            self._handle, n_rows, steps_per_draw, block.adapt, int(block.langevin),
            int(block.exact), int(block.am), seed, ptr(block.params), ptr(block.state),
            ptr(block.chol), ptr(block.sq_grad), ptr(block.mean), x.ctypes.data,
            grad.ctypes.data, self._lp_ptr, draws.ctypes.data, stats.ctypes.data,
            ptr(noise))
        return self._lp.value, draws, dict(zip(self.MH_STATS, stats.T)), noise

    def draw_momenta(self, inv_metric: np.ndarray | None, seed: int, n: int) -> np.ndarray:
        """``n`` momenta from N(0, M) drawn exactly as :meth:`hmc_block` draws them
        (``ahmc_draw_momenta``)."""
        out = np.empty((n, self.dims))
        if self._draw_momenta(*metric_args(inv_metric), self.dims, seed, n,
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
            fn = self.entry("ahmc_hessian_autodiff")
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
            fn = self.entry("ahmc_third_order_available")
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

    #: Relative step of the central differences of gradients behind
    #: ``log_density_hessian(method="gradient")``: ≈ eps^(1/3), so that truncation and
    #: rounding errors balance (≈ 1e-8 relative or below).
    hessian_step = 6e-6

    def resolve_hessian_method(self, method: str) -> str:
        """``"autodiff"`` (forward-over-reverse, where the library has it, see
        :attr:`hessian_autodiff`) or ``"gradient"`` (central differences of autodiff
        gradients); ``"auto"`` is autodiff where available."""
        if method == "auto":
            method = "autodiff" if self.hessian_autodiff else "gradient"
        if method not in ("autodiff", "gradient"):
            raise ValueError(f"unknown Hessian method {method!r}; expected 'auto', "
                             "'autodiff' or 'gradient'")
        if method == "autodiff" and not self.hessian_autodiff:
            raise RuntimeError("this model library was built without autodiff Hessians "
                               "(its build log says why); use 'gradient'")
        return method

    def log_density_hessian(self, x: np.ndarray, grad_out: np.ndarray,
                            hess_out: np.ndarray, method: str = "auto") -> float:
        """Write the gradient and the Hessian (C-contiguous ``(dims, dims)``) at ``x`` into
        the buffers and return the log density; ``-inf`` where the model throws or a
        result is not finite.  ``method`` (:meth:`resolve_hessian_method`):
        ``"autodiff"``, one forward-over-reverse pass (``ahmc_log_density_hessian``);
        ``"gradient"``, ``H[:, i] = (∇(x + h_i e_i) − ∇(x − h_i e_i)) / 2h_i`` with
        ``h_i`` = :attr:`hessian_step` · max(1, |x_i|), symmetrised: 2·dims + 1 gradients,
        far cheaper than autodiff for models whose functions have fast gradients but no
        fast forward mode (Stan Math's GLMs)."""
        if method == "gradient" and self.hessian_autodiff:
            return self._hessian_by_differences(x, grad_out, hess_out)
        fn = self.entry("ahmc_log_density_hessian")  # autodiff, or the library's differences
        if fn(self._handle, x.ctypes.data, self._lp_ptr, grad_out.ctypes.data,
              hess_out.ctypes.data):
            return -np.inf
        return self._lp.value

    def _hessian_by_differences(self, x, grad_out, hess_out) -> float:
        lp = self.log_density_gradient(x, grad_out)
        if not np.isfinite(lp):
            return -np.inf
        y, above, below = x.copy(), np.empty(self.dims), np.empty(self.dims)
        for i in range(self.dims):
            h = self.hessian_step * max(1.0, abs(float(x[i])))
            y[i] = x[i] + h
            up = y[i] - x[i]  # the steps actually taken, exact in floating point
            if not np.isfinite(self.log_density_gradient(y, above)):
                return -np.inf
            y[i] = x[i] - h
            down = x[i] - y[i]
            if not np.isfinite(self.log_density_gradient(y, below)):
                return -np.inf
            y[i] = x[i]
            hess_out[:, i] = (above - below) / (up + down)
        hess_out[...] = 0.5 * (hess_out + hess_out.T)
        return lp if np.all(np.isfinite(hess_out)) else -np.inf

    def third_derivatives(self, x: np.ndarray, out: np.ndarray, method: str = "auto"
                          ) -> bool:
        """Write ``T[l, j, k] = ∂³log p/∂x_l∂x_j∂x_k`` (C-contiguous ``(dims,)*3``) into
        ``out``; False where the model throws or a result is not finite.  ``method``:
        ``"autodiff"``, exact (``stan::math::grad_hessian``: dims(dims+1)/2
        ``fvar<fvar<var>>`` sweeps); for libraries without it ``"hessian"``, central
        differences of autodiff Hessians (2·dims Hessians, ~1e-10 relative error), or
        ``"gradient"``, second differences of autodiff gradients (2·dims² + 1 gradients,
        ~1e-7); ``"auto"`` (default) is autodiff where available, else "gradient"."""
        fn = self.entry("ahmc_third_derivatives")
        method = self.resolve_third_method(method)
        return fn(self._handle, x.ctypes.data, self._third_methods[method],
                  self._third_step(method), out.ctypes.data) == 0

    # ---- the generalised leapfrog in C++ (riemann.RMHMCKernel's native path) ------------

    def rmhmc_point_size(self) -> int:
        """Length of a packed RMHMC point (``csrc/ahmc_bridge.cpp``, "Riemann-manifold
        HMC"; :meth:`~ahmc_stan.riemann.RMHMCState.from_packed`)."""
        n = self.dims
        return 1 + 6 * n + 2 * n * n + n ** 3

    def rmhmc_options(self, softness: float, tol: float, max_iter: int,
                      check_reversibility: bool, reversibility_tol: float,
                      hessian_method: str, third_method: str, max_energy_error: float
                      ) -> np.ndarray:
        """The options array of the ``ahmc_rmhmc_*`` entry points for resolved Hessian
        and third-derivative methods (the same derivatives as
        :meth:`log_density_hessian` and :meth:`third_derivatives` compute)."""
        by_differences = hessian_method == "gradient" and self.hessian_autodiff
        return np.array([softness, tol, max_iter, bool(check_reversibility),
                         reversibility_tol, int(by_differences), self.hessian_step,
                         self._third_methods[third_method], self._third_step(third_method),
                         max_energy_error], dtype=float)

    def rmhmc_geometry(self, options: np.ndarray, x: np.ndarray
                       ) -> tuple[np.ndarray | None, np.ndarray]:
        """The packed SoftAbs point at ``x`` (``ahmc_rmhmc_geometry``; None where the
        density or a derivative is not finite) and the (Hessians, tensors) evaluated."""
        point, counts = np.empty(self.rmhmc_point_size()), np.zeros(2, np.intc)
        x = np.ascontiguousarray(x, dtype=float)
        failed = self.entry("ahmc_rmhmc_geometry")(self._handle, options.ctypes.data,
                                                   x.ctypes.data, point.ctypes.data,
                                                   counts.ctypes.data)
        return (None if failed else point), counts

    def rmhmc_integrate(self, options: np.ndarray, step_size: float, n_steps: int,
                        point: np.ndarray, p: np.ndarray
                        ) -> tuple[int, np.ndarray | None, np.ndarray, np.ndarray]:
        """``n_steps`` generalised leapfrog steps in C++ (``ahmc_rmhmc_integrate``) from a
        packed point and momentum.  Returns (status 0 ok, 1 fixed point, 2 not finite;
        the packed end point, None on failure; the momentum; (Hessians, tensors, steps
        taken))."""
        out, counts = np.empty(self.rmhmc_point_size()), np.zeros(3, np.intc)
        p = np.array(p, dtype=float)
        status = self.entry("ahmc_rmhmc_integrate")(
            self._handle, options.ctypes.data, float(step_size), int(n_steps),
            point.ctypes.data, p.ctypes.data, out.ctypes.data, counts.ctypes.data)
        return status, (out if status == 0 else None), p, counts

    def rmhmc_block(self, options: np.ndarray, n_iter: int, step_size: float,
                    max_steps: int, jitter: bool, seed: int, point: np.ndarray,
                    want_noise: bool = False
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """``n_iter`` RMHMC iterations in one C++ call (``ahmc_rmhmc_block``), momenta,
        ``L_r`` and uniforms drawn from ``seed``.  Returns (the packed final point, draws,
        per-iteration statistics (:attr:`~ahmc_stan.riemann.RMHMCKernel.NATIVE_STATS`
        columns), and with ``want_noise`` each iteration's momentum, L_r and log u)."""
        point = point.copy()
        draws = np.empty((n_iter, self.dims))
        stats = np.empty((n_iter, 10))
        noise = np.empty((n_iter, self.dims + 2)) if want_noise else None
        if self.entry("ahmc_rmhmc_block")(
                self._handle, options.ctypes.data, int(n_iter), float(step_size),
                int(max_steps), int(bool(jitter)), seed, point.ctypes.data,
                draws.ctypes.data, stats.ctypes.data,
                None if noise is None else noise.ctypes.data):
            raise MemoryError("ahmc_rmhmc_block failed")
        return point, draws, stats, noise

    def tr_hessian_grad(self, x: np.ndarray, M: np.ndarray, out: np.ndarray,
                        method: str = "auto") -> bool:
        """Write ``tr(M ∂(∇²log p)/∂x_l)`` for every l into ``out`` (``M`` C-contiguous
        ``(dims, dims)``); False where the model throws or a result is not finite.
        ``method``: ``"autodiff"`` (``stan::math::grad_tr_mat_times_hessian``, dims
        ``fvar<fvar<var>>`` sweeps) or ``"hessian"`` (differences of autodiff Hessians);
        ``"auto"`` is autodiff where available."""
        fn = self.entry("ahmc_log_density_tr_hessian_grad")
        method = self.resolve_third_method(method, ("autodiff", "hessian"), fallback="hessian")
        return fn(self._handle, x.ctypes.data, M.ctypes.data, self._third_methods[method],
                  self._third_step(method), out.ctypes.data) == 0
