"""Write a `Decoder` as an HF checkpoint directory (config.json, model.safetensors, tokenizer), the format
`dcsjax.load` and transformers both read: how a fine-tuned model leaves dcsjax.

The tensor names and layouts are the inverse of `assemble._layer_table`, so a save followed by a load
gives back the very same parameters. A `dcsjax.json` beside them names the model card the weights came
from (its prompt format: chat template, document start) and whatever the caller wants kept with them
(how it was trained).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from dcsjax.checkpoints.assemble import _layer_table
from dcsjax.nn.config import DecoderConfig

METADATA_FILE = "dcsjax.json"


def hf_config_dict(c: DecoderConfig) -> dict[str, Any]:
    """The config.json transformers (and `config_from_hf`) read back into the same `DecoderConfig`. RoPE
    goes in transformers 5's nested `rope_parameters`: it ignores a top-level `rope_theta`."""
    common = {
        "hidden_size": c.hidden_size, "intermediate_size": c.mlp_size, "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
        "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_eps,
        "max_position_embeddings": c.max_context, "tie_word_embeddings": c.tie_embeddings,
        "attention_bias": c.qkv_bias, "torch_dtype": "float32",
    }
    if c.architecture not in ("llama", "gemma3"):
        from dcsjax.errors import ConfigError

        raise ConfigError(f"writing a {c.architecture} model as an HF directory is not implemented (llama, gemma3)")
    if c.architecture == "gemma3":
        return common | {
            "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
            "hidden_activation": "gelu_pytorch_tanh", "sliding_window": c.sliding_window,
            "query_pre_attn_scalar": int(c.query_pre_attn_scalar),
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": c.rope_base},
                                "sliding_attention": {"rope_type": "default", "rope_theta": c.local_rope_base}},
            "layer_types": ["sliding_attention" if local else "full_attention" for local in c.local_layers],
        }
    return common | {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
                     "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_base}}


def _to_hf_layout(c: DecoderConfig, name: str, value: np.ndarray) -> np.ndarray:
    """One layer's parameter in our layout -> torch's (out, in) layout (inverse of `_layer_table`)."""
    if name in ("q", "k", "v"):  # [D, heads, K] -> [heads * K, D]
        return value.reshape(c.hidden_size, -1).T
    if name == "o":  # [H, K, D] -> [D, H * K]
        return value.reshape(-1, c.hidden_size).T
    if name in ("gate", "up", "down"):
        return value.T
    if name.endswith("bias"):
        return value.reshape(-1)
    return value  # norms


def hf_named_tensors(model) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array) for every parameter of a `Decoder`."""
    c = model.config
    hf_name = {entries[0][0]: hf for hf, entries in _layer_table(c).items() if len(entries) == 1}  # unfused names
    yield "model.embed_tokens.weight", np.asarray(model.embed[...], np.float32)
    yield "model.norm.weight", np.asarray(model.final_norm[...], np.float32)
    if not c.tie_embeddings:
        yield "lm_head.weight", np.asarray(model.unembed[...], np.float32)
    for name, stacked in model.layers.arrays().items():
        stacked = np.asarray(stacked, np.float32)
        for layer in range(c.num_layers):
            yield f"model.layers.{layer}.{hf_name[name]}", np.ascontiguousarray(_to_hf_layout(c, name, stacked[layer]))


def save_hf_dir(model, tokenizer, directory: str | Path, *, card: str | None = None,
                metadata: dict[str, Any] | None = None) -> Path:
    """config.json + model.safetensors + the tokenizer's files + dcsjax.json in `directory`."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = hf_config_dict(model.config)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(tokenizer, key, None) is not None:
            config[key] = getattr(tokenizer, key)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file(dict(hf_named_tensors(model)), str(directory / "model.safetensors"))
    tokenizer.save_pretrained(directory)
    (directory / METADATA_FILE).write_text(json.dumps({"card": card, **(metadata or {})}, indent=2))
    return directory


def saved_card(directory: Path) -> str | None:
    """The model card a saved directory names in its dcsjax.json, if any."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("card")
