"""`dcsjax.load`: a scorer from a model card name, a GGUF file, or an HF checkpoint directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import jax.numpy as jnp

from dcsjax.checkpoints.cards import ModelCard, model_card, model_card_names
from dcsjax.checkpoints.assemble import build_decoder, param_count, place_params
from dcsjax.checkpoints.gguf_file import gguf_metadata, gguf_vocab_size, open_gguf
from dcsjax.checkpoints.gguf_tokenizer import gguf_tokenizer
from dcsjax.checkpoints.hub import hub_snapshot, is_hub_id
from dcsjax.checkpoints.hf_dir import hf_config, hf_tensors
from dcsjax.errors import CheckpointError, ConfigError, UnknownModelError
from dcsjax.nn.config import DecoderConfig, config_from_gguf, config_from_hf
from dcsjax.engine.scorer import Scorer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def load(name_or_path: str | os.PathLike, *, dtype: str = "float32", document_start: str | None = None,
         variant: str | None = None, progress: bool = False, mesh=None, **scorer_options) -> Scorer:
    """A `Scorer` for a card name (fetched into the cache on first use), a GGUF file, an HF directory or a
    Hugging Face hub id (`org/name` or `org/name@revision`, through huggingface_hub's cache).

    dtype: parameter dtype ("float32" or "bfloat16"); log-probs are float32 either way.
    document_start: the token that starts a document, for a model whose tokenizer adds no BOS and that
    has no card (a card names it).
    variant: "base" or "instruct", for a model without a card (it decides APX's prompt and whether the
    letters are asked through the chat template); a card's own variant otherwise.
    mesh: "2x4" (data x model devices), a jax Mesh, or None: parameters load straight into their shards.
    batch_size (a scorer option): rows per batch, or "auto": the most that the device's free memory holds.
    """
    from dcsjax.checkpoints.fetch import fetch_model
    from dcsjax.nn.sharding import make_mesh

    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    if variant not in (None, "base", "instruct"):
        raise ConfigError(f"variant must be 'base' or 'instruct', not {variant!r}")
    try:
        mesh = make_mesh(mesh)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    text = str(name_or_path)
    card: ModelCard | None = None
    path = Path(text).expanduser()
    hub = None
    if is_hub_id(text):  # org/name[@revision]: a snapshot in huggingface_hub's cache, fetched where reachable
        path, hub = hub_snapshot(text)
    elif not path.exists() and "/" not in text and not text.endswith(".gguf"):
        if text not in model_card_names():
            raise UnknownModelError(
                f"unknown model {text!r}: not a model card ({', '.join(model_card_names())}), "
                "a GGUF file or an HF checkpoint directory")
        card = model_card(text)
        path = fetch_model(text, quiet=not progress)
    if path.is_dir():
        from dcsjax.checkpoints.export import saved_card

        base = saved_card(path)  # a directory dcsjax wrote keeps its model card's prompt format
        if base is not None and card is None:
            card = model_card(base)
        model, tokenizer = _load_hf_dir(path, DTYPES[dtype], mesh)
        identity = hub or {"hf_dir": path.name}  # the digest, not where the folder lies, says what it holds
        identity = {**identity, "sha256": hf_dir_digest(path)}
    elif path.suffix == ".gguf" or path.is_file():
        model, tokenizer, digest = _load_gguf(path, DTYPES[dtype], mesh, card.sha256 if card is not None else None)
        identity = {"gguf": path.name, "sha256": digest}
    else:
        raise CheckpointError(f"{path}: no such model file or directory")
    start = document_start_id(tokenizer, card, document_start, source=str(path))
    # results are filed under this name: a hub model under org--name, as huggingface_hub's cache spells it
    name = hub["hub"].replace("/", "--") if hub else path.name if path.is_dir() else (card.name if card else path.stem)
    variant = variant or (card.variant if card else None)
    # parameters and variant ride along so that `dcsjax report` can place the model on a size axis
    # the chat template decides the letter and APX prompts of an instruct model, so it names the model too
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    fingerprint = {**identity, "card": card.name if card else None, "dtype": dtype, "document_start": int(start),
                   "variant": variant, "parameters": param_count(model),
                   "chat_template": hashlib.sha256(template.encode()).hexdigest()[:16] if template else None}
    auto = scorer_options.get("batch_size") == "auto"
    if auto:
        del scorer_options["batch_size"]
    scorer = Scorer(model, tokenizer, start, name=name, card=card, progress=progress, mesh=mesh,
                    model_fingerprint=fingerprint, variant=variant, **scorer_options)
    if auto:  # the most rows the device's free memory holds (`batches.auto_batch_size`)
        from dcsjax.engine.batches import auto_batch_size

        scorer = scorer.replace(batch_size=auto_batch_size(scorer))
    return scorer


def load_config(name_or_path: str | os.PathLike) -> tuple[DecoderConfig, str]:
    """(the model's config, where it was read) without its weights: a published config's name
    (`models/configs/`), a config.json or an HF directory, a hub id (its config.json alone), a model card or
    a GGUF file (the file's header; a card's file is fetched once, as `load` would)."""
    import json

    from dcsjax.checkpoints.cards import published_config, published_config_names
    from dcsjax.checkpoints.fetch import fetch_model
    from dcsjax.checkpoints.hub import hub_config

    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    elif not path.exists() and published_config(text):
        path = published_config(text)
    elif not path.exists() and is_hub_id(text):
        path = hub_config(text)
    if path.suffix == ".json" and path.is_file():
        try:
            return config_from_hf(json.loads(path.read_text()), source=str(path)), str(path)
        except json.JSONDecodeError as err:
            raise CheckpointError(f"{path}: broken JSON: {err}") from err
    if not path.exists() and text not in model_card_names():
        raise UnknownModelError(f"unknown model {text!r}: not a published config ({', '.join(published_config_names())}), "
                                f"a model card ({', '.join(model_card_names())}), a config.json, an HF directory, "
                                "a hub id or a GGUF file")
    path = path if path.exists() else fetch_model(text, quiet=True)
    file = open_gguf(path)
    return config_from_gguf(gguf_metadata(file), gguf_vocab_size(file), source=str(path)), str(path)


def hf_dir_digest(path: Path) -> str:
    """What identifies an HF directory without reading gigabytes: its config and tokenizer files' bytes,
    and each weight file's name and size (a hub snapshot's folder name is its revision besides)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        digest.update(file.name.encode() + b"\0")
        if file.suffix in (".safetensors", ".bin", ".gguf"):
            digest.update(str(file.stat().st_size).encode())
        else:
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def document_start_id(tokenizer, card: ModelCard | None, override: str | None, source: str) -> int:
    """The tokenizer's BOS where it adds one by default, else the card's (or caller's) document start."""
    bos = tokenizer.bos_token_id
    probe = tokenizer("a")["input_ids"]
    if override is None and bos is not None and probe and probe[0] == bos:
        return int(bos)
    name = override or (card.document_start if card else None)
    if name is None:
        raise ConfigError(
            f"{source}: the tokenizer adds no BOS, so say which token starts a document "
            "(load(..., document_start='<|endoftext|>') or a model card's [text] document_start)")
    token_id = tokenizer.convert_tokens_to_ids(name)
    if token_id is None or token_id == tokenizer.unk_token_id and name != tokenizer.unk_token:
        raise ConfigError(f"{source}: document-start token {name!r} is not in the vocabulary")
    return int(token_id)


def _load_gguf(path: Path, dtype, mesh, sha256: str | None):
    """(model, tokenizer, the file's SHA-256); a card's checksum was checked when it was fetched. The file's
    conversion and tokenizer are kept in the cache after the first load (`checkpoints/converted.py`)."""
    from dcsjax.cache import sha256_file
    from dcsjax.checkpoints.converted import converted_gguf

    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    sha256 = sha256 or sha256_file(path)
    config, params, vocab_size = converted_gguf(path, sha256)
    model = place_params(config, params, str(path), dtype, mesh)
    return model, gguf_tokenizer(path, sha256, vocab_size), sha256


def _load_hf_dir(path: Path, dtype, mesh=None):
    from transformers import AutoTokenizer

    config = config_from_hf(hf_config(path), source=str(path / "config.json"))
    model = build_decoder(config, hf_tensors(path), str(path), dtype, mesh)
    return model, AutoTokenizer.from_pretrained(path)
