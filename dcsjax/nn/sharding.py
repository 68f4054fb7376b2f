"""Sharding: one rules table from the parameters' logical axis names onto a (data, model) device mesh.

Every parameter of the decoder carries logical axes (`nnx.Param(..., axes=(...))`). `RULES` maps them
onto mesh axes: batches split over `data`; vocabulary, attention heads and MLP width over `model`; the
rest replicated. A dimension that the mesh axis does not divide is replicated instead (SmolLM2's 9 heads
on 4 devices), so every model runs on every mesh. The same model code runs on one device and on a mesh:
XLA's SPMD partitioner inserts the collectives from the parameters' and inputs' shardings, and the
log-prob kernel runs as an explicit `shard_map` over the vocabulary (`engine/logprobs.py`).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "model")
RULES: dict[str, str] = {"batch": "data", "vocab": "model", "heads": "model", "kv_heads": "model", "mlp": "model",
                         "experts": "model"}


def make_mesh(spec: str | Sequence[int] | Mesh | None) -> Mesh | None:
    """"2x4" (data x model), (2, 4), a Mesh, or None (one device, no mesh)."""
    if spec is None or isinstance(spec, Mesh):
        return spec
    try:
        shape = tuple(int(s) for s in spec.lower().split("x")) if isinstance(spec, str) else tuple(map(int, spec))
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"a mesh is data x model devices, two whole numbers such as '2x4', not {spec!r}")
    have = jax.local_device_count()  # a mesh spans this process's devices; processes split the items
    if math.prod(shape) != have:
        raise ValueError(f"mesh {shape[0]}x{shape[1]} needs {math.prod(shape)} devices; this process has {have} "
                         f"(on CPU, set JAX_NUM_CPU_DEVICES={math.prod(shape)} before starting Python)")
    # Auto axes: XLA's partitioner places the collectives from the parameters' and inputs' shardings.
    return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=jax.local_devices())


def partition_spec(axes: Sequence[str], shape: Sequence[int], mesh: Mesh) -> P:
    """The rules applied to one array: a dimension goes on its mesh axis only where that axis divides it.
    Attention weights whose heads the model axis does not divide (Qwen2.5-7B's 28 query and 4 KV heads, Phi-4's
    10 KV heads on 8 devices) are split over their head size instead of being replicated: the partitioner
    then sums the scores' partial dot products across devices."""
    spec = []
    for name, size in zip(axes, shape):
        target = RULES.get(name)
        usable = target and target not in spec and mesh.shape[target] > 1 and size % mesh.shape[target] == 0
        spec.append(target if usable else None)  # a mesh axis splits one dimension of an array at most
    m = mesh.shape["model"]
    heads = {"heads", "kv_heads"} & set(axes)
    if m > 1 and heads and "model" not in spec and "head_dim" in axes:
        i = list(axes).index("head_dim")
        if shape[i] % m == 0:
            spec[i] = "model"
    return P(*spec)


def place(value: np.ndarray, axes: Sequence[str], mesh: Mesh, dtype) -> jax.Array:
    """A host array onto the mesh, each device receiving only its own slice (never the whole array)."""
    sharding = NamedSharding(mesh, partition_spec(axes, value.shape, mesh))
    return jax.make_array_from_callback(value.shape, sharding, lambda index: np.asarray(value[index], dtype))


# A decoding loop's KV cache [layers, rows, slots, kv heads, head size]: rows over `data`, KV heads over `model`
# where it divides them, else the head size (as the k and v weights are split). Left to XLA, a cache whose
# heads the model axis does not divide came out whole on every device (Llama-3.1-70B's 8 KV heads on 16).
CACHE_AXES = ("layers", "batch", "slots", "kv_heads", "head_dim")


def constrain(x: jax.Array, axes: Sequence[str], mesh: Mesh | None) -> jax.Array:
    """Inside a jitted program: x laid out by the rules table, as `place` lays out an input (no-op without a
    mesh)."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, partition_spec(axes, x.shape, mesh)))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows of a batch over `data`, replicated over `model`."""
    return NamedSharding(mesh, P("data"))
