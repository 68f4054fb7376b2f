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

from dcsjax.data.items import LETTERS, Item, ItemError, check_item


def _index(value, n: int) -> int:
    if isinstance(value, str) and len(value) == 1 and value.upper() in LETTERS[:n]:
        return LETTERS.index(value.upper())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f"answer {value!r} is neither an index nor a letter")


def jsonl_items(path: str | Path) -> tuple[list[Item], list[ItemError]]:
    path = Path(path)
    items: list[Item] = []
    errors: list[ItemError] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        where = f"{path}:{number}"
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("a line must hold a JSON object")
            missing = [k for k in ("question", "choices", "answer") if k not in row]
            if missing:
                raise ValueError(f"missing field {', '.join(missing)}")
            choices = tuple(row["choices"])
            answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
            item = Item(id=str(row.get("id", f"{path.stem}/{number}")), question=row["question"], choices=choices,
                        correct=tuple(_index(a, len(choices)) for a in answers),
                        statements=tuple(row["statements"]) if row.get("statements") is not None else None,
                        idk=row.get("idk"), source={"file": str(path), "line": number})
        except json.JSONDecodeError as err:
            errors.append(ItemError(where, f"broken JSON: {err.msg}"))
            continue
        except (ValueError, TypeError) as err:
            errors.append(ItemError(where, str(err)))
            continue
        checked = check_item(item, where)
        (items if isinstance(checked, Item) else errors).append(checked)
    return items, errors
