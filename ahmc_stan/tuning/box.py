"""The parameter box Γ searched by the Bayesian-optimisation tuner.

Wang, Mohamed & de Freitas (ICML 2013), Section 3: "we set Γ to be a box constraint
... The parameter L is discrete. The parameter ϵ is continuous, but since it is
one-dimensional, we can discretize it using a very fine grid."  A :class:`Box` is a list of
named :class:`Dimension` s, each continuous or integer, with inclusive bounds.  It knows
nothing about what the parameters mean.

Coordinates: the GP and the maximisers work on the unit cube ``[0, 1]^d``; dimension ``j``
maps affinely, ``u_j = (γ_j − b_l) / (b_u − b_l)``.  The paper's ARD length scales
``κ (b_u − b_l)`` (Section 3) are therefore simply ``κ`` on the unit cube.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["Dimension", "Box"]


@dataclass(frozen=True)
class Dimension:
    """One named axis of the box: ``[low, high]`` (continuous) or ``{low, ..., high}`` (integer)."""

    name: str
    low: float
    high: float
    integer: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a dimension needs a name")
        low, high = float(self.low), float(self.high)
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(f"{self.name}: bounds must be finite, got [{self.low}, {self.high}]")
        if low > high:
            raise ValueError(f"{self.name}: low {self.low} > high {self.high}")
        if self.integer:
            if low != round(low) or high != round(high):
                raise ValueError(f"{self.name}: integer bounds must be integers")
            low, high = float(round(low)), float(round(high))
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def width(self) -> float:
        """``b_u − b_l``."""
        return self.high - self.low

    @property
    def n_values(self) -> int | None:
        """Number of admissible values of an integer dimension; ``None`` if continuous."""
        return int(self.high - self.low) + 1 if self.integer else None


class Box:
    """A box Γ of named dimensions (paper Section 3).

    >>> box = Box([Dimension("eps", 0.01, 0.2), Dimension("L", 1, 100, integer=True)])
    >>> box.from_unit([0.0, 1.0])          # integer dims are rounded
    {'eps': 0.01, 'L': 100}

    Parameters
    ----------
    dims:
        The dimensions, in order.  Names must be unique.
    """

    def __init__(self, dims: Iterable[Dimension]):
        self.dims: tuple[Dimension, ...] = tuple(dims)
        if not self.dims:
            raise ValueError("a box needs at least one dimension")
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate dimension names in {names}")
        self.names: tuple[str, ...] = tuple(names)
        self.low = np.array([d.low for d in self.dims], dtype=float)
        self.high = np.array([d.high for d in self.dims], dtype=float)
        self.width = self.high - self.low
        self.is_integer = np.array([d.integer for d in self.dims], dtype=bool)
        self._grid_cache: dict[tuple[int, int], np.ndarray] = {}
        self._unit_grid_cache: dict[tuple[int, int], np.ndarray] = {}

    # ------------------------------------------------------------------ basics
    @property
    def ndim(self) -> int:
        """``d``, the dimension of Γ (enters β, Section 3)."""
        return len(self.dims)

    def __len__(self) -> int:
        return self.ndim

    def __repr__(self) -> str:
        parts = [
            f"{d.name}∈{{{int(d.low)}..{int(d.high)}}}" if d.integer else f"{d.name}∈[{d.low:g}, {d.high:g}]"
            for d in self.dims
        ]
        return f"Box({', '.join(parts)})"

    def length_scales(self, kappa: float = 0.2) -> np.ndarray:
        """The paper's ARD length scales ``κ (b_u − b_l)`` in the box's own units."""
        return kappa * self.width

    def center(self) -> dict[str, Any]:
        """The midpoint of the box (integer dims rounded to nearest, ties to even)."""
        return self.from_unit(np.full(self.ndim, 0.5))

    # ------------------------------------------------------------ conversions
    def to_array(self, gamma: Mapping[str, float] | Sequence[float] | np.ndarray) -> np.ndarray:
        """A point as a float array in box units, ordered like :attr:`names`."""
        if isinstance(gamma, Mapping):
            missing = [n for n in self.names if n not in gamma]
            if missing:
                raise KeyError(f"missing dimensions {missing}")
            return np.array([float(gamma[n]) for n in self.names], dtype=float)
        arr = np.asarray(gamma, dtype=float)
        if arr.shape[-1:] != (self.ndim,):
            raise ValueError(f"expected last axis of length {self.ndim}, got shape {arr.shape}")
        return arr

    def to_dict(self, x: Sequence[float] | np.ndarray) -> dict[str, Any]:
        """A single point (box units) as ``{name: value}``; integer dims as Python ``int``."""
        x = np.asarray(x, dtype=float).reshape(self.ndim)
        return {
            d.name: int(round(v)) if d.integer else float(v) for d, v in zip(self.dims, x)
        }

    def snap(self, x: Mapping[str, float] | Sequence[float] | np.ndarray) -> np.ndarray:
        """Clip into the box and round integer dims; works on ``(..., d)`` arrays."""
        arr = np.clip(self.to_array(x), self.low, self.high)
        return np.where(self.is_integer, np.round(arr), arr)

    def to_unit(self, x: Mapping[str, float] | Sequence[float] | np.ndarray) -> np.ndarray:
        """Box units → unit cube, ``(γ − b_l)/(b_u − b_l)``; a zero-width dim maps to 0."""
        arr = self.to_array(x)
        safe = np.where(self.width > 0, self.width, 1.0)
        return (arr - self.low) / safe

    def unit_to_box(self, u: Sequence[float] | np.ndarray) -> np.ndarray:
        """Unit cube → box units as an array, clipped and with integer dims rounded."""
        u = np.clip(np.asarray(u, dtype=float), 0.0, 1.0)
        return self.snap(self.low + u * self.width)

    def from_unit(self, u: Sequence[float] | np.ndarray) -> dict[str, Any]:
        """Unit cube → a single point as a dict (integer dims rounded)."""
        return self.to_dict(self.unit_to_box(u))

    # ------------------------------------------------------------- candidates
    def grid_counts(self, max_points: int = 20000, resolution: int = 200) -> list[int]:
        """Number of grid values per dimension for :meth:`grid`.

        Continuous dims start at ``resolution`` values, integer dims at all their values (or
        ``1`` for a zero-width dim).  While the product exceeds ``max_points`` the largest
        count is shrunk by 10% (never below 2), so big integer ranges are thinned evenly.
        """
        if max_points < 1 or resolution < 2:
            raise ValueError("need max_points >= 1 and resolution >= 2")
        counts = []
        for d in self.dims:
            if d.width == 0:
                counts.append(1)
            elif d.integer:
                counts.append(int(d.n_values))
            else:
                counts.append(int(resolution))
        while math.prod(counts) > max_points:
            j = int(np.argmax(counts))
            if counts[j] <= 2:
                break  # cannot shrink further; 2^d > max_points
            counts[j] = max(2, int(counts[j] * 0.9))
        return counts

    def axis_values(self, j: int, count: int) -> np.ndarray:
        """``count`` evenly spread values on dimension ``j`` (endpoints included).

        Integer dims: ``round(linspace(low, high, count))`` de-duplicated, i.e. every
        integer when ``count`` is the number of integers, an even sub-sample otherwise.
        """
        d = self.dims[j]
        if count <= 1 or d.width == 0:
            return np.array([d.low if d.width == 0 else d.low + 0.5 * d.width])
        vals = np.linspace(d.low, d.high, count)
        if d.integer:
            vals = np.unique(np.round(vals))
        return vals

    def grid(self, max_points: int = 20000, resolution: int = 200) -> np.ndarray:
        """The candidate set for the grid maximiser, shape ``(n, d)`` in box units.

        A fine grid on continuous dims × all integers on integer dims (Section 3), with
        ``n <= max_points`` (see :meth:`grid_counts`).  Cached; treat as read-only.
        """
        key = (int(max_points), int(resolution))
        if key not in self._grid_cache:
            counts = self.grid_counts(max_points, resolution)
            axes = [self.axis_values(j, c) for j, c in enumerate(counts)]
            mesh = np.meshgrid(*axes, indexing="ij")
            g = np.stack([m.ravel() for m in mesh], axis=-1)
            g.setflags(write=False)
            self._grid_cache[key] = g
        return self._grid_cache[key]

    def unit_grid(self, max_points: int = 20000, resolution: int = 200) -> np.ndarray:
        """:meth:`grid` mapped to the unit cube; cached and read-only (same row order)."""
        key = (int(max_points), int(resolution))
        if key not in self._unit_grid_cache:
            u = self.to_unit(self.grid(max_points, resolution))
            u.setflags(write=False)
            self._unit_grid_cache[key] = u
        return self._unit_grid_cache[key]
