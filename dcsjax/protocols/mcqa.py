"""MCQA-LL (002 App. B): each option as a continuation of the question, under four normalisations.

The context is the card's `mcqa_context` ("Question: {question}\nAnswer:" unless the card says otherwise;
HellaSwag's is the bare passage, as lm-eval has it). A cloze card (Winogrande's "_") is scored as lm-eval
scores it, by partial evaluation: each option fills the blank in its own context, and the rest of the
sentence is the continuation whose log-likelihood is compared.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dcsjax.data.items import Item
from dcsjax.errors import InputError

NORMALISATIONS = ("sum", "token", "char", "byte")
MCQA_CONTEXT = "Question: {question}\nAnswer:"


def mcqa_context(item: Item, template: str = MCQA_CONTEXT) -> str:
    return template.format(question=item.question)


def normalised(logprobs: Sequence[np.ndarray], texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Per option: the summed log-likelihood, and divided by its tokens, characters or UTF-8 bytes."""
    total = np.array([float(lp.astype(np.float64).sum()) for lp in logprobs])
    return {"sum": total, "token": total / np.array([len(lp) for lp in logprobs]),
            "char": total / np.array([len(t) for t in texts]),
            "byte": total / np.array([len(t.encode()) for t in texts])}


def partial_contexts(item: Item, blank: str) -> tuple[list[str], str]:
    """lm-eval's Winogrande: (the sentence up to the blank with each option, " " + the rest)."""
    head, found, tail = item.question.rpartition(blank)
    if not found or not tail.strip():
        raise InputError(f"item {item.id}: a cloze sentence needs a blank {blank!r} with text after it")
    return [head + c for c in item.choices], " " + tail.strip()


def run_mcqa(scorer, items: Sequence[Item], card=None) -> list[dict]:
    if not items:
        return []
    if card is not None and card.cloze_blank is not None:
        parts = [partial_contexts(item, card.cloze_blank) for item in items]
        flat = scorer.option_logprobs([c for contexts, _ in parts for c in contexts],
                                      [[rest] for contexts, rest in parts for _ in contexts])
        per_token, texts, at = [], [], 0
        for item, (contexts, rest) in zip(items, parts):
            per_token.append([lps[0] for lps in flat[at:at + len(contexts)]])
            texts.append([rest] * len(contexts))
            at += len(contexts)
    else:
        template = card.mcqa_context if card is not None else MCQA_CONTEXT
        texts = [[" " + c for c in item.choices] for item in items]
        per_token = scorer.option_logprobs([mcqa_context(i, template) for i in items], texts)
    records = []
    for item, opts, lps in zip(items, texts, per_token):
        scores = normalised(lps, opts)
        choices = {k: int(np.argmax(v)) for k, v in scores.items()}
        records.append({"id": item.id, "loglik": scores["sum"].round(6).tolist(), "choice": choices,
                        "correct": {k: c in item.correct for k, c in choices.items()}})
    return records


def summarise(records: list[dict]) -> dict:
    return {f"accuracy_{k}": float(np.mean([r["correct"][k] for r in records])) if records else None
            for k in NORMALISATIONS}
