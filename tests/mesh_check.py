"""Run by tests/test_sharding.py in a process of its own with 8 simulated CPU devices (JAX_NUM_CPU_DEVICES=8):
scores on 2x4 and 8x1 meshes against one device, for both real models; prints one JSON line per model.

Arguments: models, each `NAME` (both meshes) or `NAME@MESH` (that mesh only)."""

import gc
import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

import dcsjax
from dcsjax.engine.batches import _batch_logprobs
from dcsjax.nn.sharding import batch_sharding

TEXTS = [f"Statement {i}: " + " ".join(["the sharded model scores this text"] * (1 + i % 7)) for i in range(24)]


def all_gathers(scorer) -> list[tuple[int, ...]]:
    """Result shapes of every all-gather in the compiled batch kernel."""
    tokens = jax.device_put(np.zeros((scorer.batch_size, 64), np.int32), batch_sharding(scorer.mesh))
    compiled = _batch_logprobs.lower(scorer.graphdef, scorer.vocab_chunk, scorer.mesh, scorer.state,
                                     *([tokens] * 5)).compile()
    return gathered_shapes(compiled.as_text())


def gathered_shapes(hlo: str) -> list[tuple[int, ...]]:
    shapes = re.findall(r"= \w+\[([\d,]*)\][^=]*? all-gather(?:-start)?\(", hlo)
    return [tuple(int(d) for d in s.split(",") if d) for s in shapes]


def naive_all_gathers(scorer) -> list[tuple[int, ...]]:
    """The control: the one-device kernel jitted on the same sharded matrix, leaving the partitioner to
    reconcile its vocabulary chunks with the shards: it gathers the whole matrix."""
    from dcsjax.engine.logprobs import token_logprobs

    w = scorer.model.output_embedding
    h = jax.device_put(np.zeros((scorer.batch_size, 64, w.shape[1]), np.float32), batch_sharding(scorer.mesh))
    t = jax.device_put(np.zeros((scorer.batch_size, 64), np.int32), batch_sharding(scorer.mesh))
    compiled = jax.jit(token_logprobs, static_argnums=3).lower(h, w, t, scorer.vocab_chunk).compile()
    return gathered_shapes(compiled.as_text())


def eval_on_mesh(name) -> dict:
    """`dcsjax eval` (every protocol, APX's decode loop included) on one device and on a 2x4 mesh."""
    import tempfile
    from pathlib import Path

    from dcsjax.eval.run import read_records, run_eval

    card = Path(__file__).with_name("data") / "unknowns.toml"  # conftest.UNKNOWNS_CARD
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mesh in (None, "2x4"):
            folder = Path(tmp) / str(mesh)
            run_eval(name, [str(card)], ["mcqa", "apx", "dcs"], folder, limit=6, progress=False, mesh=mesh)
            out[mesh] = {p: read_records(folder / name / "unknowns" / f"{p}.jsonl") for p in ("mcqa", "apx", "dcs")}
    one, sharded = out[None], out["2x4"]
    return {"dcs_max_diff": max(abs(a["dcs"] - b["dcs"]) for a, b in zip(one["dcs"], sharded["dcs"])),
            "mcqa_max_diff": max(abs(x - y) for a, b in zip(one["mcqa"], sharded["mcqa"])
                                 for x, y in zip(a["loglik"], b["loglik"])),
            "apx_same_generations": [a["generation"] for a in one["apx"]] == [b["generation"] for b in sharded["apx"]]}


def random_moe(seed: int = 0, experts: int = 8):
    """(config, one layer's router and expert weights): Qwen3-30B-A3B's published config at a tiny width, 8
    experts, 2 a token; random weights (what is checked is the routing arithmetic, not the model)."""
    import dataclasses

    from dcsjax.engine.load import load_config

    config = dataclasses.replace(load_config("qwen3-30b-a3b")[0], hidden_size=32, num_experts=experts,
                                 experts_per_token=2, expert_mlp_size=16)
    rng = np.random.default_rng(seed)
    d, e, f = config.hidden_size, experts, config.expert_mlp_size
    weights = {"router": rng.normal(size=(d, e)), "expert_gate": rng.normal(size=(e, d, f)) / 4,
               "expert_up": rng.normal(size=(e, d, f)) / 4, "expert_down": rng.normal(size=(e, f, d)) / 4}
    x = rng.normal(size=(4, 64, d))
    return config, {k: jnp.asarray(v, jnp.float32) for k, v in weights.items()}, jnp.asarray(x, jnp.float32)


def routed_on_mesh() -> float:
    """The TPU path of the MoE (each model device its own experts, under shard_map) on a 2x4 mesh against every
    expert computed densely on one device: the largest difference."""
    from dcsjax.nn.decoder import dense_experts, routed_experts
    from dcsjax.nn.sharding import make_mesh

    config, weights, x = random_moe()
    mesh = make_mesh("2x4")
    routed = jax.jit(lambda w, x: routed_experts(config, w, x, mesh))(weights, x)
    return float(jnp.abs(routed - dense_experts(config, weights, x)).max())


def splash_on_mesh() -> dict:
    """The TPU long-row kernel (splash, in interpret mode) under shard_map on a 2x4 mesh against the dense path on
    one device, rows over data and by heads: 4 KV heads over model; 2 KV heads of 4 queries (8 query heads, 2 a
    device, each device's within one KV head); 2 KV heads of 3 queries (6 query heads: neither divides, every
    device computes all)."""
    from dcsjax.nn.attention import MaskParts, dense_attention, splash_attention
    from dcsjax.nn.sharding import make_mesh

    mesh = make_mesh("2x4")
    rng = np.random.default_rng(2)
    out = {}
    for n, g in ((4, 2), (2, 4), (2, 3)):
        b, t, k = 2, 256, 16
        seg = jnp.asarray((np.arange(t)[None, :] < np.array([[256], [200]])).astype(np.int32))
        pos = jnp.asarray(np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)))
        parts = MaskParts(seg, seg, jnp.zeros_like(seg), pos, pos)
        q = jnp.asarray(rng.normal(size=(b, t, n, g, k)), jnp.float32)
        keys, values = (jnp.asarray(rng.normal(size=(b, t, n, k)), jnp.float32) for _ in range(2))
        dense = dense_attention(q, keys, values, parts.dense(), 0.25, None)
        sharded = jax.jit(lambda q, k, v: splash_attention(q, k, v, parts, 0.25, None, mesh=mesh, interpret=True,
                                                           block=128))(q, keys, values)
        out[f"{n}x{g}_heads_max_diff"] = float(jnp.abs(sharded - dense)[np.asarray(seg) > 0].max())
    return out


def main(names):
    from pathlib import Path

    for argument in names:
        name, _, only = argument.partition("@")
        # a tiny checkpoint directory (test_architectures.py) carries SmolLM2's tokenizer, which adds no BOS
        options = {"document_start": "<|endoftext|>"} if Path(name).is_dir() else {}
        single = dcsjax.load(name, batch_size=8, **options)
        reference = single.token_logprobs(TEXTS)
        vocab = single.config.vocab_size
        del single
        result = {"model": name, "devices": jax.device_count()}
        for mesh in (only,) if only else ("2x4", "8x1"):
            scorer = dcsjax.load(name, batch_size=8, mesh=mesh, **options)
            got = scorer.token_logprobs(TEXTS)
            embed = scorer.model.embed[...]
            result[mesh] = {
                "max_diff": float(max(np.abs(a - b).max() for a, b in zip(got, reference))),
                "embed_spec": str(embed.sharding.spec),
                "embed_shard_rows": int(embed.addressable_shards[0].data.shape[0]),
                "gathered_vocab_sized": [s for s in all_gathers(scorer) if any(d >= vocab // 2 for d in s)],
                "rows_per_batch_multiple_of_data": scorer.row_multiple,
            }
            if mesh == "2x4":
                result[mesh]["control_gathered"] = [s for s in naive_all_gathers(scorer) if any(d >= vocab // 2 for d in s)]
            del scorer
            jax.clear_caches()  # frees this mesh's copies and programs before the next (measured with Gemma on
            # 8x1: it did not lower that 11.8 GB peak, which one mesh makes alone)
            gc.collect()
        result["vocab"] = vocab
        if argument == names[0] and not options:
            result["eval"] = eval_on_mesh(name)
            result["splash"] = splash_on_mesh()
            result["routed_experts_max_diff"] = routed_on_mesh()
        print(json.dumps(result), flush=True)
        jnp.zeros(1).block_until_ready()


if __name__ == "__main__":
    main(sys.argv[1:])
