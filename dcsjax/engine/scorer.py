"""The scorer: texts in, float32 token log-probabilities out, through bucketed, packed, jitted batches.

Every text is scored in full, conditioned on the token that starts a document in the model's
pretraining (`document_start_id`): the tokenizer's BOS where it adds one by default (Gemma 3), else the
token the model card names (SmolLM2: `<|endoftext|>`). The first real token is thus scored too.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Sequence

import jax
import numpy as np
from flax import nnx

from dcsjax.errors import ConfigError, InputError
from dcsjax.engine.logprobs import reduce_logprobs, sharded_token_logprobs, token_logprobs_and_greedy
from dcsjax.engine.packing import (BUCKET_MULTIPLE, DEFAULT_BUCKETS, Group, PlannedBatch, bucket_for, make_batch,
                                   plan_batches)
from dcsjax.nn.attention import long_row_kernel, shares_prefixes, takes_blockwise
from dcsjax.nn.decoder import Decoder
from dcsjax.nn.sharding import batch_sharding


def _forward(graphdef, vocab_chunk: int, mesh, state, tokens, positions, segment_ids, attend_to, targets):
    """([B, T] float32 log p(targets[b, t] | what row b's token t sees), [B, T] bool: the target is the
    argmax), junk where t has no target. On a mesh, the parameters and rows arrive sharded and the
    vocabulary is scanned shard by shard."""
    model = nnx.merge(graphdef, state)
    hidden = model(tokens, positions, segment_ids, attend_to, mesh=mesh)  # [B, T, D]
    cap = model.config.final_softcap
    if mesh is not None:
        return sharded_token_logprobs(hidden, model.output_embedding, targets, mesh, vocab_chunk, cap, with_greedy=True)
    return token_logprobs_and_greedy(hidden, model.output_embedding, targets, vocab_chunk, cap)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _batch_logprobs(graphdef, vocab_chunk: int, mesh, state, tokens, positions, segment_ids, attend_to, targets):
    """[B, T] float32 log-probs (`_forward`'s first half: XLA drops the unused flags)."""
    return _forward(graphdef, vocab_chunk, mesh, state, tokens, positions, segment_ids, attend_to, targets)[0]


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


def auto_batch_size(scorer: "Scorer", free_bytes: int | None = None) -> int:
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
    """`Scorer._run_groups`' parts of groups that were run as whole sequences, one per suffix (`origin`), cut
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


@dataclass(frozen=True)
class Scorer:
    """A loaded model and how it is run: encoding, the request builders (texts, continuations, options,
    token ids) and the jitted engine underneath. Immutable: a scorer with other settings is
    `scorer.replace(batch_size=...)`, which shares the model, its parameters and every compiled program."""
    model: Decoder
    tokenizer: object  # a transformers tokenizer
    document_start_id: int
    name: str = "model"
    card: object | None = None  # the ModelCard, when loaded by name
    batch_size: int = 16  # rows per batch
    max_batch_tokens: int | None = 16384  # fewer rows in long buckets, so attention memory stays bounded
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    pack: bool = True
    vocab_chunk: int = 8192
    progress: bool = False
    mesh: object | None = None  # a jax Mesh with axes (data, model); the model's parameters already on it
    # what identifies the weights and how they were loaded (file checksum, card, dtype, document start):
    # part of every result record's fingerprint (`dcsjax.eval.results`)
    model_fingerprint: dict | None = None
    variant: str | None = None  # "base" or "instruct": the card's, or what the caller said; None: not known
    # (context ids, continuation ids) -> that continuation's token log-probs, shared by every `replace` of
    # this scorer: a run's protocols score the same option after the same question once (MCQA-LL and
    # sequence DCS). Exact, since a continuation's scores do not depend on what shares its row or batch.
    # None: no sharing. `dcsjax eval` gives each run its own.
    continuation_cache: dict | None = None

    @property
    def is_instruct(self) -> bool | None:
        return None if self.variant is None else self.variant == "instruct"

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

    def replace(self, **changes) -> "Scorer":
        """This scorer with other settings (batch_size, pack, buckets, progress, ...), the same model."""
        return dataclasses.replace(self, **changes)

    @property
    def row_multiple(self) -> int:
        """Rows of a batch are split over the mesh's data axis, so a batch holds a multiple of its size."""
        return self.mesh.shape["data"] if self.mesh is not None else 1

    @property
    def config(self):
        return self.model.config

    # ---------------------------------------------------------------------------------------- texts
    def asks_through_chat_template(self, purpose: str) -> bool:
        """Whether a prompt for `purpose` goes through the chat template: an instruct model's does. An
        instruct model without a template is refused, naming how to give one, instead of being asked another
        way without a word (its letters and answers would change)."""
        if not self.is_instruct:
            return False
        if not self.tokenizer.chat_template:
            raise ConfigError(
                f"{self.name} is an instruct model without a chat template, which {purpose} asks it through: give "
                "its tokenizer one (chat_template in tokenizer_config.json, or chat_template.jinja in the model's "
                "folder), or load it as a base model (--variant base)")
        return True

    def chat_text(self, user: str, system: str | None = None) -> str:
        """A [system and] user turn through the tokenizer's chat template, the assistant's turn opened."""
        messages = ([{"role": "system", "content": system}] if system is not None else []) + \
            [{"role": "user", "content": user}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids without special tokens; an empty text is an error naming it."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"text {i} is a {type(text).__name__}, not a string")
            if not text:
                raise InputError(f"text {i} is empty: there is nothing to score")
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def token_logprobs(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One float32 array per text: log p(token_i | document start, tokens before i), every token."""
        return self.logprobs_of_ids(self.encode(texts))

    def score(self, texts: Sequence[str], reduction: str = "sum") -> np.ndarray:
        """One number per text: the sum or mean of its token log-probs, or its perplexity ('ppl')."""
        return np.array([reduce_logprobs(lp, reduction) for lp in self.token_logprobs(texts)])

    def score_continuations(self, contexts: Sequence[str], continuations: Sequence[str],
                            reduction: str = "sum") -> np.ndarray:
        """log p(continuation | document start, context), reduced per pair."""
        if len(contexts) != len(continuations):
            raise InputError(f"{len(contexts)} contexts but {len(continuations)} continuations")
        ctx_ids, cont_ids = zip(*(self.split_encode(c, x, i) for i, (c, x) in
                                  enumerate(zip(contexts, continuations)))) if contexts else ((), ())
        lps = self.logprobs_of_ids([c + x for c, x in zip(ctx_ids, cont_ids)])
        return np.array([reduce_logprobs(lp[len(c):], reduction) for lp, c in zip(lps, ctx_ids)])

    def split_encode(self, context: str, continuation: str, index: int = 0) -> tuple[list[int], list[int]]:
        """Context and continuation ids, tokenised together and split at the character boundary.

        Where a token would straddle the boundary (no such merge in the usual " answer" case), the two
        sides are tokenised apart instead, so no token ever merges across it.
        """
        if not continuation:
            raise InputError(f"continuation {index} is empty: there is nothing to score")
        enc = self.tokenizer(context + continuation, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        b = len(context)
        n_ctx = sum(1 for start, end in offsets if end <= b)
        aligned = all(end <= b for _, end in offsets[:n_ctx]) and all(start >= b for start, _ in offsets[n_ctx:])
        if aligned and n_ctx < len(ids):
            return ids[:n_ctx], ids[n_ctx:]
        ctx = list(self.tokenizer(context, add_special_tokens=False)["input_ids"]) if context else []
        return ctx, list(self.tokenizer(continuation, add_special_tokens=False)["input_ids"])

    def score_options(self, contexts: Sequence[str], options: Sequence[Sequence[str]],
                      reduction: str = "sum") -> list[np.ndarray]:
        """Per item, log p(option | document start, context) for each of its options, reduced."""
        return [np.array([reduce_logprobs(lp, reduction) for lp in lps])
                for lps in self.option_logprobs(contexts, options)]

    def option_logprobs(self, contexts: Sequence[str], options: Sequence[Sequence[str]]) -> list[list[np.ndarray]]:
        """Per item and option, the token log-probs of the option after the document start and the context.

        The context is computed once per item: one row holds the context and then every option, each
        option seeing the context and itself only, its positions continuing from the context's end.
        Scores equal `score_continuations` on each (context, option) pair alone.
        """
        if len(contexts) != len(options):
            raise InputError(f"{len(contexts)} contexts but {len(options)} option lists")
        cache = self.continuation_cache
        out: list[list] = [[None] * len(opts) for opts in options]
        groups, owners = [], []  # owners[g] = [(item, option index, cache key)] scored by suffixes of group g
        for i, (context, opts) in enumerate(zip(contexts, options)):
            by_context: dict[tuple[int, ...], list[tuple[int, tuple[int, ...]]]] = {}
            for j, option in enumerate(opts):
                ctx, cont = self.split_encode(context, option, j)
                if cache is not None and (tuple(ctx), tuple(cont)) in cache:
                    out[i][j] = cache[tuple(ctx), tuple(cont)]
                    continue
                by_context.setdefault(tuple(ctx), []).append((j, tuple(cont)))
            for ctx, conts in by_context.items():  # one group per distinct context tokenisation (almost always one)
                head = (self.document_start_id, *ctx)
                # The prefix stops one token short; each suffix restarts with the context's last token, so
                # that token's prediction of the option's first token is in the option's own segment.
                groups.append(Group(head[:-1], tuple((head[-1], *cont) for _, cont in conts)))
                owners.append([(i, j, (ctx, cont)) for j, cont in conts])
        parts = self._run_groups(groups) if groups else []
        for g, owner in enumerate(owners):
            for (i, j, key), lp in zip(owner, parts[g][1]):
                out[i][j] = lp
                if cache is not None:
                    cache[key] = lp
        return out

    # ---------------------------------------------------------------------------------------- engine
    def logprobs_of_ids(self, id_lists: Sequence[Sequence[int]]) -> list[np.ndarray]:
        parts = self._run_groups([Group((self.document_start_id, *ids)) for ids in id_lists])
        return [prefix for prefix, _ in parts]

    def continuation_logprobs_of_ids(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]
                                     ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per (context ids, continuation ids): the continuation's token log-probs given the context, and
        whether each continuation token is the argmax there. Nothing is prepended: the context's first
        token is conditioning only (lm-eval's convention; `dcsjax.lmeval.backend` passes its requests here).

        Continuations of one context share one group, the context computed once (`option_logprobs`),
        split so that no group exceeds the row length."""
        for i, (ctx, cont) in enumerate(pairs):
            if not ctx or not cont:
                raise InputError(f"pair {i}: the context and the continuation must both hold tokens")
        by_context: dict[tuple[int, ...], list[int]] = {}
        for i, (ctx, _) in enumerate(pairs):
            by_context.setdefault(tuple(ctx), []).append(i)
        groups, owners = [], []
        for ctx, members in by_context.items():
            if len(ctx) == 1:  # no prefix to share: each pair is one sequence
                for i in members:
                    groups.append(Group((*ctx, *pairs[i][1])))
                    owners.append([i])
                continue
            batch, room = [], len(ctx) - 1
            for i in members:  # suffixes restart with the context's last token (see option_logprobs)
                suffix = (ctx[-1], *pairs[i][1])
                if batch and room + len(suffix) > self.max_length:
                    groups.append(Group(ctx[:-1], tuple(s for _, s in batch)))
                    owners.append([j for j, _ in batch])
                    batch, room = [], len(ctx) - 1
                batch.append((i, suffix))
                room += len(suffix)
            groups.append(Group(ctx[:-1], tuple(s for _, s in batch)))
            owners.append([j for j, _ in batch])
        parts, flags = self._run_groups(groups, greedy=True)
        out: list = [None] * len(pairs)
        for g, owner in enumerate(owners):
            if not parts[g][1]:  # a plain sequence: the continuation is its tail
                n = len(pairs[owner[0]][1])
                out[owner[0]] = (parts[g][0][-n:], flags[g][0][-n:])
                continue
            for i, lp, greedy in zip(owner, parts[g][1], flags[g][1]):
                out[i] = (lp, greedy)
        return out

    def _run_groups(self, groups: list[Group], greedy: bool = False):
        """Per group: the prefix's token log-probs and each suffix's (its first token is not scored); with
        greedy, a second list of the same shape holds whether each scored token is the argmax.

        Where the long-row kernel cannot share a prefix (splash, on TPU: `attention.shares_prefixes`), a group
        that would fill a long row is run as one whole sequence per suffix, and its parts cut back out."""
        if shares_prefixes(long_row_kernel(self.mesh)):
            return self._run_packed(groups, greedy)
        whole, origin = [], []  # origin[w] = (group, suffix; None: the group itself)
        for g, group in enumerate(groups):
            if group.suffixes and (group.room > self.max_length or takes_blockwise(bucket_for(group.room, self.buckets))):
                whole += [Group(group.prefix + suffix) for suffix in group.suffixes]
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
            arrays = (batch.tokens, batch.positions, batch.segment_ids, batch.attend_to, batch.targets)
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
        for s in batch.spans:
            scored = lp[s.row, s.start:s.start + s.length - 1]
            scored = scored if scored.dtype == bool else scored.astype(np.float32)
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
