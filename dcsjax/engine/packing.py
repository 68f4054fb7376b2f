"""Static-shape batches: sequences placed into rows of a few bucketed lengths, several to a row.

Every full batch of one bucket has the shape [batch_size, bucket]; a bucket's short last batch takes
fewer rows from a fixed halving ladder, so a process compiles a few shapes per bucket, whatever the data.
A row holds several sequences kept apart by segment ids (0 marks padding); positions restart at
0 in each sequence, so a packed sequence sees exactly what it would see alone.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# Why rows are multiples of BUCKET_MULTIPLE tokens: a sequence's float32 scores are then bit-identical at any
# batch size, packed or alone, at any offset in its row, in any bucket (tests/test_invariance.py checks this
# bit for bit against a one-text-at-a-time reference). Offsets need no grid: every sum over a row's keys is
# a matmul (decoder.attention), and XLA's matmuls add in the same order wherever a row sits.
BUCKET_MULTIPLE = 64
# Every multiple of 64 up to 512, where most statements, questions and options fall (a 150-token row in a
# 256 bucket wastes 40% of its slots; measured in bench/throughput.py: 100-250-token passages went from
# 576 to 826 tokens/s on SmolLM2), then 1024 and every multiple of 512 up to 4096 (long passages: a 2,100-token
# passage in a 4,096-token row computed twice its work; bench/passages.py), then doublings, so compiles stay
# few. Every bucket from 1024 on is at most twice the one before, so its rows hold one sequence each (a group
# lands in the smallest bucket that holds it; two would not fit), which the blockwise attention relies on.
DEFAULT_BUCKETS = (64, 128, 192, 256, 320, 384, 448, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 8192, 16384,
                   32768)


@dataclass(frozen=True)
class Group:
    """A prefix, and suffixes that each continue it: a suffix sees the prefix and itself, not the other
    suffixes, and its positions continue from the prefix's end. The prefix is computed once for all of
    them (a shared question). A plain sequence is a group without suffixes.

    context: the prefix's first `context` tokens are conditioning only: the predictions made at them are not
    computed (NaN in the result). A shared question's prefix is all context (`Scorer.option_logprobs`): the
    vocabulary head then runs on the options' tokens only, which for a long question and short options is most
    of a forward pass's work saved (Gemma 3's 262k-row head costs more than its blocks)."""

    prefix: tuple[int, ...]
    suffixes: tuple[tuple[int, ...], ...] = ()
    context: int = 0

    @property
    def room(self) -> int:
        return len(self.prefix) + sum(len(s) for s in self.suffixes)

    @property
    def longest(self) -> int:
        """The longest sequence it stands for: prefix + its longest suffix."""
        return len(self.prefix) + max((len(s) for s in self.suffixes), default=0)


@dataclass(frozen=True)
class Span:
    group: int  # index of the group in the caller's list
    part: int  # -1: the prefix; j: suffix j
    row: int
    start: int  # first token's column
    length: int


@dataclass(frozen=True)
class Batch:
    tokens: np.ndarray  # [B, T] int32
    positions: np.ndarray  # [B, T] int32
    segment_ids: np.ndarray  # [B, T] int32, 0 = padding
    attend_to: np.ndarray  # [B, T] int32: the prefix segment a suffix token may also see (0: none)
    targets: np.ndarray  # [B, T] int32: the next token of the same part (0 where there is none)
    spans: tuple[Span, ...]
    scored: np.ndarray  # [B, K] int32: the columns whose predictions are computed, K <= T (`scored_width`)
    wanted: np.ndarray  # [B, K] bool: which of them a caller reads (False: padding of `scored`)

    def spread(self, values: np.ndarray, fill) -> np.ndarray:
        """[B, K] values at `scored` -> [B, T], `fill` where nothing was wanted."""
        out = np.full(self.targets.shape, fill, values.dtype)
        rows = np.broadcast_to(np.arange(len(out))[:, None], self.scored.shape)
        out[rows[self.wanted], self.scored[self.wanted]] = values[self.wanted]
        return out


def round_up(length: int, multiple: int = BUCKET_MULTIPLE) -> int:
    """length rounded up to a multiple of BUCKET_MULTIPLE: the row lengths of every padded batch that is not
    packed into the buckets (training prompts), so they too come in few shapes, each one compile. A row long
    enough for the blockwise attention path (BLOCKWISE_FROM tokens on) is a whole number of its tiles, as the
    buckets from 1024 on are (MMLU's longest prompts run past 1,024 tokens)."""
    from dcsjax.nn.attention import BLOCK, BLOCKWISE_FROM  # read per call: a bench may move the threshold

    rounded = -(-int(length) // multiple) * multiple
    return rounded if rounded < BLOCKWISE_FROM else -(-rounded // BLOCK) * BLOCK


def bucket_for(length: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if length <= b:
            return b
    raise ValueError(f"length {length} exceeds the largest bucket {buckets[-1]}")


def pack_rows(rooms: list[int], indices: list[int], row_len: int, pack: bool) -> list[list[int]]:
    """Rows (lists of group indices) of at most row_len tokens: best fit, largest first."""
    order = sorted(indices, key=lambda i: (-rooms[i], i))
    if not pack:
        return [[i] for i in order]
    rows: list[list[int]] = []
    free: dict[int, list[int]] = defaultdict(list)  # remaining capacity -> rows with exactly that room
    for i in order:
        n = rooms[i]
        room = next((c for c in range(n, row_len + 1) if free[c]), None)
        if room is None:
            rows.append([])
            row, room = len(rows) - 1, row_len
        else:
            row = free[room].pop()
        rows[row].append(i)
        if room - n > 0:
            free[room - n].append(row)
    return rows


class PlannedBatch(NamedTuple):
    bucket: int  # tokens per row
    rows: list[list[int]]  # group indices, a list per row
    height: int  # rows of the batch, padding rows included


def plan_batches(rooms: list[int], batch_size: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS,
                 pack: bool = True, max_batch_tokens: int | None = None,
                 row_multiple: int = 1) -> list[PlannedBatch]:
    """The batches that hold these groups, shortest bucket first.

    Long buckets get fewer rows (at most max_batch_tokens per batch, at least one row), so memory stays
    bounded. A bucket's last batch, when it is short, takes the fewest rows of the halving ladder
    (batch_heights) that hold it rather than a full batch of padding rows: the bench's 512 statements make
    99 rows of 64 tokens, and a full last batch of 16 rows held 3 (13% of all slots computed for nothing).
    Heights come from a fixed ladder, so a bucket compiles for at most len(batch_heights(...)) shapes in a
    process, whatever the data.
    """
    by_bucket: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(rooms):
        by_bucket[bucket_for(n, buckets)].append(i)
    plan = []
    for bucket in sorted(by_bucket):
        rows = pack_rows(rooms, by_bucket[bucket], bucket, pack)
        heights = batch_heights(bucket, batch_size, max_batch_tokens, row_multiple)
        for s in range(0, len(rows), heights[0]):
            chunk = rows[s:s + heights[0]]
            plan.append(PlannedBatch(bucket, chunk, min(h for h in heights if h >= len(chunk))))
    return plan


def rows_per_batch(bucket: int, batch_size: int, max_batch_tokens: int | None, multiple: int = 1) -> int:
    """Rows of a full batch in `bucket`: batch_size, fewer in long buckets, rounded up to a multiple of
    `multiple` (the mesh's data-axis size, which splits the rows)."""
    rows = batch_size if max_batch_tokens is None else max(1, min(batch_size, max_batch_tokens // bucket))
    return _round_up(rows, multiple)


def batch_heights(bucket: int, batch_size: int, max_batch_tokens: int | None, multiple: int = 1) -> tuple[int, ...]:
    """The row counts a batch in `bucket` may have, largest first: the full batch, then halvings (rounded up
    to `multiple`), e.g. 16, 8, 4, 2, 1."""
    heights = [rows_per_batch(bucket, batch_size, max_batch_tokens, multiple)]
    while heights[-1] > multiple:
        heights.append(_round_up(-(-heights[-1] // 2), multiple))
    return tuple(heights)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def scored_width(most: int, bucket: int) -> int:
    """K, the columns a batch computes predictions at, from the most that one of its rows wants: rounded up to a
    multiple of BUCKET_MULTIPLE (of the log-prob kernel's token block past it), so batches come in few shapes;
    the whole row where that would not be shorter."""
    from dcsjax.engine.logprobs import TOKEN_BLOCK

    step = BUCKET_MULTIPLE if most <= TOKEN_BLOCK else TOKEN_BLOCK
    return min(bucket, max(step, -(-most // step) * step))


def make_batch(groups: list[Group], bucket: int, rows: list[list[int]], batch_rows: int) -> Batch:
    shape = (batch_rows, bucket)
    tokens, positions, segments, attend_to, targets = (np.zeros(shape, np.int32) for _ in range(5))
    wanted_at = np.zeros(shape, bool)  # a prediction a caller reads
    spans = []
    for r, row in enumerate(rows):
        start, segment = 0, 0
        for g in row:
            group = groups[g]
            prefix_segment = 0
            for part, seq in [(-1, group.prefix), *enumerate(group.suffixes)]:
                n = len(seq)
                if n == 0:
                    continue
                segment += 1
                end = start + n
                tokens[r, start:end] = seq
                offset = len(group.prefix) if part >= 0 else 0
                positions[r, start:end] = offset + np.arange(n)
                segments[r, start:end] = segment
                targets[r, start:end - 1] = seq[1:]
                wanted_at[r, start + (group.context if part == -1 else 0):end - 1] = True
                if part == -1:
                    prefix_segment = segment
                else:
                    attend_to[r, start:end] = prefix_segment
                spans.append(Span(g, part, r, start, n))
                start = end
    counts = wanted_at.sum(axis=1)
    # Only a batch that holds context gathers: plain sequences want nearly every column, and would only add shapes
    has_context = any(groups[g].context for row in rows for g in row)
    width = scored_width(int(counts.max(initial=0)), bucket) if has_context else bucket
    if width == bucket:  # every column: nothing to gather
        scored, wanted = np.broadcast_to(np.arange(bucket, dtype=np.int32), shape).copy(), wanted_at
    else:  # each row's wanted columns first, in order (a stable sort of "not wanted"), then padding
        order = np.argsort(~wanted_at, axis=1, kind="stable")[:, :width].astype(np.int32)
        scored, wanted = order, np.arange(width)[None, :] < counts[:, None]
    return Batch(tokens, positions, segments, attend_to, targets, tuple(spans), scored, wanted)
