"""Does a number measure what its column says? Option order against a letter preference, rotations, the
D.2 parser's hard cases, APS refusing question + option texts, and sequence DCS under IDK phrasings."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import QUESTIONS_CARD, UNKNOWNS_CARD, scorer_for
from dcsjax.eval import protocols
from dcsjax.data.items import Item
from dcsjax.data.tasks import load_task, resolve_task
from dcsjax.errors import ConfigError
from dcsjax.eval.run import run_eval, summary_row
from dcsjax.eval.protocols.apx import parse_answer
from dcsjax.eval.protocols.options import permute, shuffled


class LetterPreferrer:
    """A model with a preference for letter positions and, optionally, for option texts: it always answers
    "A" when asked for a letter, and its next-token letter scores are bias[position] + taste(option text)."""
    is_instruct = False
    document_start_id = 0

    def __init__(self, bias=(3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), taste=None):
        self.bias, self.taste = bias, taste or (lambda text: 0.0)
        self.tokenizer = SimpleNamespace(chat_template=None, decode=lambda tokens, skip_special_tokens=True: "A")

    def encode(self, texts):
        return [[1] for _ in texts]

    def score_options(self, prompts, letter_lists):
        out = []
        for prompt, letters in zip(prompts, letter_lists):
            texts = dict(re.findall(r"^([A-Z])\. (.*)$", prompt, flags=re.M))
            out.append(np.array([self.bias[i] + self.taste(texts[x.strip()]) for i, x in enumerate(letters)]))
        return out


@pytest.fixture
def always_a(monkeypatch):
    monkeypatch.setattr("dcsjax.eval.protocols.apx.greedy_generate", lambda scorer, prompts, n: [[7]] * len(prompts))
    return LetterPreferrer()


def context(scorer, task):
    from dcsjax.eval.protocols.dcs import IDK_PHRASINGS

    return protocols.Context(scorer, resolve_task(task), idk_phrasings=IDK_PHRASINGS)


def test_a_constant_answer_scores_its_letters_share_in_source_order_and_one_in_k_shuffled(always_a):
    """MMLU's answers lean to D in its own order: answering "A" throughout scores the share of A among the gold
    letters there (and "D", the best constant, more than a quarter), and one in K = 4 when the options are
    shuffled. 2,000 questions drawn by a fixed seed (stratified by subject; their gold letters: A 22%, B 25%, C 26%, D 27%)."""
    from dcsjax.eval.run import sample_items

    items = sample_items(load_task(resolve_task("mmlu"))[0], 2000, seed=0)
    n = len(items)
    gold = np.bincount([i.correct[0] for i in items], minlength=4) / n
    apx = protocols.get("apx")
    source = protocols.score(apx, context(always_a, "mmlu"), items, "source", 0)
    assert np.mean([r["correct"] for r in source]) == pytest.approx(gold[0])
    row = summary_row("m", "mmlu", "apx", source, 0, 1, 1, "f", {}, 0)
    assert (row["positions"]["best_constant_letter"], row["positions"]["best_constant"]) == ("D", pytest.approx(gold[3]))
    assert gold[3] > 0.25  # the lean: a model preferring "D" gains on MMLU's own order
    for seed in (0, 1):
        shuffled_records = protocols.score(apx, context(always_a, "mmlu"), items, "shuffle", seed)
        accuracy = np.mean([r["correct"] for r in shuffled_records])
        assert abs(accuracy - 0.25) < 4 * np.sqrt(0.25 * 0.75 / n), accuracy  # binomial, four standard deviations
        positions = summary_row("m", "t", "apx", shuffled_records, 0, 1, 1, "f", {}, 0)["positions"]
        assert positions["answer"]["A"] >= n - 2 and positions["best_constant"] == pytest.approx(
            max(positions["gold"].values()) / n) and positions["best_constant"] < 0.3
    # (an option whose own text is "A" takes the parsed answer: D.2 reads an option's text before its letter)
    # the record keeps the permutation, the gold letter and the answered letter
    record, item = shuffled_records[0], items[0]
    perm, shown = record["order"]["presentations"][0]["perm"], record["order"]["presentations"][0]
    assert sorted(perm) == [0, 1, 2, 3] and shown["gold"] == ["ABCD"[perm.index(item.correct[0])]]
    assert shown["answer"] == "A" and record["correct"] == (perm[0] == item.correct[0])


def test_the_shuffle_is_fixed_by_seed_and_item_id():
    assert shuffled("task/3", 5, 0) == shuffled("task/3", 5, 0) != shuffled("task/3", 5, 1)
    assert sorted(shuffled("task/3", 5, 0)) == list(range(5))
    assert len({shuffled(f"task/{i}", 4, 0) for i in range(200)}) == 24  # every permutation of 4 turns up


def test_rotation_averages_out_a_letter_preference():
    """dcs-letters under `rotate`: with a pure preference for A, the averaged distribution is uniform over
    the options (IDK included); with a taste for some texts as well, it is the same distribution however
    the source orders the options."""
    item = Item("q", "Which?", ("red", "green", "blue"), (1,))
    letters = protocols.get("dcs-letters")
    record = protocols.score(letters, context(LetterPreferrer(), "general_knowledge"), [item], "rotate", 0)[0]
    assert np.allclose(record["probs"], 0.25, atol=1e-6) and len(record["order"]["presentations"]) == 4
    taste = {"red": 0.5, "green": 2.0, "blue": -1.0, "I don't know.": 0.0}.get
    scorer = LetterPreferrer(taste=taste)
    a = protocols.score(letters, context(scorer, QUESTIONS_CARD), [item], "rotate", 0)[0]
    b_item = permute(item, (2, 0, 1))  # the same options listed blue, red, green
    b = protocols.score(letters, context(scorer, QUESTIONS_CARD), [b_item], "rotate", 0)[0]
    by_text = lambda it, r: dict(zip([*it.choices, "I don't know."], r["probs"]))  # noqa: E731
    assert by_text(item, a) == pytest.approx(by_text(b_item, b), abs=1e-6)
    assert a["dcs"] == pytest.approx(b["dcs"], abs=1e-6) and a["choice"] == 1 and a["correct"]
    # under `source`, the same model's answer follows the letter: it picks red, at A
    assert protocols.score(letters, context(scorer, QUESTIONS_CARD), [item], "source", 0)[0]["choice"] == 0


def test_apx_rotations_vote(always_a):
    item = Item("q", "Which?", ("red", "green", "blue"), (1,))
    record = protocols.score(protocols.get("apx"), context(always_a, "general_knowledge"), [item], "rotate", 0)[0]
    assert record["votes"] == [1, 1, 1] and record["choice"] is None and "tie" in record["parse_error"]


@pytest.mark.parametrize("generation, choices, expected", [
    ("B. A cat", ("A dog", "A cat"), 1),  # the article "A" is no letter
    ("A dog", ("A dog", "A cat"), 0),
    ("I think it is C.", tuple("abcdefghij"), None),  # "I" is the ninth letter here, but not in answer position
    ("I think the answer is C", ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine"), 2),
    ("F", ("T", "F"), 1),  # one-character options
    ("T", ("T", "F"), 0),
    ("Answer: F", ("T", "F"), 1),
    ("Paris, Texas", ("Paris", "Paris, Texas"), 1),  # an option inside another
    ("Paris", ("Paris", "Paris, Texas"), 0),
    ("(B)", ("x1", "x2", "x3"), 1),
    ("The correct answer is B, x2.", ("x1", "x2", "x3"), 1),
    ("A. x1\nB. x2\nC. x3", ("x1", "x2", "x3"), None),  # the list repeated: several options
])
def test_parser_hard_cases(generation, choices, expected):
    choice, failure = parse_answer(generation, choices)
    assert choice == expected, failure
    assert (failure is None) == (expected is not None)


def test_aps_without_declarative_statements_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="aps on known_unknowns: no declarative statements.*qa-ppl"):
        run_eval("no-such-model", ["known_unknowns"], ["aps", "dcs"], tmp_path)
    assert not (tmp_path / "summary.json").exists()
    for task in ("logical_deduction_three_objects", "timedial", "winogrande", "hellaswag", "winogender"):
        assert protocols.get("aps").unavailable(context(None, task)) is None, task
    for task in ("misconceptions", "general_knowledge", "hindu_knowledge", "hhh_alignment", "emoji_movie", "mmlu", "arc_easy"):
        assert protocols.get("aps").unavailable(context(None, task)), task


def test_aps_skipped_on_many_mmlu_subjects_is_one_line_naming_them():
    from dcsjax.eval.run import format_table

    tasks = ("mmlu:anatomy", "mmlu:marketing", "mmlu:global_facts")
    reasons = [protocols.get("aps").unavailable(context(None, task)) for task in tasks]
    skipped = [{"protocol": "aps", "task": task, "reason": reason} for task, reason in zip(tasks, reasons)]
    lines = [line for line in format_table({"rows": [], "skipped": skipped}).splitlines() if line.startswith("skipped")]
    assert lines == [f"skipped aps on {', '.join(tasks)}: {reasons[0]}"]


def test_aps_is_skipped_and_named_where_asked(tmp_path):  # MMLU: a rule for its sentence stems only
    summary = run_eval("smollm2-135m-instruct", ["mmlu:anatomy"], ["aps", "qa-ppl"], tmp_path, limit=4,
                       scorer=scorer_for("smollm2-135m-instruct"), progress=False, skip_unavailable=True)
    assert [r["protocol"] for r in summary["rows"]] == ["qa-ppl"]
    assert summary["skipped"][0]["protocol"] == "aps"
    assert "dcsjax statements generate --task TASK" in summary["skipped"][0]["reason"]


@pytest.mark.slow
def test_sequence_dcs_under_each_idk_phrasing_against_direct_continuation_scores():
    """Each record's pIDK under each phrasing and normalisation, recomputed from `score_continuations`
    (each continuation scored on its own): the headline's pIDK is one phrasing's (paper 000's one abstention
    response: the first), the set of phrasings ("any") a companion, and its control ("paraphrased": each
    option said as many ways, bare, "The answer is ...", "The answer to this question is ...", summed likewise)."""
    scorer = scorer_for("smollm2-135m-instruct")
    items = load_task(resolve_task(QUESTIONS_CARD))[0][:3]
    ctx = context(scorer, QUESTIONS_CARD)
    records = protocols.score(protocols.get("dcs"), ctx, items, "source", 0)
    for item, record in zip(items, records):
        question = f"Question: {item.question}\nAnswer:"
        options = [" " + c for c in item.choices]
        idk = [" " + p for p in ctx.idk_phrasings]
        ll = scorer.score_continuations([question] * len(options + idk), options + idk)
        tokens = np.array([len(scorer.split_encode(question, t)[1]) for t in options + idk])
        said = [f" The answer is {c}." for c in item.choices] + [f" The answer to this question is {c}." for c in item.choices]
        said_ll = np.array(scorer.score_continuations([question] * len(said), said)).reshape(2, len(options))
        for norm, scores in (("sum", ll), ("token", ll / tokens)):
            opt, phr = scores[:len(options)], scores[len(options):]
            for name, idk_score in [*zip(ctx.idk_phrasings, phr), ("any", np.logaddexp.reduce(phr))]:
                full = np.append(opt, idk_score)
                p = np.exp(full - np.logaddexp.reduce(full))
                assert record["idk_sensitivity"][norm][name][1] == pytest.approx(p[-1], abs=2e-5), (norm, name)
        full = np.append(np.logaddexp.reduce(np.vstack([ll[:len(options)], said_ll]), axis=0),
                         np.logaddexp.reduce(ll[len(options):]))  # three wordings a side, summed
        p = np.exp(full - np.logaddexp.reduce(full))
        p_correct = float(p[list(item.correct)].sum())
        p_wrong = 1.0 - p[-1] - p_correct
        assert record["idk_sensitivity"]["sum"]["paraphrased"] == pytest.approx(
            [(p_correct - p_wrong) * (1 - p[-1]), p[-1]], abs=2e-5)  # paper 000's DCS at lc = lw = 1
        assert record["idk_sensitivity"]["sum"]["paraphrased"][1] < record["idk_sensitivity"]["sum"]["any"][1]
        assert record["p_idk"] == pytest.approx(record["idk_sensitivity"]["sum"][ctx.idk_phrasings[0]][1], abs=1e-6)
        assert record["p_idk"] < record["idk_sensitivity"]["sum"]["any"][1]
    metrics = protocols.get("dcs").summarise(records)
    assert set(metrics["dcs_by_idk"]) == {"any", "paraphrased", *ctx.idk_phrasings} and metrics["idk_spread"] >= 0

    # an item with an IDK option of its own (known_unknowns' "Unknown"): that option is the headline's IDK
    item = load_task(resolve_task(UNKNOWNS_CARD))[0][0]
    (record,) = protocols.score(protocols.get("dcs"), context(scorer, UNKNOWNS_CARD), [item], "source", 0)
    question = f"Question: {item.question}\nAnswer:"
    texts = [" " + c for c in item.choices]  # the item's own options, its IDK option among them
    ll = scorer.score_continuations([question] * len(texts), texts)
    assert record["p_idk"] == pytest.approx(float(np.exp(ll[item.idk] - np.logaddexp.reduce(ll))), abs=2e-5)


def test_sequence_dcs_continues_the_cards_own_context():
    """A card with its own `mcqa_context` (HellaSwag's bare passage, no "Question:" wrapper): sequence DCS scores
    the options and the IDK response after that context, as MCQA-LL does, and the run's settings name it."""
    from dataclasses import replace

    scorer = scorer_for("smollm2-135m-instruct")
    (item,) = load_task(resolve_task(QUESTIONS_CARD))[0][:1]
    plain = context(scorer, QUESTIONS_CARD)
    ctx = replace(plain, card=replace(plain.card, mcqa_context="{question}"))
    (record,) = protocols.score(protocols.get("dcs"), ctx, [item], "source", 0)
    texts = [" " + c for c in item.choices] + [" " + ctx.idk_phrasings[0]]
    ll = scorer.score_continuations([item.question] * len(texts), texts)
    assert record["p_idk"] == pytest.approx(float(np.exp(ll[-1] - np.logaddexp.reduce(ll))), abs=2e-5)
    assert protocols.get("dcs").prompt(ctx, item)["context"] == item.question
    assert protocols.get("dcs").settings(ctx)["context"] == "{question}"
    assert protocols.get("dcs").settings(plain)["context"] == "Question: {question}\nAnswer:"


def test_order_free_protocols_give_the_same_scores_shuffled():
    """mcqa scores each option on its own: shuffling the options permutes its log-likelihoods, no more."""
    scorer = scorer_for("smollm2-135m-instruct")
    items = load_task(resolve_task(QUESTIONS_CARD))[0][:6]
    ctx = context(scorer, QUESTIONS_CARD)
    source = protocols.score(protocols.get("mcqa"), ctx, items, "source", 0)
    mixed = protocols.score(protocols.get("mcqa"), ctx, items, "shuffle", 0)
    for a, b in zip(source, mixed):
        perm = b["order"]["presentations"][0]["perm"]
        assert [a["loglik"][p] for p in perm] == pytest.approx(b["loglik"], abs=1e-5)
        assert a["correct"] == b["correct"]
