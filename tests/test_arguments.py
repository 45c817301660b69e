"""tune_and_sample checks its arguments and option names in the caller's process before
any work, with one-line messages (issue 17, item 3)."""

import json

import numpy as np
import pytest

from ahmc_stan import tune_and_sample
from ahmc_stan.sampling import SAMPLERS, sampler_options

from .conftest import stan_model_path


class NoWork:
    """A model that fails the test if anything touches it: the checks come first."""

    def __getattr__(self, name):
        raise AssertionError(f"the model was used ({name}) before the arguments were checked")


@pytest.mark.parametrize("kwargs, message", [
    ({"chains": 0}, r"^chains must be an integer >= 1, not 0$"),
    ({"chains": -1}, r"^chains must be an integer >= 1, not -1$"),
    ({"chains": 2.5}, r"^chains must be an integer >= 1, not 2.5$"),
    ({"draws": -5}, r"^draws must be an integer >= 1, not -5$"),
    ({"draws": 0}, r"^draws must be an integer >= 1, not 0$"),
    ({"warmup": -1}, r"^warmup must be an integer >= 0, not -1$"),
    ({"seed": -5}, r"^seed must be an integer in \[0, 2\*\*32\), not -5$"),
    ({"seed": 2**32}, r"^seed must be an integer in \[0, 2\*\*32\)"),
    ({"seed": "1"}, r"^seed must be an integer"),
    ({"parallel": 0}, r"^parallel must be an integer >= 1, not 0$"),
    ({"sampler": "nuts"}, r"^unknown sampler 'nuts'; choose from \["),
    ({"metirc": "diag"}, r"^unknown option 'metirc' for sampler 'ahmc'; valid options: "
                         r"adapt_delta, adapt_during_sampling, .*\bmetric\b"),
    ({"sampler": "rwm", "target_accept": 0.95},
     r"^unknown option 'target_accept' for sampler 'rwm'; valid options: adapt_delta, "
     r"step_size, steps_per_draw$"),
    ({"sampler": "gadmala", "num_steps": 5, "foo": 1},
     r"^unknown options 'num_steps', 'foo' for sampler 'gadmala'; valid options: "
     r"adapt_delta, initial_scale, learning_rate, min_beta, min_diag_ratio, rho_beta, "
     r"steps_per_draw$"),
    ({"thin": 0}, r"^thin must be an integer >= 1, not 0$"),
    ({"warmup": 0}, r"^sampler 'ahmc' derives its box .* with warmup=0 give box="),
])
def test_bad_arguments_fail_before_any_work(kwargs, message):
    kwargs = {"sampler": "ahmc", **kwargs}
    with pytest.raises(ValueError, match=message) as err:
        tune_and_sample(NoWork(), progress=False, **kwargs)
    assert "\n" not in str(err.value)


def test_every_samplers_options_are_known():
    """Each built-in sampler's valid names are its own keywords plus, for the AHMC family,
    the tuned chain's and the tuner's; no sampler accepts the driver's own arguments."""
    ahmc = sampler_options("ahmc")
    assert {"metric", "box", "max_restarts", "detect_stuck", "k", "anneal_start", "adapt_delta",
            "adapt_during_sampling", "callback"} <= ahmc
    assert "kernel" not in ahmc
    assert {"num_candidates", "k", "max_restarts"} <= sampler_options("ohmc")
    assert {"u_exponent", "box", "k"} <= sampler_options("svhmc")
    assert {"softness", "third_derivatives", "max_restarts", "k"} <= sampler_options("armhmc")
    bandit = sampler_options("bandit")
    assert {"reward", "folds", "k", "adapt_delta"} <= bandit and "max_restarts" not in bandit
    assert sampler_options("hmc") == {"num_steps", "adapt_delta", "step_size_jitter",
                                      "block_size", "max_restarts", "detect_stuck"}
    for name in SAMPLERS:
        assert not {"model", "rng", "x0", "warmup", "draws", "progress", "seed",
                    "chains"} & sampler_options(name)


def test_valid_options_pass_the_check_and_run(mvn_model):
    fit = tune_and_sample(mvn_model, "hmc", chains=1, warmup=50, draws=20, seed=1,
                          progress=False, diagnose=False, num_steps=5, adapt_delta=0.7,
                          max_restarts=2)
    assert fit.draws.shape == (1, 20, 3)
    fit = tune_and_sample(mvn_model, "ahmc", chains=1, warmup=0, draws=20, seed=np.int64(3),
                          progress=False, diagnose=False, metric="identity",
                          box=((0.1, 0.5), (1, 10)))
    assert fit.draws.shape == (1, 20, 3)


def test_cli_misspelt_option_is_one_line(mvn_data, tmp_path, capsys):
    from ahmc_stan.cli import main

    data = tmp_path / "mvn.json"
    data.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in mvn_data.items()}))
    status = main(["sample", str(stan_model_path("mvn")), "--data", str(data), "--chains",
                   "1", "--option", "adapt_detla=0.95"])
    err = capsys.readouterr().err
    assert status != 0
    assert "unknown option 'adapt_detla' for sampler 'ahmc'; valid options:" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("init, message", [
    ([{"x": [0, 0, 0]}], r"^init has 1 entries for 2 chains; give one per chain"),
    (-1, r"^init as a number is the radius .* must be >= 0, not -1$"),
    ("no_such_inits.json", r"^init: no such file 'no_such_inits.json'$"),
    ([{"x": [0, 0, 0]}, 3], r"^init\[1\] must be a dict of initial values or a JSON file, "
                            r"not int$"),
])
def test_bad_inits_fail_before_any_work(init, message):
    with pytest.raises(ValueError, match=message):
        tune_and_sample(NoWork(), chains=2, progress=False, init=init)


def test_inits_per_chain_from_files_and_radius(mvn_model, tmp_path):
    """``init`` as cmdstanpy's ``inits``: one dict per chain, a JSON file, a number (the
    radius of the uniform initialisation; 0 is the origin).  The initial point is the
    first recorded row only if the first transition was rejected, so the points are read
    where the chains start: ``model.initial_point`` with the chain's seed."""
    import ahmc_stan.sampling as sampling

    starts = []
    real = sampling.StanModel.initial_point

    def spy(self, rng, init=None, **kwargs):
        x = real(self, rng, init, **kwargs)
        starts.append(x.copy())
        return x

    path = tmp_path / "init.json"
    path.write_text(json.dumps({"x": [5.0, 5.0, 5.0]}))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampling.StanModel, "initial_point", spy)
        for init in ([{"x": [1, 2, 3]}, path], 0, str(path)):
            tune_and_sample(mvn_model, "ahmc", chains=2, warmup=20, draws=5, seed=1,
                            progress=False, parallel=False, diagnose=False, init=init)
    np.testing.assert_array_equal(starts[0], [1, 2, 3])
    np.testing.assert_array_equal(starts[1], [5, 5, 5])
    np.testing.assert_array_equal(starts[2:4], np.zeros((2, 3)))
    np.testing.assert_array_equal(starts[4:6], np.full((2, 3), 5.0))
    with pytest.raises(ValueError, match="must hold a JSON object of initial values"):
        tune_and_sample(mvn_model, chains=1, progress=False, init=bad)


def test_cli_init_file_and_bad_init(mvn_data, tmp_path, capsys):
    from ahmc_stan.cli import main

    data = tmp_path / "mvn.json"
    data.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in mvn_data.items()}))
    common = ["sample", str(stan_model_path("mvn")), "--data", str(data), "--chains", "1",
              "--warmup", "50", "--draws", "20", "--seed", "1", "--no-progress"]
    inits = tmp_path / "inits.json"
    inits.write_text(json.dumps({"x": [0.5, -1.0, 2.0]}))
    assert main([*common, "--init", str(inits)]) == 0
    assert main([*common, "--init", "0.5"]) == 0
    capsys.readouterr()
    assert main([*common, "--init", str(tmp_path / "missing.json")]) != 0
    err = capsys.readouterr().err
    assert "init: no such file" in err and "Traceback" not in err


@pytest.mark.parametrize("parallel", [False, 2])
def test_max_seconds_returns_the_draws_made_flagged(logistic_model, parallel):
    """A time budget far shorter than the run: the Fit holds what was drawn, flagged
    incomplete and out of time, and the diagnosis says why.  With 3 chains on 2 workers
    (or one after another) the chain that never started is left out.  (A regression:
    10⁶ draws of a 3-d Gaussian now take under 4 s.)"""
    from ahmc_stan import ConvergenceWarning

    with pytest.warns(ConvergenceWarning, match=r"ran out of its time budget "
                                                r"\(max_seconds=4\)"):
        fit = tune_and_sample(logistic_model, "ahmc", chains=3, warmup=100, draws=10**6,
                              seed=1, progress=False, parallel=parallel, max_seconds=4)
    assert fit.incomplete and fit.metadata["out_of_time"]
    assert 1 <= fit.chains <= 2 and 0 < fit.n_draws < 10**6
    assert np.isfinite(fit.draws).all()


def test_max_seconds_is_checked(mvn_model):
    for bad in (0, -1, "10"):
        with pytest.raises(ValueError, match=r"^max_seconds must be a positive number"):
            tune_and_sample(mvn_model, chains=1, progress=False, max_seconds=bad)
    fit = tune_and_sample(mvn_model, chains=1, warmup=50, draws=20, seed=1, progress=False,
                          diagnose=False, max_seconds=600)
    assert not fit.incomplete and "out_of_time" not in fit.metadata


def test_cli_max_seconds(logistic_data, tmp_path, capsys):
    from ahmc_stan.cli import main

    data = tmp_path / "logistic.json"
    data.write_text(json.dumps({k: np.asarray(v).tolist() for k, v in logistic_data.items()}))
    status = main(["sample", str(stan_model_path("logistic")), "--data", str(data), "--chains",
                   "2", "--warmup", "100", "--draws", "1000000", "--seed", "1",
                   "--no-progress", "--max-seconds", "4"])
    assert status == 0
    out = capsys.readouterr()
    assert "(out of time: the fit holds the draws made so far)" in out.out
    assert "time budget (max_seconds=4)" in out.err


def test_progress_moves_through_every_phase_as_plain_lines(mvn_model, capsys):
    """Outside a terminal (pytest's captured stderr, CI logs) progress is plain lines at
    every 10 % naming the phase; AHMC's scale phase (the first half of warmup) reports
    too, where the bar used to sit at 0 %."""
    tune_and_sample(mvn_model, "ahmc", chains=1, warmup=400, draws=400, seed=1,
                    progress=True, parallel=False, diagnose=False)
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("ahmc chain 1:")]
    assert "\x1b" not in "".join(lines) and "\r" not in "".join(lines)
    counts = [int(l.split()[4].split("/")[0]) for l in lines]
    assert counts == sorted(counts) and counts[-1] == 800
    phases = [l.split()[3] for l in lines]
    assert phases.count("warmup") >= 3 and "sampling" in phases
    assert any(0 < n < 200 for n in counts)  # inside the scale phase


def test_progress_bar_on_a_terminal_names_the_phase():
    import io

    from ahmc_stan.sampling import ChainProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    bar = ChainProgress("ahmc chain 2", 10, 10, stream=out)
    bar(5)
    bar(15)
    bar.close()
    text = out.getvalue()
    assert "ahmc chain 2 (warmup)" in text and "ahmc chain 2 (sampling)" in text


@pytest.mark.parametrize("sampler, dims, warmup", [
    ("ahmc", 10, 1000), ("ahmc", 51, 1000), ("gadmala", 10, 1000), ("ohmc", 10, 1000),
    ("ahmc", 10, 7)])
def test_warmup_defaults_to_cmdstans(monkeypatch, sampler, dims, warmup):
    """Without ``warmup`` every sampler, AHMC on small models too, runs CmdStan's 1000
    warmup iterations (README, "The default warmup"); a given ``warmup`` is kept."""
    from ahmc_stan import sampling

    class Ran(Exception):
        pass

    class Dims:
        def __init__(self, dims):
            self.dims = dims

    def run_chains(model, name, chains, n_warmup, *args):
        raise Ran(n_warmup)

    monkeypatch.setattr(sampling, "_run_chains", run_chains)
    given = {"warmup": warmup} if warmup == 7 else {}
    with pytest.raises(Ran) as ran:
        tune_and_sample(Dims(dims), sampler, progress=False, **given)
    assert ran.value.args[0] == warmup
