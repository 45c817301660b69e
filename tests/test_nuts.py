"""CmdStan's NUTS as the baseline: correctness of the draws, the column mapping and the cost.

Every test needs CmdStan (the README's setup installs it).  Two models are compiled with
CmdStan, once per session (about a minute each the first time; later sessions reuse the
cached executables): ``mvn.stan`` and ``constrained.stan``.
"""

import json
import math
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ahmc_stan import Fit, load_fit, run_nuts
from ahmc_stan.fit import stan_name
from ahmc_stan.nuts import CmdStanCompileError, _partial_fit, compile_cmdstan_model

from .conftest import stan_model_path

pytestmark = pytest.mark.cmdstan

CHAINS, WARMUP, DRAWS = 2, 500, 500
SEED = 20261122


@pytest.fixture(scope="session")
def cmdstan_home():
    from ahmc_stan.cmdstan_setup import ensure_cmdstan

    return Path(ensure_cmdstan(verbose=True))


@pytest.fixture(scope="session")
def mvn_run(cmdstan_home, mvn_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("mvn_csv")
    fit = run_nuts(mvn_model, chains=CHAINS, warmup=WARMUP, draws=DRAWS, seed=SEED,
                   output_dir=str(out))
    return fit, out


@pytest.fixture(scope="session")
def mvn_fit(mvn_run):
    return mvn_run[0]


@pytest.fixture(scope="session")
def constrained_fit(cmdstan_home, constrained_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("constrained_csv")
    return run_nuts(constrained_model, chains=CHAINS, warmup=300, draws=300, seed=SEED,
                    output_dir=str(out), adapt_delta=0.9)


def read_csv(path):
    """A CmdStan CSV read independently of ahmc_stan (pandas), with its comment lines."""
    text = Path(path).read_text()
    df = pd.read_csv(path, comment="#")
    return df, text


# ---- the mvn target ----------------------------------------------------------------------

def test_shapes_names_and_metadata(mvn_fit, mvn_model, cmdstan_home):
    fit = mvn_fit
    assert isinstance(fit, Fit) and fit.sampler == "nuts" and not fit.incomplete
    assert fit.draws.shape == (CHAINS, DRAWS, 3)
    assert fit.warmup_draws.shape == (CHAINS, WARMUP, 3)
    assert fit.columns == mvn_model.param_names() == ["x.1", "x.2", "x.3"]
    assert fit.param_names == ["x[1]", "x[2]", "x[3]"]
    assert fit.n_params == 3
    for name in ("accept_stat", "step_size", "n_grad", "divergent", "treedepth", "energy",
                 "lp"):
        assert fit.sampler_stats[name].shape == (CHAINS, DRAWS)
        assert fit.warmup_sampler_stats[name].shape == (CHAINS, WARMUP)
    assert fit.sampler_stats["n_grad"].dtype.kind == "i"
    assert fit.metadata["seed"] == SEED
    assert fit.metadata["cmdstan_version"] == "2.27.0"
    assert fit.metadata["metric_type"] == "diag_e"
    assert np.shape(fit.metadata["inv_metric"]) == (CHAINS, 3)
    # after warmup the step size is the adapted one, constant within a chain
    steps = fit.sampler_stats["step_size"]
    assert np.all(steps == steps[:, :1])
    np.testing.assert_allclose(steps[:, 0], fit.metadata["step_size_adapted"], rtol=1e-5)


def test_recovers_mean_and_marginal_sd(mvn_fit, mvn_data):
    """Each coordinate's mean within 4 MCSE of mu and its sd within 4 MCSE(sd) of
    sqrt(Sigma_ii).

    MCSE(sd) is ArviZ's ``mcse(method="sd")``: the delta method on the variance estimate,
    MCSE(sd) = sqrt(Var((x - m)^2) / ESS((x - m)^2)) / (2 sd), i.e. the Monte Carlo error
    of the mean of the squared deviations (whose ESS ArviZ estimates from the draws)
    carried through the square root.  For a Gaussian whose squared deviations have ESS n
    this is ≈ sd / sqrt(2 n).  (NUTS's ESS for the squares is usually well below its bulk
    ESS for the mean, so MCSE(sd) is not sd / sqrt(2 ess_bulk).)
    With 6 independent checks at 4 MCSE the chance of a spurious failure is < 1e-3, and
    the seed is fixed.
    """
    summary = mvn_fit.summary()
    mu = np.asarray(mvn_data["mu"])
    sd = np.sqrt(np.diag(mvn_data["Sigma"]))
    for i, name in enumerate(mvn_fit.param_names):
        row = summary.loc[stan_name(name)]
        assert abs(row["mean"] - mu[i]) < 4 * row["mcse_mean"], (name, row)
        assert abs(row["sd"] - sd[i]) < 4 * row["mcse_sd"], (name, row)
        assert 0 < row["mcse_sd"] < 0.1 * row["sd"]
    assert summary["r_hat"].max() < 1.02
    # the full covariance too, loosely
    flat = mvn_fit.draws.reshape(-1, 3)
    np.testing.assert_allclose(np.cov(flat.T), mvn_data["Sigma"], atol=0.15)


def test_gradient_totals_match_the_csv(mvn_run):
    fit, out = mvn_run
    files = sorted(fit.metadata["csv_files"])
    assert len(files) == CHAINS and all(Path(f).parent == out for f in files)
    warm_total = samp_total = 0
    warm_time = samp_time = 0.0
    for chain, path in enumerate(files):
        df, text = read_csv(path)
        assert len(df) == WARMUP + DRAWS
        leap = df["n_leapfrog__"].to_numpy()
        warm_total += int(leap[:WARMUP].sum())
        samp_total += int(leap[WARMUP:].sum())
        np.testing.assert_array_equal(fit.warmup_sampler_stats["n_grad"][chain],
                                      leap[:WARMUP])
        np.testing.assert_array_equal(fit.sampler_stats["n_grad"][chain], leap[WARMUP:])
        np.testing.assert_array_equal(fit.sampler_stats["divergent"][chain],
                                      df["divergent__"].to_numpy()[WARMUP:])
        np.testing.assert_array_equal(fit.draws[chain, :, 1], df["x.2"].to_numpy()[WARMUP:])
        warm_time += float(next(line for line in text.splitlines()
                                if "(Warm-up)" in line).split()[-3])
        samp_time += float(next(line for line in text.splitlines()
                                if "(Sampling)" in line).split()[-3])
    assert fit.n_grad_warmup == warm_total
    assert fit.n_grad_sampling == samp_total
    assert fit.n_grad_warmup + fit.n_grad_sampling == warm_total + samp_total
    e = fit.efficiency()
    assert e["n_grad_warmup"] == warm_total and e["n_grad_sampling"] == samp_total
    assert fit.time_warmup == pytest.approx(warm_time, abs=1e-9)
    assert fit.time_sampling == pytest.approx(samp_time, abs=1e-9)
    assert fit.time_sampling > 0


def test_efficiency_matches_direct_arviz(mvn_fit):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz as az

    bulk = [float(az.ess(mvn_fit.draws[:, :, j], method="bulk")) for j in range(3)]
    tail = [float(az.ess(mvn_fit.draws[:, :, j], method="tail")) for j in range(3)]
    e = mvn_fit.efficiency()
    assert e["min_ess_bulk"] == pytest.approx(min(bulk), rel=1e-12)
    assert e["min_ess_tail"] == pytest.approx(min(tail), rel=1e-12)
    assert e["min_ess_per_grad"] == pytest.approx(min(bulk) / mvn_fit.n_grad_sampling)
    assert e["min_ess_per_grad_total"] == pytest.approx(
        min(bulk) / (mvn_fit.n_grad_warmup + mvn_fit.n_grad_sampling))
    assert e["min_ess_per_s"] == pytest.approx(min(bulk) / mvn_fit.time_sampling)
    assert e["divergences"] == int(mvn_fit.sampler_stats["divergent"].sum()) == 0
    assert 0.6 < e["accept_rate"] < 0.99
    assert e["chains"] == CHAINS and e["draws"] == DRAWS
    # a sane baseline: a 3-d Gaussian mixes well
    assert e["min_ess_bulk"] > 0.2 * CHAINS * DRAWS


def test_save_load(mvn_fit, tmp_path):
    back = load_fit(mvn_fit.save(tmp_path / "nuts.npz"))
    np.testing.assert_array_equal(back.draws, mvn_fit.draws)
    np.testing.assert_array_equal(back.warmup_draws, mvn_fit.warmup_draws)
    for k, v in mvn_fit.sampler_stats.items():
        np.testing.assert_array_equal(back.sampler_stats[k], v)
    for k, v in mvn_fit.warmup_sampler_stats.items():
        np.testing.assert_array_equal(back.warmup_sampler_stats[k], v)
    np.testing.assert_array_equal(back.metadata["inv_metric"], mvn_fit.metadata["inv_metric"])
    assert back.metadata["seed"] == SEED
    assert back.metadata["time_per_chain"] == mvn_fit.metadata["time_per_chain"]
    assert back.efficiency() == mvn_fit.efficiency()
    pd.testing.assert_frame_equal(back.summary(), mvn_fit.summary())


def test_seed_is_drawn_recorded_and_reproducible(cmdstan_home, mvn_model):
    first = run_nuts(mvn_model, chains=1, warmup=100, draws=50)
    seed = first.metadata["seed"]
    assert isinstance(seed, int) and 0 < seed < 2**31
    again = run_nuts(mvn_model, chains=1, warmup=100, draws=50, seed=seed)
    np.testing.assert_array_equal(first.draws, again.draws)
    np.testing.assert_array_equal(first.sampler_stats["n_grad"], again.sampler_stats["n_grad"])


def test_warmup_none_is_cmdstans_default(cmdstan_home, mvn_model):
    fit = run_nuts(mvn_model, chains=1, warmup=None, draws=20, seed=3, diagnose=False)
    assert fit.metadata["warmup"] == 1000 and fit.warmup_draws.shape[1] == 1000


def test_interrupted_run_gives_an_incomplete_fit(mvn_run, mvn_model, tmp_path):
    """What run_nuts does on Ctrl-C: the CSVs written so far, cut to the shortest chain."""
    fit, out = mvn_run
    for i, path in enumerate(sorted(fit.metadata["csv_files"])):
        lines = Path(path).read_text().splitlines(keepends=True)
        header = next(j for j, line in enumerate(lines) if not line.startswith("#"))
        # keep the comments, warmup, the adaptation comments and 120 + 10 i sampling rows,
        # then half a line, as a killed process leaves it
        rows = [j for j, line in enumerate(lines[header + 1:], header + 1)
                if not line.startswith("#")]
        keep = rows[WARMUP + 120 + 10 * i]
        text = "".join(lines[:keep]) + lines[keep][: len(lines[keep]) // 2]
        (tmp_path / Path(path).name).write_text(text)
    part = _partial_fit(mvn_model, tmp_path, WARMUP, dict(fit.metadata))
    assert part.incomplete
    assert part.draws.shape == (CHAINS, 120, 3)
    np.testing.assert_array_equal(part.draws, fit.draws[:, :120])
    np.testing.assert_array_equal(part.warmup_draws, fit.warmup_draws)
    assert part.n_grad_sampling == int(fit.sampler_stats["n_grad"][:, :120].sum())
    assert math.isnan(part.time_sampling)  # a killed chain never writes its times
    assert "INCOMPLETE" in part.efficiency_line()
    # before any sampling draw there is nothing to return
    for path in tmp_path.glob("*.csv"):
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(lines[:60]))
    assert _partial_fit(mvn_model, tmp_path, WARMUP, {}) is None


# ---- vector and matrix parameters, constraints ---------------------------------------------

def test_columns_line_up_with_stanmodel(constrained_fit, constrained_model):
    fit = constrained_fit
    names = constrained_model.param_names()
    assert names[:2] == ["sigma", "p"] and len(names) == 8
    assert fit.columns == names + ["sigma_sq"]
    assert fit.param_names[:4] == ["sigma", "p", "M[1,1]", "M[2,1]"]  # Stan's names
    assert fit.n_params == 8
    rng = np.random.default_rng(0)
    for chain, draw in zip(rng.integers(CHAINS, size=20), rng.integers(300, size=20)):
        row = fit.draws[chain, draw, :8]
        # a valid constrained point in StanModel's order: unconstrain and constrain back
        x = constrained_model.unconstrain(row)
        np.testing.assert_allclose(constrained_model.constrain(x), row, rtol=1e-9,
                                   atol=1e-12)
        # the generated quantity belongs to this row (CmdStan prints 6 significant digits)
        assert fit.draws[chain, draw, 8] == pytest.approx(row[0] ** 2, rel=2e-5)
    assert np.all(fit.column("sigma") > 0)
    assert np.all((fit.column("p") > 0) & (fit.column("p") < 1))


def test_matrix_layout_matches_cmdstanpy(constrained_fit):
    import cmdstanpy

    mcmc = cmdstanpy.from_csv(constrained_fit.metadata["csv_files"])
    M = mcmc.stan_variable("M")  # (chains * draws, 2, 3), chain after chain
    assert M.shape == (CHAINS * 300, 2, 3)
    M = M.reshape(CHAINS, 300, 2, 3)
    for i in range(2):
        for j in range(3):
            np.testing.assert_array_equal(constrained_fit.column(f"M.{i + 1}.{j + 1}"),
                                          M[:, :, i, j])
    post = constrained_fit.to_arviz().posterior
    np.testing.assert_array_equal(post["M"].values, M)
    np.testing.assert_array_equal(post["sigma"].values,
                                  mcmc.stan_variable("sigma").reshape(CHAINS, 300))


# ---- errors and the command line ----------------------------------------------------------

TOO_NEW = """\
// tuples arrived in Stan 2.33: CmdStan 2.27's stanc rejects this program
parameters {
  real x;
}
model {
  tuple(real, real) t = (x, 1.0);
  x ~ normal(t.2, 1);
}
"""


def test_too_new_syntax_gives_a_clear_error(cmdstan_home, tmp_path):
    stan_file = tmp_path / "tuples.stan"
    stan_file.write_text(TOO_NEW)
    with pytest.raises(ValueError) as info:
        compile_cmdstan_model(stan_file)
    err = info.value
    assert isinstance(err, CmdStanCompileError)
    message = str(err)
    assert "CmdStan 2.27.0's stanc rejected" in message
    assert "accepted by stanc 2.27" in message
    assert "tuples.stan" in message and "line 6" in message  # stanc's own diagnosis
    # run_nuts raises the same error before sampling
    with pytest.raises(CmdStanCompileError):
        run_nuts(types.SimpleNamespace(stan_file=stan_file, data_json=""), chains=1)


def test_cli_nuts(cmdstan_home, mvn_data, tmp_path, capsys):
    from ahmc_stan.cli import main

    data = tmp_path / "mvn.json"
    data.write_text(json.dumps({k: np.asarray(v).tolist() if not isinstance(v, int) else v
                                for k, v in mvn_data.items()}))
    out = tmp_path / "fit.npz"
    status = main(["nuts", str(stan_model_path("mvn")), "--data", str(data), "--chains", "1",
                   "--warmup", "150", "--draws", "100", "--seed", "3", "--output", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "x[1]" in printed and "ess_bulk" in printed and "95%" in printed \
        and "min ESS bulk" in printed
    fit = load_fit(out)
    assert fit.draws.shape == (1, 100, 3) and fit.metadata["seed"] == 3
