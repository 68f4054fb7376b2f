"""Batch planning: every sequence placed once, on the alignment grid, inside its row, never overlapping."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dcsjax.kernels.packing import ALIGN, make_batch, plan_batches, rows_per_batch

BUCKETS = (64, 128, 256)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 256), min_size=1, max_size=60), batch_size=st.integers(1, 9),
       pack=st.booleans(), max_tokens=st.sampled_from([None, 256, 1024]))
def test_every_sequence_is_placed_once_and_alone(lengths, batch_size, pack, max_tokens):
    rng = np.random.default_rng(len(lengths))
    seqs = [list(rng.integers(1, 1000, n)) for n in lengths]
    seen = []
    for bucket, rows in plan_batches(lengths, batch_size, BUCKETS, pack, max_tokens):
        size = rows_per_batch(bucket, batch_size, max_tokens)
        assert 1 <= len(rows) <= size
        batch = make_batch(seqs, bucket, rows, size)
        assert batch.tokens.shape == (size, bucket)
        occupied = np.zeros((size, bucket), bool)
        for p in batch.placements:
            seq = seqs[p.seq]
            assert p.start % ALIGN == 0 and p.start + p.length <= bucket
            assert not occupied[p.row, p.start:p.start + p.length].any()
            occupied[p.row, p.start:p.start + p.length] = True
            assert list(batch.tokens[p.row, p.start:p.start + p.length]) == seq
            assert list(batch.positions[p.row, p.start:p.start + p.length]) == list(range(len(seq)))
            assert list(batch.targets[p.row, p.start:p.start + p.length - 1]) == seq[1:]
            segment = batch.segment_ids[p.row, p.start]
            assert segment > 0 and (batch.segment_ids[p.row, p.start:p.start + p.length] == segment).all()
            # the smallest bucket that holds it
            assert bucket == min(b for b in BUCKETS if b >= len(seq))
            seen.append(p.seq)
        if not pack:
            assert len({p.row for p in batch.placements}) == len(batch.placements)
        assert (batch.segment_ids[~occupied] == 0).all()
    assert sorted(seen) == list(range(len(lengths)))


def test_packing_fills_rows():
    lengths = [20] * 30  # 24 tokens each on the grid: 5 per 128-token row
    plan = plan_batches(lengths, 16, (128,), pack=True)
    rows = [row for _, batch in plan for row in batch]
    assert len(rows) == 6 and all(len(r) == 5 for r in rows)
    unpacked = plan_batches(lengths, 16, (128,), pack=False)
    assert sum(len(batch) for _, batch in unpacked) == 30
