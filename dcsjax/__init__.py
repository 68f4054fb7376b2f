"""dcsjax: scoring language models on multiple-choice benchmarks with JAX/Flax.

The public entry point is `load`, which returns a `Scorer` (see `dcsjax.engine.scorer`). The model stack (flax,
transformers) is imported on first use, so `import dcsjax.analysis` or `dcsjax.eval.results` stays light.
"""

from dcsjax.host import choose_jax_platforms

choose_jax_platforms()  # before JAX starts: no TPU here, no libtpu start-up lines (`dcsjax.host`)

from dcsjax.errors import CheckpointError, ConfigError, DcsjaxError, FetchError, InputError, UnknownModelError  # noqa: E402

__version__ = "0.1.0"
__all__ = ["load", "Scorer", "dcs", "loadings_from_threshold", "DcsjaxError", "CheckpointError", "ConfigError",
           "FetchError", "InputError", "UnknownModelError", "__version__"]

_LAZY = {"load": "dcsjax.engine.load", "Scorer": "dcsjax.engine.scorer", "dcs": "dcsjax.metrics.dcs",
         "loadings_from_threshold": "dcsjax.metrics.dcs"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dcsjax' has no attribute {name!r}")
