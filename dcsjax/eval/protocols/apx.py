"""APX (paper 002 §2, D.1, D.2): prompt for the answer letter, decode greedily, parse with regexes.

The system prompt is D.1's, verbatim. The question prompt lists the lettered options; instruct models are
asked a question ("What is the correct answer?"), base models are given a statement to complete ("The
correct answer is:"), with no trailing whitespace. Models with a chat template get
[system, user] messages through it; others get the two parts concatenated. At most 15 new tokens.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from dcsjax.data.items import Item
from dcsjax.engine.generate import greedy_generate

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
    """An instruct model is asked through its chat template (refused without one); a model whose variant no
    card or caller names counts as instruct when it has a template."""
    if scorer.is_instruct is None:
        return bool(scorer.tokenizer.chat_template)
    return bool(scorer.is_instruct) and scorer.asks_through_chat_template("APX")


def prompt_ids(scorer, item: Item, exemplars: Sequence[Item] = ()) -> list[int]:
    """Token ids of the full prompt: the chat template where the model has one, else system + question
    after the document-start token. Few-shot exemplars come first, solved with their letter: as earlier
    user and assistant turns in a chat, as earlier questions each followed by " <letter>" otherwise."""
    return ask_ids(scorer, question_prompt(item, is_instruct(scorer)), exemplars)


def ask_ids(scorer, question: str, exemplars: Sequence[Item] = ()) -> list[int]:
    """`prompt_ids` for a question prompt already written (`question_prompt`, or a variant of it)."""
    instruct = is_instruct(scorer)
    if uses_chat_template(scorer):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        for ex in exemplars:
            messages += [{"role": "user", "content": question_prompt(ex, instruct)},
                         {"role": "assistant", "content": ex.letters[ex.correct[0]]}]
        messages.append({"role": "user", "content": question})
        text = scorer.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return scorer.encode([text])[0]
    shots = "".join(f"{question_prompt(ex, instruct)} {ex.letters[ex.correct[0]]}\n\n" for ex in exemplars)
    return [scorer.document_start_id, *scorer.encode([f"{SYSTEM_PROMPT}\n\n{shots}{question}"])[0]]


# A letter counts only where an answer stands: alone at the start of a line ("C", "C.", "(C)", "C)"),
# in parentheses anywhere, or after "answer is" / "answer:". Elsewhere a capital is a word ("I think", the
# article "A").
# Where a letter is an answer ({L}: the letters, upper case; {l}: lower case). Markdown emphasis and quotes
# around it are read through ("**B**", "'B'").
_LETTER_AT = (
    r"(?m)^[\s*_\"'\[(]*({L})(?:[.):,\]*_]|\s*$)",  # alone at the start of a line: "C", "C.", "(C)", "**C**"
    r"\(({L})\)",  # in parentheses anywhere
    r"(?i:answer|option|choice)(?:\s+is)?\s*[:\-]?\s*[*_\"'(]*({L})(?![A-Za-z])",  # "answer is B", "Option B"
    r"(?m)^[\s*_\"'\[(]*({L})[*_\"')]*\s+is\s+(?i:the\s+)?(?i:correct|right)",  # "B is correct"
    r"(?i:answer)\s*[:\-]\s*[*_\"'(]*({l})(?:[.):,\]*_]|\s*$)",  # "answer: b", a lower-case letter standing alone
)


def _letters_in_answer_position(text: str, letters: Sequence[str]) -> set[str]:
    """The letters (upper case) that `_LETTER_AT` finds in answer position. A lower-case letter counts only
    standing alone after "answer:", so the article in "the answer is a dog" is not read as A."""
    upper = "|".join(map(re.escape, letters))
    lower = "|".join(re.escape(x.lower()) for x in letters if x.isalpha() and x.isupper())
    hits = {m.group(1) for pattern in _LETTER_AT for m in re.finditer(pattern.format(L=upper, l=lower or "(?!)"), text)}
    return {hit if hit in letters else hit.upper() for hit in hits}


def parse_answer(generation: str, choices: Sequence[str]) -> tuple[int | None, str | None]:
    """D.2: the answer is a letter standing alone or an option's text. An answer naming several options is
    an error; so is one naming none. Returns (option index, None) or (None, why it failed).

    Option texts are matched first, longest first, case-insensitively as whole words, and each match is
    masked, so an option inside another ("Paris" in "Paris, Texas") or a letter inside an option ("B. A cat")
    is not read again. A one-character option ("T", "F") counts only in answer position, like a letter."""
    letters = [chr(ord("A") + i) for i in range(len(choices))]
    found: set[int] = set()
    masked = generation
    texts = sorted(((c.strip(), i) for i, c in enumerate(choices) if len(c.strip()) > 1), key=lambda x: -len(x[0]))
    for text, i in texts:
        pattern = re.compile(rf"(?<!\w){re.escape(text)}(?!\w)", re.IGNORECASE)
        if pattern.search(masked):
            found.add(i)
            masked = pattern.sub(lambda m: " " * len(m.group(0)), masked)
    short = {c.strip(): i for i, c in enumerate(choices) if len(c.strip()) == 1}
    for hit in _letters_in_answer_position(masked, sorted(set(letters) | set(short))):
        # a one-character option's own text wins over reading it as a letter
        found.add(short[hit] if hit in short else letters.index(hit))
    if len(found) == 1:
        return found.pop(), None
    if not found:
        return None, "no option letter or option text found"
    return None, "names several options: " + ", ".join(letters[i] for i in sorted(found))


def run_apx(scorer, items: Sequence[Item], exemplars=None) -> list[dict]:
    """exemplars: item id -> solved items shown before it (`fewshot.Exemplars`); none by default."""
    prompts = [prompt_ids(scorer, item, exemplars(item) if exemplars is not None else ()) for item in items]
    generations = greedy_generate(scorer, prompts, MAX_NEW_TOKENS) if items else []
    records = []
    for item, tokens in zip(items, generations):
        text = scorer.tokenizer.decode(tokens, skip_special_tokens=True)
        choice, failure = parse_answer(text, item.choices)
        records.append({"id": item.id, "generation": text, "choice": choice, "parse_error": failure,
                        "correct": choice is not None and choice in item.correct})
    return records


def merge_rotations(item: Item, records: Sequence[dict], perms: Sequence[Sequence[int]]) -> dict:
    """One answer per rotation, mapped back to the item's own order; the answer is the option most
    rotations chose (a tie, or no parsable answer in any rotation, is a parse failure)."""
    votes = np.zeros(len(item.choices), int)
    for record, perm in zip(records, perms):
        if record["choice"] is not None:
            votes[perm[record["choice"]]] += 1
    top = np.flatnonzero(votes == votes.max()) if votes.any() else []
    choice = int(top[0]) if len(top) == 1 else None
    failure = None if choice is not None else ("no rotation gave a parsable answer" if not votes.any()
                                               else "rotations tie between " + ", ".join(item.letters[i] for i in top))
    return {"id": item.id, "generation": [r["generation"] for r in records], "votes": votes.tolist(),
            "choice": choice, "parse_error": failure, "correct": choice is not None and choice in item.correct}


def summarise(records: list[dict]) -> dict:
    return {"accuracy": float(np.mean([r["correct"] for r in records])) if records else None,
            "parse_failures": float(np.mean([r["parse_error"] is not None for r in records])) if records else None}
