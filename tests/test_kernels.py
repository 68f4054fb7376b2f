"""The log-prob kernel against float64 numpy, and its memory bound on Gemma 3's 262k vocabulary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import PASSAGE
from dcsjax.engine.logprobs import reduce_logprobs, token_logprobs
from dcsjax.engine.batches import _batch_logprobs


def float64_logprobs(hidden: np.ndarray, out_embed: np.ndarray, targets: np.ndarray) -> np.ndarray:
    logits = hidden.astype(np.float64) @ out_embed.astype(np.float64).T
    top = logits.max(-1, keepdims=True)
    lse = top[..., 0] + np.log(np.exp(logits - top).sum(-1))
    return np.take_along_axis(logits, targets[..., None], -1)[..., 0] - lse


@pytest.mark.parametrize("vocab,chunk", [(1000, 128), (1000, 1000), (1000, 4096), (777, 100)])
def test_chunked_kernel_matches_float64_on_random_data(vocab, chunk):
    rng = np.random.default_rng(vocab + chunk)
    hidden = rng.standard_normal((3, 5, 16)).astype(np.float32) * 3
    out_embed = rng.standard_normal((vocab, 16)).astype(np.float32)
    targets = rng.integers(0, vocab, (3, 5))
    ours = np.asarray(token_logprobs(jnp.asarray(hidden), jnp.asarray(out_embed), jnp.asarray(targets), chunk))
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, float64_logprobs(hidden, out_embed, targets), atol=2e-5)


def test_long_rows_are_taken_a_block_of_tokens_at_a_time(monkeypatch):
    """Rows longer than TOKEN_BLOCK go through the vocabulary one block of tokens at a time (the memory of a
    32k-token row: tests/test_attention.py); every token's log-prob is the one computed unsplit."""
    from dcsjax.engine import logprobs

    rng = np.random.default_rng(1)
    hidden = rng.standard_normal((2, 64, 16)).astype(np.float32) * 3
    out_embed = rng.standard_normal((500, 16)).astype(np.float32)
    targets = rng.integers(0, 500, (2, 64))
    whole = np.asarray(token_logprobs(jnp.asarray(hidden), jnp.asarray(out_embed), jnp.asarray(targets), 128))
    monkeypatch.setattr(logprobs, "TOKEN_BLOCK", 16)
    split = np.asarray(token_logprobs(jnp.asarray(hidden), jnp.asarray(out_embed), jnp.asarray(targets), 128))
    np.testing.assert_allclose(split, whole, atol=1e-6)
    np.testing.assert_allclose(split, float64_logprobs(hidden, out_embed, targets), atol=2e-5)


def test_kernel_is_float32_from_bfloat16_weights_and_differentiable():
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.standard_normal((2, 3, 8)), jnp.bfloat16)
    out_embed = jnp.asarray(rng.standard_normal((50, 8)), jnp.bfloat16)
    targets = jnp.asarray(rng.integers(0, 50, (2, 3)))
    assert token_logprobs(hidden, out_embed, targets, 16).dtype == jnp.float32
    # gradient against finite differences, in float32
    h32, w32 = hidden.astype(jnp.float32), out_embed.astype(jnp.float32)
    f = lambda h: token_logprobs(h, w32, targets, 16).sum()  # noqa: E731
    grad = jax.grad(f)(h32)
    eps = 1e-2
    bump = jnp.zeros_like(h32).at[1, 2, 5].set(eps)
    numeric = (f(h32 + bump) - f(h32 - bump)) / (2 * eps)
    assert abs(float(grad[1, 2, 5]) - float(numeric)) < 1e-2


def dot_precisions(jaxpr) -> list[tuple]:
    """(precision, its operands' ranks) of every matmul in a traced program, nested programs (scans, checkpoints,
    kernels) too."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((eqn.params["precision"], tuple(v.aval.ndim for v in eqn.invars)))
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    found += dot_precisions(inner)
    return found


@pytest.mark.slow
def test_float32_matmuls_ask_for_full_precision_and_bfloat16_ones_keep_the_default():
    """A GPU's default float32 matmul is TensorFloat-32 (4.8e-4 nats a token off on an H200, where this was found:
    docs/bench/gpu-h200-precision-*); no CPU shows it, so what is checked here is what the traced program asks
    for: every matmul of a float32 decoder (forward, the gradient through a LoRA update, the Pallas kernel) at
    HIGHEST; in a bfloat16 decoder only the float32 sums taken as dots with a vector (the norms' and the
    log-prob kernel's), the layers' matmuls at the default."""
    from dataclasses import replace

    from flax import nnx

    from dcsjax.nn.attention import pallas_attention
    from dcsjax.nn.decoder import Decoder, LowRank, dense
    from dcsjax.engine.load import load_config
    from test_attention import packed_rows

    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    tokens = jnp.ones((2, 16), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(16), (2, 16))
    for dtype in (jnp.float32, jnp.bfloat16):
        config = replace(load_config("llama-3.1-8b")[0], vocab_size=256, hidden_size=32, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=8, mlp_size=64)
        model = Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        forward = jax.make_jaxpr(lambda t: _batch_logprobs(graphdef, 128, None, state, t, positions, jnp.ones_like(t),
                                                           jnp.zeros_like(t), t))(tokens).jaxpr
        found = set(dot_precisions(forward))
        if dtype == jnp.float32:
            assert {p for p, _ in found} == {highest}, found
        else:  # the layers' matmuls (rank-3 and more) at the default; full precision only for sums with a vector
            assert {p for p, ranks in found if ranks[-1] > 1} == {None}, found
            assert {p for p, ranks in found if ranks[-1] == 1} == {highest}, found
    x, w, a, b = (jnp.ones(shape) for shape in [(4, 8), (8, 6), (8, 2), (2, 6)])
    grads = jax.make_jaxpr(jax.grad(lambda a, b: dense("mi,io->mo", x, LowRank(w, a, b)).sum(), (0, 1)))(a, b)
    assert {p for p, _ in dot_precisions(grads.jaxpr)} == {highest}
    parts = packed_rows(128, [[(100, False), (28, True)]])  # a question and its option
    for dtype, expected in ((jnp.float32, highest), (jnp.bfloat16, None)):
        q = jnp.ones((1, 128, 1, 1, 8), dtype)
        kernel = jax.make_jaxpr(lambda q: pallas_attention(q, q[:, :, :, 0], q[:, :, :, 0], parts, 1.0, None,
                                                           interpret=True))(q)
        assert {p for p, _ in dot_precisions(kernel.jaxpr)} == {expected}, dtype


@pytest.mark.slow
def test_kernel_on_real_hidden_states_matches_float64(smollm2):
    ids = smollm2.encode([PASSAGE])[0][:200]
    seq = jnp.asarray([[smollm2.document_start_id, *ids]])
    hidden = smollm2.model(seq, jnp.arange(seq.shape[1])[None], jnp.ones_like(seq))
    targets = jnp.concatenate([seq[:, 1:], jnp.zeros((1, 1), seq.dtype)], axis=1)
    ours = np.asarray(token_logprobs(hidden, smollm2.model.output_embedding, targets))[0, :-1]
    exact = float64_logprobs(np.asarray(hidden), np.asarray(smollm2.model.output_embedding), np.asarray(targets))[0, :-1]
    gap = np.abs(ours - exact).max()
    print(f"real hidden states, 200 tokens: max |kernel - float64| = {gap:.2e}")
    assert gap < 5e-5


def test_reductions():
    lp = np.array([-1.0, -2.0, -3.0], np.float32)
    assert reduce_logprobs(lp, "sum") == -6.0
    assert reduce_logprobs(lp, "mean") == -2.0
    assert reduce_logprobs(lp, "ppl") == pytest.approx(np.exp(2.0))
    with pytest.raises(ValueError, match="reduction"):
        reduce_logprobs(lp, "max")


@pytest.mark.slow
def test_gemma_32x256_never_holds_full_vocabulary_logits(gemma3):
    """Peak temporary memory of the compiled batch kernel, against the 8.6 GB a [32, 256, 262144]
    float32 logits tensor would need."""
    z = jnp.zeros((32, 256), jnp.int32)
    compiled = _batch_logprobs.lower(gemma3.graphdef, gemma3.vocab_chunk, None, gemma3.state, z, z, z + 1, z, z).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    full_logits = 32 * 256 * gemma3.config.vocab_size * 4
    print(f"Gemma 3, 32 x 256 tokens: peak temporary memory {temp / 2**20:.0f} MiB; "
          f"full logits would be {full_logits / 2**20:.0f} MiB")
    assert temp < full_logits / 8
