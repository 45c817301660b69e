"""Step-size adaptation as Stan does it: dual averaging (Hoffman & Gelman 2014,
Algorithm 5, eq. 6) towards a target acceptance statistic, with Stan's constants."""

from __future__ import annotations

import math

import numpy as np


class DualAveraging:
    """Nesterov dual averaging of log ε; ``update(accept_stat)`` returns the next ε and
    ``final`` the averaged ε to keep after adaptation."""

    def __init__(self, initial_step_size: float, target: float = 0.8, gamma: float = 0.05,
                 t0: float = 10.0, kappa: float = 0.75):
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.restart(initial_step_size)

    def restart(self, initial_step_size: float) -> None:
        self.mu = math.log(10 * initial_step_size)
        self.counter = 0
        self.s_bar = 0.0
        self.x_bar = 0.0
        self.step_size = initial_step_size

    def update(self, accept_stat: float) -> float:
        self.counter += 1
        accept_stat = min(1.0, accept_stat) if math.isfinite(accept_stat) else 0.0
        eta = 1.0 / (self.counter + self.t0)
        self.s_bar = (1 - eta) * self.s_bar + eta * (self.target - accept_stat)
        x = self.mu - self.s_bar * math.sqrt(self.counter) / self.gamma
        x_eta = self.counter ** (-self.kappa)
        self.x_bar = (1 - x_eta) * self.x_bar + x_eta * x
        self.step_size = math.exp(x)
        return self.step_size

    def state_array(self) -> np.ndarray:
        """``[mu, counter, s_bar, x_bar, log ε]``, the state the C++ warmup block
        (``ahmc_hmc_adapt_block``) advances."""
        return np.array([self.mu, self.counter, self.s_bar, self.x_bar,
                         math.log(self.step_size)])

    def params_array(self) -> np.ndarray:
        """``[target, gamma, t0, kappa]``."""
        return np.array([self.target, self.gamma, self.t0, self.kappa], dtype=float)

    def load_state_array(self, state) -> None:
        self.mu, counter, self.s_bar, self.x_bar, log_eps = (float(v) for v in state)
        self.counter = int(round(counter))
        self.step_size = math.exp(log_eps)

    @property
    def final(self) -> float:
        return math.exp(self.x_bar) if self.counter else self.step_size


def initial_step_size(log_accept, step_size: float = 1.0, target: float = 0.8) -> float:
    """Stan's heuristic (``base_hmc::init_stepsize``): double or halve ε until the
    acceptance probability of one leapfrog step crosses ``target``.

    ``log_accept(ε)`` returns log min(1, exp(-ΔH)) of a one-step trajectory from the
    current state with a fresh momentum.
    """
    log_target = math.log(target)
    direction = 1 if log_accept(step_size) > log_target else -1
    for _ in range(100):
        step_size = step_size * 2 if direction == 1 else step_size / 2
        if not 1e-7 < step_size < 1e7:
            break
        h = log_accept(step_size)
        if direction == 1 and not h > log_target:
            break
        if direction == -1 and not h < log_target:
            break
    return step_size
