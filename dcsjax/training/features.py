"""The frozen part of a fine-tuned model, computed once: each item's letters prompt through the lower
layers, kept as the residual stream the trainable top layers start from.

Fine-tuning only the top `k` layers (and the final norm) makes the lower layers a fixed function of the
prompt, so their output is cached: a training step then costs k layers instead of all of them, which is
what lets a run of hundreds of steps fit two CPU cores. The readout is the letters elicitation of
`protocols.dcs.run_dcs_letters` exactly (same prompt, same tokens, the next-token logits of the
option letters at the prompt's last token), so the trained model's scores are the ones `dcsjax eval`
gives it (tests/test_training.py checks this).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dcsjax.data.items import Item
from dcsjax.errors import InputError
from dcsjax.engine.packing import round_up
from dcsjax.metrics.calibration import option_masks
from dcsjax.nn.decoder import right_padded
from dcsjax.eval.protocols.dcs import letters_context


class LetterFeatures(NamedTuple):
    """N items, prompts padded to T tokens, up to K options (IDK included)."""
    hidden: np.ndarray  # [N, T, D] float32: residual stream after the frozen layers
    length: np.ndarray  # [N] int32: prompt tokens (document start included); the last one is read out
    letters: np.ndarray  # [N, K] int32: each option letter's token id (0 where padded)
    correct: np.ndarray  # [N, K] bool (on an unanswerable item: the IDK option only)
    idk: np.ndarray  # [N, K] bool
    valid: np.ndarray  # [N, K] bool

    def take(self, index) -> "LetterFeatures":
        return LetterFeatures(*(x[index] for x in self))

    def __len__(self) -> int:
        return len(self.length)


def letter_prompts(scorer, items: Sequence[Item], lc: float = 1.0, lw: float = 1.0):
    """Per item: (prompt token ids with the document start, [letter token id per option], idk index)."""
    out = []
    for item in items:
        context, letters, idk = letters_context(scorer, item, lc, lw)
        ids, letter_ids = None, []
        for j, letter in enumerate(letters):
            ctx, cont = scorer.split_encode(context, letter, j)
            if len(cont) != 1:
                raise InputError(f"item {item.id}: option letter {letter!r} is {len(cont)} tokens, not one")
            ids = ids or [scorer.document_start_id, *ctx]
            letter_ids.append(cont[0])
        out.append((ids, letter_ids, idk))
    return out


@partial(jax.jit, static_argnums=(0, 2))
def _frozen_residual(graphdef, state, num_layers: int, tokens, length):
    model = nnx.merge(graphdef, state)
    positions, segments = right_padded(length, tokens.shape[1])
    return model.residual(tokens, positions, segments, num_layers).astype(jnp.float32)


def letter_features(scorer, items: Sequence[Item], top_layers: int, *, lc: float = 1.0, lw: float = 1.0,
                    batch_size: int = 8, progress=None) -> LetterFeatures:
    """The residual after the first (L - top_layers) layers for every item's letters prompt."""
    c = scorer.config
    if not 1 <= top_layers <= c.num_layers:
        raise InputError(f"top_layers must lie in 1..{c.num_layers}, not {top_layers}")
    prompts = letter_prompts(scorer, items, lc, lw)
    n, k_max = len(items), max(len(letters) for _, letters, _ in prompts)
    t = round_up(max(len(ids) for ids, _, _ in prompts))  # one padded length: one compile
    tokens = np.zeros((n, t), np.int32)
    length = np.array([len(ids) for ids, _, _ in prompts], np.int32)
    letters = np.zeros((n, k_max), np.int32)
    correct, idk, valid = option_masks([len(x) for _, x, _ in prompts], [item.correct for item in items],
                                       [idk_index for _, _, idk_index in prompts], k_max)
    for i, (ids, letter_ids, _) in enumerate(prompts):
        tokens[i, :len(ids)] = ids
        letters[i, :len(letter_ids)] = letter_ids
    graphdef, state = nnx.split(scorer.model)
    hidden = np.zeros((n, t, c.hidden_size), np.float32)
    for start in range(0, n, batch_size):
        rows = np.arange(start, min(start + batch_size, n))
        padded = np.resize(rows, batch_size)  # a full last batch (repeats rows): no second compile
        out = _frozen_residual(graphdef, state, c.num_layers - top_layers, tokens[padded], length[padded])
        hidden[rows] = np.asarray(out)[: len(rows)]
        if progress is not None:
            progress(len(rows))
    return LetterFeatures(hidden, length, letters, correct, idk, valid)


def save_features(features: LetterFeatures, path) -> None:
    np.savez(path, **features._asdict())


def load_features(path) -> LetterFeatures:
    with np.load(path) as f:
        return LetterFeatures(**{name: f[name] for name in LetterFeatures._fields})
