"""Chain workers kept from one call to the next (``ahmc_stan.workers``): they give the
draws of workers forked for the call, and a call forks afresh whenever something a chain
can see has changed, a job names code from elsewhere, or a kept worker is gone."""

import functools
import io
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from ahmc_stan import sampling, tune_and_sample, workers
from ahmc_stan.model import StanModel
from ahmc_stan.samplers import ahmc as ahmc_module
from ahmc_stan.tuning import fast_warmup, hmc_warmup

from .conftest import stan_model_path

KW = dict(chains=4, draws=200, progress=False, diagnose=False, parallel=2)


def _kept_pids() -> list[int]:
    return [] if workers._KEPT is None else [w.pid for w in workers._KEPT.pipes.values()]


def _fresh(model, monkeypatch, **kw):
    """The same call on workers forked for it."""
    with monkeypatch.context() as m:
        m.setattr(workers, "KEEP", False)
        return tune_and_sample(model, **kw)


def test_kept_workers_give_the_draws_of_workers_forked_for_the_call(gauss2d, monkeypatch):
    """Calls on the same model reuse the kept worker (after the first calls, which also
    import and cache what later calls use) and give, seed for seed, the draws of workers
    forked for each call."""
    kept = {s: tune_and_sample(gauss2d, seed=s, **KW) for s in (1, 2)}
    pids = _kept_pids()
    kept[3] = tune_and_sample(gauss2d, seed=3, **KW)
    assert len(pids) == 1 and _kept_pids() == pids and pids[0] != os.getpid()
    for s, fit in kept.items():
        fresh = _fresh(gauss2d, monkeypatch, seed=s, **KW)
        np.testing.assert_array_equal(fit.draws, fresh.draws)
        np.testing.assert_array_equal(fit.warmup_draws, fresh.warmup_draws)
        assert fit.metadata["fast_warmup"] == fresh.metadata["fast_warmup"]


def test_a_setting_changed_between_calls_reaches_every_chain(gauss2d, monkeypatch):
    """A module setting changed after the workers were kept (the early warmup's longest
    trajectory): the next call forks afresh, and its draws are those of the new
    setting."""
    for s in (1, 2):
        before = tune_and_sample(gauss2d, seed=4, **KW)
    pids = _kept_pids()
    monkeypatch.setattr(hmc_warmup, "SMALL_EARLY_MAX_STEPS", 3)
    changed = tune_and_sample(gauss2d, seed=4, **KW)
    assert _kept_pids() and _kept_pids() != pids
    fresh = _fresh(gauss2d, monkeypatch, seed=4, **KW)
    np.testing.assert_array_equal(changed.draws, fresh.draws)
    assert not np.array_equal(changed.draws, before.draws)  # the setting matters here


def test_another_model_forks_afresh(gauss2d, mvn_model):
    tune_and_sample(gauss2d, seed=1, **KW)
    pids = _kept_pids()
    tune_and_sample(mvn_model, seed=1, **KW)
    assert _kept_pids() != pids and workers._KEPT.models == [mvn_model]


def test_a_kept_worker_killed_between_calls_is_forked_again(gauss2d, monkeypatch):
    for s in (1, 2):
        tune_and_sample(gauss2d, seed=s, **KW)
    (pid,) = _kept_pids()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    fit = tune_and_sample(gauss2d, seed=5, **KW)
    assert _kept_pids() and _kept_pids() != [pid]
    np.testing.assert_array_equal(fit.draws, _fresh(gauss2d, monkeypatch, seed=5, **KW).draws)


def test_an_idle_kept_worker_ends_and_the_next_call_forks_again(gauss2d, monkeypatch):
    """A kept worker ends after ``IDLE_SECONDS`` without a call (it holds memory this
    process may have freed); the next call forks afresh and gives the same draws."""
    monkeypatch.setattr(workers, "IDLE_SECONDS", 0.5)
    workers.shutdown()  # the next workers are forked with the short idle time
    for s in (1, 2):
        tune_and_sample(gauss2d, seed=s, **KW)
    (pid,) = _kept_pids()
    time.sleep(2.0)
    assert not workers._KEPT.pipes[next(iter(workers._KEPT.pipes))].is_alive()
    fit = tune_and_sample(gauss2d, seed=6, **KW)
    assert _kept_pids() and _kept_pids() != [pid]
    np.testing.assert_array_equal(fit.draws, _fresh(gauss2d, monkeypatch, seed=6, **KW).draws)


def test_a_worker_that_ends_as_a_call_begins_leaves_its_chains_to_this_process(
        gauss2d, monkeypatch):
    """A kept worker that ends between the call's check and its jobs (an idle one's
    time running out): the jobs it cannot take run here, and the draws are right."""
    for s in (1, 2):
        tune_and_sample(gauss2d, seed=s, **KW)
    (pid,) = _kept_pids()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    with monkeypatch.context() as m:
        m.setattr(workers._Kept, "serves", lambda self, n, models: True)  # the race
        fit = tune_and_sample(gauss2d, seed=7, **KW)
    assert workers._KEPT is None  # dropped: the next call forks afresh
    np.testing.assert_array_equal(fit.draws, _fresh(gauss2d, monkeypatch, seed=7, **KW).draws)


@pytest.mark.parametrize("change", [
    "module setting", "class attribute", "registry", "function defaults", "numpy function",
    "environment", "stderr", "numpy errors", "warnings filters", "module imported",
    "model attribute"])
def test_the_snapshot_sees_each_change_a_chain_could_see(change, gauss2d, monkeypatch):
    """Each kind of change :class:`~ahmc_stan.workers.Snapshot` watches is seen, and
    undoing it is seen as no change."""
    snapshot = workers.Snapshot([gauss2d])
    assert snapshot.unchanged(), snapshot.changes()
    with monkeypatch.context() as m:
        if change == "module setting":
            m.setattr(ahmc_module, "TAIL_CHECK_RATIO", 4.0)
        elif change == "class attribute":
            m.setattr(fast_warmup.FastWarmupMember, "at", 300)
        elif change == "registry":
            m.setitem(sampling.SAMPLERS, "mine", sampling.SAMPLERS["hmc"])
        elif change == "function defaults":
            m.setattr(sampling._run_one, "__defaults__", (3.0, None, None, None))
        elif change == "numpy function":
            m.setattr(np.linalg, "cholesky", lambda a: a)
        elif change == "environment":
            m.setenv("AHMC_STAN_TEST_VARIABLE", "1")
        elif change == "stderr":
            m.setattr(sys, "stderr", io.StringIO())
        elif change == "numpy errors":
            old = np.seterr(over="raise")
        elif change == "warnings filters":
            m.setattr(warnings, "filters", [("error", None, Warning, None, 0)])
        elif change == "module imported":
            m.setitem(sys.modules, "ahmc_stan._imported_later", types.ModuleType("x"))
        elif change == "model attribute":
            m.setattr(gauss2d, "data_json", '{"x": 1}')
        assert not snapshot.unchanged()
        assert snapshot.changes()
        if change == "numpy errors":
            np.seterr(**old)
    assert snapshot.unchanged(), snapshot.changes()


def test_the_snapshot_ignores_the_slot_names_that_pickling_caches():
    """Pickling an instance of a class (a chain's
    :class:`~ahmc_stan.sampling.ChainResult`, sent to a worker to continue it) sets the
    class's ``__slotnames__``, copyreg's cache of its slot names, the first time: no
    change a chain can see, so no fork in the middle of a call."""
    cls = sampling.ChainResult
    saved = cls.__dict__.get("__slotnames__")
    if saved is not None:
        del cls.__slotnames__
    try:
        snapshot = workers.Snapshot()
        pickle.dumps(cls(np.zeros((2, 1)), {}, 1, 1, 0.0, 0.0))
        assert "__slotnames__" in cls.__dict__
        assert snapshot.unchanged(), snapshot.changes()
    finally:
        if saved is not None:
            cls.__slotnames__ = saved


def test_a_second_call_in_a_fresh_process_keeps_the_first_calls_workers(tmp_path):
    """A process's first call fills what its later calls read (the model's integer
    variables and whether it constrains to itself, its native entry points, the
    temporary directory's name, the modules that forking imports) before it forks its
    kept workers: the second call runs on them, not on workers forked again."""
    script = tmp_path / "calls.py"
    script.write_text(textwrap.dedent(f"""
        import warnings
        warnings.simplefilter("ignore")
        from ahmc_stan import StanModel, tune_and_sample, workers
        model = StanModel({str(stan_model_path("mvn"))!r},
                          {{"D": 2, "mu": [0.0, 0.0], "Sigma": [[1.0, 0.5], [0.5, 1.0]]}})
        pids = []
        for seed in (1, 2, 3):
            tune_and_sample(model, seed=seed, chains=4, draws=200, progress=False,
                            diagnose=False, parallel=2)
            pids.append(sorted(w.pid for w in workers._KEPT.pipes.values()))
            print(seed, pids[-1], workers._KEPT.snapshot.changes(), flush=True)
        assert pids[0] == pids[1] == pids[2], pids
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _elsewhere():
    """A function of this test module's: a job naming it does not go to a kept worker."""


@pytest.mark.parametrize("job, kept", [
    (("ahmc", np.random.SeedSequence(1).spawn(2)[1], {"x": np.ones(3)}, Path("a"), None,
      1.5, (2, "b")), True),
    (("ahmc", {"callback": _elsewhere}), False),
    (("ahmc", {"callback": lambda rec: None}), False),
    (("ahmc", {"callback": functools.partial(_elsewhere)}), False),
    (("ahmc", {"callback": print}), True),  # a built-in of Python's own
    (("ahmc", types.SimpleNamespace(a=1)), True),
    (("ahmc", np.random.default_rng(1)), True),
])
def test_only_jobs_that_name_watched_code_go_to_kept_workers(job, kept, gauss2d):
    buffer = io.BytesIO()
    pickler = workers._JobPickler(buffer, StanModel)
    if not kept:
        with pytest.raises(workers._Cold):
            pickler.dump((gauss2d, *job))
        return
    pickler.dump((gauss2d, *job, gauss2d))
    assert pickler.models == [gauss2d]
    back = workers._load(buffer.getvalue(), [gauss2d])
    assert back[0] is gauss2d and back[-1] is gauss2d


def test_a_model_subclass_or_a_registered_sampler_forks_afresh(gauss2d):
    class Mine(StanModel):
        pass

    mine = Mine.__new__(Mine)
    with pytest.raises(workers._Cold):
        workers._JobPickler(io.BytesIO(), StanModel).dump((mine,))
    job = (gauss2d, "ahmc") + (None,) * 10
    assert sampling._built_in(job)
    sampling.register_sampler("mine_for_test", sampling.SAMPLERS["hmc"])
    try:  # a user's loader, though this one is ours: not watched
        sampling.SAMPLERS["mine_for_test"] = lambda: None
        assert not sampling._built_in((gauss2d, "mine_for_test") + (None,) * 10)
    finally:
        del sampling.SAMPLERS["mine_for_test"]


def test_a_slot_is_shared_with_kept_workers_and_freed_when_dropped():
    """A fast warmup's decision lives in a slot made before any kept worker: it goes to
    them by index, and the slot is free again once the decision is dropped."""
    fast = fast_warmup.FastWarmup(shared=workers.slot())
    index = fast._shared.index
    fast._post(True, 0.1)
    buffer = io.BytesIO()
    workers._JobPickler(buffer, StanModel).dump(fast)
    back = workers._load(buffer.getvalue(), [])
    assert back.decision is True and back._state[1] == 0.1
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(fast)  # only to a kept worker, by index
    free = len(workers._FREE)
    del fast, back
    import gc
    gc.collect()
    assert len(workers._FREE) == free + 1 and index in workers._FREE


def _script(body: str) -> str:
    return textwrap.dedent(f"""
        import os, signal, sys, ahmc_stan
        from ahmc_stan import workers
        signal.signal(signal.SIGINT, signal.default_int_handler)
        model = ahmc_stan.StanModel({str(stan_model_path("std_normal"))!r}, {{"D": 10}})
        short = dict(chains=4, warmup=200, draws=200, progress=False, diagnose=False,
                     parallel=2)
        for seed in (1, 2):  # the worker kept
            ahmc_stan.tune_and_sample(model, seed=seed, **short)
        pid = [w.pid for w in workers._KEPT.pipes.values()]
        print("READY", pid[0], flush=True)
    """) + textwrap.dedent(body)


def _interrupted(script: str, after: float) -> str:
    """The output of ``script`` run in a session of its own and sent SIGINT (what Ctrl-C
    in a terminal does) ``after`` seconds past its "READY" line; it must end cleanly."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout.readline().startswith("READY")
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    return out


def test_ctrl_c_on_a_call_of_kept_workers_keeps_the_draws_and_the_next_call_is_right():
    """Ctrl-C during a call on a kept worker: the call returns its draws, the worker is
    still kept, and the next call gives the draws of a worker forked for it."""
    script = _script("""
        fit = ahmc_stan.tune_and_sample(model, chains=2, warmup=300, draws=10**7, seed=1,
                                        progress=False, block_size=5, metric="identity",
                                        box=((0.01, 0.02), (50, 100)), parallel=2)
        print("INCOMPLETE", fit.incomplete, fit.draws.shape[0], flush=True)
        print("KEPT", [w.pid for w in workers._KEPT.pipes.values()] == pid, flush=True)
        after = ahmc_stan.tune_and_sample(model, seed=3, **short)
        print("REUSED", [w.pid for w in workers._KEPT.pipes.values()] == pid, flush=True)
        workers.KEEP = False
        fresh = ahmc_stan.tune_and_sample(model, seed=3, **short)
        print("SAME", (after.draws == fresh.draws).all(), flush=True)
    """)
    out = _interrupted(script, after=6)
    assert "INCOMPLETE True 2" in out and "KEPT True" in out, out
    assert "REUSED True" in out and "SAME True" in out, out


def test_a_kept_worker_that_dies_during_a_call_names_its_chain():
    """A kept worker killed during a chain: the call fails naming the chain, as with a
    worker forked for the call, and the next call forks afresh and is right.  (This
    process finds the death once its own chain has ended: 2·10⁶ draws, about 12 s here,
    with the kill 3 s into them.)"""
    script = _script("""
        try:
            ahmc_stan.tune_and_sample(model, chains=2, warmup=300, draws=2 * 10**6, seed=1,
                                      progress=False, block_size=5, metric="identity",
                                      box=((0.01, 0.02), (50, 100)), parallel=2)
        except RuntimeError as err:
            print("ERROR", err, flush=True)
        after = ahmc_stan.tune_and_sample(model, seed=3, **short)
        print("NEW", [w.pid for w in workers._KEPT.pipes.values()] != pid, flush=True)
        workers.KEEP = False
        fresh = ahmc_stan.tune_and_sample(model, seed=3, **short)
        print("SAME", (after.draws == fresh.draws).all(), flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ready = proc.stdout.readline().split()
    assert ready[0] == "READY"
    time.sleep(3)
    os.kill(int(ready[1]), signal.SIGKILL)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    assert "ERROR the worker process running chain 2 died (exit code -9)" in out, out
    assert "NEW True" in out and "SAME True" in out, out


def _workers_given_jobs(monkeypatch) -> list[int]:
    """How many kept workers got each call's jobs (recorded as the call gathers)."""
    counts: list[int] = []
    gather = workers._gather

    def counted(pipes, *args, **kw):
        if kw.get("kept"):
            counts.append(len(pipes))
        return gather(pipes, *args, **kw)

    monkeypatch.setattr(workers, "_gather", counted)
    return counts


def test_chains_still_waiting_start_late_beside_the_running_ones(gauss2d, monkeypatch):
    """``parallel=None`` on two cores, four chains: one kept worker besides this process
    gets the jobs at once, and the chains still waiting ``LATE_SECONDS`` later start in
    two more, sharing the cores; the draws are those of the chains run one after
    another."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(workers, "LATE_SECONDS", 0.0)  # while the first chains run
    kw = dict(chains=4, draws=200, progress=False, diagnose=False)
    given = _workers_given_jobs(monkeypatch)
    late = {s: tune_and_sample(gauss2d, seed=s, **kw) for s in (1, 2)}
    # each call's four chains went to three workers (a call's extension of fewer chains,
    # if any, to fewer)
    assert len(_kept_pids()) == 3 and given.count(3) >= 2
    for s, fit in late.items():
        alone = tune_and_sample(gauss2d, seed=s, parallel=False, **kw)
        np.testing.assert_array_equal(fit.draws, alone.draws)
        np.testing.assert_array_equal(fit.warmup_draws, alone.warmup_draws)


def test_chains_that_all_start_in_time_use_the_cores_workers_only(gauss2d, monkeypatch):
    """Where every chain has started before ``LATE_SECONDS``, the late workers get no
    jobs; with ``parallel`` a number, none is late."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(workers, "LATE_SECONDS", 600.0)
    kw = dict(chains=4, draws=200, progress=False, diagnose=False)
    given = _workers_given_jobs(monkeypatch)
    tune_and_sample(gauss2d, seed=1, **kw)
    monkeypatch.setattr(workers, "LATE_SECONDS", 0.0)
    tune_and_sample(gauss2d, seed=1, parallel=2, **kw)
    assert len(given) >= 2 and set(given) == {1}


def test_ctrl_c_while_late_chains_run_keeps_every_chains_draws():
    """Ctrl-C on a call whose waiting chains started late (two cores, four chains, all of
    them running by then): every chain's draws are returned, the kept workers stay, and
    the next call gives the draws of the chains run one after another."""
    script = textwrap.dedent(f"""
        import os, signal, ahmc_stan
        from ahmc_stan import workers
        os.cpu_count = lambda: 2
        signal.signal(signal.SIGINT, signal.default_int_handler)
        model = ahmc_stan.StanModel({str(stan_model_path("std_normal"))!r}, {{"D": 10}})
        short = dict(chains=4, warmup=200, draws=200, progress=False, diagnose=False)
        ahmc_stan.tune_and_sample(model, seed=1, **short)
        pid = [w.pid for w in workers._KEPT.pipes.values()]
        print("READY", flush=True)
        fit = ahmc_stan.tune_and_sample(model, chains=4, warmup=300, draws=10**7, seed=1,
                                        progress=False, block_size=5, metric="identity",
                                        box=((0.01, 0.02), (50, 100)), diagnose=False)
        print("INCOMPLETE", fit.incomplete, fit.chains, min(len(fit.chain_draws(c))
                                                            for c in range(4)) > 0, flush=True)
        print("KEPT", len(pid) == 3 and [w.pid for w in workers._KEPT.pipes.values()] == pid,
              flush=True)
        after = ahmc_stan.tune_and_sample(model, seed=3, **short)
        alone = ahmc_stan.tune_and_sample(model, seed=3, parallel=False, **short)
        print("SAME", (after.draws == alone.draws).all(), flush=True)
    """)
    out = _interrupted(script, after=4)
    assert "INCOMPLETE True 4 True" in out and "KEPT True" in out, out
    assert "SAME True" in out, out
