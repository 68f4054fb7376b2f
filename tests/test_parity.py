"""Parity with transformers + torch on the same GGUF weights, float32, on a prompt of several hundred
tokens (past Gemma 3's 512-token sliding window, so local layers and both RoPE bases are exercised)."""

import pytest
import jax
import jax.numpy as jnp
import numpy as np

from conftest import F32_NATS, PASSAGE, reference_logprobs, scorer_for

N_TOKENS = 640


@pytest.mark.slow
def test_token_logprobs_and_greedy_tokens_match_transformers(model_name):
    from dcsjax.engine.packing import bucket_for
    from dcsjax.nn.attention import takes_blockwise
    from dcsjax.engine.scorer import Scorer

    scorer = scorer_for(model_name)
    ids = scorer.encode([PASSAGE])[0][:N_TOKENS]
    assert len(ids) == N_TOKENS
    # One row: the default batch of the 1024-token bucket has 16 rows, 15 of them padding for one text.
    one_row = Scorer(scorer.model, scorer.tokenizer, scorer.document_start_id, batch_size=1)
    ours = one_row.logprobs_of_ids([ids])[0]
    seq = [scorer.document_start_id, *ids]
    ref, ref_logits = reference_logprobs(model_name, seq)

    assert ours.dtype == np.float32 and ours.shape == (N_TOKENS,)
    gap = np.abs(ours - ref).max()
    print(f"{model_name}: {N_TOKENS} tokens, max |log p - reference| = {gap:.2e}")
    assert gap < F32_NATS

    # The scorer ran that 1024-token row blockwise (2 x 2 tiles of 512, one skipped by causality; Gemma's
    # local layers need the tile below the diagonal for the first 128 queries past the window); the dense
    # path on the same row agrees with it and with the reference
    assert bucket_for(len(seq), one_row.buckets) == 1024 and takes_blockwise(1024)
    row = np.zeros((1, 1024), np.int32)
    row[0, :len(seq)] = seq
    segments = (np.arange(1024) < len(seq)).astype(np.int32)[None]
    positions = np.arange(1024, dtype=np.int32)[None]
    paths = {blockwise: np.asarray(scorer.model(jnp.asarray(row), jnp.asarray(positions), jnp.asarray(segments),
                                                blockwise=blockwise)[0, :len(seq)]) for blockwise in (True, False)}
    path_logprobs = {}
    for blockwise, hidden in paths.items():
        logits = scorer.model.logits(jnp.asarray(hidden[:-1]))  # the decoder's own head, float32 [T, V]
        lp = jax.nn.log_softmax(logits, axis=-1)[np.arange(N_TOKENS), np.asarray(ids)]  # jax's, not the engine's kernel
        path_logprobs[blockwise] = np.asarray(lp, np.float64)
        gap = np.abs(path_logprobs[blockwise] - ref).max()
        print(f"{model_name}: {'blockwise' if blockwise else 'dense'} path on a 1024-token row: {gap:.2e} from the reference")
        assert gap < F32_NATS
    between = np.abs(path_logprobs[True] - path_logprobs[False]).max()
    print(f"{model_name}: blockwise - dense attention, whole model: {between:.2e} nats at most")
    # float32 rounding of two orders of summation, carried through every layer (the attention outputs
    # themselves agree within 1e-6: tests/test_attention.py); the bar is the one against the reference
    assert between < 1e-4

    # Greedy next tokens at every position, from full logits of the same forward pass.
    tokens = jnp.asarray([seq])
    hidden = scorer.model(tokens, jnp.arange(len(seq))[None], jnp.ones_like(tokens))
    logits = np.asarray(scorer.model.logits(hidden[0]))
    assert (logits.argmax(-1) == ref_logits.argmax(-1)).all()


def test_document_start_conditioning_matters_as_documented():
    """SmolLM2 scores the sentence at -17.3 after <|endoftext|>, -31.8 after <|im_start|> (DESIGN.md)."""
    from dcsjax.engine.scorer import Scorer

    smol = scorer_for("smollm2-135m-instruct")
    sentence = "The capital of France is Paris."
    assert smol.tokenizer.convert_ids_to_tokens(smol.document_start_id) == "<|endoftext|>"
    after_eot = smol.score([sentence])[0]
    im_start = smol.tokenizer.convert_tokens_to_ids("<|im_start|>")
    after_im_start = Scorer(smol.model, smol.tokenizer, im_start).score([sentence])[0]
    for start, ours in [(smol.document_start_id, after_eot), (im_start, after_im_start)]:
        ref, _ = reference_logprobs("smollm2-135m-instruct", [start, *smol.encode([sentence])[0]])
        assert abs(ours - ref.sum()) < F32_NATS
    assert abs(after_eot - -17.3) < 0.05 and abs(after_im_start - -31.8) < 0.06


def test_gemma_conditions_on_its_bos(gemma3):
    assert gemma3.document_start_id == gemma3.tokenizer.bos_token_id == 2


@pytest.mark.slow
def test_the_cached_reference_is_transformers_own_gguf_load():
    """The reference the tests read (conftest.reference_dir, a safetensors copy written once) holds exactly
    the tensors transformers' GGUF loader makes, tied the same way, with the same generation settings
    (SmolLM2; the copy is written by the same code for every model)."""
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import reference_for
    from dcsjax.checkpoints.fetch import fetch_model

    name = "smollm2-135m-instruct"
    path = fetch_model(name)
    direct = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    cached = reference_for(name)
    a, b = cached.state_dict(), direct.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert cached.lm_head.weight.data_ptr() == cached.model.embed_tokens.weight.data_ptr()  # tied, as direct is
    assert cached.config.to_diff_dict() | {"quantization_config": None} == direct.config.to_diff_dict() | {"quantization_config": None}
    assert cached.generation_config.to_diff_dict() == direct.generation_config.to_diff_dict()
