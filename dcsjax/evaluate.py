"""`dcsjax eval`: every protocol on every task, results written per item as they finish, resumable.

The files and their rules belong to `dcsjax.results`: records carry the fingerprint of what made them,
a resumed run reuses only records of its own fingerprint, one process at a time writes a folder, and
summary.json is merged and written atomically. Scores do not depend on which items share a batch (they
are bit-identical however the batches are packed), so a resumed run's files equal an unbroken run's.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from dcsjax import results
from dcsjax.errors import ConfigError, InputError
from dcsjax.metrics.bootstrap import mean_ci

PROTOCOLS = ("aps", "mcqa", "apx", "dcs", "dcs-letters")
CHUNK = 32  # items per write: small enough to lose little on a kill, large enough to fill batches
OPTION_ORDER = "source"  # options are scored in the order the source lists them


def bootstrap_ci(values: Sequence[float], n_boot: int = 1000, seed: int = 0) -> tuple[float | None, float | None]:
    """95% percentile interval of the mean, resampling items; (None, None) for no items."""
    if len(values) == 0:
        return None, None
    interval = mean_ci(values, n_boot, seed)
    return interval.low, interval.high


def read_records(path: Path) -> list[dict]:
    """A protocol's records, read only (see `dcsjax.results.read_records`)."""
    return results.read_records(path)


def run_protocol(protocol: str, scorer, items, card, lc: float, lw: float, statements=None) -> list[dict]:
    """statements: item -> its declarative statements for APS (default: the card's rule)."""
    from dcsjax.data.tasks import statements_for
    from dcsjax.protocols.apx import run_apx
    from dcsjax.protocols.likelihood import run_aps, run_dcs_letters, run_dcs_sequences, run_mcqa

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
    raise ConfigError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")


def score_items(protocol: str, scorer, items, card, lc: float, lw: float, statements=None) -> list[dict]:
    """`run_protocol`, but an item the model cannot take (longer than its context, say) becomes an error
    record naming the item, {"id", "error"}, while the others are scored."""
    try:
        return run_protocol(protocol, scorer, items, card, lc, lw, statements)
    except InputError as err:
        if len(items) == 1:
            return [{"id": items[0].id, "error": f"{protocol}: {err}"}]
    return [r for item in items for r in score_items(protocol, scorer, [item], card, lc, lw, statements)]


def protocol_settings(protocol: str, scorer, card, lc: float, lw: float, statements_file: str | None) -> dict:
    """What, besides model, task and code, decides a protocol's records: it goes into their fingerprint."""
    from dcsjax.protocols.apx import MAX_NEW_TOKENS, is_instruct, uses_chat_template
    from dcsjax.protocols.likelihood import IDK_CONTINUATION, letters_use_chat_template

    settings: dict = {"option_order": OPTION_ORDER}
    if protocol == "aps":
        settings["statements"] = ("file" if statements_file else "cloze" if card.cloze_blank
                                  else "choices" if card.statements == "choices" else card.statement_template)
    elif protocol == "apx":
        settings |= {"instruct": is_instruct(scorer), "chat_template": uses_chat_template(scorer),
                     "max_new_tokens": MAX_NEW_TOKENS}
    elif protocol == "dcs":
        settings |= {"lc": lc, "lw": lw, "idk_continuation": IDK_CONTINUATION}
    elif protocol == "dcs-letters":
        settings |= {"lc": lc, "lw": lw, "chat_template": letters_use_chat_template(scorer)}
    return settings


def task_identity(card, items, statements_file: Path | None) -> dict:
    """The task's card and a digest of every item it holds (so a changed source file is a changed task)."""
    from dcsjax.fetch import sha256_file

    rows = [[i.id, i.question, list(i.choices), list(i.correct), i.statements and list(i.statements), i.idk]
            for i in items]
    card_fields = asdict(card)
    if card.source.startswith("jsonl:"):  # a local file is known by its items, not by how its path was spelled
        card_fields.pop("source")
    identity = {"card": card_fields, "items": results.digest(rows, 32)}
    if statements_file is not None:
        identity["statements_file"] = sha256_file(statements_file)
    return identity


def summarise(protocol: str, records: list[dict]) -> dict[str, float | None]:
    """The headline metric of a protocol (first key) and its companions; None where there are no items."""
    def mean(values):
        return float(np.mean(values)) if len(values) else None

    if protocol == "aps":
        return {"accuracy": mean([r["correct"] for r in records]), "ppl_delta": mean([r["ppl_delta"] for r in records])}
    if protocol == "mcqa":
        return {f"accuracy_{k}": mean([r["correct"][k] for r in records]) for k in ("sum", "token", "char", "byte")}
    if protocol == "apx":
        return {"accuracy": mean([r["correct"] for r in records]),
                "parse_failures": mean([r["parse_error"] is not None for r in records])}
    answered = [r for r in records if not r["abstained"]]
    return {"dcs": mean([r["dcs"] for r in records]), "accuracy": mean([r["correct"] for r in records]),
            "abstention": mean([r["abstained"] for r in records]),
            "accuracy_answered": mean([r["correct"] for r in answered]), "p_idk": mean([r["p_idk"] for r in records])}


def headline_values(protocol: str, records: list[dict]) -> list[float]:
    if protocol in ("aps", "apx"):
        return [float(r["correct"]) for r in records]
    if protocol == "mcqa":
        return [float(r["correct"]["sum"]) for r in records]
    return [r["dcs"] for r in records]


def check_arguments(protocols: Sequence[str], limit: int | None, threshold: float | None) -> tuple[float, float]:
    """Clear errors before anything is loaded. -> (lc, lw)."""
    from dcsjax.kernels.dcs import loadings_from_threshold

    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown or not protocols:
        raise ConfigError(f"unknown protocol {', '.join(map(repr, unknown)) or '(none given)'}; known: "
                          f"{', '.join(PROTOCOLS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit must be a whole number of items, at least 1, not {limit!r}")
    if threshold is None:
        return 1.0, 1.0
    try:
        return loadings_from_threshold(float(threshold))
    except ValueError as err:
        raise ConfigError(f"{err}: answering pays above confidence t, so 0 < t < 1") from err


def run_eval(model: str, tasks: Sequence[str], protocols: Sequence[str], output: Path, limit: int | None = None,
             threshold: float | None = None, batch_size: int = 16, progress: bool = True, scorer=None,
             chunk: int = CHUNK, dtype: str = "float32", mesh=None, statements: str | Path | None = None,
             replace_stale: bool = False, document_start: str | None = None, variant: str | None = None) -> dict:
    """Every protocol on every task. In a multi-process run (`dcsjax.distributed`), each process scores its
    share of every chunk and process 0 writes the gathered records; the files equal a single process's.

    statements: a file from `dcsjax statements generate`: APS reads its statements, and every protocol
    scores only the items it holds (the same items for all, as in paper 002); each item it lacks (filtered
    at generation) is an error record of its task.
    replace_stale: records of other settings in the output are moved aside (`.stale`) instead of stopping."""
    import dcsjax
    from dcsjax import distributed
    from dcsjax.data.tasks import load_task, resolve_task

    lc, lw = check_arguments(protocols, limit, threshold)
    cards = [resolve_task(task) for task in tasks]
    statements = Path(statements) if statements is not None else None
    lead = distributed.rank() == 0  # the process that reads and writes the files
    output = Path(output)
    writer = results.ResultsWriter(output, replace_stale) if lead else contextlib.nullcontext()
    with writer:  # taken before the model loads: a locked or unwritable folder fails at once
        scorer = scorer or dcsjax.load(model, batch_size=batch_size, dtype=dtype, mesh=mesh,
                                       document_start=document_start, variant=variant)
        model_identity = scorer.model_fingerprint or {"name": scorer.name}
        rows = []
        for card in cards:
            all_items, load_errors = load_task(card)
            task = task_identity(card, all_items, statements)
            items = all_items[:limit] if limit is not None else all_items
            if statements is not None:
                items, load_errors = _with_statements(items, load_errors, statements)
            folder = results.task_folder(output, scorer.name, card.slug)
            errors = [e.as_record() for e in load_errors]
            if lead:
                writer.write_errors(folder, errors)
            for protocol in protocols:
                settings = {"model": model_identity, "task": task, "protocol": protocol,
                            "settings": protocol_settings(protocol, scorer, card, lc, lw,
                                                          str(statements) if statements else None),
                            "code": results.code_version()}
                fingerprint = results.digest(settings)
                path = results.records_path(output, scorer.name, card.slug, protocol)
                state = {"done": [], "error": None}
                if lead:
                    try:
                        state["done"] = sorted(r["id"] for r in writer.resume(path, fingerprint, settings))
                    except results.ResultsError as err:
                        state["error"] = str(err)
                state = distributed.from_rank0(state)
                if state["error"]:
                    raise results.ResultsError(state["error"])
                done = set(state["done"])
                todo = [i for i in items if i.id not in done]
                start = time.perf_counter()
                bar = _bar(progress and lead, len(items), len(items) - len(todo), f"{scorer.name} {card.name} {protocol}")
                scoring_errors = []
                for s in range(0, len(todo), chunk):
                    part = todo[s:s + chunk]
                    mine = score_items(protocol, scorer, distributed.my_share(part), card, lc, lw,
                                       (lambda item: list(item.statements)) if statements is not None else None)
                    gathered = distributed.gather_in_order(mine, len(part))
                    failed = [{"where": r["id"], "error": r["error"]} for r in gathered if "error" in r]
                    scoring_errors += failed
                    if lead:
                        writer.append(path, [{**r, "fingerprint": fingerprint} for r in gathered if "error" not in r])
                        writer.append(folder / "errors.jsonl", failed)
                    bar.update(len(part))
                bar.close()
                if not lead:
                    continue
                by_id = {r["id"]: r for r in results.read_records(path)}
                records = [by_id[i.id] for i in items if i.id in by_id]
                metrics = summarise(protocol, records)
                low, high = bootstrap_ci(headline_values(protocol, records))
                rows.append({"model": scorer.name, "task": card.name, "protocol": protocol, "n": len(records),
                             "errors": len(errors) + len(scoring_errors), "metric": next(iter(metrics)),
                             "value": next(iter(metrics.values())), "ci95": [low, high], "metrics": metrics,
                             "lc": lc, "lw": lw, "fingerprint": fingerprint, "settings": settings["settings"],
                             "seconds": round(time.perf_counter() - start, 2)})
        if lead:
            writer.update_summary(rows)
    # this run's rows, in its order (summary.json also keeps the rows of earlier runs of other tasks)
    return distributed.from_rank0({"rows": rows})


def _with_statements(items, errors, path: Path):
    """Items that have statements in the file, carrying them; the rest become error records."""
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
    def number(x):
        return "-" if x is None else f"{x:.3f}"

    header = ["model", "task", "protocol", "n", "err", "metric", "value", "95% CI"]
    rows = [[r["model"], r["task"], r["protocol"], str(r["n"]), str(r["errors"]), r["metric"], number(r["value"]),
             "-" if r["ci95"][0] is None else f"[{number(r['ci95'][0])}, {number(r['ci95'][1])}]"]
            for r in summary["rows"]]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])
