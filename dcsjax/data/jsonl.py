"""Local benchmark files in the item format, one JSON object per line:

    {"id": "q1", "question": "...", "choices": ["...", "..."], "answer": 1,
     "statements": ["...", "..."], "idk": null}

`answer` is a 0-based index, a letter, or a list of either (several correct options); `id`, `statements`
and `idk` are optional. A line that is broken JSON, lacks a field or fails a check becomes an `ItemError`
naming the file and line, so a malformed row is reported, never dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from dcsjax.data.items import LETTERS, Item, ItemError, check_item
from dcsjax.errors import InputError


def _index(value, n: int) -> int:
    if isinstance(value, str) and len(value) == 1 and value.upper() in LETTERS[:n]:
        return LETTERS.index(value.upper())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"answer {value!r} is neither an index nor a letter")


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
            line = raw.decode("utf-8")
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
    for number, row, problem in jsonl_rows(path):
        where = f"{path}:{number}"
        if problem is not None:
            errors.append(ItemError(where, problem))
            continue
        try:
            missing = [k for k in ("question", "choices", "answer") if k not in row]
            if missing:
                raise ValueError(f"missing field {', '.join(missing)}")
            choices = tuple(row["choices"])
            answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
            item = Item(id=str(row.get("id", f"{path.stem}/{number}")), question=row["question"], choices=choices,
                        correct=tuple(_index(a, len(choices)) for a in answers),
                        statements=tuple(row["statements"]) if row.get("statements") is not None else None,
                        idk=row.get("idk"), source={"file": str(path), "line": number})
        except (ValueError, TypeError) as err:
            errors.append(ItemError(where, str(err)))
            continue
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
        rows.append(row)
    return rows
