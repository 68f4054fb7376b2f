"""Batch planning: every part placed once, inside its row, never overlapping;
suffixes continue their prefix's positions and see its segment."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dcsjax.engine.packing import Group, batch_heights, make_batch, plan_batches, rows_per_batch

BUCKETS = (64, 128, 256)


@settings(max_examples=200, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 120), st.lists(st.integers(1, 30), max_size=4)), min_size=1, max_size=40),
       batch_size=st.integers(1, 9), pack=st.booleans(), max_tokens=st.sampled_from([None, 256, 1024]))
def test_every_part_is_placed_once_and_alone(shapes, batch_size, pack, max_tokens):
    rng = np.random.default_rng(len(shapes))
    groups = [Group(tuple(rng.integers(1, 1000, p)), tuple(tuple(rng.integers(1, 1000, s)) for s in suffixes),
                    context=int(rng.integers(0, p + 1)))  # the prefix's first `context` predictions not wanted
              for p, suffixes in shapes]
    groups = [g for g in groups if g.room <= BUCKETS[-1]]
    if not groups:
        return
    seen, plan = [], plan_batches([g.room for g in groups], batch_size, BUCKETS, pack, max_tokens)
    for i, (bucket, rows, size) in enumerate(plan):
        full = rows_per_batch(bucket, batch_size, max_tokens)
        # full batches, except a bucket's last, which takes the smallest height of the ladder that holds it
        last_of_bucket = i + 1 == len(plan) or plan[i + 1].bucket != bucket
        assert size == (min(h for h in batch_heights(bucket, batch_size, max_tokens) if h >= len(rows))
                        if last_of_bucket else full)
        assert 1 <= len(rows) <= size and (len(rows) == full or last_of_bucket)
        batch = make_batch(groups, bucket, rows, size)
        assert batch.tokens.shape == (size, bucket)
        occupied = np.zeros((size, bucket), bool)
        # the columns computed: every wanted prediction once, in the fewest multiples of 64 (or the whole row)
        width = batch.scored.shape[1]
        assert batch.scored.shape == batch.wanted.shape == (size, width) and width <= bucket and width % 64 == 0
        wanted = np.zeros((size, bucket), bool)
        for s in batch.spans:
            skip = groups[s.group].context if s.part < 0 else 0
            wanted[s.row, s.start + skip:s.start + s.length - 1] = True
        computed = batch.spread(np.ones(batch.scored.shape, bool), False)
        assert (computed == wanted).all()
        has_context = any(groups[g].context for row in rows for g in row)
        assert width == (min(bucket, max(64, -(-wanted.sum(1).max() // 64) * 64)) if has_context else bucket)
        for r in range(size):
            assert len(set(batch.scored[r][batch.wanted[r]])) == batch.wanted[r].sum()
        prefix_segment = {}
        for s in batch.spans:
            group = groups[s.group]
            seq = list(group.prefix if s.part < 0 else group.suffixes[s.part])
            cols = slice(s.start, s.start + s.length)
            assert s.start + s.length <= bucket and s.length == len(seq)
            assert not occupied[s.row, cols].any()
            occupied[s.row, cols] = True
            assert list(batch.tokens[s.row, cols]) == seq
            first = 0 if s.part < 0 else len(group.prefix)
            assert list(batch.positions[s.row, cols]) == list(range(first, first + len(seq)))
            assert list(batch.targets[s.row, s.start:s.start + s.length - 1]) == seq[1:]
            segment = batch.segment_ids[s.row, s.start]
            assert segment > 0 and (batch.segment_ids[s.row, cols] == segment).all()
            if s.part < 0:
                prefix_segment[s.group] = segment
                assert (batch.attend_to[s.row, cols] == 0).all()
            else:
                assert (batch.attend_to[s.row, cols] == prefix_segment[s.group]).all()
            assert bucket == min(b for b in BUCKETS if b >= group.room)
            seen.append((s.group, s.part))
        if not pack:
            assert len({s.row for s in batch.spans}) == len({s.group for s in batch.spans})
        assert (batch.segment_ids[~occupied] == 0).all()
    assert sorted(seen) == sorted((g, p) for g, group in enumerate(groups) for p in range(-1, len(group.suffixes)))


def test_packing_fills_rows():
    rooms = [Group(tuple(range(21))).room] * 30  # 21 tokens each, packed end to end: 6 per 128-token row
    plan = plan_batches(rooms, 16, (128,), pack=True)
    rows = [row for batch in plan for row in batch.rows]
    assert len(rows) == 5 and all(len(r) == 6 for r in rows)
    assert [batch.height for batch in plan] == [8]  # 5 rows: the ladder's 8, not a batch of 16
    unpacked = plan_batches(rooms, 16, (128,), pack=False)
    assert [len(batch.rows) for batch in unpacked] == [16, 14] and [batch.height for batch in unpacked] == [16, 16]


def test_padded_lengths_are_few_and_whole_tiles_on_the_blockwise_path():
    """Training prompts are padded, not packed: to a multiple of 64 tokens, and from 1,024 on (the blockwise
    attention path) to whole 512-token tiles, as the buckets are (an MMLU prompt of 1,088 tokens once failed)."""
    from dcsjax.engine.packing import DEFAULT_BUCKETS, round_up

    assert [round_up(n) for n in (1, 64, 65, 150, 1000, 1024)] == [64, 64, 128, 192, 1024, 1024]
    assert [round_up(n) for n in (1025, 1088, 1536, 1537, 2100)] == [1536, 1536, 1536, 2048, 2560]
    assert all(round_up(b) == b for b in DEFAULT_BUCKETS)
