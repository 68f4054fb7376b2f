"""The slices of a layer's stacked weights and KV cache that a compiled program copies before reading them.

The engine's layers run under `lax.scan` over stacked arrays (leading axis `layers`): each iteration slices
its layer's weights and cache. A slice fused into the dot that reads it reads the stacked array in place; a
slice the compiler writes into a buffer of its own first is a copy. Where that buffer lies in device memory
(HBM on TPU, RAM on CPU) the copy is traffic on top of the reads the layer needs, written once and read once
more: on the CPU backend a decode step spends over half its operation time on such copies
(docs/throughput.md). On TPU the compiler also prefetches slices into on-chip memory (memory space 1 in the
layout, `S(1)`: VMEM) ahead of the dot; that is how the layer's data is read, not extra HBM traffic, and is
reported apart. `dcsjax plan` adds the HBM copies of a scanned decode step to its estimate;
`bench/tpu_copies.py` lists both kinds.

The optimised HLO text says it: a fusion of the entry, a loop body or another unfused computation whose
operations only move data (`MOVES`) writes its operands' elements, sliced or relaid out, into a buffer (a
fusion nested in a fused computation writes none). Each such buffer is named by the per-layer arrays of its
shape (sizes of 1 dropped, as a scan's slice keeps the layer axis at 1) or, relaid out, of its size, and by its
memory space.
"""

from __future__ import annotations

import math
import re

import jax

SIZE = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "pred": 1}
MOVES = {"parameter", "constant", "slice", "dynamic-slice", "bitcast", "copy", "tuple", "transpose", "reshape"}
_COMPUTATION = re.compile(r"(?m)^(?:ENTRY )?%(\S+) \(.*?\{\n(.*?)\n\}", re.S)
_OPCODE = re.compile(r"= (?:\([^=]*?\)|\S+) ([a-z][\w-]*)\(")
_FUSION = re.compile(r"(?m)^\s*%(\S+) = (\(.*?\)|\S+) fusion\(.*?kind=kLoop, calls=%([\w.\-]+)")
_CALLED_BY_FUSION = re.compile(r"fusion\(.*?kind=k\w+, calls=%([\w.\-]+)")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\](\{[^}]*\})?")  # dtype[dims]{layout}
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")  # in a layout; absent: 0, device memory (HBM)
MEMORY = {0: "HBM", 1: "VMEM"}  # TPU's memory spaces as XLA numbers them (1: on chip; 0 on CPU: RAM)


def _core(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def layer_leaves(state) -> list[tuple[str, object]]:
    """(name, array) of every stacked per-layer parameter (leading axis `layers`) of a model's state."""
    leaves = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        if "layers" in keys:
            leaves.append((str(keys[-1] if keys[-1] != "value" else keys[-2]), leaf))
    return leaves


def per_layer_shapes(state, cache_shard=None) -> dict[tuple, list[str]]:
    """A layer's shard shape on the largest device (sizes of 1 dropped) -> the names of the stacked arrays of
    that shape; cache_shard: the KV cache's shard shape [layers, rows, slots, kv heads, head size], if any."""
    names: dict[tuple, list[str]] = {}
    for name, leaf in layer_leaves(state):
        names.setdefault(_core(leaf.sharding.shard_shape(leaf.shape)[1:]), []).append(name)
    if cache_shard is not None:
        names.setdefault(_core(cache_shard[1:]), []).append("KV cache")
    return names


def _names(names_of: dict, core: tuple) -> list[str]:
    """The per-layer arrays a buffer of this shape holds: those of its shape, or else those of its number of
    elements (a relayout, such as q's [width, heads, head size] copied as [width, heads x head size])."""
    if core in names_of:
        return names_of[core]
    same_size = [name for shape, names in names_of.items() if math.prod(shape) == math.prod(core) for name in names]
    return same_size or ["?"]


def copied_slices(hlo: str, names_of: dict, least: int = 0) -> list[dict]:
    """The buffers of `least` bytes or more that the fusions of an optimised HLO text fill by moving data alone,
    grouped by dtype, shape and memory space and named by the per-layer arrays of that shape (`names_of`, from
    `per_layer_shapes`; "?" for none, such as the output head's vocabulary chunks): dicts with `of`, `shape`,
    `dtype`, `memory` ("HBM", "VMEM"), `bytes` (one buffer) and `buffers` (how many the text holds; a loop
    body's once)."""
    computations = _COMPUTATION.findall(hlo)
    opcodes = {name: set(_OPCODE.findall(body)) for name, body in computations}
    fused = set(_CALLED_BY_FUSION.findall(hlo))
    found: dict[tuple, dict] = {}
    for name, body in computations:
        if name in fused:  # TPU nests fusions (a slice or relayout in a dot's operand): no buffer of their own
            continue
        for _, outputs, called in _FUSION.findall(body):
            if not opcodes.get(called) or not opcodes[called] <= MOVES:
                continue
            for dtype, dims, layout in _ARRAY.findall(outputs):  # a multi-output fusion writes several buffers
                shape = tuple(int(d) for d in dims.split(",") if d)
                size = math.prod(shape) * SIZE.get(dtype, 4)
                if size < least:
                    continue
                space = _MEMORY_SPACE.search(layout)
                number = int(space.group(1)) if space else 0
                memory = MEMORY.get(number, f"S({number})")
                entry = found.setdefault((dtype, _core(shape), memory), {
                    "of": " or ".join(_names(names_of, _core(shape))), "shape": list(_core(shape)),
                    "dtype": dtype, "memory": memory, "bytes": size, "buffers": 0})
                entry["buffers"] += 1
    return list(found.values())


def layer_copy_bytes(hlo: str, names_of: dict, layers_per_text: int) -> dict[str, float]:
    """Bytes a layer copies, per chip, by memory space ("HBM", "VMEM"): the copies of per-layer arrays in the
    text over the layers it holds (1 for a scanned program, whose loop body is one layer; the depth for one
    written out)."""
    per_layer = dict.fromkeys(MEMORY.values(), 0.0)
    for c in copied_slices(hlo, names_of):
        if c["of"] != "?":
            per_layer[c["memory"]] = per_layer.get(c["memory"], 0.0) + c["bytes"] * c["buffers"] / layers_per_text
    return per_layer
