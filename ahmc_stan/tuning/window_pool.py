"""Cross-chain pooling of the warmup's metric windows: at the end of each of Stan's
windows every chain estimates its inverse metric from the window's draws (and gradients)
of all chains, each chain's centred on its own mean (the pooled within-chain
covariances), instead of from its own alone.  The chains still run apart; only the data
of the estimate are shared, so all chains end the window with the same metric.  Cross-chain
adaptation as in ChEES (Hoffman, Radul & Sountsov 2021) and MEADS (Hoffman & Sountsov
2022), here for the windowed estimators of :mod:`~ahmc_stan.tuning.windows`: with 4
chains a window of 100 draws in 86 dimensions becomes one of 400, away from the
Marchenko–Pastur noise of one chain's estimate.  Opt-in: where it pays and where it does
not is measured in ``README.md`` ("Pooled metric windows").

The chains run in processes of their own (forked after :class:`WindowPool` is made) and
wait for each other at every window's end.  A chain that leaves the common schedule (a
metric fallback, a stuck start, an error, Ctrl-C) leaves the pool: every window it has
not put in is then estimated by each chain from its own draws, as without pooling, and
none waits for it."""

from __future__ import annotations

import numpy as np

__all__ = ["WindowPool", "PoolMember"]


class WindowPool:
    """The shared buffers of ``chains`` chains of ``dims`` parameters whose windows have
    at most ``max_rows`` draws; ``ctx`` a multiprocessing context whose processes are
    forked after this is made.  Window ``k`` is pooled when every chain has put in its
    ``k``-th window, and given up by all when a chain leaves before it has: which
    windows are pooled depends only on which windows the chains put in, not on their
    timing.  Two buffers alternate between windows, so a chain writing its next window
    never overwrites one another chain still reads (it cannot finish the next window
    before them).  ``timeout`` (seconds) only guards against a worker that died without
    leaving."""

    def __init__(self, chains: int, dims: int, max_rows: int, ctx, timeout: float = 3600.0):
        self.chains, self.dims, self.max_rows, self.timeout = chains, dims, max_rows, timeout
        self._cond = ctx.Condition()
        self._data = ctx.RawArray("d", 2 * chains * 2 * max_rows * dims)
        self._rows = ctx.RawArray("q", 2 * chains)
        self._reached = ctx.RawArray("q", chains)  # windows put in, per chain
        self._left = ctx.RawArray("b", chains)

    def arrays(self):
        data = np.frombuffer(self._data, dtype=np.float64).reshape(
            2, self.chains, 2, self.max_rows, self.dims)
        return data, np.frombuffer(self._rows, dtype=np.int64).reshape(2, self.chains)

    def member(self, chain: int) -> "PoolMember":
        return PoolMember(self, chain)

    def _complete(self, k: int) -> bool:
        return all(r > k for r in self._reached)

    def _given_up(self, k: int) -> bool:
        return any(left and r <= k for left, r in zip(self._left, self._reached))


class PoolMember:
    """Chain ``chain``'s side of a :class:`WindowPool`."""

    def __init__(self, pool: WindowPool, chain: int):
        self.pool, self.chain, self.left, self.windows = pool, chain, False, 0

    def share(self, draws: np.ndarray, grads: np.ndarray | None = None):
        """This chain's window (``draws``, and ``grads`` for the gradient-based
        estimators) in, once every chain has put in its own: all chains' windows, each
        centred on its own mean, stacked in chain order (draws, grads or ``None``).
        ``None`` once a chain has left the pool before putting in this window
        (:meth:`leave`)."""
        pool, k = self.pool, self.windows
        if self.left:
            return None
        n = len(draws)
        if n > pool.max_rows or draws.shape[1] != pool.dims:
            self.leave()
            return None
        data, rows = pool.arrays()
        parity = k % 2
        slot = data[parity, self.chain]
        slot[0, :n] = draws
        if grads is not None:
            slot[1, :n] = grads
        rows[parity, self.chain] = n
        with pool._cond:
            pool._reached[self.chain] = k + 1
            pool._cond.notify_all()
            pool._cond.wait_for(lambda: pool._complete(k) or pool._given_up(k), pool.timeout)
            complete = pool._complete(k)
        if not complete:
            self.leave()
            return None
        self.windows += 1
        counts = rows[parity].copy()
        x = np.concatenate([data[parity, c, 0, :m] - data[parity, c, 0, :m].mean(0)
                            for c, m in enumerate(counts)])
        g = None if grads is None else np.concatenate(
            [data[parity, c, 1, :m] - data[parity, c, 1, :m].mean(0)
             for c, m in enumerate(counts)])
        return x, g

    def leave(self) -> None:
        """Leave the pool: every chain estimates the windows this one has not put in
        from its own draws."""
        if not self.left:
            self.left = True
            with self.pool._cond:
                self.pool._left[self.chain] = 1
                self.pool._cond.notify_all()
