"""The public API: compiles bounded per bucket, continuations split at the boundary, progress bar."""

import pytest
import numpy as np

from conftest import PASSAGE, reference_logprobs
from dcsjax.engine.packing import batch_heights
from dcsjax.engine.scorer import Scorer


def test_compiles_once_per_batch_shape(tiny):
    """One compile per (bucket, rows) shape a run uses, and none for a shape an earlier run compiled; rows
    come from the halving ladder, so a bucket has at most len(batch_heights) shapes whatever the data. About
    the engine's shapes, not weights: the tiny decoder (conftest.tiny_scorer) compiles in a fraction of the time."""
    words = PASSAGE.split()
    # a vocab_chunk (a static argument of the kernel) that no other test uses: shapes compiled by earlier
    # tests in this process are not in its cache
    scorer = Scorer(tiny.model, tiny.tokenizer, tiny.document_start_id, batch_size=5,
                    buckets=(64, 128, 256), vocab_chunk=4096)

    def shapes(texts):
        rooms = [len(ids) + 1 for ids in scorer.encode(texts)]
        return {(b.bucket, b.height) for b in scorer.plan(rooms)}

    first_texts = [" ".join(words[i:i + n]) for i, n in enumerate(range(1, 150, 3))]  # 50 lengths, 3 buckets
    second_texts = [" ".join(words[i + 7:i + 7 + n]) for i, n in enumerate(range(2, 150, 5))]
    before = Scorer.compile_count()
    scorer.score(first_texts)
    first = Scorer.compile_count() - before
    scorer.score(second_texts)
    second = Scorer.compile_count() - before - first
    print(f"50 texts of 1-149 words over buckets (64, 128, 256): {first} compiles for shapes "
          f"{sorted(shapes(first_texts))}; a second run: {second} for {sorted(shapes(second_texts))}")
    assert first == len(shapes(first_texts)) and {b for b, _ in shapes(first_texts)} == {64, 128, 256}
    assert second == len(shapes(second_texts) - shapes(first_texts))
    assert all(h in batch_heights(b, 5, scorer.max_batch_tokens) for b, h in shapes(first_texts) | shapes(second_texts))


@pytest.mark.slow
def test_continuation_scores_match_transformers(smollm2):
    contexts = ["The capital of France is", "Question: What is 2 + 2?\nAnswer:", ""]
    continuations = [" Paris.", " 4", "Hello"]
    ours = smollm2.score_continuations(contexts, continuations)
    for ctx, cont, score in zip(contexts, continuations, ours):
        ctx_ids, cont_ids = smollm2.split_encode(ctx, cont)
        assert smollm2.tokenizer.decode(cont_ids) == cont and smollm2.tokenizer.decode(ctx_ids) == ctx
        ref, _ = reference_logprobs("smollm2-135m-instruct", [smollm2.document_start_id, *ctx_ids, *cont_ids])
        assert abs(score - ref[len(ctx_ids):].sum()) < 1e-4
    assert ours[0] > smollm2.score_continuations(["The capital of France is"], [" London."])[0]
    np.testing.assert_allclose(
        smollm2.score_continuations(contexts[:1], continuations[:1], reduction="mean"), ours[:1] / 2, rtol=1e-6)


def test_no_token_merges_across_the_boundary(smollm2):
    """'Paris' after 'The capital of France is ' (trailing space) would merge as ' Paris' if tokenised
    together; the split keeps the context's space as its own token instead."""
    ctx_ids, cont_ids = smollm2.split_encode("The capital of France is ", "Paris")
    assert smollm2.tokenizer.decode(ctx_ids) == "The capital of France is "
    assert smollm2.tokenizer.decode(cont_ids) == "Paris"


def test_progress_bar(smollm2, capsys):
    scorer = Scorer(smollm2.model, smollm2.tokenizer, smollm2.document_start_id, progress=True, name="smol")
    scorer.score(["One.", "Two."])
    assert "scoring (smol)" in capsys.readouterr().err


@pytest.mark.slow
def test_shared_question_equals_each_pair_alone(model_name):
    """One row per item holds the question once and then every option; scores equal each pair alone."""
    from conftest import scorer_for

    scorer = scorer_for(model_name)
    contexts = [
        "On a shelf, there are three books: a black book, an orange book, and a blue book. The blue book is to "
        "the right of the orange book. The orange book is to the right of the black book.\nAnswer:",
        "Question: When was Abraham Lincoln born?\nAnswer:",
        "Is the following statement true or false? Twinkies are edible for decades or longer.",
    ]
    options = [
        [" The black book is the leftmost.", " The orange book is the leftmost.", " The blue book is the leftmost."],
        [" February 12, 1809", " Unknown", " I don't know.", " 1809"],
        [" T", " F"],
    ]
    shared = scorer.score_options(contexts, options)
    alone = [scorer.score_continuations([c] * len(opts), opts) for c, opts in zip(contexts, options)]
    for s, a in zip(shared, alone):
        assert np.abs(s - a).max() < 1e-4
    # and against transformers, pair by pair, for the first item (per token: the parity bound)
    mean = scorer.score_options(contexts[:1], options[:1], reduction="mean")[0]
    for option, score in zip(options[0], mean):
        ctx_ids, cont_ids = scorer.split_encode(contexts[0], option)
        ref, _ = reference_logprobs(model_name, [scorer.document_start_id, *ctx_ids, *cont_ids])
        assert abs(score - ref[len(ctx_ids):].mean()) < 1e-4


@pytest.mark.slow
def test_options_after_a_long_question_run_only_their_own_tokens_through_the_head(tiny, monkeypatch):
    """A shared question's prefix is context: the vocabulary head runs on the options' columns only (64 of a
    row's 256 here), the prefix's predictions come back NaN, and the options' scores equal each pair scored
    alone as one whole sequence (every column through the head)."""
    import dcsjax.engine.batches as batches
    from dcsjax.engine.packing import Group

    widths = []
    real = batches.make_batch
    monkeypatch.setattr(batches, "make_batch", lambda *a: (lambda b: widths.append(b.scored.shape) or b)(real(*a)))
    question = " ".join(PASSAGE.split()[:120]) + "\nAnswer:"
    options = [" yes", " no", " the passage does not say"]
    shared = tiny.score_options([question], [options])[0]
    assert [w for _, w in widths] == [64] and len(tiny.encode([question])[0]) > 128
    widths.clear()
    alone = tiny.score_continuations([question] * 3, options)
    assert widths and all(w >= 128 for _, w in widths)  # whole sequences: every column
    np.testing.assert_allclose(shared, alone, rtol=0, atol=1e-5)
    ids = tiny.encode([question])[0]
    (prefix, suffixes), = tiny._run_groups([Group((tiny.document_start_id, *ids[:-1]), ((ids[-1], 5, 6),),
                                                  context=len(ids))])
    assert np.isnan(prefix).all() and len(prefix) == len(ids) - 1 and np.isfinite(suffixes[0]).all()
    # bit for bit whatever shares the batch: options of 1 to 90 words with their questions, which gather 64 to
    # 256 of a row's columns, at three batch sizes, packed and not
    words = PASSAGE.split()
    contexts = [" ".join(words[i:i + 5 + 9 * i]) + "\nAnswer:" for i in range(8)]
    options = [[" " + " ".join(words[j:j + 1 + (j * 13) % 90]) for j in range(i, i + 3)] for i in range(8)]
    widths.clear()
    runs = [tiny.replace(batch_size=b, pack=pack).score_options(contexts, options)
            for b, pack in ((1, False), (3, True), (16, True))]
    assert {w for _, w in widths} >= {64, 128}, widths
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            np.testing.assert_array_equal(a, b)


def test_a_scorer_is_immutable_and_replace_shares_the_model(tiny):
    """Settings are fixed at construction (a caller cannot change a scorer under another's feet); `replace`
    gives one with other settings over the same model and parameters, checked as the constructor checks."""
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.batch_size = 1
    one = tiny.replace(batch_size=1, pack=False)
    assert (one.batch_size, one.pack, tiny.batch_size) == (1, False, 16) and one.model is tiny.model
    texts = ["The capital of France is Paris.", "Two plus two is four.", "Hello"]
    assert [x.tolist() for x in one.token_logprobs(texts)] == [x.tolist() for x in tiny.token_logprobs(texts)]
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        tiny.replace(batch_size=0)


def test_a_shared_continuation_is_scored_once_with_the_same_scores(tiny, monkeypatch):
    """With a continuation cache (what `dcsjax eval` gives each run), a (context, option) pair scored by one
    protocol is not scored again by the next (MCQA-LL then sequence DCS, which adds IDK continuations), and its
    log-probs are bit-identical to scoring without the cache."""
    contexts = ["Question: What is 2 + 2?\nAnswer:", "Question: What colour is the sky?\nAnswer:"]
    options = [[" 4", " 5"], [" blue", " green", " red"]]
    with_idk = [opts + [" I don't know.", " Unknown"] for opts in options]
    plain = tiny.option_logprobs(contexts, with_idk)
    shared = tiny.replace(continuation_cache={})
    scored = []
    run_groups = Scorer._run_groups
    monkeypatch.setattr(Scorer, "_run_groups", lambda self, groups, greedy=False: scored.append(
        sum(len(g.suffixes) for g in groups)) or run_groups(self, groups, greedy))
    first = shared.option_logprobs(contexts, options)
    second = shared.replace(batch_size=3).option_logprobs(contexts, with_idk)  # `replace` shares the cache
    assert scored == [5, 4]  # the second call scores only the four IDK continuations
    for got, want in zip([*first, *second], [*[p[:len(o)] for p, o in zip(plain, options)], *plain]):
        assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_auto_batch_size_is_the_most_rows_the_free_memory_holds(tiny):
    """`--batch-size auto` on the tiny decoder: the rows whose compiled scoring step (XLA's memory analysis of the
    engine's kernel) fits in 3/4 of the free memory given, the next multiple not; capped; at least one row."""
    import jax

    from dcsjax.engine.batches import AUTO_BUCKET, AUTO_HEADROOM, AUTO_ROWS, _batch_logprobs, auto_batch_size

    def used(rows):
        spec = jax.ShapeDtypeStruct((rows, AUTO_BUCKET), np.int32)
        m = _batch_logprobs.lower(tiny.graphdef, tiny.vocab_chunk, None, tiny.state, *[spec] * 5).compile().memory_analysis()
        return m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes

    assert auto_batch_size(tiny, free_bytes=10**15) == AUTO_ROWS
    assert auto_batch_size(tiny, free_bytes=0) == 1
    free = int(used(20) / AUTO_HEADROOM) + 1  # room for 20 rows, not 21
    rows = auto_batch_size(tiny, free_bytes=free)
    assert rows == 20 and used(rows) <= AUTO_HEADROOM * free < used(rows + 1)
