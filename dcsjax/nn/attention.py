"""Attention over packed rows: the softmax part (after the projections), by row length.

Two paths compute the same thing, softmax(q k^T * scale, capped, masked) v, for queries q [B, T, N, G, K]
(N KV heads, G queries per KV head) and keys, values [B, S, N, K]:

- `dense_attention` builds the whole [T, S] score matrix per head. It is the bit-exact path: every sum over
  keys is one matmul, so a sequence's scores do not depend on where it sits in its row or what shares its
  batch (`tests/test_invariance.py`).
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
score depend on its offset, and a row of one tile gains nothing from tiling. CPU and GPU run this blockwise
path by default.

`pallas_attention` is the same tiled computation as one Pallas kernel, for GPUs. It is checked in Pallas'
interpret mode on CPU against the dense path, and compiled on one H200 it matched the dense path within 1.2e-6
in float32 (`bench/gpu_llama1b.py`'s check); its speed there against the blockwise path is not yet known for the
current code, so it is not the default anywhere: `DCSJAX_LONG_ROWS=pallas` selects it for long rows.

On TPU long rows go through JAX's splash kernel (`splash_attention`, under `shard_map` on a mesh), which masks
by a static causal or local mask and segment equality: rows of one sequence from column 0, which the scorer
makes there (`shares_prefixes`). Checked in interpret mode on CPU; compiled for TPU topologies by `dcsjax plan`.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from dcsjax.nn import loops

F32 = jnp.float32
MASKED = -1e30  # finite, so a fully masked (padding) row softmaxes to uniform instead of NaN
BLOCKWISE_FROM = 1024  # rows at least this long take the blockwise path (bench/passages.py)
BLOCK = 512  # queries and keys per tile
NO_WINDOW = 1 << 30  # the window of a global layer


KERNELS = ("blockwise", "pallas", "splash")


def platform(mesh=None) -> str:
    """The platform a program runs on: its mesh's devices' (a TPU topology compiled for on a CPU host is "tpu"),
    else the default backend's."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def long_row_kernel(mesh=None) -> str:
    """What long rows run through: "splash" on TPU (JAX's Pallas TPU kernel, `splash_attention`), "blockwise"
    elsewhere; `DCSJAX_LONG_ROWS` names one of `KERNELS` instead ("pallas": the GPU kernel; a Pallas kernel off
    its own platform runs in interpret mode). Read at trace time."""
    kernel = os.environ.get("DCSJAX_LONG_ROWS") or ("splash" if platform(mesh) == "tpu" else "blockwise")
    if kernel not in KERNELS:
        raise ValueError(f"DCSJAX_LONG_ROWS must be one of {', '.join(KERNELS)}, not {kernel!r}")
    return kernel


def shares_prefixes(kernel: str) -> bool:
    """Whether the kernel takes a row whose suffixes attend to a shared prefix (`MaskParts.attend_to`). Splash
    masks by segment equality only, so on it the scorer gives a long row one sequence (`BatchEngine.run_groups`)."""
    return kernel != "splash"


class LongRow(NamedTuple):
    """A long row's mask as the tiled kernels take it (`MaskParts`, the layer's window in it), the model's local
    layers' window (None: it has none; splash builds its static masks from it) and the mesh the program runs on
    (None: one device), which picks the kernel (`long_row_kernel`)."""

    parts: MaskParts
    sliding_window: int | None = None
    mesh: object = None


def tiled_attention(q: jax.Array, k: jax.Array, v: jax.Array, row: LongRow, scale: float,
                    cap: float | None) -> jax.Array:
    """A long row's attention through `long_row_kernel(row.mesh)`."""
    parts, mesh = row.parts, row.mesh
    kernel = long_row_kernel(mesh)
    if kernel == "pallas":
        return pallas_attention(q, k, v, parts, scale, cap, interpret=platform(mesh) != "gpu")
    if kernel == "splash":
        return splash_attention(q, k, v, parts, scale, cap, row.sliding_window, mesh, interpret=platform(mesh) != "tpu")
    return blockwise_attention(q, k, v, parts, scale, cap)


def takes_blockwise(row_length: int) -> bool:
    """The default path for rows this long. Read at trace time: a bench that changes BLOCKWISE_FROM clears
    jax's caches first."""
    return row_length >= BLOCKWISE_FROM


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
    """cap * tanh(x / cap) (Gemma 2's scores and logits); x itself without a cap."""
    return x if cap is None else jnp.tanh(x / cap) * cap


def visible(q_index, k_index, seg_q, to_q, pos_q, seg_k, pos_k, window) -> jax.Array:
    """Which queries see which keys, from their columns, segments and positions, broadcast against each other
    ([bq, 1] queries and [1, bk] keys give a [bq, bk] tile): the one mask rule, of the dense and tiled paths and
    of a decode step over its cache (`Decoder.decode_step`)."""
    return (q_index >= k_index) & ((seg_q == seg_k) | (to_q == seg_k)) & (seg_k != 0) & (pos_q - pos_k < window)


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
        return visible((q0 + jnp.arange(bq))[:, None], (k0 + jnp.arange(bk))[None, :], seg_q, to_q, pos_q, seg_k,
                       pos_k, self.window)

    def dense(self) -> jax.Array:
        """[B, T, S] bool: the whole mask (the dense path's)."""
        return self.tile(0, 0, self.q_segment.shape[1], self.k_segment.shape[1])

    def live_tiles(self, bq: int, bk: int, per_row: bool = False) -> jax.Array:
        """[T / bq, S / bk] bool: the tiles some query of some row may see ([B, T / bq, S / bk] per_row). A conservative test from each
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
        live = causal & segments & near  # [B, T / bq, S / bk]
        return live if per_row else live.any(axis=0)


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


def cached_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, k: jax.Array, v: jax.Array,
                     mask: jax.Array, scale: float, cap: float | None) -> jax.Array:
    """One new query per row against a KV cache and its own key: q [B, 1, N, G, K], k_cache, v_cache
    [B, S, N, K], k, v [B, 1, N, K] (the query's own), mask [B, 1, S] (the cache slots it sees; its own key it
    always sees) -> [B, 1, N, G, K] float32.
    The cache is only read, never rebuilt: a decode step writes its new slot once, for every layer, after the
    layer scan. Writing it inside the layer (a `where` over K and V, then a ones column appended to V for the
    denominator) built three cache-sized arrays per layer and token (`bench/profile_decode.py`, README)."""
    past = softcap(jnp.einsum("btngk,bsnk->bngts", q, k_cache, preferred_element_type=F32) * scale, cap)
    past = jnp.where(mask[:, None, None], past, MASKED)  # [B, N, G, 1, S]
    own = softcap(jnp.einsum("btngk,btnk->bngt", q, k, preferred_element_type=F32) * scale, cap)[..., None]
    top = jnp.maximum(past.max(axis=-1, keepdims=True), own)  # [B, N, G, 1, 1]
    w_past, w_own = jnp.exp(past - top), jnp.exp(own - top)
    summed = (jnp.einsum("bngts,bsnk->btngk", w_past, v_cache, preferred_element_type=F32)
              + jnp.einsum("bngts,bsnk->btngk", w_own, v, preferred_element_type=F32))
    total = (w_past.sum(axis=-1) + w_own[..., 0]).transpose(0, 3, 1, 2)[..., None]  # [B, 1, N, G, 1]
    return summed / total


def nonzero(total: jax.Array) -> jax.Array:
    """A softmax denominator, 1 where it is 0: a padding query whose tiles were all skipped gets 0, not NaN,
    so nothing downstream (a debugger's NaN check, a padding key's value) ever sees a NaN. A real query's
    denominator is at least 1 (its largest term is exp(0)), so its result is unchanged."""
    return jnp.where(total > 0, total, 1.0)


def with_ones(v: jax.Array) -> jax.Array:
    """v [B, S, N, K] -> [B, S, N, K + 1] float32: a ones column, whose weighted sum is the softmax's denominator."""
    return jnp.concatenate([v.astype(F32), jnp.ones((*v.shape[:-1], 1), F32)], axis=-1)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, parts: MaskParts, scale: float,
                        cap: float | None, block: int | None = None) -> jax.Array:
    """q [B, T, N, G, K], k, v [B, S, N, K] -> [B, T, N, G, K] float32, one [block, block] tile of scores at a
    time; tiles `MaskParts.live_tiles` rules out are skipped (`lax.cond`: not computed at all)."""
    b, t, n, g, kd = q.shape
    s = k.shape[1]
    block = block or BLOCK
    bq, bk = min(block, t), min(block, s)
    if t % bq or s % bk:
        raise ValueError(f"rows of {t} queries and {s} keys do not split into tiles of {bq} x {bk}")
    live = parts.live_tiles(bq, bk)  # [T / bq, S / bk]
    # head-major tiles, laid out once: every tile's two einsums are then plain batched matmuls over (B, N),
    # with no transpose inside the loops
    q_tiles = q.reshape(b, t // bq, bq, n, g, kd).transpose(1, 0, 3, 4, 2, 5)  # [T / bq, B, N, G, bq, K]
    k_tiles = k.reshape(b, s // bk, bk, n, kd).transpose(1, 0, 3, 2, 4)  # [S / bk, B, N, bk, K]
    v_tiles = with_ones(v).reshape(b, s // bk, bk, n, kd + 1).transpose(1, 0, 3, 2, 4)  # [S / bk, B, N, bk, K + 1]

    def query_tile(args):
        i, q_i = args

        def key_tile(carry, args):
            j, k_j, v_j = args

            def update(carry):
                high, summed = carry  # [B, N, G, bq] running max; [B, N, G, bq, K + 1] running sums
                scores = softcap(jnp.einsum("bngtk,bnsk->bngts", q_i, k_j, preferred_element_type=F32) * scale, cap)
                scores = jnp.where(parts.tile(i * bq, j * bk, bq, bk)[:, None, None], scores, MASKED)
                new_high = jnp.maximum(high, scores.max(axis=-1))
                unnormed = jnp.exp(scores - new_high[..., None])
                # earlier sums were taken against the old max; a query that has seen only masked keys so far
                # (max MASKED) has its junk sums multiplied by exp(MASKED - real max) = 0 at its first real key
                rescale = jnp.exp(high - new_high)[..., None]  # [B, N, G, bq, 1]
                return new_high, summed * rescale + jnp.einsum("bngts,bnsk->bngtk", unnormed, v_j,
                                                               preferred_element_type=F32)

            return loops.cond(live[i, j], update, lambda c: c, carry), None

        init = (jnp.full((b, n, g, bq), MASKED, F32), jnp.zeros((b, n, g, bq, kd + 1), F32))
        (_, summed), _ = loops.scan(key_tile, init, (jnp.arange(s // bk), k_tiles, v_tiles))
        return summed[..., :-1] / nonzero(summed[..., -1:])

    out = loops.map(query_tile, (jnp.arange(t // bq), q_tiles))  # [T / bq, B, N, G, bq, K]
    return out.transpose(1, 0, 4, 2, 3, 5).reshape(b, t, n, g, kd)


# ------------------------------------------------------------------------------------------------ Pallas
PALLAS_BLOCK = 64  # queries and keys per tile in the Pallas kernel (Triton: powers of two, on-chip memory)


def pallas_attention(q: jax.Array, k: jax.Array, v: jax.Array, parts: MaskParts, scale: float, cap: float | None,
                     block: int = PALLAS_BLOCK, interpret: bool = False) -> jax.Array:
    """`blockwise_attention` as one Pallas kernel (the GPU path; `interpret=True` runs it anywhere, which is
    how the tests check it on CPU). q [B, T, N, G, K], k, v [B, S, N, K] -> [B, T, N, G, K] float32.

    The grid is (row, query head, query tile); each program keeps its queries' running max, sum and
    output in registers and walks the key tiles up to the causal diagonal, skipping the ones
    `MaskParts.live_tiles` rules out for its row. A query head reads its KV head (h // G) straight from
    k and v, so grouped keys are never repeated in memory."""
    from jax.experimental import pallas as pl

    b, t, n, g, kd = q.shape
    s = k.shape[1]
    bq, bk = min(block, t), min(block, s)
    if t % bq or s % bk:
        raise ValueError(f"rows of {t} queries and {s} keys do not split into tiles of {bq} x {bk}")
    heads = jnp.moveaxis(q.reshape(b, t, n * g, kd), 2, 1)  # [B, H, T, K], head h = n * G + g
    keys, values = jnp.moveaxis(k, 2, 1), jnp.moveaxis(v, 2, 1)  # [B, N, S, K]
    live = parts.live_tiles(bq, bk, per_row=True).astype(jnp.int32)  # [B, T / bq, S / bk]
    window = jnp.broadcast_to(jnp.asarray(parts.window, jnp.int32), (1,))
    # Triton's float32 dot is TensorFloat-32 unless told (the decoder's rule: nn.decoder.float32_matmuls)
    precision = jax.lax.Precision.HIGHEST if q.dtype == F32 else None

    def kernel(q_ref, k_ref, v_ref, q_seg_ref, q_to_ref, q_pos_ref, k_seg_ref, k_pos_ref, live_ref, window_ref, o_ref):
        i = pl.program_id(2)
        queries = q_ref[...].astype(F32)  # [bq, K]
        seg_q, to_q, pos_q = q_seg_ref[...][:, None], q_to_ref[...][:, None], q_pos_ref[...][:, None]
        q_index = (i * bq + jnp.arange(bq))[:, None]

        def key_tile(j, carry):
            def update(carry):
                high, total, summed = carry  # [bq], [bq], [bq, K]
                cut = pl.ds(j * bk, bk)
                scores = softcap(jnp.dot(queries, k_ref[cut, :].astype(F32).T, precision=precision,
                                         preferred_element_type=F32) * scale, cap)
                seg_k, pos_k = k_seg_ref[cut][None, :], k_pos_ref[cut][None, :]
                seen = visible(q_index, (j * bk + jnp.arange(bk))[None, :], seg_q, to_q, pos_q, seg_k, pos_k,
                               window_ref[0])
                scores = jnp.where(seen, scores, MASKED)
                new_high = jnp.maximum(high, scores.max(axis=-1))
                unnormed = jnp.exp(scores - new_high[:, None])
                rescale = jnp.exp(high - new_high)
                return (new_high, total * rescale + unnormed.sum(axis=-1),
                        summed * rescale[:, None] + jnp.dot(unnormed, v_ref[cut, :].astype(F32), precision=precision,
                                                            preferred_element_type=F32))

            return jax.lax.cond(live_ref[j] > 0, update, lambda c: c, carry)

        init = (jnp.full((bq,), MASKED, F32), jnp.zeros((bq,), F32), jnp.zeros((bq, kd), F32))
        last = jnp.minimum((i * bq + bq + bk - 1) // bk, s // bk)  # key tiles up to the causal diagonal
        _, total, summed = jax.lax.fori_loop(0, last, key_tile, init)
        o_ref[...] = summed / nonzero(total)[:, None]

    row = lambda shape: pl.BlockSpec(shape, lambda r, h, i: (r, 0))  # noqa: E731
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b, n * g, t, kd), F32),
        grid=(b, n * g, t // bq),
        in_specs=[
            pl.BlockSpec((None, None, bq, kd), lambda r, h, i: (r, h, i, 0)),
            pl.BlockSpec((None, None, s, kd), lambda r, h, i: (r, h // g, 0, 0)),
            pl.BlockSpec((None, None, s, kd), lambda r, h, i: (r, h // g, 0, 0)),
            *[pl.BlockSpec((None, bq), lambda r, h, i: (r, i))] * 3,
            row((None, s)), row((None, s)),
            pl.BlockSpec((None, None, s // bk), lambda r, h, i: (r, i, 0)),
            pl.BlockSpec((1,), lambda r, h, i: (0,)),
        ],
        out_specs=pl.BlockSpec((None, None, bq, kd), lambda r, h, i: (r, h, i, 0)),
        interpret=interpret,
    )(heads, keys, values, parts.q_segment, parts.attend_to, parts.q_position, parts.k_segment, parts.k_position,
      live, window)
    return jnp.moveaxis(out, 1, 2).reshape(b, t, n, g, kd)


# ------------------------------------------------------------------------------------------------ splash (TPU)
SPLASH_BLOCK = 512  # queries and keys per tile of the splash kernel (a multiple of 128; long rows are of 512)


def splash_head_split(kv_heads: int, group: int, model_devices: int) -> str | None:
    """How splash's heads go over a model axis: "kv" (the KV heads divide), "query" (the query heads divide and
    each device's fall within one KV head), or None (every model device computes every head)."""
    per = kv_heads * group // model_devices
    if kv_heads % model_devices == 0:
        return "kv"
    return "query" if (kv_heads * group) % model_devices == 0 and group % per == 0 else None


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, parts: MaskParts, scale: float, cap: float | None,
                     sliding_window: int | None = None, mesh=None, interpret: bool = False,
                     block: int = SPLASH_BLOCK) -> jax.Array:
    """Long rows on TPU through JAX's splash attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`,
    a Mosaic kernel that skips the tiles its static mask rules out). q [B, T, N, G, K], k, v [B, S, N, K] ->
    [B, T, N, G, K] float32.

    Splash's mask is static (causal, or causal within `sliding_window`, by column) and-ed with segment equality,
    so it equals `visible` on rows that hold one sequence from column 0, padding after: there positions are
    columns and nothing attends across segments. Those are the long rows the scorer makes on TPU
    (`shares_prefixes`); a shared question's suffixes (`attend_to`) are not expressible and must not reach it.
    A layer's window is traced (the layer scan's flags), so a model with local layers compiles both masks and
    `lax.cond` picks one. On a mesh the kernel runs under `shard_map`: rows over `data`, KV heads over `model`
    where that axis divides them, else query heads where each device's fall within one KV head, else every
    model device computes all heads of its rows (`splash_head_split`). Queries are scaled before the kernel (it
    takes no scale), in their own dtype; its sums are float32, its output q's dtype."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    b, t, n, g, kd = q.shape
    s = k.shape[1]
    bq, bk = min(block, t), min(block, s)
    if t % bq or s % bk:
        raise ValueError(f"rows of {t} queries and {s} keys do not split into tiles of {bq} x {bk}")
    sizes = splash.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq, block_kv_dkv=bk,
                              block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)

    @functools.cache
    def kernel(window: int | None, heads: int):  # one KV head's query heads: q [heads, T, K], k, v [S, K]
        head = splash.CausalMask((t, s)) if window is None else splash.LocalMask((t, s), (window - 1, 0), 0)
        return splash.make_splash_mqa_single_device(splash.MultiHeadMask([head] * heads), block_sizes=sizes,
                                                    attn_logits_soft_cap=cap, interpret=interpret)

    local_layers = bool(sliding_window and sliding_window < NO_WINDOW)

    def local(q, k, v, segments, window):  # one device's rows and heads: q [b, T, n, G', K], k, v [b, S, n, K]
        heads = (q * jnp.asarray(scale, q.dtype)).transpose(0, 2, 3, 1, 4)  # [b, n, G', T, K]
        keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, n, S, K]
        ids = splash.SegmentIds(segments, segments)  # [b, T] each

        def run(w):
            per_head = jax.vmap(kernel(w, q.shape[3]), in_axes=(0, 0, 0, None))  # a row's KV heads share its segments
            return jax.vmap(per_head, in_axes=(0, 0, 0, 0))(heads, keys, values, ids)  # [b, n, G', T, K]

        out = jax.lax.cond(window < NO_WINDOW, lambda: run(sliding_window), lambda: run(None)) if local_layers \
            else run(None)
        return out.transpose(0, 3, 1, 2, 4).astype(F32)

    window = jnp.asarray(parts.window, jnp.int32)
    if mesh is None:
        return local(q, k, v, parts.q_segment, window)
    rows = "data" if b % mesh.shape["data"] == 0 else None
    m = mesh.shape["model"]
    split = splash_head_split(n, g, m)
    if split == "kv":  # KV heads (and their queries) over model
        heads = P(rows, None, "model")
        return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(heads, heads, heads, P(rows), P()),
                             out_specs=heads)(q, k, v, parts.q_segment, window)
    if split == "query":
        per = n * g // m
        # query heads over model, each device's within one KV head (Llama-3.1-70B's 64 query and 8 KV heads on
        # 16 devices: 4 query heads a device, one KV head per two devices), which it slices from the whole keys
        def own_kv_head(q, k, v, segments, window):  # q [b, T, per, K]; k, v [b, S, N, K]
            first = jax.lax.axis_index("model") * per // g
            pick = lambda a: jax.lax.dynamic_slice_in_dim(a, first, 1, axis=2)  # noqa: E731
            return local(q[:, :, None], pick(k), pick(v), segments, window)[:, :, 0]

        heads = P(rows, None, "model")
        out = jax.shard_map(own_kv_head, mesh=mesh, check_vma=False, in_specs=(heads, P(rows), P(rows), P(rows), P()),
                            out_specs=heads)(q.reshape(b, t, n * g, kd), k, v, parts.q_segment, window)
        return out.reshape(b, t, n, g, kd)
    # neither divides: every model device computes every head of its rows
    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(P(rows),) * 4 + (P(),),
                         out_specs=P(rows))(q, k, v, parts.q_segment, window)
