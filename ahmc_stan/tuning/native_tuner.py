"""The Bayesian-optimisation tuner of AHMC in C++ (``csrc/ahmc_tuner.hpp``).

:class:`NativeBayesOptTuner` is :class:`~.bayesopt.BayesOptTuner` (Wang, Mohamed & de
Freitas 2013, Algorithm 2) with its GP and its moves computed in the model's library, so
that a sampler may run blocks *and* the tuner's moves in one call (``ahmc_tuned_hmc_block``,
:func:`ahmc_stan.samplers.ahmc.run_native_tuned_blocks`).  It is a drop-in for the Python
tuner: the same constructor options, the same uniforms drawn from the same Generator by
:meth:`update_many` and :meth:`updates_until_move`, the same history and marks, and the
same GP (:attr:`gp`, fed from the history when read).  The Python tuner stays the
reference: on the same rewards and uniforms both make the same moves with the grid
maximiser, up to acquisition values that tie to rounding on the grid.  With
``maximizer="direct"`` (the thesis's, used by the GP bandit) the C++ DIRECT
(``direct_minimise`` in ``csrc/ahmc_tuner.hpp``, Jones et al. 1993 with Gablonsky &
Kelley's locally biased choice) stands in for :func:`scipy.optimize.direct`, which calls
back into Python at each of its ~2000 points per move; the two are different codes of one
algorithm, so their moves are compared by the acquisition value they reach
(``tests/test_native_tuner.py``).
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from .bayesopt import BayesOptTuner, TunerRecord
from .box import Box
from .gp import DEFAULT_NOISE_VAR, GaussianProcess

__all__ = ["NativeBayesOptTuner"]


class NativeBayesOptTuner(BayesOptTuner):
    """:class:`~.bayesopt.BayesOptTuner` (grid or DIRECT maximiser) held in C++ in the
    library of ``density`` (a :class:`~ahmc_stan.native.NativeDensity`); the other
    arguments are :class:`~.bayesopt.BayesOptTuner`'s.  :attr:`handle` is the C++ tuner,
    which ``ahmc_tuned_hmc_block`` updates; :meth:`sync` then reads its state back."""

    def __init__(self, density, box: Box, rng=None, *, seed=None, k: int = 100,
                 alpha: float | None = 4.0, kappa: float = 0.2, delta: float = 0.1,
                 schedule: str = "ahmc", lam: float = 0.01, initial=None,
                 noise_var: float = DEFAULT_NOISE_VAR, grid_points: int = 20000,
                 grid_resolution: int = 200, maximizer: str = "grid",
                 direct_maxfun: int = 2000):
        if schedule not in ("ahmc", "exponential"):
            raise ValueError(f"the native tuner takes schedule 'ahmc' or 'exponential', "
                             f"not {schedule!r}")
        if maximizer not in ("grid", "direct"):
            raise ValueError(f"the native tuner takes maximizer 'grid' or 'direct', "
                             f"not {maximizer!r}")
        super().__init__(box, rng, seed=seed, k=k, alpha=alpha, kappa=kappa, delta=delta,
                         schedule=schedule, lam=lam, maximizer=maximizer, initial=initial,
                         noise_var=noise_var, grid_points=grid_points,
                         grid_resolution=grid_resolution, direct_maxfun=direct_maxfun)
        self._density = density  # keeps the library alive
        self._fn = {name: density.entry(f"ahmc_bo_{name}")
                    for name in ("update", "state", "history", "set", "predict")}
        if maximizer == "grid":
            grid = np.ascontiguousarray(box.grid(grid_points, grid_resolution), dtype=float)
            unit = np.ascontiguousarray(box.unit_grid(grid_points, grid_resolution),
                                        dtype=float)
        else:  # DIRECT: no grid
            grid = unit = np.zeros((0, box.ndim))
        config = np.array([self.kappa, noise_var, self._gp.signal_var,
                           math.nan if alpha is None else alpha, self.delta, self.k,
                           self.lam, 0 if schedule == "ahmc" else 1,
                           GaussianProcess.REFRESH_EVERY, 0 if maximizer == "grid" else 1,
                           direct_maxfun], dtype=float)
        low = np.ascontiguousarray(box.low, dtype=float)
        width = np.ascontiguousarray(box.width, dtype=float)
        integer = np.ascontiguousarray(box.is_integer, dtype=np.intc)
        current = np.ascontiguousarray(self._current, dtype=float)
        self.handle = density.entry("ahmc_bo_new")(
            box.ndim, low.ctypes.data, width.ctypes.data, integer.ctypes.data, len(grid),
            unit.ctypes.data, grid.ctypes.data, config.ctypes.data, current.ctypes.data)
        if not self.handle:
            raise MemoryError("could not create the native tuner")
        weakref.finalize(self, density.entry("ahmc_bo_free"), self.handle)
        self._n_grid = len(grid)
        self._state = np.zeros(7)
        self._current_buf = np.zeros(box.ndim)
        self._rows = np.empty((0, 7 + 2 * box.ndim))  # the history read so far
        self._fed = 0                                   # of which given to self._gp

    # ------------------------------------------------------------ state from C++
    def sync(self) -> None:
        """Read the C++ tuner's state (after ``ahmc_tuned_hmc_block`` moved it on)."""
        self._fn["state"](self.handle, self._state.ctypes.data,
                          self._current_buf.ctypes.data)
        self._i, self._s, self._r_max = int(self._state[0]), *self._state[1:3]
        self._frozen = bool(self._state[3])
        self.seconds = float(self._state[6])
        self._current = self._current_buf.copy()

    def history_array(self) -> np.ndarray:
        """The history as rows ``i, γ (d), reward, p, moved, s, β, next γ (d), u`` (u: the
        uniform that decided the move, NaN when frozen)."""
        n_rows = int(self._state[5])
        if n_rows > len(self._rows):
            new = np.empty((n_rows - len(self._rows), self._rows.shape[1]))
            self._fn["history"](self.handle, len(self._rows), len(new), new.ctypes.data)
            self._rows = np.vstack([self._rows, new])
        return self._rows

    @property
    def history(self) -> list[TunerRecord]:
        rows, d = self.history_array(), self.box.ndim
        kinds = [(name, int if integer else float)
                 for name, integer in zip(self.box.names, self.box.is_integer.tolist())]
        for row in rows[len(self._history):].tolist():
            self._history.append(TunerRecord(
                i=int(row[0]), gamma={n: kind(v) for (n, kind), v in zip(kinds, row[1:1 + d])},
                reward=row[1 + d], p=row[2 + d], moved=bool(row[3 + d]), s=row[4 + d],
                beta=row[5 + d],
                next_gamma={n: kind(v) for (n, kind), v in zip(kinds, row[6 + d:6 + 2 * d])}))
        return self._history

    def history_table(self) -> dict[str, list]:
        rows, d = self.history_array(), self.box.ndim
        table = {"i": rows[:, 0].astype(int).tolist()}
        for j, (name, integer) in enumerate(zip(self.box.names, self.box.is_integer)):
            table[f"gamma_{name}"] = rows[:, 1 + j].astype(int if integer else float).tolist()
        table.update(reward=rows[:, 1 + d].tolist(), p=rows[:, 2 + d].tolist(),
                     moved=rows[:, 3 + d].astype(bool).tolist(), s=rows[:, 4 + d].tolist())
        return table

    def moves_since(self, name: str) -> int | None:
        if name not in self.marks:
            return None
        return int(self.history_array()[self.marks[name]:, 3 + self.box.ndim].sum())

    @property
    def gp(self) -> GaussianProcess:
        """The Python GP, given the rewards the C++ tuner received (for :meth:`best`,
        :meth:`acquisition` and figures)."""
        rows, d = self.history_array(), self.box.ndim
        for row in rows[self._fed:]:
            self._gp.add(self.box.to_unit(row[1:1 + d]), float(row[1 + d]))
        self._fed = len(rows)
        return self._gp

    def predict_grid(self) -> tuple[np.ndarray, np.ndarray]:
        """The C++ GP's posterior mean and variance on the candidate grid
        (:meth:`~.box.Box.grid`), as its moves use them (empty with DIRECT)."""
        mean, var = np.empty(self._n_grid), np.empty(self._n_grid)
        self._fn["predict"](self.handle, mean.ctypes.data, var.ctypes.data)
        return mean, var

    # ------------------------------------------------------------ the algorithm
    def update_many(self, gamma, rewards) -> None:
        rewards = np.array([float(r) for r in rewards], dtype=float)
        bad = rewards[~np.isfinite(rewards)]
        if bad.size:
            raise ValueError(f"reward must be finite, got {bad[0]}")
        uniforms = np.zeros(len(rewards))
        if not self._frozen:
            for j in range(len(rewards)):
                uniforms[j] = self._queued_u.pop(0) if self._queued_u else self.rng.random()
        x = np.ascontiguousarray(self.box.snap(gamma), dtype=float)
        self._fn["update"](self.handle, x.ctypes.data, len(rewards), rewards.ctypes.data,
                           uniforms.ctypes.data)
        self.sync()

    def _push(self) -> None:
        current = np.ascontiguousarray(self._current, dtype=float)
        self._fn["set"](self.handle, current.ctypes.data, int(self._frozen))

    def freeze(self, to: str = "current") -> dict:
        gamma = super().freeze(to)
        self._push()
        return gamma

    def unfreeze(self) -> None:
        super().unfreeze()
        self._push()
