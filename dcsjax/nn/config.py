"""Decoder configs: one frozen dataclass, built from GGUF metadata or an HF `config.json`.

Both builders consume every key they are given. A key that changes the computation and that the
decoder does not implement (an unknown `rope_scaling`, logit soft-capping, ...) raises `ConfigError`
instead of being silently ignored; keys that only describe bookkeeping are listed in `_INERT_HF_KEYS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from dcsjax.errors import ConfigError

# Families whose HF configs map onto the one decoder; GGUF files are read for the first two.
ARCHITECTURES = ("llama", "gemma3", "qwen2", "qwen3", "qwen3_moe", "mistral", "olmo2", "gemma2", "phi3", "smollm3",
                 "falcon")
NORM_PLACEMENTS = ("pre", "pre+post", "post", "shared")
QK_NORMS = (None, "head", "projection")


@dataclass(frozen=True)
class DecoderConfig:
    """Every way the families differ is a named field here; the decoder reads the fields, never the family."""
    architecture: str  # the family, for messages and tensor tables (see ARCHITECTURES)
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
    # Local layers attend to the last `sliding_window` keys, with their own RoPE base (Gemma 2/3, Qwen2/3
    # with use_sliding_window, Mistral v0.1).
    sliding_window: int | None = None
    local_rope_base: float | None = None
    layer_is_local: tuple[bool, ...] = field(default=())
    query_pre_attn_scalar: float | None = None  # attention scale is its -1/2 power; default head_dim
    activation: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w): Gemma's is 1
    embed_scale: float = 1.0  # the embeddings are multiplied by it: Gemma's sqrt(hidden_size)
    # "pre" (Llama), "pre+post" (Gemma 2/3: around attention and MLP), "post" (OLMo-2), "shared" (Falcon-7B:
    # one norm feeding attention and MLP side by side)
    norms: str = "pre"
    norm_type: str = "rms"  # "rms", or "layer" (LayerNorm with a bias: Falcon)
    parallel_block: bool = False  # Falcon: x + attention(norm(x)) + mlp(norm(x)) instead of one after the other
    gated_mlp: bool = True  # SwiGLU/GeGLU; False: down(act(up(x))) (Falcon)
    qk_norm: str | None = None  # RMSNorm of queries and keys: per "head" (Gemma 3, Qwen3), whole "projection" (OLMo-2)
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_softcap: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    # Llama 3.x RoPE scaling: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    rope_llama3: tuple[float, float, float, int] | None = None
    layer_uses_rope: tuple[bool, ...] = field(default=())  # () = every layer; SmolLM3 has NoPE layers
    # Routed experts in place of the MLP (Qwen3-MoE): a softmax router picks `experts_per_token` of
    # `num_experts` SwiGLU experts of width `expert_mlp_size`, weighted by their (renormalised) router mass
    num_experts: int = 0
    experts_per_token: int = 0
    expert_mlp_size: int = 0
    norm_topk: bool = False

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{self.num_heads} heads do not split into {self.num_kv_heads} KV groups")
        for name in ("layer_is_local", "layer_uses_rope"):
            if getattr(self, name) and len(getattr(self, name)) != self.num_layers:
                raise ConfigError(f"{name} must name every layer")
        if any(self.layer_is_local) and (self.sliding_window is None or self.local_rope_base is None):
            raise ConfigError("local layers need sliding_window and local_rope_base")
        if self.norms not in NORM_PLACEMENTS or self.qk_norm not in QK_NORMS:
            raise ConfigError(f"norms must be one of {NORM_PLACEMENTS} and qk_norm one of {QK_NORMS}")
        if self.norm_type not in ("rms", "layer") or (self.norms == "shared" and not self.parallel_block):
            raise ConfigError(f"norm_type {self.norm_type!r} / norms {self.norms!r} is not implemented")
        if self.activation not in ("silu", "gelu_tanh", "gelu"):
            raise ConfigError(f"activation {self.activation!r} is not implemented")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ConfigError(f"{self.experts_per_token} experts per token of {self.num_experts}")

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def local_layers(self) -> tuple[bool, ...]:
        return self.layer_is_local or (False,) * self.num_layers

    @property
    def rope_layers(self) -> tuple[bool, ...]:
        return self.layer_uses_rope or (True,) * self.num_layers

    def flops_per_token(self, mean_context: float) -> float:
        """Forward FLOPs of one token: 2 x the matmul parameters (output head included) + the attention
        scores and mixing over `mean_context` keys (4 x layers x heads x head_dim x context)."""
        mlp = (3 * self.hidden_size * self.expert_mlp_size * self.experts_per_token + self.hidden_size * self.num_experts
               if self.num_experts else 3 * self.hidden_size * self.mlp_size)  # routed: the chosen experts' share
        per_layer = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim + \
            self.num_heads * self.head_dim * self.hidden_size + mlp
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
_GGUF_ARCHITECTURES = ("llama", "gemma3")
GEMMA_TRAITS = dict(activation="gelu_tanh", norm_offset=1.0)  # GeGLU, RMSNorm by (1 + w)


def config_from_gguf(meta: Mapping[str, Any], vocab_size: int, source: str = "GGUF") -> DecoderConfig:
    arch = meta.get("general.architecture")
    if arch not in _GGUF_ARCHITECTURES:
        raise ConfigError(f"{source}: GGUF architecture {arch!r} is not supported (supported: {_GGUF_ARCHITECTURES}; "
                          "the other families load from HF directories)")
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
            **GEMMA_TRAITS, embed_scale=math.sqrt(hidden), qk_norm="head", norms="pre+post",
        )
    return DecoderConfig(**common)



# --------------------------------------------------------------------------------------------------
# HF config.json
# --------------------------------------------------------------------------------------------------

# Keys that describe bookkeeping, tokens or training, not the forward pass.
_INERT_HF_KEYS = {
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "bos_token_id",
    "eos_token_id", "pad_token_id", "unk_token_id", "initializer_range", "use_cache", "attention_dropout",
    "pretraining_tp", "_name_or_path", "_model_name_or_path", "tokenizer_class", "is_llama_config",
    "max_window_layers", "quantization_config", "resid_pdrop", "embd_pdrop", "dropout",
    "use_bidirectional_attention", "_sliding_window_pattern", "sliding_window_pattern", "cache_implementation",
    "id2label", "label2id", "output_attentions", "output_hidden_states", "return_dict", "problem_type",
    "chunk_size_feed_forward",  # a memory setting of torch's feed-forward; results do not change
    "tie_encoder_decoder", "torchscript", "output_scores", "return_dict_in_generate",
    "router_aux_loss_coef", "output_router_logits",  # the MoE load-balancing loss of training
    "hidden_dropout",
}


@dataclass(frozen=True)
class HFFamily:
    """How one HF `model_type` reads into a `DecoderConfig`: what the family fixes, and readers of its own keys.
    Everything else is read the common (Llama) way by `config_from_hf`."""
    arch: str  # the family (ARCHITECTURES)
    traits: Mapping[str, Any] = field(default_factory=dict)  # DecoderConfig fields the family fixes
    hidden_act: str = "silu"  # the activation it implements (config key hidden_act / hidden_activation)
    # how a sliding_window applies: "" not at all; "all" to every layer; "asked" only with use_sliding_window,
    # on the layers layer_types names; "alternating" local and global layers (Gemma: `global_every`)
    window: str = ""
    global_every: int = 0  # Gemma: every n-th layer attends globally when layer_types does not say
    softcaps: bool = False  # Gemma 2's attention and final logit soft-caps
    own_keys: Callable | None = None  # (take, n_layers, source) -> more DecoderConfig fields
    common_spelling: Callable | None = None  # (cfg, source) -> (cfg in the common spelling, more fields)

    @property
    def gemma(self) -> bool:
        return self.window == "alternating"


def config_from_hf(cfg: Mapping[str, Any], source: str = "config.json") -> DecoderConfig:
    """A config from an HF config.json, in transformers 4's spelling (rope_scaling, rope_theta) or 5's
    (rope_parameters). Every key is either used, known to be inert, or raises naming it."""
    cfg = dict(cfg)
    model_type = cfg.get("model_type")
    if model_type not in HF_FAMILIES:
        raise ConfigError(f"{source}: model_type {model_type!r} is not supported ({sorted(HF_FAMILIES)})")
    family = HF_FAMILIES[model_type]
    arch, gemma = family.arch, family.gemma
    spelled: dict = {}
    if family.common_spelling is not None:
        cfg, spelled = family.common_spelling(cfg, source)
    taken: set[str] = set()

    def take(key: str, default: Any = ...) -> Any:
        taken.add(key)
        if key in cfg and cfg[key] is not None:
            return cfg[key]
        if default is ...:
            raise ConfigError(f"{source}: {key} is missing")
        return default

    def must_be(key: str, allowed: tuple) -> Any:
        value = take(key, None)
        if value not in allowed:
            raise ConfigError(f"{source}: {key}={value!r} is not implemented (only {allowed})")
        return value

    hidden, heads = int(take("hidden_size")), int(take("num_attention_heads"))
    head_dim = int(take("head_dim", hidden // heads))
    vocab, kv_heads = int(take("vocab_size")), int(take("num_key_value_heads", heads))
    n_layers = int(take("num_hidden_layers"))
    rope_base, local_base, llama3 = _hf_rope(take, arch, source)
    must_be("hidden_act", (None, family.hidden_act))
    must_be("hidden_activation", (None, family.hidden_act) if gemma else (None,))
    must_be("mlp_bias", (None, False))
    attn_cap, final_cap = take("attn_logit_softcapping", None), take("final_logit_softcapping", None)
    if not family.softcaps:
        must_be("attn_logit_softcapping", (None,))
        must_be("final_logit_softcapping", (None,))
    if not family.traits.get("qkv_bias"):
        must_be("attention_bias", (None, False))
    must_be("partial_rotary_factor", (None, 1.0, 1))
    must_be("is_encoder_decoder", (None, False))

    types = take("layer_types", None)
    window = take("sliding_window", None)
    use_window = bool(take("use_sliding_window", False))
    local: tuple[bool, ...] = ()
    if family.window == "alternating":
        every = family.global_every
        types = types or ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n_layers)]
        local = tuple(t == "sliding_attention" for t in types)
    elif family.window == "asked" and use_window and window is not None:
        local = tuple(t == "sliding_attention" for t in types) if types else (True,) * n_layers
    elif family.window == "all" and window is not None:
        local = (True,) * n_layers
    if types is not None and len(types) != n_layers or set(types or ()) - {"sliding_attention", "full_attention"}:
        raise ConfigError(f"{source}: layer_types={types!r} is not implemented")
    if any(local):
        local_base = local_base if arch == "gemma3" else rope_base
    config = DecoderConfig(
        architecture=arch, vocab_size=vocab, hidden_size=hidden, num_layers=n_layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        mlp_size=int(take("intermediate_size")), rms_eps=float(take("rms_norm_eps")), rope_base=rope_base,
        max_context=int(take("max_position_embeddings")), tie_embeddings=bool(take("tie_word_embeddings", True)),
        sliding_window=int(window) if any(local) else None,
        local_rope_base=local_base if any(local) else None, layer_is_local=local if any(local) else (),
        query_pre_attn_scalar=float(take("query_pre_attn_scalar", head_dim)) if gemma else None,
        embed_scale=math.sqrt(hidden) if gemma else 1.0, attn_softcap=attn_cap, final_softcap=final_cap,
        rope_llama3=llama3, **family.traits, **spelled,
        **(family.own_keys(take, n_layers, source) if family.own_keys else {}),
    )
    unknown = sorted(set(cfg) - taken - _INERT_HF_KEYS)
    if unknown:
        raise ConfigError(f"{source}: attributes {unknown} are not implemented")
    return config


def _hf_rope(take, arch: str, source: str) -> tuple[float, float, tuple | None]:
    """(global base, local base, Llama 3 scaling or None), from transformers 4's `rope_theta` +
    `rope_scaling` or 5's `rope_parameters` (per layer type for Gemma 3). Other scalings raise."""
    params = take("rope_parameters", None)
    scaling = take("rope_scaling", None)
    base = float(take("rope_theta", 10_000.0))
    local = float(take("rope_local_base_freq", _GEMMA3_LOCAL_ROPE_BASE if arch == "gemma3" else base))
    if params is not None and "rope_type" in params:  # one setting for the model; local layers take its base
        per_type = {"full_attention": params}
    else:
        per_type = dict(params or {})
    if scaling is not None:  # transformers 4: one scaling for the whole model
        per_type = {"full_attention": {**scaling, "rope_theta": base}, **(
            {"sliding_attention": per_type["sliding_attention"]} if "sliding_attention" in per_type else {})}
    llama3 = None
    for kind, p in per_type.items():
        rope_type = p.get("rope_type", p.get("type", "default"))
        keys = set(p) - {"rope_type", "type", "rope_theta"}
        if rope_type == "llama3" and kind == "full_attention" and keys == {
                "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}:
            llama3 = (float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"]),
                      int(p["original_max_position_embeddings"]))
        elif rope_type != "default" or keys - {"partial_rotary_factor"} or p.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConfigError(f"{source}: rope_scaling / rope_parameters ({kind}) {p!r} is not implemented")
    base = float(per_type.get("full_attention", {}).get("rope_theta", base))
    local = float(per_type.get("sliding_attention", {}).get("rope_theta", local))
    return base, local, llama3


def _falcon_as_common(cfg: dict, source: str) -> tuple[dict, dict]:
    """Falcon's config in the common spelling, and where its norms sit (a DecoderConfig field).
    Falcon-7B: multi-query, attention and MLP side by side on one LayerNorm; Falcon-40B (the "new decoder
    architecture"): grouped KV heads, a LayerNorm each. Both: LayerNorm with bias, a plain GELU MLP."""
    cfg = dict(cfg)
    if cfg.pop("alibi", False):
        raise ConfigError(f"{source}: alibi=True is not implemented (Falcon-RW); rotary Falcon only")
    if cfg.pop("bias", False):
        raise ConfigError(f"{source}: bias=True is not implemented")
    new_arch = bool(cfg.pop("new_decoder_architecture", False))
    multi_query = bool(cfg.pop("multi_query", True))
    parallel = bool(cfg.pop("parallel_attn", True))
    lns = cfg.pop("num_ln_in_parallel_attn", None) or (2 if new_arch else 1)
    heads = int(cfg["num_attention_heads"])
    kv = cfg.pop("num_kv_heads", None)
    if not new_arch and not multi_query:
        raise ConfigError(f"{source}: multi_query=False without new_decoder_architecture (per-head interleaved "
                          "q/k/v) is not implemented")
    if not parallel:
        raise ConfigError(f"{source}: parallel_attn=False is not implemented")
    act = cfg.pop("activation", "gelu")
    if act != "gelu":
        raise ConfigError(f"{source}: activation={act!r} is not implemented")
    hidden = int(cfg["hidden_size"])
    cfg.update(num_key_value_heads=int(kv or heads) if new_arch else 1, rms_norm_eps=cfg.pop("layer_norm_epsilon", 1e-5),
               intermediate_size=cfg.pop("ffn_hidden_size", None) or 4 * hidden)
    return cfg, {"norms": "pre" if lns == 2 else "shared"}


def _experts(take, n_layers: int, source: str) -> dict:
    """Qwen3-MoE: every layer routed (the published models); mixed stacks would need two scans."""
    if take("decoder_sparse_step", None) not in (None, 1):
        raise ConfigError(f"{source}: decoder_sparse_step={take('decoder_sparse_step', None)!r} is not implemented "
                          "(only (None, 1))")
    if take("mlp_only_layers", None):
        raise ConfigError(f"{source}: mlp_only_layers={take('mlp_only_layers', None)!r} is not implemented")
    return dict(num_experts=int(take("num_experts", None) or take("num_local_experts")),
                experts_per_token=int(take("num_experts_per_tok")),
                expert_mlp_size=int(take("moe_intermediate_size")), norm_topk=bool(take("norm_topk_prob", False)))


def _nope_layers(take, n_layers: int, source: str) -> dict:
    """SmolLM3: layers without RoPE, from no_rope_layers or every `no_rope_layer_interval`-th."""
    interval = int(take("no_rope_layer_interval", 4))
    flags = take("no_rope_layers", None) or [int((i + 1) % interval != 0) for i in range(n_layers)]
    uses_rope = tuple(bool(f) for f in flags[:n_layers])
    return {"layer_uses_rope": uses_rope if not all(uses_rope) else ()}


def _ignored(*keys: str) -> Callable:
    """Keys the family's config carries that change nothing here (Qwen2's attention_bias: it always has
    q/k/v biases; Phi-3's original_max_position_embeddings: only long-context RoPE reads it, and that raises)."""
    def read(take, n_layers: int, source: str) -> dict:
        for key in keys:
            take(key, None)
        return {}
    return read


_GEMMA = {**GEMMA_TRAITS, "norms": "pre+post"}
# HF model_type -> family: each family's differences, one row each
HF_FAMILIES = {
    "llama": HFFamily("llama"),
    "mistral": HFFamily("mistral", window="all"),
    "qwen2": HFFamily("qwen2", {"qkv_bias": True}, window="asked", own_keys=_ignored("attention_bias")),
    "qwen3": HFFamily("qwen3", {"qk_norm": "head"}, window="asked"),
    "qwen3_moe": HFFamily("qwen3_moe", {"qk_norm": "head"}, window="asked", own_keys=_experts),
    "olmo2": HFFamily("olmo2", {"norms": "post", "qk_norm": "projection"}),
    "gemma2": HFFamily("gemma2", _GEMMA, "gelu_pytorch_tanh", "alternating", global_every=2, softcaps=True),
    "gemma3_text": HFFamily("gemma3", {**_GEMMA, "qk_norm": "head"}, "gelu_pytorch_tanh", "alternating",
                            global_every=_GEMMA3_GLOBAL_EVERY),
    "phi3": HFFamily("phi3", window="all", own_keys=_ignored("original_max_position_embeddings")),
    "smollm3": HFFamily("smollm3", window="asked", own_keys=_nope_layers),
    "falcon": HFFamily("falcon", dict(norm_type="layer", parallel_block=True, gated_mlp=False, activation="gelu"),
                       common_spelling=_falcon_as_common),
}
