"""A warmup that cannot get stuck: detect a chain that does not move during step-size
adaptation, and restart its warmup from a fresh initial point.

What a stuck chain looks like (ARMA(1,1) started at φ = 1.8, θ = 1.65, where the
one-step-ahead errors grow like θ^t and the log density is ≈ −10^64): Stan's step-size
heuristic already ends at its floor (ε₀ ≈ 6·10⁻⁸), every trajectory is rejected
(divergent), and dual averaging, whose iterate is ``log ε = μ − √t·s̄/γ``, drives ε down by
≈ 16√t·(mean acceptance deficit) e-folds: 10⁻²⁷ after 20 iterations.  L = 2/ε then sits at
``max_num_steps`` and the positions no longer change in floating point.  Such a chain may
crawl out after hundreds of capped iterations, or never (its window's "variance" is 0, so
the metric and ε* it hands on are nonsense).

:class:`StuckDetector` is fed each warmup iteration (the step size to use next, the
position, optionally the acceptance statistic and lp for its message) and names a reason
when one of two rules fires:

* **collapse**: ε < 10^−``collapse_orders`` × the reference ε (the heuristic's ε at the
  start of adaptation, or after each metric update, :meth:`StuckDetector.restart`);
  default 10 orders of magnitude.  Measured in the scale phase of AHMC (500 iterations,
  diag metric, Stan-rule inits): the deepest dip of healthy chains was 2.7 orders (standard
  normal, mvn, logistic, Neal's 100-d Gaussian, eight schools, banana, constrained;
  20–200 chains each) and 6.7 orders on a target that is −inf on part of the space
  (``reject_region.stan``: trajectories that cross the boundary are rejected whatever ε
  is, until ε·L is short); the HMC baseline (L = 5, 20) dipped at most 4.4 orders.  On
  ARMA(1,1), 29% of Stan-rule starts (|θ| > 1 makes the errors explode) collapsed 10–43
  orders; every chain still stuck at the end of the scale phase had collapsed > 20.
* **frozen**: over a block of ``window`` consecutive iterations (default 50;
  non-overlapping blocks) no coordinate moved by more than ``frozen_tol`` (1e-8) ×
  max(1, |x|): healthy chains move ≥ 10^−2.7 of that scale in every block (most ≥ 0.3);
  stuck ARMA chains do not move at all (range exactly 0).

Both rules only look at one chain's own history, so the decision is a deterministic
function of the chain's seed.  What they cannot see: a chain that moves normally but in
the wrong place (a minor mode, a region whose lp is far below the other chains').  That
needs the other chains and so belongs to the post-run diagnostics
(:func:`ahmc_stan.convergence.diagnose`, the lp-gap part of ``stuck_chain``), which
compare chains once all have finished.

:class:`WarmupRestarts` is the samplers' side: on a reason it discards the attempt's
recorded iterations (their evaluation counts are charged to the first iteration of the
next attempt, :meth:`~ahmc_stan.samplers.chain.ChainRecorder.discard`, so the Fit's
warmup cost includes them), logs ``{"iteration", "reason", "n_grad", ...}``, and draws a
fresh point by Stan's rule (``model.initial_point(rng)``: uniform(−2, 2) on the
unconstrained scale, ignoring any user ``init``); after ``max_restarts`` restarts it raises
:class:`StuckChainError`.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["StuckDetector", "WarmupRestarts", "StuckChainError", "WarmupStuck",
           "DEFAULT_MAX_RESTARTS"]

#: Restarts allowed per chain before :class:`StuckChainError`.
DEFAULT_MAX_RESTARTS = 10


class StuckChainError(RuntimeError):
    """A chain's warmup got stuck ``max_restarts + 1`` times.  ``chain`` (1-based) is set
    by :func:`ahmc_stan.tune_and_sample`; ``restarts`` is the log of the attempts."""

    def __init__(self, message: str, chain: int | None = None, restarts=()):
        super().__init__(message)
        self.message, self.chain, self.restarts = message, chain, list(restarts)

    def __str__(self) -> str:
        return self.message if self.chain is None else f"chain {self.chain}: {self.message}"

    def __reduce__(self):  # picklable across worker processes, chain included
        return (type(self), (self.message, self.chain, self.restarts))

    def for_chain(self, chain: int) -> "StuckChainError":
        return type(self)(self.message, chain, self.restarts)


class WarmupStuck(Exception):
    """Internal signal from a warmup loop: ``iteration`` (within the attempt), ``reason``."""

    def __init__(self, iteration: int, reason: str):
        super().__init__(f"iteration {iteration}: {reason}")
        self.iteration, self.reason = iteration, reason


class StuckDetector:
    """Per-iteration stuck test of one warmup attempt (module docstring)."""

    def __init__(self, dims: int, reference_step_size: float, *,
                 collapse_orders: float = 10.0, window: int = 50,
                 frozen_tol: float = 1e-8):
        self.collapse_orders, self.window, self.frozen_tol = (
            float(collapse_orders), int(window), float(frozen_tol))
        self.iteration = 0
        self._low = np.full(dims, np.inf)
        self._high = np.full(dims, -np.inf)
        self._block = 0
        self.restart(reference_step_size)

    def restart(self, reference_step_size: float) -> None:
        """A new reference ε: adaptation restarted (a new metric, a new heuristic ε)."""
        self.reference = float(reference_step_size)
        self._since_reference = 0
        self._accept_sum = 0.0

    @property
    def floor(self) -> float:
        """The step size below which ε has collapsed (the first rule)."""
        return self.reference * 10 ** -self.collapse_orders if self.reference > 0 else 0.0

    def update(self, step_size: float, position: np.ndarray, accept_stat: float = math.nan,
               lp: float = math.nan) -> str | None:
        """One iteration done: ``step_size`` is the ε adaptation chose next, ``position``
        the chain's state.  Returns why the chain is stuck, or None."""
        found = self.update_many([step_size], np.reshape(position, (1, -1)), [accept_stat],
                                 [lp])
        return None if found is None else found[1]

    def update_many(self, step_sizes, positions: np.ndarray, accept_stats=None, lps=None
                    ) -> tuple[int, str] | None:
        """Iterations done, one row of ``positions`` each, ``step_sizes`` the ε chosen
        after each: :meth:`update` for each in turn, stopping at the first stuck one.
        Returns (its index, why), or None."""
        eps = np.asarray(step_sizes, dtype=float)
        n = len(eps)
        accept = np.full(n, math.nan) if accept_stats is None else np.asarray(accept_stats, float)
        lps = np.full(n, math.nan) if lps is None else np.asarray(lps, float)
        floor = self.reference * 10 ** -self.collapse_orders
        collapsed = np.flatnonzero(~(eps >= floor)) if self.reference > 0 else []
        end = collapsed[0] if len(collapsed) else n  # rows fed to the frozen rule
        reason, block0 = None, self._block
        # the frozen rule's blocks that close within rows [0, end)
        for close in range(self.window - block0 - 1, end, self.window):
            start = max(0, close - self.window + 1)
            block = positions[start:close + 1]
            low = np.minimum(self._low, block.min(axis=0))
            high = np.maximum(self._high, block.max(axis=0))
            self._low.fill(np.inf)
            self._high.fill(-np.inf)
            self._block = 0
            scale = np.maximum(1.0, np.maximum(np.abs(low), np.abs(high)))
            moved = float(np.max((high - low) / scale))
            if moved <= self.frozen_tol:
                end, reason = close, (
                    f"no coordinate moved more than {moved:.3g} (relative; limit "
                    f"{self.frozen_tol:g}) in {self.window} iterations at step size "
                    f"{eps[close]:.3g}; {_where(lps[close])}")
                break
        if reason is None and end < n:  # collapsed at row `end`
            done = end + 1
            self._count(done, accept[:done])
            orders = math.inf if not eps[end] > 0 else math.log10(self.reference / eps[end])
            return end, (
                f"step size collapsed from {self.reference:.3g} to {eps[end]:.3g} "
                f"({orders:.1f} orders of magnitude, limit {self.collapse_orders:g}) in "
                f"{self._since_reference} iterations, mean acceptance "
                f"{self._accept_sum / self._since_reference:.2f}; {_where(lps[end])}")
        done = end + 1 if reason is not None else n
        self._count(done, accept[:done])
        if reason is not None:
            return end, reason
        tail = (block0 + n) % self.window
        rest = positions[n - min(tail, n):n] if tail else positions[:0]
        if len(rest):
            np.minimum(self._low, rest.min(axis=0), out=self._low)
            np.maximum(self._high, rest.max(axis=0), out=self._high)
        self._block = tail
        return None

    def _count(self, n: int, accept: np.ndarray) -> None:
        self.iteration += n
        self._since_reference += n
        finite = accept[np.isfinite(accept)]
        self._accept_sum += float(np.minimum(1.0, finite).sum())


def _where(lp: float) -> str:
    return f"lp = {lp:.4g}" if math.isfinite(lp) else f"lp = {lp}"


class WarmupRestarts:
    """Restarts of one chain's warmup (module docstring).  ``enabled=False`` turns the
    detection off (:meth:`detector` returns None)."""

    def __init__(self, max_restarts: int = DEFAULT_MAX_RESTARTS, enabled: bool = True,
                 **criteria):
        if int(max_restarts) < 0:
            raise ValueError("max_restarts must be >= 0")
        self.max_restarts, self.enabled, self.criteria = int(max_restarts), bool(enabled), criteria
        self.records: list[dict] = []

    def detector(self, dims: int, reference_step_size: float) -> StuckDetector | None:
        if not self.enabled:
            return None
        return StuckDetector(dims, reference_step_size, **self.criteria)

    def restart(self, stuck: WarmupStuck, rec, model, rng: np.random.Generator,
                start: int = 0) -> np.ndarray:
        """Log the stuck attempt, discard its iterations from ``rec`` (rows ``start`` on)
        and return a fresh initial point; :class:`StuckChainError` once ``max_restarts``
        restarts are used up."""
        discarded = rec.discard(start)
        self.records.append({"iteration": int(stuck.iteration), "reason": stuck.reason,
                             **{name: int(n) for name, n in discarded.items()
                                if n or name == "n_grad"}})
        if len(self.records) > self.max_restarts:
            tries = len(self.records)
            raise StuckChainError(
                f"the warmup got stuck {tries} time{'s' * (tries > 1)} "
                f"(max_restarts={self.max_restarts}), each time from a fresh initial "
                f"point; the last time at iteration {stuck.iteration}: {stuck.reason}.  "
                "The model's density is pathological where the chains start (uniform(-2, "
                "2) on the unconstrained scale).  Try: init= values in the posterior's "
                "bulk, bounds or a reparameterisation that exclude the pathological region "
                "(e.g. a stationarity constraint), or a larger max_restarts; "
                "detect_stuck=False turns the check off.", restarts=self.records)
        return model.initial_point(rng)
