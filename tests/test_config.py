"""Configs from GGUF metadata and from transformers' config of the same file agree with the facts read
off the files; attributes the decoder does not implement raise instead of being ignored."""

import pytest

from conftest import reference_dir, scorer_for
from dcsjax.checkpoints.assemble import param_count
from dcsjax.errors import ConfigError
from dcsjax.nn.config import config_from_gguf, config_from_hf

FACTS = {
    "smollm2-135m-instruct": dict(architecture="llama", num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3,
                                  head_dim=64, mlp_size=1536, vocab_size=49152, rope_base=1e5,
                                  tie_embeddings=True, sliding_window=None),
    "gemma3-270m": dict(architecture="gemma3", num_layers=18, hidden_size=640, num_heads=4, num_kv_heads=1,
                        head_dim=256, mlp_size=2048, vocab_size=262144, rope_base=1e6, local_rope_base=1e4,
                        tie_embeddings=True, sliding_window=512),
}


def hf_config_dict(name: str) -> dict:
    """transformers' config of the GGUF file, from the tests' kept copy of its GGUF load (conftest.reference_dir:
    reading the file's metadata through transformers takes about 15 s for Gemma 3)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(reference_dir(name)).to_dict()


@pytest.mark.slow
def test_gguf_config_has_the_facts_and_matches_transformers_config(model_name):
    scorer = scorer_for(model_name)
    config = scorer.config
    for key, value in FACTS[model_name].items():
        assert getattr(config, key) == value, key
    if config.architecture == "gemma3":  # a full-attention layer every sixth
        assert [i for i, local in enumerate(config.layer_is_local) if not local] == [5, 11, 17]
    assert config_from_hf(hf_config_dict(model_name)) == config
    assert param_count(scorer.model) == scorer.card.parameters


@pytest.mark.parametrize("change,match", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope_parameters"),
    ({"some_new_attention_trick": True}, "some_new_attention_trick"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"model_type": "gpt_neox"}, "model_type"),
])
def test_unimplemented_hf_attributes_raise(change, match):
    cfg = hf_config_dict("smollm2-135m-instruct") | change
    with pytest.raises(ConfigError, match=match):
        config_from_hf(cfg)


def test_unimplemented_gguf_metadata_raises():
    meta = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
            "llama.feed_forward_length": 128, "llama.attention.head_count": 4,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.context_length": 256}
    assert config_from_gguf(meta, vocab_size=100).num_layers == 2
    with pytest.raises(ConfigError, match="llama.rope.scaling.type"):
        config_from_gguf(meta | {"llama.rope.scaling.type": "linear"}, vocab_size=100)
    with pytest.raises(ConfigError, match="not supported"):
        config_from_gguf(meta | {"general.architecture": "falcon"}, vocab_size=100)
