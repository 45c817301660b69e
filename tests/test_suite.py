"""The papers' suite (ahmc_stan.suite, ahmc_stan.datasets): models, data, runner, Dask."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from ahmc_stan import StanModel, datasets
from ahmc_stan.suite import (EXPERIMENTS, QUICK, STAN_MODELS, experiments, job_seed,
                             predictive_mse, run_suite)
from ahmc_stan.suite.registry import FULL, available_specs, full_runs, plan_runs

#: Smaller data for the gradient check of the expensive models (same programs).
SMALL = {"sv": lambda: datasets.stochastic_volatility_data(T=50, seed=2),
         "lgcp": lambda: datasets.lgcp_data(d=6, seed=2)}

#: Tiny runs: the smoke configuration of the runner tests.
SMOKE = dict(quick=True, only=["gauss2d"], samplers=["ahmc"], iterations=(150, 150),
             chains=2, seed=7)


def _fd_gradient(model, x, h=1e-6):
    grad = np.empty_like(x)
    for i in range(len(x)):
        e = np.zeros_like(x)
        e[i] = h
        grad[i] = (model.log_density(x + e) - model.log_density(x - e)) / (2 * h)
    return grad


@pytest.mark.parametrize("name", sorted(experiments()))
def test_suite_model_gradient_matches_finite_differences(name):
    exp = experiments()[name]
    data = SMALL[name]() if name in SMALL else exp.data(False)
    model = StanModel(STAN_MODELS / exp.stan_file, data)
    x = model.initial_point(np.random.default_rng(11)) * 0.5
    lp, grad = model.log_density_gradient(x)
    assert np.isfinite(lp)
    fd = _fd_gradient(model, x)
    scale = np.maximum(1.0, np.abs(grad))
    np.testing.assert_array_less(np.abs(grad - fd) / scale, 1e-4)


@pytest.mark.cmdstan
@pytest.mark.parametrize("stan_file", sorted({e.stan_file for e in experiments().values()}))
def test_suite_model_compiles_with_cmdstan_stanc(stan_file, tmp_path):
    from ahmc_stan.cmdstan_setup import ensure_cmdstan

    stanc = Path(ensure_cmdstan()) / "bin" / "stanc"
    proc = subprocess.run([str(stanc), str(STAN_MODELS / stan_file),
                           f"--o={tmp_path / 'm.hpp'}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("make", [
    lambda s: datasets.simulate_stochastic_volatility(T=300, seed=s),
    lambda s: datasets.simulate_lgcp(d=8, seed=s),
    lambda s: (datasets.robot_arm_data(seed=s),),
])
def test_generators_are_deterministic_under_a_seed(make):
    def arrays(out):
        return [np.asarray(v, dtype=float) for part in out
                for v in (part.values() if isinstance(part, dict) else [part])]

    a, b, c = arrays(make(5)), arrays(make(5)), arrays(make(6))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert any(u.shape != w.shape or not np.array_equal(u, w) for u, w in zip(a, c))


@pytest.mark.parametrize("load, n, k", [(datasets.pima_data, 532, 7),
                                        (datasets.ripley_data, 250, 2),
                                        (datasets.caravan_data, 5822, 85),
                                        (datasets.breast_cancer_data, 569, 30)])
def test_real_datasets_shapes_and_standardisation(load, n, k):
    d = load()
    assert (d["N"], d["K"]) == (n, k) and np.shape(d["X"]) == (n, k)
    np.testing.assert_allclose(np.mean(d["X"], axis=0), 0, atol=1e-10)
    np.testing.assert_allclose(np.std(d["X"], axis=0), 1, atol=1e-10)
    assert set(np.unique(d["y"])) == {0, 1}


def test_lgcp_generator_draws_from_its_model():
    """Counts have the model's mean: E y = Σ area·exp(x); x the returned field."""
    data, x = datasets.simulate_lgcp(d=32, seed=3)
    expected = np.sum(data["area"] * np.exp(x))
    assert abs(np.sum(data["y"]) - expected) < 4 * np.sqrt(expected)
    np.testing.assert_allclose(data["L"] @ data["L"].T, datasets.lgcp_covariance(32),
                               atol=1e-10)


def test_quick_experiments_are_registered():
    """Every experiment of the quick mode, the robot arm included, is in the registry."""
    assert set(QUICK["experiments"]) <= set(EXPERIMENTS) == set(experiments())
    assert EXPERIMENTS["robot_arm"].stan_file == "robot_arm.stan"


#: The header of the full configuration's table in comparisons/README.md.
FULL_TABLE = "| experiment | sampler | chains | warmup + draws | repeats | est. seconds |"


def _documented_full_table() -> list[tuple]:
    """Rows (experiment, sampler, chains, warmup, draws, repeats) of that table."""
    lines = (Path(__file__).resolve().parents[1] / "comparisons" / "README.md") \
        .read_text().splitlines()
    start = lines.index(FULL_TABLE) + 2  # past the header and its rule
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        warmup, draws = (int(n) for n in cells[3].split("+"))
        rows.append((cells[0], cells[1], int(cells[2]), warmup, draws, int(cells[4])))
    return rows


def test_full_configuration_is_the_documented_table():
    """FULL (experiments × samplers × chains × iterations × repeats) is the table in
    comparisons/README.md, row for row; its samplers are registered (or NUTS), its
    experiments exist, and run_suite(quick=False) plans exactly it."""
    documented = _documented_full_table()
    assert documented == full_runs()
    specs = available_specs()
    assert {label for _, label, *_ in documented} <= set(specs)
    assert set(FULL) <= set(EXPERIMENTS)
    assert all("nuts" in cfg["runs"] for cfg in FULL.values())
    planned = [(p.experiment, p.label, p.chains, p.warmup, p.draws, p.repeats)
               for p in plan_runs(quick=False)]
    assert sorted(planned) == sorted(documented)
    assert all(p.chosen for p in plan_runs(quick=False))


def test_explicit_samplers_and_repeats_override_the_full_configuration():
    plan = plan_runs(quick=False, samplers=["ahmc"], repeats=2, only=["pima", "neal100"])
    assert [(p.experiment, p.label, p.repeats) for p in plan] == [
        ("pima", "ahmc", 2), ("pima", "nuts", 2), ("neal100", "ahmc", 2),
        ("neal100", "nuts", 2)]
    pima, neal = plan[0], plan[2]
    assert (pima.warmup, pima.draws) == FULL["pima"]["runs"]["ahmc"][:2]
    assert (neal.warmup, neal.draws) == EXPERIMENTS["neal100"].iterations["full"]
    assert not neal.chosen and pima.chosen
    quick = plan_runs(quick=True)
    assert {p.experiment for p in quick} == set(QUICK["experiments"])
    assert all(p.repeats == 1 and p.chains == QUICK["chains"] and not p.full_data
               for p in quick)


def test_job_seed_depends_only_on_its_arguments():
    assert job_seed(1, "pima", "ahmc", 0) == job_seed(1, "pima", "ahmc", 0)
    seeds = {job_seed(1, e, s, r) for e in ("pima", "sv") for s in ("ahmc", "nuts")
             for r in (0, 1)}
    assert len(seeds) == 8


def test_predictive_mse_uses_the_posterior_mean_prediction():
    from ahmc_stan.fit import Fit

    y_test = np.array([[1.0, 2.0], [3.0, 4.0]])
    names = [f"y_pred.{i}.{j}" for j in (1, 2) for i in (1, 2)]  # column-major
    draws = np.zeros((2, 3, 4))
    draws[..., 0], draws[..., 1], draws[..., 2], draws[..., 3] = 1.0, 3.0, 2.0, 4.0
    draws[0, :, 0] += 0.5  # mean of y_pred.1.1 becomes 1.25
    stats = {k: np.zeros((2, 3)) for k in ("accept_stat", "step_size", "n_grad", "divergent")}
    fit = Fit(draws, names, stats)
    assert predictive_mse(fit, y_test) == pytest.approx(0.25**2 / 2)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    return run_suite(out_dir=out, log=None, **SMOKE)


@pytest.mark.cmdstan
@pytest.mark.slow
def test_runner_writes_the_tables(smoke):
    target = smoke["out_dir"]
    for name in ("jobs.csv", "chains.csv", "summary.md", "run.json", "sensitivity.png"):
        assert (target / name).exists(), name
    jobs = smoke["jobs"]
    assert list(jobs["sampler"]) == ["ahmc", "nuts"] and (jobs["error"] == "").all()
    for column in ("min_ess_per_grad", "min_ess_per_grad_total", "min_ess_per_s",
                   "min_ess_per_s_total", "median_ess_per_grad", "max_rhat", "seed"):
        assert jobs[column].notna().all(), column
    head = smoke["tables"]["efficiency:gauss2d"].splitlines()[0]
    for column in ("min_ess_per_grad", "per grad / NUTS", "per s / NUTS", "max_rhat"):
        assert column in head
    assert len(smoke["chains"]) == 4  # 2 samplers × 2 chains
    assert "| 0.16 | 40 |" in smoke["tables"]["sensitivity"]


@pytest.mark.cmdstan
@pytest.mark.slow
def test_rerun_reuses_the_finished_jobs(smoke):
    """Finished jobs are kept in jobs/; running the same suite again reuses them (an
    interrupted full run continues) and gives the same table."""
    kept = sorted(p.name for p in (smoke["out_dir"] / "jobs").glob("*.pkl"))
    assert len(kept) == 2 and kept[0].startswith("gauss2d-ahmc-r0-")
    again = run_suite(out_dir=smoke["out_dir"].parent, log=None, figures=False, **SMOKE)
    assert again["jobs"]["reused"].all() and not smoke["jobs"]["reused"].any()
    assert again["jobs"].drop(columns="reused").equals(smoke["jobs"].drop(columns="reused"))
    # a corrupt checkpoint is not trusted: that job runs again, and the log says why
    (smoke["out_dir"] / "jobs" / kept[0]).write_bytes(b"not a pickle")
    messages = []
    third = run_suite(out_dir=smoke["out_dir"].parent, log=messages.append, figures=False,
                      **SMOKE)
    assert list(third["jobs"]["reused"]) == [False, True]
    assert any(kept[0] in m and "cannot be read" in m for m in messages), messages
    assert "reusing 1 finished jobs" in "\n".join(messages)


@pytest.mark.cmdstan
@pytest.mark.slow
def test_dask_path_gives_the_same_table(smoke, tmp_path):
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        dask = run_suite(out_dir=tmp_path, log=None, client=client, figures=False,
                         **SMOKE)
    timing = ["min_ess_per_s", "min_ess_per_s_total", "time_warmup", "time_sampling",
              "wall_seconds"]
    local = smoke["jobs"].drop(columns=timing)
    remote = dask["jobs"].drop(columns=timing)
    assert local.equals(remote), (local.T, remote.T)
    assert smoke["chains"].equals(dask["chains"])


def test_compare_cli_takes_exactly_one_of_suite_and_model(capsys):
    from ahmc_stan.cli import main

    assert main(["compare"]) == 1
    assert main(["compare", "model.stan", "--suite", "paper"]) == 1
    assert "exactly one of --suite" in capsys.readouterr().err


def _comparison_script(name: str):
    """``comparisons/<name>.py`` loaded as a module of its own (not on the import path)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "comparisons" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"comparison_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_robustness_rows_count_fallen_back_chains_of_any_sampler():
    """The robustness suite's rows count the returned fit's chains whose metric fell back;
    CmdStan's NUTS keeps the number of chains in ``metadata["chains"]`` (its rows failed
    with a TypeError before)."""
    robustness = _comparison_script("robustness")
    ours = {"chains": [{"metric_fallback": None}, {"metric_fallback": {"to": "diag"}},
                       {"metric_fallback": None}, {}]}
    assert robustness.metric_fallbacks(ours) == 1
    assert robustness.metric_fallbacks({"chains": 4}) == 0
    assert robustness.metric_fallbacks({}) == 0


def test_peers_bootstrap_interval_resamples_the_seeds_together():
    """``nuts_peers.interval``: with the seeds resampled together, a sampler whose ESS is
    twice a peer's at every seed is twice it in every resample, however the seeds spread;
    with a peer at other seeds, each resampled on its own, the interval holds the ratio of
    the medians; the same runs give the same interval."""
    peers = _comparison_script("nuts_peers")
    spread = np.random.default_rng(3).lognormal(0.0, 0.5, 10)
    runs = {"ours": [{"per_grad": 2 * v} for v in spread],
            "nuts": [{"per_grad": v} for v in spread],
            "nutpie": [{"per_grad": v / 3} for v in spread]}
    assert peers.interval(runs, "ours", ["nuts", "nutpie"], "per_grad") \
        == pytest.approx((2.0, 2.0), rel=1e-12)
    runs["nuts"] = runs["nuts"][:7]
    low, high = peers.interval(runs, "ours", ["nuts", "nutpie"], "per_grad")
    point = np.median(2 * spread) / np.median(spread[:7])
    assert low < point < high
    assert peers.interval(runs, "ours", ["nuts", "nutpie"], "per_grad") == (low, high)


def test_settings_set_module_constants_for_their_runs_only():
    """``ahmc_settings.constants``: a setting's ``module.CONSTANT`` keys are set while its
    runs last and restored after, also when a run fails; a name outside ``ahmc_stan`` or
    a constant the module lacks is refused (a typo would otherwise measure nothing)."""
    from ahmc_stan.tuning import hmc_warmup

    settings = _comparison_script("ahmc_settings")
    key = "ahmc_stan.tuning.hmc_warmup.EARLY_WINDOW_MAX_DIMS"
    before = hmc_warmup.EARLY_WINDOW_MAX_DIMS
    with settings.constants({key: before - 1, "metric": "diag"}):
        assert hmc_warmup.EARLY_WINDOW_MAX_DIMS == before - 1
    assert hmc_warmup.EARLY_WINDOW_MAX_DIMS == before
    with pytest.raises(RuntimeError), settings.constants({key: 7}):
        raise RuntimeError("a run failed")
    assert hmc_warmup.EARLY_WINDOW_MAX_DIMS == before
    with pytest.raises(ValueError, match="not a constant of ahmc_stan"):
        with settings.constants({"numpy.pi": 3}):
            pass
    with pytest.raises(AttributeError):
        with settings.constants({"ahmc_stan.tuning.hmc_warmup.NO_SUCH_CONSTANT": 1}):
            pass
    assert not hasattr(hmc_warmup, "NO_SUCH_CONSTANT")
