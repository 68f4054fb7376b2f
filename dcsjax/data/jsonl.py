"""Local benchmark files in the item format, one JSON object per line:

    {"id": "q1", "question": "...", "choices": ["...", "..."], "answer": 1,
     "statements": ["...", "..."], "idk": null}

`answer` is a 0-based index, an option's own text, a letter, or a list of those (several correct options);
`idk` (the "I don't know" option, optional) likewise; `id` (unique in the file) and `statements` are
optional. A line that is broken JSON, lacks a field, holds a field of the wrong type, repeats an earlier
line's id or fails a check becomes an `ItemError` naming the file, the line and the field, so a malformed
row is reported, never dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from dcsjax.data.items import LETTERS, Item, ItemError, check_item
from dcsjax.errors import InputError


def _index(value, choices: tuple[str, ...], field: str) -> int:
    """An option named by its 0-based index, its own text (first, so an option that is itself a letter is read
    as text) or its letter."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in choices:
            return choices.index(value)
        if len(value) == 1 and value.upper() in LETTERS[:len(choices)]:
            return LETTERS.index(value.upper())
    raise ValueError(f"{field}: {value!r} is not an option's index, text or letter")


def _strings(row: dict, field: str) -> tuple[str, ...]:
    value = row[field]
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{field}: expected a list of strings, got {type(value).__name__} {value!r:.60}")
    return tuple(value)


def jsonl_rows(path: str | Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line number, the line's JSON object, None) or (line number, None, why it is not one), for every
    non-blank line. A line that is not UTF-8 is one such error, named by its line and byte; the rest of
    the file is still read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read it: {err.strerror or err}") from err
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte-order mark starts some files
        except UnicodeDecodeError as err:
            yield number, None, f"not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
            continue
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            yield number, None, f"broken JSON: {err.msg}"
            continue
        if not isinstance(row, dict):
            yield number, None, "a line must hold a JSON object"
            continue
        yield number, row, None


def jsonl_items(path: str | Path) -> tuple[list[Item], list[ItemError]]:
    path = Path(path)
    items: list[Item] = []
    errors: list[ItemError] = []
    first_line: dict[str, int] = {}  # id -> the line that holds it
    for number, row, problem in jsonl_rows(path):
        where = f"{path}:{number}"
        if problem is not None:
            errors.append(ItemError(where, problem))
            continue
        try:
            missing = [k for k in ("question", "choices", "answer") if k not in row]
            if missing:
                raise ValueError(f"missing field {', '.join(missing)}")
            if not isinstance(row["question"], str):
                raise ValueError(f"question: expected a string, got {type(row['question']).__name__} {row['question']!r:.60}")
            if not isinstance(row.get("id", ""), (str, int)) or isinstance(row.get("id"), bool):
                raise ValueError(f"id: expected a string or a whole number, got {row['id']!r:.60}")
            choices = _strings(row, "choices")
            answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
            item_id = str(row.get("id", f"{path.stem}/{number}"))
            if item_id in first_line:
                raise ValueError(f"id {item_id!r} is on line {first_line[item_id]} already: ids must be unique")
            item = Item(id=item_id, question=row["question"], choices=choices,
                        correct=tuple(_index(a, choices, "answer") for a in answers),
                        statements=_strings(row, "statements") if row.get("statements") is not None else None,
                        idk=_index(row["idk"], choices, "idk") if row.get("idk") is not None else None,
                        source={"file": str(path), "line": number})
        except (ValueError, TypeError) as err:
            errors.append(ItemError(where, str(err)))
            continue
        first_line[item.id] = number
        checked = check_item(item, where)
        (items if isinstance(checked, Item) else errors).append(checked)
    return items, errors


def read_statements(path: Path) -> list[dict]:
    """A statements file's rows; a line that is broken, not UTF-8, lacks a field or whose statements do not
    match its options is an error naming the file and line."""
    rows = []
    for number, row, problem in jsonl_rows(path):
        try:
            if problem is not None:
                raise ValueError(problem)
            missing = [k for k in ("id", "question", "choices", "statements") if k not in row]
            if missing:
                raise ValueError(f"missing field {', '.join(missing)}")
            if len(row["statements"]) != len(row["choices"]):
                raise ValueError(f"{len(row['statements'])} statements for {len(row['choices'])} options")
        except (TypeError, ValueError) as err:
            raise InputError(f"{path}:{number}: not a statements row: {err}") from err
        rows.append({**row, "line": number})
    return rows
