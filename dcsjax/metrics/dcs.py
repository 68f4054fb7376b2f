"""The Distributional Correctness Score (paper 000), elementwise and batched over items.

DCS = (lc * pc - lw * PW) * (1 - pIDK): pc is the mass on correct options, PW the mass on wrong options,
pIDK the mass on "I don't know". The IDK option is found by index (never by string). On an item whose only
correct answer is the IDK option (unanswerable), pc = 0: abstaining scores 0, any answer scores below.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def dcs(p_correct, p_wrong, p_idk, lc=1.0, lw=1.0):
    """Elementwise DCS; in [-1, 1] under the default loadings lc = lw = 1."""
    return (lc * p_correct - lw * p_wrong) * (1.0 - p_idk)


def loadings_from_threshold(t: float) -> tuple[float, float]:
    """(lc, lw) = (1, t / (1 - t)): answering pays only above confidence t (Proposition 1)."""
    if not 0.0 < t < 1.0:
        raise ValueError(f"threshold must lie in (0, 1), not {t}")
    return 1.0, t / (1.0 - t)


def loadings_note(lc: float, lw: float) -> str | None:
    """None inside Definition 1 (lc >= lw >= 0); else what leaving it costs. This project follows Proposition 1
    for a target threshold t: lc = 1, lw = t / (1 - t), so t > 0.5 gives lw > lc, outside Definition 1, where
    Theorem 1's [-1, 1] bound (proved at the default loadings) no longer holds: DCS lies in [-lw, lc]."""
    if lw <= lc:
        return None
    return (f"lw = {lw:.3g} > lc = {lc:.3g}: outside Definition 1 (lc >= lw); DCS lies in [-{lw:.3g}, {lc:.3g}], "
            f"not Theorem 1's [-1, 1]")


def option_masses(probs: jax.Array, correct: jax.Array, idk: jax.Array, valid: jax.Array):
    """[N, K] distributions -> [N] p_correct, p_wrong, p_idk. A correct IDK option (an unanswerable item)
    is abstention, not a correct answer; padded entries count nowhere."""
    probs = jnp.where(valid, probs, 0.0)
    p_correct = jnp.sum(jnp.where(correct & ~idk, probs, 0.0), axis=-1)
    p_wrong = jnp.sum(jnp.where(valid & ~correct & ~idk, probs, 0.0), axis=-1)
    p_idk = jnp.sum(jnp.where(idk, probs, 0.0), axis=-1)
    return p_correct, p_wrong, p_idk


@jax.jit
def dcs_parts(probs: jax.Array, correct: jax.Array, idk: jax.Array, valid: jax.Array,
              lc: float = 1.0, lw: float = 1.0) -> dict[str, jax.Array]:
    """Per item, from a distribution over its options padded to a common width.

    probs [N, K] (sums to 1 over valid options), correct, idk, valid [N, K] bool -> dict of [N] arrays:
    dcs, p_correct, p_wrong, p_idk, and the argmax option.
    """
    p_correct, p_wrong, p_idk = option_masses(probs, correct, idk, valid)
    return {
        "dcs": dcs(p_correct, p_wrong, p_idk, lc, lw),
        "p_correct": p_correct,
        "p_wrong": p_wrong,
        "p_idk": p_idk,
        "argmax": jnp.argmax(jnp.where(valid, probs, -1.0), axis=-1),
    }


def softmax_over_options(scores: jax.Array, valid: jax.Array) -> jax.Array:
    """[N, K] log-likelihoods -> [N, K] probabilities over each item's valid options."""
    return jax.nn.softmax(jnp.where(valid, scores, -jnp.inf), axis=-1)
