"""The builder: clear errors, the compile cache, concurrent builds."""

import json
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from ahmc_stan import StanCompileError, StanModel, compile_model
from ahmc_stan.compiler import _file_digest, _read_complete

from .conftest import stan_model_path


def _fresh_model(tmp_path, name="fresh"):
    """A small Stan program with a unique comment, so its cache entry is new."""
    stan = tmp_path / f"{name}.stan"
    stan.write_text(f"// {uuid.uuid4()}\nparameters {{ real y; }} model {{ y ~ normal(1, 2); }}\n")
    return stan


def test_syntax_error_carries_stanc_message_and_file(tmp_path):
    stan = tmp_path / "broken.stan"
    stan.write_text("parameters { real x } model { x ~ normal(0, 1); }\n")
    with pytest.raises(StanCompileError) as info:
        compile_model(stan)
    message = str(info.value)
    assert "broken.stan" in message
    assert "Syntax error" in message or "Ill-formed" in message
    assert info.value.stan_file == stan.resolve()


def test_type_error_is_a_compile_error(tmp_path):
    stan = tmp_path / "typo.stan"
    stan.write_text("parameters { real x; } model { x ~ normal(0, undefined_sd); }\n")
    with pytest.raises(StanCompileError, match="undefined_sd"):
        compile_model(stan)


def test_missing_data_names_the_variable(mvn_data):
    data = {k: v for k, v in mvn_data.items() if k != "Sigma"}
    with pytest.raises(ValueError, match="Sigma"):
        StanModel(stan_model_path("mvn"), data)


def test_misshaped_data_names_the_variable(mvn_data):
    data = dict(mvn_data, mu=[1.0, 2.0])
    with pytest.raises(ValueError, match="mu"):
        StanModel(stan_model_path("mvn"), data)


def test_data_as_dict_file_or_json_text(tmp_path, mvn_data, mvn_model):
    import stanio

    text = stanio.dump_stan_json(mvn_data)
    path = tmp_path / "data.json"
    path.write_text(text)
    x = [0.1, 0.2, 0.3]
    want = mvn_model.log_density(x)
    assert StanModel(stan_model_path("mvn"), text).log_density(x) == want
    assert StanModel(stan_model_path("mvn"), path).log_density(x) == want


def test_cache_hit_is_fast_and_does_not_rebuild(tmp_path):
    stan = _fresh_model(tmp_path)
    lib = compile_model(stan)
    built = json.loads((lib.parent / "COMPLETE.json").read_text())["built"]
    mtime = lib.stat().st_mtime
    start = time.perf_counter()
    assert compile_model(stan) == lib
    assert time.perf_counter() - start < 1.0
    assert lib.stat().st_mtime == mtime
    assert json.loads((lib.parent / "COMPLETE.json").read_text())["built"] == built


def test_cache_key_covers_code_and_includes(tmp_path):
    (tmp_path / "prior.stanfunctions").write_text("real my_prior(real y) { return -y^2; }\n")
    stan = tmp_path / "with_include.stan"
    stan.write_text("functions {\n#include prior.stanfunctions\n}\n"
                    "parameters { real y; } model { target += my_prior(y); }\n")
    first = compile_model(stan)
    assert StanModel(stan).log_density([2.0]) == pytest.approx(-4.0)
    (tmp_path / "prior.stanfunctions").write_text(
        "real my_prior(real y) { return -2 * y^2; }\n")
    second = compile_model(stan)
    assert second != first
    assert StanModel(stan).log_density([2.0]) == pytest.approx(-8.0)


def test_stanc_info_is_kept_in_the_cache_by_the_programs_sources(tmp_path, monkeypatch):
    """stanc's ``--info`` runs once per program: a second process reads it from the
    cache; an included file changed is another program; an unreadable entry is asked
    again."""
    from ahmc_stan import compiler

    (tmp_path / "gq.stanfunctions").write_text("int twice(int k) { return 2 * k; }\n")
    stan = tmp_path / f"info_{uuid.uuid4().hex[:12]}.stan"  # no entry from other runs
    stan.write_text("functions {\n#include gq.stanfunctions\n}\n"
                    "parameters { real y; } model { y ~ normal(0, 1); }\n"
                    "generated quantities { int k = twice(1); real z = y; }\n")
    first = compiler.stanc_info(stan, [tmp_path])
    assert first["generated quantities"]["k"]["type"] == "int"
    (kept,) = (compiler.cache_dir() / "info").glob(f"{stan.stem}-*.json")
    runs = []
    real_run = subprocess.run
    monkeypatch.setattr(compiler.subprocess, "run",
                        lambda *a, **k: runs.append(a) or real_run(*a, **k))
    assert compiler.stanc_info(stan, [tmp_path]) == first and runs == []
    (tmp_path / "gq.stanfunctions").write_text("real twice(int k) { return 2.0 * k; }\n")
    stan.write_text(stan.read_text().replace("int k", "real k"))
    second = compiler.stanc_info(stan, [tmp_path])
    assert second["generated quantities"]["k"]["type"] == "real" and len(runs) == 1
    assert len(list((compiler.cache_dir() / "info").glob(f"{stan.stem}-*.json"))) == 2
    kept.write_text("{not json")
    stan.write_text(stan.read_text().replace("real k", "int k"))
    (tmp_path / "gq.stanfunctions").write_text("int twice(int k) { return 2 * k; }\n")
    assert compiler.stanc_info(stan, [tmp_path]) == first and len(runs) == 2
    assert json.loads(kept.read_text()) == first


def test_corrupt_entry_is_rebuilt(tmp_path):
    stan = _fresh_model(tmp_path)
    lib = compile_model(stan)
    lib.write_bytes(lib.read_bytes()[:1000])  # truncated library
    assert _read_complete(lib.parent) is None
    rebuilt = compile_model(stan)
    assert _read_complete(rebuilt.parent) is not None
    assert StanModel(stan).log_density([1.0]) == pytest.approx(0.0)


def test_entry_corrupted_in_place_is_rebuilt(tmp_path):
    """A library overwritten without changing its size fails its checksum and is rebuilt;
    one that fails to load even so (its record rewritten to match) is rebuilt by
    StanModel.  Loads happen in fresh processes: a process keeps a loaded library's
    mapping."""
    import os

    stan = _fresh_model(tmp_path, "flipped")
    lib = compile_model(stan)
    data = bytearray(lib.read_bytes())
    data[:4] = b"JUNK"  # no longer an ELF header; same size

    def corrupt():
        junk = lib.with_name("junk")
        junk.write_bytes(bytes(data))
        os.replace(junk, lib)

    def log_density_in_new_process():
        out = subprocess.run([sys.executable, "-c", (
            "import ahmc_stan; "
            f"print(ahmc_stan.StanModel({str(stan)!r}).log_density([1.0]))")],
            capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        return float(out.stdout.split()[-1])

    corrupt()
    assert _read_complete(lib.parent) is None
    assert log_density_in_new_process() == pytest.approx(0.0)
    assert lib.read_bytes()[:4] == b"\x7fELF"
    corrupt()  # and make the record agree with it: now only the load can tell
    record = json.loads((lib.parent / "COMPLETE.json").read_text())
    record["files"]["model.so"]["sha256"] = _file_digest(lib)
    (lib.parent / "COMPLETE.json").write_text(json.dumps(record))
    assert _read_complete(lib.parent) is not None
    assert log_density_in_new_process() == pytest.approx(0.0)
    assert lib.read_bytes()[:4] == b"\x7fELF"


def test_failed_build_keeps_its_log(tmp_path, monkeypatch):
    """A C++ failure names a build log that still exists after the build gave up."""
    from ahmc_stan import compiler

    stan = _fresh_model(tmp_path, "nolink")
    real_run = compiler._run

    def failing_link(cmd, log, what, cwd=None):
        if what.startswith("linking"):
            cmd = [*cmd, "-lno_such_library_here"]
        return real_run(cmd, log, what, cwd)

    monkeypatch.setattr(compiler, "_run", failing_link)
    with pytest.raises(compiler.CompileError) as err:
        compile_model(stan)
    assert err.value.log_path.is_file()
    assert "no_such_library_here" in err.value.log_path.read_text()
    assert str(err.value.log_path) in str(err.value)


def test_two_processes_build_one_model_once(tmp_path):
    stan = _fresh_model(tmp_path, "concurrent")
    script = textwrap.dedent(f"""
        import ahmc_stan
        lib = ahmc_stan.compile_model({str(stan)!r}, verbose=True)
        print("LIB", lib)
        print("LP", ahmc_stan.StanModel({str(stan)!r}).log_density([3.0]))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    libs = {line for out in outputs for line in out.splitlines() if line.startswith("LIB")}
    assert len(libs) == 1
    assert sum(out.count("compiled concurrent.stan") for out in outputs) == 1
    for out in outputs:
        assert "LP -0.5" in out
    leftovers = [p for p in stan_cache_dir(libs).parent.iterdir() if ".tmp-" in p.name]
    assert not [p for p in leftovers if p.name.startswith("concurrent-")]


def stan_cache_dir(libs):
    from pathlib import Path

    return Path(next(iter(libs)).split(" ", 1)[1]).parent


def _glm_model(tmp_path):
    """A logistic regression written as stanc --O1 rewrites it: ``bernoulli_logit(alpha +
    X * beta)`` becomes the fused GLM function and ``beta`` a struct of arrays."""
    stan = tmp_path / "glm.stan"
    stan.write_text(f"// {uuid.uuid4()}\n" + textwrap.dedent("""\
        data { int N; int K; matrix[N, K] X; array[N] int<lower=0, upper=1> y; }
        parameters { real alpha; vector[K] beta; }
        model {
          alpha ~ normal(0, 5);
          beta ~ normal(0, 2.5);
          y ~ bernoulli_logit(alpha + X * beta);
        }
        """))
    import numpy as np

    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 4))
    y = (rng.uniform(size=60) < 1 / (1 + np.exp(-X @ [1.0, -0.5, 0.2, 0.0]))).astype(int)
    return stan, {"N": 60, "K": 4, "X": X, "y": y}


def test_models_are_translated_at_stanc_o1_with_the_same_density(tmp_path):
    """By default stanc optimises (--O1); the density and gradient are those of its --O0
    translation, which ``stanc_args`` can still ask for."""
    import numpy as np

    stan, data = _glm_model(tmp_path)
    default = StanModel(stan, data)
    plain = StanModel(stan, data, stanc_args=["--O0"])
    cpp = lambda m: (m.lib_path.parent.parent / "model.cpp").read_text()  # noqa: E731
    assert "bernoulli_logit_glm_lpmf" in cpp(default)
    assert "bernoulli_logit_glm_lpmf" not in cpp(plain)
    assert default.hessian_method == plain.hessian_method == "autodiff"
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.normal(size=5)
        lp0, g0 = plain.log_density_gradient(x)
        lp1, g1 = default.log_density_gradient(x)
        assert lp1 == pytest.approx(lp0, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(g1, g0, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(default.log_density_hessian(x)[2],
                                   plain.log_density_hessian(x)[2], rtol=1e-9, atol=1e-12)


def test_o1_cpp_that_does_not_compile_is_built_from_o0(tmp_path, monkeypatch):
    """Where stanc --O1's C++ does not compile (here made so), the model is built from
    --O0's, and its build log says so."""
    from ahmc_stan import compiler

    real_stanc = compiler.run_stanc

    def stanc(stan_file, out_cpp, include_paths, stanc_args=()):
        warnings = real_stanc(stan_file, out_cpp, include_paths, stanc_args)
        if "--O1" in stanc_args:
            # a fatal error at once (an #error would let g++ compile the rest)
            out_cpp.write_text('#include "no_such_header_from_stanc_o1.hpp"\n'
                               + out_cpp.read_text())
        return warnings

    monkeypatch.setattr(compiler, "run_stanc", stanc)
    stan = _fresh_model(tmp_path, "o1_broken")
    model = StanModel(stan)
    assert model.log_density([1.0]) == pytest.approx(0.0)
    assert "built from stanc --O0's instead" in model.build_log.read_text()
    cpp = (model.lib_path.parent.parent / "model.cpp").read_text()
    flags = next(line for line in cpp.splitlines() if "stancflags = " in line)
    assert "--O0" in flags and "--O1" not in flags
