"""A shorter warmup where the posterior looks Gaussian: the fit's first chain decides at
iteration :data:`DECIDE_AT` of its scale phase, from that phase's draws and gradients
since iteration :data:`FROM`, and every chain of the fit follows.

For a Gaussian target the gradient is affine in the position, so the draws-and-gradients
metrics (:func:`~ahmc_stan.tuning.windows.low_rank_inv_metric`) are exact from any window
that spans the space, and the :func:`~ahmc_stan.tuning.windows.gaussian_misfit` of the
window is 0 to rounding; GLMs measure little above it, the hierarchical and skewed
posteriors on which a shorter warmup lost (UCB admissions, Caravan) far more
(``README.md``, "A shorter warmup for Gaussian-looking posteriors";
``comparisons/fast_warmup_decisions.py``).  Below
:data:`MISFIT` (with fewer divergent transitions than the metric fallback's rule in the
window) the scale phase ends after a terminal buffer at :data:`SCALE` iterations, and the
tuner gets :data:`TUNING`: a warmup of :data:`WARMUP` instead of 1000.  Only
:func:`~ahmc_stan.sampling.tune_and_sample` called without ``warmup`` uses it; an explicit
warmup is run as asked.

One chain decides, so that the chains of a fit share a warmup length (the Fit's arrays
and every diagnosis assume it) and the decision does not depend on how many chains run at
once: the same seed gives the same draws with any ``parallel``.  The chains run in
processes forked after the :class:`FastWarmup` is made (or one after the other in this
one); a chain other than the first waits for the decision at its own iteration
:data:`DECIDE_AT`.  The first chain is always started first, so it never waits, and if it
ends before deciding (an error, Ctrl-C, a deadline) the others take the full warmup."""

from __future__ import annotations

import multiprocessing

import numpy as np

from .windows import gaussian_misfit

__all__ = ["FastWarmup", "FastWarmupMember", "DECIDE_AT", "FROM", "MISFIT", "SCALE",
           "TUNING", "WARMUP"]

#: The scale phase's iteration at which the first chain decides: the end of the window
#: 150–250 of the default 500-iteration scale phase (Stan's windows of a 1000 warmup).
DECIDE_AT = 250
#: The decision's draws start here (after the 75-iteration buffer and the first window),
#: so that up to about 120 parameters have more distinct draws than coefficients.
FROM = 100
#: Below this misfit of the first chain's draws the posterior is taken to be Gaussian.
MISFIT = 0.25
#: The short warmup: a scale phase of SCALE iterations (a 50-iteration terminal buffer
#: after DECIDE_AT), then TUNING for the tuner (the fewest with which the chains' tail
#: check runs, ``samplers.ahmc.TAIL_CHECK_MIN_TUNING``).
SCALE = 300
TUNING = 200
WARMUP = SCALE + TUNING

_UNDECIDED, _FULL, _SHORT = 0.0, 1.0, 2.0


class _Shared:
    """A condition and two doubles in the shared memory of ``ctx``."""

    def __init__(self, ctx):
        self.cond, self.state = ctx.Condition(), ctx.RawArray("d", 2)


def window_misfit(draws: np.ndarray, grads: np.ndarray) -> float:
    """The :func:`~ahmc_stan.tuning.windows.gaussian_misfit` of the distinct draws (a
    rejected proposal repeats a row, and a regression on fewer distinct rows than
    coefficients fits anything exactly); ``inf`` where it is not defined."""
    draws, keep = np.unique(np.asarray(draws, dtype=float), axis=0, return_index=True)
    misfit = gaussian_misfit(draws, np.asarray(grads, dtype=float)[keep])
    return float(misfit) if np.isfinite(misfit) else float("inf")


class FastWarmup:
    """The decision of one fit, shared by its chains.  ``forced`` (True or False) makes it
    without looking (the chain reruns of a fit follow the fit's own decision).
    ``shared``: where the decision lives, in shared memory (anything with a ``cond``
    condition and a ``state`` of two doubles, such as a kept worker's
    :class:`~ahmc_stan.workers.Slot`); default new ones of ``ctx``."""

    def __init__(self, forced: bool | None = None, ctx=None, timeout: float = 3600.0,
                 shared=None):
        if shared is None:
            shared = _Shared(multiprocessing.get_context("fork") if ctx is None else ctx)
        self._attach(shared, timeout)
        self._state[0], self._state[1] = _UNDECIDED, 0.0
        if forced is not None:
            self._post(forced, float("nan"))

    def _attach(self, shared, timeout: float) -> None:
        self._shared, self.timeout = shared, timeout
        self._cond, self._state = shared.cond, shared.state

    def __getstate__(self) -> dict:  # (the shared memory goes by ``shared``'s own means)
        return {"shared": self._shared, "timeout": self.timeout}

    def __setstate__(self, state: dict) -> None:
        self._attach(state["shared"], state["timeout"])

    def member(self, chain: int) -> "FastWarmupMember":
        return FastWarmupMember(self, chain)

    @property
    def decision(self) -> bool | None:
        """True (short), False (full) or None (not made yet)."""
        value = self._state[0]
        return None if value == _UNDECIDED else value == _SHORT

    def note(self) -> dict:
        return {"short": self.decision, "misfit": self._state[1], "threshold": MISFIT,
                "decided_at": DECIDE_AT, "from": FROM, "warmup": WARMUP}

    def _post(self, short: bool, misfit: float) -> None:
        with self._cond:
            if self._state[0] == _UNDECIDED:
                self._state[1] = misfit
                self._state[0] = _SHORT if short else _FULL
            self._cond.notify_all()

    def _wait(self) -> bool:
        with self._cond:
            if not self._cond.wait_for(lambda: self._state[0] != _UNDECIDED, self.timeout):
                return False
            return self._state[0] == _SHORT


class FastWarmupMember:
    """Chain ``chain``'s side of a :class:`FastWarmup`: :meth:`__call__` at iteration
    :data:`DECIDE_AT` (``hmc_warmup``'s ``shorten``)."""

    at, start = DECIDE_AT, FROM

    def __init__(self, shared: FastWarmup, chain: int):
        self.shared, self.chain = shared, chain
        self.own_misfit: float | None = None
        self.short = False  # the chain's scale phase was shortened

    def __call__(self, draws: np.ndarray, grads: np.ndarray, divergent: int,
                 rule: int) -> bool:
        """Whether this chain's warmup is the short one: the first chain posts its
        decision (misfit below :data:`MISFIT` and fewer than ``rule`` divergent
        transitions in the last window), the others wait for it without measuring their
        own (on a cheap model of 100 parameters that would cost a tenth of a chain's
        time; ``comparisons/fast_warmup_decisions.py`` measures every chain's)."""
        if self.chain == 0:
            self.own_misfit = window_misfit(draws, grads)
            self.shared._post(self.own_misfit < MISFIT and divergent < rule, self.own_misfit)
        self.short = self.shared._wait()
        return self.short

    def leave(self) -> None:
        """The chain ends: if it was to decide and has not, the others take the full
        warmup."""
        if self.chain == 0:
            self.shared._post(False, float("nan"))

    def note(self) -> dict:
        return self.shared.note()
