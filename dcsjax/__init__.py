"""dcsjax: scoring language models on multiple-choice benchmarks with JAX/Flax.

The public entry point is `load`, which returns a `Scorer` (see `dcsjax.scorer`).
"""

from dcsjax.errors import CheckpointError, ConfigError, DcsjaxError, FetchError, InputError, UnknownModelError
from dcsjax.kernels.dcs import dcs, loadings_from_threshold
from dcsjax.loading import load
from dcsjax.scorer import Scorer

__version__ = "0.1.0"
__all__ = ["load", "Scorer", "dcs", "loadings_from_threshold", "DcsjaxError", "CheckpointError", "ConfigError", "FetchError", "InputError",
           "UnknownModelError", "__version__"]
