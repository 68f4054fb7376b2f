"""The order in which a protocol presents an item's options, and what the records keep of it.

Sources often put the correct option at one position (BIG-bench 1.0.0: A in every hhh_alignment and
emoji_movie item, C in every timedial item), so a letter protocol scored in source order rewards a letter
preference. Three orders:
- `source`: as the source lists them;
- `shuffle` (the default): a permutation seeded by the run seed and the item id, the same for every model
  and every run with that seed;
- `rotate`: every cyclic rotation, scored apart and averaged (the distributions of `dcs-letters`, the votes
  of `apx`), so a preference for a letter position spreads evenly over the options. Only protocols that
  show letters depend on the order; the others (each option scored on its own) are scored once, shuffled.

A permutation `perm` lists source indices by presented position: presented option i is source option
perm[i]. Records are in the presented order and keep `perm`, the gold letters and the answered letter.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Sequence

import numpy as np

from dcsjax.data.items import LETTERS, Item

ORDERS = ("source", "shuffle", "rotate")
DEFAULT_ORDER = "shuffle"


def shuffled(item_id: str, n: int, seed: int) -> tuple[int, ...]:
    """A permutation of n options fixed by the run seed and the item id (not by the item's position in a
    file or a batch, so a resumed or sharded run presents the same order)."""
    key = int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "little")
    return tuple(int(i) for i in np.random.default_rng([seed, key]).permutation(n))


def rotations(n: int) -> list[tuple[int, ...]]:
    return [tuple((r + i) % n for i in range(n)) for r in range(n)]


def permutations_for(item: Item, order: str, seed: int, letters: bool) -> list[tuple[int, ...]]:
    """The presentations of one item: one, except `rotate` on a protocol that shows letters."""
    n = len(item.choices)
    if order == "source":
        return [tuple(range(n))]
    if order == "rotate" and letters:
        return rotations(n)
    if order in ("shuffle", "rotate"):
        return [shuffled(item.id, n, seed)]
    raise ValueError(f"unknown option order {order!r}; known: {', '.join(ORDERS)}")


def permute(item: Item, perm: Sequence[int]) -> Item:
    """The item with its options (statements, correct and IDK indices with them) in the order `perm`."""
    where = {source: shown for shown, source in enumerate(perm)}
    return replace(item, choices=tuple(item.choices[p] for p in perm),
                   correct=tuple(sorted(where[c] for c in item.correct)),
                   statements=None if item.statements is None else tuple(item.statements[p] for p in perm),
                   idk=None if item.idk is None else where[item.idk])


def with_idk(item: Item, text: str) -> Item:
    """The item with "I don't know" as one more option, where it has none of its own (so a shuffle can
    place it at any letter, like the others)."""
    if item.idk is not None:
        return item
    return replace(item, choices=(*item.choices, text), idk=len(item.choices),
                   statements=None if item.statements is None else (*item.statements, text))


def order_record(presented: Item, perm: Sequence[int], answer: int | None) -> dict:
    """What a record keeps of its presentation: the permutation, the gold letters, the answered letter."""
    return {"perm": list(perm), "gold": [LETTERS[c] for c in presented.correct],
            "answer": None if answer is None else LETTERS[answer], "size": len(perm)}


def position_report(records: Sequence[dict]) -> dict:
    """Where the gold options and the answers sit, over every presentation of every record, and the
    accuracy of the best constant answer (always the same letter) on these presentations (002 A.3).

    A constant letter's accuracy is the share of presentations whose gold letters include it; the best
    constant is the baseline a letter preference alone reaches."""
    presentations = [p for r in records for p in r.get("order", {}).get("presentations", [])]
    if not presentations:
        return {"gold": {}, "answer": {}, "best_constant": None, "best_constant_letter": None, "presentations": 0}
    width = max(p["size"] for p in presentations)
    letters = LETTERS[:width]
    gold = {x: sum(x in p["gold"] for p in presentations) for x in letters}
    answer = {x: sum(p["answer"] == x for p in presentations) for x in letters}
    answer["none"] = sum(p["answer"] is None for p in presentations)
    best = max(letters, key=lambda x: gold[x])
    return {"gold": gold, "answer": answer, "best_constant": gold[best] / len(presentations),
            "best_constant_letter": best, "presentations": len(presentations)}
