"""Declarative statements (002 A.1, A.2): the filter, seeded top-p sampling in the jitted decode loop,
BLEU and length gap against hand-computed values, the rule-based cloze path, and generation end to end
with SmolLM2 on a BIG-bench task (resumable, its file read by `dcsjax eval --statements`)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import scorer_for
from dcsjax.engine.generate import generate, greedy_generate, sample_token
from dcsjax.statements.generate import filter_counts, generate_statements, parse_statements, template_statements
from dcsjax.metrics.statements import bleu, statement_metrics
from dcsjax.statements.validate import summarise

SMOL = "smollm2-135m-instruct"
TASK = "mmlu:world_religions"  # statements generated for MMLU questions, then APS over them


# ------------------------------------------------------------------------------------------------ filter
@pytest.mark.parametrize("text, n, kept, why", [
    ("Paris is the capital.\nRome is the capital.", 2, ["Paris is the capital.", "Rome is the capital."], None),
    ("One.\n\n   \nTwo.\n", 2, ["One.", "Two."], None),  # blank and whitespace-only lines are not statements
    ("One.\nTwo.\nThree.", 2, None, "3 statements for 2 options"),
    ("One.", 2, None, "1 statements for 2 options"),
    ("", 2, None, "empty output"),
    ("\n \n\t\n", 3, None, "empty output"),
])
def test_filter_keeps_exactly_one_statement_per_option(text, n, kept, why):
    assert parse_statements(text, n) == (kept, why)


def test_filter_counts_by_reason(tmp_path):
    out = tmp_path / "s.jsonl"
    out.write_text('{"id": "a"}\n{"id": "b"}\n')
    rows = [("3 statements for 2 options", 2), ("1 statements for 4 options", 4), ("empty output", 3)]
    (tmp_path / "s.rejected.jsonl").write_text(
        "".join(json.dumps({"id": str(i), "reason": r, "n_options": n}) + "\n" for i, (r, n) in enumerate(rows))
        + json.dumps({"id": "c", "rule": "stem", "reason": "rule 'stem' does not reach it", "n_options": 4}) + "\n")
    assert dict(filter_counts(out)) == {"kept": 2, "too many": 1, "too few": 2, "empty": 1, "not reached": 1}


# ------------------------------------------------------------------------------------------------ sampling
def test_top_p_keeps_the_smallest_nucleus_and_renormalises():
    """p = (0.5, 0.3, 0.15, 0.05), top-p 0.7: the nucleus is {0, 1} (0.5 < 0.7 <= 0.8), drawn as 5/8, 3/8."""
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    keys = jax.random.split(jax.random.key(0), 20_000)
    draws = np.asarray(jax.vmap(lambda k: sample_token(logits, k, 1.0, 0.7))(keys))
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, [5 / 8, 3 / 8, 0, 0], atol=0.01)
    # temperature 2 flattens before the cut: p ~ sqrt(p) = (.42, .33, .23, .13) -> nucleus {0, 1, 2}
    draws = np.asarray(jax.vmap(lambda k: sample_token(logits, k, 2.0, 0.7))(keys))
    root = np.sqrt([0.5, 0.3, 0.15]) / np.sqrt([0.5, 0.3, 0.15]).sum()
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), [*root, 0], atol=0.01)
    assert int(sample_token(logits, keys[0], 0.0, 0.7)) == 0  # temperature 0: argmax


@pytest.mark.slow
def test_sampling_is_seeded_and_independent_of_batching():
    scorer = scorer_for(SMOL)
    prompts = [scorer.encode([t])[0] for t in ["Once upon a time", "The best way to learn is", "In 1850, the city"]]
    run = lambda **kw: generate(scorer, prompts, 12, temperature=0.7, top_p=0.95, **kw)  # noqa: E731
    first = run(seed=3, batch_size=4)
    assert run(seed=3, batch_size=4) == first
    assert run(seed=3, batch_size=1) == first  # each prompt's key is its own, not its batch's
    assert run(seed=4, batch_size=4) != first
    assert generate(scorer, prompts, 12, temperature=0.0) == greedy_generate(scorer, prompts, 12)


# ------------------------------------------------------------------------------------------------ validation
def test_bleu_against_hand_computed_values():
    ref = "the cat sat on the mat"
    assert bleu(ref, ref) == pytest.approx(1.0)
    # "the cat sat on a mat": 1- to 4-gram precisions 5/6, 3/5, 2/4, 1/3; equal lengths, no brevity penalty
    assert bleu("the cat sat on a mat", ref) == pytest.approx((5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25, abs=1e-4)
    # shorter by one word: brevity penalty exp(1 - 6/5); precisions 5/5, 4/4, 3/3, 2/2
    assert bleu("the cat sat on the", ref) == pytest.approx(math.exp(1 - 6 / 5), abs=1e-4)


def test_length_gap_and_spread_against_hand_counts():
    rows = [{"id": "q", "question": "What is 2 + 2?", "choices": ["4", "five"],
             "statements": ["Two plus two is four.", "Two plus two is five, it is said."]}]
    (m,) = statement_metrics(rows)
    assert m["length_gap"] == [5 - 6, 8 - 6]  # pairs "What is 2 + 2? 4" and "... five": 6 words each
    assert m["median_gap"] == 0.5 and m["length_spread"] == 3
    summary = summarise([m])
    assert summary["items"] == 1 and summary["statements"] == 2


# ------------------------------------------------------------------------------------------------ end to end
def test_rule_based_cloze_path_needs_no_model(tmp_path, bigbench_copy):
    from dcsjax.data.tasks import load_task, resolve_task

    card = resolve_task("timedial")
    items, _ = load_task(card)
    out = tmp_path / "timedial.jsonl"
    counts = template_statements(items[:20], card.name, card, out)
    assert counts["kept"] == 20
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        head, blank, tail = row["question"].rpartition("<MASK>")
        assert blank and "<MASK>" not in tail
        for choice, statement in zip(row["choices"], row["statements"]):
            assert statement == head + choice.strip() + tail


@pytest.mark.parametrize("question, choices, statements", [
    # a stem each option completes: the statement is the question-answer pair itself
    ("Narcotics work because they are chemically very similar to", ["endorphins", "Resource providers."],
     ["Narcotics work because they are chemically very similar to endorphins",
      "Narcotics work because they are chemically very similar to Resource providers."]),
    ("All of the following organs secrete enzymes EXCEPT the", ["mouth", "pancreas"],
     ["All of the following organs secrete enzymes EXCEPT the mouth",
      "All of the following organs secrete enzymes EXCEPT the pancreas"]),
    # one blank filled with the option as written, its full stop dropped inside the sentence
    ("Projective tests generally ___ than objective tests.", ["Have higher reliability.", "are shorter"],
     ["Projective tests generally Have higher reliability than objective tests.",
      "Projective tests generally are shorter than objective tests."]),
    ("A public that is well informed is known as _________", ["Moral imagination.", "civics"],
     ["A public that is well informed is known as Moral imagination.", "A public that is well informed is known as civics"]),
    # no rule statement: a question, an instruction, several lines, a scenario pair, two blanks, a capital or a
    # formula at the end, an empty option
    ("What is the capital of France?", ["Paris", "Rome"], None),
    ("Why is ____ the first step?", ["planning", "testing"], None),
    ("Find the degree of the extension.", ["2", "4"], None),
    ("Which of the following is true:\nI. a is\nII. b is", ["I only", "II only"], None),
    ("Scenario 1 | I took it. Scenario 2 | I gave it", ["Wrong, Wrong", "Not wrong, Wrong"], None),
    ("In Holocene Africa, the ____ was replaced by the ____.", ["a; b", "c; d"], None),
    ("A microprocessor is ALU", ["and control unit", "none"], None),
    ("Compute the product (12)(16) in Z_24", ["0", "4"], None),
    ("The longest bone in the body is", ["the femur", " "], None),
])
def test_stem_rule_makes_statements_exactly_and_only_from_sentence_stems(question, choices, statements):
    from dcsjax.data.tasks import stem_statements

    assert stem_statements(question, choices) == statements


def test_mmlu_stem_statements_are_their_question_answer_pairs_and_the_rest_say_why(tmp_path):
    """The rule on the whole of MMLU, no model: every kept stem item's statements are its question followed by
    each option (BLEU 1 against the pair, gap 0) or its one blank filled; every item is in the kept file or the
    rejected file with the reason, none in both, none lost."""
    from dcsjax.data.tasks import load_task, resolve_task

    card = resolve_task("mmlu")
    items, _ = load_task(card)
    out = tmp_path / "mmlu.jsonl"
    counts = template_statements(items, card.name, card, out)
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    rejected = [json.loads(line) for line in (tmp_path / "mmlu.rejected.jsonl").read_text().splitlines()]
    assert counts["kept"] == len(kept) and counts["not reached"] == len(rejected)
    assert sorted(r["id"] for r in kept + rejected) == sorted(i.id for i in items)
    assert 0.15 < len(kept) / len(items) < 0.35  # about a quarter of MMLU's questions are sentence stems
    filled = 0
    for row in kept:
        q = row["question"].strip()
        if "___" in q:
            filled += 1
            assert all("___" not in s and c.strip().rstrip(".") in s for s, c in zip(row["statements"], row["choices"]))
        else:
            assert row["statements"] == [f"{q} {c.strip()}" for c in row["choices"]] and q[-1].islower()
    assert 0 < filled < len(kept) / 5
    assert all("?" != r["question"].strip()[-1:] for r in kept)
    assert all("does not reach it" in r["reason"] for r in rejected)
    checked = statement_metrics(kept[:200])
    assert all(m["median_gap"] == 0 for m in checked if "___" not in next(r for r in kept if r["id"] == m["id"])["question"])


@pytest.mark.slow
def test_generation_end_to_end_resumes_and_feeds_aps(tmp_path):
    from dcsjax.data.tasks import load_task, resolve_task
    from dcsjax.eval.run import run_eval

    scorer = scorer_for(SMOL)
    card = resolve_task(TASK)
    items = load_task(card)[0][:6]
    out = tmp_path / "gk.jsonl"
    counts = generate_statements(scorer, items[:4], card.name, out, max_new_tokens=64, progress=False)
    assert counts["kept"] + counts["too many"] + counts["too few"] == 4
    # a kill in the middle of writing leaves half a line: it is dropped and its item generated again
    with out.open("a") as f:
        f.write('{"id": "' + items[4].id + '", "statem')
    counts = generate_statements(scorer, items, card.name, out, max_new_tokens=64, progress=False)  # resumes
    assert counts["kept"] + counts["too many"] + counts["too few"] == 6
    ids = [json.loads(line)["id"] for path in (out, tmp_path / "gk.rejected.jsonl") if path.is_file()
           for line in path.read_text().splitlines()]
    assert sorted(ids) == sorted(i.id for i in items)  # each item once: none redone, none lost
    for line in out.read_text().splitlines() if out.is_file() else []:
        row = json.loads(line)
        assert len(row["statements"]) == len(row["choices"]) and row["generator"]["temperature"] == 0.7

    # the file drives APS: the kept items are scored with their statements; the filtered are error records
    run_eval(SMOL, [TASK], ["aps"], tmp_path / "eval", limit=6, scorer=scorer, progress=False, statements=out)
    folder = tmp_path / "eval" / scorer.name / card.slug
    aps = [json.loads(line) for line in (folder / "aps.jsonl").read_text().splitlines()] \
        if (folder / "aps.jsonl").is_file() else []
    errors = [json.loads(line) for line in (folder / "errors.jsonl").read_text().splitlines()]
    assert len(aps) == counts["kept"] and len(aps) + len(errors) == 6
    kept = {json.loads(line)["id"]: json.loads(line)["statements"] for line in out.read_text().splitlines()} \
        if out.is_file() else {}
    for record in aps:  # in the presented (shuffled) order: presented statement i is the file's perm[i]
        perm = record["order"]["presentations"][0]["perm"]
        assert record["statements"] == [kept[record["id"]][p] for p in perm]


@pytest.mark.slow
def test_judge_reads_yes_against_no_as_transformers_does(tmp_path):
    """The judge's P(Yes) / (P(Yes) + P(No)) at the assistant turn's first token, against transformers."""
    import torch

    from conftest import reference_for
    from dcsjax.statements.validate import JUDGE_PROMPT, validate_file

    rows = [{"id": "q1", "question": "What is the capital of France?", "choices": ["Paris", "Rome"],
             "answer": [0], "statements": ["The capital of France is Paris.", "The capital of France is Rome."]}]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scorer = scorer_for(SMOL)
    summary = validate_file(path, tmp_path / "v", judge=scorer)
    assert {"judge_yes", "bleu_mean", "median_gap_mean", "length_spread_mean"} <= set(summary)
    assert (tmp_path / "v" / "histograms.png").stat().st_size > 0 and (tmp_path / "v" / "summary.md").is_file()
    got = json.loads((tmp_path / "v" / "validation.jsonl").read_text().splitlines()[0])["judge_p_yes"]

    tok = scorer.tokenizer
    yes, no = tok.convert_tokens_to_ids("Yes"), tok.convert_tokens_to_ids("No")
    want = []
    for choice, statement in zip(rows[0]["choices"], rows[0]["statements"]):
        prompt = JUDGE_PROMPT.format(question=rows[0]["question"], answer=choice, statement=statement)
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
        ids = [scorer.document_start_id, *tok(text, add_special_tokens=False)["input_ids"]]
        with torch.no_grad():
            logits = reference_for(SMOL)(torch.tensor([ids])).logits[0, -1]
        want.append(float(torch.softmax(logits[[yes, no]], -1)[0]))
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_statements_cli_rule_path_and_validate(tmp_path, capsys, bigbench_copy):
    from dcsjax.cli import main

    out = tmp_path / "timedial.jsonl"
    assert main(["statements", "generate", "--task", "timedial", "--out", str(out), "--limit", "5"]) == 0
    assert "timedial" in capsys.readouterr().out and len(out.read_text().splitlines()) == 5
    assert main(["statements", "validate", str(out), "--out", str(tmp_path / "v")]) == 0
    printed = capsys.readouterr().out
    assert "bleu_mean" in printed and (tmp_path / "v" / "validation.jsonl").is_file()
