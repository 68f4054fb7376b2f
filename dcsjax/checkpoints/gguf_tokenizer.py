"""A GGUF file's tokenizer, built from the file's own metadata without torch.

transformers' `AutoTokenizer.from_pretrained(dir, gguf_file=...)` reads the metadata with a reader that
imports torch, which only the test extra installs. The conversion itself (vocabulary, merges, special
tokens, pre-tokenizer, chat template) needs only `tokenizers`, so the metadata is read here
(`gguf_file.read_gguf`) and handed to transformers' converter: the same tokenizer, token for token
(`tests/test_tokenizer.py` compares the two on both real models).

Gemma 3's 262k-token vocabulary takes about 13 s to convert, so the result is kept under the cache,
keyed by the file's checksum and transformers' version, and rebuilt when the kept copy cannot be read or does
not match the file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from dcsjax.errors import CheckpointError
from dcsjax.cache import cache_dir


def gguf_tokenizer_parts(file, source: str) -> tuple[str, dict, dict]:
    """(architecture, tokenizer dict, tokenizer config) as transformers' GGUF converter takes them."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import _SPECIAL_TOKENS, GGUF_TOKENIZER_MAPPING

    if "tokenizer.ggml.tokens" not in file.metadata:
        raise CheckpointError(f"{source}: the GGUF file holds no tokenizer (no tokenizer.ggml.tokens)")
    meta = {key: value for key, value in file.metadata.items()
            if key.startswith("tokenizer.") or key == "general.architecture"}
    grouped = {group: {name: meta[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in meta}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        # as transformers' reader: llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise
        config.setdefault("add_bos_token", True)
    for name, key in _SPECIAL_TOKENS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return meta["general.architecture"], tokenizer, config


def build_gguf_tokenizer(file, source: str):
    """A transformers fast tokenizer from the GGUF metadata (no torch, no cache)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend_json, init = _convert(file, source)
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(backend_json), **init)


def _convert(file, source: str) -> tuple[str, dict]:
    """(the `tokenizers` backend as JSON, the keyword arguments transformers' wrapper takes): what the GGUF
    metadata converts to."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, config = gguf_tokenizer_parts(file, source)
    try:
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except ValueError as err:
        raise CheckpointError(f"{source}: cannot build its tokenizer: {err}") from err
    return backend.to_str(), {**config, **extra}


def _read_kept(folder: Path):
    """The wrapper made from a kept conversion, as from a fresh one, but reading the backend from its file
    (`tokenizers` parses it in Rust; a backend object handed over instead is deep-copied, and transformers'
    `from_pretrained` parses the 33 MB of Gemma 3's JSON in Python first)."""
    from transformers import PreTrainedTokenizerFast

    init = json.loads((folder / "init.json").read_text())
    backend = folder / "backend.json"
    if not backend.is_file():
        raise FileNotFoundError(backend)
    return PreTrainedTokenizerFast(tokenizer_file=str(backend), **init)


def gguf_tokenizer(path: Path, sha256: str, vocab_size: int, file=None):
    """The tokenizer of the GGUF file at `path` (whose digest is `sha256` and whose vocabulary has `vocab_size`
    tokens): from the cache when a sound copy is there, else converted from `file` (the file's header, read
    here when not given) and kept. The cache keeps what the conversion made, the backend's JSON and the
    wrapper's arguments (`tests/test_tokenizer.py` checks a kept copy against a fresh conversion)."""
    from dcsjax.checkpoints.gguf_file import open_gguf

    from importlib.metadata import version

    # keyed by the file and by the converter's version: another transformers may convert differently
    saved = cache_dir() / "gguf-tokenizers" / f"{sha256[:24]}-transformers-{version('transformers')}"
    if saved.is_dir():
        try:
            tokenizer = _read_kept(saved)
            if len(tokenizer) == vocab_size:
                return tokenizer
            problem = f"{len(tokenizer)} tokens where the file has {vocab_size}"
        except Exception as err:  # a damaged cache: a missing file, any parse error of its JSON files
            problem = f"{type(err).__name__}: {err}"
        warnings.warn(f"{saved}: the cached tokenizer of {path.name} is unusable ({problem}); rebuilding it",
                      stacklevel=3)
        shutil.rmtree(saved, ignore_errors=True)
    backend_json, init = _convert(file if file is not None else open_gguf(path), str(path))
    saved.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=saved.parent))
    (tmp / "backend.json").write_text(backend_json)
    (tmp / "init.json").write_text(json.dumps(init))
    tokenizer = _read_kept(tmp)
    try:
        os.replace(tmp, saved)  # atomic: a reader sees the whole folder or none
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer
