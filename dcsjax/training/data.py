"""Data to learn abstention from: answerable and unanswerable versions of real multiple-choice items.

For each question with at least three options, two versions with the same number of options:
- answerable: one wrong option removed (the correct one stays);
- unanswerable: the correct option removed, so every remaining option is wrong and the right answer is
  "I don't know."
Removing an option from both keeps the option count from giving the answer away: only knowing the
answer tells the versions apart. Tasks that ship their own IDK choice are used as they are: their
unanswerable questions are unanswerable *by their wording*, which needs no knowledge to see (BIG-bench
`known_unknowns`, whose right option is then "Unknown"; BBQ's ambiguous contexts, `bbq_religion_ambig`,
beside the same contexts disambiguated, `bbq_religion_disambig`). Every version says which of the two
constructions made it (`source["construction"]`: "answerable", "option removed", "wording"), so results
report abstention on each apart.

Options are shuffled per version (IDK among them), seeded by the run seed and the version's id: in
BIG-bench's own order every answerable emoji_movie item has its answer at A, and a model trained on that
order could learn a letter instead of abstention. `option_order="source"` keeps the source order.

Splits, as R-Tuning splits MMLU (Zhang et al., NAACL 2024: 28 subjects for training and in-domain testing,
29 never trained on): where items have a subject, `UNSEEN_SHARE` of the subjects (29 of MMLU's 57, chosen
by a hash of each subject's name, so the same for every run, seed and machine) go whole to the `unseen`
split, and the questions of the other subjects are split into `train`, `dev` and `test` (in-domain: the
training subjects' held-out questions). Both versions of a question go to the same split, chosen by a hash
of the task and the normalised question text (so the same question repeated under two ids cannot straddle
splits); items generated from one template (BBQ) go together, by template, whatever their names and
context. The two test splits are only ever scored at the end.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from dcsjax.data.items import Item
from dcsjax.data.tasks import load_task, resolve_task
from dcsjax.errors import DcsjaxError
from dcsjax.eval.protocols import IDK_CONTINUATION
from dcsjax.eval.protocols.options import permute, shuffled

# MMLU's test split from the package index, split by subject; its four options give three and IDK per version
DEFAULT_TASKS = ("mmlu",)
DEFAULT_PER_TASK = 30  # questions of each MMLU subject: 1,710 questions, 3,420 versions (about an hour's study)
CONSTRUCTIONS = ("answerable", "option removed", "wording")  # how a version was made (its unanswerability)
SPLITS = ("train", "dev", "test", "unseen")
TEST_SPLITS = ("unseen", "test")  # scored at the end: subjects never trained on, then the training subjects' held out
UNSEEN_SHARE = 29 / 57  # of the subjects: R-Tuning's 29 of MMLU's 57 never trained on


def question_key(task: str, question: str) -> str:
    return f"{task}\n{' '.join(question.casefold().split())}"


def group_key(item: Item, task: str) -> str:
    """What must not straddle the train, dev and test splits: the template an item was generated from (BBQ:
    ambiguous and disambiguated versions, every name swap), else the question itself."""
    template = item.source.get("template")
    return f"template\n{template}" if template else question_key(task, item.question)


def _hash_unit(key: str) -> float:
    """A number in [0, 1) fixed by `key`: for every run, seed and machine."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) / 16 ** 12


def split_of(key: str, fractions: tuple[float, float, float]) -> str:
    """A question's split among train, dev and test, from a hash of its key."""
    u = _hash_unit(key)
    if u < fractions[0]:
        return "train"
    return "dev" if u < fractions[0] + fractions[1] else "test"


def unseen_subjects(subjects: Sequence[str], share: float = UNSEEN_SHARE) -> set[str]:
    """share x n of the n subjects, rounded down (some are always left to train on), those first by a hash of
    their names: never trained on. MMLU's 57 subjects at the default share: 29 (R-Tuning's split in size; which
    ones is this hash's choice); one subject alone: none."""
    ranked = sorted(set(subjects), key=lambda s: (_hash_unit(f"subject\n{s}"), s))
    return set(ranked[:int(share * len(ranked) + 1e-9)])


def abstention_versions(item: Item, task: str, rng: random.Random) -> list[Item]:
    """The answerable and unanswerable versions of one item, each with an explicit IDK option last."""
    key = group_key(item, task)
    if item.idk is not None:  # the task has its own IDK option: its items are used as they are
        kind = "answerable" if item.answerable else "unanswerable"
        return [replace(item, id=f"{item.id}/{kind}", source={**item.source, "version": kind, "group": key,
                                                              "construction": "answerable" if item.answerable
                                                              else "wording"})]
    if len(item.choices) < 3 or len(item.correct) != 1:
        return []  # two options would leave a single one; several correct ones have no single removal
    correct = item.correct[0]
    wrong = [i for i in range(len(item.choices)) if i != correct]
    versions = []
    for kind, removed in (("answerable", rng.choice(wrong)), ("unanswerable", correct)):
        keep = [i for i in range(len(item.choices)) if i != removed]
        choices = tuple(item.choices[i] for i in keep) + (IDK_CONTINUATION,)
        idk = len(choices) - 1
        answer = (keep.index(correct),) if kind == "answerable" else (idk,)
        construction = "answerable" if kind == "answerable" else "option removed"
        versions.append(Item(id=f"{item.id}/{kind}", question=item.question, choices=choices, correct=answer,
                             idk=idk, source={**item.source, "version": kind, "group": key,
                                              "construction": construction}))
    return versions


def abstention_splits(tasks: Sequence[str] = DEFAULT_TASKS, *, per_task: int | None = None,
                      fractions: tuple[float, float, float] = (0.6, 0.2, 0.2), unseen_share: float = UNSEEN_SHARE,
                      seed: int = 0, option_order: str = "shuffle", errors: list | None = None
                      ) -> dict[str, list[Item]]:
    """{"train", "dev", "test", "unseen"} -> items. per_task: at most this many questions of each task, or of
    each of its subjects where its items have one (the first ones). unseen_share: the share of all the tasks'
    subjects held out whole (`unseen_subjects`); fractions: how the other questions divide among train, dev
    and test. `seed` picks which wrong option the answerable version drops and the option shuffle. errors: a
    list that takes the rows no task could read (MMLU's two header rows), each an `ItemError`; without one,
    such a row stops with an error naming it."""
    if option_order not in ("shuffle", "source"):
        raise DcsjaxError(f"option_order must be 'shuffle' or 'source' for training data, not {option_order!r}")
    if not 0.0 <= unseen_share < 1.0:
        raise DcsjaxError(f"unseen_share must lie in [0, 1), not {unseen_share}")
    loaded = []
    for task in tasks:
        card = resolve_task(task)
        items, bad = load_task(card)
        if bad and errors is None:
            raise DcsjaxError(f"task {task}: {len(bad)} malformed item(s), first: {bad[0].where}: {bad[0].reason}")
        if errors is not None:
            errors += bad
        loaded.append((card.name, items))
    # subjects held out are chosen among all the tasks' subjects at once (`mmlu:a,mmlu:b` are two tasks of one)
    unseen = unseen_subjects([i.source["subject"] for _, items in loaded for i in items if i.source.get("subject")],
                             unseen_share)
    rng = random.Random(seed)
    splits: dict[str, list[Item]] = {name: [] for name in SPLITS}
    for task, items in loaded:
        taken: dict = {}
        for item in items:
            subject = item.source.get("subject")
            taken[subject] = taken.get(subject, 0) + 1
            if per_task is not None and taken[subject] > per_task:
                continue
            for version in abstention_versions(item, task, rng):
                if option_order == "shuffle":
                    version = permute(version, shuffled(version.id, len(version.choices), seed))
                where = "unseen" if subject in unseen else split_of(version.source["group"], fractions)
                splits[where].append(version)
    return splits


def stated_targets(items: Sequence[Item], thresholds: Sequence[float], seed: int = 0) -> list[float]:
    """Per item, the target t its stated-risk training prompt states: drawn uniformly from `thresholds` by a
    hash of (seed, item id), so the same for every run and machine, and independent of the item's split and
    construction (a question's two versions draw apart)."""
    ts = [float(t) for t in thresholds]
    if not ts:
        raise DcsjaxError("the stated-risk arm needs at least one target threshold to state")
    return [ts[min(int(_hash_unit(f"stated\n{seed}\n{item.id}") * len(ts)), len(ts) - 1)] for item in items]


def write_jsonl(items: Sequence[Item], path: Path) -> Path:
    """Items as a `jsonl:` benchmark file, so `dcsjax eval --tasks jsonl:FILE` scores exactly them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for item in items:
            f.write(json.dumps({"id": item.id, "question": item.question, "choices": list(item.choices),
                                "answer": list(item.correct), "idk": item.idk,
                                "construction": item.source.get("construction")}) + "\n")
    return path
