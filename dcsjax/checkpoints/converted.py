"""A GGUF file converted once: its decoder config and stacked float32 parameters, kept in the cache.

Loading a GGUF file dequantises every tensor in Python, block by block (gguf's dequantiser), and parses the
whole header, vocabulary strings included: about 3 s of each Gemma 3 270M load on 2 cores, and minutes for a
7B file. What that produces does not change between loads of the same file, so the first load keeps it under
`<cache>/converted/<file digest>-<conversion digest>/` (`config.json` and one safetensors file of the
parameters as `assemble.assemble_params` lays them out) and later loads read it back (a fraction of a second).

The conversion digest hashes the modules that decide the conversion (the GGUF reader and its tensor names,
the family tables, the config) and the gguf package's version: a change to any of them converts again rather
than reading what older code made. A kept copy that cannot be read is rebuilt with a warning, as the
tokenizer's is. Only models of up to `MAX_KEPT_BYTES` of float32 parameters are kept (a 7B file would take
28 GB of disk); larger ones are converted at each load.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

MAX_KEPT_BYTES = 4 << 30
_PARAMS, _CONFIG = "params.safetensors", "config.json"


@functools.cache
def conversion_digest() -> str:
    """What would change a converted copy: the converting modules' bytes and the dequantiser's version."""
    from importlib.metadata import version

    from dcsjax.checkpoints import assemble, gguf_file
    from dcsjax.nn import config

    digest = hashlib.sha256(version("gguf").encode())
    for module in (gguf_file, assemble, config):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:12]


def converted_gguf(path: Path, sha256: str):
    """(DecoderConfig, parameters by name, the vocabulary's token count) of the GGUF file whose digest is
    `sha256`: from the kept copy where a sound one is there, else converted (and kept when small enough)."""
    from dcsjax.cache import cache_dir

    folder = cache_dir() / "converted" / f"{sha256[:24]}-{conversion_digest()}"
    if (folder / _PARAMS).is_file():
        try:
            return _read(folder)
        except Exception as err:  # a damaged copy: a truncated file, broken JSON, a missing key
            warnings.warn(f"{folder}: the converted copy of {path.name} is unusable ({type(err).__name__}: {err}); "
                          "converting the file again", stacklevel=3)
            shutil.rmtree(folder, ignore_errors=True)
    config, params, vocab_size = convert_gguf(path)
    if sum(p.nbytes for p in params.values()) <= MAX_KEPT_BYTES:
        _write(folder, config, params, vocab_size)
    return config, params, vocab_size


def convert_gguf(path: Path):
    """(DecoderConfig, parameters by name, the vocabulary's token count), read and dequantised from the file."""
    from dcsjax.checkpoints.assemble import assemble_params
    from dcsjax.checkpoints.gguf_file import gguf_metadata, gguf_tensors, gguf_vocab_size, open_gguf
    from dcsjax.nn.config import config_from_gguf

    file = open_gguf(path)
    vocab_size = gguf_vocab_size(file)
    config = config_from_gguf(gguf_metadata(file), vocab_size, source=str(path))
    tensors = gguf_tensors(file, config.architecture, config.num_heads, config.num_kv_heads, str(path))
    return config, assemble_params(config, tensors, str(path)), vocab_size


def _read(folder: Path):
    from safetensors.numpy import load_file

    from dcsjax.nn.config import DecoderConfig

    saved = json.loads((folder / _CONFIG).read_text())
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["config"].items()}  # JSON has no tuples
    return DecoderConfig(**fields), load_file(folder / _PARAMS), int(saved["vocab_size"])


def _write(folder: Path, config, params: dict[str, np.ndarray], vocab_size: int) -> None:
    """Whole or absent: written in a folder beside it and renamed into place (a second process that wrote
    it first wins, and a reader never sees half a file)."""
    from safetensors.numpy import save_file

    tmp = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
        save_file({k: np.ascontiguousarray(v) for k, v in params.items()}, str(tmp / _PARAMS))
        (tmp / _CONFIG).write_text(json.dumps({"config": dataclasses.asdict(config), "vocab_size": vocab_size}))
        os.replace(tmp, folder)
    except Exception as err:  # this load goes on from memory either way
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / _PARAMS).is_file():  # not another process keeping it first: a full disk, a read-only cache
            warnings.warn(f"{folder}: the converted copy could not be kept ({type(err).__name__}: {err}); each load "
                          "converts the file again", stacklevel=4)
