"""The scorer: texts in, float32 token log-probabilities out. Three parts, each immutable:
- `Encoder` (`engine.encoder`): texts to token ids, chat templates;
- the request builders here: texts, continuations after contexts, an item's options after one shared
  context, lm-eval's (context, continuation) id pairs, each turned into groups of ids (a prefix and the
  suffixes that continue it) and the groups' log-probs back into the request's shape;
- `BatchEngine` (`engine.batches`): groups through bucketed, packed, jitted batches.

Every text is scored in full, conditioned on the token that starts a document in the model's
pretraining (`document_start_id`): the tokenizer's BOS where it adds one by default (Gemma 3), else the
token the model card names (SmolLM2: `<|endoftext|>`). The first real token is thus scored too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dcsjax.errors import InputError
from dcsjax.engine.batches import BatchEngine, BatchSettings
from dcsjax.engine.encoder import Encoder
from dcsjax.engine.logprobs import reduce_logprobs
from dcsjax.engine.packing import Group, PlannedBatch
from dcsjax.nn.decoder import Decoder

@dataclass(frozen=True)
class Scorer(BatchSettings):
    """A loaded model and how it is run: its `Encoder`, the request builders (texts, continuations, options,
    token ids) and its `BatchEngine`, made from these fields and the engine's settings (`BatchSettings`: name,
    batch_size, max_batch_tokens, buckets, pack, vocab_chunk, progress, mesh; keyword arguments). Immutable: a
    scorer with other settings is `scorer.replace(batch_size=...)`, which shares the model, its parameters and
    every compiled program."""
    model: Decoder
    tokenizer: object  # a transformers tokenizer
    document_start_id: int
    card: object | None = None  # the ModelCard, when loaded by name
    # what identifies the weights and how they were loaded (file checksum, card, dtype, document start):
    # part of every result record's fingerprint (`dcsjax.eval.results`)
    model_fingerprint: dict | None = None
    variant: str | None = None  # "base" or "instruct": the card's, or what the caller said; None: not known
    # (context ids, continuation ids) -> that continuation's token log-probs, shared by every `replace` of
    # this scorer: a run's protocols score the same option after the same question once (MCQA-LL and
    # sequence DCS). Exact, since a continuation's scores do not depend on what shares its row or batch.
    # None: no sharing. `dcsjax eval` gives each run its own.
    continuation_cache: dict | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__.__get__(self)  # frozen: derived once, here
        settings = {f.name: getattr(self, f.name) for f in dataclasses.fields(BatchSettings)}
        engine = BatchEngine(model=self.model, **settings)
        set_("engine", engine)
        set_("encoder", Encoder(self.tokenizer, self.name, self.variant))
        set_("buckets", engine.buckets)  # cut at the model's context

    def replace(self, **changes) -> "Scorer":
        """This scorer with other settings (batch_size, pack, buckets, progress, ...), the same model."""
        return dataclasses.replace(self, **changes)

    # what the engine derived: the longest sequence, the graph and parameters its jitted kernel takes
    max_length = property(lambda self: self.engine.max_length)
    graphdef = property(lambda self: self.engine.graphdef)
    state = property(lambda self: self.engine.state)
    row_multiple = property(lambda self: self.engine.row_multiple)
    config = property(lambda self: self.model.config)
    # the encoder's
    is_instruct = property(lambda self: self.encoder.is_instruct)

    def asks_through_chat_template(self, purpose: str) -> bool:
        return self.encoder.asks_through_chat_template(purpose)

    def chat_text(self, user: str, system: str | None = None) -> str:
        return self.encoder.chat_text(user, system)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.encoder.encode(texts)

    def split_encode(self, context: str, continuation: str, index: int = 0) -> tuple[list[int], list[int]]:
        return self.encoder.split_encode(context, continuation, index)

    asks_through_chat_template.__doc__ = Encoder.asks_through_chat_template.__doc__
    chat_text.__doc__ = Encoder.chat_text.__doc__
    encode.__doc__ = Encoder.encode.__doc__
    split_encode.__doc__ = Encoder.split_encode.__doc__

    # ---------------------------------------------------------------------------------------- requests
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
                groups.append(Group(head[:-1], tuple((head[-1], *cont) for _, cont in conts), context=len(head) - 1))
                owners.append([(i, j, (ctx, cont)) for j, cont in conts])
        parts = self._run_groups(groups) if groups else []
        for g, owner in enumerate(owners):
            for (i, j, key), lp in zip(owner, parts[g][1]):
                out[i][j] = lp
                if cache is not None:
                    cache[key] = lp
        return out

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
                    groups.append(Group(ctx[:-1], tuple(s for _, s in batch), context=len(ctx) - 1))
                    owners.append([j for j, _ in batch])
                    batch, room = [], len(ctx) - 1
                batch.append((i, suffix))
                room += len(suffix)
            groups.append(Group(ctx[:-1], tuple(s for _, s in batch), context=len(ctx) - 1))
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
        """The engine's `run_groups` (one place to count or watch what a request sends it)."""
        return self.engine.run_groups(groups, greedy)

    def plan(self, rooms: list[int]) -> list[PlannedBatch]:
        """The batches that hold groups of these sizes (tokens each, document start included)."""
        return self.engine.plan(rooms)

    compile_count = staticmethod(BatchEngine.compile_count)
