"""Published full-size configs (their hub config.json, as the hub serves them: transformers 4's spelling)
give their published parameter counts through `jax.eval_shape` (no memory), and on an abstract 8-device
mesh each device holds an eighth of the parameters: vocabulary, MLP and attention split, nothing large
replicated (Qwen2.5-7B's 28 heads and Phi-4's 10 KV heads split over their head size)."""

import math

import pytest
from flax import nnx

from dcsjax.nn.config import config_from_hf
from dcsjax.nn.decoder import Decoder
from dcsjax.nn.sharding import partition_spec

PUBLISHED = {  # name: (config.json as published, parameters as published)
    "Llama-3.1-8B": ({
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "head_dim": 128,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}}, 8_030_261_248),
    "Qwen2.5-7B": ({
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28}, 7_615_616_512),
    "Gemma-2-9b": ({
        "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "attention_bias": False}, 9_241_705_984),
    "OLMo-2-1124-7B": ({
        "model_type": "olmo2", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 100352, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 500000, "tie_word_embeddings": False, "hidden_act": "silu",
        "attention_bias": False}, 7_298_617_344),
    "Qwen3-30B-A3B": ({
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "hidden_act": "silu", "attention_bias": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001, "output_router_logits": False, "sliding_window": None,
        "use_sliding_window": False, "max_window_layers": 48}, 30_532_122_624),
    "Falcon-7B": ({
        "model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
        "vocab_size": 65024, "layer_norm_epsilon": 1e-5, "multi_query": True, "parallel_attn": True, "bias": False,
        "alibi": False, "new_decoder_architecture": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "bos_token_id": 11, "eos_token_id": 11, "max_position_embeddings": 2048, "rope_theta": 10000.0},
        6_921_720_704),
    "Phi-4": ({
        "model_type": "phi3", "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
        "num_attention_heads": 40, "num_key_value_heads": 10, "vocab_size": 100352, "max_position_embeddings": 16384,
        "original_max_position_embeddings": 16384, "rms_norm_eps": 1e-5, "rope_theta": 250000,
        "tie_word_embeddings": False, "hidden_act": "silu", "sliding_window": None, "resid_pdrop": 0.0,
        "embd_pdrop": 0.0, "attention_dropout": 0.0}, 14_659_507_200),
}


class AbstractMesh:  # partition_spec reads only the axis sizes
    shape = {"data": 1, "model": 8}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_give_published_sizes_and_shard_eight_ways(name):
    cfg, published = PUBLISHED[name]
    config = config_from_hf(cfg, source=name)
    model = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    leaves = [leaf for leaf in nnx.to_flat_state(params)]
    total = sum(math.prod(v.shape) for _, v in leaves)
    assert abs(total - published) / published < 0.01, (name, total, published)
    per_device, replicated = 0, []
    for path, v in leaves:
        spec = partition_spec(v.axes, v.shape, AbstractMesh())
        split = math.prod(8 if s == "model" else 1 for s in spec)
        per_device += math.prod(v.shape) // split
        if split == 1 and math.prod(v.shape) > 1e6:
            replicated.append("/".join(map(str, path)))
    fraction = per_device / total
    print(f"{name}: {total:,} parameters (published {published:,}); per device on 8: {fraction:.3f} of them, "
          f"{per_device * 2 / 2**30:.2f} GiB in bfloat16; replicated: {replicated or 'nothing large'}")
    assert replicated == [] and fraction == pytest.approx(1 / 8, rel=0.001)
