"""The suite installable like any package: the bundled models are package data
(``ahmc_stan.stan_models``) read through ``importlib.resources``; every subpackage is listed
in ``pyproject.toml``.  CI builds a wheel and runs the quick suite from it (``.ci/run``)."""

import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from ahmc_stan.stan_models import directory, stan_file
from ahmc_stan.suite import STAN_MODELS, experiments

ROOT = Path(__file__).resolve().parent.parent


def test_every_experiment_model_resolves_through_importlib_resources():
    models = resources.files("ahmc_stan.stan_models")
    for name, exp in experiments().items():
        assert (models / exp.stan_file).is_file(), name
        assert stan_file(exp.stan_file) == Path(str(models / exp.stan_file))
    assert STAN_MODELS == directory() == Path(str(models))


def test_every_bundled_model_is_package_data():
    shipped = {p.name for p in resources.files("ahmc_stan.stan_models").iterdir()
               if p.name.endswith(".stan")}
    assert shipped == {p.name for p in (ROOT / "stan_models").glob("*.stan")}
    with pytest.raises(FileNotFoundError, match="no bundled Stan model"):
        stan_file("no_such_model")


def test_c_sources_are_package_data():
    csrc = resources.files("ahmc_stan") / "csrc"
    for name in ("ahmc_bridge.cpp", "ahmc_second_order.hpp", "ahmc_third_order.hpp",
                 "stan_pch.hpp"):
        assert (csrc / name).is_file(), name


def test_models_are_found_from_another_directory(tmp_path):
    """Not through the working directory: as an installed package finds them."""
    code = ("from ahmc_stan.suite import experiments; from ahmc_stan.stan_models import "
            "stan_file; print(stan_file(experiments()['pima'].stan_file))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert Path(out).is_file() and Path(out).name == "logistic.stan"


def test_pyproject_lists_every_subpackage():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "ahmc_stan").rglob("__init__.py")}
    assert set(config["packages"]) == found | {"ahmc_stan.csrc", "ahmc_stan.stan_models"}
    assert config["package-dir"] == {"ahmc_stan.stan_models": "stan_models"}
