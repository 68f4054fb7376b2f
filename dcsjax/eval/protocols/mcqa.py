"""MCQA-LL (002 App. B): each option as a continuation of the question, under five normalisations.

The context is the card's `mcqa_context` ("Question: {question}\nAnswer:" unless the card says otherwise;
HellaSwag's is the bare passage, as lm-eval has it); a template may name the item's `{subject}` (in words)
and its `{options}` lettered in their presented order ("A. ...\nB. ..."). What continues it is " " + the
option's text, or " " + its letter where the card's `mcqa_answer` is "letter" (lm-eval's MMLU); where the card
asks for the chat template, the context is the user's turn and the continuation starts the assistant's
(no leading space). These are the presentations that published MMLU numbers use (benchmarks/mmlu_*.toml).
A cloze card (Winogrande's "_") is scored as lm-eval scores it, by partial evaluation: each option fills the
blank in its own context, and the rest of the sentence is the continuation whose log-likelihood is compared.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dcsjax.data.items import Item
from dcsjax.errors import InputError

# sum: lm-eval's acc; char: its acc_norm (the continuation's characters, the leading space counted);
# char_nospace: lighteval's acc_norm_nospace (not counted)
NORMALISATIONS = ("sum", "token", "char", "char_nospace", "byte")
MCQA_CONTEXT = "Question: {question}\nAnswer:"


def mcqa_context(item: Item, template: str = MCQA_CONTEXT) -> str:
    options = "\n".join(f"{letter}. {choice}" for letter, choice in zip(item.letters, item.choices))
    return template.format(question=item.question, options=options,
                           subject=str(item.source.get("subject", "")).replace("_", " "))


def normalised(logprobs: Sequence[np.ndarray], texts: Sequence[str]) -> dict[str, np.ndarray]:
    """Per option: the summed log-likelihood, and divided by its tokens, characters (with and without the
    leading space) or UTF-8 bytes."""
    total = np.array([float(lp.astype(np.float64).sum()) for lp in logprobs])
    return {"sum": total, "token": total / np.array([len(lp) for lp in logprobs]),
            "char": total / np.array([len(t) for t in texts]),
            "char_nospace": total / np.array([max(1, len(t.lstrip())) for t in texts]),
            "byte": total / np.array([len(t.encode()) for t in texts])}


def partial_contexts(item: Item, blank: str) -> tuple[list[str], str]:
    """lm-eval's Winogrande: (the sentence up to the blank with each option, " " + the rest)."""
    head, found, tail = item.question.rpartition(blank)
    if not found or not tail.strip():
        raise InputError(f"item {item.id}: a cloze sentence needs a blank {blank!r} with text after it")
    return [head + c for c in item.choices], " " + tail.strip()


FEWSHOT_DELIMITER = "\n\n"  # between solved exemplars and before the question (lm-eval's default)


def fewshot_prefix(exemplars: Sequence[Item], card=None) -> str:
    """Solved exemplars, each its context and its answer as the option continuation would be scored
    (a cloze sentence with its blank filled), then the delimiter before the item's own context."""
    if card is not None and card.cloze_blank is not None:
        shots = [ex.question.replace(card.cloze_blank, ex.choices[ex.correct[0]]) for ex in exemplars]
    else:
        template = card.mcqa_context if card is not None else MCQA_CONTEXT
        shots = [f"{mcqa_context(ex, template)} {ex.choices[ex.correct[0]]}" for ex in exemplars]
    return "".join(shot + FEWSHOT_DELIMITER for shot in shots)


def answers(item: Item, card=None) -> list[str]:
    """What each option's continuation says: its text, or its letter where the card's `mcqa_answer` says so."""
    return list(item.letters) if card is not None and card.mcqa_answer == "letter" else list(item.choices)


def contexts_and_continuations(item: Item, card=None, exemplars: Sequence[Item] = (), scorer=None
                               ) -> tuple[list[str], list[str]]:
    """What is scored for one item: per option, (context, continuation); the context is shared except in
    a cloze card, where each option fills the blank of its own context. A card with `chat_template` asks
    through the scorer's chat template."""
    prefix = fewshot_prefix(exemplars, card)
    if card is not None and card.cloze_blank is not None:
        contexts, rest = partial_contexts(item, card.cloze_blank)
        return [prefix + c for c in contexts], [rest] * len(contexts)
    template = card.mcqa_context if card is not None else MCQA_CONTEXT
    context = prefix + mcqa_context(item, template)
    if card is not None and card.chat_template:
        if scorer is None or not scorer.tokenizer.chat_template:
            raise InputError(f"task {card.name} asks through the chat template, and the model has none")
        return [scorer.chat_text(context)] * len(item.choices), answers(item, card)
    return [context] * len(item.choices), [" " + a for a in answers(item, card)]


def prompt_record(item: Item, card=None, exemplars: Sequence[Item] = (), scorer=None) -> dict:
    """What --log-samples keeps: the shared context (a cloze card's one per option) and the continuations."""
    contexts, continuations = contexts_and_continuations(item, card, exemplars, scorer)
    shared = len(set(contexts)) == 1
    return {"context" if shared else "contexts": contexts[0] if shared else contexts, "continuations": continuations}


def run_mcqa(scorer, items: Sequence[Item], card=None, exemplars=None) -> list[dict]:
    """exemplars: item id -> solved items shown before it (`fewshot.Exemplars`); none by default."""
    if not items:
        return []
    shots = [exemplars(item) if exemplars is not None else [] for item in items]
    if card is not None and card.cloze_blank is not None:
        parts = [contexts_and_continuations(item, card, ex) for item, ex in zip(items, shots)]
        flat = scorer.option_logprobs([c for contexts, _ in parts for c in contexts],
                                      [[rest] for contexts, rests in parts for rest in rests])
        per_token, texts, at = [], [], 0
        for item, (contexts, rests) in zip(items, parts):
            per_token.append([lps[0] for lps in flat[at:at + len(contexts)]])
            texts.append(rests)
            at += len(contexts)
    else:
        parts = [contexts_and_continuations(item, card, ex, scorer) for item, ex in zip(items, shots)]
        texts = [conts for _, conts in parts]
        per_token = scorer.option_logprobs([contexts[0] for contexts, _ in parts], texts)
    records = []
    for item, opts, lps in zip(items, texts, per_token):
        scores = normalised(lps, opts)
        choices = {k: int(np.argmax(v)) for k, v in scores.items()}
        record = {"id": item.id, "loglik": scores["sum"].round(6).tolist(), "choice": choices,
                  "correct": {k: c in item.correct for k, c in choices.items()}}
        if card is not None and card.mcqa_normalisation != "sum":
            record["headline"] = card.mcqa_normalisation  # the normalisation the card's presentation reports
        records.append(record)
    return records


def headline(record: dict) -> str:
    return record.get("headline", "sum")


def summarise(records: list[dict]) -> dict:
    """Accuracy under each normalisation, the card's headline first."""
    first = headline(records[0]) if records else "sum"
    return {f"accuracy_{k}": float(np.mean([r["correct"][k] for r in records])) if records else None
            for k in (first, *[k for k in NORMALISATIONS if k != first])}
