"""nutpie as a peer: our compiled library sampled by nutpie, returned as our Fit."""

import json

import numpy as np
import pytest

from ahmc_stan import compare
from ahmc_stan.peers import run_nutpie, run_peer

from .conftest import stan_model_path
from .stats_util import assert_moments

nutpie = pytest.importorskip("nutpie")


@pytest.fixture(scope="module")
def nutpie_fit(mvn_model):
    return run_nutpie(mvn_model, chains=2, warmup=500, draws=1000, seed=4)


@pytest.mark.parametrize("low_rank", [False, True])
def test_recovers_correlated_gaussian(mvn_model, mvn_data, nutpie_fit, low_rank):
    fit = nutpie_fit if not low_rank else run_nutpie(
        mvn_model, chains=2, warmup=500, draws=1000, seed=5, low_rank=True)
    assert fit.sampler == ("nutpie_lowrank" if low_rank else "nutpie")
    assert fit.draws.shape == (2, 1000, 3) and fit.warmup_draws.shape == (2, 500, 3)
    assert fit.param_names == ["x[1]", "x[2]", "x[3]"]
    assert_moments(fit.params, np.asarray(mvn_data["mu"]),
                   np.sqrt(np.diag(mvn_data["Sigma"])))
    assert fit.diagnose().converged


def test_gradients_are_nutpies_steps_and_seed_reproduces(mvn_model, nutpie_fit):
    """n_grad is nutpie's own n_steps, draw by draw, read from a direct nutpie run of
    the same library and seed; the same seed gives the same draws."""
    from nutpie import _lib
    from nutpie.compile_stan import CompiledStanModel

    compiled = CompiledStanModel(
        code=mvn_model.stan_file.read_text(), library=_lib.StanLibrary(
            str(mvn_model.lib_path)), dims={}, _coords={}, model_name=mvn_model.name,
        model=None, data=None).with_data(**json.loads(mvn_model.data_json))
    raw = nutpie.sample(compiled, chains=2, tune=500, draws=1000, seed=4, cores=2,
                        progress_bar=False, save_warmup=True)
    np.testing.assert_array_equal(nutpie_fit.sampler_stats["n_grad"],
                                  raw.sample_stats["n_steps"].values)
    assert nutpie_fit.n_grad_warmup == int(raw.warmup_sample_stats["n_steps"].sum())
    np.testing.assert_allclose(nutpie_fit.draws[:, :, 0], raw.posterior["x"].values[..., 0])
    again = run_nutpie(mvn_model, chains=2, warmup=500, draws=1000, seed=4)
    np.testing.assert_array_equal(again.draws, nutpie_fit.draws)
    assert nutpie_fit.efficiency()["min_ess_per_grad"] > 0


def test_stan_names_of_options(mvn_model):
    fit = run_nutpie(mvn_model, chains=1, warmup=300, draws=200, seed=1,
                     adapt_delta=0.95, max_treedepth=3, diagnose=False)
    assert fit.sampler_stats["treedepth"].max() <= 3
    assert fit.metadata["options"] == {"target_accept": 0.95, "maxdepth": 3}


def test_compare_cli_with_peers(tmp_path, capsys):
    from ahmc_stan.cli import main

    data = tmp_path / "d.json"
    data.write_text('{"D": 4}')
    status = main(["compare", str(stan_model_path("std_normal")), "--data", str(data),
                   "--samplers", "ahmc", "--peers", "nuts,nutpie,nutpie_lowrank",
                   "--chains", "2", "--warmup", "300", "--draws", "300", "--seed", "2"])
    out = capsys.readouterr().out
    assert status == 0
    table = out[out.index("| fit"):]
    for name in ("ahmc", "nuts", "nutpie", "nutpie_lowrank"):
        assert f"| {name} " in table
    with pytest.raises(ValueError, match="unknown peer 'stan'"):
        run_peer("stan", None)


def test_compare_ranks_nutpie_beside_nuts(mvn_model, nutpie_fit):
    from ahmc_stan import run_nuts

    nuts = run_nuts(mvn_model, chains=2, warmup=500, draws=1000, seed=4)
    table = compare({"nuts": nuts, "nutpie": nutpie_fit})
    assert set(table.index) == {"nuts", "nutpie"}
    assert table.loc["nuts", "min_ess_per_grad / NUTS"] == 1
    assert np.isfinite(table.loc["nutpie", "min_ess_per_s / NUTS"])


def test_nutpie_warmup_defaults_to_nutpies_own(mvn_model):
    """Without ``warmup`` nutpie tunes for its own default (400 iterations with its
    diagonal mass matrix), and the Fit says how many it ran."""
    fit = run_nutpie(mvn_model, chains=1, draws=50, seed=2)
    assert fit.metadata["warmup"] == fit.warmup_draws.shape[1] == 400
