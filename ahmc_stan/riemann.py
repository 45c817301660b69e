"""Riemann-manifold HMC (Girolami & Calderhead 2011) with Betancourt's SoftAbs metric.

**Metric** (Betancourt 2013, arXiv:1212.4693, section 4).  With ``U = −log π`` and the
eigendecomposition of its Hessian ``∇²U(x) = Q diag(λ) Qᵀ``,

    G(x) = Q diag(f(λ_i)) Qᵀ,   f(λ) = λ coth(αλ),

a smooth ``|λ|`` that is positive definite everywhere: ``f(λ) → |λ|`` for ``|αλ| ≫ 1`` and
``f → 1/α`` as ``λ → 0``.  The softness ``α`` only matters for curvatures within a few 1/α
of zero, i.e. for directions whose local scale exceeds ~sqrt(α).  Default ``α = 1``, the
default of Betancourt's and Stan's reference SoftAbs code: unconstrained Stan parameters
are on unit scale, every curvature above ~3 (local sd below ~0.6) is used as is (on a
Gaussian with such a precision the metric *is* the precision; it is to machine precision
once αλ > 20), and flat or indefinite regions get metric eigenvalues ≥ 1 — moves no larger
than identity-metric HMC would make.  Large α (Betancourt's "hard" limit, e.g. 1e6) adapts
to weakly identified directions too, but where the Hessian is indefinite its near-zero
eigenvalues then give near-singular metrics, huge velocities and fixed-point failures (on
``stan_models/banana.stan`` with b = 2 at ε = 0.1: 31% of proposals failed with α = 1e6,
none with α = 1); use it for log-concave posteriors with scales ≫ 1.

**Hamiltonian** (Girolami & Calderhead 2011, eq. 13)

    H(x, p) = U(x) + ½ log det G(x) + ½ pᵀ G(x)⁻¹ p.

**Its position gradient** (Betancourt 2013, eqs. for the SoftAbs gradient).  By the
Daleckiĭ–Kreĭn formula a change ``dA`` of ``A = ∇²U`` changes ``G`` by
``Q (J ∘ (Qᵀ dA Q)) Qᵀ`` with the divided differences

    J_ij = (f(λ_i) − f(λ_j)) / (λ_i − λ_j),   J_ii = f'(λ_i) = coth(αλ_i) − αλ_i csch²(αλ_i).

``∂H/∂x_l = ∂_l U + ½ tr(G⁻¹ ∂_l G) − ½ pᵀG⁻¹(∂_l G)G⁻¹p`` and
``tr(A ∂_l G) = tr(Q((QᵀAQ) ∘ J)Qᵀ ∂_l∇²U)`` reduce both metric terms to *one* contraction
with the third derivatives:

    ∂H/∂x_l = −∂_l log π − tr(W ∂_l ∇²log π),
    W = Q [½ diag(f'(λ)/f(λ)) − ½ J ∘ (v vᵀ)] Qᵀ,   v = diag(1/f(λ)) Qᵀ p.

The first part of W (the log-determinant) does not depend on p and is contracted once per
point; the second is recontracted at every fixed-point iteration of the momentum update.
Third derivatives come from :meth:`~ahmc_stan.native.NativeDensity.third_derivatives` once
per point of the trajectory, as the full tensor (contracted again at every fixed-point
iteration).  By default (``third_derivatives="auto"``) that is exact
third-order autodiff, ``stan::math::grad_hessian`` on ``fvar<fvar<var>>`` compiled into the
model's library (``csrc/ahmc_third_order.hpp``): d(d+1)/2 sweeps.  For a model whose
functions lack third-order instances (its library is then built without them), "auto"
falls back to second differences of autodiff gradients (``"gradient"``: 2d² + 1
gradients, ~1e−7 relative error); ``"hessian"`` takes differences of Hessians (~1e−10).
Either error is far below anything a Monte Carlo estimate can see, and exactness has a
price: ``fvar<fvar<var>>`` has none of Stan Math's vectorised reverse-mode
specialisations, so on the Pima logistic regression (d = 8) the exact tensor costs 13 ms
and second differences of gradients 1.7 ms — pass ``third_derivatives="gradient"`` when
speed matters more than the last 1e−7.

**Integrator**: the generalised leapfrog (Girolami & Calderhead 2011, eqs. 16–18)

    p_{½} = p − ε/2 ∂_x H(x, p_{½})                              (implicit in p_{½})
    x'    = x + ε/2 [G(x)⁻¹ + G(x')⁻¹] p_{½}                     (implicit in x')
    p'    = p_{½} − ε/2 ∂_x H(x', p_{½})

— symmetric and volume preserving, hence a valid Metropolis proposal.  Both implicit
equations are solved by fixed-point iteration (Anderson-accelerated) until the max-norm
change is below ``tol · max(1, ‖·‖∞)`` (``fixed_point_tol``, default 1e−10), at most
``max_fixed_point_iterations`` times (default 100); a non-converged solve stops the
trajectory and rejects the proposal, and is counted.  Rejecting only forward failures is
not enough: from the proposal the backward solve may fail or find another root, and the
move would then have no reverse.  So a proposal the Metropolis test would accept is first
integrated back from ``(x', −p')`` and accepted only if that returns to ``(x, p)`` (within
``reversibility_tol``, 1e−6 relative; Zappa, Holmes-Cerfon & Goodman 2018): the moves that
can be accepted then come in reverse pairs and detailed balance holds exactly.  The check
costs a second trajectory per accepted proposal (counted in ``num_leapfrog`` and in the
Hessians and tensors it evaluates; turn it off with ``check_reversibility=False``, as
Girolami & Calderhead and Stan's prototype do, at the price of that exactness).

**Cost.**  A generalised leapfrog step evaluates no plain gradient: the momentum solve
reuses the tensor of its start point, each iteration of the position solve evaluates one
Hessian (with its gradient) at the trial point, and the new point's geometry one Hessian
and one third-derivative tensor — ``k + 1`` Hessians and 1 tensor for a position solve of
``k`` iterations.  Each is counted where it is made (``num_hessian``, ``num_third``;
``num_grad`` is 0), and the Fit converts them into gradient-equivalents with their costs
measured on the model (:mod:`ahmc_stan.costs`).

**In C++.**  By default the kernel runs in the model's library (``ahmc_rmhmc_block``,
``ahmc_rmhmc_integrate`` and ``ahmc_rmhmc_geometry`` in ``csrc/ahmc_bridge.cpp``): Eigen's
symmetric eigensolver, the SoftAbs map, the Anderson-accelerated fixed points (least
squares by SVD with numpy's cutoff), the reversibility check and the Metropolis test, with
Hessians and tensors by the same methods (central differences of gradients done in C++
with :attr:`~ahmc_stan.native.NativeDensity.hessian_step`) and counted alike; a block's
momenta, ``L_r`` and uniforms come from one seed per call.  The tensor stays materialised:
the momentum solve recontracts it at every iteration, so one tensor per point
(d(d+1)/2 sweeps) costs less than a ``grad_tr_mat_times_hessian`` contraction (d sweeps)
per iteration once a solve takes more than (d+1)/2 iterations, and the differences
fallback has no such contraction.  The Python implementation (``native=False``) is the
reference the C++ is tested against, transition by transition.

**Constant metric** (:func:`constant_softabs_metric`): for high dimensions the SoftAbs of the
Hessian at the mode (found with L-BFGS) is used as a fixed dense metric of plain HMC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .hmc import HMCInfo, HMCParameters
from .native import NativeDensity

__all__ = ["DEFAULT_SOFTNESS", "softabs_eigenvalues", "softabs_divided_differences",
           "softabs_inv_metric", "RMHMCState", "RMHMCInfo", "RMHMCKernel",
           "find_mode", "constant_softabs_metric", "RIEMANN_STATS"]

DEFAULT_SOFTNESS = 1.0

#: Per-iteration statistics of RMHMC beyond HMC's (``RMHMCInfo.extra_stats``).
RIEMANN_STATS = ("n_hessian", "n_third", "n_leapfrog", "fixed_point_failures")


# ---- the SoftAbs map -----------------------------------------------------------------------

def softabs_eigenvalues(lam: np.ndarray, softness: float = DEFAULT_SOFTNESS
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``f(λ) = λ coth(αλ)`` and ``f'(λ) = coth(αλ) − αλ csch²(αλ)``; with ``z = αλ``, the
    series ``f ≈ (1 + z²/3)/α`` for |z| < 1e−4 (so ``f(0) = 1/α``) and ``f = |λ|`` for
    |z| > 20, where they agree with the closed form to double precision."""
    lam = np.asarray(lam, dtype=float)
    z = softness * lam
    az = np.abs(z)
    f = np.abs(lam).astype(float)
    fp = np.sign(lam).astype(float)
    small = az < 1e-4
    f[small] = (1.0 + z[small] ** 2 / 3.0) / softness
    fp[small] = 2.0 * z[small] / 3.0 * (1.0 - 2.0 * z[small] ** 2 / 15.0)
    mid = ~small & (az <= 20.0)
    zm = z[mid]
    coth = 1.0 / np.tanh(zm)
    f[mid] = lam[mid] * coth
    fp[mid] = coth - zm / np.sinh(zm) ** 2
    return f, fp


def softabs_divided_differences(lam: np.ndarray, f: np.ndarray, fp: np.ndarray,
                                softness: float = DEFAULT_SOFTNESS) -> np.ndarray:
    """``J_ij = (f_i − f_j)/(λ_i − λ_j)``, and ``(f'_i + f'_j)/2`` where the eigenvalues
    agree to 1e−7 of their scale (error ≲ 1e−9 either way)."""
    dl = lam[:, None] - lam[None, :]
    scale = np.maximum(np.maximum(np.abs(lam)[:, None], np.abs(lam)[None, :]), 1 / softness)
    close = np.abs(dl) <= 1e-7 * scale
    with np.errstate(divide="ignore", invalid="ignore"):
        J = np.where(close, 0.5 * (fp[:, None] + fp[None, :]),
                     (f[:, None] - f[None, :]) / np.where(close, 1.0, dl))
    return J


def softabs_inv_metric(neg_hessian: np.ndarray, softness: float = DEFAULT_SOFTNESS
                       ) -> np.ndarray:
    """``G⁻¹ = Q diag(1/f(λ)) Qᵀ`` for the Hessian ``∇²U = −∇²log π`` (symmetrised)."""
    lam, Q = np.linalg.eigh(0.5 * (neg_hessian + neg_hessian.T))
    f, _ = softabs_eigenvalues(lam, softness)
    inv = (Q / f) @ Q.T
    return 0.5 * (inv + inv.T)


# ---- a point with its geometry -------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class RMHMCState:
    """A position with its log density, gradient and SoftAbs geometry; ``third`` (the
    third-derivative tensor of log π) and the p-independent force are present on states
    of a trajectory, absent on trial points of the implicit position update."""

    position: np.ndarray
    logdensity: float
    logdensity_grad: np.ndarray
    eigvals: np.ndarray            # λ of ∇²U
    eigvecs: np.ndarray            # Q
    softabs: np.ndarray            # f(λ)
    softabs_grad: np.ndarray       # f'(λ)
    third: np.ndarray | None = None
    divided_differences: np.ndarray | None = None   # J
    static_force: np.ndarray | None = None          # ∂_x [U + ½ log det G]
    packed: np.ndarray | None = None                # the C++ layout (:meth:`pack`)

    @staticmethod
    def _layout(n: int) -> tuple[tuple[str, tuple], ...]:
        """Fields and shapes of a packed point, in ``csrc/ahmc_bridge.cpp``'s order."""
        return (("position", (n,)), ("logdensity", ()), ("logdensity_grad", (n,)),
                ("eigvals", (n,)), ("eigvecs", (n, n)), ("softabs", (n,)),
                ("softabs_grad", (n,)), ("divided_differences", (n, n)),
                ("static_force", (n,)), ("third", (n, n, n)))

    @classmethod
    def from_packed(cls, packed: np.ndarray, dims: int) -> "RMHMCState":
        """The state whose arrays are views of a packed point (C++'s)."""
        fields, at = {}, 0
        for name, shape in cls._layout(dims):
            size = int(np.prod(shape))
            fields[name] = (float(packed[at]) if shape == ()
                            else packed[at:at + size].reshape(shape))
            at += size
        return cls(packed=packed, **fields)

    def pack(self) -> np.ndarray:
        """The state in one array, as the C++ generalised leapfrog takes it."""
        if self.packed is None:
            if self.third is None:
                raise ValueError("a trial point (no third derivatives) cannot be packed")
            return np.concatenate([np.ravel(getattr(self, name))
                                   for name, _ in self._layout(len(self.position))])
        return self.packed

    @property
    def logdet_metric(self) -> float:
        return float(np.sum(np.log(self.softabs)))

    def metric(self) -> np.ndarray:
        """``G(x)``."""
        return (self.eigvecs * self.softabs) @ self.eigvecs.T

    def inv_metric(self) -> np.ndarray:
        """``G(x)⁻¹``."""
        return (self.eigvecs / self.softabs) @ self.eigvecs.T

    def velocity(self, p: np.ndarray) -> np.ndarray:
        """``∂H/∂p = G⁻¹p``."""
        return self.eigvecs @ ((self.eigvecs.T @ p) / self.softabs)

    def hamiltonian(self, p: np.ndarray) -> float:
        """``U + ½ log det G + ½ pᵀG⁻¹p`` (without the constant ``d/2 log 2π``)."""
        w = self.eigvecs.T @ p
        kinetic = 0.5 * float(np.sum(w * w / self.softabs))
        return -self.logdensity + 0.5 * self.logdet_metric + kinetic

    def force(self, p: np.ndarray) -> np.ndarray:
        """``∂H/∂x`` at this point for momentum ``p`` (module docstring)."""
        v = (self.eigvecs.T @ p) / self.softabs
        B = self.eigvecs @ (self.divided_differences * np.outer(v, v)) @ self.eigvecs.T
        return self.static_force + 0.5 * np.einsum("ljk,jk->l", self.third, B)


# ---- the kernel ----------------------------------------------------------------------------

@dataclass(frozen=True)
class RMHMCInfo(HMCInfo):
    """:class:`~ahmc_stan.hmc.HMCInfo` plus, per iteration, Hessians evaluated (outside
    third derivatives), third-derivative tensors evaluated (each dims(dims+1)/2
    third-order autodiff sweeps, or their finite-difference fallback), generalised
    leapfrog steps taken (those of the reversibility check included) and whether a
    proposal failed a fixed-point solve or the reversibility check.  ``num_grad`` is 0:
    RMHMC evaluates gradients only as part of Hessians."""

    num_hessian: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    num_third: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    fixed_point_failures: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    num_leapfrog: np.ndarray = field(default_factory=lambda: np.zeros(0, int))

    @property
    def extra_stats(self) -> dict[str, np.ndarray]:
        return {"n_hessian": self.num_hessian, "n_third": self.num_third,
                "n_leapfrog": self.num_leapfrog,
                "fixed_point_failures": self.fixed_point_failures}


class RMHMCKernel:
    """RMHMC with the SoftAbs metric and the generalised leapfrog, in the shape of
    :class:`~ahmc_stan.hmc.HMCKernel`: ``init(position)``, ``step(rng, state, params)``,
    ``run(rng, state, params, n_iter)`` with :class:`~ahmc_stan.hmc.HMCParameters`
    (``inv_metric`` must be None: the metric is G(x); ``jitter`` draws
    ``L_r ~ Uniform{1..L}`` as AHMC does).  ``num_hessian`` and ``num_third`` count the
    evaluations made (module docstring, "Cost"; ``num_grad`` is 0), ``num_leapfrog`` the
    steps, those of the reversibility check included; ``fixed_point_failures`` counts
    proposals rejected because a solve did not converge or the check failed (acceptance
    statistic 0).  ``hessian``: how Hessians are computed
    (:meth:`~ahmc_stan.native.NativeDensity.log_density_hessian`, ``"auto"``: autodiff
    where the library has it; ``"gradient"``: central differences of gradients).

    ``native`` (default: where the library has it): ``init``, ``integrate`` and ``run``
    in C++ (``ahmc_rmhmc_geometry``, ``ahmc_rmhmc_integrate``, ``ahmc_rmhmc_block``:
    Eigen's symmetric eigensolver, the same fixed points, rules and counts; ``run`` draws
    its random numbers in C++ from one seed per call).  ``native=False`` runs the Python
    implementation below, the reference the C++ is tested against."""

    max_energy_error = 1000.0

    #: Columns of the per-iteration statistics of :meth:`transition` and the C++ block.
    NATIVE_STATS = ("accept_stat", "accepted", "divergent", "num_steps", "energy", "lp",
                    "n_hessian", "n_third", "fixed_point_failures", "n_leapfrog")

    def __init__(self, density: NativeDensity, softness: float = DEFAULT_SOFTNESS,
                 fixed_point_tol: float = 1e-10, max_fixed_point_iterations: int = 100,
                 check_reversibility: bool = True, reversibility_tol: float = 1e-6,
                 third_derivatives: str = "auto", hessian: str = "auto",
                 native: bool | None = None):
        if softness <= 0:
            raise ValueError("softness must be positive")
        self.density = density
        self.softness = float(softness)
        self.tol = float(fixed_point_tol)
        self.max_iter = int(max_fixed_point_iterations)
        self.check_reversibility = bool(check_reversibility)
        # "auto" resolved once; an unknown or unavailable method fails here, not mid-chain
        self.third_method = density.resolve_third_method(third_derivatives)
        self.hessian_method = density.resolve_hessian_method(hessian)
        self.reversibility_tol = float(reversibility_tol)
        n = density.dims
        self._grad = np.empty(n)
        self._hess = np.empty((n, n))
        self._third = np.empty((n, n, n))
        #: All work done so far, recorded or not (initialisation, step-size probes); the
        #: kernel makes no plain gradient evaluation, so ``n_grad`` stays 0.
        self.totals = {"n_grad": 0, "n_hessian": 0, "n_third": 0}
        available = bool(getattr(density, "native", False)) and hasattr(density,
                                                                         "rmhmc_block")
        if native and not available:
            raise RuntimeError("the C++ generalised leapfrog needs a library built by "
                               "ahmc-stan")
        self.native = available if native is None else bool(native)
        if self.native:
            self._options = density.rmhmc_options(
                self.softness, self.tol, self.max_iter, self.check_reversibility,
                self.reversibility_tol, self.hessian_method, self.third_method,
                self.max_energy_error)

    def _count(self, hessians, thirds) -> None:
        self.totals["n_hessian"] += int(hessians)
        self.totals["n_third"] += int(thirds)

    # -- geometry
    def geometry(self, position: np.ndarray, third: bool = True) -> RMHMCState | None:
        """The state at ``position`` (None where the density or a derivative is not
        finite); ``third=False`` skips the third derivatives (trial points)."""
        x = np.ascontiguousarray(position, dtype=float)
        lp = self.density.log_density_hessian(x, self._grad, self._hess, self.hessian_method)
        self.totals["n_hessian"] += 1
        if not np.isfinite(lp):
            return None
        lam, Q = np.linalg.eigh(-self._hess)
        f, fp = softabs_eigenvalues(lam, self.softness)
        grad = self._grad.copy()
        if not third:
            return RMHMCState(x.copy(), lp, grad, lam, Q, f, fp)
        self.totals["n_third"] += 1
        if not self.density.third_derivatives(x, self._third, self.third_method):
            return None
        T = self._third.copy()
        J = softabs_divided_differences(lam, f, fp, self.softness)
        W0 = (Q * (0.5 * fp / f)) @ Q.T
        static = -grad - np.einsum("ljk,jk->l", T, W0)
        return RMHMCState(x.copy(), lp, grad, lam, Q, f, fp, T, J, static)

    def init(self, position: np.ndarray) -> RMHMCState:
        if self.native:
            packed, counts = self.density.rmhmc_geometry(self._options, position)
            self._count(*counts)
            state = None if packed is None else RMHMCState.from_packed(packed, len(position))
        else:
            state = self.geometry(position)
        if state is None:
            raise ValueError("the initial point has a non-finite log density or derivative")
        return state

    # -- integrator
    def _fixed_point(self, g, start: np.ndarray) -> tuple[np.ndarray | None, str]:
        """Solve ``y = g(y)`` from ``start`` by fixed-point iteration with Anderson
        acceleration of depth 2 (Walker & Ni 2011; it halves the iterations here and finds
        the same fixed point).  Converged when ``‖g(y) − y‖∞ ≤ tol·max(1, ‖g(y)‖∞)``;
        returns (g(y), "ok"), or (None, "fixed_point" | "non_finite")."""
        y, gs, fs = start, [], []
        for _ in range(self.max_iter):
            gy = g(y)
            if gy is None or not np.all(np.isfinite(gy)):
                return None, "non_finite"
            if self._converged(gy, y):
                return gy, "ok"
            gs.append(gy)
            fs.append(gy - y)
            del gs[:-3], fs[:-3]
            if len(fs) > 1:
                dF = np.diff(fs, axis=0).T
                gamma = np.linalg.lstsq(dF, fs[-1], rcond=None)[0]
                y = gy - np.diff(gs, axis=0).T @ gamma
            else:
                y = gy
        return None, "fixed_point"

    def _returned(self, end: np.ndarray, start: np.ndarray) -> bool:
        return float(np.max(np.abs(end - start))) <= self.reversibility_tol * max(
            1.0, float(np.max(np.abs(start))))

    def _converged(self, new: np.ndarray, old: np.ndarray) -> bool:
        scale = max(1.0, float(np.max(np.abs(new))))
        return float(np.max(np.abs(new - old))) <= self.tol * scale

    def leapfrog(self, state: RMHMCState, p: np.ndarray, step_size: float
                 ) -> tuple[RMHMCState | None, np.ndarray, str]:
        """One generalised leapfrog step (module docstring) from ``(state, p)``.  Returns
        (new state, new momentum, status) with status ``"ok"``, ``"fixed_point"`` (an
        implicit solve did not converge) or ``"non_finite"`` (new state None then)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return self._leapfrog(state, p, step_size)

    def _leapfrog(self, state, p, step_size):
        half = 0.5 * step_size
        p_half, status = self._fixed_point(                # implicit momentum half step
            lambda q: p - half * state.force(q), p)
        if status != "ok":
            return None, p, status
        v0 = state.velocity(p_half)

        def position_map(y):
            trial = self.geometry(y, third=False)
            if trial is None:
                return None
            return state.position + half * (v0 + trial.velocity(p_half))

        x_new, status = self._fixed_point(                 # implicit position step, from
            position_map, state.position + step_size * v0)  # the iterate of x' = x
        if status != "ok":
            return None, p, status
        new_state = self.geometry(x_new)
        if new_state is None:
            return None, p, "non_finite"
        return new_state, p_half - half * new_state.force(p_half), "ok"

    def integrate(self, state: RMHMCState, p: np.ndarray, step_size: float, n_steps: int
                  ) -> tuple[RMHMCState | None, np.ndarray, str, int]:
        """``n_steps`` generalised leapfrog steps; stops at the first failure.  Returns
        (state, momentum, status, steps taken).  In C++ when the kernel is native."""
        if self.native:
            status, packed, p, counts = self.density.rmhmc_integrate(
                self._options, step_size, n_steps, state.pack(), p)
            self._count(counts[0], counts[1])
            new = None if packed is None else RMHMCState.from_packed(packed, len(p))
            return new, p, ("ok", "fixed_point", "non_finite")[status], int(counts[2])
        for step in range(n_steps):
            state, p, status = self.leapfrog(state, p, step_size)
            if status != "ok":
                return None, p, status, step + 1
        return state, p, "ok", n_steps

    def draw_momentum(self, rng: np.random.Generator, state: RMHMCState) -> np.ndarray:
        """``p ~ N(0, G(x))``."""
        z = rng.standard_normal(len(state.position))
        return state.eigvecs @ (np.sqrt(state.softabs) * z)

    # -- transitions
    def step(self, rng: np.random.Generator, state: RMHMCState, params: HMCParameters
             ) -> tuple[RMHMCState, RMHMCInfo]:
        """One RMHMC iteration (arrays of length 1 in the info, as HMCKernel)."""
        return self.run(rng, state, params, 1)

    def run(self, rng: np.random.Generator, state: RMHMCState, params: HMCParameters,
            n_iter: int) -> tuple[RMHMCState, RMHMCInfo]:
        """``n_iter`` iterations at fixed (ε, L): native, one C++ call whose random numbers
        come from one 64-bit seed taken from ``rng`` (:meth:`run_native`); else in Python,
        drawing per iteration, in order, the momentum (dims normals), ``L_r`` (if
        ``jitter``) and ``log u`` from ``rng``."""
        if params.inv_metric is not None:
            raise ValueError("RMHMC uses the position-dependent SoftAbs metric; "
                             "inv_metric must be None")
        if self.native:
            state, info, _ = self.run_native(int(rng.integers(0, 2**63)), state, params,
                                             n_iter)
            return state, info
        positions = np.empty((n_iter, len(state.position)))
        stats = np.empty((n_iter, len(self.NATIVE_STATS)))
        for i in range(n_iter):
            p = self.draw_momentum(rng, state)
            n_steps = (int(rng.integers(1, params.num_steps, endpoint=True)) if params.jitter
                       else int(params.num_steps))
            log_u = math.log(rng.uniform())
            state, stats[i] = self.transition(state, p, n_steps, log_u, params.step_size)
            positions[i] = state.position
        return state, self._info(positions, stats)

    def run_native(self, seed: int, state: RMHMCState, params: HMCParameters, n_iter: int,
                   want_noise: bool = False
                   ) -> tuple[RMHMCState, RMHMCInfo, np.ndarray | None]:
        """``n_iter`` iterations in one C++ call (``ahmc_rmhmc_block``): iteration i draws
        from ``seed`` the momentum ``p ~ N(0, G(x))``, ``L_r`` and ``u``, in this order,
        and makes :meth:`transition`.  With ``want_noise`` also returns each iteration's
        (p, L_r, log u) as rows ``[p..., L_r, log u]``."""
        packed, draws, stats, noise = self.density.rmhmc_block(
            self._options, n_iter, params.step_size, params.num_steps, params.jitter, seed,
            state.pack(), want_noise)
        columns = dict(zip(self.NATIVE_STATS, stats.T))
        self._count(columns["n_hessian"].sum(), columns["n_third"].sum())
        return (RMHMCState.from_packed(packed, len(state.position)),
                self._info(draws, stats), noise)

    def transition(self, state: RMHMCState, p: np.ndarray, n_steps: int, log_u: float,
                   step_size: float) -> tuple[RMHMCState, np.ndarray]:
        """One iteration from ``state`` with momentum ``p``: ``n_steps`` steps, accepted
        iff ``log u < −ΔH`` and (with the check) the trajectory from ``(x', −p')`` returns
        to ``(x, p)``.  Returns (the state kept, its :data:`NATIVE_STATS`)."""
        before = dict(self.totals)
        h0 = state.hamiltonian(p)
        new, p_new, status, taken = self.integrate(state, p, step_size, n_steps)
        delta = new.hamiltonian(p_new) - h0 if status == "ok" else math.inf
        accepted = log_u < -delta
        if accepted and self.check_reversibility:   # back from (x', −p') to (x, p)?
            back, p_back, status_back, taken_back = self.integrate(new, -p_new, step_size,
                                                                   n_steps)
            taken += taken_back
            if not (status_back == "ok" and self._returned(back.position, state.position)
                    and self._returned(-p_back, p)):
                accepted, status = False, "fixed_point"
        failed = status == "fixed_point"
        divergent = status == "non_finite" or (
            math.isfinite(delta) and delta > self.max_energy_error)
        accept_stat = (math.exp(min(0.0, -delta)) if not failed and math.isfinite(delta)
                       else 0.0)
        energy = h0 + delta if accepted else h0
        if accepted:
            state = new
        return state, np.array([
            accept_stat, accepted, divergent, n_steps, energy, state.logdensity,
            self.totals["n_hessian"] - before["n_hessian"],
            self.totals["n_third"] - before["n_third"], failed, taken], dtype=float)

    def _info(self, positions: np.ndarray, stats: np.ndarray) -> RMHMCInfo:
        c = dict(zip(self.NATIVE_STATS, stats.T))
        ints = {k: c[k].astype(int) for k in ("num_steps", "n_hessian", "n_third",
                                              "fixed_point_failures", "n_leapfrog")}
        return RMHMCInfo(positions, c["accept_stat"], c["accepted"].astype(bool),
                         c["divergent"].astype(bool), ints["num_steps"],
                         np.zeros(len(stats), int), c["energy"], c["lp"], ints["n_hessian"],
                         ints["n_third"], ints["fixed_point_failures"], ints["n_leapfrog"])


# ---- constant metric -----------------------------------------------------------------------

def find_mode(density: NativeDensity, x0: np.ndarray, max_iter: int = 1000
              ) -> tuple[np.ndarray, int, bool]:
    """Maximise log π on the unconstrained scale with L-BFGS (``scipy.optimize.minimize``
    and the autodiff gradient) from ``x0``; returns (x, gradient evaluations, success)."""
    from scipy.optimize import minimize

    grad = np.empty(density.dims)
    n_eval = 0

    def objective(x):
        nonlocal n_eval
        n_eval += 1
        lp = density.log_density_gradient(np.ascontiguousarray(x, dtype=float), grad)
        if not np.isfinite(lp):
            return np.inf, np.zeros_like(grad)
        return -lp, -grad.copy()

    res = minimize(objective, np.asarray(x0, dtype=float), jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter})
    return np.asarray(res.x, dtype=float), n_eval, bool(res.success)


def constant_softabs_metric(density: NativeDensity, x0: np.ndarray,
                            softness: float = DEFAULT_SOFTNESS) -> dict:
    """The fixed inverse metric of constant-metric mode: ``G⁻¹`` (SoftAbs) of the Hessian
    at the mode found by :func:`find_mode` from ``x0`` (at ``x0`` if the mode's Hessian
    is not finite).  Returns ``inv_metric``, ``mode``, ``n_grad`` (optimiser gradients),
    ``optimizer_success``."""
    mode, n_grad, success = find_mode(density, x0)
    grad, hess = np.empty(density.dims), np.empty((density.dims,) * 2)
    point = mode
    if not np.isfinite(density.log_density_hessian(mode, grad, hess)):
        point = np.ascontiguousarray(x0, dtype=float)
        if not np.isfinite(density.log_density_hessian(point, grad, hess)):
            raise ValueError("no finite Hessian at the mode or at the initial point")
    return {"inv_metric": softabs_inv_metric(-hess, softness), "mode": point,
            "n_grad": n_grad, "optimizer_success": success}
