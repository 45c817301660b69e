"""SVHMC and OSVHMC: HMC with the adaptive-step Störmer–Verlet integrator of Alfaki,
Subbey & Haugland (2008, slide "Variable Step-Size HMC Algorithm"), made exact.

The integrator (V = −log π, kinetic energy ½pᵀM⁻¹p), for l = 0..L−1::

    P_{l+½} = P_l − ε/(2ρ_l) ∇V(C_l)
    C_{l+½} = C_l + ε/(2ρ_l) M⁻¹P_{l+½}
    ρ_{l+1} = 2 U(C_{l+½}, P_{l+½}) − ρ_l
    C_{l+1} = C_{l+½} + ε/(2ρ_{l+1}) M⁻¹P_{l+½}
    P_{l+1} = P_{l+½} − ε/(2ρ_{l+1}) ∇V(C_{l+1})

with the talk's ``U = G^{−1/2}``, ``G = ‖∇V‖² + Pᵀ(∇²V)²P``; with a metric
``G = ∇VᵀM⁻¹∇V + wᵀM⁻¹w``, ``w = ∇²V M⁻¹P`` — one Hessian-vector product, since
``Pᵀ(∇²V)²P = ‖∇²V P‖²``.  The ρ recurrence is the symmetric step-density update of the
reversible adaptive Störmer–Verlet (Hairer 1997; Huang & Leimkuhler 1997).  We normalise
``G`` by a constant ``G_ref`` (its median over the last scale-phase positions with fresh
momenta, or over 20 momenta at the initial point without a scale phase) so that ρ ≈ 1 and
ε is a step size on the leapfrog scale: ``U = (G/G_ref)^a``, ``a = u_exponent``.  Taken
literally (a = −½) the talk's steps ``ε/ρ ≈ ε (G/G_ref)^{1/2}`` *grow* with force and
curvature; ``a = +½`` makes them shrink there, as step-size functions usually do.  On
N(0, I) with the identity metric ``G = ‖C‖² + ‖P‖² = 2H`` is nearly conserved, so either
way the step is nearly constant along a trajectory and varies between trajectories.

What we found (``tests/test_ohmc_svhmc.py``, on the non-Gaussian ``stan_models/banana.stan``,
10 steps of ε = 0.1):

* With ρ₀ a fixed "fictive" constant, or a function of the state (ρ₀ = U(C₀, P₀)), the map
  ``(C₀, P₀) ↦ (C_L, P_L)`` is **neither reversible nor volume-preserving**: flipping the
  momentum and integrating again misses the start by 0.36 (constant ρ₀) or 1e−3
  (ρ₀ = U) — the second run starts from ρ₀, not ρ_L — and ``log|det|`` of its Jacobian is
  −1.35 or −1.14.  Not being an involution, it cannot be fixed by a Jacobian factor in a
  Metropolis step; with the plain ``min(1, e^{−ΔH})`` it is biased: five such iterations
  (ε = 0.15, L = 10) from 3000 exact banana draws give sd(x₁) = 0.94 instead of 1
  (4.5 MCSE), where the corrected sampler gives 1.02 (1.8 MCSE).
* In the space **extended by ρ** the map ``Φ(C, P, ρ) = (C_L, P_L, ρ_L)`` is exact: every
  sub-step is a shear (a momentum kick or position drift whose size depends on the other
  variables, determinant 1) or ``ρ ↦ 2U − ρ`` with U independent of ρ (determinant −1),
  so ``|det DΦ| = 1``; and ``F = flip ∘ Φ`` (flip ``P ↦ −P``) is an involution because
  ``U(C, −P) = U(C, P)``.  The tests confirm the involution to 1e−10 and the determinant
  to 1e−6 (finite differences).

The correction used: ρ is an auxiliary variable with conditional
``q(ρ | C, P) = N(U(C, P), (s·U(C, P))²)`` (``s = rho_sd``).  Each iteration draws
``ρ₀ ~ q(· | C, P*)``, integrates, and accepts ``(C_L, −P_L, ρ_L)`` — an involutive,
volume-preserving proposal on ``π(C) N(P) q(ρ|C, P)`` — with probability
``min(1, exp(−ΔH + log q(ρ_L | C_L, P_L) − log q(ρ₀ | C₀, P*)))``; ρ is then discarded
(:mod:`ahmc_stan.ghmc`, map 2).  A trajectory on which some ρ_l ≤ 0 or the density is
not finite is rejected and reported as divergent (F maps the set of such starts to itself,
so detailed balance holds).  The additive recurrence cannot follow U when it changes by
more than about half within a step: on the banana ~40% of the talk's trajectories (a = −½)
end that way, ~3% with a = +½; on the Gaussian targets none.  Each step costs two
gradients and one Hessian-vector product, plus one product at each end of the trajectory
for U; ``n_grad`` counts the gradients, ``n_hvp`` the products (each counted where it is
made; the Fit converts products into gradient-equivalents with their cost measured on the
model, :mod:`ahmc_stan.costs`).  The gradients and products of G_ref's estimate are
charged to the first iteration after it.

Nothing in this argument needs U to be the talk's: any U(C, P) with U(C, −P) = U(C, P)
keeps the sampler exact.  So ``hvp="gradient"`` takes the product from a central
difference of two gradients (:class:`GradientDifferenceHV`, odd in P to the last bit)
where forward-over-reverse autodiff is dear (Stan Math's GLM functions have no fast
forward mode); only U's faithfulness to the Hessian changes (to ~1e-8).

SVHMC draws a fresh momentum each iteration; OSVHMC updates it by ordered overrelaxation
as OHMC does (:mod:`.ohmc`).  Both are tuned over Γ of (ε, L) like AHMC.  Whole blocks of
iterations run in C++ (``ahmc_ghmc_block``); :class:`AdaptiveVerlet` and
:class:`~ahmc_stan.ghmc.GHMCKernel`'s loop are the Python reference of every operation.
"""

from __future__ import annotations

import ctypes
import math
from typing import Callable

import numpy as np

from ..ghmc import NativeIntegrator
from ..metric import InvMetric, draw_momenta
from .ahmc import HMC_STATS, run_tuned_chain
from .chain import ChainResult
from .ohmc import DEFAULT_NUM_CANDIDATES, check_metric, ghmc_blocks

__all__ = ["AdaptiveVerlet", "HessianVector", "GradientDifferenceHV", "hessian_vector",
           "run_svhmc", "run_osvhmc", "TALK_EXPONENT"]

#: The talk's ``U = G^{-1/2}``.
TALK_EXPONENT = -0.5

SV_STATS = (*HMC_STATS, "n_hvp")


class HessianVector:
    """``H v`` of the log density (Jacobian included, constants dropped, as the sampler's
    density) by forward-over-reverse autodiff, through the library's
    ``bs_log_density_hessian_vector_product`` with preallocated buffers."""

    #: evaluations per product, and the C++ block's code for the method
    grads, products, method = 0, 1, 0

    def __init__(self, model):
        self._fn = model.density.entry("bs_log_density_hessian_vector_product")
        self._handle = model.bridge.model
        self._lp = ctypes.c_double()
        self._lp_ptr = ctypes.addressof(self._lp)
        self._model = model  # keeps the library alive

    def __call__(self, x: np.ndarray, v: np.ndarray, out: np.ndarray) -> bool:
        """Write ``H(x) v`` into ``out``; False where the model throws or it is not finite."""
        if self._fn(self._handle, True, True, x.ctypes.data, v.ctypes.data, self._lp_ptr,
                    out.ctypes.data, None):
            return False
        return bool(np.isfinite(out).all())


class GradientDifferenceHV:
    """``H v`` by a central difference of two gradients, ``(∇log π(x + hv) −
    ∇log π(x − hv)) / 2h``, ``h = √ε_mach (1 + ‖x‖_∞) / ‖v‖_∞`` (Stan Math's rule, with
    maximum norms, which any summation order computes alike).  It is odd in v to the
    last bit, so ``U(C, −P) = U(C, P)`` and SVHMC stays exact with it
    (any such U does, module docstring); only U's faithfulness to the talk's Hessian is
    approximate (to about 1e-8 relative)."""

    grads, products, method = 2, 0, 1

    def __init__(self, density):
        self.density = density
        dims = density.dims
        self._x, self._g = np.empty(dims), np.empty(dims)

    def __call__(self, x: np.ndarray, v: np.ndarray, out: np.ndarray) -> bool:
        scale = float(np.max(np.abs(v)))
        if scale == 0.0:
            out[:] = 0.0
            return True
        h = math.sqrt(np.finfo(float).eps) * (1.0 + float(np.max(np.abs(x)))) / scale
        np.add(x, h * v, out=self._x)
        if not math.isfinite(self.density.log_density_gradient(self._x, out)):
            return False
        np.subtract(x, h * v, out=self._x)
        if not math.isfinite(self.density.log_density_gradient(self._x, self._g)):
            return False
        out -= self._g
        out /= 2.0 * h
        return True


#: ``hvp=`` option → the product's method.
HVP_METHODS = ("autodiff", "gradient")


def _evaluations(hvp) -> tuple[int, int]:
    """(gradients, products) one call of ``hvp`` makes: what it declares, else one
    product."""
    return getattr(hvp, "grads", 0), getattr(hvp, "products", 1)


def _check_hvp(method: str) -> None:
    if method not in HVP_METHODS:
        raise ValueError(f"hvp must be one of {', '.join(map(repr, HVP_METHODS))}, "
                         f"not {method!r}")


def hessian_vector(model, method: str = "autodiff"):
    """The Hessian-vector product of ``method``: ``"autodiff"`` (:class:`HessianVector`)
    or ``"gradient"`` (:class:`GradientDifferenceHV`)."""
    _check_hvp(method)
    return HessianVector(model) if method == "autodiff" else GradientDifferenceHV(model.density)


class AdaptiveVerlet:
    """The talk's adaptive Störmer–Verlet on ``(C, P, ρ)`` and its auxiliary ρ; called,
    :meth:`trajectory` (a :data:`~ahmc_stan.ghmc.Trajectory`, which the C++ block
    ``ahmc_ghmc_block`` runs too: :attr:`native_integrator`).

    ``reference`` is ``G_ref``; ``u_exponent`` is a in ``U = (G/G_ref)^a``; ``rho_sd`` is
    the relative sd s of ``q(ρ | C, P) = N(U, (sU)²)``.
    """

    def __init__(self, density, hvp: HessianVector, inv_metric: InvMetric, reference: float,
                 u_exponent: float = TALK_EXPONENT, rho_sd: float = 0.1):
        if not reference > 0 or not rho_sd > 0:
            raise ValueError("the reference G and rho_sd must be positive")
        self.density, self.hvp, self.inv_metric = density, hvp, inv_metric
        self.reference, self.u_exponent, self.rho_sd = float(reference), u_exponent, rho_sd
        dims = density.dims
        self._v, self._w, self._g = np.empty(dims), np.empty(dims), np.empty(dims)
        self._per_u = _evaluations(hvp)  # the evaluations of one U
        #: work done outside trajectories (G_ref's estimate), added to the next one's counts
        self.pending: dict[str, int] | None = None

    def __call__(self, *args) -> tuple[float, float, dict]:
        return self.trajectory(*args)

    @property
    def native_integrator(self) -> NativeIntegrator | None:
        method = getattr(self.hvp, "method", None)  # None: a product C++ does not have
        return (None if method is None else
                NativeIntegrator((self.reference, self.u_exponent, self.rho_sd, method)))

    def take_pending(self) -> dict[str, int] | None:
        """:attr:`pending`, which is then cleared."""
        pending, self.pending = self.pending, None
        return pending

    def _minv(self, p: np.ndarray) -> np.ndarray:
        return p if self.inv_metric is None else self.inv_metric * p

    def density_g(self, x: np.ndarray, p: np.ndarray, grad: np.ndarray) -> float:
        """``G = ∇VᵀM⁻¹∇V + wᵀM⁻¹w``, ``w = ∇²V M⁻¹P`` (nan where H v is not finite)."""
        self._v[:] = self._minv(p)
        if not self.hvp(x, self._v, self._w):
            return math.nan
        return float(grad @ self._minv(grad) + self._w @ self._minv(self._w))

    def u(self, x: np.ndarray, p: np.ndarray, grad: np.ndarray) -> float:
        return (self.density_g(x, p, grad) / self.reference) ** self.u_exponent

    def log_q(self, rho: float, u: float) -> float:
        """``log N(ρ; U, (sU)²)`` up to a constant."""
        z = (rho - u) / (self.rho_sd * u)
        return -0.5 * z * z - math.log(abs(u))

    def integrate(self, n_steps: int, step_size: float, x: np.ndarray, p: np.ndarray,
                  grad: np.ndarray, lp: float, rho: float) -> tuple[float, float, int, int]:
        """Φ: ``n_steps`` steps from (x, p, ρ) updating x, p, grad in place; returns
        (log density at the end, ρ_L, gradients, Hessian-vector products).  The log
        density is ``-inf`` if the trajectory met a non-finite value or some ρ_l ≤ 0."""
        g_half = self._g
        n_grad = n_hvp = 0
        for _ in range(n_steps):
            h = 0.5 * step_size / rho
            p += h * grad                       # ∇ log π = −∇V
            x += h * self._minv(p)
            lp_half = self.density.log_density_gradient(x, g_half)
            n_grad += 1
            if not math.isfinite(lp_half):
                return -math.inf, rho, n_grad, n_hvp
            n_grad, n_hvp = n_grad + self._per_u[0], n_hvp + self._per_u[1]
            rho = 2.0 * self.u(x, p, g_half) - rho
            if not (rho > 0 and math.isfinite(rho)):
                return -math.inf, rho, n_grad, n_hvp
            h = 0.5 * step_size / rho
            x += h * self._minv(p)
            lp = self.density.log_density_gradient(x, grad)
            n_grad += 1
            if not math.isfinite(lp):
                return -math.inf, rho, n_grad, n_hvp
            p += h * grad
        return lp, rho, n_grad, n_hvp

    def trajectory(self, rng: np.random.Generator, n_steps: int, step_size: float,
                   x: np.ndarray, p: np.ndarray, grad: np.ndarray, lp: float
                   ) -> tuple[float, float, dict]:
        """A :data:`~ahmc_stan.ghmc.Trajectory`: draws ρ₀ ~ q(· | x, p), integrates, and
        returns the log weight ``log q(ρ_L | x_L, p_L) − log q(ρ₀ | x, p)``.  Counts:
        ``n_grad`` gradients, ``n_hvp`` Hessian-vector products (and the work of
        :attr:`pending`, charged to the first trajectory)."""
        rho_noise = rng.standard_normal()
        u0 = self.u(x, p, grad)
        one_u = self._per_u
        if not math.isfinite(u0):
            return -math.inf, 0.0, self._counts(*one_u)
        rho0 = u0 * (1.0 + self.rho_sd * rho_noise)
        if not rho0 > 0:  # F would map this start to one ending at ρ_L = ρ₀ ≤ 0
            return -math.inf, 0.0, self._counts(*one_u)
        lp_end, rho_end, n_grad, n_hvp = self.integrate(n_steps, step_size, x, p, grad, lp,
                                                        rho0)
        n_grad, n_hvp = n_grad + one_u[0], n_hvp + one_u[1]  # U(x, p) at the start
        log_w = -math.inf
        if math.isfinite(lp_end):
            n_grad, n_hvp = n_grad + one_u[0], n_hvp + one_u[1]
            u_end = self.u(x, p, grad)
            if math.isfinite(u_end):
                log_w = self.log_q(rho_end, u_end) - self.log_q(rho0, u0)
        return lp_end, log_w, self._counts(n_grad, n_hvp)

    def _counts(self, n_grad: int, n_hvp: int) -> dict:
        counts = {"n_grad": n_grad, "n_hvp": n_hvp}
        pending = self.take_pending()
        if pending:
            counts = {k: v + pending.get(k, 0) for k, v in counts.items()}
        return counts


def reference_g(density, hvp, rng: np.random.Generator, positions: np.ndarray,
                inv_metric: InvMetric, n_momenta: int = 20, counts: dict | None = None
                ) -> float:
    """Median of G over ``positions`` (or ``n_momenta`` momenta at a single position), each
    with a fresh momentum from N(0, M).  ``counts`` (``n_grad``, ``n_hvp``), if given, is
    incremented by the evaluations made."""
    counts = {"n_grad": 0, "n_hvp": 0} if counts is None else counts
    if len(positions) == 1:
        positions = np.repeat(positions, n_momenta, axis=0)
    verlet = AdaptiveVerlet(density, hvp, inv_metric, 1.0)
    momenta = draw_momenta(rng, inv_metric, len(positions), positions.shape[1])
    grad = np.empty(positions.shape[1])
    values = []
    for x, p in zip(positions, momenta):
        x = np.ascontiguousarray(x)
        counts["n_grad"] = counts.get("n_grad", 0) + 1
        if math.isfinite(density.log_density_gradient(x, grad)):
            grads, products = _evaluations(hvp)
            counts["n_grad"] += grads
            counts["n_hvp"] = counts.get("n_hvp", 0) + products
            values.append(verlet.density_g(x, p, grad))
    values = np.array(values)
    values = values[np.isfinite(values) & (values > 0)]
    if not len(values):
        raise RuntimeError("G = ‖∇V‖² + ‖∇²V P‖² is not positive and finite anywhere")
    return float(np.median(values))


def _sv_trajectory(model, u_exponent: float, rho_sd: float, n_reference: int, hvp: str,
                   found: dict) -> Callable:
    """A ``make_trajectory`` for :func:`~.ohmc.ghmc_blocks`; stores G_ref in ``found``."""
    def make_trajectory(density, rng, position, inv_metric, rec):
        hvp_fn = hessian_vector(model, hvp)
        scale = rec.positions_since(max(0, rec.n - n_reference)) if rec.n else position[None]
        work = {"n_grad": 0, "n_hvp": 0}
        found["reference_g"] = reference_g(density, hvp_fn, rng, scale, inv_metric,
                                           counts=work)
        verlet = AdaptiveVerlet(density, hvp_fn, inv_metric, found["reference_g"], u_exponent,
                                rho_sd)
        verlet.pending = work  # charged to the first iteration of the blocks
        return verlet

    return make_trajectory


def _run(model, rng, x0, warmup, draws, progress, num_candidates, metric, u_exponent,
         rho_sd, n_reference, hvp, options) -> ChainResult:
    check_metric(metric, "SVHMC")
    _check_hvp(hvp)  # before any sampling, not when the blocks start
    found: dict = {}
    make_trajectory = _sv_trajectory(model, u_exponent, rho_sd, n_reference, hvp, found)
    result = run_tuned_chain(model, rng, x0, warmup, draws, progress,
                             ghmc_blocks(make_trajectory, num_candidates),
                             SV_STATS, metric=metric, **options)
    result.extras.update(reference_g=found.get("reference_g"),
                         u_exponent=u_exponent, rho_sd=rho_sd, num_candidates=num_candidates,
                         hvp=hvp)
    return result


def run_svhmc(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
              progress: Callable[[int], None], *, metric: str = "diag",
              u_exponent: float = TALK_EXPONENT, rho_sd: float = 0.1, n_reference: int = 50,
              hvp: str = "gradient", **options) -> ChainResult:
    """One SVHMC chain (fresh momentum each iteration).  ``u_exponent``: a in
    ``U = (G/G_ref)^a``; ``rho_sd``: s of ρ's conditional; ``n_reference``: the last
    scale-phase positions G_ref is the median over; ``hvp``: the Hessian-vector product
    in U, ``"autodiff"`` or ``"gradient"`` (:class:`GradientDifferenceHV`: two gradients,
    the sampler still exact); other options are AHMC's."""
    return _run(model, rng, x0, warmup, draws, progress, None, metric, u_exponent, rho_sd,
                n_reference, hvp, options)


def run_osvhmc(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
               progress: Callable[[int], None], *, num_candidates: int = DEFAULT_NUM_CANDIDATES,
               metric: str = "diag", u_exponent: float = TALK_EXPONENT, rho_sd: float = 0.1,
               n_reference: int = 50, hvp: str = "gradient", **options) -> ChainResult:
    """One OSVHMC chain: SVHMC with the momentum updated by ordered overrelaxation with
    ``num_candidates`` (K) values per component, as in OHMC."""
    if int(num_candidates) < 1:
        raise ValueError("num_candidates (K) must be at least 1")
    return _run(model, rng, x0, warmup, draws, progress, int(num_candidates), metric,
                u_exponent, rho_sd, n_reference, hvp, options)
