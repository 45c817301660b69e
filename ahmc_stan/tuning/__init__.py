"""Sampler-agnostic tuners: propose parameters, receive rewards.

The Bayesian-optimisation bandit of adaptive HMC (Wang, Mohamed & de Freitas, ICML 2013,
Section 3, Algorithm 2) and its thesis variant (Wang 2012, §3.3).  Nothing here knows about
HMC or Stan; a sampler calls :meth:`BayesOptTuner.propose` before a block and
:meth:`BayesOptTuner.update` with the block's reward after it.
:class:`NativeBayesOptTuner` is the same tuner held in C++ in a model's library.
"""

from .bayesopt import (
    BayesOptTuner,
    TunerRecord,
    annealing_probability_ahmc,
    annealing_probability_exponential,
    beta_schedule,
    maximize_direct,
    maximize_grid,
    ucb,
)
from .box import Box, Dimension
from .gp import DEFAULT_NOISE_VAR, GaussianProcess, se_ard_kernel
from .native_tuner import NativeBayesOptTuner

__all__ = [
    "Box",
    "Dimension",
    "GaussianProcess",
    "se_ard_kernel",
    "DEFAULT_NOISE_VAR",
    "BayesOptTuner",
    "NativeBayesOptTuner",
    "TunerRecord",
    "beta_schedule",
    "annealing_probability_ahmc",
    "annealing_probability_exponential",
    "ucb",
    "maximize_grid",
    "maximize_direct",
]
