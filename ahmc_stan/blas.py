"""OpenBLAS's threads in this process: the pools found once, and one thread for a while
without rebuilding the pool.

After a fork OpenBLAS shuts its thread pool down and builds it again at the next call
that asks for threads, with a thread per core that spins for about 0.1 s of CPU each time
it is woken (README, "AHMC against the best NUTS", stop 65).  A run's own linear algebra
(its chains, its decisions between runs, the diagnosis of its fit) is on arrays of one
fit, which one thread serves: asking for more after the chain workers' fork costs the
rebuild (on Neal's 100-d fit the diagnosis's first matrix product took 14–41 ms instead of
4–5 ms: README, "The diagnosis on one BLAS thread").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

__all__ = ["threadpools", "one_thread"]


@functools.lru_cache(maxsize=None)
def threadpools():
    """This process's thread pools (BLAS's), found once: the scan takes milliseconds."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def one_thread():
    """OpenBLAS on one thread in this process for the duration, by its thread count
    (``blas_cpu_number``) set directly: threadpoolctl's ``limit`` goes through
    ``openblas_set_num_threads``, which rebuilds the pool a fork shut down, with threads
    that spin, at entry and again at exit (on the next call's chains).
    Set directly, the pool stays down and OpenBLAS rebuilds it at the next call that
    asks for threads, as after any fork.  Another BLAS, or an OpenBLAS without the
    symbol: threadpoolctl's ``limit``.  Nested uses restore what the outer one set."""
    saved = []
    for lib in threadpools().info():
        if lib.get("user_api") != "blas":
            continue
        if lib.get("internal_api") != "openblas":  # MKL, BLIS: threadpoolctl's way
            saved = None
            break
        try:
            count = ctypes.c_int.in_dll(ctypes.CDLL(lib["filepath"]), "blas_cpu_number")
        except (OSError, ValueError):
            saved = None
            break
        saved.append((count, count.value))
    if saved is None:
        with threadpools().limit(limits=1, user_api="blas"):
            yield
        return
    for count, _ in saved:
        count.value = 1
    try:
        yield
    finally:
        for count, value in saved:
            count.value = value
