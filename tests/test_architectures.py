"""Paper 002's architecture families, each from an HF directory that transformers itself wrote.

No weights of these families are reachable from this machine, so each is a tiny random-weight model made by
`AutoModelForCausalLM.from_config` (weights drawn larger than the init so that errors show), saved with
`save_pretrained`, loaded by `dcsjax.load(dir)` and compared per token with transformers on the same
weights: float32 log-probs within 1e-4 on a text several times longer than any sliding window. Each
directory's config is read in transformers 5's spelling (`rope_parameters`, as saved) and in transformers 4's
(`rope_theta` + `rope_scaling`, what the published hub configs say), into the same config. SmolLM2 and Gemma 3 keep their
real-weight parity tests (`test_parity.py`).
"""

import json
import shutil

import numpy as np
import pytest

import dcsjax
from conftest import PASSAGE, UNKNOWNS_CARD, reference_tokenizer
from dcsjax.errors import ConfigError

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False)
WINDOW = 32  # tokens; the test text is several hundred
FALCON_TINY = dict(hidden_size=64, ffn_hidden_size=128, num_hidden_layers=6, num_attention_heads=4,
                   max_position_embeddings=2048, layer_norm_epsilon=1e-5, tie_word_embeddings=False)

FAMILIES = {
    "llama3": ("LlamaConfig", dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", dict(sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict()),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         norm_topk_prob=True)),
    "olmo2": ("Olmo2Config", dict()),
    "gemma2": ("Gemma2Config", dict(sliding_window=WINDOW, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                    query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh")),
    "gemma3": ("Gemma3TextConfig", dict(sliding_window=WINDOW, query_pre_attn_scalar=24)),
    "phi3": ("Phi3Config", dict(sliding_window=None, pad_token_id=0)),
    "smollm3": ("SmolLM3Config", dict(no_rope_layer_interval=3, pad_token_id=0)),
    "falcon7b": ("FalconConfig", dict(multi_query=True, new_decoder_architecture=False, parallel_attn=True)),
    "falcon40b": ("FalconConfig", dict(new_decoder_architecture=True, num_kv_heads=2, parallel_attn=True)),
}


def write_tiny(family: str, directory, dtype=None):
    """A random-weight checkpoint of `family`, written by transformers, with SmolLM2's tokenizer."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    class_name, extra = FAMILIES[family]
    base = FALCON_TINY if class_name == "FalconConfig" else TINY
    config = getattr(transformers, class_name)(**{**base, **extra, "vocab_size": 49152})
    torch.manual_seed(sum(map(ord, family)))
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name or "ln_" in name) and name.endswith("weight"):  # norms near 1 (Gemma's near 0:
                # it scales by 1 + w), each entry different; LayerNorm biases fall to the 1-D case below
                p.copy_((0.0 if "gemma" in family else 1.0) + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2 if p.ndim > 1 else 0.1)
    model.to(dtype or torch.float32).save_pretrained(directory)
    reference_tokenizer("smollm2-135m-instruct").save_pretrained(directory)  # transformers' GGUF tokenizer
    if dtype is not None:  # the reference reads the saved weights back (RoPE tables are not in the file)
        return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    return model.eval()


def v4_spelling(directory) -> None:
    """Rewrite config.json as transformers 4 wrote it: top-level rope_theta and rope_scaling."""
    path = directory / "config.json"
    cfg = json.loads(path.read_text())
    params = cfg.pop("rope_parameters", None)
    if params is not None:
        if "full_attention" in params:  # per layer type (Gemma 3)
            cfg["rope_local_base_freq"] = params["sliding_attention"]["rope_theta"]
            params = params["full_attention"]
        cfg["rope_theta"] = params["rope_theta"]
        if params.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    cfg.pop("layer_types", None)  # transformers 4 configs do not carry it
    path.write_text(json.dumps(cfg))


def reference_logprobs(model, ids: list[int]) -> np.ndarray:
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(1, x[0, 1:, None])[:, 0].numpy()


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_matches_transformers_in_both_config_spellings(family, tmp_path):
    from dcsjax.checkpoints.hf_dir import hf_config
    from dcsjax.nn.config import config_from_hf

    model = write_tiny(family, tmp_path / "v5")
    scorer = dcsjax.load(tmp_path / "v5", document_start="<|endoftext|>")
    assert scorer.config.architecture == {"llama3": "llama", "falcon7b": "falcon", "falcon40b": "falcon"}.get(family, family)
    text = PASSAGE[:1500]
    (ids,) = scorer.encode([text])
    assert len(ids) > 8 * WINDOW
    ours = scorer.token_logprobs([text])[0]
    want = reference_logprobs(model, [scorer.document_start_id, *ids])
    diff = np.abs(ours - want).max()
    print(f"{family}: {len(ids)} tokens, max |difference| {diff:.2e} nats, mean log-prob {want.mean():.2f}")
    assert diff < 1e-4, (family, diff)
    # the same directory in transformers 4's spelling reads into the very same config (same tensors, so
    # the same scores)
    shutil.copytree(tmp_path / "v5", tmp_path / "v4")
    v4_spelling(tmp_path / "v4")
    assert "rope_parameters" not in hf_config(tmp_path / "v4")
    assert config_from_hf(hf_config(tmp_path / "v4")) == scorer.config


@pytest.mark.slow
def test_traits_read_off_the_configs(tmp_path):
    """Each family's traits land in the named fields, not in a family switch."""
    configs = {}
    for family in ("gemma2", "olmo2", "smollm3", "llama3", "phi3", "falcon7b", "falcon40b"):
        write_tiny(family, tmp_path / family)
        configs[family] = dcsjax.load(tmp_path / family, document_start="<|endoftext|>").config
    g2 = configs["gemma2"]
    assert (g2.attn_softcap, g2.final_softcap, g2.norms, g2.qk_norm) == (50.0, 30.0, "pre+post", None)
    assert g2.layer_is_local == (True, False) * 3 and g2.sliding_window == WINDOW and g2.query_pre_attn_scalar == 24
    assert (configs["olmo2"].norms, configs["olmo2"].qk_norm) == ("post", "projection")
    assert configs["smollm3"].rope_layers == (True, True, False, True, True, False)
    assert configs["llama3"].rope_llama3 == (8.0, 1.0, 4.0, 64)
    assert configs["phi3"].architecture == "phi3" and not configs["phi3"].qkv_bias
    f7, f40 = configs["falcon7b"], configs["falcon40b"]
    assert (f7.norm_type, f7.norms, f7.parallel_block, f7.gated_mlp, f7.num_kv_heads) == ("layer", "shared", True, False, 1)
    assert (f40.norms, f40.num_kv_heads, f40.activation) == ("pre", 2, "gelu")
    write_tiny("qwen3_moe", tmp_path / "moe")
    moe = dcsjax.load(tmp_path / "moe", document_start="<|endoftext|>")
    assert (moe.config.num_experts, moe.config.experts_per_token, moe.config.expert_mlp_size, moe.config.norm_topk) == \
        (4, 2, 32, True)
    assert moe.model.layers.expert_gate[...].shape == (6, 4, 64, 32)


def test_routed_experts_equal_dense_experts():
    """The MoE's TPU path (`routed_experts`: the (token, expert) pairs sorted by expert, grouped matmuls) on one
    device against every expert computed and the unchosen weighted 0 (`dense_experts`, checked against
    transformers in test_family_matches_transformers_in_both_config_spellings), on random weights: the same
    routing arithmetic, to float32 rounding. Its mesh form: test_sharding.py."""
    from mesh_check import random_moe

    from dcsjax.nn.decoder import dense_experts, routed_experts

    config, weights, x = random_moe()
    routed, dense = routed_experts(config, weights, x), dense_experts(config, weights, x)
    assert float(np.abs(np.asarray(routed) - np.asarray(dense)).max()) < 1e-5
    assert float(np.abs(np.asarray(dense)).mean()) > 0.1  # the experts' output is not trivially small


@pytest.mark.slow
def test_bfloat16_checkpoint_loads(tmp_path):
    import torch

    model = write_tiny("qwen3", tmp_path, dtype=torch.bfloat16)  # the reference: the bf16 weights, in float32
    scorer = dcsjax.load(tmp_path, document_start="<|endoftext|>")
    text = PASSAGE[:600]
    (ids,) = scorer.encode([text])
    np.testing.assert_allclose(scorer.token_logprobs([text])[0],
                               reference_logprobs(model, [scorer.document_start_id, *ids]), atol=1e-4)
    bf16 = dcsjax.load(tmp_path, dtype="bfloat16", document_start="<|endoftext|>")
    assert bf16.model.embed[...].dtype == np.dtype("bfloat16")
    assert np.abs(bf16.token_logprobs([text])[0] - scorer.token_logprobs([text])[0]).mean() < 0.1


@pytest.mark.parametrize("change, match", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
    ({"attention_bias": True}, "attention_bias"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
])
def test_what_the_decoder_does_not_implement_raises_naming_it(tmp_path, change, match):
    write_tiny("qwen3", tmp_path)
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    if "rope_scaling" in change:
        cfg.pop("rope_parameters")
    path.write_text(json.dumps(cfg | change))
    with pytest.raises(ConfigError, match=match):
        dcsjax.load(tmp_path, document_start="<|endoftext|>")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    for family in ("qwen3", "gemma2", "qwen3_moe"):
        write_tiny(family, root / family)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "gemma2", "qwen3_moe"])
def test_invariance_bit_identical_across_batching_and_packing(tiny_dirs, family):
    """Bit for bit, the MoE's routing included (routed in fixed-shape chunks of tokens: routed over the whole
    batch at once, its scores moved by up to 2.4e-5 nats with the batch shape)."""
    from test_invariance import brute_force_scores, check

    base = dcsjax.load(tiny_dirs / family, document_start="<|endoftext|>")
    reference = brute_force_scores(base)
    for batch_size, pack, buckets in [(1, False, (64, 128)), (7, True, (64, 128)), (32, True, (128,))]:
        check(family, batch_size, pack, buckets, base=base, reference=reference)


@pytest.mark.slow
def test_mesh_scores_equal_one_device(tiny_dirs):
    """Qwen3 (q/k norms per head), Gemma 2 (soft-caps, local layers) and Qwen3-MoE (experts split over the
    model axis) on 2x4 and 8x1 meshes of 8 CPU devices."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}
    script = Path(__file__).with_name("mesh_check.py")
    out = subprocess.run([sys.executable, str(script), *(str(tiny_dirs / f) for f in ("qwen3", "gemma2", "qwen3_moe"))],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert len(results) == 3
    for r in results:
        print(json.dumps(r))
        assert r["devices"] == 8
        for mesh in ("2x4", "8x1"):
            assert r[mesh]["max_diff"] < 1e-4, (r["model"], mesh, r[mesh]["max_diff"])
            assert r[mesh]["gathered_vocab_sized"] == []


@pytest.mark.slow
def test_eval_and_report_of_a_model_without_a_card(tiny_dirs, tmp_path):
    """--document-start and --variant say what a card would; the report reads the model's size from the
    records' fingerprints (dcsjax counted the parameters when it loaded the model): no --sizes needed."""
    from dcsjax.analysis.report import load_results
    from dcsjax.checkpoints.assemble import param_count
    from dcsjax.cli import main

    directory = tiny_dirs / "qwen3"
    assert main(["eval", "--model", str(directory), "--tasks", UNKNOWNS_CARD, "--protocols", "qa-ppl,apx",
                 "--limit", "3", "--output", str(tmp_path), "--document-start", "<|endoftext|>",
                 "--variant", "base"]) == 0
    models = load_results([tmp_path])
    expected = param_count(dcsjax.load(directory, document_start="<|endoftext|>").model)
    assert models["qwen3"].parameters == expected and models["qwen3"].variant == "base"
    with pytest.raises(ConfigError, match="variant must be 'base' or 'instruct'"):
        dcsjax.load(directory, document_start="<|endoftext|>", variant="chat")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_moe", "gemma2", "falcon7b"])
def test_greedy_decoding_matches_transformers(family, tmp_path):
    """The KV-cache decode loop (one token a step: the MoE routes a handful of tokens, Gemma 2 soft-caps the
    logits, Falcon runs attention and MLP side by side) gives transformers' greedy tokens."""
    import torch

    from dcsjax.engine.generate import greedy_generate

    model = write_tiny(family, tmp_path)
    scorer = dcsjax.load(tmp_path, document_start="<|endoftext|>")
    prompt = [scorer.document_start_id, *scorer.encode([PASSAGE[:200]])[0]]
    ours = greedy_generate(scorer, [prompt], 12)[0]
    x = torch.tensor([prompt])
    with torch.no_grad():  # the attention mask given: the document start (id 0) is no padding
        theirs = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False)
    theirs = theirs[0, len(prompt):].tolist()
    assert len(ours) >= 4 and ours == theirs[:len(ours)]  # ours stops at the tokenizer's end of text


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_decode_steps_match_transformers_past_the_window(family, tmp_path):
    """Teacher-forced decode steps (a right-padded prefill of two rows, then one token a step through the KV
    cache) give transformers' log-probs within 1e-4 over three sliding windows: the cache slots a step must
    not see (the shorter row's padding, slots outside the window) are masked as the full forward masks them,
    and each step's keys land in the slot the next steps read."""
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    model = write_tiny(family, tmp_path)
    scorer = dcsjax.load(tmp_path, document_start="<|endoftext|>")
    ids = [scorer.document_start_id, *scorer.encode([PASSAGE[:1500]])[0]][:3 * WINDOW + 12]
    lengths = np.array([12, 5])  # prefill lengths; row 1 is the same text, shorter prompt
    steps = len(ids) - lengths[0]
    net = scorer.model
    tokens = np.zeros((2, 16), np.int32)
    for r, n in enumerate(lengths):
        tokens[r, :n] = ids[:n]
    positions = np.broadcast_to(np.arange(16), (2, 16))
    segments = (positions < lengths[:, None]).astype(np.int32)
    _, (cache_k, cache_v) = net(jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segments), return_kv=True)
    pad = ((0, 0), (0, 0), (0, steps + 16), (0, 0), (0, 0))
    cache_k, cache_v = jnp.pad(cache_k, pad), jnp.pad(cache_v, pad)
    graphdef, state = nnx.split(net)

    @jax.jit
    def step(state, token, position, cache_k, cache_v):
        m = nnx.merge(graphdef, state)
        h, cache_k, cache_v = m.decode_step(token, position, cache_k, cache_v)
        return jax.nn.log_softmax(m.logits(h)), cache_k, cache_v

    ours = [[], []]
    for i in range(steps):
        position = lengths + i
        token = np.array([ids[p] for p in position])
        logprobs, cache_k, cache_v = step(state, jnp.asarray(token), jnp.asarray(position), cache_k, cache_v)
        for r in range(2):
            ours[r].append(np.asarray(logprobs[r]))
    with torch.no_grad():
        want = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1).numpy()  # [T, V]
    for r, n in enumerate(lengths):
        got = np.stack(ours[r])  # the distributions after positions n .. n + steps - 1
        diff = np.abs(got - want[n:n + steps]).max()
        print(f"{family} row {r}: {steps} decode steps from a {n}-token prefill, max |difference| {diff:.2e} nats")
        assert diff < 1e-4, (family, r, diff)
