"""Fit, efficiency and comparison on synthetic draws (no CmdStan, no compiled model)."""

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from ahmc_stan.comparison import RATIO_COLUMNS, compare, to_markdown
from ahmc_stan.fit import Fit, load_fit

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

MATRIX_NAMES = ["sigma", "p"] + [f"M.{i}.{j}" for j in (1, 2, 3) for i in (1, 2)]


def stats(chains, draws, n_grad=7, rng=None, accept=0.8):
    rng = rng or np.random.default_rng(0)
    return {
        "accept_stat": np.full((chains, draws), accept),
        "step_size": np.full((chains, draws), 0.25),
        "n_grad": np.full((chains, draws), n_grad, dtype=np.int64),
        "divergent": np.zeros((chains, draws), dtype=np.int64),
        "treedepth": np.full((chains, draws), 3, dtype=np.int64),
        "lp": rng.normal(size=(chains, draws)),
    }


def ar1(rng, phi, chains, draws, cols):
    """Stationary AR(1) chains with unit marginal variance: ESS = n (1 - phi) / (1 + phi)."""
    x = np.empty((chains, draws, cols))
    x[:, 0] = rng.normal(size=(chains, cols))
    scale = math.sqrt(1 - phi**2)
    eps = rng.normal(size=(chains, draws, cols)) * scale
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + eps[:, t]
    return x


def iid_fit(seed=0, chains=4, draws=1000, cols=3, n_grad=7, sampler="nuts", **kw):
    rng = np.random.default_rng(seed)
    names = [f"x.{i + 1}" for i in range(cols)]
    return Fit(rng.normal(size=(chains, draws, cols)), names,
               stats(chains, draws, n_grad, rng), sampler=sampler, **kw)


# ---- ESS on known processes ------------------------------------------------------------

def test_iid_draws_have_ess_close_to_n():
    fit = iid_fit(chains=4, draws=1000, cols=5)
    summary = fit.summary()
    n = 4 * 1000
    assert ((summary["ess_bulk"] > 0.8 * n) & (summary["ess_bulk"] < 1.25 * n)).all()
    assert ((summary["ess_tail"] > 0.7 * n) & (summary["ess_tail"] < 1.4 * n)).all()
    assert (summary["r_hat"] < 1.01).all()
    assert np.allclose(summary["mean"], 0, atol=4 / math.sqrt(n))
    assert np.allclose(summary["sd"], 1, atol=0.06)


@pytest.mark.parametrize("phi", [0.5, 0.9])
def test_ar1_ess_matches_theory(phi):
    rng = np.random.default_rng(1)
    chains, draws = 4, 5000
    x = ar1(rng, phi, chains, draws, 4)
    fit = Fit(x, ["a", "b", "c", "d"], stats(chains, draws))
    theory = chains * draws * (1 - phi) / (1 + phi)
    ess = fit.summary()["ess_bulk"].to_numpy()
    assert np.all(ess > 0.75 * theory) and np.all(ess < 1.33 * theory), (ess, theory)
    e = fit.efficiency()
    assert e["min_ess_bulk"] == pytest.approx(ess.min())


def test_efficiency_equals_direct_arviz_calls():
    rng = np.random.default_rng(2)
    chains, draws = 3, 400
    # three parameters with different mixing, then a "generated quantity" that mixes
    # worst but must not enter the parameters-block ESS
    x = np.concatenate([ar1(rng, 0.2, chains, draws, 1), ar1(rng, 0.6, chains, draws, 1),
                        rng.normal(size=(chains, draws, 1)),
                        ar1(rng, 0.99, chains, draws, 1)], axis=2)
    st = stats(chains, draws, n_grad=5)
    st["n_grad"][0, :10] = 50
    fit = Fit(x, ["a", "b", "c", "gq"], st, n_params=3, n_grad_warmup=1234,
              time_warmup=2.0, time_sampling=4.0)
    bulk = [float(az.ess(x[:, :, j], method="bulk")) for j in range(3)]
    tail = [float(az.ess(x[:, :, j], method="tail")) for j in range(3)]
    rhat = [float(az.rhat(x[:, :, j])) for j in range(3)]
    e = fit.efficiency()
    n_grad = int(st["n_grad"].sum())
    assert e["n_grad_sampling"] == n_grad == chains * draws * 5 + 10 * 45
    assert e["n_grad_warmup"] == 1234
    assert e["min_ess_bulk"] == pytest.approx(min(bulk), rel=1e-12)
    assert e["median_ess_bulk"] == pytest.approx(np.median(bulk), rel=1e-12)
    assert e["max_ess_bulk"] == pytest.approx(max(bulk), rel=1e-12)
    assert e["min_ess_tail"] == pytest.approx(min(tail), rel=1e-12)
    assert e["max_rhat"] == pytest.approx(max(rhat), rel=1e-12)
    assert e["min_ess_per_grad"] == pytest.approx(min(bulk) / n_grad)
    assert e["min_ess_per_grad_total"] == pytest.approx(min(bulk) / (n_grad + 1234))
    assert e["min_ess_per_s"] == pytest.approx(min(bulk) / 4.0)
    assert e["min_ess_per_s_total"] == pytest.approx(min(bulk) / 6.0)
    assert e["chains"] == chains and e["draws"] == draws
    # the summary covers every column, the gq included
    summary = fit.summary()
    assert list(summary.index) == ["a", "b", "c", "gq"]
    assert summary.loc["gq", "ess_bulk"] == pytest.approx(
        float(az.ess(x[:, :, 3], method="bulk")))
    assert summary.loc["gq", "ess_bulk"] < min(bulk)
    mcse = float(az.mcse(x[:, :, 1], method="mean"))
    assert summary.loc["b", "mcse_mean"] == pytest.approx(mcse)


def test_divergences_accept_rate_and_n_grad_totals():
    chains, draws = 2, 100
    st = stats(chains, draws, n_grad=3)
    st["divergent"][1, [5, 50, 99]] = 1
    st["accept_stat"][0] = 0.5
    wst = stats(chains, 20, n_grad=11)
    wst["divergent"][:] = 1  # warmup divergences are not counted
    fit = Fit(np.random.default_rng(3).normal(size=(chains, draws, 2)), ["a", "b"], st,
              warmup_draws=np.zeros((chains, 20, 2)), warmup_sampler_stats=wst)
    e = fit.efficiency()
    assert e["divergences"] == 3
    assert e["accept_rate"] == pytest.approx((0.5 + 0.8) / 2)
    assert fit.n_grad_sampling == e["n_grad_sampling"] == chains * draws * 3
    assert fit.n_grad_warmup == e["n_grad_warmup"] == chains * 20 * 11
    assert math.isnan(e["min_ess_per_s"])  # no time recorded
    assert fit.n_warmup == 20 and fit.chains == 2 and fit.n_draws == 100


def test_constructor_validates():
    rng = np.random.default_rng(4)
    st = stats(2, 10)
    with pytest.raises(ValueError, match="names for"):
        Fit(rng.normal(size=(2, 10, 3)), ["a", "b"], st)
    with pytest.raises(ValueError, match="required"):
        Fit(rng.normal(size=(2, 10, 2)), ["a", "b"],
            {k: v for k, v in st.items() if k != "n_grad"})
    with pytest.raises(ValueError, match="shape"):
        Fit(rng.normal(size=(2, 10, 2)), ["a", "b"], dict(st, lp=np.zeros((2, 9))))
    with pytest.raises(ValueError, match="chains, draws, columns"):
        Fit(rng.normal(size=(20, 2)), ["a", "b"], st)
    with pytest.raises(ValueError, match="n_params"):
        Fit(rng.normal(size=(2, 10, 2)), ["a", "b"], st, n_params=3)


# ---- ArviZ, save / load -------------------------------------------------------------------

def matrix_fit(incomplete=False):
    rng = np.random.default_rng(5)
    chains, draws, warm = 2, 50, 30
    names = MATRIX_NAMES + ["sigma_sq"]
    x = rng.normal(size=(chains, draws + warm, len(names)))
    st = stats(chains, draws + warm, rng=rng)
    st["energy"] = rng.normal(size=(chains, draws + warm))
    return Fit(x[:, warm:], names, {k: v[:, warm:] for k, v in st.items()}, n_params=8,
               warmup_draws=x[:, :warm],
               warmup_sampler_stats={k: v[:, :warm] for k, v in st.items()},
               time_warmup=1.5, time_sampling=2.5, sampler="nuts",
               metadata={"seed": 42, "inv_metric": rng.uniform(size=(chains, 8)),
                         "step_size_adapted": np.array([0.3, 0.4]),
                         "nested": {"a": [1, 2.5, None, "x"], "t": (1, 2),
                                    "nan": float("nan"), "inf": -math.inf,
                                    "flag": True, "np_int": np.int64(3)}},
               incomplete=incomplete)


def test_to_arviz_reshapes_matrix_and_names_stats():
    fit = matrix_fit()
    idata = fit.to_arviz()
    post = idata.posterior
    assert set(post.data_vars) == {"sigma", "p", "M", "sigma_sq"}
    assert post["M"].shape == (2, 50, 2, 3)
    for j in (1, 2, 3):
        for i in (1, 2):
            np.testing.assert_array_equal(post["M"].values[:, :, i - 1, j - 1],
                                          fit.column(f"M.{i}.{j}"))
    np.testing.assert_array_equal(post["sigma"].values, fit.column("sigma"))
    ss = idata.sample_stats
    for name in ("acceptance_rate", "step_size", "n_steps", "diverging", "tree_depth",
                 "lp", "energy"):
        assert name in ss.data_vars
    assert ss["diverging"].dtype == bool
    np.testing.assert_array_equal(ss["n_steps"].values, fit.sampler_stats["n_grad"])
    assert idata.warmup_posterior["M"].shape == (2, 30, 2, 3)
    assert "acceptance_rate" in idata.warmup_sample_stats.data_vars
    # ArviZ's own diagnostics work on it
    s = az.summary(idata, var_names=["sigma"], round_to="none")
    assert s.loc["sigma", "ess_bulk"] == pytest.approx(fit.summary().loc["sigma", "ess_bulk"],
                                                       rel=1e-6)


def test_stan_names_accessors_and_quantiles():
    """cmdstanpy's surface: columns by Stan's name, shaped variables, draws_pd with Stan's
    names, 5 %/50 %/95 % quantiles in summary()."""
    fit = matrix_fit()
    assert fit.param_names == ["sigma", "p", "M[1,1]", "M[2,1]", "M[1,2]", "M[2,2]",
                               "M[1,3]", "M[2,3]", "sigma_sq"]
    assert fit.columns[2] == "M.1.1"
    assert Fit(fit.draws, fit.param_names, fit.sampler_stats).columns == fit.columns
    np.testing.assert_array_equal(fit.column("M[2,3]"), fit.column("M.2.3"))
    np.testing.assert_array_equal(fit.column("M[2, 3]"), fit.column("M.2.3"))
    with pytest.raises(KeyError, match="no column 'M\\[3,1\\]'"):
        fit.column("M[3,1]")
    m = fit.stan_variable("M")
    assert m.shape == (2, 50, 2, 3)
    np.testing.assert_array_equal(m[:, :, 1, 0], fit.column("M.2.1"))
    assert fit.stan_variable("sigma").shape == (2, 50)
    assert set(fit.stan_variables()) == {"sigma", "p", "M", "sigma_sq"}
    with pytest.raises(KeyError, match="no variable 'theta'; the fit has"):
        fit.stan_variable("theta")
    df = fit.draws_pd()
    assert len(df) == 100 and list(df.columns[:3]) == ["chain__", "iter__", "draw__"]
    assert "M[2,1]" in df.columns and "n_grad__" in df.columns
    np.testing.assert_array_equal(df.loc[df.chain__ == 2, "M[2,1]"], fit.column("M.2.1")[1])
    assert df.iter__.iloc[50] == 1 and df.draw__.iloc[-1] == 100
    s = fit.summary()
    flat = fit.column("sigma").reshape(-1)
    for q in (5, 50, 95):
        assert s.loc["sigma", f"{q}%"] == pytest.approx(np.quantile(flat, q / 100))


def test_summary_keeps_the_parameters_diagnostics(monkeypatch):
    """After the convergence checks computed the parameters' ESS and R-hat, summary()
    computes only their MCSEs and the other columns' diagnostics: the same table, bit
    for bit, as a fit that computes all at once."""
    from ahmc_stan import rank_diagnostics

    fit = matrix_fit()
    fit._diagnostics(params_only=True)
    asked = []
    diagnostics = rank_diagnostics.diagnostics

    def spy(values, keys=rank_diagnostics.KEYS):
        asked.append((np.shape(values)[2], tuple(keys)))
        return diagnostics(values, keys)

    monkeypatch.setattr(rank_diagnostics, "diagnostics", spy)
    kept = fit.summary()
    assert asked == [(8, ("mcse_mean", "mcse_sd")), (1, rank_diagnostics.KEYS)]
    pd.testing.assert_frame_equal(kept, matrix_fit().summary(), check_exact=True)


def test_to_arviz_keeps_unparseable_names_flat():
    rng = np.random.default_rng(6)
    names = ["z.real", "z.imag", "t:1", "v.1", "v.3"]  # complex, tuple, a gappy vector
    fit = Fit(rng.normal(size=(2, 10, 5)), names, stats(2, 10))
    post = fit.to_arviz().posterior
    assert {"z.real", "z.imag", "t:1", "v.1", "v.3"} <= set(post.data_vars)


def assert_same_fit(a, b):
    np.testing.assert_array_equal(a.draws, b.draws)
    assert a.param_names == b.param_names and a.n_params == b.n_params
    assert a.sampler_stats.keys() == b.sampler_stats.keys()
    for k in a.sampler_stats:
        np.testing.assert_array_equal(a.sampler_stats[k], b.sampler_stats[k])
        assert a.sampler_stats[k].dtype == b.sampler_stats[k].dtype
    if a.warmup_draws is None:
        assert b.warmup_draws is None
    else:
        np.testing.assert_array_equal(a.warmup_draws, b.warmup_draws)
    assert (a.warmup_sampler_stats is None) == (b.warmup_sampler_stats is None)
    for k in a.warmup_sampler_stats or {}:
        np.testing.assert_array_equal(a.warmup_sampler_stats[k], b.warmup_sampler_stats[k])
    for attr in ("n_grad_warmup", "n_grad_sampling", "sampler", "incomplete"):
        assert getattr(a, attr) == getattr(b, attr)
    for attr in ("time_warmup", "time_sampling"):
        x, y = getattr(a, attr), getattr(b, attr)
        assert x == y or (math.isnan(x) and math.isnan(y))
    assert_same_json(a.metadata, b.metadata)


def assert_same_json(a, b):
    assert type(a) is type(b) or (isinstance(a, (int, np.integer)) and isinstance(b, int)), \
        (a, b)
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_json(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_json(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


@pytest.mark.parametrize("incomplete", [False, True])
def test_save_load_round_trip(tmp_path, incomplete):
    fit = matrix_fit(incomplete=incomplete)
    path = fit.save(tmp_path / "sub" / "fit")  # suffix added, directory created
    assert path.name == "fit.npz" and path.is_file()
    back = load_fit(path)
    assert_same_fit(fit, back)
    assert_same_fit(fit, load_fit(tmp_path / "sub" / "fit"))
    pd.testing.assert_frame_equal(fit.summary(), back.summary())
    assert fit.efficiency() == back.efficiency()


def test_save_load_without_warmup(tmp_path):
    fit = iid_fit(time_sampling=3.0)
    back = load_fit(fit.save(tmp_path / "f.npz"))
    assert back.warmup_draws is None and back.warmup_sampler_stats is None
    assert_same_fit(fit, back)


def test_metadata_must_be_serialisable(tmp_path):
    fit = iid_fit(metadata={"obj": object()})
    with pytest.raises(TypeError, match="metadata"):
        fit.save(tmp_path / "f.npz")


# ---- compare ---------------------------------------------------------------------------

def test_compare_ranks_by_ess_per_grad_and_divides_by_nuts():
    # identical draws, so identical ESS: ESS per gradient is ordered by n_grad
    kw = dict(seed=7, time_warmup=1.0)
    fits = {
        "NUTS": iid_fit(n_grad=10, time_sampling=2.0, n_grad_warmup=5000, **kw),
        "ahmc": iid_fit(n_grad=5, sampler="ahmc", time_sampling=1.0, n_grad_warmup=100,
                        **kw),
        "slow": iid_fit(n_grad=40, sampler="rwm", time_sampling=8.0, n_grad_warmup=0, **kw),
    }
    df = compare(fits)
    assert list(df.index) == ["ahmc", "NUTS", "slow"]
    ess = fits["NUTS"].efficiency()["min_ess_bulk"]
    assert df.loc["ahmc", "min_ess_bulk"] == pytest.approx(ess)
    for col in ("min_ess_bulk", "min_ess_per_grad", "n_grad_sampling", "divergences",
                "accept_rate", "max_rhat", "sampler"):
        assert col in df.columns
    assert df.loc["ahmc", "min_ess_per_grad / NUTS"] == pytest.approx(2.0)
    assert df.loc["slow", "min_ess_per_grad / NUTS"] == pytest.approx(0.25)
    assert df.loc["NUTS", "min_ess_per_grad / NUTS"] == pytest.approx(1.0)
    n = 4 * 1000
    nuts_total = ess / (10 * n + 5000)
    assert df.loc["ahmc", "min_ess_per_grad_total / NUTS"] == pytest.approx(
        (ess / (5 * n + 100)) / nuts_total)
    assert df.loc["ahmc", "min_ess_per_s / NUTS"] == pytest.approx(2.0)
    assert df.loc["slow", "min_ess_per_s / NUTS"] == pytest.approx(0.25)


def test_compare_finds_nuts_by_sampler_and_works_without_it():
    fits = {"baseline": iid_fit(n_grad=10, sampler="nuts"),
            "mine": iid_fit(n_grad=20, sampler="ahmc")}
    df = compare(fits)
    assert list(df.index) == ["baseline", "mine"]
    assert df.loc["mine", "min_ess_per_grad / NUTS"] == pytest.approx(0.5)
    df = compare({"mine": iid_fit(sampler="ahmc"), "other": iid_fit(sampler="x")})
    for col in RATIO_COLUMNS.values():
        assert col not in df.columns


def test_compare_puts_stuck_and_undefined_last():
    stuck = iid_fit(sampler="stuck", n_grad=1)
    stuck.draws[:] = np.arange(4.0)[:, None, None]  # chains that never moved
    free = iid_fit(sampler="free", n_grad=0)  # no gradients recorded: ESS/grad undefined
    df = compare({"nuts": iid_fit(n_grad=10), "stuck": stuck, "free": free})
    # converged fits first (nan ESS/grad last among them), then the unconverged "stuck"
    assert list(df.index) == ["nuts", "free", "stuck"]
    assert list(df["converged"]) == [True, True, False]
    assert df.loc["stuck", "min_ess_bulk"] < 10 and df.loc["stuck", "max_rhat"] > 100
    assert math.isnan(df.loc["free", "min_ess_per_grad"])
    assert math.isnan(df.loc["free", "min_ess_per_grad / NUTS"])


def test_to_markdown():
    fits = {"nuts": iid_fit(n_grad=10, time_sampling=2.0), "a|b": iid_fit(n_grad=5)}
    df = compare(fits)
    text = to_markdown(df, columns=["sampler", "min_ess_bulk", "min_ess_per_grad",
                                    "divergences", "min_ess_per_grad / NUTS"])
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("| fit ") and "min_ess_per_grad / NUTS" in lines[0]
    assert set(lines[1]) <= set("|-: ")
    assert lines[1].count("|") == lines[0].count("|") - 0 == 7
    assert "a\\|b" in lines[2]  # pipes in cells are escaped
    assert lines[1].split("|")[3].endswith(":")  # numbers right-aligned
    assert len({len(line) for line in lines}) == 1
    ratio = df.loc["a|b", "min_ess_per_grad / NUTS"]
    assert f"{ratio:.4g}" in lines[2]
    # plain frames too
    plain = to_markdown(pd.DataFrame({"x": [1.0, 2.5], "y": ["u", "v"]}), index=False)
    assert plain.splitlines()[2] == "|   1 | u   |"


def test_step_size_and_inv_metric_per_chain():
    fit = matrix_fit()
    np.testing.assert_array_equal(fit.step_size, fit.sampler_stats["step_size"][:, -1])
    # CmdStan's layout: metadata["inv_metric"] has one row per chain
    assert [m.tolist() for m in fit.inv_metric] == fit.metadata["inv_metric"].tolist()
    ours = Fit(fit.draws, fit.param_names, fit.sampler_stats, n_params=8,
               metadata={"chains": [{"inv_metric": np.ones(8)}, {"inv_metric": None}]})
    assert ours.inv_metric[0].tolist() == [1.0] * 8 and ours.inv_metric[1] is None
    bare = Fit(fit.draws, fit.param_names,
               {**fit.sampler_stats, "step_size": np.full((2, 50), np.nan)}, n_params=8)
    assert bare.inv_metric is None and np.isnan(bare.step_size).all()


def test_to_arviz_log_likelihood_and_observed_data_make_loo_work():
    """A ``log_lik`` generated quantity becomes the log_likelihood group: ``arviz.loo``
    runs on it: elpd_loo = lppd − p_loo, lppd = Σ_i log mean_s exp(log_lik[s, i]), and
    with one parameter the effective number of parameters p_loo is about 1."""
    rng = np.random.default_rng(3)
    y = rng.normal(size=20)
    mu = rng.normal(0, 0.2, size=(2, 500))
    log_lik = -0.5 * (y[None, None, :] - mu[:, :, None]) ** 2 - 0.5 * np.log(2 * np.pi)
    draws = np.concatenate([mu[:, :, None], log_lik], axis=2)
    names = ["mu"] + [f"log_lik.{i + 1}" for i in range(20)]
    st = stats(2, 500, rng=rng)
    fit = Fit(draws, names, st, n_params=1, sampler="ahmc")
    idata = fit.to_arviz(observed_data={"y": y})
    assert idata.log_likelihood["log_lik"].shape == (2, 500, 20)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)
    loo = az.loo(idata)
    lppd = np.sum(np.log(np.mean(np.exp(log_lik.reshape(-1, 20)), axis=0)))
    assert loo.elpd_loo == pytest.approx(lppd - loo.p_loo, abs=1e-6)
    assert 0.2 < loo.p_loo < 2
    assert "log_likelihood" not in matrix_fit().to_arviz().groups()


def test_integer_generated_quantities_stay_integers_in_arviz():
    """Variables declared ``int`` (stanc's --info) are integer arrays in to_arviz()."""
    from ahmc_stan import StanModel, tune_and_sample

    from .conftest import stan_model_path

    model = StanModel(stan_model_path("int_gq"))
    assert model.int_variables() == ["positive", "counts"]
    fit = tune_and_sample(model, chains=2, warmup=100, draws=100, seed=1, progress=False,
                          parallel=False, diagnose=False, extend=False)
    post = fit.to_arviz().posterior
    assert post["positive"].dtype == np.int64 and post["counts"].dtype == np.int64
    assert post["counts"].shape == (2, 100, 2) and post["mu2"].dtype == np.float64
    np.testing.assert_array_equal(post["positive"].values, (fit.column("mu") > 0))


@pytest.mark.parametrize("threads_from", [0, 10**9])
def test_chains_constrained_at_once_equal_one_after_another(monkeypatch, threads_from):
    """``StanModel.constrain_each`` (the chains' draws constrained in threads when a fit is
    assembled, or one after another below ``CONSTRAIN_IN_THREADS`` values) gives each
    chain exactly what its own call gives, generated quantities' random numbers included,
    and the same draws again from the same seeds."""
    from ahmc_stan import StanModel, model as model_module

    monkeypatch.setattr(model_module, "CONSTRAIN_IN_THREADS", threads_from)

    from .conftest import stan_model_path

    model = StanModel(stan_model_path("int_gq"))
    rng = np.random.default_rng(5)
    xs = [rng.normal(size=(3000, model.dims)) for _ in range(4)]
    seeds = np.random.SeedSequence(12).spawn(4)
    at_once = model.constrain_each(xs, [np.random.default_rng(s) for s in seeds],
                                   include_tp=True, include_gq=True)
    one_by_one = [model.constrain(x, include_tp=True, include_gq=True,
                                  rng=np.random.default_rng(s)) for x, s in zip(xs, seeds)]
    for a, b in zip(at_once, one_by_one):
        np.testing.assert_array_equal(a, b)
    counts = np.concatenate([a[:, 2:4] for a in at_once])
    assert 2.8 < counts.mean() < 3.2  # Poisson(3) draws: sd of the mean 0.016
    assert len({a[:, 2:4].tobytes() for a in at_once}) == 4  # each chain its own stream
