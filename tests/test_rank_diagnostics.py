"""The vectorised diagnostics equal ArviZ's, column by column, to rounding."""

import numpy as np
import pytest
from scipy import stats

from ahmc_stan import rank_diagnostics as rd


def awkward_draws(rng, chains: int, draws: int) -> np.ndarray:
    """Columns that exercise every branch: AR(1) from antithetic to sticky, ties, heavy
    tails, a constant, a nan, a stray chain, binary, rare events, long blocks, tiny
    values, an infinite draw, an infinite column."""
    k = 14
    x = rng.standard_normal((chains, draws, k))
    phi = np.linspace(-0.9, 0.995, k)
    for t in range(1, draws):
        x[:, t] = phi * x[:, t - 1] + np.sqrt(1 - phi ** 2) * x[:, t]
    x[..., 0] = np.round(x[..., 0])
    x[..., 1] = rng.standard_cauchy((chains, draws))
    x[..., 2] = 3.0
    x[-1, draws // 2, 3] = np.nan
    x[0, :, 4] += 2.0
    x[..., 5] = rng.integers(0, 2, (chains, draws))
    x[..., 6] = (rng.uniform(size=(chains, draws)) < 0.02).astype(float)
    x[..., 7] = np.repeat(rng.standard_normal((chains, draws // 50 + 1)), 50, axis=1)[:, :draws]
    x[..., 8] = 1e-300 * x[..., 8]
    x[0, draws // 3, 9] = np.inf
    x[..., 10] = np.inf
    return x


@pytest.mark.parametrize("chains,draws", [(4, 1000), (1, 1000), (3, 101), (4, 7), (2, 4),
                                          (4, 3), (8, 2001), (2, 5)])
def test_every_diagnostic_equals_arviz(chains, draws):
    x = awkward_draws(np.random.default_rng(chains * 10_000 + draws), chains, draws)
    ref = rd.arviz_diagnostics(x)
    new = rd.diagnostics(x)
    assert set(new) == set(ref)
    for key in ref:
        np.testing.assert_allclose(new[key], ref[key], rtol=1e-12, atol=0,
                                   equal_nan=True, err_msg=key)


def test_each_function_equals_its_entry_of_diagnostics():
    x = awkward_draws(np.random.default_rng(5), 4, 300)
    both = rd.diagnostics(x)
    for key, f in [("ess_bulk", rd.ess_bulk), ("ess_tail", rd.ess_tail), ("r_hat", rd.rhat),
                   ("mcse_mean", rd.mcse_mean), ("mcse_sd", rd.mcse_sd)]:
        np.testing.assert_array_equal(f(x), both[key], err_msg=key)


def test_ranks_equal_scipys_with_ties():
    rng = np.random.default_rng(3)
    rows = np.round(rng.standard_normal((6, 500)), 1)
    rows[2] = 7.0
    rows[3] = rng.standard_normal(500)
    for r in range(6):
        np.testing.assert_array_equal(rd._ranks(rows)[r],
                                      stats.rankdata(rows[r], method="average"))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_blocks_change_no_value(monkeypatch, threads):
    """The columns split into blocks (in threads) or not: the same values, bit for bit;
    the blocks cover every column once, at most ``BLOCK`` each, as evenly as they can."""
    x = np.concatenate([awkward_draws(np.random.default_rng(s), 4, 200) for s in range(5)],
                       axis=2)  # 70 columns
    monkeypatch.setattr(rd, "_threads", lambda: 1)
    monkeypatch.setattr(rd, "BLOCK", 10 ** 6)
    whole = rd.diagnostics(x)
    monkeypatch.undo()
    monkeypatch.setattr(rd, "_threads", lambda: threads)
    for key, value in rd.diagnostics(x).items():
        np.testing.assert_array_equal(value, whole[key], err_msg=key)
    np.testing.assert_array_equal(rd.ess_bulk(x), whole["ess_bulk"])
    for n in (1, 7, 8, 16, 33, 70, 100, 1003):
        blocks = rd._blocks(n, threads)
        sizes = [stop - start for start, stop in blocks]
        assert [start for start, _ in blocks] == [0, *np.cumsum(sizes)[:-1]]
        assert sum(sizes) == n and max(sizes) <= rd.BLOCK and max(sizes) - min(sizes) <= 1
        assert len(blocks) == 1 or min(sizes) >= rd.MIN_BLOCK
        assert len(blocks) % threads == 0 or len(blocks) == max(1, n // rd.MIN_BLOCK)


def test_no_columns():
    out = rd.diagnostics(np.zeros((4, 100, 0)))
    assert all(v.shape == (0,) for v in out.values())


def test_a_default_run_imports_neither_arviz_nor_scipy_optimize_nor_fft():
    """Importing them took most of a small model's first run; a run's diagnostics need
    none of them."""
    import subprocess
    import sys

    from tests.conftest import stan_model_path

    script = f"""
import sys, warnings
import ahmc_stan
model = ahmc_stan.StanModel({str(stan_model_path("std_normal"))!r}, {{"D": 3}})
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    fit = ahmc_stan.tune_and_sample(model, chains=2, warmup=200, draws=200, seed=1,
                                    progress=False)
fit.summary(); fit.diagnose(); fit.efficiency()
print(sorted(m for m in ("arviz", "xarray", "scipy.optimize", "scipy.fft") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_fft_length_is_scipys():
    from scipy.fftpack import next_fast_len

    for n in list(range(1, 3000)) + [10007, 40000, 65537, 99991]:
        assert rd.next_fast_len(n) == next_fast_len(n), n


@pytest.mark.parametrize("chains,draws", [(4, 1000), (1, 1000), (2, 4), (8, 2000), (3, 101)])
def test_native_statistics_equal_numpys(monkeypatch, chains, draws):
    """The native library (``csrc/ahmc_diagnostics.cpp``) and numpy alone give the same
    statistics to rounding, on columns of every kind (random walks: autocorrelations
    past the library's lags); with an even number of draws the library computes every
    finite column's statistics (a random walk's bulk ESS from its scores by the FFT), but
    the tail ESS of long binary chains (more pairs to count than the FFT's work); the
    MCSEs of iid draws too."""
    from ahmc_stan.native import rank_diagnostics_entry

    assert rank_diagnostics_entry() is not None  # a C++ compiler is at hand here
    rng = np.random.default_rng(chains * 7 + draws)
    x = np.concatenate([awkward_draws(rng, chains, draws),
                        rng.standard_normal((chains, draws, 30)).cumsum(axis=1)[..., ::3],
                        np.round(rng.standard_normal((chains, draws, 5)), 1)], axis=2)
    native = rd.diagnostics(x)
    monkeypatch.setattr(rd, "NATIVE", False)
    numpy = rd.diagnostics(x)
    for key in rd.KEYS:
        np.testing.assert_allclose(native[key], numpy[key], rtol=1e-12, atol=0,
                                   equal_nan=True, err_msg=key)
    monkeypatch.undo()
    numpy_ess = rd._ess
    y = rd._by_column(x)
    ok = rd._valid(y, 1) & np.isfinite(y).all(axis=(1, 2))
    out = {key: np.full(y.shape[0], np.nan) for key in rd.KEYS}
    ranked = ["ess_bulk", "ess_tail", "mcse_mean", "mcse_sd"] + (["r_hat"] if chains >= 2
                                                                  else [])
    by_fft = []

    def spy(z):
        by_fft.append(len(z))
        return numpy_ess(z)

    monkeypatch.setattr(rd, "_ess", spy)
    computed = rd._native_block(y[ok], ranked, out, ok)
    if draws >= 1000:  # the ten random walks (and more): autocorrelations past its lags
        assert len(by_fft) == 1 and by_fft[0] >= 10
    if draws % 2:
        assert not any(done.any() for done in computed.values())
    else:
        binary = np.flatnonzero(ok) == 5  # half its draws at the 5 % quantile
        assert computed["ess_tail"][~binary].all()
        assert computed["ess_tail"][binary].all() == (draws < 1000)  # pairs past the FFT's
        assert chains < 2 or computed["r_hat"].all()
        assert computed["ess_bulk"].all()
        iid = np.flatnonzero(ok) >= x.shape[2] - 5  # the rounded normal draws
        assert computed["mcse_mean"][iid].all() and computed["mcse_sd"][iid].all()


def test_without_a_compiler_numpy_computes_alone(monkeypatch, tmp_path):
    """No C++ compiler: the library is not built, and the statistics are numpy's."""
    from ahmc_stan import native

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("AHMC_STAN_CACHE", str(tmp_path / "cache"))
    assert native.rank_diagnostics_entry.__wrapped__() is None
    monkeypatch.setattr(rd, "_native_entry", native.rank_diagnostics_entry.__wrapped__)
    x = awkward_draws(np.random.default_rng(9), 4, 400)
    without = rd.diagnostics(x)
    monkeypatch.setattr(rd, "NATIVE", False)
    for key, value in rd.diagnostics(x).items():
        np.testing.assert_array_equal(without[key], value, err_msg=key)


@pytest.mark.parametrize("chains,draws", [(4, 1000), (1, 7), (3, 2)])
@pytest.mark.parametrize("probs", [[0.1, 0.25, 0.75, 0.9], [0.05, 0.5, 0.95], [0.0, 1.0],
                                   [0.3]])
@pytest.mark.parametrize("with_nan", [False, True])
def test_row_quantiles_equal_numpys_bit_for_bit(chains, draws, probs, with_nan):
    """The tail check and the summary take their quantiles from a sort: the values of
    ``np.quantile`` exactly, with ties, heavy tails and infinite draws, and with a
    column holding a nan (which numpy answers)."""
    x = awkward_draws(np.random.default_rng(chains + draws), chains, draws)
    rows = x.reshape(-1, x.shape[2]).T
    if not with_nan:
        rows = np.delete(rows, 3, axis=0)
    with np.errstate(invalid="ignore"):  # inf - inf, as in numpy's own interpolation
        got, want = rd.row_quantiles(rows, probs), np.quantile(rows, probs, axis=1)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[:, 3]).all() == with_nan  # column 3 held the nan


def test_native_sort_of_smooth_columns_with_ties_and_signed_zeros(monkeypatch):
    """The library sorts a column whose values spread smoothly by buckets between its
    extremes (``value_order``) and a crowded one by radix: smooth columns with a tie of
    forty zeros of both signs, repeated draws and a skewed spread give numpy's (and
    ArviZ's) statistics to rounding."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 1000, 3))
    zeros = rng.choice(4000, 40, replace=False)
    x.reshape(-1, 3)[zeros, 0] = np.where(np.arange(40) % 2, 0.0, -0.0)
    x.reshape(-1, 3)[rng.choice(4000, 300), 1] = x.reshape(-1, 3)[rng.choice(4000, 300), 1]
    x[..., 2] = np.exp(x[..., 2])
    native = rd.diagnostics(x)
    ref = rd.arviz_diagnostics(x)
    monkeypatch.setattr(rd, "NATIVE", False)
    numpy = rd.diagnostics(x)
    for key in rd.KEYS:
        np.testing.assert_allclose(native[key], numpy[key], rtol=1e-12, atol=0, err_msg=key)
        np.testing.assert_allclose(native[key], ref[key], rtol=1e-10, atol=0, err_msg=key)


@pytest.mark.parametrize("chains,draws", [(4, 1000), (1, 1000), (3, 101), (2, 4)])
@pytest.mark.parametrize("native", [True, False])
def test_quantiles_with_the_diagnostics_equal_numpys(monkeypatch, chains, draws, native):
    """The quantiles :func:`diagnostics` returns with the statistics (from the library's
    sort, or numpy's where it leaves a column) are ``np.quantile``'s over all chains'
    draws exactly: ties, heavy tails, signed zeros, infinite draws and a nan column; the
    statistics are those computed without them; and asked for alone, the same."""
    monkeypatch.setattr(rd, "NATIVE", native)
    rng = np.random.default_rng(chains + 3 * draws)
    x = np.concatenate([awkward_draws(rng, chains, draws),
                        np.exp(3 * rng.standard_normal((chains, draws, 2)))], axis=2)
    x.reshape(-1, x.shape[2])[rng.choice(chains * draws, 3 * draws // 4), 11] = -0.0
    probs = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)
    with np.errstate(invalid="ignore"):  # inf - inf, as in numpy's own interpolation
        want = np.quantile(x.reshape(-1, x.shape[2]), probs, axis=0).T
    got = rd.diagnostics(x, rd.CONVERGENCE_KEYS, probs)
    assert got["quantiles"].shape == (x.shape[2], len(probs))
    np.testing.assert_array_equal(got.pop("quantiles"), want)
    for key, value in rd.diagnostics(x, rd.CONVERGENCE_KEYS).items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    np.testing.assert_array_equal(rd.diagnostics(x, (), probs)["quantiles"], want)
