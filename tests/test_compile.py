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
