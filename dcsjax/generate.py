"""Greedy generation (temperature 0) with a KV cache, jitted on static shapes.

Prompts are right-padded into rows of a bucketed length; one prefill fills the cache, then a `lax.scan`
of `decode_step`s emits a fixed number of tokens per row. One compile per prompt bucket.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dcsjax.errors import InputError
from dcsjax.kernels.packing import bucket_for


@functools.partial(jax.jit, static_argnums=(0, 4))
def _greedy(graphdef, state, tokens, lengths, max_new: int):
    """tokens [B, T] right-padded, lengths [B] -> [B, max_new] greedy tokens."""
    model = nnx.merge(graphdef, state)
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    segments = (positions < lengths[:, None]).astype(jnp.int32)
    hidden, (cache_k, cache_v) = model(tokens, positions, segments, return_kv=True)  # [L, B, T, N, K]
    pad = ((0, 0), (0, 0), (0, max_new), (0, 0), (0, 0))
    cache_k, cache_v = jnp.pad(cache_k, pad), jnp.pad(cache_v, pad)
    out_embed = model.output_embedding
    next_token = lambda h: jnp.argmax(jnp.einsum("bd,vd->bv", h, out_embed, preferred_element_type=jnp.float32), -1)  # noqa: E731
    first = next_token(hidden[jnp.arange(b), lengths - 1])

    def step(carry, _):
        token, position, cache_k, cache_v = carry
        h, cache_k, cache_v = model.decode_step(token, position, cache_k, cache_v)
        return (next_token(h), position + 1, cache_k, cache_v), token

    _, emitted = jax.lax.scan(step, (first, lengths, cache_k, cache_v), None, length=max_new)
    return emitted.T


def greedy_generate(scorer, prompts: Sequence[Sequence[int]], max_new_tokens: int = 15,
                    batch_size: int = 8) -> list[list[int]]:
    """Greedy continuations of token-id prompts, cut after the first end-of-sequence token."""
    limit = scorer.max_length - max_new_tokens
    for i, p in enumerate(prompts):
        if not p:
            raise InputError(f"prompt {i} is empty")
        if len(p) > limit:
            raise InputError(f"prompt {i} has {len(p)} tokens; with {max_new_tokens} new ones that exceeds "
                             f"the {scorer.max_length}-token limit of {scorer.name}")
    stops = {t for t in (scorer.tokenizer.eos_token_id, *_extra_stops(scorer.tokenizer)) if t is not None}
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[list[int] | None] = [None] * len(prompts)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        bucket = bucket_for(max(len(prompts[i]) for i in idx), scorer.buckets)
        tokens = np.zeros((batch_size, bucket), np.int32)
        lengths = np.ones(batch_size, np.int32)
        for r, i in enumerate(idx):
            tokens[r, :len(prompts[i])] = prompts[i]
            lengths[r] = len(prompts[i])
        emitted = np.asarray(_greedy(scorer._graphdef, scorer._state, jnp.asarray(tokens), jnp.asarray(lengths),
                                     max_new_tokens))
        for r, i in enumerate(idx):
            seq = emitted[r].tolist()
            cut = next((k for k, t in enumerate(seq) if t in stops), len(seq))
            out[i] = seq[:cut]
    return out  # type: ignore[return-value]


def _extra_stops(tokenizer) -> list[int]:
    """End-of-turn tokens of chat templates (<|im_end|>, <end_of_turn>) also end a generation."""
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>") if t in vocab]
