"""One item format for every benchmark (paper 002 §2), and the checks every item passes.

A source row that fails a check becomes an `ItemError` record naming where it came from and why; it is
reported and counted, never silently dropped.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

LETTERS = string.ascii_uppercase


@dataclass(frozen=True)
class Item:
    id: str
    question: str
    choices: tuple[str, ...]
    correct: tuple[int, ...]  # indices of correct choices (usually one)
    statements: tuple[str, ...] | None = None  # one declarative statement per choice, for APS
    idk: int | None = None  # index of the "I don't know" choice, if the benchmark has one
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def letters(self) -> tuple[str, ...]:
        return tuple(LETTERS[: len(self.choices)])

    @property
    def answerable(self) -> bool:
        """False when the correct answer is the IDK choice."""
        return not (self.idk is not None and self.correct == (self.idk,))


@dataclass(frozen=True)
class ItemError:
    where: str  # file:line, or task and example index
    reason: str

    def as_record(self) -> dict[str, str]:
        return {"error": self.reason, "where": self.where}


def check_item(item: Item, where: str, duplicates: bool = False) -> Item | ItemError:
    """The item, or the first reason it cannot be scored. duplicates: an option may be listed twice, as a
    published benchmark does (14 of MMLU's test questions): kept and scored as published, its gold by index."""
    if not item.question or not item.question.strip():
        return ItemError(where, "empty question")
    if len(item.choices) < 2:
        return ItemError(where, f"fewer than two options ({len(item.choices)})")
    if len(item.choices) > len(LETTERS):
        return ItemError(where, f"more than {len(LETTERS)} options")
    for i, choice in enumerate(item.choices):
        if not isinstance(choice, str) or not choice.strip():
            return ItemError(where, f"option {i} is empty")
    normalised = [c.strip().casefold() for c in item.choices]
    if len(set(normalised)) != len(normalised) and not duplicates:
        dup = next(c for c in item.choices if normalised.count(c.strip().casefold()) > 1)
        return ItemError(where, f"duplicate option {dup!r}")
    if not item.correct:
        return ItemError(where, "no correct option")
    for k in item.correct:
        if not 0 <= k < len(item.choices):
            return ItemError(where, f"correct index {k} is out of range for {len(item.choices)} options")
    if item.idk is not None and not 0 <= item.idk < len(item.choices):
        return ItemError(where, f"IDK index {item.idk} is out of range")
    if item.statements is not None and len(item.statements) != len(item.choices):
        return ItemError(where, f"{len(item.statements)} statements for {len(item.choices)} options")
    return item
