"""MCQA-LL (002 App. B): each option as a continuation of the question, under four normalisations."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dcsjax.data.items import Item

NORMALISATIONS = ("sum", "token", "char", "byte")


def mcqa_context(item: Item) -> str:
    return f"Question: {item.question}\nAnswer:"


def normalised(logprobs: Sequence[np.ndarray], texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Per option: the summed log-likelihood, and divided by its tokens, characters or UTF-8 bytes."""
    total = np.array([float(lp.astype(np.float64).sum()) for lp in logprobs])
    return {"sum": total, "token": total / np.array([len(lp) for lp in logprobs]),
            "char": total / np.array([len(t) for t in texts]),
            "byte": total / np.array([len(t.encode()) for t in texts])}


def run_mcqa(scorer, items: Sequence[Item]) -> list[dict]:
    options = [[" " + c for c in item.choices] for item in items]
    per_token = scorer.option_logprobs([mcqa_context(i) for i in items], options) if items else []
    records = []
    for item, opts, lps in zip(items, options, per_token):
        scores = normalised(lps, opts)
        choices = {k: int(np.argmax(v)) for k, v in scores.items()}
        records.append({"id": item.id, "loglik": scores["sum"].round(6).tolist(), "choice": choices,
                        "correct": {k: c in item.correct for k, c in choices.items()}})
    return records


def summarise(records: list[dict]) -> dict:
    return {f"accuracy_{k}": float(np.mean([r["correct"][k] for r in records])) if records else None
            for k in NORMALISATIONS}
