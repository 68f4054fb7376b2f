"""The training step of `train-abstain` (`training.train._train_step`) compiled for a TPU slice, as
`engine.plan` compiles the scoring and decoding programs: the frozen and trainable top blocks, the optimizer
state, the output embedding and one batch of cached hidden states, all as sharded shapes by the rules that
`training.train.on_mesh` and `batch_on_mesh` apply on a real mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dcsjax.engine.plan import Chip, ESTIMATED, compile_memory, cost_of, timed_compile, unrolled_jit
from dcsjax.nn.config import DecoderConfig
from dcsjax.nn.decoder import layer_param_shapes
from dcsjax.nn.sharding import partition_spec
from dcsjax.training.features import LetterBatch
from dcsjax.training.train import TrainConfig, _train_step, init_trainable, optimizer_for, step_settings

F32 = jnp.float32


def abstract_top(config: DecoderConfig, top_layers: int, mesh) -> dict:
    """`train.top_params`'s tree (float32 copies of the top blocks and the final norm) as sharded shapes."""
    def shaped(shape, axes):
        return jax.ShapeDtypeStruct(shape, F32, sharding=NamedSharding(mesh, partition_spec(axes, shape, mesh)))

    layers = {name: shaped((top_layers, *shape), ("layers", *axes))
              for name, (shape, axes) in layer_param_shapes(config).items()}
    finals = {"final_norm": shaped((config.hidden_size,), ("embed",))}
    if config.norm_type == "layer":
        finals["final_norm_bias"] = shaped((config.hidden_size,), ("embed",))
    return {"layers": layers, **finals}


def _like(tree, params, mesh):
    """Shardings for an optimizer state: a leaf shaped as a parameter is split as it is; the rest replicated."""
    by_shape = {leaf.shape: leaf.sharding for leaf in jax.tree.leaves(params)}
    replicated = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=by_shape.get(x.shape, replicated)),
                        tree)


def plan_training(config: DecoderConfig, mesh, chip: Chip, cfg: TrainConfig = TrainConfig(), top_layers: int = 2,
                  prompt: int = 256, options: int = 5, dtype=jnp.bfloat16) -> dict:
    """One update of `cfg.batch_size` prompts of `prompt` tokens with `options` letters each (hidden states
    after the frozen layers cached, as train-abstain caches them): memory per chip from the real step, and
    XLA's FLOPs and estimated seconds from the same step with its loops unrolled (the top blocks are few: the
    whole step is written out, no depth scaling)."""
    base = abstract_top(config, top_layers, mesh)
    trainable = base if cfg.adapter == "top" else _like(jax.eval_shape(lambda b: init_trainable(cfg, b), base), {}, mesh)
    optimizer = optimizer_for(cfg)
    opt_state = _like(jax.eval_shape(optimizer.init, trainable), trainable, mesh)
    v, d = config.vocab_size, config.hidden_size
    embedding = jax.ShapeDtypeStruct((v, d), dtype, sharding=NamedSharding(
        mesh, partition_spec(("vocab", "embed"), (v, d), mesh)))
    rows = NamedSharding(mesh, P(None, "data") if cfg.batch_size % mesh.shape["data"] == 0 else P())
    a, b, k = cfg.accumulate, cfg.batch_size, options
    # one prompt a row (`LetterFeatures.batch`'s layout; packing puts the same tokens in fewer rows)
    shaped_as = lambda shape, dtype: jax.ShapeDtypeStruct((a, *shape), dtype, sharding=rows)  # noqa: E731
    batch = LetterBatch(shaped_as((b, prompt, d), F32), *(shaped_as((b, prompt), jnp.int32) for _ in range(2)),
                        *(shaped_as((b,), jnp.int32) for _ in range(2)), shaped_as((b, k), jnp.int32),
                        *(shaped_as((b, k), jnp.bool_) for _ in range(3)))
    start = jax.ShapeDtypeStruct((a, b, k), F32, sharding=rows)
    stated_lw = jax.ShapeDtypeStruct((a, b), F32, sharding=rows)
    step = jax.ShapeDtypeStruct((), F32, sharding=NamedSharding(mesh, P()))
    static, weights = step_settings(cfg)
    args = (config, static, optimizer, weights, trainable, opt_state, base, embedding, batch, start, stated_lw, step)
    _, memory, seconds = compile_memory(_train_step, *args)
    cost = cost_of(timed_compile(unrolled_jit(_train_step, static_argnums=(0, 1, 2)), *args)[0])
    used = memory["argument_bytes"] + memory["temp_bytes"] + memory["code_bytes"]
    ok = cost["optimal_seconds"] > 0
    return {"program": "train", "rows": b * a, "length": prompt, "top_layers": top_layers, "adapter": cfg.adapter,
            **memory, "hbm_bytes": chip.hbm_bytes, "fits": "refused" not in memory and used <= chip.hbm_bytes,
            "compiled_flops": cost["flops"], "bytes_accessed": cost["bytes_accessed"],
            "estimated_seconds": cost["optimal_seconds"] if ok else None,
            "estimated_steps_per_s": 1 / cost["optimal_seconds"] if ok else None, "estimate": ESTIMATED,
            "compile_s": round(seconds, 1)}
