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
from dcsjax.eval.protocols.stated import instruction, penalty


class LetterFeatures(NamedTuple):
    """N items, up to K options (IDK included). The residual stream is kept ragged, each prompt's rows one
    after another, not padded to the longest prompt: MMLU's prompts run from under a hundred tokens to over
    1,500, so a padded [N, T_max, D] array would be mostly padding (several GB for train-abstain's default data).
    `batch` pads the rows a step reads, to that batch's own longest prompt."""
    hidden: np.ndarray  # [S, D] float32: residual after the frozen layers; S = sum(length)
    offset: np.ndarray  # [N] int64: item i's prompt is hidden[offset[i]:offset[i] + length[i]]
    length: np.ndarray  # [N] int32: prompt tokens (document start included); the last one is read out
    letters: np.ndarray  # [N, K] int32: each option letter's token id (0 where padded)
    correct: np.ndarray  # [N, K] bool (on an unanswerable item: the IDK option only)
    idk: np.ndarray  # [N, K] bool
    valid: np.ndarray  # [N, K] bool
    lw: np.ndarray  # [N] float32: the cost of a wrong answer that each prompt states (lc = 1)

    def __len__(self) -> int:
        return len(self.length)

    def batch(self, index) -> tuple[np.ndarray, ...]:
        """The arrays one step reads for items `index` (any shape [...]): hidden [..., t, D] zero past each
        prompt, t = `cut_length` of these items; length [...]; letters, correct, idk, valid [..., K]."""
        index = np.asarray(index)
        t = cut_length(self.length[index])
        at = np.arange(t)
        inside = at < self.length[index][..., None]  # [..., t]
        rows = np.where(inside, self.offset[index][..., None] + at, 0)
        hidden = np.where(inside[..., None], self.hidden[rows], 0.0).astype(np.float32)
        return (hidden, *(x[index] for x in (self.length, self.letters, self.correct, self.idk, self.valid)))


def cut_length(length: np.ndarray) -> int:
    """The prompt length a batch is run at: its longest prompt rounded up (`packing.round_up`: few shapes,
    each one compile, little padding). Positions past a prompt are padding that no prompt token attends to,
    so their values (zero here) change no logit."""
    return round_up(int(np.max(length)))


def letter_prompts(scorer, items: Sequence[Item], lc: float = 1.0, lw: float = 1.0,
                   stated: Sequence[float] | None = None):
    """Per item: (prompt token ids with the document start, [letter token id per option], idk index).
    stated: per item, the target t that its prompt states (the stated-risk protocol's letters prompt,
    `stated.instruction`) in place of the cost line at (lc, lw)."""
    out = []
    for k, item in enumerate(items):
        if stated is None:
            context, letters, idk = letters_context(scorer, item, lc, lw)
        else:
            context, letters, idk = letters_context(scorer, item, 1.0, penalty(stated[k]), instruction(stated[k]))
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
                    stated: Sequence[float] | None = None, batch_size: int = 8, progress=None) -> LetterFeatures:
    """The residual after the first (L - top_layers) layers for every item's letters prompt (at (lc, lw), or
    stating each item's target t from `stated`: the stated-risk prompt). Prompts run shortest first, each
    batch cut to its longest prompt (`cut_length`): one compile per length, and no prompt pays for the
    longest one's padding."""
    if stated is not None and len(stated) != len(items):
        raise InputError(f"{len(stated)} stated targets for {len(items)} items")
    c = scorer.config
    if not 1 <= top_layers <= c.num_layers:
        raise InputError(f"top_layers must lie in 1..{c.num_layers}, not {top_layers}")
    prompts = letter_prompts(scorer, items, lc, lw, stated)
    n, k_max = len(items), max(len(letters) for _, letters, _ in prompts)
    length = np.array([len(ids) for ids, _, _ in prompts], np.int32)
    offset = np.concatenate([[0], np.cumsum(length[:-1], dtype=np.int64)]).astype(np.int64)
    letters = np.zeros((n, k_max), np.int32)
    correct, idk, valid = option_masks([len(x) for _, x, _ in prompts], [item.correct for item in items],
                                       [idk_index for _, _, idk_index in prompts], k_max)
    for i, (_, letter_ids, _) in enumerate(prompts):
        letters[i, :len(letter_ids)] = letter_ids
    graphdef, state = nnx.split(scorer.model)
    hidden = np.zeros((int(length.sum()), c.hidden_size), np.float32)
    by_length = np.argsort(length, kind="stable")
    for start in range(0, n, batch_size):
        rows = by_length[start:start + batch_size]
        padded = np.resize(rows, batch_size)  # a full last batch (repeats rows): no second compile
        t = cut_length(length[padded])
        tokens = np.zeros((batch_size, t), np.int32)
        for r, i in enumerate(padded):
            tokens[r, :length[i]] = prompts[i][0]
        out = np.asarray(_frozen_residual(graphdef, state, c.num_layers - top_layers, tokens, length[padded]))
        for r, i in enumerate(rows):
            hidden[offset[i]:offset[i] + length[i]] = out[r, :length[i]]
        if progress is not None:
            progress(len(rows))
    stated_lw = np.full(n, lw / lc) if stated is None else np.array([penalty(t) for t in stated])
    return LetterFeatures(hidden, offset, length, letters, correct, idk, valid, stated_lw.astype(np.float32))


def save_features(features: LetterFeatures, path) -> None:
    np.savez(path, **features._asdict())


def load_features(path) -> LetterFeatures:
    with np.load(path) as f:
        return LetterFeatures(**{name: f[name] for name in LetterFeatures._fields})
