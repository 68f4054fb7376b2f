"""Decoder configs: one frozen dataclass, built from GGUF metadata or an HF `config.json`.

Both builders consume every key they are given. A key that changes the computation and that the
decoder does not implement (an unknown `rope_scaling`, logit soft-capping, ...) raises `ConfigError`
instead of being silently ignored; keys that only describe bookkeeping are listed in `_INERT_HF_KEYS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from dcsjax.errors import ConfigError

ARCHITECTURES = ("llama", "gemma3")


@dataclass(frozen=True)
class DecoderConfig:
    architecture: str  # "llama" (SmolLM2, Llama 3, Qwen2, Mistral) or "gemma3"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_size: int
    rms_eps: float
    rope_base: float  # global (full-attention) layers
    max_context: int
    tie_embeddings: bool = True
    qkv_bias: bool = False
    # Gemma 3: local layers attend to the last `sliding_window` keys with their own RoPE base.
    sliding_window: int | None = None
    local_rope_base: float | None = None
    layer_is_local: tuple[bool, ...] = field(default=())
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power; default head_dim

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{self.num_heads} heads do not split into {self.num_kv_heads} KV groups")
        if self.layer_is_local and len(self.layer_is_local) != self.num_layers:
            raise ConfigError("layer_is_local must name every layer")
        if any(self.layer_is_local) and (self.sliding_window is None or self.local_rope_base is None):
            raise ConfigError("local layers need sliding_window and local_rope_base")

    # Family traits, derived so that they have one source of truth: the architecture.
    @property
    def is_gemma(self) -> bool:
        return self.architecture == "gemma3"

    @property
    def norm_offset(self) -> float:
        """Gemma's RMSNorm scales by (1 + w); Llama's by w."""
        return 1.0 if self.is_gemma else 0.0

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size) if self.is_gemma else 1.0

    @property
    def activation(self) -> str:
        return "gelu_tanh" if self.is_gemma else "silu"

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def local_layers(self) -> tuple[bool, ...]:
        return self.layer_is_local or (False,) * self.num_layers

    def flops_per_token(self, mean_context: float) -> float:
        """Forward FLOPs of one token: 2 x the matmul parameters (output head included) + the attention
        scores and mixing over `mean_context` keys (4 x layers x heads x head_dim x context)."""
        per_layer = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim + \
            self.num_heads * self.head_dim * self.hidden_size + 3 * self.hidden_size * self.mlp_size
        matmul_params = self.num_layers * per_layer + self.vocab_size * self.hidden_size
        return 2 * matmul_params + 4 * self.num_layers * self.num_heads * self.head_dim * mean_context


# --------------------------------------------------------------------------------------------------
# GGUF metadata
# --------------------------------------------------------------------------------------------------

# `{arch}.` keys we read; any other `{arch}.` key changes the computation in a way we do not know.
_GGUF_KEYS = {
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
    "attention.key_length", "attention.value_length", "rope.freq_base", "rope.dimension_count",
    "attention.sliding_window", "vocab_size",
}
_GEMMA3_LOCAL_ROPE_BASE = 10_000.0  # not stored in the GGUF; transformers' Gemma 3 default
_GEMMA3_GLOBAL_EVERY = 6  # every sixth layer attends globally (transformers' sliding_window_pattern)


def config_from_gguf(meta: Mapping[str, Any], vocab_size: int, source: str = "GGUF") -> DecoderConfig:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{source}: architecture {arch!r} is not supported (supported: {ARCHITECTURES})")
    prefix = arch + "."
    unknown = sorted(k[len(prefix):] for k in meta if k.startswith(prefix) and k[len(prefix):] not in _GGUF_KEYS)
    if unknown:
        raise ConfigError(f"{source}: metadata {', '.join(prefix + u for u in unknown)} is not implemented")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(prefix + key, default)
        if value is None:
            raise ConfigError(f"{source}: metadata {prefix + key} is missing")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ConfigError(f"{source}: key and value head sizes differ")
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ConfigError(f"{source}: partial rotary embeddings are not implemented")
    n_layers = int(get("block_count"))
    common = dict(
        architecture=arch, vocab_size=int(meta.get(prefix + "vocab_size", vocab_size)), hidden_size=hidden,
        num_layers=n_layers, num_heads=heads, num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim, mlp_size=int(get("feed_forward_length")),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")), rope_base=float(get("rope.freq_base", 10_000.0)),
        max_context=int(get("context_length")),
    )
    if arch == "gemma3":
        return DecoderConfig(
            **common, sliding_window=int(get("attention.sliding_window")),
            local_rope_base=_GEMMA3_LOCAL_ROPE_BASE, query_pre_attn_scalar=float(head_dim),
            layer_is_local=tuple((i + 1) % _GEMMA3_GLOBAL_EVERY != 0 for i in range(n_layers)),
        )
    return DecoderConfig(**common)


# --------------------------------------------------------------------------------------------------
# HF config.json
# --------------------------------------------------------------------------------------------------

_HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma3_text": "gemma3"}
# Keys that describe bookkeeping, tokens or training, not the forward pass.
_INERT_HF_KEYS = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id", "unk_token_id", "initializer_range", "use_cache", "attention_dropout",
    "pretraining_tp", "_name_or_path", "_model_name_or_path", "tokenizer_class", "is_llama_config",
    "use_sliding_window", "max_window_layers", "quantization_config",
    "use_bidirectional_attention", "_sliding_window_pattern", "sliding_window_pattern", "cache_implementation",
    "id2label", "label2id", "output_attentions", "output_hidden_states", "return_dict", "problem_type",
    "chunk_size_feed_forward",  # a memory setting of torch's feed-forward; results do not change
}


def config_from_hf(cfg: Mapping[str, Any], source: str = "config.json") -> DecoderConfig:
    cfg = dict(cfg)
    model_type = cfg.get("model_type")
    if model_type not in _HF_MODEL_TYPES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not supported ({sorted(_HF_MODEL_TYPES)})")
    arch = _HF_MODEL_TYPES[model_type]
    taken: set[str] = set()

    def take(key: str, default: Any = ...) -> Any:
        taken.add(key)
        if key in cfg and cfg[key] is not None:
            return cfg[key]
        if default is ...:
            raise ConfigError(f"{source}: {key} is missing")
        return default

    def must_be(key: str, allowed: tuple) -> None:
        value = take(key, None)
        if value not in allowed:
            raise ConfigError(f"{source}: {key}={value!r} is not implemented (only {allowed})")

    hidden, heads = int(take("hidden_size")), int(take("num_attention_heads"))
    head_dim = int(take("head_dim", hidden // heads))
    vocab, kv_heads = int(take("vocab_size")), int(take("num_key_value_heads", heads))
    rope_base, local_base = _hf_rope(take, must_be, arch, source)
    must_be("hidden_act", (None, "silu") if arch == "llama" else (None,))
    must_be("hidden_activation", (None,) if arch == "llama" else ("gelu_pytorch_tanh",))
    must_be("mlp_bias", (None, False))
    must_be("attn_logit_softcapping", (None,))
    must_be("final_logit_softcapping", (None,))
    qkv_bias = bool(take("attention_bias", model_type == "qwen2"))
    n_layers = int(take("num_hidden_layers"))
    sliding, layer_is_local = None, ()
    if arch == "gemma3":
        types = take("layer_types", None)
        if types is None:
            types = ["full_attention" if (i + 1) % _GEMMA3_GLOBAL_EVERY == 0 else "sliding_attention"
                     for i in range(n_layers)]
        layer_is_local = tuple(t == "sliding_attention" for t in types)
        sliding = int(take("sliding_window"))
    else:
        # Mistral/Qwen2 store a window they do not use unless use_sliding_window is set.
        window = take("sliding_window", None)
        if cfg.get("use_sliding_window") or (model_type == "mistral" and window is not None):
            raise ConfigError(f"{source}: sliding-window attention for {model_type} is not implemented")
    must_be("is_encoder_decoder", (None, False))
    config = DecoderConfig(
        architecture=arch, vocab_size=vocab, hidden_size=hidden, num_layers=n_layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        mlp_size=int(take("intermediate_size")), rms_eps=float(take("rms_norm_eps")), rope_base=rope_base,
        max_context=int(take("max_position_embeddings")), tie_embeddings=bool(take("tie_word_embeddings", True)),
        qkv_bias=qkv_bias, sliding_window=sliding, local_rope_base=local_base if arch == "gemma3" else None,
        layer_is_local=layer_is_local,
        query_pre_attn_scalar=float(take("query_pre_attn_scalar", head_dim)) if arch == "gemma3" else None,
    )
    unknown = sorted(set(cfg) - taken - _INERT_HF_KEYS)
    if unknown:
        raise ConfigError(f"{source}: attributes {unknown} are not implemented")
    return config


def _hf_rope(take, must_be, arch: str, source: str) -> tuple[float, float]:
    """(global base, local base). Only plain RoPE is implemented; any scaling raises."""
    params = take("rope_parameters", None)
    scaling = take("rope_scaling", None)
    if scaling is not None:
        raise ConfigError(f"{source}: rope_scaling={scaling!r} is not implemented")
    base = float(take("rope_theta", 10_000.0))
    local = float(take("rope_local_base_freq", _GEMMA3_LOCAL_ROPE_BASE))
    if params is None:
        return base, local
    # transformers >= 5 nests RoPE settings, per layer type for Gemma 3.
    per_type = params if "rope_type" not in params else {"full_attention": params, "sliding_attention": params}
    for kind, p in per_type.items():
        if p.get("rope_type", "default") != "default" or set(p) - {"rope_type", "rope_theta"}:
            raise ConfigError(f"{source}: rope_parameters[{kind!r}]={p!r} is not implemented")
    base = float(per_type.get("full_attention", {}).get("rope_theta", base))
    local = float(per_type.get("sliding_attention", {}).get("rope_theta", local))
    return base, local
