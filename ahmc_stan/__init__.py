"""ahmc-stan: self-tuning MCMC samplers on Stan models, compared against CmdStan's NUTS."""

from .compiler import CompileError, StanCompileError, compile_model
from .model import DensityError, StanModel
from .native import NativeDensity
from .fit import Fit, load_fit
from .nuts import run_nuts
from .comparison import compare
from .convergence import ConvergenceWarning, Diagnosis, diagnose
from .sampling import load_output, tune_and_sample
from .tuning.stuck import StuckChainError

__version__ = "0.1.0"

__all__ = [
    "StanModel", "NativeDensity", "DensityError", "StanCompileError", "CompileError",
    "compile_model",
    "Fit", "load_fit", "run_nuts", "compare", "tune_and_sample", "load_output",
    "diagnose", "Diagnosis", "ConvergenceWarning", "StuckChainError",
]
