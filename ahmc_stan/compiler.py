"""Compile a Stan program into a shared library that exports the BridgeStan C API.

The toolchain is the one the ``httpstan`` wheel ships (``stanc``, the Stan, Stan Math,
Eigen, Boost, Sundials and TBB headers and libraries), so nothing is downloaded.  A build
has three parts:

1. once per toolchain: a precompiled header of the Stan headers (``<cache>/pch-<key>``)
   and the object file of our C layer, ``csrc/ahmc_bridge.cpp`` (``<cache>/bridge-<key>``);
2. per model: ``stanc`` (at ``--O1``, :data:`DEFAULT_STANC_OPT`, unless ``stanc_args``
   choose a level) → C++ with ``csrc/ahmc_second_order.hpp`` (autodiff Hessians,
   ``fvar<var>``) and ``csrc/ahmc_third_order.hpp`` (third derivatives,
   ``fvar<fvar<var>>``) appended → one object file compiled against the precompiled
   header, in ``<cache>/models/<name>-<key>``.  Stan's ODE and algebraic solvers and 1-D
   integrators have no forward-mode instances: where the model's C++ does not compile with
   a snippet it is compiled without it (first the third-order one, then both), its
   ``build.log`` says so and why, and the C layer falls back to finite differences of
   autodiff gradients (:attr:`ahmc_stan.StanModel.hessian_method`);
3. a link of the two objects into ``model.so`` in ``lib-<key>`` inside the model's entry
   (so editing the C layer costs a link per model, not a compile).

Cache keys cover everything that changes the output: the Stan code and every file it
``#include``s, the stanc and g++ versions, the flags and our C layer's source.  Builds run
in a temporary directory and are renamed into place under a file lock, so concurrent
builds of one model neither corrupt the cache nor duplicate work; an entry without a
valid completion record is rebuilt, never loaded.

If the environment variable ``BRIDGESTAN`` names a BridgeStan source tree, models are
built with ``bridgestan.compile_model`` instead (our sampler entry points are then
absent and samplers fall back to the slower BridgeStan calls).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import filelock

__all__ = ["StanCompileError", "CompileError", "compile_model", "cache_dir", "toolchain",
           "diagnostics_library"]

#: Bumped whenever the build recipe changes in a way the hashed inputs do not show.
RECIPE_VERSION = "2"

_CSRC = Path(__file__).parent / "csrc"
_PCH_HEADER = "stan_pch.hpp"
_BRIDGE_SOURCE = "ahmc_bridge.cpp"
#: Headers of our own that the C layer includes (hashed into its key with it).
_BRIDGE_HEADERS = ("ahmc_low_rank.hpp", "ahmc_triangular.hpp", "ahmc_tuner.hpp")
#: Appended to every model's C++ (see those files); module variables so a test can swap them.
_SECOND_ORDER_SOURCE = _CSRC / "ahmc_second_order.hpp"
_THIRD_ORDER_SOURCE = _CSRC / "ahmc_third_order.hpp"
_COMPLETE = "COMPLETE.json"

_CXXFLAGS = [
    "-std=c++17",
    "-O3",
    "-fPIC",
    "-DSTAN_THREADS",
    # With STAN_THREADS every autodiff variable reaches the thread-local tape; in a
    # library loaded with dlopen the default (global-dynamic) TLS access is a call to
    # __tls_get_addr each time.  TLS descriptors (x86-64's gnu2 dialect; aarch64's
    # default) resolve it to an offset when the library's TLS fits in static TLS and
    # fall back safely when it does not.  Same arithmetic, a cheaper gradient
    # (benchmarks/bench_tls.py).
    *(["-mtls-dialect=gnu2"] if platform.machine().lower() in ("x86_64", "amd64") else []),
    "-D_REENTRANT",
    "-DBOOST_DISABLE_ASSERTS",
    "-DBOOST_PHOENIX_NO_VARIADIC_EXPRESSION",
    # httpstan's libtbb is built on manylinux2014 with the old C++ ABI.
    "-D_GLIBCXX_USE_CXX11_ABI=0",
    "-Wno-ignored-attributes",
    "-Wno-deprecated-declarations",
    "-Winvalid-pch",
]


class StanCompileError(ValueError):
    """stanc rejected the Stan program; the message is stanc's, naming the file."""

    def __init__(self, stan_file: Path, message: str):
        self.stan_file = Path(stan_file)
        self.stanc_message = message
        super().__init__(f"stanc could not compile {stan_file}:\n{message}")


class CompileError(RuntimeError):
    """The C++ compiler or linker failed; ``log_path`` holds the full build log."""

    def __init__(self, what: str, log_path: Path, tail: str):
        self.what, self.log_path, self.tail = what, Path(log_path), tail
        super().__init__(f"{what} failed; full log: {log_path}\n{tail}")


def cache_dir() -> Path:
    """Where compiled models live: ``$AHMC_STAN_CACHE``, else the user cache directory."""
    env = os.environ.get("AHMC_STAN_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("ahmc-stan"))


@dataclass(frozen=True)
class Toolchain:
    """The httpstan toolchain and compiler.  ``pch_key`` identifies the precompiled Stan
    headers (toolchain, compiler, flags); ``key`` adds our C layer's source."""

    httpstan_dir: Path
    stanc: Path
    stanc_version: str
    cxx: str
    cxx_version: str
    cxxflags: tuple[str, ...]
    pch_key: str
    key: str

    @property
    def include_dir(self) -> Path:
        return self.httpstan_dir / "include"

    @property
    def lib_dir(self) -> Path:
        return self.httpstan_dir / "lib"


def _sha256(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()


def _compiler() -> tuple[str, str]:
    """The C++ compiler (``$CXX``, else g++) and the first line of its ``--version``
    (read on each call: its callers cache what they build from it)."""
    cxx = os.environ.get("CXX", "g++")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             check=True).stdout.splitlines()[0]
    return cxx, version


@functools.lru_cache(maxsize=None)
def toolchain() -> Toolchain:
    """Locate stanc and the Stan headers in the installed httpstan package."""
    import httpstan

    httpstan_dir = Path(httpstan.__file__).parent
    stanc = httpstan_dir / "stanc"
    stanc_version = subprocess.run(
        [str(stanc), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    cxx, cxx_version = _compiler()
    flags = tuple(_CXXFLAGS)
    pch_key = _sha256(
        RECIPE_VERSION, str(httpstan_dir), getattr(httpstan, "__version__", "?"),
        stanc_version, cxx, cxx_version, " ".join(flags), (_CSRC / _PCH_HEADER).read_bytes(),
    )[:16]
    key = _sha256(pch_key, *((_CSRC / name).read_bytes()
                             for name in (_BRIDGE_SOURCE, *_BRIDGE_HEADERS)))[:16]
    return Toolchain(httpstan_dir, stanc, stanc_version, cxx, cxx_version, flags,
                     pch_key, key)


def _run(cmd: list[str], log: Path, what: str, cwd: Path | None = None) -> None:
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise CompileError(what, log, tail)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_complete(directory: Path) -> dict | None:
    """The completion record of a cache entry, or None if the entry is partial or corrupt
    (a file missing, or its size or SHA-256 not the recorded one)."""
    try:
        record = json.loads((directory / _COMPLETE).read_text())
        for name, expected in record["files"].items():
            path = directory / name
            if path.stat().st_size != expected["size"] or _file_digest(path) != expected["sha256"]:
                return None
        return record
    except (OSError, ValueError, KeyError, TypeError):
        return None


def invalidate(library: Path) -> None:
    """Drop the cache entry of a compiled library that failed to load, so that the next
    :func:`compile_model` rebuilds it."""
    entry = Path(library).parent
    with filelock.FileLock(str(entry) + ".lock"):
        (entry / _COMPLETE).unlink(missing_ok=True)


def _build_cached(final: Path, build) -> Path:
    """Return ``final`` if it holds a complete entry; otherwise build it exactly once.

    ``build(tmpdir)`` writes the entry's files into a fresh directory and returns the
    names of the files whose sizes and checksums the completion record checks.
    """
    if _read_complete(final) is not None:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(final) + ".lock"):
        if _read_complete(final) is not None:  # another process built it meanwhile
            return final
        tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
        try:
            try:
                names = build(tmp)
            except CompileError as err:  # keep the log where the message says it is
                kept = final.with_name(final.name + ".failed.log")
                shutil.copy(err.log_path, kept)
                raise CompileError(err.what, kept, err.tail) from None
            record = {
                "files": {n: {"size": (tmp / n).stat().st_size,
                              "sha256": _file_digest(tmp / n)} for n in names},
                "built": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            (tmp / _COMPLETE).write_text(json.dumps(record, indent=1))
            if final.exists():  # a partial or corrupt entry
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _pch_dir(tc: Toolchain) -> Path:
    """The precompiled Stan headers, built once per toolchain, compiler and flags."""

    def build(tmp: Path) -> list[str]:
        shutil.copy(_CSRC / _PCH_HEADER, tmp / _PCH_HEADER)
        _run([tc.cxx, *tc.cxxflags, f"-I{tc.include_dir}", "-x", "c++-header", _PCH_HEADER,
              "-o", _PCH_HEADER + ".gch"], tmp / "build.log", "precompiling the Stan headers",
             cwd=tmp)
        return [_PCH_HEADER + ".gch"]

    return _build_cached(cache_dir() / f"pch-{tc.pch_key}", build)


def _bridge_object(tc: Toolchain, pch: Path) -> Path:
    """Our C layer's object file, built once per version of its source."""

    def build(tmp: Path) -> list[str]:
        info = f'-DAHMC_BUILD_INFO="{tc.cxx_version}; {" ".join(tc.cxxflags)}"'
        _run([tc.cxx, *tc.cxxflags, f"-I{pch}", f"-I{tc.include_dir}", "-include",
              str(pch / _PCH_HEADER), info, "-c", str(_CSRC / _BRIDGE_SOURCE), "-o",
              "ahmc_bridge.o"], tmp / "build.log", "compiling the ahmc-stan C layer", cwd=tmp)
        return ["ahmc_bridge.o"]

    return _build_cached(cache_dir() / f"bridge-{tc.key}", build) / "ahmc_bridge.o"


_DIAGNOSTICS_SOURCE = "ahmc_diagnostics.cpp"
_DIAGNOSTICS_LIBRARY = "libahmc_diagnostics.so"
_DIAGNOSTICS_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-shared")


def diagnostics_library() -> Path:
    """The shared library of ``csrc/ahmc_diagnostics.cpp`` (rank-normalised R-hat and
    ESS, :mod:`ahmc_stan.rank_diagnostics`'s native path): plain C++ without Stan's
    headers, built once per source, compiler and flags into ``<cache>/diagnostics-<key>``
    (a second or two), under the cache's file lock."""
    cxx, version = _compiler()
    source = _CSRC / _DIAGNOSTICS_SOURCE
    key = _sha256(RECIPE_VERSION, cxx, version, " ".join(_DIAGNOSTICS_FLAGS),
                  source.read_bytes())[:16]

    def build(tmp: Path) -> list[str]:
        _run([cxx, *_DIAGNOSTICS_FLAGS, str(source), "-o", _DIAGNOSTICS_LIBRARY],
             tmp / "build.log", "compiling the native diagnostics", cwd=tmp)
        return [_DIAGNOSTICS_LIBRARY]

    return _build_cached(cache_dir() / f"diagnostics-{key}", build) / _DIAGNOSTICS_LIBRARY


_INCLUDE = re.compile(r'^\s*#include\s+[<"]?([^>"\s]+)[>"]?', re.MULTILINE)


def _stan_sources(stan_file: Path, include_paths: list[Path]) -> list[tuple[str, bytes]]:
    """The Stan file and, recursively, every file it ``#include``s that can be found."""
    seen: dict[Path, bytes] = {}
    stack = [stan_file]
    while stack:
        path = stack.pop().resolve()
        if path in seen:
            continue
        code = path.read_bytes()
        seen[path] = code
        for name in _INCLUDE.findall(code.decode(errors="replace")):
            for base in [path.parent, *include_paths]:
                candidate = base / name
                if candidate.is_file():
                    stack.append(candidate)
                    break
    return [(str(p), c) for p, c in seen.items()]


def _model_name(stan_file: Path) -> str:
    name = re.sub(r"\W", "_", stan_file.stem)
    if not name or name[0].isdigit():
        name = "m_" + name
    return name + "_model"


def run_stanc(stan_file: Path, out_cpp: Path, include_paths: list[Path],
              stanc_args: list[str] = ()) -> str:
    """Translate Stan to C++; returns stanc's warnings, raises StanCompileError."""
    tc = toolchain()
    cmd = [str(tc.stanc), "--name", _model_name(stan_file), "--o", str(out_cpp),
           *(f"--include-paths={p}" for p in include_paths), *stanc_args, str(stan_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise StanCompileError(stan_file, (proc.stderr + proc.stdout).strip())
    return proc.stderr.strip()


def stanc_info(stan_file: str | os.PathLike, include_paths=()) -> dict:
    """stanc's ``--info``: the program's variables by block with their types
    (``{"generated quantities": {"y_rep": {"type": "int", "dimensions": 1}}, ...}``),
    kept in the cache (``info/``) under the digest of stanc's version and the program's
    sources, so that stanc runs once per program, not once per process."""
    stan_file = Path(stan_file).resolve()
    tc = toolchain()
    includes = [Path(p).resolve() for p in include_paths]
    key = _sha256(tc.stanc_version, *map(str, includes),
                  *(c for _, c in sorted(_stan_sources(stan_file, includes))))[:16]
    kept = cache_dir() / "info" / f"{stan_file.stem}-{key}.json"
    try:
        return json.loads(kept.read_text())
    except (OSError, ValueError):  # not kept yet (or unreadable): stanc tells
        pass
    cmd = [str(tc.stanc), "--info", *(f"--include-paths={p}" for p in include_paths),
           str(stan_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise StanCompileError(stan_file, (proc.stderr + proc.stdout).strip())
    info = json.loads(proc.stdout)
    tmp = None
    try:  # whole or not at all: another process reads either the file or nothing
        kept.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=kept.name + ".", dir=kept.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(proc.stdout)
        os.replace(tmp, kept)
    except OSError:  # a read-only cache: stanc again next time
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return info


#: stanc's optimisation level for a model whose ``stanc_args`` name none: ``--O1``, stanc's
#: basic optimisations (``y ~ bernoulli_logit(alpha + X * beta)`` becomes the fused GLM
#: function, vectors and matrices of parameters become structs of arrays).  The density is
#: the same to rounding; where a GLM is fused, the log density without constants (``lp__``)
#: can differ from ``--O0``'s by a constant.  Where its C++ does not compile, stanc's
#: ``--O0`` output is built.
DEFAULT_STANC_OPT = "--O1"


def _chooses_level(stanc_args) -> bool:
    """Whether ``stanc_args`` name an optimisation level (``--O0``, ``--O1``, ...)."""
    return any(a.startswith("--O") for a in stanc_args)


def _stanc_args(stanc_args) -> list[str]:
    """``stanc_args`` with :data:`DEFAULT_STANC_OPT` first unless they choose a level."""
    args = list(stanc_args)
    return args if _chooses_level(args) else [DEFAULT_STANC_OPT, *args]


#: The derivative snippets tried, most capable first: (appended files, what the build log
#: says when this level is the one that compiled).
_SNIPPET_LEVELS = (
    (("second", "third"), None),
    (("second",), "without third-order autodiff: third derivatives (RMHMC) are finite "
                  "differences of autodiff Hessians or gradients"),
    ((), "without second-order autodiff: Hessians and Hessian-vector products are central "
         "differences of autodiff gradients, third derivatives second differences of them"),
)


def _compile_with_snippets(tc: Toolchain, pch: Path, tmp: Path, log: Path, what: str) -> None:
    """Compile ``tmp/model.cpp`` (stanc's output) into ``tmp/model.o`` with the most
    derivative snippets that compile (:data:`_SNIPPET_LEVELS`).  The model's own C++ is
    tried last, bare, so a model that stanc accepts always builds; a level is skipped
    when the previous failure shows that the snippet it keeps does not compile."""
    sources = {"second": _SECOND_ORDER_SOURCE, "third": _THIRD_ORDER_SOURCE}
    cpp = (tmp / "model.cpp").read_text()
    compile_cmd = [tc.cxx, *tc.cxxflags, f"-I{pch}", f"-I{tc.include_dir}", "-include",
                   str(pch / _PCH_HEADER), "-c"]
    failed_output = ""
    for level, (snippets, note) in enumerate(_SNIPPET_LEVELS):
        last = level == len(_SNIPPET_LEVELS) - 1
        if not last and any(sources[k].name in failed_output for k in snippets):
            continue
        name = f"model_{'_'.join(snippets) or 'bare'}.cpp"
        (tmp / name).write_text(cpp + "".join(f'\n#include "{sources[k]}"\n'
                                              for k in snippets))
        if note:
            first_error = next((line for line in failed_output.splitlines()
                                if "error:" in line), "").strip()
            with open(log, "a") as fh:
                fh.write(f"# {note}.\n# Why: the previous attempt did not compile; its "
                         f"first error: {first_error[:500]}\n")
        start = log.stat().st_size if log.exists() else 0
        try:
            _run([*compile_cmd, name, "-o", "model.o"], log, f"compiling the C++ of {what}",
                 cwd=tmp)
            return
        except CompileError:
            if last:
                raise
            with open(log, errors="replace") as fh:
                fh.seek(start)
                failed_output = fh.read()


def compile_model(stan_file: str | os.PathLike, *, stanc_args: list[str] = (),
                  include_paths: list[str | os.PathLike] = (), verbose: bool = False) -> Path:
    """Return the path of the shared library for ``stan_file``, building it if needed."""
    stan_file = Path(stan_file).resolve()
    if not stan_file.is_file():
        raise FileNotFoundError(f"no Stan file at {stan_file}")
    if os.environ.get("BRIDGESTAN"):
        import bridgestan

        bridgestan.set_bridgestan_path(os.environ["BRIDGESTAN"])
        return Path(bridgestan.compile_model(stan_file, stanc_args=_stanc_args(stanc_args),
                                             make_args=["STAN_THREADS=true"]))
    tc = toolchain()
    defaulted = not _chooses_level(stanc_args)  # the level is ours
    stanc_args = _stanc_args(stanc_args)
    includes = [Path(p).resolve() for p in include_paths]
    sources = _stan_sources(stan_file, includes)
    code_key = _sha256(tc.pch_key, " ".join(stanc_args), _SECOND_ORDER_SOURCE.read_bytes(),
                       _THIRD_ORDER_SOURCE.read_bytes(), *(c for _, c in sorted(sources)))[:16]
    model_dir = cache_dir() / "models" / f"{stan_file.stem}-{code_key}"
    lib_dir = model_dir / f"lib-{tc.key}"
    if _read_complete(lib_dir) is not None:
        return lib_dir / "model.so"

    # Syntax errors surface before any toolchain work, with stanc's own message.
    with tempfile.TemporaryDirectory() as tmp:
        run_stanc(stan_file, Path(tmp) / "check.cpp", [stan_file.parent, *includes],
                  list(stanc_args))
    pch = _pch_dir(tc)
    bridge = _bridge_object(tc, pch)

    def build_object(tmp: Path) -> list[str]:
        start = time.perf_counter()
        log = tmp / "build.log"
        shutil.copy(stan_file, tmp / "model.stan")
        warnings = run_stanc(stan_file, tmp / "model.cpp", [stan_file.parent, *includes],
                             list(stanc_args))
        log.write_text(warnings + "\n" if warnings else "")
        try:
            _compile_with_snippets(tc, pch, tmp, log, stan_file.name)
        except CompileError:
            if not defaulted:
                raise
            with open(log, "a") as fh:
                fh.write(f"# stanc {DEFAULT_STANC_OPT}'s C++ did not compile (above); built "
                         "from stanc --O0's instead.\n")
            run_stanc(stan_file, tmp / "model.cpp", [stan_file.parent, *includes],
                      ["--O0", *stanc_args[1:]])
            _compile_with_snippets(tc, pch, tmp, log, stan_file.name)
        if verbose:
            print(f"compiled {stan_file.name} in {time.perf_counter() - start:.1f} s")
        return ["model.o"]

    def link(tmp: Path) -> list[str]:
        _run([tc.cxx, "-shared", "-o", "model.so", str(model_dir / "model.o"), str(bridge),
              f"-L{tc.lib_dir}", "-ltbb", "-lsundials_cvodes", "-lsundials_idas",
              "-lsundials_kinsol", "-lsundials_nvecserial", f"-Wl,-rpath,{tc.lib_dir}"],
             tmp / "build.log", f"linking {stan_file.name}", cwd=tmp)
        return ["model.so"]

    _build_cached(model_dir, build_object)
    return _build_cached(lib_dir, link) / "model.so"
