"""Likelihood protocols on the same forward passes: APS, MCQA-LL and sequence- or letter-elicited DCS.

Each `run_*` takes a scorer and a list of items and returns one JSON-able record per item, in order.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from dcsjax.data.items import LETTERS, Item
from dcsjax.kernels.dcs import dcs_parts, softmax_over_options

IDK_CONTINUATION = "I don't know."
NORMALISATIONS = ("sum", "token", "char", "byte")


# ------------------------------------------------------------------------------------------------ APS
def run_aps(scorer, items: Sequence[Item], statements: Callable[[Item], Sequence[str]]) -> list[dict]:
    """Each statement alone; mean token log-prob; the lowest-perplexity statement is the answer (002 §2)."""
    texts = [list(statements(item)) for item in items]
    flat = [t for ts in texts for t in ts]
    means = iter(scorer.score(flat, reduction="mean")) if flat else iter(())
    records = []
    for item, ts in zip(items, texts):
        mean = np.array([next(means) for _ in ts])
        ppl = np.exp(-mean)
        order = np.argsort(ppl, kind="stable")
        choice = int(order[0])
        records.append({
            "id": item.id, "choice": choice, "correct": choice in item.correct, "ppl": ppl.round(6).tolist(),
            "ppl_correct": float(ppl[item.correct[0]]),
            "ppl_delta": float(ppl[order[1]] - ppl[order[0]]),  # second choice minus first (002 §4, E.3)
            "statements": ts,
        })
    return records


# ------------------------------------------------------------------------------------------------ MCQA-LL
def mcqa_context(item: Item) -> str:
    return f"Question: {item.question}\nAnswer:"


def run_mcqa(scorer, items: Sequence[Item]) -> list[dict]:
    """Each option as a continuation of the question (002 App. B), under four normalisations."""
    options = [[" " + c for c in item.choices] for item in items]
    per_token = scorer.option_logprobs([mcqa_context(i) for i in items], options) if items else []
    records = []
    for item, opts, lps in zip(items, options, per_token):
        total = np.array([float(lp.astype(np.float64).sum()) for lp in lps])
        n_tokens = np.array([len(lp) for lp in lps])
        scores = {
            "sum": total,
            "token": total / n_tokens,
            "char": total / np.array([len(o) for o in opts]),
            "byte": total / np.array([len(o.encode()) for o in opts]),
        }
        choices = {k: int(np.argmax(v)) for k, v in scores.items()}
        records.append({
            "id": item.id, "loglik": total.round(6).tolist(), "choice": choices,
            "correct": {k: c in item.correct for k, c in choices.items()},
        })
    return records


# ------------------------------------------------------------------------------------------------ DCS
def _dcs_records(items: Sequence[Item], logits: list[np.ndarray], idk_index: list[int], lc: float, lw: float,
                 extra: list[dict]) -> list[dict]:
    width = max(len(x) for x in logits)
    n = len(items)
    scores = np.full((n, width), -np.inf, np.float32)
    correct, idk, valid = (np.zeros((n, width), bool) for _ in range(3))
    for r, (item, x, k) in enumerate(zip(items, logits, idk_index)):
        scores[r, :len(x)] = x
        valid[r, :len(x)] = True
        correct[r, list(item.correct)] = True
        idk[r, k] = True
    probs = np.asarray(softmax_over_options(jnp.asarray(scores), jnp.asarray(valid)))
    parts = {k: np.asarray(v) for k, v in dcs_parts(jnp.asarray(probs), jnp.asarray(correct), jnp.asarray(idk),
                                                     jnp.asarray(valid), lc, lw).items()}
    records = []
    for r, item in enumerate(items):
        choice = int(parts["argmax"][r])
        abstained = choice == idk_index[r]
        records.append({
            "id": item.id, "dcs": float(parts["dcs"][r]), "p_correct": float(parts["p_correct"][r]),
            "p_wrong": float(parts["p_wrong"][r]), "p_idk": float(parts["p_idk"][r]),
            "probs": probs[r, :len(logits[r])].round(6).tolist(), "idk_index": idk_index[r], "choice": choice,
            "abstained": abstained, "correct": (not abstained) and choice in item.correct,
            "correct_options": list(item.correct),
            "answerable": item.answerable, "lc": lc, "lw": lw, **extra[r],
        })
    return records


def run_dcs_sequences(scorer, items: Sequence[Item], lc: float = 1.0, lw: float = 1.0,
                      normalise: bool = False) -> list[dict]:
    """A softmax over the options' continuation log-likelihoods, plus an "I don't know." continuation where
    the item has no IDK choice. No length normalisation unless asked (then per token)."""
    options, idk_index = [], []
    for item in items:
        opts = [" " + c for c in item.choices]
        if item.idk is None:
            opts.append(" " + IDK_CONTINUATION)
        options.append(opts)
        idk_index.append(item.idk if item.idk is not None else len(opts) - 1)
    contexts = [mcqa_context(i) for i in items]
    scores = scorer.score_options(contexts, options, reduction="mean" if normalise else "sum") if items else []
    return _dcs_records(items, list(scores), idk_index, lc, lw, [{} for _ in items])


def letters_prompt(item: Item, lc: float, lw: float) -> tuple[str, list[str], int]:
    """The options lettered, IDK as an explicit last lettered option, and the cost of a wrong answer."""
    choices = list(item.choices)
    if item.idk is None:
        choices.append(IDK_CONTINUATION)
        idk = len(choices) - 1
    else:
        idk = item.idk
    letters = list(LETTERS[: len(choices)])
    cost = lw / lc
    lines = [f"Question: {item.question}", "Options:"] + [f"{letter}. {c}" for letter, c in zip(letters, choices)]
    lines.append(f"A correct answer earns 1 point, a wrong answer costs {cost:g} point{'s' if cost != 1 else ''}, "
                 f"and answering {letters[idk]} (I don't know) costs nothing. Answer with the letter only.")
    lines.append("Answer:")
    return "\n".join(lines), letters, idk


def letters_use_chat_template(scorer) -> bool:
    """Only a model whose card says instruct is asked through its chat template (a base model's template,
    where it has one, is not what it was pretrained on)."""
    return bool(scorer.is_instruct) and bool(scorer.tokenizer.chat_template)


def letters_context(scorer, item: Item, lc: float, lw: float) -> tuple[str, list[str], int]:
    """(context, letter continuations, IDK index). An instruct model with a chat template is asked through
    it, and its answer starts the assistant turn ("A"); others complete "Answer:" (" A")."""
    prompt, letters, idk = letters_prompt(item, lc, lw)
    if letters_use_chat_template(scorer):
        return scorer.chat_text(prompt.rsplit("\nAnswer:", 1)[0]), letters, idk
    return prompt, [" " + letter for letter in letters], idk


def run_dcs_letters(scorer, items: Sequence[Item], lc: float = 1.0, lw: float = 1.0) -> list[dict]:
    """The next-token probabilities of the option letters after the prompt, renormalised over the letters;
    the mass the letters received is recorded (`letter_mass`)."""
    prompts, letter_lists, idk_index = [], [], []
    for item in items:
        prompt, letters, idk = letters_context(scorer, item, lc, lw)
        prompts.append(prompt)
        letter_lists.append(letters)
        idk_index.append(idk)
    scores = scorer.score_options(prompts, letter_lists) if items else []
    extra = [{"letter_mass": float(sum(math.exp(s) for s in x))} for x in scores]
    return _dcs_records(items, list(scores), idk_index, lc, lw, extra)
