"""The bundled Stan programs: this folder, installed as the package ``ahmc_stan.stan_models``
(``pyproject.toml`` maps it), its ``.stan`` files package data read through
``importlib.resources``, so that they are found from a wheel as from the checkout."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

__all__ = ["directory", "stan_file"]


def directory() -> Path:
    """The folder of the bundled ``.stan`` files (a real folder: wheels install unzipped,
    and the compilers need a file path)."""
    return Path(os.fspath(resources.files(__name__)))


def stan_file(name: str) -> Path:
    """The bundled program ``name`` (``"logistic.stan"`` or ``"logistic"``)."""
    path = directory() / (name if name.endswith(".stan") else f"{name}.stan")
    if not path.is_file():
        raise FileNotFoundError(f"no bundled Stan model {name!r} in {path.parent}")
    return path
