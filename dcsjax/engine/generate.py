"""Generation with a KV cache, jitted on static shapes: greedy (temperature 0) or sampled with a
temperature and top-p (nucleus) cut.

Prompts are right-padded into rows of a bucketed length; one prefill fills the cache, then a
`lax.while_loop` of `decode_step`s emits tokens until every row has ended or the budget is spent. One
compile per prompt bucket and setting.
Sampling is seeded per prompt (the key of prompt i is fold_in(seed, i), then fold_in(step)), so what a
prompt gets does not depend on which other prompts share its batch or on the batch size.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dcsjax.errors import InputError
from dcsjax.engine.packing import bucket_for
from dcsjax.nn.decoder import right_padded
from dcsjax.nn.sharding import CACHE_AXES, constrain


def sample_token(logits: jax.Array, key: jax.Array, temperature: float, top_p: float) -> jax.Array:
    """logits [V] float32 -> one token: argmax at temperature 0, else a draw from softmax(logits / T)
    restricted to the nucleus, the smallest set of most probable tokens whose mass reaches top_p.

    The nucleus is every token at least as probable as a threshold found by bisection (the largest one
    whose tokens still hold top_p of the mass): 40 masked sums over the vocabulary instead of sorting it,
    which on a CPU is most of a decode step's time."""
    if temperature == 0.0:
        return jnp.argmax(logits)
    scaled = logits / temperature
    probs = jax.nn.softmax(scaled)
    if top_p < 1.0:
        def bisect(_, bounds):
            low, high = bounds  # mass(>= low) >= top_p > mass(>= high)
            mid = (low + high) / 2
            enough = jnp.sum(jnp.where(probs >= mid, probs, 0.0)) >= top_p
            return jnp.where(enough, mid, low), jnp.where(enough, high, mid)

        low, _ = jax.lax.fori_loop(0, 40, bisect, (jnp.float32(0.0), jnp.max(probs) * (1 + 1e-6)))
        scaled = jnp.where(probs >= low, scaled, -jnp.inf)
    return jax.random.categorical(key, scaled)


@functools.partial(jax.jit, static_argnums=(0, 5, 6, 7, 8, 9))
def _decode(graphdef, state, tokens, lengths, keys, max_new: int, temperature: float, top_p: float,
            stops: tuple[int, ...], mesh=None):
    """tokens [B, T] right-padded, lengths [B], keys [B] (one PRNG key per row) -> [B, max_new] tokens.
    Decoding ends once every row has emitted one of `stops` (slots after that hold -1): a batch costs its
    longest answer, not the token budget. mesh: the model's (None on one device): the cache is split on it
    by `sharding.CACHE_AXES`."""
    model = nnx.merge(graphdef, state)
    b, t = tokens.shape
    positions, segments = right_padded(lengths, t)
    hidden, (cache_k, cache_v) = model(tokens, positions, segments, return_kv=True, mesh=mesh)  # [L, B, T, N, K]
    pad = ((0, 0), (0, 0), (0, max_new), (0, 0), (0, 0))
    cache_k, cache_v = (constrain(jnp.pad(x, pad), CACHE_AXES, mesh) for x in (cache_k, cache_v))
    def next_token(h, step):  # h [B, D]
        logits = model.logits(h)  # [B, V]
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(keys)
        return jax.vmap(lambda z, k: sample_token(z, k, temperature, top_p))(logits, step_keys)

    first = next_token(hidden[jnp.arange(b), lengths - 1], 0)

    stop_ids = jnp.asarray(stops or (-1,), jnp.int32)

    def unfinished(carry):
        i, *_, done = carry
        return (i < max_new) & ~jnp.all(done)

    def step(carry):
        i, token, position, cache_k, cache_v, emitted, done = carry
        emitted = emitted.at[:, i].set(token)
        done = done | jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        h, cache_k, cache_v = model.decode_step(token, position, cache_k, cache_v, mesh=mesh)
        cache_k, cache_v = (constrain(x, CACHE_AXES, mesh) for x in (cache_k, cache_v))
        return i + 1, next_token(h, i + 1), position + 1, cache_k, cache_v, emitted, done

    carry = (0, first, lengths, cache_k, cache_v, jnp.full((b, max_new), -1, jnp.int32), jnp.zeros(b, bool))
    return jax.lax.while_loop(unfinished, step, carry)[5]


def greedy_generate(scorer, prompts: Sequence[Sequence[int]], max_new_tokens: int = 15,
                    batch_size: int = 8) -> list[list[int]]:
    """Greedy continuations of token-id prompts, cut after the first end-of-sequence token."""
    return generate(scorer, prompts, max_new_tokens, batch_size=batch_size)


def generate(scorer, prompts: Sequence[Sequence[int]], max_new_tokens: int, *, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, batch_size: int = 8,
             key_ids: Sequence[int] | None = None, stop_ids: Sequence[int] | None = None) -> list[list[int]]:
    """Continuations of token-id prompts, cut before the first end-of-sequence token; greedy at
    temperature 0, else sampled, prompt i with the key fold_in(key(seed), key_ids[i]) (default i):
    reproducible whatever the batching. stop_ids: the tokens that end a row (default: the tokenizer's EOS
    and the chat templates' end-of-turn tokens; () decodes every row to max_new_tokens)."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise InputError(f"temperature must be >= 0 and top_p in (0, 1]; got {temperature}, {top_p}")
    limit = scorer.max_length - max_new_tokens
    for i, p in enumerate(prompts):
        if not p:
            raise InputError(f"prompt {i} is empty")
        if len(p) > limit:
            raise InputError(f"prompt {i} has {len(p)} tokens; with {max_new_tokens} new ones that exceeds "
                             f"the {scorer.max_length}-token limit of {scorer.name}")
    key_ids = list(range(len(prompts))) if key_ids is None else list(key_ids)
    if stop_ids is None:
        stop_ids = (scorer.tokenizer.eos_token_id, *_extra_stops(scorer.tokenizer))
    stops = {t for t in stop_ids if t is not None}
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        bucket = bucket_for(max(len(prompts[i]) for i in idx), scorer.buckets)
        tokens = np.zeros((batch_size, bucket), np.int32)
        lengths = np.ones(batch_size, np.int32)
        rows = np.zeros(batch_size, np.int32)
        for r, i in enumerate(idx):
            tokens[r, :len(prompts[i])] = prompts[i]
            lengths[r] = len(prompts[i])
            rows[r] = key_ids[i]
        keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(jnp.asarray(rows))
        emitted = np.asarray(_decode(scorer.graphdef, scorer.state, jnp.asarray(tokens), jnp.asarray(lengths),
                                     keys, max_new_tokens, float(temperature), float(top_p), tuple(sorted(stops)),
                                     scorer.mesh))
        for r, i in enumerate(idx):
            seq = emitted[r].tolist()
            cut = next((k for k, t in enumerate(seq) if t in stops), len(seq))
            out[i] = seq[:cut]
    return out  # type: ignore[return-value]


def _extra_stops(tokenizer) -> list[int]:
    """End-of-turn tokens of chat templates (<|im_end|>, <end_of_turn>) also end a generation."""
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>") if t in vocab]
