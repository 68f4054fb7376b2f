"""`dcsjax eval`: every protocol on every task, results written per item as they finish, resumable.

Layout: DIR/<model>/<task>/<protocol>.jsonl (one record per item), DIR/<model>/<task>/errors.jsonl (items
that failed their checks, with line and reason), and DIR/summary.json. A run that is killed and started
again skips the items already written; scores do not depend on which items share a batch (they are
bit-identical however the batches are packed), so the resumed files equal those of an unbroken run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from dcsjax.data.tasks import load_task, resolve_task, statements_for
from dcsjax.kernels.dcs import loadings_from_threshold
from dcsjax.metrics.bootstrap import mean_ci
from dcsjax.protocols.apx import run_apx
from dcsjax.protocols.likelihood import run_aps, run_dcs_letters, run_dcs_sequences, run_mcqa

PROTOCOLS = ("aps", "mcqa", "apx", "dcs", "dcs-letters")
CHUNK = 32  # items per write: small enough to lose little on a kill, large enough to fill batches


def bootstrap_ci(values: Sequence[float], n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean, resampling items."""
    interval = mean_ci(values, n_boot, seed)
    return interval.low, interval.high


def read_records(path: Path) -> list[dict]:
    """Records already written; a last line cut short by a kill is dropped (and rewritten on resume)."""
    if not path.exists():
        return []
    records, good_bytes = [], 0
    with path.open("rb") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
            if not line.endswith(b"\n"):
                records.pop()
                break
            good_bytes += len(line)
    if good_bytes != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_bytes)
    return records


def append_records(path: Path, records: list[dict]) -> None:
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())


def run_protocol(protocol: str, scorer, items, card, lc: float, lw: float, statements=None) -> list[dict]:
    """statements: item -> its declarative statements for APS (default: the card's rule)."""
    if not items:  # a process whose share of a short last chunk is empty
        return []
    if protocol == "aps":
        return run_aps(scorer, items, statements or statements_for(card))
    if protocol == "mcqa":
        return run_mcqa(scorer, items)
    if protocol == "apx":
        return run_apx(scorer, items)
    if protocol == "dcs":
        return run_dcs_sequences(scorer, items, lc, lw)
    if protocol == "dcs-letters":
        return run_dcs_letters(scorer, items, lc, lw)
    raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")


def summarise(protocol: str, records: list[dict]) -> dict[str, float]:
    """The headline metric of a protocol (first key) and its companions."""
    if protocol == "aps":
        return {"accuracy": np.mean([r["correct"] for r in records]),
                "ppl_delta": np.mean([r["ppl_delta"] for r in records])}
    if protocol == "mcqa":
        return {f"accuracy_{k}": np.mean([r["correct"][k] for r in records]) for k in ("sum", "token", "char", "byte")}
    if protocol == "apx":
        return {"accuracy": np.mean([r["correct"] for r in records]),
                "parse_failures": np.mean([r["parse_error"] is not None for r in records])}
    answered = [r for r in records if not r["abstained"]]
    return {
        "dcs": np.mean([r["dcs"] for r in records]),
        "accuracy": np.mean([r["correct"] for r in records]),
        "abstention": np.mean([r["abstained"] for r in records]),
        "accuracy_answered": np.mean([r["correct"] for r in answered]) if answered else float("nan"),
        "p_idk": np.mean([r["p_idk"] for r in records]),
    }


def headline_values(protocol: str, records: list[dict]) -> list[float]:
    if protocol in ("aps", "apx"):
        return [float(r["correct"]) for r in records]
    if protocol == "mcqa":
        return [float(r["correct"]["sum"]) for r in records]
    return [r["dcs"] for r in records]


def run_eval(model: str, tasks: Sequence[str], protocols: Sequence[str], output: Path, limit: int | None = None,
             threshold: float | None = None, batch_size: int = 16, progress: bool = True, scorer=None,
             chunk: int = CHUNK, dtype: str = "float32", mesh=None, statements: str | Path | None = None) -> dict:
    """Every protocol on every task. In a multi-process run (`dcsjax.distributed`), each process scores its
    share of every chunk and process 0 writes the gathered records; the files equal a single process's.

    statements: a file from `dcsjax statements generate`: APS reads its statements, and every protocol
    scores only the items it holds (the same items for all, as in paper 002); each item it lacks (filtered
    at generation) is an error record of its task."""
    import dcsjax
    from dcsjax import distributed

    for p in protocols:
        if p not in PROTOCOLS:
            raise ValueError(f"unknown protocol {p!r}; known: {', '.join(PROTOCOLS)}")
    lc, lw = loadings_from_threshold(threshold) if threshold is not None else (1.0, 1.0)
    scorer = scorer or dcsjax.load(model, batch_size=batch_size, dtype=dtype, mesh=mesh)
    lead = distributed.rank() == 0  # the process that reads and writes the files
    output = Path(output)
    summary_path = output / "summary.json"
    summary = json.loads(summary_path.read_text()) if lead and summary_path.exists() else {"rows": []}
    rows = [r for r in summary["rows"] if r["model"] != scorer.name or r["task"] not in tasks]
    for task in tasks:
        card = resolve_task(task)
        items, errors = load_task(card)
        if limit is not None:
            items = items[:limit]
        if statements is not None:
            items, errors = _with_statements(items, errors, Path(statements))
        folder = output / scorer.name / card.slug
        if lead:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "errors.jsonl").write_text("".join(json.dumps(e.as_record()) + "\n" for e in errors))
        for protocol in protocols:
            path = folder / f"{protocol}.jsonl"
            done = set(distributed.from_rank0(sorted(r["id"] for r in read_records(path)) if lead else []))
            todo = [i for i in items if i.id not in done]
            start = time.perf_counter()
            bar = _bar(progress and lead, len(items), len(items) - len(todo), f"{scorer.name} {card.name} {protocol}")
            for s in range(0, len(todo), chunk):
                part = todo[s:s + chunk]
                mine = run_protocol(protocol, scorer, distributed.my_share(part), card, lc, lw,
                                    (lambda item: list(item.statements)) if statements is not None else None)
                records = distributed.gather_in_order(mine, len(part))
                if lead:
                    append_records(path, records)
                bar.update(len(part))
            bar.close()
            if not lead:
                continue
            by_id = {r["id"]: r for r in read_records(path)}
            records = [by_id[i.id] for i in items if i.id in by_id]
            metrics = {k: float(v) for k, v in summarise(protocol, records).items()}
            low, high = bootstrap_ci(headline_values(protocol, records))
            rows.append({"model": scorer.name, "task": card.name, "protocol": protocol, "n": len(records),
                         "errors": len(errors), "metric": next(iter(metrics)), "value": next(iter(metrics.values())),
                         "ci95": [low, high], "metrics": metrics, "lc": lc, "lw": lw,
                         "seconds": round(time.perf_counter() - start, 2)})
    summary = {"rows": rows}
    if lead:
        output.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=1))
    return distributed.from_rank0(summary)


def _with_statements(items, errors, path: Path):
    """Items that have statements in the file, carrying them; the rest become error records."""
    from dataclasses import replace

    from dcsjax.data.items import ItemError
    from dcsjax.statements.validate import read_statements

    by_id = {row["id"]: row["statements"] for row in read_statements(path)}
    kept = [replace(i, statements=tuple(by_id[i.id])) for i in items if i.id in by_id and len(by_id[i.id]) == len(i.choices)]
    missing = [ItemError(i.id, f"no statements for it in {path} (filtered at generation?)") for i in items
               if i.id not in by_id or len(by_id[i.id]) != len(i.choices)]
    return kept, [*errors, *missing]


def _bar(progress: bool, total: int, initial: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="item", disable=not progress)


def format_table(summary: dict) -> str:
    header = ["model", "task", "protocol", "n", "err", "metric", "value", "95% CI"]
    rows = [[r["model"], r["task"], r["protocol"], str(r["n"]), str(r["errors"]), r["metric"], f"{r['value']:.3f}",
             f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"] for r in summary["rows"]]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])
