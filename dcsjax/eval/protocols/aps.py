"""Perplexity ranking of one text per option (paper 002 §2): `aps` and `qa-ppl`.

`aps` ranks declarative statements, one per option ("The Vedas are the oldest Hindu texts."): from a
statements file (`dcsjax statements generate`, 002 A.1), a card's cloze rule (the option fills the blank),
options that are statements already, or a card template marked declarative. It is the paper's APS only
with such statements, so it refuses a task that has none.
`qa-ppl` ranks the question followed by each option (the card's `qa_template`): the question-plus-option
scoring that 002 §2 sets apart from APS; kept under its own name so that it is never read as APS.
Each text is scored alone, every token conditioned on the document start; the lowest perplexity wins.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from dcsjax.data.items import Item


def rank_by_perplexity(scorer, items: Sequence[Item], texts: Callable[[Item], Sequence[str]],
                       field: str = "statements") -> list[dict]:
    """Each text alone; mean token log-prob; the lowest-perplexity text is the answer."""
    per_item = [list(texts(item)) for item in items]
    flat = [t for ts in per_item for t in ts]
    means = iter(scorer.score(flat, reduction="mean")) if flat else iter(())
    records = []
    for item, ts in zip(items, per_item):
        ppl = np.exp(-np.array([next(means) for _ in ts]))
        order = np.argsort(ppl, kind="stable")
        choice = int(order[0])
        records.append({
            "id": item.id, "choice": choice, "correct": choice in item.correct, "ppl": ppl.round(6).tolist(),
            "ppl_correct": float(ppl[item.correct[0]]),
            "ppl_delta": float(ppl[order[1]] - ppl[order[0]]),  # second choice minus first (002 §4, E.3)
            field: ts,
        })
    return records


def run_aps(scorer, items: Sequence[Item], statements: Callable[[Item], Sequence[str]]) -> list[dict]:
    return rank_by_perplexity(scorer, items, statements, "statements")


def qa_texts(item: Item, template: str) -> list[str]:
    return [template.format(question=item.question, choice=c) for c in item.choices]


def run_qa_ppl(scorer, items: Sequence[Item], template: str) -> list[dict]:
    return rank_by_perplexity(scorer, items, lambda item: qa_texts(item, template), "texts")


def summarise(records: list[dict]) -> dict:
    return {"accuracy": _mean([r["correct"] for r in records]), "ppl_delta": _mean([r["ppl_delta"] for r in records])}


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None
