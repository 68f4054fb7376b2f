"""Token log-probabilities without ever building [B, T, V] logits.

log p(y | h) = <h, W[y]> - logsumexp_v <h, W[v]> for the output matrix W [V, D]. Both terms are taken
over vocabulary chunks under `lax.scan` (running max, running sum, target logit), so the largest live
logits block is [B, T, chunk]; rows longer than TOKEN_BLOCK are also taken TOKEN_BLOCK tokens at a time, so
it stays [B, TOKEN_BLOCK, chunk] (a 32k-token row: 128 MiB instead of 1 GiB per chunk). Everything here is
float32 whatever the parameter dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dcsjax.nn import loops
from dcsjax.nn.decoder import row_sum, unembed

F32 = jnp.float32
# Tokens of a row per pass over the vocabulary. Only rows longer than this are split, and those hold one
# sequence each whose row length follows from its own length (`dcsjax.nn.attention`), so no score changes
# with what shares its batch.
TOKEN_BLOCK = 4096


def token_logprobs(hidden: jax.Array, out_embed: jax.Array, targets: jax.Array, chunk: int = 8192,
                   cap: float | None = None) -> jax.Array:
    """log p(targets | hidden): hidden [B, T, D], out_embed [V, D], targets [B, T] int -> [B, T] float32.
    cap: the logits' soft-cap (Gemma 2), applied to every logit before the softmax.

    The target's logit is picked out of the same chunk of logits that feeds the log-normaliser, so the
    two share their rounding: a confident prediction (target logit ~ logsumexp) then loses nothing.
    """
    return token_logprobs_and_greedy(hidden, out_embed, targets, chunk, cap)[0]


def token_logprobs_and_greedy(hidden: jax.Array, out_embed: jax.Array, targets: jax.Array, chunk: int = 8192,
                              cap: float | None = None) -> tuple[jax.Array, jax.Array]:
    """([B, T] float32 log p(targets | hidden), [B, T] bool: the target is the most probable token).

    The flag is lm-eval's `is_greedy` per token: the target's logit reaches the running maximum of the
    same scan, so it costs one comparison (a tie counts as greedy; argmax would pick the lower id)."""
    running_max, running_sum, target_logit = vocab_scan(hidden, out_embed, targets, 0, out_embed.shape[0], chunk, cap)
    return target_logit - (running_max + jnp.log(running_sum)), target_logit >= running_max


def vocab_scan(hidden: jax.Array, out_embed: jax.Array, targets: jax.Array, first_id, vocab_size: int,
               chunk: int = 8192, cap: float | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Over the rows first_id .. first_id + len(out_embed) of the vocabulary: [B, T] running max, sum of
    exp(logit - max), and the target's logit (0 where the target lies outside these rows). Rows at or past
    `vocab_size` (padding) are masked."""
    b, t = targets.shape
    if t > TOKEN_BLOCK and t % TOKEN_BLOCK == 0:  # a long row: one block of its tokens at a time
        blocks = lambda x: jnp.moveaxis(x.reshape(b, t // TOKEN_BLOCK, TOKEN_BLOCK, *x.shape[2:]), 1, 0)  # noqa: E731
        out = loops.map(lambda xs: vocab_scan(xs[0], out_embed, xs[1], first_id, vocab_size, chunk, cap),
                          (blocks(hidden), blocks(targets)))
        return tuple(jnp.moveaxis(x, 0, 1).reshape(b, t) for x in out)
    rows, d = out_embed.shape
    chunk = min(chunk, rows)
    n_chunks = -(-rows // chunk)
    w = jnp.pad(out_embed, ((0, n_chunks * chunk - rows), (0, 0))).reshape(n_chunks, chunk, d)  # [C, chunk, D]
    # cast once, outside the scan (`unembed` casts each chunk of rows to the same dtype)
    h = hidden.astype(hidden.dtype if hidden.dtype == out_embed.dtype else F32)
    batch_shape = targets.shape

    # Rematerialised under autodiff, so a backward pass keeps no chunk of logits either.
    @jax.checkpoint
    def step(carry, xs):
        running_max, running_sum, target_logit = carry  # [B, T] each
        w_c, local_first = xs
        logits = unembed(h, w_c, cap)  # [B, T, chunk] float32: the decoder's output head on this chunk
        local_ids = local_first + jnp.arange(chunk)  # [chunk] rows of this slice
        vocab_ids = first_id + local_ids
        # Rows padded onto this slice's last chunk, and rows past the vocabulary, are no tokens (on a
        # vocabulary shard, the padded rows' ids belong to the next shard).
        real = (local_ids < rows) & (vocab_ids < vocab_size)  # [chunk]
        logits = jnp.where(real, logits, -jnp.inf)
        is_target = (vocab_ids == targets[..., None]) & real  # [B, T, chunk]
        target_logit = target_logit + jnp.where(is_target, logits, 0.0).sum(-1)  # one term: exact
        new_max = jnp.maximum(running_max, logits.max(axis=-1))
        running_sum = running_sum * jnp.exp(running_max - new_max) + row_sum(jnp.exp(logits - new_max[..., None]))
        return (new_max, running_sum, target_logit), None

    init = (jnp.full(batch_shape, -jnp.inf, F32), jnp.zeros(batch_shape, F32), jnp.zeros(batch_shape, F32))
    return loops.scan(step, init, (w, jnp.arange(n_chunks) * chunk))[0]


def sharded_token_logprobs(hidden: jax.Array, out_embed: jax.Array, targets: jax.Array, mesh,
                           chunk: int = 8192, cap: float | None = None, with_greedy: bool = False):
    """`token_logprobs` with the vocabulary split over the mesh's `model` axis and rows over `data`
    (with_greedy: `token_logprobs_and_greedy`'s pair).

    Each device scans only its own rows of the output matrix; the log-normaliser is combined from the
    devices' [B, T] partial maxima and sums (pmax, psum), and the target's logit from the one device that
    holds it. No device ever holds another's logits or rows of the matrix.
    """
    from jax.sharding import PartitionSpec as P

    v = out_embed.shape[0]
    m = mesh.shape["model"]
    per_device = -(-v // m)
    if per_device * m != v:
        out_embed = jnp.pad(out_embed, ((0, per_device * m - v), (0, 0)))

    def local(h, w, t):
        first = jax.lax.axis_index("model") * per_device
        part_max, part_sum, part_target = vocab_scan(h, w, t, first, v, chunk, cap)
        top = jax.lax.pmax(part_max, "model")
        total = jax.lax.psum(part_sum * jnp.exp(part_max - top), "model")
        target = jax.lax.psum(part_target, "model")
        logprobs = target - (top + jnp.log(total))
        return (logprobs, target >= top) if with_greedy else logprobs

    out_specs = (P("data"), P("data")) if with_greedy else P("data")
    return jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P("model"), P("data")),
                         out_specs=out_specs, check_vma=False)(hidden, out_embed, targets)


def reduce_logprobs(logprobs, reduction: str):
    """One number from a sequence's token log-probs: sum, mean, or perplexity exp(-mean)."""
    import numpy as np

    lp = np.asarray(logprobs, np.float64)
    if reduction == "sum":
        return float(lp.sum())
    if reduction == "mean":
        return float(lp.mean())
    if reduction in ("ppl", "perplexity"):
        return float(np.exp(-lp.mean()))
    raise ValueError(f"reduction must be 'sum', 'mean' or 'ppl', not {reduction!r}")
