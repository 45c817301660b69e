"""The sensitivity demonstration of Wang, Mohamed & de Freitas (2013), section 2, Figure 1:
plain HMC on the 2-d Gaussian at three nearby (ε, L)."""

from __future__ import annotations

import numpy as np

from ..model import StanModel

#: (ε, L) of Figure 1; all three have acceptance ≈ 0.7 in the paper, only the first mixes well.
SENSITIVITY_SETTINGS = ((0.16, 40), (0.16, 50), (0.15, 50))


def sensitivity_demo(model: StanModel, n_iter: int = 1000, seed: int = 2013,
                     settings=SENSITIVITY_SETTINGS) -> list[dict]:
    """Plain HMC (no jitter, identity metric) on the 2-d Gaussian at each (ε, L), from
    the same start and seed: draws, acceptance rate and autocorrelations."""
    from ..fit import _arviz
    from ..hmc import HMCKernel, HMCParameters

    az = _arviz()
    kernel = HMCKernel(model.density)
    out = []
    for eps, n_steps in settings:
        rng = np.random.default_rng(seed)
        start = kernel.init(np.zeros(model.dims))
        _, info = kernel.run(rng, start, HMCParameters(eps, n_steps, jitter=False), n_iter)
        x = info.positions
        ess = [float(az.ess(x[None, :, j])) for j in range(x.shape[1])]
        acf = np.array([az.autocorr(x[:, j])[:41] for j in range(x.shape[1])])
        out.append({"step_size": eps, "num_steps": n_steps, "draws": x,
                    "accept_rate": float(np.mean(info.acceptance_rate)),
                    "min_ess": min(ess), "min_ess_per_grad": min(ess) / float(np.sum(info.num_grad)),
                    "acf": acf})
    return out


