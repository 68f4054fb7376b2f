"""Token log-probabilities without ever building [B, T, V] logits.

log p(y | h) = <h, W[y]> - logsumexp_v <h, W[v]> for the output matrix W [V, D]. Both terms are taken
over vocabulary chunks under `lax.scan` (running max, running sum, target logit), so the largest live
logits block is [B, T, chunk]. Everything here is float32 whatever the parameter dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dcsjax.nn.decoder import row_sum

F32 = jnp.float32


def token_logprobs(hidden: jax.Array, out_embed: jax.Array, targets: jax.Array, chunk: int = 8192) -> jax.Array:
    """log p(targets | hidden): hidden [B, T, D], out_embed [V, D], targets [B, T] int -> [B, T] float32.

    The target's logit is picked out of the same chunk of logits that feeds the log-normaliser, so the
    two share their rounding: a confident prediction (target logit ~ logsumexp) then loses nothing.
    """
    v, d = out_embed.shape
    chunk = min(chunk, v)
    n_chunks = -(-v // chunk)
    w = jnp.pad(out_embed, ((0, n_chunks * chunk - v), (0, 0))).reshape(n_chunks, chunk, d)  # [C, chunk, D]
    h = hidden.astype(F32)
    batch_shape = targets.shape

    # Rematerialised under autodiff, so a backward pass keeps no chunk of logits either.
    @jax.checkpoint
    def step(carry, xs):
        running_max, running_sum, target_logit = carry  # [B, T] each
        w_c, first = xs
        logits = jnp.einsum("btd,vd->btv", h, w_c.astype(F32))  # [B, T, chunk]
        vocab_ids = first + jnp.arange(chunk)  # [chunk]
        logits = jnp.where(vocab_ids < v, logits, -jnp.inf)
        is_target = vocab_ids == targets[..., None]  # [B, T, chunk]
        target_logit = target_logit + jnp.where(is_target, logits, 0.0).sum(-1)  # one term: exact
        new_max = jnp.maximum(running_max, logits.max(axis=-1))
        running_sum = running_sum * jnp.exp(running_max - new_max) + row_sum(jnp.exp(logits - new_max[..., None]))
        return (new_max, running_sum, target_logit), None

    init = (jnp.full(batch_shape, -jnp.inf, F32), jnp.zeros(batch_shape, F32), jnp.zeros(batch_shape, F32))
    starts = jnp.arange(n_chunks) * chunk
    (running_max, running_sum, target_logit), _ = jax.lax.scan(step, init, (w, starts))
    return target_logit - (running_max + jnp.log(running_sum))


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
