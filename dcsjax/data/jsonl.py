"""Local benchmark files: JSONL (one JSON object a line), JSON (an array of objects) or CSV (a header row),
each row one item:

    {"id": "q1", "question": "...", "choices": ["...", "..."], "answer": 1,
     "statements": ["...", "..."], "idk": null}

`answer` is a 0-based index, an option's own text, a letter, or a list of those (several correct options);
`idk` (the "I don't know" option, optional) likewise; `id` (unique in the file) and `statements` are
optional. A card's `fields` maps these names to the file's own columns (`choices` to one column holding a
list, or to a list of columns, one option each); a CSV without a `choices` column takes its options from
the columns named A, B, C, ... . A row that is broken, lacks a field, holds a field of the wrong type,
repeats an earlier row's id or fails a check becomes an `ItemError` naming the file, the line (a JSON
array's element number) and the field, so a malformed row is reported, never dropped.
"""

from __future__ import annotations

import csv
import io
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
        if value.strip().isdigit():  # a CSV cell holds every index as text
            return int(value)
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


FILE_KINDS = ("jsonl", "json", "csv")


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except OSError as err:
        raise InputError(f"{path}: cannot read it: {err.strerror or err}") from err
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 (byte 0x{err.object[err.start]:02x} at offset {err.start})") from err


def json_rows(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """A JSON array's elements, numbered from 1, as `jsonl_rows` gives lines."""
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: broken JSON at line {err.lineno}: {err.msg}") from err
    if not isinstance(data, list):
        raise InputError(f"{path}: a JSON task file holds an array of objects, not a {type(data).__name__}")
    for number, row in enumerate(data, start=1):
        yield (number, row, None) if isinstance(row, dict) else (number, None, "an element must be a JSON object")


def csv_rows(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """A CSV file's rows under its header, numbered by the line each ends on; empty cells are absent."""
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    try:
        for row in reader:
            if None in row:
                yield reader.line_num, None, f"{len(row[None])} cell(s) more than the header's {len(reader.fieldnames)}"
                continue
            yield reader.line_num, {k: v for k, v in row.items() if v not in (None, "")}, None
    except csv.Error as err:
        yield reader.line_num, None, f"broken CSV: {err}"


def _mapped(row: dict, fields: dict | None, kind: str) -> dict:
    """The row under the item's field names (`fields`: item field -> column, or list of columns for choices)."""
    fields = dict(fields or {})
    if kind == "csv" and "choices" not in fields and "choices" not in row:
        fields["choices"] = [letter for letter in LETTERS if letter in row]
    out = {k: v for k, v in row.items() if k not in fields.values()}
    for name, column in fields.items():
        if isinstance(column, list):
            out[name] = [row[c] for c in column if c in row]
        elif column in row:
            out[name] = row[column]
    return out


def file_items(path: str | Path, kind: str = "jsonl", fields: dict | None = None) -> tuple[list[Item], list[ItemError]]:
    """Items of a local file of `kind` (FILE_KINDS), its columns mapped by `fields` (a card's)."""
    path = Path(path)
    rows = {"jsonl": jsonl_rows, "json": json_rows, "csv": csv_rows}[kind](path)
    items: list[Item] = []
    errors: list[ItemError] = []
    first_line: dict[str, int] = {}  # id -> the line that holds it
    for number, row, problem in rows:
        where = f"{path}:{number}"
        if problem is not None:
            errors.append(ItemError(where, problem))
            continue
        row = _mapped(row, fields, kind)
        if kind == "csv" and isinstance(row.get("choices"), str):  # one cell holding a JSON list
            try:
                row["choices"] = json.loads(row["choices"])
            except json.JSONDecodeError:
                pass  # reported below as not a list of strings
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


def jsonl_items(path: str | Path) -> tuple[list[Item], list[ItemError]]:
    return file_items(path, "jsonl")


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
