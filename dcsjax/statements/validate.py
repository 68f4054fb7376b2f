"""`dcsjax statements validate FILE`: how close each statement stays to its question-answer pair (002 A.2).

Per statement: sentence BLEU (sacrebleu, on a 0-1 scale as the paper reports it) against the pair
"question answer", and the length gap, statement minus pair, in tokens (whitespace words, or a model's
tokens). Per item: the median gap (002 A.2's "within-item median difference") and the spread of its
statements' lengths (longest minus shortest: a long correct statement would favour nothing in APS, which
averages per token, but a skewed spread is worth seeing). Optionally a model judges meaning with the
paper's question (does the statement preserve the meaning of the question-answer pair without omissions
or distortions?), read as P(Yes) against P(No) at the answer's first token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from dcsjax.data.jsonl import read_statements
from dcsjax.errors import InputError
from dcsjax.metrics.statements import bleu, qa_pair, statement_metrics, word_count  # noqa: F401 (this command's names)

JUDGE_PROMPT = ("Question: {question}\nAnswer: {answer}\nStatement: {statement}\n\nDoes the statement preserve the "
                "meaning of the question-answer pair without omissions or distortions? Answer Yes or No.")


def judge_meaning(scorer, rows: Sequence[dict]) -> list[list[float]]:
    """Per item and statement, the judge's P(Yes) against P(No) (renormalised over the two answers)."""
    contexts, options = [], []
    chat = bool(scorer.tokenizer.chat_template)
    for row in rows:
        for choice, statement in zip(row["choices"], row["statements"]):
            prompt = JUDGE_PROMPT.format(question=row["question"], answer=choice, statement=statement)
            if chat:
                contexts.append(scorer.chat_text(prompt))
                options.append(["Yes", "No"])
            else:
                contexts.append(prompt + "\nAnswer:")
                options.append([" Yes", " No"])
    scores = scorer.score_options(contexts, options) if contexts else []
    p_yes = iter([float(1 / (1 + np.exp(s[1] - s[0]))) for s in scores])
    return [[next(p_yes) for _ in row["statements"]] for row in rows]


def summarise(metrics: Sequence[dict], judged: Sequence[Sequence[float]] | None = None) -> dict[str, float]:
    flat_bleu = [b for m in metrics for b in m["bleu"]]
    median_gaps = [m["median_gap"] for m in metrics]
    spreads = [m["length_spread"] for m in metrics]
    summary = {"items": len(metrics), "statements": len(flat_bleu),
               "bleu_mean": float(np.mean(flat_bleu)), "bleu_median": float(np.median(flat_bleu)),
               "median_gap_mean": float(np.mean(median_gaps)), "median_gap_median": float(np.median(median_gaps)),
               "length_spread_mean": float(np.mean(spreads)), "length_spread_median": float(np.median(spreads))}
    if judged is not None:
        summary["judge_yes"] = float(np.mean([p > 0.5 for item in judged for p in item]))
    return summary


def format_summary(summary: dict[str, float]) -> str:
    lines = ["| measure | value |", "|---|---:|"]
    lines += [f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in summary.items()]
    return "\n".join(lines)


def plot_histograms(metrics: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    data = [([b for m in metrics for b in m["bleu"]], "BLEU vs question-answer pair"),
            ([g for m in metrics for g in m["length_gap"]], "length gap (statement - pair)"),
            ([m["length_spread"] for m in metrics], "within-item length spread")]
    for ax, (values, title) in zip(axes, data):
        ax.hist(values, bins=20, color="C0", alpha=0.8)
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def validate_file(path: Path, out: Path, *, tokenizer=None, judge=None) -> dict[str, float]:
    """Metrics of every row, `validation.jsonl`, `histograms.png` and `summary.md` under `out`."""
    rows = read_statements(path)
    if not rows:
        raise InputError(f"{path}: no statements to validate")
    count = word_count if tokenizer is None else (lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    metrics = statement_metrics(rows, count)
    judged = judge_meaning(judge, rows) if judge is not None else None
    if judged is not None:
        for m, p in zip(metrics, judged):
            m["judge_p_yes"] = p
    out.mkdir(parents=True, exist_ok=True)
    with (out / "validation.jsonl").open("w") as f:
        f.writelines(json.dumps(m) + "\n" for m in metrics)
    plot_histograms(metrics, out / "histograms.png")
    summary = summarise(metrics, judged)
    (out / "summary.md").write_text(f"Statements: {path}\n\n{format_summary(summary)}\n")
    return summary
