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


PACKED_ROW_MULTIPLE = 4  # packed batches' rows come in multiples of this: few shapes, each one compile


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

    def batch(self, index) -> "LetterBatch":
        """The arrays one forward pass reads for items `index` (any shape [..., B]), one prompt per row from
        column 0, right-padded to the items' `cut_length` t: hidden [..., B, t, D], zero past each prompt (scoring
        runs items sorted by length, so there is little padding to pack away)."""
        index = np.asarray(index)
        t = cut_length(self.length[index])
        at = np.arange(t, dtype=np.int32)
        length = self.length[index]
        inside = at < length[..., None]  # [..., B, t]
        rows = np.where(inside, self.offset[index][..., None] + at, 0)
        hidden = np.where(inside[..., None], self.hidden[rows], 0.0).astype(np.float32)
        positions = np.broadcast_to(at, inside.shape).astype(np.int32)
        row = np.broadcast_to(np.arange(index.shape[-1], dtype=np.int32), index.shape)
        return LetterBatch(hidden, positions, inside.astype(np.int32), row.copy(), (length - 1).astype(np.int32),
                           *self._targets(index))

    def packed(self, index, row_multiple: int = PACKED_ROW_MULTIPLE, row_length: int | None = None) -> "LetterBatch":
        """The same items' prompts packed several to a row of t tokens (`row_length`, by default the items'
        `cut_length`: their longest prompt, rounded up): the training step's layout, since a random batch laid out
        one prompt a row is mostly padding (MMLU's prompts run from under a hundred tokens to over 1,500).
        index [..., B]; every micro-batch (the leading axes) gets the same R rows, the most any of them needs
        rounded up to `row_multiple` (few shapes, each one compile; a multiple of a mesh's data devices). Each
        prompt keeps its own positions from 0 and a segment of its own, which the attention masks keep apart, so
        every item's logits are those of `batch` (tests/test_training.py)."""
        index = np.asarray(index)
        micro = index.reshape(-1, index.shape[-1])  # [M, B]
        t = row_length or cut_length(self.length[index])
        layouts = [first_fit(self.length[items], t) for items in micro]  # per micro-batch: (row, column) per item
        most = max(int(rows.max()) + 1 for rows, _ in layouts)
        r = -(-most // row_multiple) * row_multiple
        m, b = micro.shape
        hidden = np.zeros((m, r, t, self.hidden.shape[1]), np.float32)
        positions, segments = np.zeros((m, r, t), np.int32), np.zeros((m, r, t), np.int32)
        row, last = np.zeros((m, b), np.int32), np.zeros((m, b), np.int32)
        for k, (items, (rows, columns)) in enumerate(zip(micro, layouts)):
            for j, (i, r_j, c_j) in enumerate(zip(items, rows, columns)):
                n = int(self.length[i])
                hidden[k, r_j, c_j:c_j + n] = self.hidden[self.offset[i]:self.offset[i] + n]
                positions[k, r_j, c_j:c_j + n] = np.arange(n)
                segments[k, r_j, c_j:c_j + n] = j + 1  # distinct within the row (0 is padding)
                row[k, j], last[k, j] = r_j, c_j + n - 1
        shape = index.shape[:-1]
        return LetterBatch(hidden.reshape(*shape, r, t, -1), positions.reshape(*shape, r, t),
                           segments.reshape(*shape, r, t), row.reshape(index.shape), last.reshape(index.shape),
                           *self._targets(index))

    def _targets(self, index) -> tuple[np.ndarray, ...]:
        return tuple(x[index] for x in (self.letters, self.correct, self.idk, self.valid))


class LetterBatch(NamedTuple):
    """What one forward pass reads for B items: their prompts' residual streams laid out in R rows of T tokens
    (one prompt a row: `LetterFeatures.batch`; several: `LetterFeatures.packed`), where each item's prompt ends,
    and its options. Leading axes [...] (micro-batches) on every field."""
    hidden: np.ndarray  # [..., R, T, D] float32, zero on padding
    positions: np.ndarray  # [..., R, T] int32: each prompt's own positions, from 0
    segments: np.ndarray  # [..., R, T] int32: the prompts of a row numbered from 1; 0 padding
    row: np.ndarray  # [..., B] int32: the row that holds item b's prompt
    last: np.ndarray  # [..., B] int32: the column of its last token, whose next-token logits are read
    letters: np.ndarray  # [..., B, K] int32
    correct: np.ndarray  # [..., B, K] bool
    idk: np.ndarray  # [..., B, K] bool
    valid: np.ndarray  # [..., B, K] bool

    @property
    def inputs(self) -> tuple:
        """What `train.letter_logits` reads after the parameters: hidden ... letters."""
        return tuple(self[:6])

    @property
    def targets(self) -> tuple:
        """What the loss reads besides the logits: correct, idk, valid."""
        return tuple(self[6:])


def first_fit(length: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts of `length` [B] tokens placed into rows of t, longest first, each in the first row with room
    (first-fit decreasing: within 22% of the fewest rows) -> (row [B], column [B]). Deterministic."""
    row, column, used = np.zeros(len(length), np.int32), np.zeros(len(length), np.int32), []
    for i in np.argsort(-length, kind="stable"):
        n = int(length[i])
        r = next((k for k, filled in enumerate(used) if filled + n <= t), len(used))
        if r == len(used):
            used.append(0)
        row[i], column[i] = r, used[r]
        used[r] += n
    return row, column


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
