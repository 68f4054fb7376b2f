"""`dcsjax statements generate`: one affirmative statement per option, by an instruct model (002 A.1).

The system prompt is A.1's, verbatim. The paper prints only the user prompt's first line
("Question: {{ question }}") and says the model was given "the question, choices, and instructions to
generate declarative statements for each of the choices, one per line"; the rest of `USER_PROMPT` is
written to say exactly that. Sampling as A.1: temperature 0.7, top-p 0.95 (the 1,500-token budget there
held a reasoning trace; our default budget is for the answer alone). The answer is split on new lines,
empty lines are removed, and an item whose count of statements differs from its count of options is
filtered out and counted (002 Fig. 3): never silently dropped.

Output: JSONL, one line per kept item with its id, question, choices, answer, statements and the
generator and its settings; a `.rejected.jsonl` beside it holds every filtered item with its raw output
and why. A killed run resumes: items already in either file are not generated again.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Sequence

from dcsjax.data.items import Item

SYSTEM_PROMPT = ("You are a precise text transformation assistant. Your task is to generate, for each multiple-choice "
                 "question, one affirmative statement per answer option, both for correct and incorrect options.")
USER_PROMPT = ("Question: {question}\nOptions:\n{options}\n\nWrite one affirmative declarative statement for each "
               "option, in the order given, one statement per line. Write exactly {n} lines and nothing else.")
TEMPERATURE, TOP_P, MAX_NEW_TOKENS = 0.7, 0.95, 256


def parse_statements(text: str, n_options: int) -> tuple[list[str] | None, str | None]:
    """A.1's parse: split on new lines, drop empty (or blank) lines; keep only exactly one per option.
    -> (statements, None) or (None, why it was filtered)."""
    lines = [line.strip() for line in text.splitlines()]
    statements = [line for line in lines if line]
    if len(statements) == n_options:
        return statements, None
    if not statements:
        return None, "empty output"
    return None, f"{len(statements)} statements for {n_options} options"


def prompt_ids(scorer, item: Item) -> list[int]:
    options = "\n".join(f"{letter}. {choice}" for letter, choice in zip(item.letters, item.choices))
    user = USER_PROMPT.format(question=item.question, options=options, n=len(item.choices))
    if not scorer.tokenizer.chat_template:
        text = f"{SYSTEM_PROMPT}\n\n{user}\n"
        return [scorer.document_start_id, *scorer.encode([text])[0]]
    return scorer.encode([scorer.chat_text(user, SYSTEM_PROMPT)])[0]


def statement_record(item: Item, task: str, statements: Sequence[str], generator: dict) -> dict:
    """A line of a statements file: what `jsonl:` tasks and `dcsjax eval --statements` read."""
    return {"id": item.id, "task": task, "question": item.question, "choices": list(item.choices),
            "answer": list(item.correct), "idk": item.idk, "statements": list(statements), "generator": generator}


def done_ids(*paths: Path) -> set[str]:
    """Ids already written (read only; the writer repairs a last line cut short by a kill first)."""
    from dcsjax.eval.results import read_records

    return {row["id"] for path in paths for row in read_records(path)}


def rejected_path(out: Path) -> Path:
    return out.with_name(out.stem + ".rejected.jsonl")


def generate_statements(scorer, items: Sequence[Item], task: str, out: Path, *, temperature: float = TEMPERATURE,
                        top_p: float = TOP_P, max_new_tokens: int = MAX_NEW_TOKENS, seed: int = 0,
                        batch_size: int = 8, chunk: int = 32, progress: bool = True) -> Counter:
    """Generate, filter and append to `out` (kept) and its `.rejected.jsonl` (filtered), a chunk at a time.
    -> counts of kept items and of each reason for filtering, over the whole file (resumed runs included)."""
    from tqdm.auto import tqdm

    from dcsjax.engine.generate import generate
    from dcsjax.eval.results import FileLock, append_jsonl, repair_cut_tail

    out = Path(out)
    rejected = rejected_path(out)
    generator = {"model": scorer.name, "model_fingerprint": scorer.model_fingerprint, "temperature": temperature,
                 "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed}
    with FileLock(out.with_name(out.name + ".lock"), f"statements file {out}"):  # one writer per file
        repair_cut_tail(out)
        repair_cut_tail(rejected)
        done = done_ids(out, rejected)
        todo = [(index, item) for index, item in enumerate(items) if item.id not in done]
        with tqdm(total=len(items), initial=len(items) - len(todo), desc=f"statements {task}",
                  disable=not progress) as bar:
            for start in range(0, len(todo), chunk):
                part = todo[start:start + chunk]
                prompts = [prompt_ids(scorer, item) for _, item in part]
                # each item's sampling key comes from its index in the task: a resumed run draws what a whole one would
                outputs = generate(scorer, prompts, max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                                   batch_size=batch_size, key_ids=[index for index, _ in part])
                kept, filtered = [], []
                for (_, item), tokens in zip(part, outputs):
                    text = scorer.tokenizer.decode(tokens, skip_special_tokens=True)
                    statements, why = parse_statements(text, len(item.choices))
                    if statements is None:
                        filtered.append({"id": item.id, "task": task, "reason": why, "output": text,
                                         "n_options": len(item.choices), "generator": generator})
                    else:
                        kept.append(statement_record(item, task, statements, generator))
                append_jsonl(out, kept)  # fsynced, as eval's records
                append_jsonl(rejected, filtered)
                bar.update(len(part))
    return filter_counts(out)


def filter_counts(out: Path) -> Counter:
    """{"kept": n, "too many": n, "too few": n, "empty": n, "not reached": n} over a statements file and its
    rejected file ("empty" outputs are also counted as "too few"; "not reached": items a partial rule does not
    make statements for)."""
    counts: Counter = Counter({"kept": 0, "too many": 0, "too few": 0, "empty": 0, "not reached": 0})
    if out.is_file():
        counts["kept"] = sum(1 for line in out.read_text().splitlines() if line.strip())
    rejected = rejected_path(out)
    if rejected.is_file():
        for line in rejected.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if "rule" in row:
                    counts["not reached"] += 1
                    continue
                got = 0 if row["reason"] == "empty output" else int(row["reason"].split()[0])
                counts["too many" if got > row["n_options"] else "too few"] += 1
                counts["empty"] += got == 0
    return counts


def template_statements(items: Sequence[Item], task: str, card, out: Path) -> Counter:
    """The rule-based path, no model: the card's declarative rule (cloze blank, statement template, statement
    options, or a sentence stem completed by each option). An item a partial rule does not reach (a question
    that is no stem) goes to the rejected file with the reason. A card without a rule needs a model."""
    from dcsjax.data.tasks import rule_statements
    from dcsjax.errors import ConfigError

    make = rule_statements(card)
    if make is None or card.statements is None:
        raise ConfigError(f"task {card.name} has no declarative rule for statements (its card names no cloze blank, "
                          "statement template, statement options or stem rule): generate them with --model")
    generator = {"rule": card.statements, "template": card.cloze_blank if card.statements == "cloze"
                 else card.statement_template}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as kept, rejected_path(out).open("w") as rejected:
        for item in items:
            statements = make(item)
            if statements is None:
                rejected.write(json.dumps({"id": item.id, "task": task, "rule": card.statements, "n_options":
                                           len(item.choices), "reason": f"rule {card.statements!r} does not reach "
                                           "it: the question is no sentence that each option completes"}) + "\n")
            else:
                kept.write(json.dumps(statement_record(item, task, statements, generator)) + "\n")
    return filter_counts(out)
