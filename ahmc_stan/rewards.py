"""The predictive reward of the GP-bandit sampler: cross-validation error (Wang 2012, §3.2).

"We divide the data into n sets, and train n BNNs each on n − 1 sets and test them on the
remaining set ... During each super-transition, we draw samples for each of the BNNs and
calculate the mean cross-validation error by using only the samples drawn in this
super-transition."  The pieces, each usable alone:

* :func:`fold_indices` / :func:`fold_data` — n deterministic, disjoint, contiguous folds
  covering the cases (as the thesis code's ``train_range``), and the Stan data of the model
  conditioned on the other n − 1 folds with the held-out fold as its test set;
* :func:`predictions` — a generated-quantities variable (the held-out prediction) of a
  block of unconstrained draws;
* :func:`cv_error` — the mean over folds of the loss of the *posterior predictive mean*
  (the draws' average prediction, as Neal's ``net-pred``) against the held-out targets,
  with :func:`mean_squared_error` or :func:`classification_error`;
* :class:`CVReward` — error → reward on the scale of the bandit's GP;
* :func:`fold_models` and :class:`CrossValidation` put these together for a sampler.

The other built-in reward, AHMC's normalised ESJD, is
:func:`ahmc_stan.samplers.tuned_blocks.esjd_reward`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

__all__ = ["fold_indices", "fold_data", "mean_squared_error", "classification_error",
           "LOSSES", "variable_draws", "predictions", "cv_error", "CVReward", "fold_models",
           "CrossValidation"]


# ---- folds ----------------------------------------------------------------------------------

def fold_indices(n_cases: int, folds: int) -> list[np.ndarray]:
    """Case indices of each of ``folds`` contiguous folds of ``range(n_cases)``, sizes
    differing by at most one (``numpy.array_split``): disjoint, covering, deterministic."""
    if not 2 <= folds <= n_cases:
        raise ValueError(f"need 2 <= folds <= n_cases, got folds={folds}, n_cases={n_cases}")
    return np.array_split(np.arange(n_cases), folds)


def fold_data(data: Mapping, held_out: np.ndarray, *, case_vars: Sequence[str],
              n_var: str = "N", suffix: str = "_test") -> dict:
    """``data`` with the cases ``held_out`` moved to the test set: each per-case variable
    ``v`` in ``case_vars`` (first axis = case) keeps the other cases and ``v + suffix``
    gets the held-out ones; ``n_var`` and ``n_var + suffix`` are the two counts.  Other
    variables (including any test set of ``data``) are replaced or kept as they are."""
    n = int(data[n_var])
    keep = np.setdiff1d(np.arange(n), held_out)
    out = dict(data)
    out[n_var], out[n_var + suffix] = len(keep), len(held_out)
    for var in case_vars:
        values = np.asarray(data[var])
        if values.shape[:1] != (n,):
            raise ValueError(f"case variable {var!r} has {values.shape[:1]} rows, "
                             f"{n_var} = {n}")
        out[var], out[var + suffix] = values[keep], values[held_out]
    return out


# ---- losses ---------------------------------------------------------------------------------

def mean_squared_error(prediction: np.ndarray, target: np.ndarray) -> float:
    """Mean over cases (first axis) of the squared error summed over a case's outputs —
    Neal's convention, which the thesis's Table 4.1 uses (for the robot arm the noise
    alone contributes 2 × 0.05² = 0.005)."""
    diff = np.asarray(prediction, float) - np.asarray(target, float)
    return float(np.mean(np.sum(diff.reshape(len(diff), -1) ** 2, axis=1)))


def classification_error(prediction: np.ndarray, target: np.ndarray) -> float:
    """Fraction of cases misclassified.  ``prediction`` holds class probabilities: shape
    ``(n,)`` for P(y = 1) with 0/1 targets (threshold 0.5), or ``(n, K)`` with targets in
    1..K (Stan's labels; the most probable class is the guess)."""
    prediction, target = np.asarray(prediction, float), np.asarray(target)
    guess = (prediction > 0.5).astype(int) if prediction.ndim == 1 else (
        np.argmax(prediction, axis=1) + 1)
    return float(np.mean(guess != target.reshape(guess.shape)))


#: Losses by name.
LOSSES: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "mse": mean_squared_error, "classification": classification_error}


# ---- predictions from draws -----------------------------------------------------------------

def variable_draws(values: np.ndarray, names: Sequence[str], var: str) -> np.ndarray:
    """The Stan variable ``var`` of constrained draws ``values`` (rows; columns named as
    ``StanModel.param_names``, ``v.i.j`` for ``v[i, j]``): shape ``(draws, *dims)``."""
    values = np.asarray(values)
    if var in names:
        return values[:, list(names).index(var)].copy()
    cols = [j for j, n in enumerate(names) if n.startswith(var + ".")]
    if not cols:
        raise KeyError(f"no variable {var!r} among the model's outputs")
    index = np.array([[int(i) - 1 for i in names[j][len(var) + 1:].split(".")]
                      for j in cols])
    out = np.empty((len(values), *(index.max(axis=0) + 1)))
    out[(slice(None), *index.T)] = values[:, cols]
    return out


def predictions(model, positions: np.ndarray, var: str, rng: np.random.Generator
                ) -> np.ndarray:
    """``var`` (a generated quantity) at each unconstrained draw (rows of ``positions``)."""
    names = model.param_names(include_tp=True, include_gq=True)
    values = model.constrain(np.atleast_2d(positions), include_tp=True, include_gq=True,
                             rng=rng)
    return variable_draws(values, names, var)


def cv_error(fold_predictions: Sequence[np.ndarray], fold_targets: Sequence[np.ndarray],
             loss: str | Callable = "mse") -> float:
    """Mean over folds of ``loss(mean prediction over the fold's draws, held-out targets)``;
    ``fold_predictions[j]`` has shape ``(draws, *target shape)``."""
    loss = LOSSES[loss] if isinstance(loss, str) else loss
    return float(np.mean([loss(np.mean(p, axis=0), t)
                          for p, t in zip(fold_predictions, fold_targets, strict=True)]))


# ---- error -> reward ------------------------------------------------------------------------

@dataclass
class CVReward:
    """``r = (e_ref − e) / (unit · e_ref)``: minus the CV error, shifted and scaled so that
    the GP's unit prior sd is a ``unit`` (default 10 %) relative change of a reference
    error ``e_ref`` and its zero prior mean is "as good as the reference".  ``e_ref`` is
    the first error scored unless given.  The thesis states no scale; its authors' code
    used the same affine form, ``(0.01 − e)·1000`` for the robot arm (ziyuw/AHMC,
    ``control.py``).  A zero reference error falls back to ``e_ref = 1``."""

    ref: float | None = None
    unit: float = 0.1

    def __call__(self, error: float) -> float:
        if not math.isfinite(error):
            raise ValueError(f"the cross-validation error is not finite: {error}")
        if self.ref is None:
            self.ref = float(error) if error > 0 else 1.0
        return (self.ref - float(error)) / (self.unit * self.ref)


# ---- the cross-validation reward of a sampler ------------------------------------------------

def fold_models(model, folds: int, *, case_vars: Sequence[str], target: str,
                n_var: str = "N", suffix: str = "_test") -> tuple[list, list[np.ndarray]]:
    """The ``folds`` copies of ``model`` (a StanModel) conditioned on the other folds
    (:func:`fold_data`) and each copy's held-out targets, the data variable ``target``."""
    from .model import StanModel

    data = model.data
    seed, stanc_args, include_paths = model._init_args  # the model's build options
    copies, targets = [], []
    for held_out in fold_indices(int(data[n_var]), folds):
        fold = fold_data(data, held_out, case_vars=case_vars, n_var=n_var, suffix=suffix)
        copies.append(StanModel(model.stan_file, fold, seed=seed, stanc_args=stanc_args,
                                include_paths=include_paths))
        targets.append(np.asarray(fold[target]))
    return copies, targets


class CrossValidation:
    """Reward of a round from the draws of the fold copies (thesis §3.2): for each copy j,
    ``prediction`` (a generated quantity) at its draws, averaged, scored by ``loss``
    against ``targets[j]``; the mean over folds is the CV error (kept in ``errors``) and
    :class:`CVReward` maps it to the reward."""

    def __init__(self, models: Sequence, targets: Sequence[np.ndarray], prediction: str, *,
                 loss: str | Callable = "mse", unit: float = 0.1, ref: float | None = None,
                 rng: np.random.Generator | int = 0):
        self.models, self.targets = list(models), [np.asarray(t) for t in targets]
        self.prediction, self.loss = prediction, loss
        self.scale = CVReward(ref, unit)
        self.rng = np.random.default_rng(rng)
        self.errors: list[float] = []

    def error(self, fold_positions: Sequence[np.ndarray]) -> float:
        """The CV error of one block of draws per fold (unconstrained, rows)."""
        preds = [predictions(m, x, self.prediction, self.rng)
                 for m, x in zip(self.models, fold_positions, strict=True)]
        return cv_error(preds, self.targets, self.loss)

    def __call__(self, fold_positions: Sequence[np.ndarray]) -> float:
        self.errors.append(self.error(fold_positions))
        return self.scale(self.errors[-1])
