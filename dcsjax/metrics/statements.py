"""How close a declarative statement stays to its question-answer pair (paper 002 A.2): sentence BLEU and the
length gap, per statement and per item. APS records carry them (`eval/protocols/aps.py`), and
`dcsjax statements validate` reports them over a file (`dcsjax/statements/validate.py`)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def qa_pair(question: str, choice: str) -> str:
    return f"{question.strip()} {choice.strip()}"


def bleu(statement: str, reference: str) -> float:
    """Sentence BLEU in [0, 1] (sacrebleu's defaults: 13a tokenisation, exponential smoothing)."""
    from sacrebleu.metrics import BLEU

    return BLEU(effective_order=True).sentence_score(statement, [reference]).score / 100.0


def word_count(text: str) -> int:
    return len(text.split())


def statement_metrics(rows: Sequence[dict], count: Callable[[str], int] = word_count) -> list[dict]:
    """One dict per item: BLEU and length gap per statement, the median gap and the length spread."""
    out = []
    for row in rows:
        pairs = [qa_pair(row["question"], c) for c in row["choices"]]
        lengths = [count(s) for s in row["statements"]]
        gaps = [n - count(p) for n, p in zip(lengths, pairs)]
        out.append({"id": row["id"], "task": row.get("task"),
                    "bleu": [bleu(s, p) for s, p in zip(row["statements"], pairs)],
                    "length_gap": gaps, "median_gap": float(np.median(gaps)),
                    "length_spread": max(lengths) - min(lengths)})
    return out
