"""A GGUF file's tokenizer, built from the file's own metadata without torch.

transformers' `AutoTokenizer.from_pretrained(dir, gguf_file=...)` reads the metadata with a reader that
imports torch, which only the test extra installs. The conversion itself (vocabulary, merges, special
tokens, pre-tokenizer, chat template) needs only `tokenizers`, so the metadata is read here
(`gguf_file.read_gguf`) and handed to transformers' converter: the same tokenizer, token for token
(`tests/test_tokenizer.py` compares the two on both real models).

Gemma 3's 262k-token vocabulary takes about 13 s to convert, so the result is kept under the cache,
keyed by the file's checksum, and rebuilt when the kept copy cannot be read or does not match the file.
"""

from __future__ import annotations

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
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, config = gguf_tokenizer_parts(file, source)
    try:
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except ValueError as err:
        raise CheckpointError(f"{source}: cannot build its tokenizer: {err}") from err
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)


def gguf_tokenizer(path: Path, file, sha256: str):
    """The file's tokenizer, from the cache when a sound copy for this checksum is there."""
    from transformers import PreTrainedTokenizerFast

    vocab_size = len(file.metadata.get("tokenizer.ggml.tokens", ()))
    saved = cache_dir() / "tokenizers" / sha256[:24]
    if saved.is_dir():
        try:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(saved)
            if len(tokenizer) == vocab_size:
                return tokenizer
            problem = f"{len(tokenizer)} tokens where the file has {vocab_size}"
        except Exception as err:  # a damaged cache: any parse error of its JSON files
            problem = f"{type(err).__name__}: {err}"
        warnings.warn(f"{saved}: the cached tokenizer of {path.name} is unusable ({problem}); rebuilding it",
                      stacklevel=2)
        shutil.rmtree(saved, ignore_errors=True)
    tokenizer = build_gguf_tokenizer(file, str(path))
    saved.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=saved.parent))
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, saved)  # atomic: a reader sees the whole folder or none
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer
