"""The one cache folder: fetched wheels' payloads, converted tokenizers, benchmark data."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DCSJAX_CACHE"


def cache_dir() -> Path:
    """`$DCSJAX_CACHE`, else `$XDG_CACHE_HOME/dcsjax`, else `~/.cache/dcsjax`."""
    if os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dcsjax"
    root.mkdir(parents=True, exist_ok=True)
    return root
