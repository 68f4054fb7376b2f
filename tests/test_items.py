"""The item format and BIG-bench, read from the real sdist; bad rows become error records, never dropped."""

import json

import pytest

from dcsjax.data import bigbench
from dcsjax.data.items import Item, ItemError, check_item
from dcsjax.data.tasks import declarative_statements, load_task, qa_texts, resolve_task

GOOD = Item(id="x", question="2 + 2 =", choices=("3", "4"), correct=(1,))


@pytest.mark.parametrize("change,reason", [
    (dict(question=""), "empty question"),
    (dict(choices=("4",), correct=(0,)), "fewer than two options"),
    (dict(correct=(2,)), "out of range"),
    (dict(correct=()), "no correct option"),
    (dict(choices=("4", " 4")), "duplicate option"),
    (dict(choices=("3", "")), "option 1 is empty"),
    (dict(statements=("Two and two make three.",)), "1 statements for 2 options"),
])
def test_check_item_names_the_reason(change, reason):
    from dataclasses import replace

    assert check_item(GOOD, "f:1") is GOOD
    error = check_item(replace(GOOD, **change), "f:1")
    assert isinstance(error, ItemError) and reason in error.reason and error.where == "f:1"


def test_known_unknowns_has_its_idk_choice():
    items, errors = load_task(resolve_task("bigbench:known_unknowns"))
    assert len(items) == 46 and not errors
    unanswerable = [i for i in items if not i.answerable]
    assert unanswerable and all(i.choices[i.idk].strip() == "Unknown" for i in items)
    first = items[0]
    assert first.question == "How often did Abraham Lincoln cut his toenails?"
    assert first.choices == ("Every Saturday night", "Unknown") and first.correct == (1,) and first.idk == 1


def test_subtasks_prefix_and_statements():
    items, _ = load_task(resolve_task("logical_deduction_three_objects"))
    assert len(items) == 300 and items[0].statements == items[0].choices
    assert items[0].question.startswith("The following paragraphs each describe a set of three objects")
    whole, _ = bigbench.bigbench_items("logical_deduction")
    assert len(whole) == 300 + 500 + 700  # three, five and seven objects
    card = resolve_task("known_unknowns")  # no declarative rule: APS refuses it, qa-ppl ranks question + option
    assert declarative_statements(card) is None
    assert qa_texts(card)(load_task(card)[0][0])[1] == "Q: How often did Abraham Lincoln cut his toenails?\nA: Unknown"
    card = resolve_task("misconceptions")  # the claim with the option's word: a declarative statement
    first = load_task(card)[0][0]
    assert declarative_statements(card)(first) == ["The claim 'Twinkies are edible for decades or longer.' is true.",
                                                   "The claim 'Twinkies are edible for decades or longer.' is false."]


def test_bad_examples_are_reported(tmp_path, monkeypatch):
    root = tmp_path / "benchmark_tasks"
    (root / "toy").mkdir(parents=True)
    examples = [
        {"input": "fine", "target_scores": {"a": 1, "b": 0}},
        {"input": "no correct option", "target_scores": {"a": 0, "b": 0}},
        {"input": "generative", "target": "x"},
        {"input": "dup", "target_scores": {"a": 1, "a ": 0}},
        {"input": "two correct", "target_scores": {"a": 1, "b": 1, "c": 0}},
    ]
    (root / "toy" / "task.json").write_text(json.dumps({"examples": examples}))
    monkeypatch.setattr(bigbench, "fetch_bigbench", lambda quiet=False: root)
    items, errors = bigbench.bigbench_items("toy")
    assert [i.id for i in items] == ["toy/0", "toy/4"] and items[1].correct == (0, 1)
    assert [e.reason.split(" ")[0] for e in errors] == ["no", "no", "duplicate"]
    assert all("example" in e.where for e in errors)
    (root / "broken").mkdir()
    (root / "broken" / "task.json").write_text('{"examples": [')
    with pytest.raises(Exception, match="broken JSON at line 1"):
        bigbench.bigbench_items("broken")
    with pytest.raises(Exception, match="no task 'tyo'"):
        bigbench.bigbench_items("tyo")


def test_local_jsonl_file_reports_every_bad_line(tmp_path):
    from dcsjax.data.tasks import resolve_task

    rows = [
        '{"id": "ok", "question": "2 + 2 =", "choices": ["3", "4"], "answer": "B"}',
        '{"question": "no choices", "answer": 0}',
        '{"question": "label out of range", "choices": ["a", "b"], "answer": 5}',
        '{"question": "one option", "choices": ["a"], "answer": 0}',
        '{"question": "duplicates", "choices": ["a", "a"], "answer": 0}',
        '{"question": "", "choices": ["a", "b"], "answer": 0}',
        '{"question": "broken", "choices": ["a", "b"], "answer": 0',
        '',
        '{"question": "several", "choices": ["a", "b", "c"], "answer": [0, "C"], "idk": 1}',
    ]
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join(rows) + "\n")
    items, errors = load_task(resolve_task(f"jsonl:{path}"))
    assert [i.id for i in items] == ["ok", "bench/9"] and items[0].correct == (1,) and items[1].correct == (0, 2)
    assert [(e.where.rsplit(":", 1)[1], e.reason.split(" ")[0]) for e in errors] == [
        ("2", "missing"), ("3", "correct"), ("4", "fewer"), ("5", "duplicate"), ("6", "empty"), ("7", "broken")]


def test_jsonl_rows_are_checked_by_field_and_repeated_ids_refused_naming_both_lines(tmp_path):
    """Each bad row is an error naming file, line and field, and the others load; answers and IDK by index,
    letter or an option's own text; a byte-order mark is not part of the first row."""
    from dcsjax.data.jsonl import jsonl_items

    rows = [
        {"id": "a", "question": "Sky?", "choices": ["blue", "green", "Unknown"], "answer": "blue", "idk": "Unknown"},
        {"id": "b", "question": "Grass?", "choices": ["blue", "green"], "answer": "B"},
        {"id": "a", "question": "Again?", "choices": ["yes", "no"], "answer": 0},
        {"id": "c", "question": "Yes?", "choices": "yes", "answer": 0},
        {"id": "d", "question": 42, "choices": ["x", "y"], "answer": 0},
        {"id": "e", "question": "Which?", "choices": ["x", "y"], "answer": "z"},
        {"id": "f", "question": "Which?", "choices": ["x", "y"], "answer": 1, "idk": "C"},
        {"id": "g", "question": "Letters?", "choices": ["B", "A"], "answer": "A"},
    ]
    path = tmp_path / "own.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    items, errors = jsonl_items(path)
    by_id = {i.id: i for i in items}
    assert sorted(by_id) == ["a", "b", "g"]
    assert (by_id["a"].correct, by_id["a"].idk, by_id["b"].correct) == ((0,), 2, (1,))
    assert by_id["g"].correct == (1,)  # an option's own text wins over a letter
    assert [(e.where, e.reason) for e in errors] == [
        (f"{path}:3", "id 'a' is on line 1 already: ids must be unique"),
        (f"{path}:4", "choices: expected a list of strings, got str 'yes'"),
        (f"{path}:5", "question: expected a string, got int 42"),
        (f"{path}:6", "answer: 'z' is not an option's index, text or letter"),
        (f"{path}:7", "idk: 'C' is not an option's index, text or letter"),
    ]
