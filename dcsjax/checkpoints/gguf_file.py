"""GGUF files: the header read here, tensors dequantised one at a time with the `gguf` package.

Tensors come out under transformers' names and in torch's (out, in) layout, with two llama.cpp
conventions undone the way transformers' GGUF loader undoes them: Llama q/k rows are permuted for
llama.cpp's interleaved rotary layout, and Gemma's norm weights are stored as w + 1.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
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


def open_gguf(path: str | Path) -> GGUFFile:
    """The file's header and tensor views, or a `CheckpointError` that names the file and says what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    try:
        return read_gguf(path)
    except Exception as err:  # ValueError, UnicodeDecodeError, an unknown tensor type, ... on a bad file
        raise CheckpointError(f"{path}: not a readable GGUF file (truncated or corrupt?): {err}") from err


def gguf_metadata(file: GGUFFile) -> dict[str, Any]:
    """Scalar and string metadata; the tokenizer's large arrays are left out."""
    return {key: value for key, value in file.metadata.items()
            if not (key.startswith("tokenizer.ggml.") and key.rsplit(".", 1)[-1] in {"tokens", "scores", "token_type", "merges"})}


def gguf_vocab_size(file: GGUFFile) -> int:
    if "tokenizer.ggml.tokens" not in file.metadata:
        raise CheckpointError(f"{file.path}: the GGUF file holds no tokenizer (no tokenizer.ggml.tokens)")
    return len(file.metadata["tokenizer.ggml.tokens"])


def gguf_tensors(file: GGUFFile, arch: str, num_heads: int, num_kv_heads: int, source: str) -> Iterator[tuple[str, np.ndarray]]:
    """(transformers name, float32 array in torch layout), one tensor at a time."""
    from gguf.quants import dequantize

    names = GGUF_TO_HF[arch]
    for tensor in file.tensors:
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


# --- The file's header -------------------------------------------------------------------------------
# `gguf.GGUFReader` builds a numpy view per array element, which for Gemma 3's 262k-token vocabulary
# (tokens, scores, token types) took 14 s of every load on 2 cores (this reader: 0.4 s). It keeps the same
# layout rules (GGUF v2/v3, either byte order, `general.alignment`) and the same values, and reads each
# numeric array in one `np.frombuffer`; `tests/test_gguf_file.py` checks it against `gguf.GGUFReader`
# on both real files, key by key and tensor by tensor.

# GGUF value types (gguf.GGUFValueType): numeric ones as struct/numpy codes, then STRING = 8, ARRAY = 9.
_SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_GGUF_MAGIC = 0x46554747  # b"GGUF" read as a little-endian uint32
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first, i.e. (in, out) for a matrix
    data: np.ndarray  # a view of the file: typed for plain types, the raw blocks (uint8) for quantised ones


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # every key: numbers and bools as Python values, strings as str, arrays as lists
    tensors: list[GGUFTensor]


class _Header:
    """A cursor over the file's bytes that refuses to read past the end."""

    def __init__(self, data: np.ndarray, endian: str, pos: int):
        self.view, self.size, self.pos = memoryview(data), data.size, pos
        self.endian, self._structs = endian, {}  # one struct.Struct per format code, compiled once

    def _need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"{what} at byte {self.pos} runs past the end of the file ({self.size} bytes)")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, code: str, what: str):
        layout = self._structs.get(code) or self._structs.setdefault(code, struct.Struct(self.endian + code))
        return layout.unpack_from(self.view, self._need(layout.size, what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("Q", what)
        start = self._need(length, what)
        return str(self.view[start:start + length], "utf-8")

    def value(self, value_type: int, what: str):
        if value_type in _SCALAR_CODES:
            return self.scalar(_SCALAR_CODES[value_type], what)
        if value_type == _STRING:
            return self.string(what)
        if value_type == _ARRAY:
            item_type, count = self.scalar("I", what), self.scalar("Q", what)
            if item_type in _SCALAR_CODES:  # the whole array at once
                dtype = np.dtype(self.endian + _SCALAR_CODES[item_type])
                start = self._need(count * dtype.itemsize, what)
                return np.frombuffer(self.view, dtype, count, start).tolist()
            return [self.value(item_type, what) for _ in range(count)]  # strings, nested arrays
        raise ValueError(f"{what}: unknown value type {value_type}")


def read_gguf(path: str | Path) -> GGUFFile:
    """Metadata and tensor views of a GGUF file (v2 or v3); ValueError on anything malformed."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    path = Path(path)
    # a plain ndarray over the mapping: slices of a np.memmap pay for its __array_finalize__, which
    # gguf's dequantiser (splitting rows into blocks) would call hundreds of thousands of times
    data = np.asarray(np.memmap(path, dtype=np.uint8, mode="r"))
    if data.size < 8 or struct.unpack_from("<I", data, 0)[0] != _GGUF_MAGIC:
        raise ValueError("GGUF magic invalid")
    # A file written on a big-endian machine reads its version as 0x0N000000 here.
    endian = "<" if struct.unpack_from("<I", data, 4)[0] & 0xFFFF else ">"
    header = _Header(data, endian, pos=4)  # past the magic
    version = header.scalar("I", "the version")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
    tensor_count, kv_count = header.scalar("Q", "the tensor count"), header.scalar("Q", "the key count")
    metadata: dict[str, Any] = {}
    for index in range(kv_count):
        key = header.string(f"metadata key {index}")
        if key in metadata:
            raise ValueError(f"metadata key {key} appears twice")
        metadata[key] = header.value(header.scalar("I", key), key)
    infos = []
    for index in range(tensor_count):
        name = header.string(f"tensor {index}'s name")
        n_dims = header.scalar("I", name)
        shape = tuple(header.scalar("Q", name) for _ in range(n_dims))
        infos.append((name, shape, header.scalar("I", name), header.scalar("Q", name)))
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-header.pos // alignment) * alignment
    plain = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
             GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
             GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
             GGMLQuantizationType.I64: np.int64}
    tensors, names = [], set()
    for name, shape, raw_type, offset in infos:
        if name in names:
            raise ValueError(f"tensor {name} appears twice")
        names.add(name)
        tensor_type = GGMLQuantizationType(raw_type)
        block, block_bytes = GGML_QUANT_SIZES[tensor_type]
        n_bytes = int(np.prod(shape, dtype=np.int64)) * block_bytes // block
        start = data_start + offset
        if start + n_bytes > data.size:
            raise ValueError(f"tensor {name}'s data (bytes {start} to {start + n_bytes}) runs past the end "
                             f"of the file ({data.size} bytes)")
        numpy_shape = tuple(reversed(shape))
        if tensor_type in plain:
            view = data[start:start + n_bytes].view(np.dtype(plain[tensor_type]).newbyteorder(endian))
        else:
            view, numpy_shape = data[start:start + n_bytes], quant_shape_to_byte_shape(numpy_shape, tensor_type)
        tensors.append(GGUFTensor(name, tensor_type, shape, view.reshape(numpy_shape)))
    return GGUFFile(path, metadata, tensors)
