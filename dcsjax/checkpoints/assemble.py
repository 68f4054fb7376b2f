"""From transformers-named tensors to a `Decoder`: one table maps every HF name to a parameter slot.

The model is first built abstractly (`nnx.eval_shape`, no memory), then each parameter is filled from the
stream, layer slice by layer slice, so the only full-size host copy is the stacked parameter itself.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dcsjax.errors import CheckpointError
from dcsjax.nn.config import DecoderConfig
from dcsjax.nn.decoder import Decoder, layer_param_shapes

_LAYER = re.compile(r"^(?:model\.layers|transformer\.h)\.(\d+)\.(.+)$")  # Falcon's layers are transformer.h.N
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")  # one expert's (out, in) matrix


def _layer_table(c: DecoderConfig) -> dict[str, list[tuple[str, Callable[[np.ndarray], np.ndarray]]]]:
    """HF per-layer name -> [(our parameter, transform from torch's (out, in) layout to ours)]: one entry,
    or several for a fused tensor. The names every family shares, then the family's own (`_FAMILY_TABLES`):
    a name means one thing in one family, and an export writes the family's names only."""
    d, h, n, k = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    same = lambda w: w  # noqa: E731
    table = {
        "self_attn.q_proj.weight": [("q", lambda w: w.T.reshape(d, h, k))],
        "self_attn.k_proj.weight": [("k", lambda w: w.T.reshape(d, n, k))],
        "self_attn.v_proj.weight": [("v", lambda w: w.T.reshape(d, n, k))],
        "self_attn.o_proj.weight": [("o", lambda w: w.T.reshape(h, k, d))],
        "mlp.gate_proj.weight": [("gate", lambda w: w.T)],
        "mlp.up_proj.weight": [("up", lambda w: w.T)],
        "mlp.down_proj.weight": [("down", lambda w: w.T)],
        "self_attn.q_norm.weight": [("q_norm", lambda w: w.reshape(h, k) if c.qk_norm == "projection" else w)],
        "self_attn.k_norm.weight": [("k_norm", lambda w: w.reshape(n, k) if c.qk_norm == "projection" else w)],
    }
    # The same HF name means a different norm in each placement.
    if c.norms == "pre":
        table |= {"input_layernorm.weight": [("attn_norm", same)],
                  "post_attention_layernorm.weight": [("mlp_norm", same)]}
    elif c.norms == "pre+post":
        table |= {"input_layernorm.weight": [("attn_norm", same)],
                  "post_attention_layernorm.weight": [("post_attn_norm", same)],
                  "pre_feedforward_layernorm.weight": [("mlp_norm", same)],
                  "post_feedforward_layernorm.weight": [("post_mlp_norm", same)]}
    elif c.norms == "post":  # OLMo-2
        table |= {"post_attention_layernorm.weight": [("post_attn_norm", same)],
                  "post_feedforward_layernorm.weight": [("post_mlp_norm", same)]}
    family = _FAMILY_TABLES.get(c.architecture)
    return table | (family(c) if family else {})


def _qwen2_table(c: DecoderConfig) -> dict:
    h, n, k = c.num_heads, c.num_kv_heads, c.head_dim
    return {"self_attn.q_proj.bias": [("q_bias", lambda w: w.reshape(h, k))],
            "self_attn.k_proj.bias": [("k_bias", lambda w: w.reshape(n, k))],
            "self_attn.v_proj.bias": [("v_bias", lambda w: w.reshape(n, k))]}


def _phi3_table(c: DecoderConfig) -> dict:
    """q, k and v stacked in one projection, gate and up in another."""
    d, h, n, k, f = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_size
    return {"self_attn.qkv_proj.weight": [("q", lambda w: w[:h * k].T.reshape(d, h, k)),
                                          ("k", lambda w: w[h * k:(h + n) * k].T.reshape(d, n, k)),
                                          ("v", lambda w: w[(h + n) * k:].T.reshape(d, n, k))],
            "mlp.gate_up_proj.weight": [("gate", lambda w: w[:f].T), ("up", lambda w: w[f:].T)]}


def _qwen3_moe_table(c: DecoderConfig) -> dict:
    """The router, and every expert's weights as one stacked tensor (transformers 5's layout; the hub's
    per-expert tensors are stacked on load, see `_EXPERT`)."""
    return {"mlp.gate.weight": [("router", lambda w: w.T)],
            "mlp.experts.gate_up_proj": [("expert_gate", lambda w: w[:, :w.shape[1] // 2].transpose(0, 2, 1)),
                                         ("expert_up", lambda w: w[:, w.shape[1] // 2:].transpose(0, 2, 1))],
            "mlp.experts.down_proj": [("expert_down", lambda w: w.transpose(0, 2, 1))]}


def _falcon_table(c: DecoderConfig) -> dict:
    """`transformer.h.N.` layers; q/k/v fused by KV group (each group's query heads, then its key and value
    head: Falcon-7B's multi-query layout is the one-group case); LayerNorms with biases."""
    d, h, n, k = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    g = h // n
    same = lambda w: w  # noqa: E731
    grouped = lambda w: w.reshape(n, g + 2, k, d)  # noqa: E731
    return {
        "self_attention.query_key_value.weight": [
            ("q", lambda w: grouped(w)[:, :g].reshape(h * k, d).T.reshape(d, h, k)),
            ("k", lambda w: grouped(w)[:, g].reshape(n * k, d).T.reshape(d, n, k)),
            ("v", lambda w: grouped(w)[:, g + 1].reshape(n * k, d).T.reshape(d, n, k))],
        "self_attention.dense.weight": [("o", lambda w: w.T.reshape(h, k, d))],
        "mlp.dense_h_to_4h.weight": [("up", lambda w: w.T)],
        "mlp.dense_4h_to_h.weight": [("down", lambda w: w.T)],
        "input_layernorm.weight": [("attn_norm", same)], "input_layernorm.bias": [("attn_norm_bias", same)],
        "ln_attn.weight": [("attn_norm", same)], "ln_attn.bias": [("attn_norm_bias", same)],
        "ln_mlp.weight": [("mlp_norm", same)], "ln_mlp.bias": [("mlp_norm_bias", same)],
    }


_FAMILY_TABLES = {"qwen2": _qwen2_table, "phi3": _phi3_table, "qwen3_moe": _qwen3_moe_table, "falcon": _falcon_table}


def build_decoder(c: DecoderConfig, tensors: Iterable[tuple[str, np.ndarray]], source: str,
                  dtype=jnp.float32, mesh=None) -> Decoder:
    """A `Decoder` whose every parameter was read from `tensors`; anything missing or extra raises.
    With a mesh, each parameter goes straight into its shards by the rules of `dcsjax.nn.sharding`."""
    return place_params(c, assemble_params(c, tensors, source), source, dtype, mesh)


def assemble_params(c: DecoderConfig, tensors: Iterable[tuple[str, np.ndarray]], source: str) -> dict[str, np.ndarray]:
    """The decoder's parameters as host arrays, by the names `place_params` takes: the top-level ones
    ("embed", "final_norm", ...) and each per-layer one stacked over the layers ("layers.q": [L, ...]).
    Every tensor is placed by the family's table; anything missing, extra or misshapen raises."""
    layer_shapes = layer_param_shapes(c)
    table = _layer_table(c)
    stacked = {name: np.empty((c.num_layers, *shape), np.float32) for name, (shape, _) in layer_shapes.items()}
    filled = {name: np.zeros(c.num_layers, bool) for name in layer_shapes}
    expert_filled = np.zeros((c.num_layers, 3, max(c.num_experts, 1)), bool)  # per-expert tensors: layer, part, expert
    top: dict[str, np.ndarray] = {}

    for hf_name, w in tensors:
        match = _LAYER.match(hf_name)
        if match:
            layer, rest = int(match.group(1)), match.group(2)
            expert = _EXPERT.match(rest)
            if expert and c.num_experts and layer < c.num_layers and int(expert.group(1)) < c.num_experts:
                e, part = int(expert.group(1)), ("gate", "up", "down").index(expert.group(2))
                name = f"expert_{expert.group(2)}"
                _check_shape(source, hf_name, w.T.shape, stacked[name].shape[2:])
                stacked[name][layer, e] = w.T
                expert_filled[layer, part, e] = True
                filled[name][layer] = expert_filled[layer, part].all()
                continue
            if rest not in table or any(name not in stacked for name, _ in table[rest]) or layer >= c.num_layers:
                raise CheckpointError(f"{source}: tensor {hf_name} does not fit the {c.architecture} config")
            for name, transform in table[rest]:
                value = transform(w)
                _check_shape(source, hf_name, value.shape, stacked[name].shape[1:])
                if filled[name][layer]:
                    raise CheckpointError(f"{source}: tensor {hf_name} fills layer {layer} {name} a second time")
                stacked[name][layer] = value
                filled[name][layer] = True
        elif hf_name in ("model.embed_tokens.weight", "transformer.word_embeddings.weight"):
            top["embed"] = w
        elif hf_name in ("model.norm.weight", "transformer.ln_f.weight"):
            top["final_norm"] = w
        elif hf_name == "transformer.ln_f.bias" and c.norm_type == "layer":
            top["final_norm_bias"] = w
        elif hf_name == "lm_head.weight":
            if c.tie_embeddings:
                continue  # some tied checkpoints store the shared matrix twice
            top["unembed"] = w
        else:
            raise CheckpointError(f"{source}: tensor {hf_name} does not fit the {c.architecture} config")

    missing = [f"layer {i} {name}" for name, ok in filled.items() for i in np.flatnonzero(~ok)]
    missing += [name for name in _top_param_names(c) if name not in top]
    if missing:
        raise CheckpointError(f"{source}: missing tensors: {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""))

    return {**top, **{f"layers.{name}": value for name, value in stacked.items()}}


def place_params(c: DecoderConfig, params: dict[str, np.ndarray], source: str, dtype=jnp.float32, mesh=None) -> Decoder:
    """A `Decoder` holding `params` (as `assemble_params` names them) in `dtype`, each checked against the
    shape the config gives it; with a mesh, each goes straight into its shards."""
    model = nnx.eval_shape(lambda: Decoder(c, dtype=dtype, rngs=nnx.Rngs(0)))
    expected = {*_top_param_names(c), *(f"layers.{name}" for name in layer_param_shapes(c))}
    if not expected <= params.keys():
        raise CheckpointError(f"{source}: missing parameters: {', '.join(sorted(expected - params.keys())[:8])}")

    def put(param, value):
        if mesh is None:
            param.set_value(jnp.asarray(value, dtype))
        else:
            from dcsjax.nn.sharding import place

            param.set_value(place(value, param.axes, mesh, dtype))

    for name, value in params.items():
        owner, attr = (model.layers, name[len("layers."):]) if name.startswith("layers.") else (model, name)
        param = getattr(owner, attr, None)
        if param is None:
            raise CheckpointError(f"{source}: parameter {name} does not fit the {c.architecture} config")
        _check_shape(source, name, value.shape, param.shape)
        put(param, value)
    return model


def _top_param_names(c: DecoderConfig) -> list[str]:
    return ["embed", "final_norm"] + ([] if c.tie_embeddings else ["unembed"]) + \
        (["final_norm_bias"] if c.norm_type == "layer" else [])


def _check_shape(source: str, name: str, got: tuple, want: tuple) -> None:
    if tuple(got) != tuple(want):
        raise CheckpointError(f"{source}: tensor {name} has shape {tuple(got)}, the config needs {tuple(want)}")


def param_count(model: Decoder) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
