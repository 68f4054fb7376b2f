"""Perplexity ranking of one text per option (paper 002 §2): `aps` and `qa-ppl`.

`aps` ranks declarative statements, one per option ("The Vedas are the oldest Hindu texts."): from a
statements file (`dcsjax statements generate`, 002 A.1), a card's cloze rule (the option fills the blank),
options that are statements already, or a card template marked declarative. It is the paper's APS only
with such statements, so it refuses a task that has none.
`qa-ppl` ranks the question followed by each option (the card's `qa_template`): the question-plus-option
scoring that 002 §2 sets apart from APS; kept under its own name so that it is never read as APS.
Each text is scored alone, every token conditioned on the document start; the lowest perplexity wins.

APS's statements are validated as 002 A.2 validates them, in every run: each record carries its statements'
BLEU against their question-answer pairs and their length gaps (words), and the summary their medians beside the
accuracy. Statements that stray from their pairs (`VALID_BLEU_MEDIAN`, `VALID_GAP_WORDS`) make the accuracy
withheld: the table says why and prints no number from them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from dcsjax.data.items import Item


def rank_by_perplexity(scorer, items: Sequence[Item], texts: Callable[[Item], Sequence[str]],
                       field: str = "statements") -> list[dict]:
    """Each text alone; mean token log-prob; the lowest-perplexity text is the answer."""
    per_item = [list(texts(item)) for item in items]
    flat = [t for ts in per_item for t in ts]
    means = iter(scorer.score(flat, reduction="mean")) if flat else iter(())
    records = []
    for item, ts in zip(items, per_item):
        ppl = np.exp(-np.array([next(means) for _ in ts]))
        order = np.argsort(ppl, kind="stable")
        choice = int(order[0])
        records.append({
            "id": item.id, "choice": choice, "correct": choice in item.correct, "ppl": ppl.round(6).tolist(),
            "ppl_correct": float(ppl[item.correct[0]]),
            "ppl_delta": float(ppl[order[1]] - ppl[order[0]]),  # second choice minus first (002 §4, E.3)
            field: ts,
        })
    return records


# The bounds a task's statements keep to for APS to be published: 002 A.2 measured a BLEU median of 0.75 and a
# median length gap of about -1 token on its generated statements; ours allow a BLEU median down to two thirds
# of that and a median gap (statement minus question-answer pair) within 3 words either way.
VALID_BLEU_MEDIAN, VALID_GAP_WORDS = 0.5, 3.0


def run_aps(scorer, items: Sequence[Item], statements: Callable[[Item], Sequence[str]]) -> list[dict]:
    from dcsjax.metrics.statements import statement_metrics

    records = rank_by_perplexity(scorer, items, statements, "statements")
    rows = [{"id": r["id"], "question": item.question, "choices": item.choices, "statements": r["statements"]}
            for item, r in zip(items, records)]
    for record, checked in zip(records, statement_metrics(rows)):
        record["bleu"] = [round(b, 4) for b in checked["bleu"]]
        record["length_gap"] = checked["length_gap"]
    return records


def summarise_aps(records: list[dict]) -> dict:
    """Accuracy, then the statements' validation (002 A.2): BLEU mean and median over statements, the median over
    items of each item's median length gap (words); `withheld` names why the accuracy is not to be published."""
    out = summarise(records)
    bleu = [b for r in records for b in r.get("bleu", [])]
    gaps = [float(np.median(r["length_gap"])) for r in records if r.get("length_gap")]
    if not bleu:
        return out
    out.update(statements_bleu_mean=float(np.mean(bleu)), statements_bleu_median=float(np.median(bleu)),
               statements_gap_median=float(np.median(gaps)))
    why = []
    if out["statements_bleu_median"] < VALID_BLEU_MEDIAN:
        why.append(f"BLEU median {out['statements_bleu_median']:.2f} < {VALID_BLEU_MEDIAN}")
    if abs(out["statements_gap_median"]) > VALID_GAP_WORDS:
        why.append(f"median length gap {out['statements_gap_median']:+.1f} words beyond ±{VALID_GAP_WORDS:g}")
    if why:
        out.update(accuracy=None, ppl_delta=None,  # nothing published from them
                   withheld="the statements fail validation (002 A.2): " + "; ".join(why))
    return out


def validation_table(rows: list[dict], fmt: str = "text") -> str:
    """Under the results table: each APS row's statement validation beside 002 A.2's own figures."""
    from dcsjax.eval.tables import render

    lines = [[r["model"], r["task"], str(r["n"]), f"{m['statements_bleu_mean']:.2f} / {m['statements_bleu_median']:.2f}",
              f"{m['statements_gap_median']:+.1f}", "withheld" if m.get("withheld") else "kept"]
             for r in rows for m in [r["metrics"]] if "statements_bleu_median" in m]
    if not lines:
        return ""
    return "\n".join([f"APS statements against their question-answer pairs (002 A.2: BLEU 0.69 / 0.75, median gap "
                      f"about -1 token; published here where the BLEU median >= {VALID_BLEU_MEDIAN} and the gap within "
                      f"±{VALID_GAP_WORDS:g} words):", "",
                      render(["model", "task", "items", "BLEU mean / median", "median gap (words)", "APS"], lines, fmt,
                             numeric=(2, 3, 4))])


def qa_texts(item: Item, template: str) -> list[str]:
    return [template.format(question=item.question, choice=c) for c in item.choices]


def run_qa_ppl(scorer, items: Sequence[Item], template: str) -> list[dict]:
    return rank_by_perplexity(scorer, items, lambda item: qa_texts(item, template), "texts")


def summarise(records: list[dict]) -> dict:
    return {"accuracy": _mean([r["correct"] for r in records]), "ppl_delta": _mean([r["ppl_delta"] for r in records])}


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None
