"""Benchmark cards (`benchmarks/*.toml`) and the tasks they name.

A task is named by its card (`known_unknowns`) or by its source (`bigbench:known_unknowns`, card or no
card). The card says where the items come from, which option means "I don't know", and how APS gets its
declarative statements: the options themselves (`statements = "choices"`) or a template.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from typing import Callable

from dcsjax.cards import cards_dir
from dcsjax.data.items import Item, ItemError
from dcsjax.errors import DcsjaxError

DEFAULT_TEMPLATE = "{question} {choice}"


@dataclass(frozen=True)
class BenchmarkCard:
    name: str
    source: str
    idk_choice: str | None = None
    statements: str = "template"  # "template" or "choices"
    statement_template: str = DEFAULT_TEMPLATE
    # a cloze task's blank in the question ("<MASK>", "_"): its statements fill the blank with each option
    cloze_blank: str | None = None
    # hub datasets (source "hub:<dataset>"): its config, split and row schema (dcsjax/data/hub.py)
    hub_config: str | None = None
    split: str = "test"
    schema: str | None = None

    @property
    def slug(self) -> str:
        return self.name.replace("/", "-").replace(":", "-")


def benchmark_cards() -> dict[str, BenchmarkCard]:
    cards = {}
    for path in sorted(cards_dir("benchmarks").glob("*.toml")):
        try:
            raw = tomllib.loads(path.read_text())
            cards[raw["name"]] = BenchmarkCard(**raw)
        except (KeyError, TypeError, tomllib.TOMLDecodeError) as err:
            raise DcsjaxError(f"{path}: malformed benchmark card: {err!r}") from err
    return cards


def resolve_task(task: str) -> BenchmarkCard:
    cards = benchmark_cards()
    if task in cards:
        return cards[task]
    for card in cards.values():
        if card.source == task:
            return card
    if task.startswith("bigbench:"):
        return BenchmarkCard(name=task.removeprefix("bigbench:").replace("/", "_"), source=task)
    if task.startswith("jsonl:"):
        from pathlib import Path

        return BenchmarkCard(name=Path(task.removeprefix("jsonl:")).stem, source=task)
    raise DcsjaxError(f"unknown task {task!r}: not a benchmark card ({', '.join(cards)}), bigbench:<task> "
                      "nor jsonl:<file>")


def load_task(card: BenchmarkCard) -> tuple[list[Item], list[ItemError]]:
    if card.source.startswith("bigbench:"):
        from dcsjax.data.bigbench import bigbench_items

        items, errors = bigbench_items(card.source.removeprefix("bigbench:"), card.idk_choice)
    elif card.source.startswith("hub:"):
        from dcsjax.data.hub import hub_items

        items, errors = hub_items(card.name, card.source.removeprefix("hub:"), card.schema, card.hub_config, card.split)
    elif card.source.startswith("jsonl:"):
        from dcsjax.data.jsonl import jsonl_items

        items, errors = jsonl_items(card.source.removeprefix("jsonl:"))
    else:
        raise DcsjaxError(f"card {card.name}: source {card.source!r} is not supported")
    if card.statements == "choices":
        items = [replace(i, statements=i.choices) for i in items]
    return items, errors


def cloze_statement(question: str, choice: str, blank: str) -> str:
    """The question with its blank filled by the option: "We've allowed <MASK> to be safe." -> "We've
    allowed two hours to be safe.". The last occurrence is the blank: an instruction before it may name the
    marker (timedial's prefix asks which phrase best fits the <MASK> span)."""
    head, found, tail = question.rpartition(blank)
    if not found:
        raise DcsjaxError(f"cloze question has no blank {blank!r}: {question[:80]!r}")
    return head + choice.strip() + tail


def statements_for(card: BenchmarkCard) -> Callable[[Item], list[str]]:
    if card.cloze_blank is not None:
        return lambda item: [cloze_statement(item.question, c, card.cloze_blank) for c in item.choices]
    if card.statements == "choices":
        return lambda item: list(item.statements or item.choices)
    if card.source.startswith("jsonl:"):  # a file's own statements, where it has them
        return lambda item: list(item.statements) if item.statements else [
            card.statement_template.format(question=item.question, choice=c) for c in item.choices]
    return lambda item: [card.statement_template.format(question=item.question, choice=c) for c in item.choices]
