"""A differentiable DCS loss over each item's option+IDK distribution (letters elicitation: the next-token
logits of the option letters at one position per item).

DCS is not a proper scoring rule: its expectation is maximised by committing all mass to the most likely
option or to IDK, so DCS alone teaches a model to hedge badly, and its gradient vanishes as pIDK -> 1 (a
model that always abstains cannot train its way out). Hence

    loss = -mean DCS + beta * CE(correct option | answer options, answerable items) + gamma * KL(p || p_start)

where CE is the cross-entropy of the correct option renormalised over the answer options (IDK excluded),
and KL keeps the option+IDK distribution near the starting model's. All inputs are padded [N, K] arrays
with a `valid` mask, as everywhere else in dcsjax.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dcsjax.metrics.dcs import dcs, option_masses

NEG = -1e30  # a finite "minus infinity": padded options get no mass and no NaN gradients


class LossParts(NamedTuple):
    loss: jax.Array
    dcs: jax.Array  # mean DCS
    ce: jax.Array  # mean CE over answerable items (0 if there are none)
    kl: jax.Array  # mean KL to the starting distribution (0 without one)


def dcs_loss(logits: jax.Array, correct: jax.Array, idk: jax.Array, valid: jax.Array, *, lc: float = 1.0,
             lw: float = 1.0, beta: float = 0.0, gamma: float = 0.0,
             start_logits: jax.Array | None = None) -> LossParts:
    """logits [N, K] (float32), correct/idk/valid [N, K] bool -> LossParts of scalars.

    An unanswerable item has the IDK option as its only correct entry: answering anything scores below
    abstaining. beta > 0 needs answerable items; gamma > 0 needs `start_logits` [N, K]."""
    logits = jnp.where(valid, logits.astype(jnp.float32), NEG)
    log_p = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(log_p)
    mean_dcs = jnp.mean(dcs(*option_masses(p, correct, idk, valid), lc, lw))

    answer = correct & ~idk
    options = valid & ~idk  # the answer options, IDK excluded
    answerable = jnp.any(answer, -1)
    log_options = jax.nn.logsumexp(jnp.where(options, logits, NEG), -1)
    log_correct = jax.nn.logsumexp(jnp.where(answer, logits, NEG), -1)
    ce_items = jnp.where(answerable, log_options - log_correct, 0.0)
    ce = jnp.sum(ce_items) / jnp.maximum(jnp.sum(answerable), 1)

    if start_logits is not None:
        log_q = jax.nn.log_softmax(jnp.where(valid, start_logits.astype(jnp.float32), NEG), -1)
        kl = jnp.mean(jnp.sum(jnp.where(valid, p * (log_p - log_q), 0.0), -1))
    else:
        kl = jnp.zeros((), jnp.float32)
    return LossParts(-mean_dcs + beta * ce + gamma * kl, mean_dcs, ce, kl)


def option_ce(logits: jax.Array, correct: jax.Array, valid: jax.Array) -> jax.Array:
    """Mean cross-entropy of the right answer over all options, IDK included: plain fine-tuning on the
    same data (on an unanswerable item the right answer is IDK). logits [N, K], correct/valid [N, K]."""
    logits = jnp.where(valid, logits.astype(jnp.float32), NEG)
    log_all = jax.nn.logsumexp(logits, -1)
    log_correct = jax.nn.logsumexp(jnp.where(correct & valid, logits, NEG), -1)
    return jnp.mean(log_all - log_correct)
