"""`dcsjax plan`: the engine's own jitted programs compiled for a TPU slice on this machine (no TPU needed, no
weights read), with the memory XLA allocates per chip and XLA's TPU cost model.

libtpu (the `tpu` extra) compiles for a named topology (`v5e:2x4`, ...) through
`jax.experimental.topologies`; the model's parameters are `jax.eval_shape` shapes, placed on the topology's
(data, model) mesh by the engine's sharding rules. What is compiled is the engine's code, not a copy:
- scoring: `engine.batches._batch_logprobs`, the packed scoring step (decoder, then the vocabulary-chunked
  log-prob kernel), for `rows` x `length` token rows;
- decoding: `engine.generate._decode` (prefill, then the KV-cache loop of `Decoder.decode_step`).

Two kinds of figures, kept apart:
- memory (arguments, temporaries, code, per chip) is read from the real program, as it would run;
- FLOPs, bytes accessed and `optimal_seconds` come from XLA's cost analysis, which counts a loop's body
  once. They are read from the same functions traced with every loop unrolled (`nn.loops.unrolled`) at one
  and two periods of layers (a period: Gemma's pattern of local and global layers), and scaled to the
  model's depth: total = c(p) + (L / p - 1) (c(2p) - c(p)). Seconds, tokens/s and MFU derived from them are
  estimates of XLA's TPU cost model, not measurements; a device run (`bench/gpu_llama1b.py` on GPU) is what
  measures.
- The engine runs a decode step's layers scanned; any slices its scan copies through HBM beyond the written-out
  program's (`engine.copies`; slices prefetched into VMEM are not traffic) are added at the chip's published
  bandwidth (`scan_copies` in the result).
- Long rows on TPU attend through the splash kernel (`nn.attention.splash_attention`), a Mosaic custom call that
  XLA's cost model counts as free. Its FLOPs are counted from the tiles it computes (`splash_tiles`) and its
  time taken at the chip's bf16 peak (a lower bound), then added (`attention_kernel` in the result).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dcsjax.engine import copies
from dcsjax.errors import ConfigError
from dcsjax.nn import loops
from dcsjax.nn.attention import SPLASH_BLOCK, long_row_kernel, splash_head_split, takes_blockwise
from dcsjax.nn.config import DecoderConfig
from dcsjax.nn.decoder import Decoder
from dcsjax.nn.sharding import CACHE_AXES, MESH_AXES, partition_spec

GIB = 2**30
ESTIMATED = "estimated by XLA's TPU cost model (never under the HBM bandwidth floor), not measured"


@dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes: int  # per chip, as published
    bf16_flops: float  # peak dense bfloat16 FLOP/s per chip, as published
    hbm_bytes_per_s: float = 0.0  # HBM bandwidth per chip, as published (0: not known, no bandwidth floor)


CHIPS = {  # by the topology name's prefix, as libtpu spells it
    "v4": Chip("TPU v4", 32 * GIB, 275e12, 1228e9),
    "v5e": Chip("TPU v5e", 16 * GIB, 197e12, 819e9),
    "v5p": Chip("TPU v5p", 95 * GIB, 459e12, 2765e9),
    "v6e": Chip("TPU v6e", 32 * GIB, 918e12, 1640e9),
}


def topology_mesh(topology: str, mesh: str | None = None):
    """(jax Mesh over the topology's devices, Chip). mesh "DxM" (data x model); by default the topology's
    first dimension is data and the rest model (`v5e:2x4` -> 2 x 4, `v5p:2x2x1` -> 2 x 2)."""
    kind, _, grid = topology.partition(":")
    if kind not in CHIPS or not grid:
        raise ConfigError(f"topology {topology!r}: a TPU kind ({', '.join(CHIPS)}) and a grid, such as v5e:2x4")
    # libtpu takes a lock file for the chips of a TPU host; compiling for a topology uses no chip, so
    # two plans (or a plan beside a TPU job) may share it
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from dcsjax.host import libtpu_start_up_dropped

    try:
        from jax.experimental import topologies

        with libtpu_start_up_dropped():  # its complaints that this host has no TPU
            devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    except Exception as err:  # no libtpu, or a grid libtpu refuses
        hint = "" if _has_libtpu() else " (compiling for TPU needs libtpu: pip install 'dcsjax[tpu]')"
        raise ConfigError(f"topology {topology!r}: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
                          f"{hint}") from err
    dims = [int(d) for d in grid.split("x")]
    shape = _mesh_shape(mesh) if mesh else (dims[0], math.prod(dims[1:]))
    if math.prod(shape) != len(devices):
        raise ConfigError(f"mesh {shape[0]}x{shape[1]} needs {math.prod(shape)} devices; {topology} has {len(devices)}")
    return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices), CHIPS[kind]


def _mesh_shape(spec: str) -> tuple[int, int]:
    try:
        data, model = (int(s) for s in spec.lower().split("x"))
    except ValueError:
        raise ConfigError(f"a mesh is data x model devices, such as 2x4, not {spec!r}") from None
    return data, model


def _has_libtpu() -> bool:
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


def abstract_model(config: DecoderConfig, mesh, dtype=jnp.bfloat16):
    """(graphdef, state): the decoder's parameters as sharded shapes on the mesh, by the engine's rules."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))))

    def place(v):
        value = v.get_value()
        spec = partition_spec(v.axes, value.shape, mesh)
        return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=NamedSharding(mesh, spec))

    return graphdef, jax.tree.map(place, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def bytes_per_chip(state) -> int:
    """Bytes of these sharded arrays on the device holding the most (a replicated array counts whole on each)."""
    total = 0
    for leaf in jax.tree.leaves(state):
        total += math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize  # PRNG keys too
    return total


def layer_period(config: DecoderConfig) -> int:
    """The fewest layers after which the layers' kinds (local or global, RoPE or not) repeat."""
    kinds = list(zip(config.local_layers, config.rope_layers))
    return next(p for p in range(1, len(kinds) + 1) if all(kinds[i] == kinds[i % p] for i in range(len(kinds))))


def truncated(config: DecoderConfig, layers: int) -> DecoderConfig:
    return dataclasses.replace(config, num_layers=layers, layer_is_local=config.layer_is_local[:layers],
                               layer_uses_rope=config.layer_uses_rope[:layers])


def memory_of(compiled) -> dict:
    m = compiled.memory_analysis()
    return {"argument_bytes": int(m.argument_size_in_bytes), "temp_bytes": int(m.temp_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes), "code_bytes": int(m.generated_code_size_in_bytes),
            "alias_bytes": int(m.alias_size_in_bytes)}


# Custom calls XLA's TPU cost model has no estimate for: each adds -1 s to `optimal_seconds` (a Llama-3.1-8B
# scoring step of one layer reads -9.97 s with ten of them, of two layers -26.97 s with 27). They are
# concatenations laid out as bitcasts (the attention tiles' ones column, RoPE's halves); the plan counts
# them as free and adds the second back.
UNESTIMATED_CALLS = ("ConcatBitcast",)


def cost_of(compiled) -> dict:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    unestimated = sum(text.count(f'custom_call_target="{name}"') for name in UNESTIMATED_CALLS)
    return {"flops": float(cost.get("flops", 0.0)), "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "optimal_seconds": float(cost.get("optimal_seconds", float("nan"))) + unestimated}


def scaled_cost(config: DecoderConfig, compile_at) -> dict:
    """XLA's cost of the whole depth from unrolled programs of one and two layer periods (`compile_at(config)`
    -> a compiled program); exact where the model is no deeper than two periods (compiled whole). Also the
    split: `per_layer` (a period's cost over its layers) and `outside` (embedding, output head, log-softmax:
    what is not in the blocks), which say where the time goes."""
    p = layer_period(config)
    if config.num_layers <= 2 * p:
        return cost_of(compile_at(config))
    one, two = cost_of(compile_at(truncated(config, p))), cost_of(compile_at(truncated(config, 2 * p)))
    periods = config.num_layers / p
    per_layer = {k: (two[k] - one[k]) / p for k in one}
    return {**{k: one[k] + (periods - 1) * (two[k] - one[k]) for k in one},
            "per_layer": per_layer, "outside": {k: one[k] - p * per_layer[k] for k in one}}


def unrolled_jit(fn, static_argnums, donate_argnums=()):
    """A jitted function that traces `fn` (a Python function, or a jitted one's) with every loop unrolled.
    A new wrapper each time: JAX keeps traces per function, and a trace made outside `unrolled()` keeps its loops."""
    fn = getattr(fn, "__wrapped__", fn)

    def written_out(*args):
        with loops.unrolled():
            return fn(*args)

    return jax.jit(written_out, static_argnums=static_argnums, donate_argnums=donate_argnums)


def timed_compile(fn, *args):
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - start


# libtpu refuses to compile a program whose buffers exceed the chip's HBM, saying how much it needed
_REFUSED = re.compile(r"RESOURCE_EXHAUSTED.*?HLO temporaries \(([\d.]+)([KMGT]?)\)", re.S)


def compile_memory(fn, *args) -> tuple[object | None, dict, float]:
    """(the compiled program or None, its memory per chip, compile seconds). Where the compiler refuses the
    program for want of HBM, the memory is what it said the temporaries need (`refused`: its message), the
    arguments their shapes' share on the largest device."""
    start = time.perf_counter()
    try:
        compiled = fn.lower(*args).compile()
    except jax.errors.JaxRuntimeError as err:
        match = _REFUSED.search(str(err))
        if not match:
            raise
        scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2)]
        arguments = bytes_per_chip([a for a in jax.tree.leaves(args) if isinstance(a, jax.ShapeDtypeStruct)])
        memory = {"argument_bytes": int(arguments), "temp_bytes": int(float(match.group(1)) * scale), "output_bytes": 0,
                  "code_bytes": 0, "alias_bytes": 0, "refused": str(err).splitlines()[0][:300]}
        return None, memory, time.perf_counter() - start
    return compiled, memory_of(compiled), time.perf_counter() - start


def row_shapes(shape, mesh, dtype=jnp.int32):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("data")))


def plan_scoring(config: DecoderConfig, mesh, chip: Chip, rows: int = 8, length: int = 2048,
                 dtype=jnp.bfloat16, vocab_chunk: int | None = None) -> dict:
    """The packed scoring step of `rows` x `length` fully packed rows: memory per chip (and the most rows of
    that length that fit, from the temporaries' growth between `rows` and 2 x `rows`), FLOPs per chip against
    the model's for those tokens, and XLA's estimated step time. vocab_chunk: the log-prob kernel's vocabulary
    rows per step (default the engine's, `BatchSettings.vocab_chunk`)."""
    from dcsjax.engine.batches import BatchSettings, _batch_logprobs

    vocab_chunk = vocab_chunk or BatchSettings.vocab_chunk

    data = mesh.shape["data"]
    if rows % data:
        raise ConfigError(f"{rows} rows do not split over the mesh's {data} data devices")

    def lower_args(c, n):
        graphdef, state = abstract_model(c, mesh, dtype)
        return (graphdef, vocab_chunk, mesh, state, *(row_shapes((n, length), mesh) for _ in range(5)))

    _, memory, seconds = compile_memory(_batch_logprobs, *lower_args(config, rows))
    doubled = compile_memory(_batch_logprobs, *lower_args(config, 2 * rows))[1]

    # FLOPs and seconds grow in proportion to the rows (rows of one length): where the written-out program of
    # `rows` does not fit a chip, it is compiled for fewer (down to one row per data device) and scaled
    cost_rows = rows
    while True:
        try:
            cost = scaled_cost(config, lambda c: timed_compile(unrolled_jit(_batch_logprobs, static_argnums=(0, 1, 2)),
                                                               *lower_args(c, cost_rows))[0])
            break
        except jax.errors.JaxRuntimeError as err:
            if not _REFUSED.search(str(err)) or cost_rows <= data:
                raise
            cost_rows = max(data, cost_rows // 2 // data * data)
    scale = rows / cost_rows
    cost = {k: ({kk: vv * scale for kk, vv in v.items()} if isinstance(v, dict) else v * scale) for k, v in cost.items()}
    kernel = splash_cost(config, mesh, chip, rows, length)
    cost = with_kernel(cost, kernel, config.num_layers)
    tokens = rows * length
    model_flops = config.flops_per_token(mean_context=(length + 1) / 2) * tokens / mesh.size
    params = bytes_per_chip(abstract_model(config, mesh, dtype)[1])
    return {"program": "score", "rows": rows, "length": length, "vocab_chunk": vocab_chunk, "tokens": tokens, "params_bytes": params,
            **memory, **_fit(memory, doubled, rows, data, chip), **_speed(cost, model_flops, tokens, chip, params),
            **_where_the_time_goes(cost, chip), "attention_kernel": kernel, "cost_rows": cost_rows,
            "compile_s": round(seconds, 1)}


def splash_tiles(length: int, window: int | None = None, block: int = SPLASH_BLOCK) -> int:
    """The [block, block] tiles of a row of `length` tokens (one sequence from column 0) that the splash kernel
    computes for one head: those holding a visible pair, causal and within `window` (None: global)."""
    b = min(block, length)
    i, j = (a.ravel() for a in np.meshgrid(np.arange(length // b), np.arange(length // b), indexing="ij"))
    live = j * b <= i * b + b - 1
    if window is not None:
        live &= i * b - (j * b + b - 1) < window
    return int(live.sum())


def splash_cost(config: DecoderConfig, mesh, chip: Chip, rows: int, length: int) -> dict | None:
    """What XLA's cost model leaves out of a scoring step whose rows go through splash (None where they do not):
    per chip, the kernel's FLOPs (its tiles' two matmuls, every layer) and their time at the chip's bf16 peak."""
    if not takes_blockwise(length) or long_row_kernel(mesh) != "splash":
        return None
    b = min(SPLASH_BLOCK, length)
    m = mesh.shape["model"]
    group = config.num_heads // config.num_kv_heads
    split = splash_head_split(config.num_kv_heads, group, m)  # as its shard_map splits them
    heads = config.num_heads // m if split else config.num_heads
    tiles = sum(splash_tiles(length, config.sliding_window if local else None, b) for local in config.local_layers)
    flops = 4 * b * b * config.head_dim * heads * (rows // mesh.shape["data"]) * tiles
    return {"name": "splash", "flops": float(flops), "seconds_at_peak": flops / chip.bf16_flops,
            "how": "FLOPs counted from the kernel's tiles, time at the chip's bf16 peak (a lower bound)"}


def with_kernel(cost: dict, kernel: dict | None, layers: int) -> dict:
    """XLA's cost with the attention kernel's FLOPs and seconds added (to the whole and, a layer's share, to
    `per_layer`). Seconds XLA gave no estimate for (not positive) stay as they are: no estimate."""
    if kernel is None:
        return cost

    def add(c: dict, n: int) -> dict:
        seconds = c["optimal_seconds"]
        return {**c, "flops": c["flops"] + kernel["flops"] / n,
                "optimal_seconds": seconds + kernel["seconds_at_peak"] / n if seconds > 0 else seconds}

    out = add(cost, 1)
    if "per_layer" in cost:
        out["per_layer"] = add(cost["per_layer"], layers)
    return out


def plan_decode(config: DecoderConfig, mesh, chip: Chip, rows: int = 64, cached: int = 1024, new_tokens: int = 32,
                dtype=jnp.bfloat16) -> dict:
    """Generation (`engine.generate._decode`) of `new_tokens` after `cached`-token prompts: memory per chip
    (the KV cache included) from the real program; per decode step, XLA's estimated seconds and tokens/s."""
    from dcsjax.engine.generate import _decode

    data = mesh.shape["data"]
    if rows % data:
        raise ConfigError(f"{rows} rows do not split over the mesh's {data} data devices")
    graphdef, state = abstract_model(config, mesh, dtype)
    keys = jax.ShapeDtypeStruct((rows,), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P("data")))
    args = (graphdef, state, row_shapes((rows, cached), mesh), row_shapes((rows,), mesh), keys, new_tokens, 0.0, 1.0, (0,),
            mesh)
    _, memory, seconds = compile_memory(_decode, *args)
    slots = cached + new_tokens
    cache_bytes = 2 * config.num_layers * rows * slots * config.num_kv_heads * config.head_dim * jnp.dtype(dtype).itemsize

    compiled_steps: dict[tuple, tuple] = {}

    def step_program(c: DecoderConfig, scanned: bool = False):
        """(the decode step compiled for c, its layers written out for XLA's cost or scanned as they run; the
        names of its per-layer shapes). Compiled once each: `scan_copies` reads scaled_cost's longest again."""
        if (c.num_layers, scanned) not in compiled_steps:
            g, s = abstract_model(c, mesh, dtype)
            shape = (c.num_layers, rows, slots, c.num_kv_heads, c.head_dim)
            cache = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, partition_spec(CACHE_AXES, shape, mesh)))
            jitted = (jax.jit(_decode_step, static_argnums=(0, 1), donate_argnums=(5, 6)) if scanned
                      else unrolled_jit(_decode_step, static_argnums=(0, 1), donate_argnums=(5, 6)))
            compiled = timed_compile(jitted, g, mesh, s, row_shapes((rows,), mesh), row_shapes((rows,), mesh), cache, cache)[0]
            compiled_steps[c.num_layers, scanned] = compiled, copies.per_layer_shapes(s, cache.sharding.shard_shape(shape))
        return compiled_steps[c.num_layers, scanned]

    cost = scaled_cost(config, lambda c: step_program(c)[0])
    scan_copy = scan_copies(config, chip, step_program)
    model_flops = config.flops_per_token(mean_context=cached + new_tokens / 2) * rows / mesh.size
    must_read = bytes_per_chip(state) + cache_bytes // mesh.size
    return {"program": "decode", "rows": rows, "cached": cached, "new_tokens": new_tokens,
            "params_bytes": bytes_per_chip(state), "kv_cache_bytes_per_chip": cache_bytes // mesh.size, **memory,
            "fits": "refused" not in memory and memory["argument_bytes"] + memory["temp_bytes"] + memory["code_bytes"]
            <= chip.hbm_bytes, **_speed(cost, model_flops, rows, chip, must_read, scan_copy["seconds"]),
            "scan_copies": scan_copy, "compile_s": round(seconds, 1)}


def scan_copies(config: DecoderConfig, chip: Chip, step_program) -> dict:
    """The HBM traffic the running decode step has and the plan's cost leaves out: XLA's cost is read from the
    step with its layers written out, while the engine runs them under `lax.scan`, whose body may copy its
    layer's weight and cache slices into HBM buffers before the dots read them (`engine.copies`). Per chip: the
    bytes a layer copies into HBM in each program, and the difference over the model's depth, written once and
    read once more, at the chip's published HBM bandwidth (an estimate). Slices the scan prefetches into VMEM
    (on chip) are how the dots read their operands, not extra traffic: reported, not added.
    `step_program(config, scanned)` -> (compiled program, per-layer names of its shapes)."""
    layers = min(config.num_layers, 2 * layer_period(config))  # scaled_cost's longest written-out program
    per_layer = {}
    for scanned in (True, False):
        compiled, names = step_program(truncated(config, layers), scanned=scanned)
        per_layer[scanned] = copies.layer_copy_bytes(compiled.as_text(), names, 1 if scanned else layers)
    extra = max(per_layer[True]["HBM"] - per_layer[False]["HBM"], 0.0) * config.num_layers
    return {"scanned_hbm_bytes_per_layer": per_layer[True]["HBM"],
            "written_out_hbm_bytes_per_layer": per_layer[False]["HBM"],
            "scanned_vmem_bytes_per_layer": per_layer[True]["VMEM"],
            "seconds": 2 * extra / chip.hbm_bytes_per_s if chip.hbm_bytes_per_s else 0.0,
            "how": "the scanned step's HBM copies beyond the written-out step's, written and read once more at the "
                   "published HBM bandwidth"}


def _decode_step(graphdef, mesh, state, tokens, positions, cache_k, cache_v):
    """One step of `_decode`'s loop: `Decoder.decode_step`, then the output head (greedy). The cache is
    donated, as the loop's carry is updated in place."""
    model = nnx.merge(graphdef, state)
    hidden, cache_k, cache_v = model.decode_step(tokens, positions, cache_k, cache_v, mesh=mesh)
    return jnp.argmax(model.logits(hidden), axis=-1), cache_k, cache_v


def _fit(memory: dict, doubled: dict, rows: int, data: int, chip: Chip) -> dict:
    """Whether it fits the chip's HBM, and the most rows (a multiple of the data devices) that would: the
    temporaries grow linearly with the rows (two compiles), the rest stays."""
    used = memory["argument_bytes"] + memory["temp_bytes"] + memory["code_bytes"]
    per_row = max(doubled["temp_bytes"] + doubled["argument_bytes"] - memory["temp_bytes"] - memory["argument_bytes"],
                  1) / rows
    fixed = used - per_row * rows
    most = int((chip.hbm_bytes - fixed) // per_row) // data * data if chip.hbm_bytes > fixed else 0
    return {"hbm_bytes": chip.hbm_bytes, "fits": "refused" not in memory and used <= chip.hbm_bytes, "most_rows": most}


def _where_the_time_goes(cost: dict, chip: Chip) -> dict:
    """Per chip: one layer's and the rest's (embedding, head, log-softmax) estimated seconds and the share of
    the chip's peak their FLOPs reach in them."""
    if "per_layer" not in cost:
        return {}
    out = {}
    for part in ("per_layer", "outside"):
        c = cost[part]
        out[f"{part}_seconds"] = c["optimal_seconds"]
        out[f"{part}_flops"] = c["flops"]
        out[f"{part}_share_of_peak"] = c["flops"] / (c["optimal_seconds"] * chip.bf16_flops) if c["optimal_seconds"] > 0 else None
    return out


def _speed(cost: dict, model_flops: float, tokens: int, chip: Chip, must_read: float = 0.0,
           copy_seconds: float = 0.0) -> dict:
    """Per chip: compiled against model FLOPs, and the estimated seconds as tokens/s and MFU. The estimate is
    XLA's, but never under the bandwidth floor: `must_read` bytes (a step reads every weight on the chip, and a
    decode step its KV cache) at the chip's published HBM bandwidth. XLA's TPU cost model can come in under that
    floor for a decode step (its bytes accessed counting fewer bytes than the chip's weights: docs/sharding.md),
    and where it does the floor is the estimate (`bound` says which). `copy_seconds`: traffic the program that
    runs has beyond the one XLA's cost was read from (`scan_copies`), added to either."""
    xla = cost["optimal_seconds"]
    ok = xla > 0
    floor = must_read / chip.hbm_bytes_per_s if chip.hbm_bytes_per_s else 0.0
    seconds = max(xla, floor) + copy_seconds if ok else None
    return {"compiled_flops": cost["flops"], "model_flops": model_flops,
            "compiled_over_model": cost["flops"] / model_flops if model_flops else float("nan"),
            "bytes_accessed": cost["bytes_accessed"], "xla_seconds": xla if ok else None,
            "hbm_floor_seconds": floor, "bound": None if not ok else "HBM bandwidth" if floor > xla else "XLA's cost model",
            "estimated_seconds": seconds, "estimated_tokens_per_s": tokens / seconds if ok else None,
            "estimated_mfu": model_flops / (seconds * chip.bf16_flops) if ok else None, "estimate": ESTIMATED}
