"""Hub dataset adapters on small local files of each dataset's real schema, read through the same
`datasets.load_dataset` path; a row that lacks a field or fails a check is an error record."""

import json

import pytest

from dcsjax.data.hub import hub_items
from dcsjax.data.tasks import benchmark_cards

ROWS = {  # schema -> (a real-shaped row, expected (question, choices, correct))
    "arc": ({"id": "Mercury_7", "question": "Which gas do plants take in?", "choices": {
        "text": ["oxygen", "carbon dioxide", "helium", "neon"], "label": ["A", "B", "C", "D"]}, "answerKey": "B"},
        ("Which gas do plants take in?", ("oxygen", "carbon dioxide", "helium", "neon"), (1,))),
    "openbookqa": ({"id": "7-980", "question_stem": "The sun is responsible for", "choices": {
        "text": ["puppies learning", "plants sprouting", "rocks melting", "ice forming"],
        "label": ["A", "B", "C", "D"]}, "answerKey": "B", "fact1": "x"},
        ("The sun is responsible for", ("puppies learning", "plants sprouting", "rocks melting", "ice forming"), (1,))),
    "qasc": ({"id": "3E7T", "question": "What do trees produce?", "choices": {
        "text": ["oxygen", "sand"], "label": ["A", "B"]}, "answerKey": "A"},
        ("What do trees produce?", ("oxygen", "sand"), (0,))),
    "commonsense_qa": ({"id": "075e", "question": "Where would you find a bed?", "question_concept": "bed",
                        "choices": {"label": ["A", "B", "C"], "text": ["bedroom", "ocean", "sky"]}, "answerKey": "A"},
                       ("Where would you find a bed?", ("bedroom", "ocean", "sky"), (0,))),
    "mmlu": ({"question": "2 + 2 =", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1},
             ("2 + 2 =", ("3", "4", "5", "6"), (1,))),
    "mmlu_pro": ({"question_id": 70, "question": "Which is prime?", "options": ["4", "6", "7", "8", "9"],
                  "answer": "C", "answer_index": 2, "category": "math"},
                 ("Which is prime?", ("4", "6", "7", "8", "9"), (2,))),
    "truthfulqa_mc1": ({"question": "What happens if you crack your knuckles?", "mc1_targets": {
        "choices": ["Nothing in particular happens.", "You will get arthritis."], "labels": [1, 0]}},
        ("What happens if you crack your knuckles?", ("Nothing in particular happens.", "You will get arthritis."), (0,))),
    "hellaswag": ({"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.",
                   "ctx_b": "he", "ctx": "A man is sitting on a roof. he", "endings": [
                       "is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "holds a rubik's cube.",
                       "starts pulling up roofing on a roof."], "source_id": "activitynet~v_-JhWjGDPHMY",
                   "split": "val", "split_type": "indomain", "label": "3"},
                  # lm-eval's query: activity label, ctx_a, ctx_b capitalised
                  ("Roof shingle removal: A man is sitting on a roof. He", (
                      "is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "holds a rubik's cube.",
                      "starts pulling up roofing on a roof."), (3,))),
    "hellaswag-wikihow": ({"ind": 4, "activity_label": "Home and Garden", "ctx_a": "[header] How to grow grass in "
                           "shade [title] Choose a shade tolerant grass.", "ctx_b": "[step] Fescues do well in shade.",
                           "ctx": "x", "endings": ["[substeps] Water it often.", "Paint the grass [title] green.",
                                                   "Leave it.", "Mow  it."],
                           "source_id": "wikihow~7", "split": "val", "split_type": "zeroshot", "label": "0"},
                          # [title] -> ". ", other [markers] gone, double spaces closed, capitalize() lowers the rest
                          ("Home and Garden: How to grow grass in shade. Choose a shade tolerant grass. fescues do "
                           "well in shade.", (" Water it often.", "Paint the grass. green.", "Leave it.", "Mow it."),
                           (0,))),
    "piqa": ({"goal": "To open a jar,", "sol1": "twist the lid.", "sol2": "bake it.", "label": 0},
             ("To open a jar,", ("twist the lid.", "bake it."), (0,))),
    "winogrande": ({"sentence": "Sarah was a much better surgeon than Maria so _ got the harder cases.",
                    "option1": "Sarah", "option2": "Maria", "answer": "1"},
                   ("Sarah was a much better surgeon than Maria so _ got the harder cases.", ("Sarah", "Maria"), (0,))),
    "copa": ({"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.",
              "choice2": "The grass was cut.", "question": "cause", "idx": 0, "label": 0},
             ("My body cast a shadow over the grass. What was the cause?", ("The sun was rising.", "The grass was cut."), (0,))),
    "bbh": ({"input": "Today is Christmas Eve of 1937. What is the date tomorrow in MM/DD/YYYY?\nOptions:\n"
                      "(A) 12/11/1937\n(B) 12/25/1937\n(C) 01/04/1938", "target": "(B)"},
            ("Today is Christmas Eve of 1937. What is the date tomorrow in MM/DD/YYYY?",
             ("12/11/1937", "12/25/1937", "01/04/1938"), (1,))),
    "winogender": ({"sentid": "technician.customer.1.male.txt", "sentence":
                    "The technician told the customer that he could pay with cash.", "pronoun": "he",
                    "occupation": "technician", "participant": "customer", "gender": "male",
                    "target": "customer", "label": 1},
                   ("The technician told the customer that he could pay with cash. 'He' refers to",
                    ("the technician", "the customer"), (1,))),
}


def write(tmp_path, rows):
    path = tmp_path / "rows.json"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


@pytest.mark.parametrize("schema", sorted(ROWS))
def test_schema_adapter(schema, tmp_path):
    row, (question, choices, correct) = ROWS[schema]
    items, errors = hub_items("t", "local", schema.split("-")[0], data_files=write(tmp_path, [row]))
    assert not errors and len(items) == 1
    item = items[0]
    assert (item.question, item.choices, item.correct) == (question, choices, correct)


@pytest.mark.parametrize("schema,row", [
    ("sciq", {"question": "What gas do we exhale?", "correct_answer": "carbon dioxide", "distractor1": "oxygen",
              "distractor2": "helium", "distractor3": "argon", "support": ""}),
    ("gpqa", {"Question": "Which particle is a lepton?", "Correct Answer": "electron",
              "Incorrect Answer 1": "proton", "Incorrect Answer 2": "neutron", "Incorrect Answer 3": "pion"}),
])
def test_shuffled_sources_are_reproducible(schema, row, tmp_path):
    files = write(tmp_path, [row, row])
    first, _ = hub_items("t", "local", schema, data_files=files)
    again, _ = hub_items("t", "local", schema, data_files=files)
    assert first == again
    correct = row.get("correct_answer") or row["Correct Answer"]
    assert all(i.choices[i.correct[0]] == correct and len(i.choices) == 4 for i in first)


def test_bad_rows_are_reported(tmp_path):
    good, _ = ROWS["mmlu"]
    rows = [good, {"question": "no choices", "answer": 0}, {**good, "answer": 7}, {**good, "choices": ["a", " "]}]
    items, errors = hub_items("t", "local", "mmlu", data_files=write(tmp_path, rows))
    assert len(items) == 1
    assert [e.reason.split(" ")[0] for e in errors] == ["missing", "answer", "option"]
    assert [e.where.rsplit(" ", 1)[1] for e in errors] == ["1", "2", "3"]


def test_every_hub_card_names_a_known_schema():
    from dcsjax.data.hub import SCHEMAS, SHUFFLED

    hub = [c for c in benchmark_cards().values()
           if c.source.startswith("hub:") or any(s.startswith("hub:") for s in (c.sources or {}).values())]
    # 15 cards read from the hub, and MMLU's card and its four variants can (mmlu@hub)
    assert len(hub) == 20 and all(c.schema in SCHEMAS or c.schema in SHUFFLED or c.schema == "mmlu" for c in hub)


def test_winogender_someone_and_ids(tmp_path):
    """The bleached participant "someone" takes no article, and items are named by the dataset's sentid."""
    row = {**ROWS["winogender"][0], "sentid": "technician.someone.1.male.txt", "participant": "someone",
           "sentence": "The technician told someone that he could pay with cash.", "target": "someone"}
    items, errors = hub_items("winogender", "local", "winogender", data_files=write(tmp_path, [row]))
    assert not errors
    assert items[0].choices == ("the technician", "someone") and items[0].id == "winogender/technician.someone.1.male.txt"


@pytest.mark.slow
def test_winogrande_is_scored_as_lm_eval_scores_it(tmp_path):
    """APS fills the blank; MCQA-LL is lm-eval's partial evaluation: the sentence up to the blank with each
    option as the context, the rest of the sentence (after " ") as the continuation."""
    from conftest import scorer_for
    from dcsjax.data.tasks import declarative_statements, resolve_task
    from dcsjax.eval.protocols.mcqa import partial_contexts, run_mcqa

    card = resolve_task("winogrande")
    row = {"sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.",
           "option1": "Sarah", "option2": "Maria", "answer": "1"}
    (item,), _ = hub_items("winogrande", "local", "winogrande", data_files=write(tmp_path, [row]))
    assert declarative_statements(card)(item) == [
        "Sarah was a much better surgeon than Maria so Sarah always got the harder cases.",
        "Sarah was a much better surgeon than Maria so Maria always got the harder cases."]
    contexts, rest = partial_contexts(item, card.cloze_blank)
    assert contexts == ["Sarah was a much better surgeon than Maria so Sarah",
                        "Sarah was a much better surgeon than Maria so Maria"] and rest == " always got the harder cases."
    scorer = scorer_for("smollm2-135m-instruct")
    (record,) = run_mcqa(scorer, [item], card)
    direct = scorer.score_continuations(contexts, [rest, rest])
    assert record["loglik"] == pytest.approx(direct, abs=1e-4)
    assert record["choice"]["sum"] == int(direct.argmax())
