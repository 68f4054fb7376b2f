"""Where a task's items come from: one registry of source kinds, keyed by what a card's `source` says before
its colon (`wheel`, `hub:cais/mmlu`, `bigbench:known_unknowns`, `jsonl:items.jsonl`, ...). Each kind reads a
card into (items, error records); a row that cannot be read is an error record naming where it stands."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dcsjax.data.items import Item, ItemError
from dcsjax.errors import DcsjaxError

Loaded = tuple[list[Item], list[ItemError]]


def source_kind(source: str) -> str:
    return source.partition(":")[0]


def payload(card):
    """The card's wheel payload (`dcsjax.cache.Payload`), named in the cache by its file's stem; the error where
    the index lacks it names the card's other sources."""
    from dcsjax.cache import Payload

    if not card.payload:
        raise DcsjaxError(f"card {card.name}: source 'wheel' needs a [payload] table (wheels, members, sha256)")
    stem = Path(card.payload["file"]).stem
    others = ", ".join(f"{src} (--tasks {stem}@{name})" for name, src in (card.sources or {}).items())
    if card.schema == "mmlu":
        others += f", MMLU's CSV folder (--tasks {stem}@csvdir:PATH)"
    try:
        return Payload.from_table("data", stem, card.payload, elsewhere=others)
    except KeyError as err:
        raise DcsjaxError(f"card {card.name}: its [payload] table lacks {err.args[0]!r}") from err


# Row readers of the `wheel` kind, by the card's schema: the rows (where, row, problem) and the card -> items.
def _mmlu_rows(rows, card) -> Loaded:
    from dcsjax.data.mmlu import mmlu_items

    return mmlu_items(rows, card.subjects, {"source": card.source})


WHEEL_SCHEMAS: dict[str, Callable] = {"mmlu": _mmlu_rows}


def _wheel(card) -> Loaded:
    from dcsjax.cache import fetch
    from dcsjax.data.jsonl import jsonl_rows

    if card.schema not in WHEEL_SCHEMAS:
        raise DcsjaxError(f"card {card.name}: a wheel source reads schema {', '.join(WHEEL_SCHEMAS)}, not {card.schema!r}")
    path = fetch(payload(card), quiet=True)
    return WHEEL_SCHEMAS[card.schema](((f"{path}:{n}", row, problem) for n, row, problem in jsonl_rows(path)), card)


def _csv_folder(card) -> Loaded:
    from dcsjax.data.mmlu import csv_folder_rows, mmlu_items

    if card.schema != "mmlu":
        raise DcsjaxError(f"card {card.name}: a csvdir: source is MMLU's CSV folder, for schema mmlu")
    return mmlu_items(csv_folder_rows(card.source.removeprefix("csvdir:"), card.subjects), card.subjects,
                      {"source": card.source})


def _hub(card) -> Loaded:
    from dcsjax.data.hub import hub_items

    return hub_items(card.name, card.source.removeprefix("hub:"), card.schema, card.hub_config, card.split,
                     subjects=card.subjects)


def _bigbench(card) -> Loaded:
    from dcsjax.data.bigbench import bigbench_items

    return bigbench_items(card.source.removeprefix("bigbench:"), card.idk_choice)


def _file(card) -> Loaded:
    from dcsjax.data.jsonl import file_items

    kind, _, path = card.source.partition(":")
    return file_items(path, kind, card.fields)


SOURCES: dict[str, Callable] = {"wheel": _wheel, "hub": _hub, "bigbench": _bigbench, "csvdir": _csv_folder,
                                "jsonl": _file, "json": _file, "csv": _file}


def read_source(card) -> Loaded:
    kind = source_kind(card.source)
    if kind not in SOURCES:
        raise DcsjaxError(f"card {card.name}: source {card.source!r} is not supported; the kinds: {', '.join(SOURCES)}")
    return SOURCES[kind](card)
