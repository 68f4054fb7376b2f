"""Attention over packed rows: the softmax part (after the projections), by row length.

Two paths compute the same thing, softmax(q k^T * scale, capped, masked) v, for queries q [B, T, N, G, K]
(N KV heads, G queries per KV head) and keys, values [B, S, N, K]:

- `dense_attention` builds the whole [T, S] score matrix per head. It is the bit-exact path: every sum over
  keys is one matmul, so a sequence's scores do not depend on where it sits in its row or what shares its
  batch (`tests/test_invariance.py`). On CPU it is also the fastest for short rows, where the blocks a
  blockwise pass would skip are few and its per-block overhead is not paid back.
- `blockwise_attention` (flash-style) walks the row in blocks of queries and of keys with an online
  softmax, so it never holds more than one [block, block] tile of scores per head, and it skips the tiles
  that no query of the block may see (above the causal diagonal, outside a sliding window, between
  different packed sequences). Memory grows with T instead of T^2 (a 32k-token Gemma 3 row needs 17 GB of
  scores the dense way), and long rows do about half the work (the causal half; far less for a sliding
  window). It agrees with the dense path to float32 rounding (1e-6), not bit for bit: the online softmax
  rescales partial sums.

`attention_masks` picks the path from the row length (static at trace time): rows of BLOCKWISE_FROM tokens
or more go blockwise. With the default buckets those rows hold one sequence (or shared-question group)
each, at offset 0 (`packing.plan_batches` puts a group in the smallest bucket that holds it, and two groups
of over 512 tokens never share a row of 1024), and a text's row length follows from its own length, so no
score depends on what else is packed or batched with it (`tests/test_attention.py` checks the bits).
Shorter rows keep the dense path: they pack sequences at any offset, where tile boundaries would make a
score depend on its offset, and a row of one tile gains nothing from tiling. The same code serves every backend (XLA compiles the tiles' matmuls for GPU and TPU too);
Pallas kernels for GPU/TPU are not written yet.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

F32 = jnp.float32
MASKED = -1e30  # finite, so a fully masked (padding) row softmaxes to uniform instead of NaN
BLOCKWISE_FROM = 1024  # rows at least this long take the blockwise path (bench/passages.py)
BLOCK = 512  # queries and keys per tile
NO_WINDOW = 1 << 30  # the window of a global layer


def takes_blockwise(row_length: int) -> bool:
    """The default path for rows this long. Read at trace time: a bench that changes BLOCKWISE_FROM clears
    jax's caches first."""
    return row_length >= BLOCKWISE_FROM


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap) (Gemma 2's scores and logits); x itself without a cap."""
    return x if cap is None else jnp.tanh(x / cap) * cap


class MaskParts(NamedTuple):
    """What a row's [T, S] mask is made of, for attention that builds it one tile at a time. Query t sees
    key s when s <= t (columns: causal), s is not padding, s's segment is t's own or the one t attends to
    (a shared question), and positions differ by less than `window` (sliding-window layers)."""

    q_segment: jax.Array  # [B, T] int32, 0 = padding
    k_segment: jax.Array  # [B, S] int32
    attend_to: jax.Array  # [B, T] int32: the other segment a query may see, 0 = none
    q_position: jax.Array  # [B, T] int32
    k_position: jax.Array  # [B, S] int32
    window: jax.Array | int = NO_WINDOW  # [] int32

    def tile(self, q0, k0, bq: int, bk: int) -> jax.Array:
        """[B, bq, bk] bool: the mask of queries q0..q0+bq against keys k0..k0+bk."""
        cut = lambda a, start, n: jax.lax.dynamic_slice_in_dim(a, start, n, axis=1)  # noqa: E731
        seg_q, to_q, pos_q = (cut(a, q0, bq)[:, :, None] for a in (self.q_segment, self.attend_to, self.q_position))
        seg_k, pos_k = (cut(a, k0, bk)[:, None, :] for a in (self.k_segment, self.k_position))
        causal = (q0 + jnp.arange(bq))[:, None] >= (k0 + jnp.arange(bk))[None, :]
        return (causal & ((seg_q == seg_k) | (to_q == seg_k)) & (seg_k != 0)
                & (pos_q - pos_k < self.window))

    def dense(self) -> jax.Array:
        """[B, T, S] bool: the whole mask (the dense path's)."""
        return self.tile(0, 0, self.q_segment.shape[1], self.k_segment.shape[1])

    def live_tiles(self, bq: int, bk: int) -> jax.Array:
        """[T / bq, S / bk] bool: the tiles some query of some row may see. A conservative test from each
        tile's ranges (segments, positions): a tile it calls dead has no visible pair, so skipping it
        changes nothing; a live one may still be all masked (then the online softmax ignores it)."""
        b, t = self.q_segment.shape
        s = self.k_segment.shape[1]
        big = jnp.iinfo(jnp.int32).max

        def ranges(a, n, ignore_zero):  # [B, L] -> [B, L / n] min and max over each block, padding left out
            blocks = a.reshape(b, -1, n)
            low = jnp.where(blocks == 0, big, blocks) if ignore_zero else blocks
            high = jnp.where(blocks == 0, -big, blocks) if ignore_zero else blocks
            return low.min(-1), high.max(-1)

        q_lo, q_hi = ranges(self.q_segment, bq, True)
        a_lo, a_hi = ranges(self.attend_to, bq, True)
        k_lo, k_hi = ranges(self.k_segment, bk, True)
        qp_lo, _ = ranges(self.q_position, bq, False)
        _, kp_hi = ranges(self.k_position, bk, False)
        overlap = lambda lo, hi: (lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= hi[:, :, None])  # noqa: E731
        segments = overlap(q_lo, q_hi) | overlap(a_lo, a_hi)
        # the smallest position difference a tile can hold is its lowest query position minus its highest key
        # position; a sliding window drops the tile when even that is too far
        near = qp_lo[:, :, None] - kp_hi[:, None, :] < self.window
        causal = (jnp.arange(t // bq) * bq + bq - 1)[:, None] >= (jnp.arange(s // bk) * bk)[None, :]
        return causal & (segments & near).any(axis=0)


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                    cap: float | None) -> jax.Array:
    """q [B, T, N, G, K], k, v [B, S, N, K], mask [B, T, S] -> [B, T, N, G, K] float32."""
    scores = softcap(jnp.einsum("btngk,bsnk->bngts", q, k, preferred_element_type=F32) * scale, cap)
    scores = jnp.where(mask[:, None, None], scores, MASKED)  # [B, N, G, T, S]
    unnormed = jnp.exp(scores - scores.max(axis=-1, keepdims=True))  # a max is exact in any order
    # The softmax's denominator comes out of the same matmul as the weighted values, from a column of ones
    # appended to V, and is divided out afterwards. A float32 matmul sums over keys in the same order
    # wherever a sequence sits in its row, where a separate sum (a dot with ones) groups the keys by their
    # column, so a packed sequence's scores would depend on its offset. Float32 for bfloat16 weights too:
    # the bfloat16 kernel adds keys in pairs (AVX-512 BF16), which again depends on the offset.
    summed = jnp.einsum("bngts,bsnk->btngk", unnormed, with_ones(v), preferred_element_type=F32)
    return summed[..., :-1] / summed[..., -1:]


def with_ones(v: jax.Array) -> jax.Array:
    """v [B, S, N, K] -> [B, S, N, K + 1] float32: a ones column, whose weighted sum is the softmax's denominator."""
    return jnp.concatenate([v.astype(F32), jnp.ones((*v.shape[:-1], 1), F32)], axis=-1)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, parts: MaskParts, scale: float,
                        cap: float | None, block: int = BLOCK) -> jax.Array:
    """q [B, T, N, G, K], k, v [B, S, N, K] -> [B, T, N, G, K] float32, one [block, block] tile of scores at a
    time; tiles `MaskParts.live_tiles` rules out are skipped (`lax.cond`: not computed at all)."""
    b, t, n, g, kd = q.shape
    s = k.shape[1]
    bq, bk = min(block, t), min(block, s)
    if t % bq or s % bk:
        raise ValueError(f"rows of {t} queries and {s} keys do not split into tiles of {bq} x {bk}")
    live = parts.live_tiles(bq, bk)  # [T / bq, S / bk]
    q_tiles = jnp.moveaxis(q.reshape(b, t // bq, bq, n, g, kd), 1, 0)  # [T / bq, B, bq, N, G, K]
    k_tiles = jnp.moveaxis(k.reshape(b, s // bk, bk, n, kd), 1, 0)  # [S / bk, B, bk, N, K]
    v_tiles = jnp.moveaxis(with_ones(v).reshape(b, s // bk, bk, n, kd + 1), 1, 0)

    def query_tile(args):
        i, q_i = args

        def key_tile(carry, args):
            j, k_j, v_j = args

            def update(carry):
                high, summed = carry  # [B, N, G, bq] running max; [B, bq, N, G, K + 1] running sums
                scores = softcap(jnp.einsum("btngk,bsnk->bngts", q_i, k_j, preferred_element_type=F32) * scale, cap)
                scores = jnp.where(parts.tile(i * bq, j * bk, bq, bk)[:, None, None], scores, MASKED)
                new_high = jnp.maximum(high, scores.max(axis=-1))
                unnormed = jnp.exp(scores - new_high[..., None])
                # earlier sums were taken against the old max; a query that has seen only masked keys so far
                # (max MASKED) has its junk sums multiplied by exp(MASKED - real max) = 0 at its first real key
                rescale = jnp.moveaxis(jnp.exp(high - new_high), -1, 1)[..., None]  # [B, bq, N, G, 1]
                return new_high, summed * rescale + jnp.einsum("bngts,bsnk->btngk", unnormed, v_j,
                                                               preferred_element_type=F32)

            return jax.lax.cond(live[i, j], update, lambda c: c, carry), None

        init = (jnp.full((b, n, g, bq), MASKED, F32), jnp.zeros((b, bq, n, g, kd + 1), F32))
        (_, summed), _ = jax.lax.scan(key_tile, init, (jnp.arange(s // bk), k_tiles, v_tiles))
        return summed[..., :-1] / summed[..., -1:]

    out = jax.lax.map(query_tile, (jnp.arange(t // bq), q_tiles))  # [T / bq, B, bq, N, G, K]
    return jnp.moveaxis(out, 0, 1).reshape(b, t, n, g, kd)
