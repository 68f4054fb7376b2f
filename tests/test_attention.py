"""Blockwise attention (and its Pallas kernel, in interpret mode) against the dense path, on packed rows with shared questions, sliding windows and
soft-capped scores; the tiles it skips; the memory of a 32k-token Gemma 3 row; invariance of long rows.
(Whole-model agreement of the two paths with transformers on a real 1024-token row: test_parity.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcsjax.nn.attention import (NO_WINDOW, MaskParts, blockwise_attention, dense_attention, pallas_attention,
                                  splash_attention)


def packed_rows(t: int, layouts: list[list[tuple[int, bool]]]) -> MaskParts:
    """Rows of sequences, as packing lays them out: (length, continues the previous segment) each; a
    continuation is a suffix of a shared question (it attends to it, positions go on from its end)."""
    b = len(layouts)
    seg, pos, to = (np.zeros((b, t), np.int32) for _ in range(3))
    for r, layout in enumerate(layouts):
        start = segment = 0
        prefix = prefix_end = 0
        for n, continues in layout:
            segment += 1
            seg[r, start:start + n] = segment
            if continues:
                to[r, start:start + n] = prefix
                pos[r, start:start + n] = prefix_end + np.arange(n)
            else:
                prefix, prefix_end = segment, n
                pos[r, start:start + n] = np.arange(n)
            start += n
    seg, pos, to = map(jnp.asarray, (seg, pos, to))
    return MaskParts(seg, seg, to, pos, pos)


ROWS = [  # a shared question with three options, two plain sequences; one long sequence; padding only
    [(300, False), (100, True), (120, True), (90, True), (200, False), (150, False)],
    [(1000, False)],
    [],
]


@pytest.mark.slow
@pytest.mark.parametrize("window", [NO_WINDOW, 128])
@pytest.mark.parametrize("cap", [None, 50.0])
def test_blockwise_attention_equals_the_dense_path(window, cap):
    rng = np.random.default_rng(0)
    b, t, n, g, k = len(ROWS), 1024, 2, 3, 16
    parts = packed_rows(t, ROWS)._replace(window=window)
    q = jnp.asarray(rng.normal(size=(b, t, n, g, k)) * 2, jnp.float32)
    keys, values = (jnp.asarray(rng.normal(size=(b, t, n, k)), jnp.float32) for _ in range(2))
    dense = dense_attention(q, keys, values, parts.dense(), 0.25, cap)
    real = np.asarray(parts.q_segment) > 0  # padding queries see nothing: their output is junk on both paths
    for block in (64, 256, 512, 1024):
        tiled = blockwise_attention(q, keys, values, parts, 0.25, cap, block=block)
        gap = float(jnp.abs(tiled - dense)[real].max())
        assert gap < 1e-5, (block, gap)
        assert bool(jnp.isfinite(tiled).all())  # padding queries too: never a NaN
    # the Pallas kernel (the GPU path), in Pallas' interpret mode
    kernel = pallas_attention(q, keys, values, parts, 0.25, cap, block=128, interpret=True)
    assert float(jnp.abs(kernel - dense)[real].max()) < 1e-5
    assert bool(jnp.isfinite(kernel).all())  # the padding-only row skips every tile (liveness per row)


def test_the_long_row_kernel_is_named_or_refused(monkeypatch):
    from dcsjax.nn.attention import long_row_kernel

    assert long_row_kernel() == "blockwise"  # CPU
    tpu = type("Mesh", (), {"devices": np.array([type("Device", (), {"platform": "tpu"})()])})()
    assert long_row_kernel(tpu) == "splash"  # a mesh of TPU devices (a topology compiled for here too)
    monkeypatch.setenv("DCSJAX_LONG_ROWS", "pallas")
    assert long_row_kernel() == "pallas"
    monkeypatch.setenv("DCSJAX_LONG_ROWS", "flash")
    with pytest.raises(ValueError, match="DCSJAX_LONG_ROWS must be one of blockwise, pallas, splash"):
        long_row_kernel()


def test_live_tiles_keep_every_visible_pair_and_skip_the_rest():
    parts = packed_rows(1024, ROWS[:1])._replace(window=128)
    mask = np.asarray(parts.dense())[0]
    for block in (64, 128, 256):
        live = np.asarray(parts.live_tiles(block, block))
        seen = mask.reshape(1024 // block, block, 1024 // block, block).any(axis=(1, 3))
        assert (live >= seen).all()  # no visible pair in a skipped tile
        # it skips more than the causal half: the far side of the window and other sequences' tiles
        causal_half = (1024 // block) * (1024 // block + 1) // 2
        assert live.sum() < causal_half, (block, live.sum(), causal_half)


@pytest.mark.slow
def test_a_long_row_scores_the_same_alone_and_in_a_batch(smollm2):
    """Rows of 1024 tokens and more go blockwise; a sequence there is alone in its row at offset 0, and its
    scores do not depend on the rows beside it (the same bits, as for the dense path)."""
    from conftest import PASSAGE
    from dcsjax.engine.scorer import Scorer

    ids = smollm2.encode([PASSAGE])[0]
    texts = [ids[:700], ids[100:900], ids[300:1200]]
    alone = Scorer(smollm2.model, smollm2.tokenizer, smollm2.document_start_id, batch_size=1)
    together = Scorer(smollm2.model, smollm2.tokenizer, smollm2.document_start_id, batch_size=4)
    for a, b in zip([alone.logprobs_of_ids([x])[0] for x in texts], together.logprobs_of_ids(texts)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_32k_token_gemma_row_needs_under_2_gib_beyond_its_weights(gemma3):
    """XLA's own memory analysis of the scorer's compiled step for one 32,768-token row (the dense path
    would hold 17 GB of attention scores alone)."""
    from dcsjax.engine.batches import _batch_logprobs

    row = jax.ShapeDtypeStruct((1, 32768), jnp.int32)
    compiled = _batch_logprobs.lower(gemma3.graphdef, gemma3.vocab_chunk, None, gemma3.state,
                                     row, row, row, row, row).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    print(f"32k-token Gemma 3 row: {temp / 2**30:.2f} GiB beyond the weights and inputs")
    assert temp < 2 * 2**30


def test_splash_attention_equals_the_dense_path_on_rows_of_one_sequence():
    """JAX's splash kernel (the TPU path), in Pallas' interpret mode, on what the scorer gives it on TPU: one
    sequence per row from column 0, padding after; grouped queries, a sliding window, soft-capped scores."""
    rng = np.random.default_rng(1)
    b, t, n, g, k = 3, 512, 2, 3, 32
    seg = (np.arange(t)[None, :] < np.array([[512], [300], [1]])).astype(np.int32)
    pos = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t))
    seg, pos = jnp.asarray(seg), jnp.asarray(pos)
    parts = MaskParts(seg, seg, jnp.zeros_like(seg), pos, pos)
    q = jnp.asarray(rng.normal(size=(b, t, n, g, k)) * 2, jnp.float32)
    keys, values = (jnp.asarray(rng.normal(size=(b, t, n, k)), jnp.float32) for _ in range(2))
    real = np.asarray(seg) > 0
    for window, cap in [(NO_WINDOW, None), (100, 50.0)]:
        part = parts._replace(window=window)
        dense = dense_attention(q, keys, values, part.dense(), 0.25, cap)
        # the model's local window is 100; the layer's traced window picks the local or the global mask
        splash = splash_attention(q, keys, values, part, 0.25, cap, sliding_window=100, interpret=True, block=128)
        assert float(jnp.abs(splash - dense)[real].max()) < 1e-5, (window, cap)


@pytest.mark.slow
def test_long_rows_on_splash_score_shared_questions_as_whole_sequences(tiny, monkeypatch):
    """Splash masks by segment equality only, so where it runs (TPU) the scorer gives a shared question that
    fills a long row one whole sequence per option; the options' scores are those of the shared row on the
    default kernel (here blockwise), to float32 rounding. The decoder with splash in interpret mode, end to end."""
    from conftest import PASSAGE
    from dcsjax.engine import batches
    from dcsjax.nn import attention

    traced = []
    monkeypatch.setattr(attention, "splash_attention", lambda *a, **k: traced.append(a[0].shape) or splash_attention(*a, **k))
    scorer = tiny.replace(continuation_cache=None)
    context = scorer.tokenizer.decode(scorer.encode([PASSAGE])[0][:1100])
    options = [[" The end.", " Nothing more to say here.", " And so it goes"]]
    kernels = (batches._batch_logprobs, batches._batch_logprobs_greedy)
    try:
        shared = scorer.option_logprobs([context], options)[0]
        for kernel in kernels:  # the long-row kernel is chosen at trace time
            kernel.clear_cache()
        monkeypatch.setenv("DCSJAX_LONG_ROWS", "splash")
        whole = scorer.option_logprobs([context], options)[0]
    finally:
        for kernel in kernels:
            kernel.clear_cache()
    assert traced and all(shape[0] >= 1 and shape[1] >= 1024 for shape in traced)  # splash ran, on long rows
    assert [len(x) for x in whole] == [len(x) for x in shared]
    for a, b in zip(whole, shared):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
