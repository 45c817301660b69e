"""ahmc-stan: self-tuning MCMC samplers on Stan models, compared against CmdStan's NUTS."""

from .compiler import CompileError, StanCompileError, compile_model
from .model import DensityError, DensityKernel, StanModel

__version__ = "0.1.0"

__all__ = [
    "StanModel", "DensityKernel", "DensityError", "StanCompileError", "CompileError",
    "compile_model",
]
