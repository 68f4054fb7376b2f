"""Where a long passage's time goes: the decoder's forward on one long row, the part of it that is
attention (every layer's softmax part through `attention.blockwise_attention`, the path rows of 1,024+
tokens take), the same attention through torch's `scaled_dot_product_attention` (the fused CPU
flash-attention kernel the peer's batch-1 run uses), and one [512, 512] tile's three passes (scores
matmul; mask, max and exp; values matmul) against the whole tiled call. It is the profile behind the
long-passages target (bench/passages.py) when it is missed.

    python bench/profile_attention.py              # SmolLM2, rows of 2,048 and 4,096 tokens: about 2 minutes

Queries, keys and values are random with the model's own head shapes (attention's time does not depend on
their values); the decoder forward runs the real weights. Prints a table and writes
bench/results/profile-attention-<time>.json. Needs the test extra (torch).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_statements import median_seconds  # noqa: E402
from common import ROOT, cpu_name, write_record  # noqa: E402  (bench/common.py sets the cache variables first)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

F32 = jnp.float32


def one_row_parts(t: int):
    """The mask parts of one causal sequence filling a row of t tokens (a long passage's row)."""
    from dcsjax.nn.attention import NO_WINDOW, MaskParts

    segments = jnp.ones((1, t), jnp.int32)
    positions = jnp.arange(t, dtype=jnp.int32)[None]
    return MaskParts(segments, segments, jnp.zeros_like(segments), positions, positions, NO_WINDOW)


def tile_phases(c, block: int, repeats: int) -> dict:
    """Seconds of one [block, block] tile's passes, each jitted alone at the blockwise path's shapes."""
    from dcsjax.nn.attention import MASKED, with_ones

    n, g, kd = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, n, g, block, kd)), F32)
    k = jnp.asarray(rng.standard_normal((1, n, block, kd)), F32)
    v = with_ones(jnp.asarray(rng.standard_normal((1, block, n, kd)), F32)).transpose(0, 2, 1, 3)
    scores = jnp.asarray(rng.standard_normal((1, n, g, block, block)), F32)
    mask = jnp.tril(jnp.ones((block, block), bool))
    qk = jax.jit(lambda q, k: jnp.einsum("bngtk,bnsk->bngts", q, k, preferred_element_type=F32))
    softmax = jax.jit(lambda s: jnp.exp(jnp.where(mask, s, MASKED) - s.max(-1, keepdims=True)))
    pv = jax.jit(lambda s, v: jnp.einsum("bngts,bnsk->bngtk", s, v, preferred_element_type=F32))
    return {"scores_matmul_s": median_seconds(lambda: qk(q, k), repeats),
            "mask_max_exp_s": median_seconds(lambda: softmax(scores), repeats),
            "values_matmul_s": median_seconds(lambda: pv(scores, v), repeats)}


def profile(scorer, t: int, repeats: int) -> dict:
    import torch
    from flax import nnx

    from dcsjax.nn.attention import BLOCK, blockwise_attention

    c = scorer.config
    n, g, kd = c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, t, n, g, kd)), F32)
    k, v = (jnp.asarray(rng.standard_normal((1, t, n, kd)), F32) for _ in range(2))
    parts = one_row_parts(t)
    tiled = jax.jit(lambda q, k, v, parts: blockwise_attention(q, k, v, parts, c.attn_scale, c.attn_softcap))
    layer_s = median_seconds(lambda: tiled(q, k, v, parts), repeats)

    torch.set_num_threads(os.cpu_count() or 1)
    qt = torch.from_numpy(np.array(q)).reshape(1, t, n * g, kd).transpose(1, 2)
    kt, vt = (torch.from_numpy(np.array(x)).transpose(1, 2).repeat_interleave(g, 1) for x in (k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def peer():
        with torch.inference_mode():
            return sdpa(qt, kt, vt, is_causal=True, scale=c.attn_scale)

    torch_s = median_seconds(peer, repeats, wait=lambda x: x)
    # the two compute the same thing: their outputs agree to float32 rounding (checked, reported)
    gap = float(np.abs(np.asarray(tiled(q, k, v, parts)).reshape(1, t, n * g, kd)
                       - peer().transpose(1, 2).numpy()).max())

    tokens = jnp.asarray(rng.integers(0, c.vocab_size, (1, t)), jnp.int32)
    graphdef, state = nnx.split(scorer.model)
    forward = jax.jit(lambda state, tokens, positions, segments: nnx.merge(graphdef, state)(tokens, positions, segments))
    decoder_s = median_seconds(lambda: forward(state, tokens, parts.q_position, parts.q_segment), repeats)
    blocks = t // BLOCK
    live = blocks * (blocks + 1) // 2  # causal tiles of one sequence: the diagonal and below
    phases = tile_phases(c, BLOCK, repeats)
    return {"row_tokens": t, "layers": c.num_layers, "decoder_forward_s": decoder_s,
            "attention_blockwise_s": layer_s * c.num_layers, "attention_torch_sdpa_s": torch_s * c.num_layers,
            "max_gap_blockwise_sdpa": gap,
            "attention_share_of_forward": layer_s * c.num_layers / decoder_s,
            "live_tiles_per_layer": live, "tile": phases,
            "tiles_sum_per_layer_s": live * sum(phases.values()), "blockwise_per_layer_s": layer_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", default="2048,4096", help="row lengths, multiples of 512")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON")
    args = parser.parse_args()
    import dcsjax

    scorer = dcsjax.load(args.model)
    rows = [profile(scorer, int(t), args.repeats) for t in args.rows.split(",")]
    print(f"{scorer.name}, one row, float32, {cpu_name()}, {os.cpu_count()} cores; medians of {args.repeats}")
    print(f"{'tokens':>6} {'decoder':>8} {'attention':>9} {'share':>6} {'torch sdpa':>10} | per layer: "
          f"{'tiles':>5} {'scores':>7} {'mask+exp':>8} {'values':>7} {'sum':>6} {'whole':>6}")
    for r in rows:
        ph = {k: 1e3 * v for k, v in r["tile"].items()}
        print(f"{r['row_tokens']:6d} {r['decoder_forward_s']:8.2f} {r['attention_blockwise_s']:9.2f} "
              f"{r['attention_share_of_forward']:6.2f} {r['attention_torch_sdpa_s']:10.2f} |            "
              f"{r['live_tiles_per_layer']:5d} {ph['scores_matmul_s']:7.2f} {ph['mask_max_exp_s']:8.2f} "
              f"{ph['values_matmul_s']:7.2f} {1e3 * r['tiles_sum_per_layer_s']:6.0f} {1e3 * r['blockwise_per_layer_s']:6.0f}")
    print("(seconds per row: decoder forward, attention over all layers; per layer: a tile's passes in ms, "
          "their sum over the live tiles and the whole tiled call in ms)")
    out = write_record(args.out, "profile-attention", {"model": scorer.name, "repeats": args.repeats, "rows": rows},
                       args)
    print(out)


if __name__ == "__main__":
    main()
