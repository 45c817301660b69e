"""A call's chains in forked worker processes: forked for the call, or kept from one
call to the next.

:func:`share` runs a call's chains in this process and in ``n`` forked workers, each
taking the next chain from a shared counter when free.  Forking them for every call
costs the fork, the children's exits, and the page faults of a first chain in a fresh
child and of this process's next writes (``benchmarks/fork_costs.py``).  Workers kept
between calls pay that once.

A kept worker runs the code and settings of the moment it was forked, so a call uses it
only when nothing a chain can see has changed since (:class:`Snapshot`) and its jobs
pickle without naming anything that could have (:class:`_JobPickler`); otherwise it
forks afresh, exactly as without kept workers.  Set :data:`KEEP` to False to fork for
every call; :func:`shutdown` ends the kept workers.

With kept workers a call may also start chains *late*: where more chains than workers
were asked for, the chains still waiting :data:`LATE_SECONDS` after the call began start
at once in more kept workers, sharing the cores with those running, instead of each
waiting for a chain to end.  A call's chains seldom take equal times (their tuners
choose different paths), and on two cores the last chain would otherwise run alone while
the other core idles; calls whose chains all start within :data:`LATE_SECONDS` run as
before.
"""

from __future__ import annotations

import atexit
import copy
import io
import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
import threading
import types
import warnings
import weakref
from typing import Any, Callable

import numpy as np

__all__ = ["KEEP", "IDLE_SECONDS", "LATE_SECONDS", "share", "shutdown", "Snapshot", "Slot",
           "slot"]

#: Keep chain workers from one call to the next (False: a fork for every call).
KEEP = True
#: A kept worker ends after this many seconds without a call (it holds this process's
#: memory of the moment it was forked, which this process may since have freed).
IDLE_SECONDS = 300.0
#: Seconds after which a call's chains still waiting for a worker start at once, beside
#: the running ones, in kept workers of their own (a call's ``late`` chains, :func:`share`).
LATE_SECONDS = 0.1

#: The top-level packages whose functions and classes a job sent to a kept worker may
#: name (pickled by reference, and so run as the worker has them): ahmc-stan's own
#: (watched by :class:`Snapshot`), and numpy's and the standard library's data types.
#: A function or class of anyone else's (a callback, a custom sampler) makes the call
#: fork afresh.
BY_REFERENCE = frozenset({"ahmc_stan", "numpy", "builtins", "copyreg", "collections",
                          "pathlib", "_codecs", "functools", "math", "datetime", "enum",
                          "_collections_abc", "types"})

_CTX = multiprocessing.get_context("fork") if os.name == "posix" else None


# -- chains forked for the call ------------------------------------------------------------


def share(jobs: list[tuple], n_workers: int, in_parent: bool, results: list,
          run_one: Callable, stopped: Callable[[], bool], begin: Callable[[], None],
          init: Callable[[], None], keep: bool = True, late: int = 0
          ) -> tuple[list, bool]:
    """``run_one(*job)`` for each of ``jobs`` on ``n_workers`` forked workers, with this
    process one more worker if ``in_parent`` (it takes the first job, so that a fast
    warmup's deciding chain starts first): the results in ``results`` (job order), and
    whether Ctrl-C stopped them.  A worker calls ``init()`` once, ``begin()`` before each
    call's jobs, and takes no job once ``stopped()``.  Kept workers where they may serve
    (:func:`_kept_share`) unless ``keep`` is False (the caller knows the jobs run code
    that :class:`Snapshot` does not watch), else workers forked for this call.  With kept
    workers, up to ``late`` more workers take the jobs still waiting
    :data:`LATE_SECONDS` after the start.  Ctrl-C: the chains running stop and keep their
    draws, none starts after it."""
    if KEEP and keep and in_parent and n_workers > 0:
        done = _kept_share(jobs, n_workers, results, run_one, stopped, begin, init, late)
        if done is not None:
            return done
    return _forked_share(jobs, n_workers, in_parent, results, run_one, stopped, init)


def _forked_share(jobs, n_workers, in_parent, results, run_one, stopped, init):
    """:func:`share` on workers forked for this call, which inherit the jobs (the model's
    library loaded, its data read) instead of unpickling them.  A worker leaves each
    result in a file and says so on its pipe, so it never waits for this process to
    read."""
    counter = _CTX.Value("i", 0)  # the next job; len(jobs) once stopped
    take, stop = _counter(counter, len(jobs))
    first = take() if in_parent else None  # taken before the workers take theirs
    folder = _results_folder()
    pipes: dict[Any, Any] = {}  # this process's end of each worker's pipe → the worker
    try:
        try:
            for _ in range(n_workers):
                ours, theirs = _CTX.Pipe(duplex=False)
                worker = _CTX.Process(target=_pull, name="ahmc-stan chain worker",
                                      args=(jobs, take, theirs, folder, run_one, stopped,
                                            init))
                worker.start()
                theirs.close()
                pipes[ours] = worker
            interrupted = _own_chains(jobs, first, take, results, run_one, stopped)
        except BaseException:  # the call fails: the workers' chains are not waited for
            stop()
            _end(pipes)
            raise
        if interrupted:
            stop()
        return results, _gather(pipes, folder, results, stop, interrupted)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _results_folder() -> str:
    # the temporary directory, not /dev/shm: a container's can hold 64 MB, less than one
    # chain of a large model; a file read back at once stays in the page cache
    return tempfile.mkdtemp(prefix="ahmc-chains-")


def _counter(counter, n: int) -> tuple[Callable[[], int | None], Callable[[], None]]:
    """``take()``: the next of ``n`` jobs from the shared ``counter`` (None when none is
    left); ``stop()``: none is left."""
    def take() -> int | None:
        with counter.get_lock():
            c = counter.value
            if c >= n:
                return None
            counter.value = c + 1
            return c

    def stop() -> None:
        with counter.get_lock():
            counter.value = n

    return take, stop


def _own_chains(jobs, first, take, results, run_one, stopped) -> bool:
    """This process's chains, from ``first`` on; whether Ctrl-C (or the deadline)
    stopped one, or came after one had made its draws (``stopped()``)."""
    c = first
    try:
        while c is not None:
            results[c] = run_one(*jobs[c])
            if results[c] is None or results[c].interrupted or stopped():
                return True  # Ctrl-C or the deadline: no chain starts after it
            c = take()
    except KeyboardInterrupt:
        return True
    return False


def _pull(jobs, take, pipe, folder, run_one, stopped, init) -> None:
    """A worker forked for a call: the next job while there is one (:func:`_serve_jobs`),
    then its pipe closed."""
    init()
    try:
        _serve_jobs(jobs, take, pipe, folder, run_one, stopped)
    finally:
        pipe.close()


def _serve_jobs(jobs, take, pipe, folder, run_one, stopped) -> None:
    """For each job taken, ``("start", c)`` on ``pipe``, the result (or the error)
    pickled to ``folder``, then ``("done", c)``."""
    while not stopped() and (c := take()) is not None:
        pipe.send(("start", c))
        try:
            out = (run_one(*jobs[c]), None)
        except BaseException as err:  # noqa: BLE001  (raised again in the parent)
            out = (None, err)
        try:
            data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:  # noqa: BLE001  (an error that does not pickle)
            data = pickle.dumps((None, RuntimeError(f"chain {c + 1}: {out[1]!r} ({err})")))
        with open(os.path.join(folder, f"{c}.pickle"), "wb") as f:
            f.write(data)
        pipe.send(("done", c))


def _gather(pipes: dict, folder: str, results: list, stop: Callable[[], None],
            interrupted: bool, kept: bool = False) -> bool:
    """Wait for the workers of ``pipes`` until each has closed its pipe (or, ``kept``,
    said ``("idle", None)``), putting their results in ``results``; whether Ctrl-C came
    (before, or meanwhile).  A worker's error is raised, as is a worker's death during a
    chain, unless after Ctrl-C; the other workers' chains are then stopped.  Kept workers
    are ended (:func:`_drop`) when one died or a chain failed, so that no message of this
    call is left for the next."""
    from multiprocessing.connection import wait

    running = dict.fromkeys(pipes)  # each worker's chain, None between chains
    died = False
    try:
        while running:
            try:
                ready = wait(list(running))
            except KeyboardInterrupt:  # the workers got SIGINT too: they return what they have
                interrupted = True
                stop()
                continue
            for pipe in ready:
                try:
                    what, c = pipe.recv()
                except EOFError:  # the worker is gone: done, or died during chain c
                    worker, c = pipes[pipe], running.pop(pipe)
                    died = kept
                    if not kept:
                        pipes.pop(pipe)
                        pipe.close()
                    if c is None:
                        if not kept:
                            threading.Thread(target=worker.join, daemon=True).start()
                        continue
                    worker.join()
                    err = _WorkerDied(f"the worker process running chain {c + 1} died (exit "
                                      f"code {worker.exitcode})")
                else:
                    if what == "idle":  # a kept worker took its last job of the call
                        running.pop(pipe)
                        continue
                    running[pipe] = c if what == "start" else None
                    if what == "start":
                        continue
                    if what == "error":
                        err = RuntimeError(f"a kept chain worker could not take the jobs: {c}")
                    else:
                        with open(os.path.join(folder, f"{c}.pickle"), "rb") as f:
                            results[c], err = pickle.load(f)
                if err is not None and not (interrupted and isinstance(
                        err, (KeyboardInterrupt, _WorkerDied))):
                    stop()
                    died = kept
                    if not kept:
                        _end(pipes)
                    raise err
    finally:
        if died:
            _drop()
    return interrupted


class _WorkerDied(RuntimeError):
    """A chain's worker process ended during the chain (a crash in native code, a kill)."""


def _end(pipes: dict) -> None:
    """Stop the workers of ``pipes`` now (the call fails): their chains are lost."""
    for pipe, worker in pipes.items():
        worker.terminate()
    for pipe, worker in pipes.items():
        worker.join()
        pipe.close()


# -- what a kept worker may not have seen --------------------------------------------------


def _ours(name: str) -> bool:
    return name == "ahmc_stan" or name.startswith("ahmc_stan.")


class Snapshot:
    """What the chains of a call can see, taken when workers are forked:
    :meth:`unchanged` says whether it is all as it was.

    - Every ``ahmc_stan`` module's attributes; the attributes of each class defined in
      them; the contents of the lists, dicts and sets and the attributes of the plain
      objects they hold (three levels down); the functions' code and defaults.
    - The attributes of the modules they name (``np``, ``np.linalg``, ``math``, ...).
    - Which ``ahmc_stan`` modules are imported (a module imported later would be
      imported again, from disk, in the worker).
    - Each of ``objects``' attributes (the call's models), the same way as a module's.
    - ``sys.stdout``, ``sys.stderr``, ``sys.path``, the working directory, the
      environment, numpy's error settings and the warnings filters.

    Compared by equality, identity first: a value set to an equal one is no change.  Not
    seen: a change inside an array or object that a module holds beyond those levels."""

    def __init__(self, objects=()):
        self._modules = self._our_modules()
        self._attrs: list[tuple[Any, dict]] = []  # (object, a copy of its attributes)
        self._contents: list[tuple[Any, Any]] = []  # (container, a copy)
        self._functions: list[types.FunctionType] = []
        seen: set[int] = set()
        named: list[types.ModuleType] = []
        for module in self._modules.values():
            self._watch(module, seen)
            for value in list(vars(module).values()):
                self._walk(value, 0, seen, named)
        for obj in objects:
            self._walk(obj, 0, seen, named, plain=True)
        for module in named:  # np, and the modules it names (np.linalg)
            self._watch(module, seen)
            for value in list(vars(module).values()):
                if isinstance(value, types.ModuleType):
                    self._watch(value, seen)
        self._code = self._function_state()
        self._environment = self._environment_state()

    @staticmethod
    def _our_modules() -> dict[str, types.ModuleType]:
        """Every ``ahmc_stan`` module but this one (whose state is the kept workers'
        own bookkeeping, which no chain reads)."""
        # str.startswith first: a cheap filter of the thousand or more modules loaded
        return {name: m for name, m in list(sys.modules.items())
                if name.startswith("ahmc_stan") and _ours(name)
                and name != __name__ and isinstance(m, types.ModuleType)}

    def _watch(self, obj, seen: set[int]) -> bool:
        if id(obj) in seen:
            return False
        seen.add(id(obj))
        self._attrs.append((obj, dict(vars(obj))))
        return True

    def _walk(self, obj, depth: int, seen: set[int], named: list, plain=False) -> None:
        if isinstance(obj, types.ModuleType):  # ours are each watched already
            if not _ours(obj.__name__) and id(obj) not in seen and obj not in named:
                named.append(obj)
            return
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, types.FunctionType):
            if _ours(getattr(obj, "__module__", None) or "") and id(obj) not in seen:
                seen.add(id(obj))
                self._functions.append(obj)
            return
        if depth > 3:
            return
        if isinstance(obj, (dict, list, set, bytearray)):
            if id(obj) in seen:
                return
            seen.add(id(obj))
            self._contents.append((obj, copy.copy(obj)))
            for item in list(obj.values() if isinstance(obj, dict) else obj):
                self._walk(item, depth + 1, seen, named)
            return
        if isinstance(obj, np.ndarray):
            if id(obj) not in seen and obj.size <= 100_000:
                seen.add(id(obj))
                self._contents.append((obj, obj.copy()))
            return
        if isinstance(obj, tuple):
            for item in obj:
                self._walk(item, depth + 1, seen, named)
            return
        ours = (isinstance(obj, type) and _ours(obj.__module__)) or (
            (plain or _ours(type(obj).__module__)) and not isinstance(obj, type)
            and hasattr(obj, "__dict__"))
        if ours and self._watch(obj, seen):
            for value in list(vars(obj).values()):
                self._walk(value, depth + 1, seen, named)

    def _function_state(self) -> list:
        return [(f.__code__, f.__defaults__, f.__kwdefaults__) for f in self._functions]

    @staticmethod
    def _environment_state() -> tuple:
        return (sys.stdout, sys.stderr, list(sys.path), os.getcwd(), dict(os.environ),
                np.geterr(), list(warnings.filters))

    def unchanged(self) -> bool:
        """Whether everything snapshotted is as it was."""
        try:
            return (self._modules == self._our_modules()
                    and all(_same_vars(vars(obj), attrs) for obj, attrs in self._attrs)
                    and all(_equal(obj, kept) for obj, kept in self._contents)
                    and self._code == self._function_state()
                    and _same_environment(self._environment, self._environment_state()))
        except Exception:  # noqa: BLE001  (a value whose comparison fails: changed)
            return False

    def changes(self) -> list[str]:
        """What changed, named (for tests and debugging; :meth:`unchanged` is the check)."""
        out = []
        if self._modules != self._our_modules():
            out.append("ahmc_stan modules imported")
        for obj, attrs in self._attrs:
            now, attrs = _without_caches(vars(obj)), _without_caches(attrs)
            for key in sorted(set(attrs) | set(now)):
                try:
                    same = key in attrs and key in now and bool(attrs[key] == now[key]) \
                        if attrs.get(key) is not now.get(key) else True
                except Exception:  # noqa: BLE001
                    same = False
                if not same:
                    out.append(f"{getattr(obj, '__name__', type(obj).__name__)}.{key}")
        out += [f"contents of {type(obj).__name__} {id(obj):#x}"
                for obj, kept in self._contents if not _safe_equal(obj, kept)]
        out += [f"{f.__module__}.{f.__qualname__}" for f, state in
                zip(self._functions, self._code) if state != (
                    f.__code__, f.__defaults__, f.__kwdefaults__)]
        if not _same_environment(self._environment, self._environment_state()):
            out.append("environment")
        return out


#: Attributes that the standard library sets on a class as a cache the first time its
#: instances are pickled or copied (``copyreg``'s slot names): no change a chain can see.
_CACHES = frozenset({"__slotnames__"})


def _without_caches(attrs) -> dict:
    return {k: v for k, v in attrs.items() if k not in _CACHES}


def _same_vars(now, then: dict) -> bool:
    """Whether an object's attributes ``now`` are those recorded ``then``, up to
    :data:`_CACHES` (compared without a copy unless they differ)."""
    return now == then or _without_caches(now) == _without_caches(then)


def _equal(obj, kept) -> bool:
    if isinstance(obj, np.ndarray):
        return obj.shape == kept.shape and obj.dtype == kept.dtype and \
            bool(np.array_equal(obj, kept, equal_nan=obj.dtype.kind in "fc"))
    return obj == kept


def _safe_equal(obj, kept) -> bool:
    try:
        return bool(_equal(obj, kept))
    except Exception:  # noqa: BLE001
        return False


def _same_environment(then: tuple, now: tuple) -> bool:
    return then[0] is now[0] and then[1] is now[1] and then[2:] == now[2:]


# -- kept workers --------------------------------------------------------------------------


class Slot:
    """A condition and two doubles in shared memory, made before any kept worker is
    forked, so that kept workers have it too: what a call's chains share (a fast
    warmup's decision) when a kept worker runs some of them."""

    def __init__(self, index: int):
        self.index = index
        self.cond = _CTX.Condition()
        self.state = _CTX.RawArray("d", 2)


_SLOTS: list[Slot] = []
_FREE: list[int] = []
_SLOTS_LOCK = threading.RLock()  # (a slot's release can come from a collection)
N_SLOTS = 16


def slot() -> Slot | None:
    """A free :class:`Slot` (back in the pool when the returned object is collected),
    or None where workers cannot be kept (no fork, or a process forked from the slots'
    owner, whose slots the owner may be using) or all are in use."""
    if _CTX is None or not KEEP or os.getpid() != _OWNER:
        return None
    with _SLOTS_LOCK:
        _make_slots()
        if not _FREE:
            return None
        taken = _SLOTS[_FREE.pop()]
    handle = _SlotHandle(taken)
    weakref.finalize(handle, _release, taken.index)
    return handle


class _SlotHandle:
    """A :class:`Slot` lent to one owner (pickled for a kept worker as its index)."""

    def __init__(self, slot_: Slot):
        self.index, self.cond, self.state = slot_.index, slot_.cond, slot_.state

    def __reduce__(self):
        raise pickle.PicklingError("a Slot goes to a kept worker by its index only")


def _release(index: int) -> None:
    with _SLOTS_LOCK:
        _FREE.append(index)


def _make_slots() -> None:
    if not _SLOTS and _OWNER == os.getpid():
        _SLOTS.extend(Slot(i) for i in range(N_SLOTS))
        _FREE.extend(reversed(range(N_SLOTS)))


_OWNER = os.getpid()  # the process whose kept workers these are (not a fork of it)


class _Cold(Exception):
    """A job cannot go to a kept worker: the call forks afresh."""


class _JobPickler(pickle.Pickler):
    """Pickles jobs for a kept worker: a model as its place in the call's models
    (:attr:`models`), a :class:`Slot` as its index, and functions and classes (pickled
    by reference) only from :data:`BY_REFERENCE`'s packages, else :class:`_Cold`.
    (``reducer_override`` sees only objects that are not of Python's own data types: a
    chain's results to continue hold thousands of those.)"""

    def __init__(self, file, models_of):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.models: list = []
        self._models_of = models_of

    def reducer_override(self, obj):
        if isinstance(obj, self._models_of):
            if type(obj) is not self._models_of:
                raise _Cold(f"a model of class {type(obj).__qualname__}")
            for k, model in enumerate(self.models):
                if model is obj:
                    return _model, (k,)
            self.models.append(obj)
            return _model, (len(self.models) - 1,)
        if isinstance(obj, _SlotHandle):
            return _slot, (obj.index,)
        if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type,
                            types.ModuleType, types.MethodType)):
            _check_by_reference(obj)
        return NotImplemented


def _check_by_reference(obj) -> None:
    """:class:`_Cold` unless ``obj`` (a function, method, class or module) is one of
    :data:`BY_REFERENCE`'s packages' own, defined at a module's top level."""
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
    elif isinstance(obj, types.MethodType):
        name = getattr(obj.__func__, "__module__", None)
    else:
        name = getattr(obj, "__module__", None)
    if isinstance(obj, types.FunctionType) and ("<lambda>" in obj.__qualname__
                                                or "<locals>" in obj.__qualname__):
        raise _Cold(f"a local function {obj.__qualname__}")
    if not name or name.split(".")[0] not in BY_REFERENCE:
        raise _Cold(f"{name}.{getattr(obj, '__qualname__', obj)}")


_MODELS: list = []  # in a kept worker: the models it was forked with


def _model(k: int):
    """In a kept worker: the ``k``-th model it was forked with."""
    return _MODELS[k]


def _slot(k: int) -> "_SlotHandle":
    """In a kept worker: slot ``k``, which it inherited."""
    return _SlotHandle(_SLOTS[k])


def _load(blob: bytes, models: list):
    """The jobs of ``blob`` (:class:`_JobPickler`'s), their models ``models``."""
    _MODELS[:] = models
    return pickle.loads(blob)


class _Kept:
    """Workers forked at one moment, with the :class:`Snapshot` of that moment and the
    models they were forked with."""

    def __init__(self, n: int, models: list, init: Callable[[], None]):
        _make_slots()
        self.models = list(models)
        _settle(self.models)
        self.snapshot = Snapshot(self.models)
        self.counter = _CTX.Value("i", 0)
        self.pipes: dict[Any, Any] = {}  # results end → process
        self.commands: list = []
        for _ in range(n):  # (in sampling._execute's gc.freeze(), as any chain worker)
            ours, theirs = _CTX.Pipe(duplex=False)
            command_in, command_out = _CTX.Pipe(duplex=False)
            worker = _CTX.Process(target=_serve, name="ahmc-stan chain worker (kept)",
                                  args=(init, command_in, theirs, self.counter, self.models),
                                  daemon=True)
            worker.start()
            theirs.close()
            command_in.close()
            self.pipes[ours] = worker
            self.commands.append(command_out)

    def serves(self, n: int, models: list) -> bool:
        """Whether these workers may run a call on ``n`` workers with ``models`` (in the
        order its jobs name them): all alive, the same models, nothing changed."""
        return (len(self.pipes) >= n and all(w.is_alive() for w in self.pipes.values())
                and len(models) == len(self.models)
                and all(m is k for m, k in zip(models, self.models))
                and self.snapshot.unchanged())

    def end(self) -> None:
        for command in self.commands:
            command.close()
        for pipe, worker in self.pipes.items():
            worker.terminate()
        for pipe, worker in self.pipes.items():
            worker.join()
            pipe.close()
        self.pipes.clear()


def _settle(models: list) -> None:
    """Set what a process's first call sets as a side effect, before a :class:`Snapshot`
    records it: the models' facts cached on first use (``StanModel.settle``), the
    temporary directory's name (``tempfile.tempdir``, set by the first
    :func:`_results_folder`) and the ``multiprocessing`` modules that forking a worker
    and its pipes imports.  Left to the first call, they change the snapshot of that
    call's own workers, and the next call forks them again."""
    import multiprocessing.connection  # noqa: F401
    import multiprocessing.popen_fork  # noqa: F401

    for model in models:
        model.settle()
    tempfile.gettempdir()


_KEPT: _Kept | None = None
_LOCK = threading.Lock()  # one call at a time uses the kept workers


def _serve(init, commands, pipe, counter, models) -> None:
    """A kept worker: for each call, its jobs (:func:`_serve_jobs`), then
    ``("idle", None)``; it ends when this process closes its command pipe or ends, or
    after :data:`IDLE_SECONDS` without a call (a call that comes meanwhile finds it gone
    and runs its chains itself)."""
    init()
    while True:
        try:
            if not commands.poll(IDLE_SECONDS):
                break
            blob, n, folder = commands.recv()
        except (EOFError, OSError):
            break
        take, _ = _counter(counter, n)
        try:
            run_one, stopped, begin, jobs = _load(blob, models)
            begin()
            _serve_jobs(jobs, take, pipe, folder, run_one, stopped)
        except BaseException as err:  # noqa: BLE001  (the call fails in the parent)
            pipe.send(("error", repr(err)))
        pipe.send(("idle", None))
    pipe.close()


def _kept_share(jobs, n_workers, results, run_one, stopped, begin, init, late=0):
    """:func:`share` on kept workers, or None where they may not serve this call: another
    thread's call is using them, this process is a fork of their owner, or a job does
    not pickle for them (:class:`_JobPickler`).  They are forked again when
    :meth:`_Kept.serves` says no (something changed, or a worker is gone), ``n_workers +
    late`` of them; the ``late`` ones get the jobs only if some are still waiting
    :data:`LATE_SECONDS` after the start (:class:`_Later`)."""
    global _KEPT
    from .model import StanModel

    if _CTX is None or os.getpid() != _OWNER or not _LOCK.acquire(blocking=False):
        return None
    try:
        buffer = io.BytesIO()
        pickler = _JobPickler(buffer, StanModel)
        try:
            pickler.dump((run_one, stopped, begin, jobs))
        except Exception:  # noqa: BLE001  (_Cold, or a job that does not pickle)
            return None
        if _KEPT is None or not _KEPT.serves(n_workers + late, pickler.models):
            if _KEPT is not None:
                _KEPT.end()
            _KEPT = None
            _KEPT = _Kept(n_workers + late, pickler.models, init)
        kept = _KEPT
        with kept.counter.get_lock():
            kept.counter.value = 0
        take, stop = _counter(kept.counter, len(jobs))
        first = take()
        folder = _results_folder()
        message = (buffer.getvalue(), len(jobs), folder)
        pipes = {}  # the workers that got the jobs
        gone = []  # those that had ended (idle)
        workers = list(zip(kept.commands, kept.pipes))

        def send(chosen) -> None:
            for command, pipe in chosen:
                try:
                    command.send(message)
                except OSError:  # it ended meanwhile (idle): the others take its share
                    gone.append(pipe)
                    continue
                pipes[pipe] = kept.pipes[pipe]

        try:
            later = None
            try:
                send(workers[:n_workers])
                if late > 0:
                    later = _Later(lambda: send(workers[n_workers:n_workers + late]),
                                   kept.counter, len(jobs))
                interrupted = _own_chains(jobs, first, take, results, run_one, stopped)
            except BaseException:  # the call fails: its jobs' messages must not remain
                stop()
                if later is not None:
                    later.cancel()
                _drop()
                raise
            if later is not None:
                later.cancel()  # (after it, ``pipes`` holds every worker that got jobs)
            if interrupted:
                stop()
            interrupted = _gather(pipes, folder, results, stop, interrupted, kept=True)
            if gone:
                _drop()
            return results, interrupted
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        _LOCK.release()


class _Later:
    """``start()`` in a thread of its own :data:`LATE_SECONDS` from now, if jobs are still
    waiting then (the shared ``counter`` below ``n``), unless :meth:`cancel` came first;
    after :meth:`cancel` returns, ``start`` neither runs nor is running."""

    def __init__(self, start: Callable[[], None], counter, n: int):
        self._lock, self._over = threading.Lock(), False

        def fire() -> None:
            with self._lock:
                if self._over:
                    return
                self._over = True
                with counter.get_lock():
                    waiting = counter.value < n
                if waiting:
                    start()

        self._timer = threading.Timer(LATE_SECONDS, fire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._over = True


def _drop() -> None:
    """End the kept workers (a worker died, or the call failed): the next call forks."""
    global _KEPT
    if _KEPT is not None:
        _KEPT.end()
    _KEPT = None


def shutdown() -> None:
    """End the kept chain workers (they also end with this process)."""
    if _LOCK.acquire(timeout=10):  # (not while another thread's call uses them)
        try:
            if os.getpid() == _OWNER:
                _drop()
        finally:
            _LOCK.release()


def _forget() -> None:
    """In a process forked from this one (by anyone): the kept workers are not its own.
    They also leave multiprocessing's list of its children, whose exit would otherwise
    terminate them."""
    global _KEPT
    if _KEPT is not None:
        for worker in _KEPT.pipes.values():
            multiprocessing.process._children.discard(worker)
    _KEPT = None


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
