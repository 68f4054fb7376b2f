"""HF checkpoint directories: `config.json` + `*.safetensors`, read one tensor at a time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from dcsjax.errors import CheckpointError


def hf_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: broken JSON: {err}") from err


def _check_shards(directory: Path, files: list[Path]) -> None:
    """A sharded checkpoint's index names every shard: a missing one is named before any is read (an
    interrupted download), not found later as missing tensors."""
    for index in directory.glob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (json.JSONDecodeError, KeyError, AttributeError) as err:
            raise CheckpointError(f"{index}: not a safetensors index ({err})") from err
        missing = sorted(shards - {f.name for f in files})
        if missing:
            raise CheckpointError(f"{directory}: {index.name} names {len(shards)} shards; missing: {', '.join(missing)} "
                                  "(an interrupted download? fetch the checkpoint again)")


def hf_tensors(directory: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(name, float32 array) for every tensor of every `*.safetensors` file, streamed."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors files")
    _check_shards(directory, files)
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as f:
                for name in f.keys():
                    yield name, _to_float32(f, name)
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(f"{file}: not a readable safetensors file (truncated?): {err}") from err


def _to_float32(f, name: str) -> np.ndarray:
    import ml_dtypes  # noqa: F401  (lets numpy hold the bfloat16 tensors safetensors returns)

    return np.asarray(f.get_tensor(name), dtype=np.float32)
