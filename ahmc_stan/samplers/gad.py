"""Gradient-based adaptive MCMC (Titsias & Dellaportas 2019, Algorithm 1): ``gadrwm``,
``gadmala`` (the fast variant, gadMALAf) and ``gadmala_exact`` (gadMALAe).

The proposal is :mod:`~ahmc_stan.samplers.metropolis`'s random walk or Langevin proposal
with a full lower-triangular Cholesky factor L.  During warmup every iteration takes one
stochastic-gradient step on the generalised speed measure (eq. 5–7) at the proposed y —
accepted or not — with ε held fixed:

    F(L) = min{0, h(L)} + β Σᵢ log Lᵢᵢ,

    RWM:  y = x + Lε,               h = log π(y) − log π(x)
    MALA: y = x + La,  a = ε + ½Lᵀg_x,
          h = log π(y) − log π(x) + ½‖ε‖² − ½‖r‖²,  r = a + ½Lᵀg_y

(g_x = ∇log π(x), g_y = ∇log π(y); h is the MH log ratio).  The gradient is zero in the
min term when h ≥ 0; otherwise, restricted to the lower triangle, ``[·]_lower``:

* ``dy = dL·ε`` (RWM) gives ``∇_L log π(y) = g_y εᵀ`` (section 2.2).
* ``dy = dL·a + ½L·dLᵀg_x`` (MALA) gives ``∇_L log π(y) = g_y aᵀ + ½g_x(Lᵀg_y)ᵀ``, and
  with g_y held constant (fast variant) ``∇_L(−½‖r‖²) = −½(g_x + g_y)rᵀ``; these sum to
  one outer product, ``∇_L h = ½(g_y − g_x)(ε + ½Lᵀ(g_x − g_y))ᵀ``.
* The exact variant also differentiates g_y = g(y(L)) in r:
  ``d(−½‖r‖²) ⊇ −½rᵀLᵀH dy = cᵀdy`` with ``c = −½H(Lr)``, H = ∇²log π(y) (one
  Hessian-vector product), adding ``c aᵀ + ½g_x(Lᵀc)ᵀ``.
* The entropy term adds ``β diag(1/Lᵢᵢ)``.

The step is RMSProp, elementwise: ``G ← 0.9G + 0.1g²``, ``L ← L + η/(1 + √G)·g``
(section 2.1), then ``β ← β(1 + ρ_β(αₜ − α*))`` with αₜ = 1 if y was accepted, floored at
``min_beta`` = 10⁻⁴.  L starts at ``0.1/√n·I`` and β at 1 (section 4.2); after warmup L is
fixed.

Learning rates: section 4.2 states η = 0.0005 (gadRWM) and 0.0015 (gadMALA), but the
authors' released code (github.com/mtitsias/gadMCMC, ``demo_radfordnealexample_*`` and
``demo_binaryclassification_*``) runs Table 1 with η = 0.00005 and 0.00015 — 0.0005 is its
2-d Figure 1 demo — and also floors β at 10⁻⁴.  Those are our defaults: with them we
reproduce Table 1 on Neal's Gaussian (gadMALAf min/median/max ESS 1443/1999/2430 per 2·10⁴
draws, paper 1431/2001/2471), while with the text's values gadMALA's L stays too noisy on
Caravan (acceptance 0.26 instead of 0.55, β collapsing) and gadRWM's L on Neal's Gaussian
gets a nearly singular direction (min ESS 3).

Positivity of diag(L): L is kept as is (not log-diagonal), so the gradient and the
paper's η values are the paper's own; a step that would shrink a diagonal entry below
``min_diag_ratio`` (½) of its value is cut there.  The entropy term's β/Lᵢᵢ already pushes
small entries up, so the guard only catches RMSProp overshoots — it is scale-free, unlike
the fixed floor 10⁻³ of the authors' code.

Cost per warmup iteration: a few O(n²) outer products and elementwise updates; the exact
variant adds a Hessian-vector product at y when h < 0, counted in ``n_hvp`` (and not in
``n_grad``).  Stan's forward-over-reverse HVP really costs ≈ 6 gradients on the 100-d
Gaussian and ≈ 67 on the Caravan regression (``X·β`` in nested autodiff); the Fit's ESS
per gradient converts each product with its cost measured on the model
(:mod:`ahmc_stan.costs`).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from ..mh import MHParameters
from .chain import ChainResult
from .metropolis import MHStep, Proposal, Target, propose, run_mh_chain

__all__ = ["objective", "objective_gradient", "GadProposal", "run_gadrwm", "run_gadmala",
           "run_gadmala_exact", "proposal_cholesky", "plot_proposal"]

#: variant → (α*, η): α* of section 2; η of the authors' code for Table 1 (see the module
#: docstring — the text of section 4.2 gives 10× larger values)
DEFAULTS = {"rwm": (0.25, 0.00005), "fast": (0.55, 0.00015), "exact": (0.55, 0.00015)}


def objective(L: np.ndarray, x: np.ndarray, eps: np.ndarray, beta: float,
              log_density_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]],
              langevin: bool, grad_y_fixed: np.ndarray | None = None) -> float:
    """``F(L) = min{0, h} + β Σ log Lᵢᵢ`` at ``x`` with noise ``ε`` fixed (eq. 7 and
    section 2.3).  ``grad_y_fixed`` replaces ∇log π(y) in r (the fast variant's view)."""
    lp_x, g_x = log_density_gradient(x)
    y = propose(x, L, eps, g_x if langevin else None)
    lp_y, g_y = log_density_gradient(y)
    h = lp_y - lp_x
    if langevin:
        g = g_y if grad_y_fixed is None else grad_y_fixed
        r = eps + 0.5 * L.T @ (g_x + g)
        h += 0.5 * (eps @ eps - r @ r)
    return min(0.0, h) + beta * float(np.sum(np.log(np.diag(L))))


@functools.lru_cache(maxsize=8)
def _lower_mask(n: int) -> np.ndarray:
    mask = np.tril(np.ones((n, n)))
    mask.flags.writeable = False
    return mask


def objective_gradient(L: np.ndarray, eps: np.ndarray, beta: float, log_ratio: float,
                       grad_y: np.ndarray, grad_x: np.ndarray | None = None,
                       hvp: Callable[[np.ndarray], np.ndarray | None] | None = None
                       ) -> np.ndarray | None:
    """``∇_L F`` (lower triangular) for one proposal: random walk when ``grad_x`` is None,
    Langevin otherwise — fast, or exact when ``hvp(v) = ∇²log π(y)v`` is given.  None if
    ``hvp`` fails.  See the module docstring for the derivation."""
    if log_ratio < 0:
        if grad_x is None:
            grad = np.outer(grad_y, eps)
        else:
            u_x, u_y = L.T @ grad_x, L.T @ grad_y
            grad = 0.5 * np.outer(grad_y - grad_x, eps + 0.5 * (u_x - u_y))
            if hvp is not None:
                a = eps + 0.5 * u_x
                hv = hvp(L @ (a + 0.5 * u_y))
                if hv is None:
                    return None
                c = -0.5 * hv
                grad += np.outer(c, a) + 0.5 * np.outer(grad_x, L.T @ c)
        grad *= _lower_mask(len(L))
    else:
        grad = np.zeros_like(L)
    diag = np.arange(len(L))
    grad[diag, diag] += beta / L[diag, diag]
    return grad


class GadProposal(Proposal):
    """Algorithm 1's adaptation of L and β (see the module docstring)."""

    stat_names = ("beta",)

    def __init__(self, dims: int, *, langevin: bool, exact: bool, adapt_delta: float,
                 learning_rate: float, rho_beta: float = 0.02, beta: float = 1.0,
                 initial_scale: float | None = None, min_diag_ratio: float = 0.5,
                 min_beta: float = 1e-4):
        if exact and not langevin:
            raise ValueError("the exact variant is a Langevin proposal")
        self.count_names = ("n_hvp",) if exact else ()
        scale = 0.1 / math.sqrt(dims) if initial_scale is None else float(initial_scale)
        super().__init__(scale * np.eye(dims), langevin)
        self.exact, self.adapt_delta = exact, float(adapt_delta)
        self.learning_rate, self.rho_beta = float(learning_rate), float(rho_beta)
        self.beta, self.min_diag_ratio = float(beta), float(min_diag_ratio)
        self.min_beta = float(min_beta)
        self._sq_grad = np.zeros((dims, dims))  # RMSProp's G
        self._work = np.empty((dims, dims))
        self._diag = np.arange(dims)

    def needs_gradient(self, adapting: bool) -> bool:
        return self.langevin or adapting  # gadrwm's gradient step needs ∇log π(y)

    def adapt(self, target: Target, step: MHStep) -> dict[str, int]:
        made = {"n_hvp": 0} if self.exact else {}
        if math.isfinite(step.lp_y):
            hvp = None
            if self.exact and step.log_ratio < 0:
                def hvp(v):  # counted where it is made
                    made["n_hvp"] += 1
                    return target.hvp(step.y, v)
            grad = objective_gradient(self.L, step.eps, self.beta, step.log_ratio,
                                      step.grad_y, step.grad_x if self.langevin else None,
                                      hvp)
            if grad is not None:
                self._step(grad)
        self.beta = max(self.min_beta, self.beta * (
            1 + self.rho_beta * (float(step.accepted) - self.adapt_delta)))
        return made

    def _step(self, grad: np.ndarray) -> None:
        """RMSProp ascent step on L, diagonal kept positive."""
        G, work, d = self._sq_grad, self._work, self._diag
        np.multiply(grad, grad, out=work)  # in place: this runs every warmup iteration
        work *= 0.1
        G *= 0.9
        G += work
        np.sqrt(G, out=work)
        work += 1.0
        np.divide(grad, work, out=work)
        work *= self.learning_rate
        floor = self.min_diag_ratio * self.L[d, d]
        self.L += work
        self.L[d, d] = np.maximum(self.L[d, d], floor)

    def native_block(self, adapting: bool) -> MHParameters:
        """L and G are passed as they are (the C++ block updates them in place)."""
        self.L = np.ascontiguousarray(self.L, dtype=float)
        if not adapting:
            return MHParameters(0, np.zeros(1), np.zeros(1), chol=self.L,
                               langevin=self.langevin)
        return MHParameters(2, np.array([self.adapt_delta, self.learning_rate, self.rho_beta,
                                        self.min_diag_ratio, self.min_beta]),
                           np.array([self.beta]), chol=self.L, sq_grad=self._sq_grad,
                           langevin=self.langevin, exact=self.exact)

    def load_native(self, block: MHParameters) -> None:
        if block.adapt:
            self.beta = float(block.state[0])

    def stats(self) -> dict[str, float]:
        return {"beta": self.beta}

    def extras(self) -> dict:
        return {**super().extras(), "beta": self.beta, "adapt_delta": self.adapt_delta}


def _run(model, rng, x0, warmup, draws, progress, variant, adapt_delta, learning_rate,
         rho_beta, initial_scale, steps_per_draw, min_diag_ratio, min_beta) -> ChainResult:
    default_accept, default_rate = DEFAULTS[variant]
    proposal = GadProposal(
        len(x0), langevin=variant != "rwm", exact=variant == "exact",
        adapt_delta=default_accept if adapt_delta is None else adapt_delta,
        learning_rate=default_rate if learning_rate is None else learning_rate,
        rho_beta=rho_beta, initial_scale=initial_scale, min_diag_ratio=min_diag_ratio,
        min_beta=min_beta)
    return run_mh_chain(Target(model), rng, x0, warmup, draws, progress, proposal,
                        steps_per_draw=steps_per_draw)


def run_gadrwm(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
               progress: Callable[[int], None], *, adapt_delta: float | None = None,
               learning_rate: float | None = None, rho_beta: float = 0.02,
               initial_scale: float | None = None, steps_per_draw: int = 1,
               min_diag_ratio: float = 0.5, min_beta: float = 1e-4) -> ChainResult:
    """gadRWM (section 2.2): α* = ``adapt_delta`` (0.25), η = ``learning_rate``
    (0.00005), ρ_β = ``rho_beta``, L₀ = ``initial_scale``·I (0.1/√n), β ≥ ``min_beta``;
    ``steps_per_draw`` as in :func:`~ahmc_stan.samplers.metropolis.run_mh_chain`."""
    return _run(model, rng, x0, warmup, draws, progress, "rwm", adapt_delta,
                learning_rate, rho_beta, initial_scale, steps_per_draw, min_diag_ratio, min_beta)


def run_gadmala(model, rng: np.random.Generator, x0: np.ndarray, warmup: int, draws: int,
                progress: Callable[[int], None], *, adapt_delta: float | None = None,
                learning_rate: float | None = None, rho_beta: float = 0.02,
                initial_scale: float | None = None, steps_per_draw: int = 1,
                min_diag_ratio: float = 0.5, min_beta: float = 1e-4) -> ChainResult:
    """gadMALAf (section 2.3, ∇log π(y) held constant): α* 0.55, η 0.00015; options as
    :func:`run_gadrwm`."""
    return _run(model, rng, x0, warmup, draws, progress, "fast", adapt_delta,
                learning_rate, rho_beta, initial_scale, steps_per_draw, min_diag_ratio, min_beta)


def run_gadmala_exact(model, rng: np.random.Generator, x0: np.ndarray, warmup: int,
                      draws: int, progress: Callable[[int], None], *,
                      adapt_delta: float | None = None,
                      learning_rate: float | None = None, rho_beta: float = 0.02,
                      initial_scale: float | None = None, steps_per_draw: int = 1,
                      min_diag_ratio: float = 0.5, min_beta: float = 1e-4) -> ChainResult:
    """gadMALAe (section 2.3, differentiating through ∇log π(y) with a Hessian-vector
    product); options as :func:`run_gadrwm`."""
    return _run(model, rng, x0, warmup, draws, progress, "exact", adapt_delta,
                learning_rate, rho_beta, initial_scale, steps_per_draw, min_diag_ratio, min_beta)


# ---- inspecting the adapted proposal -----------------------------------------------------

def proposal_cholesky(fit) -> list[np.ndarray]:
    """The adapted proposal factor L of each chain (``extras["proposal_cholesky"]``)."""
    return [np.asarray(c["proposal_cholesky"], dtype=float) for c in fit.metadata["chains"]]


def _ellipse(cov: np.ndarray, radius: float = 2.0, n: int = 200) -> np.ndarray:
    t = np.linspace(0, 2 * np.pi, n)
    return radius * (np.linalg.cholesky(cov) @ np.vstack([np.cos(t), np.sin(t)]))


def plot_proposal(fit, target_cov: np.ndarray | None = None, ax=None, dims=(0, 1)):
    """Figure 1 of the paper: the 2-sd ellipse of each chain's adapted LLᵀ (blue) and of
    ``target_cov`` (green) in the coordinates ``dims`` of the unconstrained space."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    idx = np.ix_(dims, dims)
    if target_cov is not None:
        ax.plot(*_ellipse(np.asarray(target_cov, dtype=float)[idx]), color="tab:green",
                label="target")
    for c, L in enumerate(proposal_cholesky(fit)):
        ax.plot(*_ellipse((L @ L.T)[idx]), color="tab:blue", alpha=0.8,
                label="proposal LLᵀ" if c == 0 else None)
    betas = [c.get("beta") for c in fit.metadata["chains"] if c.get("beta") is not None]
    title = fit.sampler + (f", β = {np.mean(betas):.3g}" if betas else "")
    ax.set_title(title)
    ax.set_aspect("equal")
    ax.legend(loc="upper left")
    return ax
