"""The one cache folder: fetched wheels' payloads, converted tokenizers, benchmark data."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from dcsjax.errors import writing

CACHE_ENV = "DCSJAX_CACHE"
CACHE_HINT = f"models and data are cached there: set {CACHE_ENV} to a folder with room that you can write"


def cache_dir() -> Path:
    """`$DCSJAX_CACHE`, else `$XDG_CACHE_HOME/dcsjax`, else `~/.cache/dcsjax`."""
    if os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dcsjax"
    with writing(root, CACHE_HINT):
        root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock on `name` in the cache while fetching into it: two processes that fetch the same
    model or dataset at once (two test workers, two runs started together) then download it once, and the
    second finds the first's whole copy instead of replacing files under its readers."""
    import fcntl

    path = cache_dir() / "locks" / f"{name}.lock"
    with writing(path, CACHE_HINT):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a")
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
