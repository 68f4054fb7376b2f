"""The batch engine: groups of token ids in (a prefix and the suffixes that continue it), float32 token
log-probabilities out, through bucketed, packed, jitted batches on one device or a mesh.

`BatchEngine` is immutable: it holds the model, split once into the graph and parameters the jitted kernel
takes, and how batches are made (rows, buckets, packing, vocabulary chunk, mesh). Texts, tokenization and
requests are the scorer's (`engine.scorer`); the packing plan is `engine.packing`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dcsjax.errors import InputError
from dcsjax.engine.logprobs import sharded_token_logprobs, token_logprobs_and_greedy
from dcsjax.engine.packing import (BUCKET_MULTIPLE, DEFAULT_BUCKETS, Group, PlannedBatch, bucket_for, make_batch,
                                   plan_batches)
from dcsjax.nn.attention import long_row_kernel, shares_prefixes, takes_blockwise
from dcsjax.nn.decoder import Decoder
from dcsjax.nn.sharding import batch_sharding


def _forward(graphdef, vocab_chunk: int, mesh, state, tokens, positions, segment_ids, attend_to, targets,
             scored=None):
    """([B, K] float32 log p(targets at column scored[b, k] | what row b's token there sees), [B, K] bool: the
    target is the argmax), junk where a column has no target. scored [B, K]: the columns to compute, K <= T
    (`packing.make_batch`); None: every column (K = T). Only those columns go through the vocabulary head. On a
    mesh, the parameters and rows arrive sharded and the vocabulary is scanned shard by shard."""
    model = nnx.merge(graphdef, state)
    hidden = model(tokens, positions, segment_ids, attend_to, mesh=mesh)  # [B, T, D]
    if scored is not None:
        hidden = jnp.take_along_axis(hidden, scored[..., None], axis=1)  # [B, K, D]
        targets = jnp.take_along_axis(targets, scored, axis=1)  # [B, K]
    cap = model.config.final_softcap
    if mesh is not None:
        return sharded_token_logprobs(hidden, model.output_embedding, targets, mesh, vocab_chunk, cap, with_greedy=True)
    return token_logprobs_and_greedy(hidden, model.output_embedding, targets, vocab_chunk, cap)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _batch_logprobs(graphdef, vocab_chunk: int, mesh, state, tokens, positions, segment_ids, attend_to, targets,
                    scored=None):
    """[B, K] float32 log-probs (`_forward`'s first half: XLA drops the unused flags)."""
    return _forward(graphdef, vocab_chunk, mesh, state, tokens, positions, segment_ids, attend_to, targets, scored)[0]


# lm-eval's `is_greedy` needs the flags too; a second jitted function, so the plain path's output is unchanged
_batch_logprobs_greedy = jax.jit(_forward, static_argnums=(0, 1, 2))


AUTO_ROWS = 128  # `--batch-size auto`'s most: past it a batch of short rows no longer runs faster
AUTO_BUCKET = 512  # the row length auto sizes for: multiple-choice prompts and options fall in buckets up to it
AUTO_HEADROOM = 0.75  # the share of the free memory a batch may take


def free_memory_bytes(device=None) -> int:
    """What the device has free: an accelerator's own count (`memory_stats`), else the host's available RAM."""
    import os

    device = device or jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def auto_batch_size(scorer, free_bytes: int | None = None) -> int:
    """`--batch-size auto`: the most rows of `AUTO_BUCKET` tokens (a multiple of the mesh's data devices, at most
    `AUTO_ROWS`) whose scoring step fits in `AUTO_HEADROOM` of the free memory. The step's memory is XLA's
    analysis of the engine's own kernel compiled at two heights: the temporaries and the rows' inputs grow
    linearly with the rows, the parameters stay. Scores do not depend on it (`tests/test_invariance.py`)."""
    free = free_memory_bytes() if free_bytes is None else free_bytes
    m = scorer.row_multiple
    sharding = batch_sharding(scorer.mesh) if scorer.mesh is not None else None

    def used(rows: int) -> int:
        spec = jax.ShapeDtypeStruct((rows, AUTO_BUCKET), np.int32, sharding=sharding)
        memory = _batch_logprobs.lower(scorer.graphdef, scorer.vocab_chunk, scorer.mesh, scorer.state,
                                       *[spec] * 5).compile().memory_analysis()
        return memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes

    one, two = used(m), used(2 * m)
    per_row = max(two - one, 1) / m
    fixed = one - per_row * m
    rows = int((AUTO_HEADROOM * free - fixed) // per_row) // m * m
    return max(m, min(rows, AUTO_ROWS // m * m))


def _cut_back(groups: list[Group], origin: list[tuple[int, int | None]], ran: list) -> list:
    """`BatchEngine.run_groups`' parts of groups that were run as whole sequences, one per suffix (`origin`), cut
    back into the groups' (prefix, suffixes) shape: a whole sequence's scores are its prefix's n - 1 (the
    first token conditions), the prediction of the suffix's first token (the context's last, which a group's
    suffix restarts with and does not score), then the suffix's."""
    out = [(None, [None] * len(g.suffixes)) for g in groups]
    for (g, j), (scores, suffix_scores) in zip(origin, ran):
        if j is None:
            out[g] = (scores, suffix_scores)
            continue
        n = len(groups[g].prefix)
        out[g][1][j] = scores[n:]
        if j == 0:
            out[g] = (scores[:max(n - 1, 0)], out[g][1])
    return out


@dataclass(frozen=True, kw_only=True)
class BatchSettings:
    """How batches are made (the engine's settings, which a `Scorer` takes as its own)."""
    name: str = "model"
    batch_size: int = 16  # rows per batch
    max_batch_tokens: int | None = 16384  # fewer rows in long buckets, so attention memory stays bounded
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    pack: bool = True
    vocab_chunk: int = 8192
    progress: bool = False
    mesh: object | None = None  # a jax Mesh with axes (data, model); the model's parameters already on it


@dataclass(frozen=True)
class BatchEngine(BatchSettings):
    """A model and how its batches are made. Immutable; derived once: the buckets cut at the model's context,
    the longest sequence (`max_length`), the graph and parameters the jitted kernel takes."""
    model: Decoder

    def __post_init__(self) -> None:
        set_ = object.__setattr__.__get__(self)  # frozen: derived once, here
        limit = self.model.config.max_context // BUCKET_MULTIPLE * BUCKET_MULTIPLE
        if self.buckets[-1] >= limit:  # the model's context is the last bucket
            set_("buckets", tuple(b for b in self.buckets if b < limit) + (limit,))
        if any(b % BUCKET_MULTIPLE or b <= 0 for b in self.buckets) or list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"buckets must be increasing multiples of {BUCKET_MULTIPLE}, not {self.buckets}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 row, not {self.batch_size}")
        set_("max_length", self.buckets[-1])  # tokens per sequence, document start included
        graphdef, state = nnx.split(self.model)  # what the jitted kernels take
        set_("graphdef", graphdef)
        set_("state", state)

    @property
    def row_multiple(self) -> int:
        """Rows of a batch are split over the mesh's data axis, so a batch holds a multiple of its size."""
        return self.mesh.shape["data"] if self.mesh is not None else 1

    def run_groups(self, groups: Sequence[Group], greedy: bool = False):
        """Per group: the prefix's token log-probs (NaN at its `context` tokens, which are not computed) and each
        suffix's (its first token is not scored); with greedy, a second list of the same shape holds whether each
        scored token is the argmax (False where not computed).

        Where the long-row kernel cannot share a prefix (splash, on TPU: `attention.shares_prefixes`), a group
        that would fill a long row is run as one whole sequence per suffix, and its parts cut back out."""
        if shares_prefixes(long_row_kernel(self.mesh)):
            return self._run_packed(groups, greedy)
        whole, origin = [], []  # origin[w] = (group, suffix; None: the group itself)
        for g, group in enumerate(groups):
            if group.suffixes and (group.room > self.max_length or takes_blockwise(bucket_for(group.room, self.buckets))):
                n = len(group.prefix)  # the prefix's own scores ride on the first suffix's sequence
                whole += [Group(group.prefix + suffix, context=min(group.context, n) if j == 0 else n)
                          for j, suffix in enumerate(group.suffixes)]
                origin += [(g, j) for j in range(len(group.suffixes))]
            else:
                whole.append(group)
                origin.append((g, None))
        ran = self._run_packed(whole, greedy)
        return tuple(_cut_back(groups, origin, r) for r in ran) if greedy else _cut_back(groups, origin, ran)

    def _run_packed(self, groups: list[Group], greedy: bool = False):
        """`_run_groups` as the packed rows hold them."""
        for i, group in enumerate(groups):
            if group.longest > self.max_length:
                raise InputError(
                    f"text {i} has {group.longest - 1} tokens; with the document-start token that exceeds the "
                    f"{self.max_length}-token limit of {self.name} (shorten it or split it)")
            if group.room > self.max_length:
                raise InputError(f"item {i}: its context and all its options together exceed {self.max_length} tokens")
        out = [(np.zeros(0, np.float32), [None] * len(g.suffixes)) for g in groups]
        flags = [(np.zeros(0, bool), [None] * len(g.suffixes)) for g in groups] if greedy else None
        kernel = _batch_logprobs_greedy if greedy else _batch_logprobs
        plan = self.plan([g.room for g in groups])
        rows_sharding = batch_sharding(self.mesh) if self.mesh is not None else None
        pending = None  # one batch in flight while the next is being prepared
        for bucket, rows, height in self._progress(plan, total=len(groups)):
            batch = make_batch(groups, bucket, rows, height)
            arrays = (batch.tokens, batch.positions, batch.segment_ids, batch.attend_to, batch.targets, batch.scored)
            arrays = jax.device_put(arrays, rows_sharding)  # None: the default device
            result = kernel(self.graphdef, self.vocab_chunk, self.mesh, self.state, *arrays)
            if pending is not None:
                self._collect_all(*pending, out, flags)
            pending = (batch, result)
        if pending is not None:
            self._collect_all(*pending, out, flags)
        return (out, flags) if greedy else out

    @classmethod
    def _collect_all(cls, batch, result, out, flags) -> None:
        if flags is None:
            cls._collect(batch, result, out)
        else:
            cls._collect(batch, result[0], out)
            cls._collect(batch, result[1], flags)

    def plan(self, rooms: list[int]) -> list[PlannedBatch]:
        """The batches that hold groups of these sizes (tokens each, document start included)."""
        return plan_batches(rooms, self.batch_size, self.buckets, self.pack, self.max_batch_tokens,
                            self.row_multiple)

    @staticmethod
    def _collect(batch, result, out) -> None:
        lp = np.asarray(result)
        lp = batch.spread(lp, False) if lp.dtype == bool else batch.spread(lp.astype(np.float32), np.nan)
        for s in batch.spans:
            scored = lp[s.row, s.start:s.start + s.length - 1]
            if s.part < 0:
                out[s.group] = (scored, out[s.group][1])
            else:
                out[s.group][1][s.part] = scored

    def _progress(self, plan, total: int):
        if not self.progress:
            yield from plan
            return
        from tqdm.auto import tqdm

        with tqdm(total=total, desc=f"scoring ({self.name})", unit="seq") as bar:
            for bucket, rows, height in plan:
                yield bucket, rows, height
                bar.update(sum(len(r) for r in rows))

    @staticmethod
    def compile_count() -> int:
        """How many shapes the batch kernel has been compiled for in this process."""
        return _batch_logprobs._cache_size()
