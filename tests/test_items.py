"""The item format and BIG-bench (read from a copy in its layout: the tests write one); bad rows become error
records, never dropped."""

import json

import numpy as np
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


def test_known_unknowns_has_its_idk_choice(bigbench_copy):
    """A BIG-bench task read from a copy (the tests' own checkout, in BIG-bench's layout)."""
    items, errors = load_task(resolve_task("bigbench:known_unknowns"))
    assert len(items) == 12 and not errors
    unanswerable = [i for i in items if not i.answerable]
    assert len(unanswerable) == 6 and all(i.choices[i.idk].strip() == "Unknown" for i in items)
    first = items[0]
    assert first.question == "What is the capital of France?" and first.id == "known_unknowns/0"
    assert first.choices == ("Paris", "Unknown") and first.correct == (0,) and first.idk == 1
    assert first.source == {"benchmark": "bigbench:known_unknowns", "example": 0, "input": first.question}


def test_subtasks_prefix_and_statements(bigbench_copy):
    items, _ = load_task(resolve_task("logical_deduction_three_objects"))
    assert len(items) == 8 and items[0].statements is None  # the card's rule writes them (below)
    assert items[0].question.startswith("The following paragraphs each describe a set of objects")
    whole, _ = bigbench.bigbench_items("logical_deduction")
    assert len(whole) == 8 + 8  # three and five objects
    card = resolve_task("known_unknowns")  # no declarative rule: APS refuses it, qa-ppl ranks question + option
    assert declarative_statements(card) is None
    assert qa_texts(card)(load_task(card)[0][0])[1] == "Q: What is the capital of France?\nA: Unknown"
    # misconceptions' "The claim '...' is true/false." would be a P(True) probe (002 section 4), not APS
    assert declarative_statements(resolve_task("misconceptions")) is None
    card = resolve_task("logical_deduction_three_objects")  # the premises, each option their conclusion (002 A.1)
    first = load_task(card)[0][0]
    statements = declarative_statements(card)(first)
    assert statements == [f"{first.question} {c}" for c in first.choices]
    assert statements[0].endswith("Puzzle 0 with 3 books. The red book is the leftmost.")


def test_card_statements_keep_002s_length_gap_to_the_question_answer_pair(bigbench_copy):
    """002 A.2: a statement is about as long as its question-answer pair (median gap about -1 token there). Every
    rule a BIG-bench card has (the options as statements, a cloze blank filled), in words: the median of the
    per-item median gaps within [-2, 1] (a bare-option statement of logical_deduction sat about 60 words short)."""
    from dcsjax.metrics.statements import statement_metrics

    for task in ("logical_deduction_three_objects", "timedial"):
        card = resolve_task(task)
        items = load_task(card)[0][:200]
        rule = declarative_statements(card)
        rows = [{"id": i.id, "question": i.question, "choices": i.choices, "statements": rule(i)} for i in items]
        gap = float(np.median([m["median_gap"] for m in statement_metrics(rows)]))
        print(f"{task}: median length gap {gap:+.1f} words over {len(rows)} items")
        assert -2 <= gap <= 1, (task, gap)


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


def test_bigbench_from_a_given_checkout_and_a_refused_copy(tmp_path, monkeypatch):
    """Where the index no longer serves the sdist, `dcsjax fetch bigbench --from PATH` takes a checkout's task
    files (laid out as the sdist's, the cache naming where they came from); a file that is not the sdist (its
    SHA-256) or a folder without task files is refused, naming the path, and the cache keeps what it held."""
    import tarfile

    from dcsjax.cli import main
    from dcsjax.errors import FetchError

    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path / "cache"))
    checkout = tmp_path / "BIG-bench"
    task = checkout / "bigbench" / "benchmark_tasks" / "toy" / "easy" / "task.json"
    task.parent.mkdir(parents=True)
    task.write_text(json.dumps({"examples": [{"input": "2 + 2 =", "target_scores": {"3": 0, "4": 1}}]}))
    assert main(["fetch", "bigbench", "--from", str(checkout)]) == 0
    (item,), errors = bigbench.bigbench_items("toy/easy")
    assert (item.question, item.correct, errors) == ("2 + 2 =", (1,), [])
    assert (tmp_path / "cache" / "bigbench" / "COMPLETE").read_text() == f"checkout {checkout.resolve()}\n"
    wrong = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(wrong, "w:gz") as tar:
        tar.add(checkout, arcname="bigbench-1.0.0")
    with pytest.raises(FetchError, match=f"{wrong}: SHA-256 .*, expected {bigbench.SDIST_SHA256}"):
        bigbench.fetch_bigbench(source=wrong)
    with pytest.raises(FetchError, match="not a BIG-bench checkout"):
        bigbench.fetch_bigbench(source=task.parent.parent)  # a task folder, not the checkout
    assert bigbench.bigbench_items("toy/easy")[0] == [item]  # still the checkout's


def test_an_index_without_the_sdist_says_how_to_give_a_copy(tmp_path, monkeypatch):
    """pip's answer where the index lacks `bigbench==1.0.0` (as it has since it dropped that release) becomes
    one error naming the sdist, pip's reason and `--from`; pip's other failures stay plain fetch errors."""
    import subprocess

    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path))
    said = ("ERROR: Could not find a version that satisfies the requirement bigbench==1.0.0 (from versions: 0.0.1)\n"
            "ERROR: No matching distribution found for bigbench==1.0.0\n")
    monkeypatch.setattr(bigbench.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", said))
    with pytest.raises(bigbench.BigBenchUnavailable, match=r"bigbench==1.0.0 is not on the package index any more "
                       r"\(ERROR: Could not find .*\(from versions: 0.0.1\).*\).*dcsjax fetch bigbench --from PATH"):
        bigbench.fetch_bigbench(quiet=True)
    monkeypatch.setattr(bigbench.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "timed out"))
    with pytest.raises(bigbench.FetchError, match="pip download bigbench==1.0.0 failed") as err:
        bigbench.fetch_bigbench(quiet=True)
    assert not isinstance(err.value, bigbench.BigBenchUnavailable) and "--from PATH" in str(err.value)


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


def test_json_and_csv_files_with_a_field_mapping(tmp_path):
    """The same three items as JSONL, a JSON array and CSV (options as columns A-D, and as one column holding a
    list), answers given as index, letter and text, read through a card's `fields`; bad rows named by file
    and line (a JSON array's element), never dropped."""
    from dcsjax.data.tasks import read_card

    want = [("q1", "2 + 2?", ("3", "4", "5"), (1,), None), ("q2", "Capital of France?", ("Rome", "Paris", "I don't know"), (1,), 2),
            ("q3", "Red is a", ("colour", "sound"), (0,), None)]
    rows = [{"qid": "q1", "prompt": "2 + 2?", "options": ["3", "4", "5"], "label": 1},
            {"qid": "q2", "prompt": "Capital of France?", "options": ["Rome", "Paris", "I don't know"], "label": "B",
             "abstain": "I don't know"},
            {"qid": "q3", "prompt": "Red is a", "options": ["colour", "sound"], "label": "colour"}]
    fields = 'fields = { id = "qid", question = "prompt", choices = "options", answer = "label", idk = "abstain" }\n'
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.json").write_text(json.dumps(rows))
    (tmp_path / "t.csv").write_text('qid,prompt,A,B,C,label,abstain\nq1,2 + 2?,3,4,5,1,\n'
                                    'q2,Capital of France?,Rome,Paris,I don\'t know,B,I don\'t know\nq3,Red is a,colour,sound,,colour,\n')
    (tmp_path / "lists.csv").write_text('qid,prompt,options,label,abstain\nq1,2 + 2?,"[""3"", ""4"", ""5""]",1,\n'
                                        'q2,Capital of France?,"[""Rome"", ""Paris"", ""I don\'t know""]",B,I don\'t know\n'
                                        'q3,Red is a,"[""colour"", ""sound""]",colour,\n')
    for name, mapping in [("t.jsonl", fields), ("t.json", fields), ("lists.csv", fields),
                          ("t.csv", fields.replace('choices = "options"', 'choices = ["A", "B", "C"]'))]:
        kind = name.rsplit(".", 1)[1]
        (tmp_path / "card.toml").write_text(f'name = "t"\nsource = "{kind}:{name}"\n' + mapping)
        items, errors = load_task(read_card(tmp_path / "card.toml"))
        assert not errors, (name, errors)
        assert [(i.id, i.question, i.choices, i.correct, i.idk) for i in items] == want, name

    # a CSV without a card: question, answer and the options' columns A, B, ...
    (tmp_path / "plain.csv").write_text("question,A,B,answer\nSky?,blue,green,A\nGrass?,blue,green,\nSea?,wet\n")
    items, errors = load_task(resolve_task(f"csv:{tmp_path / 'plain.csv'}"))
    assert [(i.question, i.correct) for i in items] == [("Sky?", (0,))]
    assert [(e.where, e.reason) for e in errors] == [(f"{tmp_path / 'plain.csv'}:3", "missing field answer"),
                                                     (f"{tmp_path / 'plain.csv'}:4", "missing field answer")]
    (tmp_path / "bad.json").write_text('[{"question": "a?", "choices": ["x", "y"], "answer": 0}, 7]')
    items, errors = load_task(resolve_task(f"json:{tmp_path / 'bad.json'}"))
    assert len(items) == 1 and [(e.where, e.reason) for e in errors] == [(f"{tmp_path / 'bad.json'}:2",
                                                                          "an element must be a JSON object")]
