"""APX (paper 002 §2, D.1, D.2): prompt for the answer letter, decode greedily, parse with regexes.

The system prompt is D.1's, verbatim. The question prompt lists the lettered options; instruct models are
asked a question ("What is the correct answer?"), base models are given a statement to complete ("The
correct answer is:"), with no trailing whitespace. Models with a chat template get
[system, user] messages through it; others get the two parts concatenated. At most 15 new tokens.
"""

from __future__ import annotations

import re
from typing import Sequence

from dcsjax.data.items import Item
from dcsjax.generate import greedy_generate

SYSTEM_PROMPT = (
    "You are an expert AI. Your task is to read a multiple-choice question and provide the most likely Correct "
    "Answer based on the Options given. Always output only the letter of the correct option. Do not add the actual "
    "answer, commentary, explanations, or metadata — only output the letter corresponding to the correct answer."
)
MAX_NEW_TOKENS = 15


def question_prompt(item: Item, instruct: bool) -> str:
    options = "\n".join(f"{letter}. {choice}" for letter, choice in zip(item.letters, item.choices))
    ending = "What is the correct answer?" if instruct else "The correct answer is:"
    return f"Question: {item.question}\nOptions:\n{options}\n{ending}"


def is_instruct(scorer) -> bool:
    """The card (or the caller's `variant`) says; without either, a model with a chat template is instruct."""
    return scorer.is_instruct if scorer.is_instruct is not None else bool(scorer.tokenizer.chat_template)


def uses_chat_template(scorer) -> bool:
    return is_instruct(scorer) and bool(scorer.tokenizer.chat_template)


def prompt_ids(scorer, item: Item) -> list[int]:
    """Token ids of the full prompt: the chat template where the model has one, else system + question
    after the document-start token."""
    question = question_prompt(item, is_instruct(scorer))
    if uses_chat_template(scorer):
        return scorer.encode([scorer.chat_text(question, SYSTEM_PROMPT)])[0]
    return [scorer.document_start_id, *scorer.encode([f"{SYSTEM_PROMPT}\n\n{question}"])[0]]


def parse_answer(generation: str, choices: Sequence[str]) -> tuple[int | None, str | None]:
    """D.2: the answer is a letter standing alone or an option's text. An answer naming several options is
    an error; so is one naming none. Returns (option index, None) or (None, why it failed)."""
    letters = [chr(ord("A") + i) for i in range(len(choices))]
    found: set[int] = set()
    for match in re.finditer(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])", generation):
        if match.group(1) in letters:
            found.add(letters.index(match.group(1)))
    lowered = generation.casefold()
    for i, choice in enumerate(choices):
        text = choice.strip().casefold()
        if len(text) > 1 and re.search(rf"(?<!\w){re.escape(text)}(?!\w)", lowered):
            found.add(i)
    if len(found) == 1:
        return found.pop(), None
    if not found:
        return None, "no option letter or option text found"
    return None, "names several options: " + ", ".join(letters[i] for i in sorted(found))


def run_apx(scorer, items: Sequence[Item]) -> list[dict]:
    prompts = [prompt_ids(scorer, item) for item in items]
    generations = greedy_generate(scorer, prompts, MAX_NEW_TOKENS) if items else []
    records = []
    for item, tokens in zip(items, generations):
        text = scorer.tokenizer.decode(tokens, skip_special_tokens=True)
        choice, failure = parse_answer(text, item.choices)
        records.append({"id": item.id, "generation": text, "choice": choice, "parse_error": failure,
                        "correct": choice is not None and choice in item.correct})
    return records
