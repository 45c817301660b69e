"""``thin`` (CmdStan's meaning) and ``output_dir`` (chains streamed to disk as they run,
:func:`ahmc_stan.load_output` reading them back, also after the run was killed)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

from ahmc_stan import load_fit, load_output, run_nuts, tune_and_sample
from ahmc_stan.samplers.chain import ChainRecorder, read_stream, streaming

from .conftest import stan_model_path


def assert_thinned(thinned, full, thin):
    """``thinned`` keeps every ``thin``-th draw of ``full`` (same seed), with the gradients
    of the dropped iterations counted in the kept ones."""
    np.testing.assert_array_equal(thinned.draws, full.draws[:, ::thin])
    np.testing.assert_array_equal(thinned.warmup_draws, full.warmup_draws)
    assert thinned.n_draws == -(-full.n_draws // thin)
    assert thinned.n_grad_sampling == full.n_grad_sampling
    assert thinned.n_grad_warmup == full.n_grad_warmup
    n_grad = full.sampler_stats["n_grad"]
    np.testing.assert_array_equal(thinned.sampler_stats["n_grad"][:, 0],
                                  n_grad[:, :thin].sum(axis=1))
    np.testing.assert_array_equal(thinned.sampler_stats["accept_stat"],
                                  full.sampler_stats["accept_stat"][:, ::thin])
    assert thinned.metadata["thin"] == thin


@pytest.mark.parametrize("sampler, options", [
    ("ahmc", {}), ("rwm", {}), ("hmc", {"num_steps": 5})])
def test_thin_keeps_every_kth_draw_and_every_gradient(gauss2d, sampler, options):
    kw = dict(chains=2, warmup=200, draws=301, seed=7, progress=False, diagnose=False,
              extend=False, **options)  # extended or not by its own R-hat: not this test
    if sampler == "ahmc":  # nor run again in another metric (here one chain falls back)
        kw["metric_rerun"] = False
    full = tune_and_sample(gauss2d, sampler, **kw)
    thinned = tune_and_sample(gauss2d, sampler, thin=3, **kw)
    assert thinned.n_draws == 101
    assert_thinned(thinned, full, 3)


def test_nuts_thin_counts_every_leapfrog_step(mvn_model):
    kw = dict(chains=2, warmup=300, draws=200, seed=3, diagnose=False)
    full = run_nuts(mvn_model, **kw)
    thinned = run_nuts(mvn_model, thin=4, **kw)
    assert_thinned(thinned, full, 4)
    with pytest.raises(ValueError, match="thin must be an integer >= 1, not 0"):
        run_nuts(mvn_model, thin=0, **kw)


def test_output_dir_streams_and_rebuilds_the_same_fit(constrained_model, tmp_path):
    """A finished run leaves fit.npz, draws.csv (Stan's names) and the chains' streams;
    the Fit rebuilt from the streams alone equals the returned one (generated
    quantities included: they are drawn from the same seeds)."""
    out = tmp_path / "run"
    # metric_rerun=False: this short run's chains disagree and mix slowly (R-hat 1.52),
    # which would add the rerun's subfolder (tested in test_convergence.py)
    fit = tune_and_sample(constrained_model, "ahmc", chains=2, warmup=150, draws=120,
                          thin=2, seed=11, progress=False, diagnose=False, output_dir=out,
                          metric_rerun=False)
    assert sorted(p.name for p in out.iterdir()) == [
        "chain_1.stream", "chain_2.stream", "draws.csv", "fit.npz", "run.json"]
    saved = load_output(out)
    np.testing.assert_array_equal(saved.draws, fit.draws)
    table = pd.read_csv(out / "draws.csv")
    assert "M[2,1]" in table.columns and len(table) == 2 * 60
    np.testing.assert_allclose(table.loc[table.chain__ == 2, "M[2,1]"],
                               fit.column("M[2,1]")[1])

    os.remove(out / "fit.npz")
    rebuilt = load_output(out)
    assert rebuilt.incomplete and rebuilt.columns == fit.columns
    np.testing.assert_array_equal(rebuilt.draws, fit.draws)
    np.testing.assert_array_equal(rebuilt.warmup_draws, fit.warmup_draws)
    for name in ("n_grad", "accept_stat", "step_size", "phase"):
        np.testing.assert_array_equal(rebuilt.sampler_stats[name], fit.sampler_stats[name])
    # the streams hold the chains' iterations; the gradients of the Gaussian misfit, taken
    # after the chains finished and charged to warmup, are in fit.npz only
    misfit = fit.metadata["gaussian_misfit"]["n_grad"]
    assert misfit > 0 and rebuilt.n_grad_warmup == fit.n_grad_warmup - misfit
    assert rebuilt.n_grad_sampling == fit.n_grad_sampling
    assert 0 < rebuilt.time_warmup and 0 < rebuilt.time_sampling


def test_a_killed_run_keeps_its_streamed_draws(tmp_path):
    """SIGKILL (no chance to clean up) in the middle of sampling — the process kills itself
    from the sampler's per-block callback, so the point is deterministic: load_output
    returns the draws streamed so far, a prefix of what the same seed draws in a complete
    run (with the tuner frozen after warmup; while it adapts, its annealing depends on
    ``draws``)."""
    out = tmp_path / "killed"
    kw = dict(chains=2, warmup=100, seed=5, progress=False, diagnose=False, parallel=False,
              metric="identity", box=((0.05, 0.1), (20, 40)), block_size=5,
              adapt_during_sampling=False)
    script = textwrap.dedent(f"""
        import os, signal, ahmc_stan
        model = ahmc_stan.StanModel({str(stan_model_path("std_normal"))!r}, {{"D": 10}})

        def die(rec):
            if rec.n > 100 + 250:
                os.kill(os.getpid(), signal.SIGKILL)

        ahmc_stan.tune_and_sample(model, draws=2000, output_dir={str(out)!r},
                                  callback=die, **{kw!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], timeout=600)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "fit.npz").exists()
    killed = load_output(out)
    assert killed.incomplete and killed.chains == 1 and 250 < killed.n_draws < 2000
    from ahmc_stan import StanModel

    model = StanModel(stan_model_path("std_normal"), {"D": 10})
    full = tune_and_sample(model, draws=2000, **kw)
    np.testing.assert_array_equal(killed.draws, full.draws[:1, :killed.n_draws])
    np.testing.assert_array_equal(killed.warmup_draws, full.warmup_draws[:1])


def test_stream_records_a_discarded_warmup(tmp_path):
    """A restarted warmup (ChainRecorder.discard) is in the stream: the rebuilt chain has
    the recorder's rows and charges the discarded evaluations as result() does."""
    rng = np.random.default_rng(0)
    path = tmp_path / "chain.stream"
    with streaming(path):
        rec = ChainRecorder(3, 100, ["n_hvp"])
        rec.add(rng.normal(size=(10, 3)), n_grad=7, n_hvp=2, accept_stat=0.5, divergent=0)
        rec.discard(4)  # 6 rows of 7 gradients, 2 HVPs
        rec.add(rng.normal(size=(30, 3)), n_grad=3, n_hvp=1, accept_stat=0.9, divergent=0)
        rec.discard(20)
        rec.add(rng.normal(size=(12, 3)), n_grad=1, n_hvp=0, accept_stat=0.7, divergent=0)
        want = rec.result(25, time.perf_counter(), {})
    got = read_stream(path, 25)
    np.testing.assert_array_equal(got.positions, want.positions)
    assert got.stats.keys() == want.stats.keys()
    for name in want.stats:
        np.testing.assert_array_equal(got.stats[name], want.stats[name], err_msg=name)
    assert (got.n_warmup, got.n_sampling) == (want.n_warmup, want.n_sampling) == (25, 7)
    # a torn last record is ignored
    with open(path, "ab") as f:
        f.write(b"\0" * 13)
    np.testing.assert_array_equal(read_stream(path, 25).positions, want.positions)


def test_stream_is_closed_when_the_chain_raises(tmp_path):
    """A chain that raises leaves its stream closed and readable up to its last block."""
    with pytest.raises(RuntimeError), streaming(tmp_path / "chain.stream"):
        rec = ChainRecorder(2, 10, [])
        rec.add(np.ones((3, 2)), n_grad=1, accept_stat=1.0, divergent=0)
        raise RuntimeError("the chain failed")
    assert rec._stream.file.closed
    np.testing.assert_array_equal(read_stream(tmp_path / "chain.stream", 5).positions,
                                  np.ones((3, 2)))


def test_load_output_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run.json"):
        load_output(tmp_path)


def test_cli_thin_and_output_dir(tmp_path, capsys):
    from ahmc_stan.cli import main

    out = tmp_path / "cli"
    data = tmp_path / "data.json"
    data.write_text('{"D": 3}')
    status = main(["sample", str(stan_model_path("std_normal")), "--data", str(data),
                   "--chains", "2", "--warmup", "200", "--draws", "100", "--thin", "5",
                   "--seed", "3", "--output-dir", str(out), "--no-progress"])
    assert status == 0
    fit = load_fit(out / "fit.npz")
    assert fit.n_draws == 20 and fit.metadata["thin"] == 5
    assert "x[3]" in capsys.readouterr().out  # the summary under Stan's names
