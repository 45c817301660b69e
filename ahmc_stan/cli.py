"""The ``ahmc-stan`` command line.

Subcommands live in :data:`COMMANDS`: name → :class:`Command` (help text, a function that
adds the subcommand's arguments to its parser, a function that runs it and returns the exit
status).  Adding a subcommand is adding an entry::

    COMMANDS["sample"] = Command("run one of our samplers", _sample_args, _sample)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

__all__ = ["main", "COMMANDS", "Command", "add_model_args", "add_run_args"]


@dataclass(frozen=True)
class Command:
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ---- shared arguments --------------------------------------------------------------------

def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``MODEL.stan`` and ``--data DATA.json``."""
    parser.add_argument("model", metavar="MODEL.stan", help="the Stan program")
    parser.add_argument("--data", metavar="DATA.json", default=None,
                        help="data in Stan's JSON format")


def add_run_args(parser: argparse.ArgumentParser, *, warmup: int | None = 1000,
                 draws: int = 1000, warmup_help: str | None = None) -> None:
    """``--chains --warmup --draws --thin --seed --output --output-dir``."""
    parser.add_argument("--chains", type=int, default=4, help="chains (default 4)")
    parser.add_argument("--warmup", type=int, default=warmup,
                        help=warmup_help or f"warmup iterations per chain (default {warmup})")
    parser.add_argument("--draws", type=int, default=draws,
                        help=f"sampling iterations per chain (default {draws})")
    parser.add_argument("--thin", type=int, default=1,
                        help="keep every THIN-th sampling iteration (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="random seed")
    parser.add_argument("--output", "-o", metavar="FIT.npz", default=None,
                        help="save the fit (load it with ahmc_stan.load_fit)")
    parser.add_argument("--output-dir", metavar="DIR", default=None,
                        help="stream the chains there as they run, then write fit.npz "
                             "and draws.csv (read it with ahmc_stan.load_output)")


def load_model(args: argparse.Namespace):
    from .model import StanModel

    return StanModel(args.model, args.data)


def print_diagnosis(fit, label: str | None = None) -> None:
    """The fit's convergence report (:meth:`Fit.diagnose`) on stderr."""
    print(f"\nDiagnosis of {label or fit.sampler or 'the fit'}:\n{fit.diagnose()}",
          file=sys.stderr)


def print_reruns(fit) -> None:
    """The notes of the run's chain reruns, slow chains, metric rerun and extension
    (:func:`tune_and_sample`), if any."""
    for rerun in ("chain_rerun", "slow_chains", "metric_rerun", "extension"):
        if rerun in fit.metadata:
            print(f"({fit.metadata[rerun]['note']})")


def report(fit, args: argparse.Namespace) -> None:
    """Print the summary and the efficiency line, and the convergence diagnosis on stderr;
    save the fit if ``--output`` was given."""
    import pandas as pd

    with pd.option_context("display.max_rows", 200, "display.max_columns", 20,
                           "display.width", 160,
                           "display.float_format", "{:.4g}".format):
        print(fit.summary())
    print()
    print(fit.efficiency_line())
    print_reruns(fit)
    sys.stdout.flush()
    print_diagnosis(fit)
    if getattr(args, "output", None):
        print(f"saved {fit.save(args.output)}")


# ---- nuts --------------------------------------------------------------------------------

def _nuts_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_run_args(parser)
    parser.add_argument("--adapt-delta", type=float, default=None,
                        help="target acceptance statistic (CmdStan default 0.8)")
    parser.add_argument("--max-treedepth", type=int, default=None,
                        help="maximum tree depth (CmdStan default 10)")
    parser.add_argument("--progress", action="store_true", help="show progress bars")


def _nuts(args: argparse.Namespace) -> int:
    from .nuts import run_nuts

    model = load_model(args)
    extra = {k: v for k, v in (("adapt_delta", args.adapt_delta),
                               ("max_treedepth", args.max_treedepth)) if v is not None}
    if args.output_dir:
        extra["output_dir"] = args.output_dir
    fit = run_nuts(model, chains=args.chains, warmup=args.warmup, draws=args.draws,
                   seed=args.seed, show_progress=args.progress, verbose=True,
                   diagnose=False, thin=args.thin, **extra)
    report(fit, args)
    return 0


# ---- sample ------------------------------------------------------------------------------

def _parse_option(text: str):
    """``name=value`` with value parsed as a Python literal when it is one."""
    import ast

    name, _, value = text.partition("=")
    try:
        return name.replace("-", "_"), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name.replace("-", "_"), value


def _sample_args(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_run_args(parser, warmup=None, warmup_help="warmup iterations per chain (default: "
                 "1000, CmdStan's, ahmc_stan.sampling.STAN_WARMUP; AHMC's 500 where its "
                 "first chain finds the posterior Gaussian, ahmc_stan.tuning.fast_warmup)")
    parser.add_argument("--sampler", default="ahmc",
                        help="one of ahmc_stan.sampling.SAMPLERS (default ahmc)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="a sampler option, e.g. --option metric=identity "
                             "--option 'box=((0.01, 0.2), (1, 100))' (repeatable)")
    parser.add_argument("--init", metavar="JSON|RADIUS", default=None,
                        help="initial values: a JSON file for every chain, or a number, "
                             "the radius of Stan's uniform initialisation (default 2)")
    parser.add_argument("--max-seconds", type=float, default=None, metavar="S",
                        help="time budget: stop after S seconds and keep what was drawn")
    parser.add_argument("--tuning-figure", metavar="PNG", default=None,
                        help="write the tuner's reward surface and trace to this file")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--no-metric-rerun", action="store_true",
                        help="keep the default metric's fit even when its chains leave a "
                             "tail under-explored or disagree and mix slowly "
                             "(tune_and_sample's metric_rerun)")
    parser.add_argument("--no-chain-rerun", action="store_true",
                        help="keep a chain that strayed into a region of negligible mass "
                             "or failed to adapt instead of running it again, and a chain "
                             "that mixes far slower than the others instead of sampling it "
                             "again in the best chain's parameters "
                             "(tune_and_sample's chain_rerun)")
    parser.add_argument("--no-extend", action="store_true",
                        help="return the draws asked for even when R-hat or ESS is "
                             "flagged while the chains mix, instead of running each chain "
                             "as many draws more (tune_and_sample's extend)")


def _sample(args: argparse.Namespace) -> int:
    from .sampling import tune_and_sample

    model = load_model(args)
    options = dict(_parse_option(o) for o in args.option)
    init = args.init
    try:
        init = float(init) if init is not None else None
    except ValueError:
        pass  # a file
    fit = tune_and_sample(model, sampler=args.sampler, chains=args.chains,
                          warmup=args.warmup, draws=args.draws, seed=args.seed, init=init,
                          max_seconds=args.max_seconds, thin=args.thin,
                          output_dir=args.output_dir,
                          progress=not args.no_progress, diagnose=False,
                          metric_rerun=not args.no_metric_rerun,
                          chain_rerun=not args.no_chain_rerun,
                          extend=not args.no_extend, **options)
    report(fit, args)
    if fit.incomplete:
        why = "out of time" if fit.metadata.get("out_of_time") else "interrupted"
        print(f"({why}: the fit holds the draws made so far)")
    if args.tuning_figure:
        fit.plot_tuning(path=args.tuning_figure)
        print(f"wrote {args.tuning_figure}")
    return 0


# ---- compare -------------------------------------------------------------------------------
# One subcommand, two forms: ``compare --suite paper [...]`` runs the papers' experiments
# (ahmc_stan.suite); ``compare MODEL.stan --data ... --samplers ahmc,nuts`` compares
# samplers on one model (compare_model).

def _compare_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", metavar="MODEL.stan", default=None,
                        help="single-model mode: the Stan program")
    parser.add_argument("--data", metavar="DATA.json", default=None,
                        help="single-model mode: data in Stan's JSON format")
    parser.add_argument("--samplers", default=None, metavar="A,B,...",
                        help="comma-separated samplers (NUTS always runs in suite mode)")
    parser.add_argument("--peers", default="nuts", metavar="A,B,...",
                        help="NUTS implementations to compare with (single-model mode): "
                             "nuts (CmdStan), nutpie, nutpie_lowrank (default nuts)")
    single = parser.add_argument_group("single-model mode")
    single.add_argument("--chains", type=int, default=4, help="chains (default 4)")
    single.add_argument("--warmup", type=int, default=None,
                        help="warmup iterations (default: each sampler's and peer's own: "
                             "1000 for ours and CmdStan's, AHMC's 500 on a posterior "
                             "that looks Gaussian, nutpie's own)")
    single.add_argument("--draws", type=int, default=1000, help="kept iterations (1000)")
    single.add_argument("--seed", type=int, default=None, help="random seed")
    single.add_argument("--csv", metavar="TABLE.csv", default=None,
                        help="also write the comparison table as CSV")
    suite = parser.add_argument_group("suite mode")
    suite.add_argument("--suite", choices=["paper"], default=None,
                       help="run a suite of experiments instead of one model")
    suite.add_argument("--quick", action="store_true",
                       help="the quick configuration (comparisons/README.md)")
    suite.add_argument("--repeats", type=int, default=None,
                       help="independent runs per model and sampler (default: 1 with "
                            "--quick, else the full configuration's)")
    suite.add_argument("--scheduler", metavar="ADDRESS", default=None,
                       help="run the jobs on this dask.distributed scheduler")
    suite.add_argument("--workers", type=int, default=None,
                       help="local worker processes (default: all cores)")
    suite.add_argument("--out", metavar="DIR", default="comparisons/results",
                       help="results folder (a quick/ or full/ subfolder is written)")
    suite.add_argument("--experiments", metavar="A,B,...", default=None,
                       help="run only these experiments (default: all of the mode)")
    suite.add_argument("--fresh", action="store_true",
                       help="rerun every job instead of reusing the finished ones kept "
                            "in the results folder's jobs/")


def compare_model(args: argparse.Namespace) -> int:
    """Single-model comparison (``compare MODEL.stan --data D.json --samplers ahmc
    --peers nuts,nutpie``): every sampler and peer on the same model, data, chains, draws and
    seed, and each at its own default warmup unless ``--warmup`` is given; prints the
    ``compare`` table ranked by ESS per gradient (fits that have not converged last,
    marked), with ratios to NUTS; each fit's diagnosis goes to stderr."""
    from .comparison import compare, to_markdown
    from .peers import PEERS, run_peer
    from .sampling import tune_and_sample

    model = load_model(args)
    split = lambda text: [s.strip() for s in text.split(",") if s.strip()]
    names = split(args.samplers or "ahmc") + split(args.peers)
    run = dict(chains=args.chains, draws=args.draws, seed=args.seed)
    if args.warmup is not None:  # else each sampler's and peer's own default
        run["warmup"] = args.warmup
    fits = {}
    for name in dict.fromkeys(names):
        fits[name] = (run_peer(name, model, diagnose=False, **run) if name in PEERS
                      else tune_and_sample(model, sampler=name, progress=False,
                                           diagnose=False, **run))
        print(fits[name].efficiency_line())
        print_reruns(fits[name])
    table = compare(fits)
    print()
    print(to_markdown(table, columns=[c for c in (
        "min_ess_bulk", "median_ess_bulk", "min_ess_per_grad", "min_ess_per_grad_total",
        "min_ess_per_s", "min_ess_per_grad / NUTS", "min_ess_per_s / NUTS", "max_rhat",
        "divergences") if c in table.columns]))
    sys.stdout.flush()
    for name, fit in fits.items():
        print_diagnosis(fit, name)
    if args.csv:
        table.to_csv(args.csv)
        print(f"wrote {args.csv}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    if (args.suite is None) == (args.model is None):
        raise ValueError("give exactly one of --suite NAME and MODEL.stan")
    if args.suite is None:
        return compare_model(args)
    from .suite import run_suite

    samplers = [s.strip() for s in args.samplers.split(",") if s.strip()] \
        if args.samplers else None
    only = [s.strip() for s in args.experiments.split(",") if s.strip()] \
        if args.experiments else None
    run_suite(args.suite, quick=args.quick, samplers=samplers, repeats=args.repeats,
              out_dir=args.out, client=args.scheduler, workers=args.workers, only=only,
              resume=not args.fresh, command="ahmc-stan " + " ".join(sys.argv[1:]))
    return 0


COMMANDS: dict[str, Command] = {
    "nuts": Command("sample with CmdStan's NUTS (the baseline)", _nuts_args, _nuts),
    "sample": Command("tune and sample with one of our samplers", _sample_args, _sample),
    "compare": Command("compare samplers with NUTS: the papers' suite (--suite) or one "
                       "model", _compare_args, _compare),
}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="ahmc-stan",
        description="Self-tuning MCMC samplers on Stan models, compared against "
                    "CmdStan's NUTS.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        cmd.configure(sub.add_parser(name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command].run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"ahmc-stan {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
