"""One Flax NNX decoder for every family dcsjax loads (Llama 2/3, Mistral, Qwen2/2.5/3 and Qwen3-MoE, OLMo-2,
Gemma 2/3, Phi-3/4, SmolLM2/3, Falcon).

The families differ in a handful of traits, each a named field of `DecoderConfig`: embedding scale, RMSNorm
offset (1 + w) or LayerNorm, where the norms sit (pre, pre+post, post, shared), q/k norms per head or over
the projection, biases, GeGLU, SwiGLU or a plain GELU MLP, routed experts, attention and MLP in sequence or
side by side, soft-capped scores and logits, Llama 3 RoPE scaling, layers without RoPE, and sliding-window
local layers (own RoPE base). Writing them as switches on one block keeps attention, RoPE and masking in
one place instead of a near-copy per family.

Parameters are stacked over layers (leading axis `layers`) and the blocks run under `lax.scan`, so compile
time does not grow with depth. Every parameter carries logical axis names (`axes` metadata) for sharding.

Shapes: B batch rows, T tokens per row, D width, H query heads, N KV heads, G = H / N, K head size,
F MLP width, V vocabulary, L layers.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from dcsjax.nn.attention import (NO_WINDOW, LongRow, MaskParts, cached_attention, dense_attention, softcap, takes_blockwise,
                                  tiled_attention, visible)
from dcsjax.nn import loops
from dcsjax.nn.config import DecoderConfig

F32 = jnp.float32
ROUTE_CHUNK = 64  # tokens routed together; rows are multiples of 64 tokens (packing.BUCKET_MULTIPLE)

# Per-layer parameters: name -> (shape given the config, logical axes). The leading `layers` axis is added.
def layer_param_shapes(c: DecoderConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    d, h, n, k, f = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_size
    shapes = {
        "q": ((d, h, k), ("embed", "heads", "head_dim")),
        "k": ((d, n, k), ("embed", "kv_heads", "head_dim")),
        "v": ((d, n, k), ("embed", "kv_heads", "head_dim")),
        "o": ((h, k, d), ("heads", "head_dim", "embed")),
    }
    if c.num_experts:  # experts first: a mesh's model axis splits the experts
        e, fe = c.num_experts, c.expert_mlp_size
        shapes |= {"router": ((d, e), ("embed", "experts")),
                   "expert_gate": ((e, d, fe), ("experts", "embed", "expert_mlp")),
                   "expert_up": ((e, d, fe), ("experts", "embed", "expert_mlp")),
                   "expert_down": ((e, fe, d), ("experts", "expert_mlp", "embed"))}
    else:
        shapes |= {"up": ((d, f), ("embed", "mlp")), "down": ((f, d), ("mlp", "embed"))}
        if c.gated_mlp:
            shapes["gate"] = ((d, f), ("embed", "mlp"))
    if c.qkv_bias:
        shapes |= {"q_bias": ((h, k), ("heads", "head_dim")), "k_bias": ((n, k), ("kv_heads", "head_dim")),
                   "v_bias": ((n, k), ("kv_heads", "head_dim"))}
    if c.norms in ("pre", "pre+post", "shared"):
        shapes["attn_norm"] = ((d,), ("embed",))
    if c.norms in ("pre", "pre+post"):
        shapes["mlp_norm"] = ((d,), ("embed",))
    if c.norms in ("pre+post", "post"):
        shapes |= {"post_attn_norm": ((d,), ("embed",)), "post_mlp_norm": ((d,), ("embed",))}
    if c.qk_norm == "head":
        shapes |= {"q_norm": ((k,), ("head_dim",)), "k_norm": ((k,), ("head_dim",))}
    elif c.qk_norm == "projection":
        shapes |= {"q_norm": ((h, k), ("heads", "head_dim")), "k_norm": ((n, k), ("kv_heads", "head_dim"))}
    if c.norm_type == "layer":  # LayerNorm's bias, beside each of the block's norms (q/k norms are RMS)
        shapes |= {f"{name}_bias": shapes[name] for name in ("attn_norm", "mlp_norm", "post_attn_norm",
                                                             "post_mlp_norm") if name in shapes}
    return shapes


class Layers(nnx.Module):
    """All decoder blocks' parameters, each stacked along a leading `layers` axis."""

    def __init__(self, c: DecoderConfig, dtype, rngs: nnx.Rngs):
        for name, (shape, axes) in layer_param_shapes(c).items():
            full = (c.num_layers, *shape)
            if name.endswith("norm"):  # identity at init: w = 1, or w = 0 under Gemma's (1 + w)
                value = jnp.full(full, 1.0 - c.norm_offset, dtype)
            elif name.endswith("bias"):
                value = jnp.zeros(full, dtype)
            else:
                value = 0.02 * jax.random.normal(rngs.params(), full, dtype)
            setattr(self, name, nnx.Param(value, axes=("layers", *axes)))

    def arrays(self) -> dict[str, jax.Array]:
        return {name: v[...] for name, v in vars(self).items() if isinstance(v, nnx.Param)}


class Decoder(nnx.Module):
    def __init__(self, config: DecoderConfig, *, dtype=F32, rngs: nnx.Rngs):
        c = self.config = config
        self.embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (c.vocab_size, c.hidden_size), dtype),
                               axes=("vocab", "embed"))
        if not c.tie_embeddings:
            self.unembed = nnx.Param(
                0.02 * jax.random.normal(rngs.params(), (c.vocab_size, c.hidden_size), dtype), axes=("vocab", "embed"))
        self.final_norm = nnx.Param(jnp.full((c.hidden_size,), 1.0 - c.norm_offset, dtype), axes=("embed",))
        if c.norm_type == "layer":
            self.final_norm_bias = nnx.Param(jnp.zeros((c.hidden_size,), dtype), axes=("embed",))
        self.layers = Layers(c, dtype, rngs)

    @property
    def output_embedding(self) -> jax.Array:  # [V, D]
        return (self.embed if self.config.tie_embeddings else self.unembed)[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The output head on final hidden states [..., D] (a forward pass's [B, T, D], a decode step's [B, D])
        -> float32 logits [..., V]. For scoring at scale the log-prob kernel takes the same head a vocabulary
        chunk at a time (`engine.logprobs`), never [B, T, V] at once."""
        return unembed(hidden, self.output_embedding, self.config.final_softcap)

    def __call__(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array,
                 attend_to: jax.Array | None = None, *, remat: bool = False, return_kv: bool = False,
                 blockwise: bool | None = None, mesh=None):
        """Final hidden states [B, T, D] of rows of tokens [B, T].

        positions [B, T]: RoPE positions. segment_ids [B, T]: 0 is padding; a token attends to earlier
        tokens of its own segment and, if `attend_to` [B, T] names one, of that segment too (a shared
        question that several option segments continue). With return_kv, also every layer's keys and
        values [L, B, T, N, K] (a prefill for `decode_step`). blockwise: the attention path (`attention_masks`;
        by default from the row length). mesh: the mesh the program runs on, which picks the long-row kernel
        (`attention.long_row_kernel`: splash on TPU) and runs it under `shard_map`.
        """
        c = self.config
        x, kv = run_blocks(c, self.layers.arrays(), layer_flags(c), self.embed_tokens(tokens),
                           positions, segment_ids, attend_to, remat=remat, return_kv=return_kv, blockwise=blockwise,
                           mesh=mesh)
        hidden = self.final(x)
        return (hidden, kv) if return_kv else hidden

    def final(self, x: jax.Array) -> jax.Array:
        """The final norm of the residual stream x [..., D]."""
        bias = self.final_norm_bias[...] if self.config.norm_type == "layer" else None
        return normalize(self.config, x, self.final_norm[...], bias)

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        """tokens [B, T] -> the residual stream's input [B, T, D]."""
        embed = self.embed[...]
        return embed[tokens] * jnp.asarray(self.config.embed_scale, embed.dtype)

    def residual(self, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array, num_layers: int) -> jax.Array:
        """The residual stream [B, T, D] after the first `num_layers` blocks (no final norm): the frozen
        part of a model whose top layers are fine-tuned (dcsjax.training caches it once)."""
        c = self.config
        params = {name: value[:num_layers] for name, value in self.layers.arrays().items()}
        x, _ = run_blocks(c, params, layer_flags(c, 0, num_layers), self.embed_tokens(tokens), positions, segment_ids)
        return x

    def decode_step(self, tokens: jax.Array, positions: jax.Array, cache_k: jax.Array, cache_v: jax.Array, mesh=None):
        """One new token per row with a KV cache: tokens, positions [B] (a row's next position is also the
        cache slot it writes); cache_k, cache_v [L, B, S, N, K] -> (hidden [B, D], cache_k, cache_v).
        Each layer reads its cache slice (scanned in, never carried) and attends over the slots before the row's
        position plus its own new key, so a right-padded prefill's padding is never seen; the new keys and
        values of all layers are written into their slots once, after the scan (one scatter, in place in the
        decoding loop's carry). mesh: the mesh the program runs on (the MoE's routed experts split over it)."""
        c = self.config
        x = self.embed_tokens(tokens[:, None])  # [B, 1, D]
        slots = jnp.arange(cache_k.shape[2])[None, :]  # [1, S]: slot s holds position s
        # `visible`, the one mask rule, for a query that sees the cached slots before its position (its own
        # key is attended apart, `cached_attention`): causally it stands at the column of the last of them
        pos = positions[:, None]  # [B, 1]
        def mask(window):  # -> [B, 1, S]
            return visible(pos - 1, slots, 1, 0, pos, 1, slots, window)[:, None, :]
        glob, local = mask(NO_WINDOW), mask(c.sliding_window or NO_WINDOW)
        ropes = rope_tables(c, positions[:, None])

        def block(x, layer):
            p, flags, k_cache, v_cache = layer
            return decoder_block(c, p, x, ropes.pick(flags), jnp.where(flags.local, local, glob),
                                 cache=(k_cache, v_cache), mesh=mesh)

        x, (new_k, new_v) = loops.scan(block, x, (self.layers.arrays(), layer_flags(c), cache_k, cache_v))
        rows = jnp.arange(tokens.shape[0])
        cache_k = cache_k.at[:, rows, positions].set(new_k[:, :, 0])  # [L, B, 1, N, K] into slot `positions`
        cache_v = cache_v.at[:, rows, positions].set(new_v[:, :, 0])
        return self.final(x)[:, 0], cache_k, cache_v


def run_blocks(c: DecoderConfig, params: dict[str, jax.Array], flags: "LayerFlags", x: jax.Array,
               positions: jax.Array, segment_ids: jax.Array, attend_to: jax.Array | None = None, *,
               remat: bool = False, return_kv: bool = False, blockwise: bool | None = None, mesh=None):
    """x [B, T, D] through the blocks whose parameters are stacked in `params` (leading axis: those layers;
    `flags` says which of them are sliding-window and which use RoPE) -> (x [B, T, D], keys and values or None)."""
    masks = attention_masks(c, positions, segment_ids, attend_to, blockwise=blockwise, mesh=mesh)
    ropes = rope_tables(c, positions)

    def block(x, layer):
        p, layer_flags = layer
        x, kv = decoder_block(c, p, x, ropes.pick(layer_flags), masks.pick(layer_flags), mesh=mesh)
        return x, (kv if return_kv else None)

    if remat:
        block = jax.checkpoint(block)
    return loops.scan(block, x, (params, flags))


class LayerFlags(NamedTuple):
    local: jax.Array  # [layers] bool: a sliding-window layer
    rope: jax.Array  # [layers] bool: a layer that rotates queries and keys (SmolLM3 has some that do not)


def layer_flags(c: DecoderConfig, start: int = 0, stop: int | None = None) -> LayerFlags:
    """The flags of layers start..stop, as arrays a `lax.scan` over the stacked layers reads."""
    return LayerFlags(jnp.asarray(c.local_layers[start:stop]), jnp.asarray(c.rope_layers[start:stop]))


class Rope(NamedTuple):
    cos: jax.Array  # [B, T, K]
    sin: jax.Array  # [B, T, K]


class RopeTables(NamedTuple):
    glob: Rope
    local: Rope

    def pick(self, flags: LayerFlags) -> Rope:
        """A layer's table: local or global, and the identity (cos 1, sin 0) for a layer without RoPE."""
        cos, sin = (jnp.where(flags.local, lo, gl) for lo, gl in zip(self.local, self.glob))
        return Rope(jnp.where(flags.rope, cos, 1.0), jnp.where(flags.rope, sin, 0.0))


class Masks(NamedTuple):
    """The dense path's masks, built once per forward pass and picked per layer."""
    glob: jax.Array  # [B, T, S] bool
    local: jax.Array  # [B, T, S] bool

    def pick(self, flags: LayerFlags) -> jax.Array:
        return jnp.where(flags.local, self.local, self.glob)


class TiledMasks(NamedTuple):
    """The tiled paths' masks: the parts each tile's mask is built from, the local layers' window and the mesh."""
    parts: MaskParts
    sliding_window: int | None
    mesh: object = None

    def pick(self, flags: LayerFlags) -> LongRow:
        window = jnp.where(flags.local, self.sliding_window or NO_WINDOW, NO_WINDOW)
        return LongRow(self.parts._replace(window=window), self.sliding_window, self.mesh)


def inverse_frequencies(head_dim: int, base: float, llama3: tuple | None = None) -> np.ndarray:
    """[K/2] float32, as transformers computes them (in float32), with Llama 3's scaling where given:
    wavelengths past the original context are slowed by `factor`, short ones kept, the band between
    interpolated."""
    inv_freq = (1.0 / (np.float32(base) ** (np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim))))
    inv_freq = inv_freq.astype(np.float32)
    if llama3 is None:
        return inv_freq
    factor, low, high, original = (np.float32(v) for v in llama3)
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > original / low, inv_freq / factor, inv_freq).astype(np.float32)
    smooth = ((original / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_table(positions: jax.Array, inv_freq: np.ndarray) -> Rope:
    """HF's (rotate-half) layout: frequencies repeated over the two halves of each head."""
    angles = positions.astype(F32)[..., None] * jnp.asarray(inv_freq, F32)  # [B, T, K/2]
    angles = jnp.concatenate([angles, angles], axis=-1)  # [B, T, K]
    return Rope(jnp.cos(angles), jnp.sin(angles))


def rope_tables(c: DecoderConfig, positions: jax.Array) -> RopeTables:
    glob = rope_table(positions, inverse_frequencies(c.head_dim, c.rope_base, c.rope_llama3))
    local = rope_table(positions, inverse_frequencies(c.head_dim, c.local_rope_base)) if any(c.local_layers) else glob
    return RopeTables(glob, local)


def right_padded(lengths: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """Positions and segment ids [B, T] of rows holding one sequence each from column 0, lengths [B] tokens,
    padding after (segment 0): prompts for a prefill, training prompts."""
    positions = jnp.broadcast_to(jnp.arange(length), (lengths.shape[0], length))
    return positions, (positions < lengths[:, None]).astype(jnp.int32)


def float32_matmuls(stream: str):
    """The decorated function traced with its matmuls at full float32 precision when its argument `stream` is
    float32. JAX's default lets a GPU run float32 matmuls in TensorFloat-32 (a 10-bit mantissa) and a TPU in
    one bfloat16 pass, and the engine promises float32 log-probs: on an H200 a float32 decoder's log-probs were
    4.8e-4 nats from the CPU's at the default, 1.9e-6 at full precision (docs/bench/gpu-h200-precision-*).
    A bfloat16 model's layer matmuls keep the default: its products of bfloat16 values are exact in float32
    either way, and the float32 ones (attention weights times values) end rounded to bfloat16, coarser than
    TensorFloat-32; its float32 sums taken as dots (`row_sum`: the norms, the log-softmax) take full precision.
    Transposed matmuls (the backward pass) keep the precision their forward one names."""

    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            if signature.bind(*args, **kwargs).arguments[stream].dtype != F32:
                return fn(*args, **kwargs)
            with jax.default_matmul_precision("highest"):
                return fn(*args, **kwargs)

        return traced

    return wrap


@float32_matmuls("hidden")
def unembed(hidden: jax.Array, rows: jax.Array, cap: float | None) -> jax.Array:
    """The output head: hidden [..., D] against rows of the output matrix [V, D] (or each hidden state's own
    rows [..., K, D], say the option letters) -> float32 logits [..., V] (or [..., K]), soft-capped (Gemma 2).
    Where hidden states and rows share a dtype the matmul runs in it, accumulated in float32 (bfloat16 products
    are exact in float32); mixed dtypes go through float32."""
    common = hidden.dtype if hidden.dtype == rows.dtype else F32
    spec = "...d,vd->...v" if rows.ndim == 2 else "...d,...vd->...v"
    return softcap(jnp.einsum(spec, hidden.astype(common), rows.astype(common), preferred_element_type=F32), cap)


def attention_masks(c: DecoderConfig, positions, segment_ids, attend_to=None, *,
                    blockwise: bool | None = None, mesh=None) -> Masks | TiledMasks:
    """The masks of rows [B, T] for every layer kind. blockwise: tiles for a tiled kernel instead of [B, T, S]
    arrays; by default for rows of `attention.BLOCKWISE_FROM` tokens or more (the kernel: `long_row_kernel(mesh)`)."""
    if blockwise is None:
        blockwise = takes_blockwise(segment_ids.shape[1])
    to = jnp.zeros_like(segment_ids) if attend_to is None else attend_to  # 0 = none: only padding keys match it, and those are masked
    parts = MaskParts(segment_ids, segment_ids, to, positions, positions)
    if blockwise:
        return TiledMasks(parts, c.sliding_window if any(c.local_layers) else None, mesh)
    glob = parts.dense()  # [B, T, S], the same rule (`attention.visible`) as the tiles
    if not any(c.local_layers):
        return Masks(glob, glob)
    return Masks(glob, parts._replace(window=c.sliding_window).dense())


@float32_matmuls("x")  # also outside a block: the final norm
def row_sum(x: jax.Array) -> jax.Array:
    """Sum over the last axis as a dot with ones. XLA's CPU reductions vectorise differently with the
    batch shape, so a row's sum would change in its last bits with the batch size; its dot kernels
    do not, which keeps every score bit-identical across batch sizes, packing and buckets."""
    return jnp.einsum("...d,d->...", x, jnp.ones(x.shape[-1], x.dtype), preferred_element_type=F32)


class LowRank(NamedTuple):
    """A frozen weight with a trained low-rank update, w + a @ b, kept apart (LoRA while training): the
    backward pass then needs x's gradient through w and the small factors' gradients, never a gradient
    the size of w, which the merged w + a @ b would cost (a third of a step's matmuls). a [in, r] and
    b [r, out] act on w's input axes flattened and its output axes flattened (any scale folded into b)."""

    w: jax.Array  # [in..., out...], as the family stores it
    a: jax.Array  # [in, r]
    b: jax.Array  # [r, out]


@float32_matmuls("x")  # also where a block is not around it (training's top layers)
def dense(spec: str, x: jax.Array, w: jax.Array | LowRank) -> jax.Array:
    """A weight matmul accumulated in float32, the result in x's dtype. For bfloat16 this is what XLA
    would compute anyway, but asked for explicitly it runs as a bfloat16 x bfloat16 -> float32 kernel
    (twice the float32 rate on CPUs with AVX-512 BF16) instead of upcasting both operands first.
    Every spec contracts x's last axes with w's first ones, which is how a `LowRank` update is applied."""
    if isinstance(w, LowRank):
        y = dense(spec, x, w.w)
        # x = [tokens..., in...]: its input axes flatten onto a's rows
        delta = low_rank_update(x.reshape(-1, w.a.shape[0]).astype(F32), w.a, w.b)  # [tokens, out]
        return y + delta.reshape(y.shape).astype(y.dtype)
    return jnp.einsum(spec, x, w, preferred_element_type=F32).astype(x.dtype)


@jax.custom_vjp
def low_rank_update(x: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """(x a) b for x [M, in], a [in, r], b [r, out] -> [M, out], with its gradients written out.

    Left to autodiff, b's gradient (x a)^T g contracts the M tokens, the leading axis of both operands, and
    XLA's CPU backend then copies the [M, out] cotangent g into a transposed layout first: in a LoRA update
    of SmolLM2 (16 prompts of 128 tokens, 30 blocks) those copies took 2.4 s of a 12.1 s update, and the matmuls
    reading them ran at half speed (`bench/profile_lora_step.py`; 9.1 s per update with this function). Here
    only the small [r, M] factors are transposed, so every large product is a plain matmul."""
    return (x @ a) @ b


@float32_matmuls("x")
def _low_rank_forward(x, a, b):
    xa = x @ a  # [M, r]
    return xa @ b, (x, a, b, xa.T)  # the small [r, M] transpose is the one kept for the backward pass


@float32_matmuls("g")  # traced apart, when the gradient is
def _low_rank_backward(saved, g):  # g [M, out]
    x, a, b, xa_t = saved
    gb_t = jnp.einsum("ro,mo->rm", b, g)  # [r, M]
    return (jnp.einsum("rm,ir->mi", gb_t, a),  # x's
            jnp.einsum("rm,mi->ri", gb_t, x).T,  # a's
            jnp.einsum("rm,mo->ro", xa_t, g))  # b's


low_rank_update.defvjp(_low_rank_forward, _low_rank_backward)


def rms_norm(x: jax.Array, w: jax.Array, eps: float, offset: float) -> jax.Array:
    xf = x.astype(F32)
    y = xf * jax.lax.rsqrt(row_sum(xf * xf)[..., None] / x.shape[-1] + eps)
    return (y * (offset + w.astype(F32))).astype(x.dtype)


def normalize(c: DecoderConfig, x: jax.Array, w: jax.Array, b: jax.Array | None = None) -> jax.Array:
    """The family's norm over the last axis: RMSNorm, or LayerNorm with its bias (Falcon). Means taken as
    dots (`row_sum`), as in RMSNorm, so a row's result does not depend on its batch."""
    if c.norm_type == "rms":
        return rms_norm(x, w, c.rms_eps, c.norm_offset)
    xf = x.astype(F32)
    centred = xf - row_sum(xf)[..., None] / x.shape[-1]
    y = centred * jax.lax.rsqrt(row_sum(centred * centred)[..., None] / x.shape[-1] + c.rms_eps)
    return (y * (c.norm_offset + w.astype(F32)) + b.astype(F32)).astype(x.dtype)


def qk_norm(c: DecoderConfig, x: jax.Array, w: jax.Array) -> jax.Array:
    """x [B, T, heads, K]: RMSNorm per head (Gemma 3, Qwen3) or over the whole projection (OLMo-2, w [heads, K])."""
    if c.qk_norm == "head":
        return rms_norm(x, w, c.rms_eps, c.norm_offset)
    flat = rms_norm(x.reshape(*x.shape[:-2], -1), w.reshape(-1), c.rms_eps, c.norm_offset)
    return flat.reshape(x.shape)


def apply_rope(x: jax.Array, rope: Rope) -> jax.Array:
    """x [B, T, ..., K]; rope tables broadcast over the head axes."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    extra = x.ndim - 3
    cos = rope.cos.reshape(*rope.cos.shape[:2], *(1,) * extra, -1)
    sin = rope.sin.reshape(*rope.sin.shape[:2], *(1,) * extra, -1)
    return (x.astype(F32) * cos + rotated.astype(F32) * sin).astype(x.dtype)


def project_kv(c: DecoderConfig, p: dict, x: jax.Array, rope: Rope) -> tuple[jax.Array, jax.Array]:
    """x [B, S, D] (normed) -> keys (normed for Gemma, rotated) and values [B, S, N, K]."""
    k = dense("bsd,dnk->bsnk", x, p["k"])
    v = dense("bsd,dnk->bsnk", x, p["v"])
    if c.qkv_bias:
        k, v = k + p["k_bias"], v + p["v_bias"]
    if c.qk_norm:
        k = qk_norm(c, k, p["k_norm"])
    return apply_rope(k, rope), v


def attention(c: DecoderConfig, p: dict, x: jax.Array, rope: Rope, mask: jax.Array | LongRow, cache=None,
              context=None):
    """-> (output [B, T, D], (keys, values) [B, S, N, K]). mask: [B, T, S] bool (the dense path) or a long
    row's (`attention.LongRow`: the tiled kernels; `dcsjax.nn.attention`).
    context (k, v [B, S, N, K]): the keys and values attended to instead of x's own (a readout at one position
    of a row whose keys are already projected). cache (k, v [B, S, N, K]): a decode step, T = 1; the query
    attends over the cache slots its mask [B, 1, S] allows and its own key, and only its own (keys, values)
    [B, 1, N, K] are returned, for the caller to write into the cache."""
    b, t, _ = x.shape
    n, g = c.num_kv_heads, c.num_heads // c.num_kv_heads
    q = dense("btd,dhk->bthk", x, p["q"])  # [B, T, H, K]
    if c.qkv_bias:
        q = q + p["q_bias"]
    if c.qk_norm:
        q = qk_norm(c, q, p["q_norm"])
    q = apply_rope(q, rope).reshape(b, t, n, g, c.head_dim)  # [B, T, N, G, K]
    k, v = project_kv(c, p, x, rope) if context is None else context
    if cache is not None:
        out = cached_attention(q, *cache, k, v, mask, c.attn_scale, c.attn_softcap)
    elif isinstance(mask, LongRow):
        out = tiled_attention(q, k, v, mask, c.attn_scale, c.attn_softcap)
    else:
        out = dense_attention(q, k, v, mask, c.attn_scale, c.attn_softcap)
    out = out.astype(v.dtype).reshape(b, t, c.num_heads, c.head_dim)
    return dense("bthk,hkd->btd", out, p["o"]), (k, v)


def mlp(c: DecoderConfig, p: dict, x: jax.Array, mesh=None) -> jax.Array:
    if c.num_experts:
        return experts(c, p, x, mesh)
    if not c.gated_mlp:  # Falcon: down(gelu(up(x)))
        return dense("btf,fd->btd", jax.nn.gelu(dense("btd,df->btf", x, p["up"]), approximate=False), p["down"])
    gate = dense("btd,df->btf", x, p["gate"])
    up = dense("btd,df->btf", x, p["up"])
    act = jax.nn.gelu(gate, approximate=True) if c.activation == "gelu_tanh" else jax.nn.silu(gate)
    return dense("btf,fd->btd", act * up, p["down"])


def experts(c: DecoderConfig, p: dict, x: jax.Array, mesh=None) -> jax.Array:
    """Routed experts, x [B, T, D] -> [B, T, D]: a softmax router over E experts, the top k of each token
    weighted by their router mass (renormalised over the k with `norm_topk`). By platform, chosen when the program
    is lowered (`jax.lax.platform_dependent`, so a TPU topology compiled for on a CPU host gets the TPU branch):
    `routed_experts` on TPU (the routed FLOPs, each device its own experts), `dense_experts` elsewhere
    (bit-invariant to the batch)."""
    return jax.lax.platform_dependent(x, tpu=lambda x: routed_experts(c, p, x, mesh),
                                      default=lambda x: dense_experts(c, p, x))


def route(c: DecoderConfig, p: dict, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """tokens [n, D] -> (weights [n, k] float32, experts [n, k]): each token's top k experts and their weights."""
    logits = jnp.einsum("td,de->te", tokens, p["router"], preferred_element_type=F32)
    z = jnp.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = z / in_order_sum(z)[..., None]
    top, index = jax.lax.top_k(probs, c.experts_per_token)  # [n, k]
    if c.norm_topk:
        top = top / in_order_sum(top)[..., None]
    return top, index


def dense_experts(c: DecoderConfig, p: dict, x: jax.Array) -> jax.Array:
    """Every expert computed for every token, the unchosen ones weighted 0: exact for any routing, at E / k
    times the routed FLOPs, and on CPU far faster than grouped matmuls (XLA's CPU `ragged_dot` computes every
    group for every row: 1.1 s for 4,096 rows of 16 groups, 1,024 x 512, about 100 times what a matmul of the
    routed FLOPs takes at the host's matmul rate). Tokens are routed in
    chunks of one fixed shape and sums added in a fixed order, so a token's output does not depend on the batch
    it is in."""
    b, t, d = x.shape
    e, fe = c.num_experts, c.expert_mlp_size

    def weights_of(chunk):  # [ROUTE_CHUNK, D] tokens -> [ROUTE_CHUNK, E] expert weights
        top, index = route(c, p, chunk)
        return (jax.nn.one_hot(index, e, dtype=F32) * top[..., None]).max(axis=-2)  # one k per expert

    # XLA's CPU code rounds the same input differently at some array shapes: elementwise (3.7e-9 on a router
    # probability between a [32, 128, 4] batch and one of its rows), and the router's matmul, whose few
    # columns (E) take a kernel that sums by the number of rows on AVX2-only hosts; routing tokens
    # in chunks of one fixed shape, the router's matmul included, makes a token's weights independent of the
    # batch it shares
    n = b * t
    tokens = jnp.pad(x.reshape(n, d), ((0, -n % ROUTE_CHUNK), (0, 0)))  # a decode step routes B tokens
    weights = loops.map(weights_of, tokens.reshape(-1, ROUTE_CHUNK, d)).reshape(-1, e)[:n].reshape(b, t, e)
    gate = dense("btd,df->btf", x, p["expert_gate"].transpose(1, 0, 2).reshape(d, e * fe)).reshape(b, t, e, fe)
    up = dense("btd,df->btf", x, p["expert_up"].transpose(1, 0, 2).reshape(d, e * fe)).reshape(b, t, e, fe)
    act = (jax.nn.silu(gate) * up).astype(F32) * weights[..., None]  # [B, T, E, Fe]
    # one plain matmul over (expert, width), as the dense MLP's down projection
    return dense("btf,fd->btd", act.reshape(b, t, e * fe), p["expert_down"].astype(F32).reshape(e * fe, d)).astype(x.dtype)


def routed_experts(c: DecoderConfig, p: dict, x: jax.Array, mesh=None) -> jax.Array:
    """Each token through its k experts only (the TPU path), x [B, T, D] -> [B, T, D]. On a mesh whose model axis
    divides the experts, each device runs its own experts (the rules table splits them over `model`) on the
    pairs routed to them, under `shard_map`, and the devices' sums are added (`psum`): the expert weights are
    never gathered (left to XLA's partitioner, every layer gathered all of them onto every device and computed
    every pair there). Equal to `dense_experts` to float32 rounding, not bit for bit, and not bit-invariant to
    the batch (a group's rows depend on what else is routed to it)."""
    weights = {name: p[name] for name in ("router", "expert_gate", "expert_up", "expert_down")}
    m = mesh.shape["model"] if mesh is not None else 1
    if m == 1 or c.num_experts % m:
        return _routed(c, weights, x, None)
    rows = "data" if x.shape[0] % mesh.shape["data"] == 0 else None
    experts_split = {name: P() if name == "router" else P("model") for name in weights}
    return jax.shard_map(lambda w, x: _routed(c, w, x, "model"), mesh=mesh, check_vma=False,
                         in_specs=(experts_split, P(rows)), out_specs=P(rows))(weights, x)


def _routed(c: DecoderConfig, w: dict, x: jax.Array, axis: str | None) -> jax.Array:
    """`routed_experts` on one device, whose experts are w's (all E, or this device's E / m along `axis`): the
    (token, expert) pairs sorted by expert, its own first and the rest after, each projection one grouped matmul
    (`jax.lax.ragged_dot`, which XLA compiles natively for TPU; rows past the groups come out 0), weighted, and
    added back per token."""
    b, t, d = x.shape
    k, own = c.experts_per_token, w["expert_gate"].shape[0]
    tokens = x.reshape(-1, d)  # [N, D]
    top, index = route(c, w, tokens)  # [N, k]
    group = index.reshape(-1) - (jax.lax.axis_index(axis) * own if axis else 0)  # [N k]: the pair's local expert
    mine = (group >= 0) & (group < own)
    group = jnp.where(mine, group, own)  # another device's expert: after this device's own
    pairs = jnp.argsort(group, stable=True)  # [N k], grouped by expert
    owner = pairs // k  # each pair's token
    sizes = jnp.bincount(group, length=own + 1)[:own].astype(jnp.int32)  # [E own]

    def grouped(rows, weight):  # rows [N k, in] by expert, weight [E own, in, out] -> [N k, out] float32
        return jax.lax.ragged_dot(rows, weight, sizes, preferred_element_type=F32)

    rows = tokens[owner]
    act = jax.nn.silu(grouped(rows, w["expert_gate"]).astype(x.dtype)) * grouped(rows, w["expert_up"]).astype(x.dtype)
    act = act.astype(F32) * jnp.where(mine, top.reshape(-1), 0.0)[pairs][:, None]  # [N k, Fe], weighted
    down = grouped(act.astype(x.dtype), w["expert_down"])  # [N k, D]
    out = jnp.zeros(tokens.shape, F32).at[owner].add(down)
    if axis:
        out = jax.lax.psum(out, axis)
    return out.astype(x.dtype).reshape(b, t, d)


def in_order_sum(x: jax.Array) -> jax.Array:
    """Sum over a short last axis (experts), added one entry after another: the same order at any batch
    shape, where a reduction's vectorisation changes with it."""
    total = x[..., 0]
    for i in range(1, x.shape[-1]):
        total = total + x[..., i]
    return total


@float32_matmuls("x")
def decoder_block(c: DecoderConfig, p: dict, x: jax.Array, rope: Rope, mask: jax.Array, cache=None, context=None,
                  mesh=None):
    """-> (x [B, T, D], this layer's (keys, values)). Norms before each part ("pre"), before and after
    ("pre+post"), after only ("post"), or one before both ("shared"); the parts one after the other, or side by
    side (`parallel_block`, Falcon). mesh: the program's (None: one device), for the MoE's routed experts."""
    def norm(y, w):
        return block_norm(c, p, y, w)

    h, kv = attention(c, p, norm(x, "attn_norm"), rope, mask, cache, context)
    if c.parallel_block:
        return x + (mlp(c, p, norm(x, "mlp_norm" if "mlp_norm" in p else "attn_norm"), mesh) + h), kv
    x = x + norm(h, "post_attn_norm")
    h = mlp(c, p, norm(x, "mlp_norm"), mesh)
    return x + norm(h, "post_mlp_norm"), kv


def block_norm(c: DecoderConfig, p: dict, y: jax.Array, name: str) -> jax.Array:
    """The block's norm `name` applied to y, or y itself where the family has no such norm."""
    return normalize(c, y, p[name], p.get(f"{name}_bias")) if name in p else y


def readout_block(c: DecoderConfig, p: dict, x: jax.Array, rope: Rope, mask: jax.Array, last: jax.Array,
                  rows: jax.Array | None = None) -> jax.Array:
    """A block's output at one position per read, x [R, T, D], last [B] -> [B, D]: keys and values from every
    position, the query, attention output and MLP at `last` only (mask [R, T, S] as for the whole block).
    rows [B]: the row of each read (rows packed with several sequences); default read b in row b (B = R).
    A model read out at one token needs only this from its top block: about 1/T of the block's cost."""
    keys, values = project_kv(c, p, block_norm(c, p, x, "attn_norm"), rope)
    if rows is None:
        rows = jnp.arange(x.shape[0])
    else:  # each read's own row's keys and values
        keys, values = keys[rows], values[rows]
    at_last = Rope(rope.cos[rows, last][:, None], rope.sin[rows, last][:, None])
    out, _ = decoder_block(c, p, x[rows, last][:, None], at_last, mask[rows, last][:, None],
                           context=(keys, values))  # every position's keys, the query's own too
    return out[:, 0]
