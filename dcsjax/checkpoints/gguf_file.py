"""GGUF files: metadata, and tensors dequantised one at a time with the `gguf` package.

Tensors come out under transformers' names and in torch's (out, in) layout, with two llama.cpp
conventions undone the way transformers' GGUF loader undoes them: Llama q/k rows are permuted for
llama.cpp's interleaved rotary layout, and Gemma's norm weights are stored as w + 1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dcsjax.errors import CheckpointError

# GGUF tensor names -> transformers names, per architecture ({i} is the layer).
_COMMON = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
GGUF_TO_HF = {
    "llama": _COMMON | {"blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight"},
    "gemma3": _COMMON | {
        "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
        "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
        "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
        "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    },
}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def open_gguf(path: str | Path):
    """A `gguf.GGUFReader`, or a `CheckpointError` that names the file and says what is wrong."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as err:  # the reader raises ValueError, IndexError, struct.error, ... on a bad file
        raise CheckpointError(f"{path}: not a readable GGUF file (truncated or corrupt?): {err}") from err


def gguf_metadata(reader) -> dict[str, Any]:
    """Scalar and string metadata; the tokenizer's large arrays are left out."""
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.rsplit(".", 1)[-1] in {"tokens", "scores", "token_type", "merges"}:
            continue
        meta[key] = field.contents()
    return meta


def gguf_vocab_size(reader) -> int:
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def gguf_tensors(reader, arch: str, num_heads: int, num_kv_heads: int, source: str) -> Iterator[tuple[str, np.ndarray]]:
    """(transformers name, float32 array in torch layout), one tensor at a time."""
    from gguf.quants import dequantize

    names = GGUF_TO_HF[arch]
    for tensor in reader.tensors:
        match = _LAYER.match(tensor.name)
        key = f"blk.{{i}}.{match.group(2)}" if match else tensor.name
        if key not in names:
            raise CheckpointError(f"{source}: tensor {tensor.name} is not known for architecture {arch}")
        hf_name = names[key].format(i=match.group(1)) if match else names[key]
        try:
            w = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except Exception as err:
            raise CheckpointError(f"{source}: tensor {tensor.name} cannot be dequantised: {err}") from err
        w = w.reshape(tuple(int(s) for s in reversed(tensor.shape)))  # GGUF dims are (in, out)
        if arch == "llama" and key in ("blk.{i}.attn_q.weight", "blk.{i}.attn_q.bias"):
            w = unpermute_rotary(w, num_heads)
        elif arch == "llama" and key in ("blk.{i}.attn_k.weight", "blk.{i}.attn_k.bias"):
            w = unpermute_rotary(w, num_kv_heads)
        elif arch == "gemma3" and key.endswith("norm.weight"):
            w = w - 1.0
        yield hf_name, w


def unpermute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: rows (head, pair, 2) -> (head, 2, pair)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
