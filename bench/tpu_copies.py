"""Which slices of the layers' stacked weights and KV cache a TPU program copies before reading them, and where.

On the CPU backend a decode step spends over half its operation time copying the layer scan's slices
(`docs/throughput.md`, "One cache slot written per step"). This compiles the engine's own decode step
(`engine.plan._decode_step`) and packed scoring step (`engine.batches._batch_logprobs`) for a TPU topology
(libtpu, no TPU needed, no weights), twice: with the layer loop as it runs (`lax.scan`, one dynamic slice of
every stacked array a layer) and written out (`nn.loops.unrolled`, static slices), and lists every fusion
of the optimised program that does nothing but move data (slice, copy, relayout) into a buffer of its own,
1 MiB or more (`dcsjax.engine.copies`): a copy into HBM, traffic on top of the layer's reads (what `dcsjax
plan` adds to its decode estimate), or a prefetch into VMEM (on chip), which is how the dots read it.
Each copy is named by the per-layer arrays of its shape. Per layer and chip it sets the bytes copied against
the bytes the layer must read anyway (its weights, and for decoding its slice of the cache).

    python bench/tpu_copies.py --model llama-3.1-8b --topology v5e:2x4 --out docs/bench

Compiles only; what the copies cost in time on a chip is not measured here (none lent).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_record  # noqa: E402

def analyse(config, mesh, chip, program: str, args) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from dcsjax.engine import copies, plan
    from dcsjax.engine.batches import BatchSettings, _batch_logprobs
    from dcsjax.nn.sharding import CACHE_AXES, partition_spec

    depth = config.num_layers
    config = plan.truncated(config, args.layers)
    graphdef, state = plan.abstract_model(config, mesh, jnp.bfloat16)
    cache_shard = None
    if program == "decode":
        slots = args.cached + 1
        shape = (config.num_layers, args.decode_rows, slots, config.num_kv_heads, config.head_dim)
        cache = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, partition_spec(CACHE_AXES, shape, mesh)))
        cache_shard = cache.sharding.shard_shape(shape)
        call_args = (graphdef, mesh, state, plan.row_shapes((args.decode_rows,), mesh),
                     plan.row_shapes((args.decode_rows,), mesh), cache, cache)
        fn, static, donate = plan._decode_step, (0, 1), (5, 6)
    else:
        call_args = (graphdef, BatchSettings.vocab_chunk, mesh, state,
                     *(plan.row_shapes((args.rows, args.length), mesh) for _ in range(5)))
        fn, static, donate = _batch_logprobs, (0, 1, 2), ()
    names = copies.per_layer_shapes(state, cache_shard)
    must_read = plan.bytes_per_chip([leaf for _, leaf in copies.layer_leaves(state)]) // config.num_layers
    if cache_shard is not None:
        must_read += 2 * math.prod(cache_shard[1:]) * 2  # keys and values, bf16
    result = {"program": program, "layers_compiled": config.num_layers, "layer_must_read_MiB": round(must_read / 2**20, 1)}
    for variant in ("scan", "unrolled"):
        jitted = (plan.unrolled_jit(fn, static, donate) if variant == "unrolled"
                  else jax.jit(getattr(fn, "__wrapped__", fn), static_argnums=static, donate_argnums=donate))
        hlo = jitted.lower(*call_args).compile().as_text()
        found = [{**c, "MiB": round(c.pop("bytes") / 2**20, 2)}
                 for c in copies.copied_slices(hlo, names, int(args.min_mib * 2**20))]
        layer_copies = [c for c in found if c["of"] != "?"]
        for c in layer_copies:  # a scan's body holds one copy a layer; the written-out program one for each layer
            c["per_layer"] = c["buffers"] / (config.num_layers if variant == "unrolled" else 1)
        per_layer = {m: round(sum(c["MiB"] * c["per_layer"] for c in layer_copies if c["memory"] == m), 1)
                     for m in ("HBM", "VMEM")}
        result[variant] = {"while_loops": hlo.count(" while("), "copies": layer_copies,
                           # outside the layers (the output head's vocabulary chunks, written out): not per layer
                           "other_copies": [c for c in found if c["of"] == "?"],
                           # prefetched into VMEM (on chip): how the dots read the slices, no HBM traffic beyond them
                           "vmem_MiB_per_layer": per_layer["VMEM"], "hbm_copied_MiB_per_layer": per_layer["HBM"],
                           # an HBM copy is written once and read once more: traffic the slice read in place would not have
                           "extra_traffic_over_must_read": round(2 * per_layer["HBM"] * 2**20 / must_read, 3),
                           # an estimate: that traffic over the whole model's layers at the published bandwidth
                           "est_copy_ms_per_step": round(2 * per_layer["HBM"] * 2**20 * depth / chip.hbm_bytes_per_s * 1e3, 2)}
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b", help="a published config, card, HF directory or hub id")
    parser.add_argument("--topology", default="v5e:2x4")
    parser.add_argument("--programs", default="decode,score")
    parser.add_argument("--layers", type=int, default=2, help="layers compiled (the copies are per layer)")
    parser.add_argument("--decode-rows", type=int, default=64)
    parser.add_argument("--cached", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--min-mib", type=float, default=1.0, help="the smallest buffer counted, MiB")
    parser.add_argument("--out", default="docs/bench")
    args = parser.parse_args(argv)

    from dcsjax.engine.load import load_config
    from dcsjax.engine.plan import topology_mesh

    config, source = load_config(args.model)
    mesh, chip = topology_mesh(args.topology)
    rows = [analyse(config, mesh, chip, program, args) for program in args.programs.split(",")]
    for r in rows:
        for variant in ("scan", "unrolled"):
            v = r[variant]
            listed = ", ".join(f"{c['of']} {c['shape']} {c['MiB']} MiB ({c['memory']})" for c in v["copies"]) or "none"
            print(f"{args.model} {args.topology} {r['program']} ({variant}): {v['hbm_copied_MiB_per_layer']} MiB copied into "
                  f"HBM per layer and chip, against {r['layer_must_read_MiB']} MiB it must read "
                  f"(+{v['extra_traffic_over_must_read']:.0%} traffic; est. {v['est_copy_ms_per_step']} ms a step over "
                  f"the model's {config.num_layers} layers at {chip.hbm_bytes_per_s / 1e9:.0f} GB/s); "
                  f"{v['vmem_MiB_per_layer']} MiB prefetched into VMEM: {listed}")
    path = write_record(args.out, f"tpu-copies-{args.model}-{args.topology.replace(':', '')}",
                        {"model": args.model, "config": source, "topology": args.topology, "chip": chip.name,
                         "mesh": dict(mesh.shape), "rows": rows, "measured": "compiled only, not run"}, args)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
