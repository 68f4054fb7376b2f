"""dcsjax: scoring language models on multiple-choice benchmarks with JAX/Flax.

The public entry point is `load`, which returns a `Scorer` (see `dcsjax.scorer`). The model stack (flax,
transformers) is imported on first use, so `import dcsjax.analysis` or `dcsjax.results` stays light.
"""

from dcsjax.errors import CheckpointError, ConfigError, DcsjaxError, FetchError, InputError, UnknownModelError

__version__ = "0.1.0"
__all__ = ["load", "Scorer", "dcs", "loadings_from_threshold", "DcsjaxError", "CheckpointError", "ConfigError",
           "FetchError", "InputError", "UnknownModelError", "__version__"]

_LAZY = {"load": "dcsjax.loading", "Scorer": "dcsjax.scorer", "dcs": "dcsjax.kernels.dcs",
         "loadings_from_threshold": "dcsjax.kernels.dcs"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dcsjax' has no attribute {name!r}")
