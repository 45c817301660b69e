"""Figures of a Fit: the Bayesian-optimisation tuner's view of Γ, and ArviZ's trace and
rank plots."""

from __future__ import annotations

import numpy as np

from .tuning import Box, Dimension, GaussianProcess

__all__ = ["plot_tuning", "tuning_surface", "plot_trace"]


def _tuning_history(fit, chain: int) -> tuple[dict, dict[str, list]]:
    """The chain's tuning record and its history by column (a fit saved before stop 77
    keeps one dict per reward)."""
    chains = fit.metadata.get("chains") or []
    history = chains[chain].get("tuning_history") if chain < len(chains) else None
    if isinstance(history, list):
        history = {key: [row[key] for row in history] for key in (history or [{}])[0]}
    if not history or not history.get("reward"):
        raise ValueError(f"the fit has no tuning history for chain {chain} "
                         f"(sampler {fit.sampler!r} is not tuned by Bayesian optimisation)")
    return chains[chain], history


def tuning_surface(fit, chain: int = 0, resolution: int = 60):
    """The GP posterior mean of the reward over Γ, refitted from the chain's history.

    Returns (box, axis values per dimension, mean on the grid (first axis × second),
    tried points (n, 2), rewards, moved flags).
    """
    record, history = _tuning_history(fit, chain)
    box = Box([Dimension(name, low, high, integer=bool(integer))
               for name, low, high, integer in record["box"]])
    tried = np.array([history[f"gamma_{d.name}"] for d in box.dims], float).T
    rewards = np.array(history["reward"], float)
    gp_settings = record.get("gp", {})
    gp = GaussianProcess(np.full(box.ndim, gp_settings.get("kappa", 0.2)),
                         noise_var=gp_settings.get("noise_var", 0.1))
    for x, r in zip(tried, rewards):
        gp.add(box.to_unit(x), r)
    axes = [np.linspace(d.low, d.high, resolution) for d in box.dims]
    mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, box.ndim)
    mean = gp.predict(np.array([box.to_unit(p) for p in mesh]), return_var=False)
    moved = np.array(history["moved"], bool)
    return box, axes, mean.reshape(resolution, resolution), tried, rewards, moved


def plot_tuning(fit, chain: int = 0, path=None):
    """Left: the GP's mean reward over Γ with the tried γ_i (like Figure 4.1 of Wang's
    thesis); right: the reward trace r_i, moves of the bandit marked.  Saved to ``path``
    if given; returns the matplotlib Figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    box, axes, mean, tried, rewards, moved = tuning_surface(fit, chain)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    contour = left.contourf(axes[0], axes[1], mean.T, levels=20, cmap="viridis")
    fig.colorbar(contour, ax=left, label="GP mean reward  ESJD/√L")
    unique, counts = np.unique(tried, axis=0, return_counts=True)
    left.scatter(unique[:, 0], unique[:, 1], s=8 + 4 * np.sqrt(counts), c="white",
                 edgecolors="black", linewidths=0.5, label="tried γ (size: blocks)")
    left.scatter(*tried[-1], marker="*", s=160, c="red", label="last γ")
    left.set_xlabel(box.dims[0].name)
    left.set_ylabel(box.dims[1].name)
    left.set_title(f"{fit.sampler}: reward surface, chain {chain + 1}")
    left.legend(loc="upper right", fontsize=8)
    blocks = np.arange(1, len(rewards) + 1)
    right.plot(blocks, rewards, lw=0.6, color="gray", label="block reward r_i")
    right.scatter(blocks[moved], rewards[moved], s=10, color="C1", zorder=3,
                  label="bandit moved γ")
    right.set_xlabel("block i")
    right.set_ylabel("r_i")
    right.set_title("reward trace")
    right.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_trace(fit, var_names=None, kind: str = "trace", path=None):
    """ArviZ's trace (``kind="trace"``) or rank (``kind="rank_bars"``) plot of the fit."""
    import arviz as az
    import matplotlib.pyplot as plt

    axes = az.plot_trace(fit.to_arviz(), var_names=var_names, kind=kind)
    fig = np.asarray(axes).ravel()[0].figure
    if path is not None:
        fig.savefig(path, dpi=120)
    plt.close(fig) if path is not None else None
    return fig
