"""`dcsjax eval`: every protocol on every task, results written per item as they finish, resumable.

The files and their rules belong to `dcsjax.eval.results`: records carry the fingerprint of what made them,
a resumed run reuses only records of its own fingerprint, one process at a time writes a folder, and
summary.json is merged and written atomically. Scores do not depend on which items share a batch (they
are bit-identical however the batches are packed), so a resumed run's files equal an unbroken run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from dcsjax.eval import results
from dcsjax.errors import ConfigError, InputError, stop_point
from dcsjax.metrics.bootstrap import mean_ci
from dcsjax.eval import protocols as registry
from dcsjax.eval.protocols.options import DEFAULT_ORDER, ORDERS

# Items per write: the first write holds CHUNK items, and each later one twice the one before, up to
# MAX_CHUNK. A killed run loses at most one write. Every write ends in a part-filled batch in each bucket
# its items reach, so the items still to score are taken shortest first (`length_hint`): a write then
# spans one or two buckets instead of all of them, and few, growing writes keep `dcsjax eval` at one
# engine call's speed (bench/eval_end_to_end.py). Scores do not depend on which items share a batch, and
# the order and the sizes depend only on the items, so every process of a multi-process run cuts the
# same writes.
CHUNK = 32
MAX_CHUNK = 512


def read_records(path: Path) -> list[dict]:
    """A protocol's records, read only (see `dcsjax.eval.results.read_records`)."""
    return results.read_records(path)


def score_items(protocol: str, ctx, items, order: str = DEFAULT_ORDER, seed: int = 0) -> list[dict]:
    """The protocol's records of `items` (`dcsjax.eval.protocols.score`), but an item the model cannot take
    (longer than its context, say) becomes an error record naming the item, {"id", "error"}, while the
    others are scored."""
    try:
        return registry.score(registry.get(protocol), ctx, items, order, seed)
    except InputError as err:
        if len(items) == 1:
            return [{"id": items[0].id, "error": f"{protocol}: {err}"}]
    return [r for item in items for r in score_items(protocol, ctx, [item], order, seed)]


def protocol_settings(protocol: str, ctx, order: str, seed: int) -> dict:
    """What, besides model, task and code, decides a protocol's records: it goes into their fingerprint."""
    return {"option_order": order, **({"seed": seed} if order != "source" else {}),
            **registry.get(protocol).settings(ctx), **({"log_samples": True} if ctx.log_samples else {})}


def task_identity(card, items, statements_file: Path | None) -> dict:
    """The task's card and a digest of every item it holds (so a changed source file is a changed task)."""
    from dcsjax.cache import sha256_file
    from dcsjax.data.tasks import local_file

    rows = [[i.id, i.question, list(i.choices), list(i.correct), i.statements and list(i.statements), i.idk]
            for i in items]
    card_fields = asdict(card)
    if local_file(card.source):  # a local file is known by its items, not by how its path was spelled
        card_fields.pop("source")
    identity = {"card": card_fields, "items": results.digest(rows, 32)}
    if statements_file is not None:
        identity["statements_file"] = sha256_file(statements_file)
    return identity


def summarise(protocol: str, records: list[dict]) -> dict:
    """The headline metric of a protocol (first key) and its companions; None where there are no items."""
    return registry.get(protocol).summarise(records)


def headline_values(protocol: str, records: list[dict]) -> list[float]:
    return [registry.get(protocol).headline(r) for r in records]


def idk_warnings(metrics: dict, low: float | None, high: float | None) -> list[str]:
    """Where a single IDK phrasing moves the task's mean DCS outside the headline's interval."""
    from dcsjax.eval.protocols.dcs import CLASSES

    if low is None or "dcs_by_idk" not in metrics:
        return []
    return [f"IDK phrased {name!r}: mean DCS {value:.3f} outside the interval [{low:.3f}, {high:.3f}]"
            for name, value in metrics["dcs_by_idk"].items() if name not in CLASSES and not low <= value <= high]


def check_arguments(protocols: Sequence[str], limit: int | None, threshold: float | None,
                    option_order: str = DEFAULT_ORDER, idk_phrasings: Sequence[str] = ("I don't know.",),
                    sample: int | None = None) -> tuple[float, float]:
    """Clear errors before anything is loaded. -> (lc, lw)."""
    from dcsjax.metrics.dcs import loadings_from_threshold

    if option_order not in ORDERS:
        raise ConfigError(f"unknown option order {option_order!r}; known: {', '.join(ORDERS)}")
    if not idk_phrasings or any(not p.strip() for p in idk_phrasings) or len(set(idk_phrasings)) != len(idk_phrasings):
        raise ConfigError(f"IDK phrasings must be distinct non-empty texts, not {list(idk_phrasings)!r}")
    unknown = [p for p in protocols if p not in registry.PROTOCOLS]
    if unknown or not protocols:
        raise ConfigError(f"unknown protocol {', '.join(map(repr, unknown)) or '(none given)'}; known: "
                          f"{', '.join(registry.PROTOCOLS)}")
    for name, value in (("limit", limit), ("sample", sample)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be a whole number of items, at least 1, not {value!r}")
    if limit is not None and sample is not None:
        raise ConfigError("limit (the first N items) and sample (N items drawn by the seed) exclude each other")
    if threshold is None:
        return 1.0, 1.0
    try:
        return loadings_from_threshold(float(threshold))
    except ValueError as err:
        raise ConfigError(f"{err}: answering pays above confidence t, so 0 < t < 1") from err


@dataclass(frozen=True)
class EvalConfig:
    """Everything that says what a `dcsjax eval` run computes and where it writes: every protocol on every task.

    statements: a file from `dcsjax statements generate`: APS reads its statements, and every protocol
    scores only the items it holds (the same items for all, as in paper 002); each item it lacks (filtered
    at generation) is an error record of its task.
    option_order, seed: how options are presented (`dcsjax.eval.protocols.options`); shuffled by default.
    idk_phrasings: the wordings of "I don't know" that sequence DCS scores (the first is the IDK option's
    text in the letter prompt); () = the protocols' default phrasings.
    skip_unavailable: a protocol a task cannot run (APS without declarative statements) is skipped and
    named in the result's `skipped`, instead of stopping the run before it starts.
    replace_stale: records of other settings in the output are moved aside (`.stale`) instead of stopping.
    num_fewshot: solved exemplars before each question, MCQA-LL and APX only (`protocols.fewshot`).
    log_samples: each record keeps the text(s) the model was given (`prompt`); its raw output is in the
    record already (APX's generation, the log-likelihoods or probabilities of the others).
    include_path: folders of task cards (`*.toml`) outside the package, as lm-eval's `--include_path`.
    chunk, max_chunk: items per write (`write_spans`); progress: progress bars; share_continuations: the run's
    protocols score a shared (context, option) pair once (`Scorer.continuation_cache`). None changes a result."""
    model: str
    tasks: tuple[str, ...]
    protocols: tuple[str, ...]
    output: Path
    limit: int | None = None
    sample: int | None = None  # instead of the first `limit`: N items of each task drawn with `seed` (`sample_items`)
    threshold: float | None = None
    batch_size: int | str = 16  # or "auto" (`engine.batches.auto_batch_size`)
    dtype: str = "float32"
    mesh: object = None
    statements: Path | None = None
    replace_stale: bool = False
    document_start: str | None = None
    variant: str | None = None
    option_order: str = DEFAULT_ORDER
    seed: int = 0
    idk_phrasings: tuple[str, ...] = ()
    skip_unavailable: bool = False
    num_fewshot: int = 0
    log_samples: bool = False
    include_path: tuple[str, ...] = ()
    chunk: int = CHUNK
    max_chunk: int = MAX_CHUNK
    progress: bool = True
    share_continuations: bool = True

    def __post_init__(self) -> None:
        from dcsjax.eval.protocols import IDK_PHRASINGS

        set_ = object.__setattr__.__get__(self)  # frozen: normalised once, here
        set_("tasks", tuple(self.tasks))
        set_("protocols", tuple(self.protocols))
        set_("output", Path(self.output))
        set_("statements", Path(self.statements) if self.statements is not None else None)
        set_("idk_phrasings", tuple(self.idk_phrasings or IDK_PHRASINGS))
        set_("include_path", tuple(map(str, self.include_path)))

    @property
    def loadings(self) -> tuple[float, float]:
        """(lc, lw), once the arguments are checked (clear errors before anything loads)."""
        return check_arguments(self.protocols, self.limit, self.threshold, self.option_order, self.idk_phrasings,
                               self.sample)

    def run_record(self, cards, model_identity: dict) -> dict:
        """The run as summary.json names it (its rows point at it): this configuration, the resolved task
        names, the model's identity, the loadings and the versions."""
        lc, lw = self.loadings
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("output", "chunk", "max_chunk", "progress", "share_continuations")}  # not asdict: it deep-copies a mesh
        return {**fields, "tasks": [c.name for c in cards], "protocols": list(self.protocols),
                "idk_phrasings": list(self.idk_phrasings), "model_identity": model_identity, "lc": lc, "lw": lw,
                "statements": str(self.statements) if self.statements else None,
                "mesh": None if self.mesh is None else str(self.mesh),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "versions": results.environment()}


def run_eval(model: str, tasks: Sequence[str], protocols: Sequence[str], output: Path, *, scorer=None,
             **settings) -> dict:
    """`evaluate(EvalConfig(model, tasks, protocols, output, **settings), scorer)`."""
    return evaluate(EvalConfig(model, tuple(tasks), tuple(protocols), Path(output), **settings), scorer)


def _check_unique_folders(cards) -> None:
    """Two tasks of one run may not share a results folder (two files `a/items.jsonl`, `b/items.jsonl`)."""
    by_slug: dict[str, list[str]] = {}
    for card in cards:
        by_slug.setdefault(card.slug, []).append(card.source)
    clashes = {slug: sources for slug, sources in by_slug.items() if len(set(sources)) > 1}
    if clashes:
        raise ConfigError("; ".join(f"tasks {', '.join(sources)} would share the results folder {slug!r}"
                                    for slug, sources in clashes.items()) + ": rename a file, or run them apart")


def evaluate(config: EvalConfig, scorer=None) -> dict:
    """Plan (which protocol runs on which task, checked before the model loads), then per task and protocol
    resume and score (`_score_protocol`), then the merged summary. scorer: an already loaded model (else
    `config.model` is loaded). In a multi-process run (`dcsjax.engine.distributed`), each process scores its
    share of every chunk and process 0 writes the gathered records; the files equal a single process's.
    -> {"rows": this run's summary rows in its order, "skipped": [...], "empty": the tasks with no item}."""
    import dcsjax
    from dcsjax.data.tasks import resolve_task
    from dcsjax.engine import distributed
    from dcsjax.eval.protocols import fewshot

    config.loadings  # noqa: B018  (argument errors first)
    if not config.tasks:
        raise ConfigError("no task given: name one or more, comma-separated (--tasks)")
    fewshot.check(config.protocols, config.num_fewshot)
    cards = [resolve_task(task, config.include_path) for task in config.tasks]
    _check_unique_folders(cards)
    plan, skipped = _plan(config, cards)
    lead = distributed.rank() == 0  # the process that reads and writes the files
    writer = results.ResultsWriter(config.output, config.replace_stale) if lead else contextlib.nullcontext()
    with writer:  # taken before the model loads: a locked or unwritable folder fails at once
        # the data too, before the model: a file's duplicate ids, a statements file of another task or a hub
        # dataset out of reach stop the run now, not after the model has loaded
        loaded = [_load_items(config, card) for card, _ in plan]
        # a task with nothing in it (an empty file, blank lines only) is named, not scored; the others are
        empty = [{"task": card.name, "reason": f"task {card.name}: {card.source} holds no item to score (an "
                  "empty file, or blank lines only)"} for (card, _), task in zip(plan, loaded)
                 if not task["all"] and not task["errors"]]
        if plan and len(empty) == len(plan):  # nothing at all to score: before the model loads
            raise InputError("; ".join(e["reason"] for e in empty))
        scorer = scorer or dcsjax.load(config.model, batch_size=config.batch_size, dtype=config.dtype, mesh=config.mesh,
                                       document_start=config.document_start, variant=config.variant)
        model_identity = scorer.model_fingerprint or {"name": scorer.name}
        # the protocols of this run score a shared (question, option) pair once; a fresh cache per run
        scorer = scorer.replace(continuation_cache={} if config.share_continuations else None)
        rows = [row for (card, runnable), task in zip(plan, loaded) if task["all"] or task["errors"]
                for row in _score_task(config, card, task, runnable, scorer, writer, lead)]
        if lead:
            writer.update_summary(rows, config.run_record(cards, model_identity))
    # this run's rows, in its order (summary.json also keeps the rows of earlier runs of other tasks)
    return distributed.from_rank0({"rows": rows, "skipped": skipped, "empty": empty})


def _context(config: EvalConfig, card, scorer=None, pool=(), pool_split: str | None = None):
    """The protocols' view of one task: the model, the card, the loadings, statements, IDK wordings, exemplars
    (drawn from `pool`: the card's few-shot split, `pool_split`, or the task's own items)."""
    from dcsjax.eval.protocols import fewshot

    lc, lw = config.loadings
    from_file = (lambda item: list(item.statements)) if config.statements is not None else None
    exemplars = (fewshot.Exemplars(tuple(pool), config.num_fewshot, config.seed, config.option_order, pool_split)
                 if config.num_fewshot and pool else None)
    phrasings = config.idk_phrasings
    if card.idk_appended:  # the card names the appended option's wording: it comes first (the headline's IDK)
        phrasings = (card.idk_appended, *[p for p in phrasings if p != card.idk_appended])
    return registry.Context(scorer, card, lc, lw, from_file, str(config.statements) if config.statements else None,
                            phrasings, exemplars, config.log_samples)


def _plan(config: EvalConfig, cards) -> tuple[list, list[dict]]:
    """[(card, the protocols it runs)] and the (task, protocol) pairs that cannot run, with why; those stop the
    run before the model loads unless `skip_unavailable`."""

    from dcsjax.eval.protocols.mcqa import NORMALISATIONS

    plan, skipped = [], []
    for card in cards:
        if card.mcqa_normalisation not in NORMALISATIONS:
            raise ConfigError(f"task {card.name}: mcqa_normalisation is one of {', '.join(NORMALISATIONS)}, not "
                              f"{card.mcqa_normalisation!r}")
        runnable = []
        for protocol in config.protocols:
            reason = registry.get(protocol).unavailable(_context(config, card))
            if reason is None and card.protocols is not None and protocol not in card.protocols:
                reason = (f"the card's presentation ({card.presentation or card.name}) is for "
                          f"{', '.join(card.protocols)} only")
            if reason is None:
                runnable.append(protocol)
            else:
                skipped.append({"task": card.name, "protocol": protocol, "reason": reason})
        plan.append((card, runnable))
    if skipped and not config.skip_unavailable:
        raise ConfigError("; ".join(f"{s['protocol']} on {s['task']}: {s['reason']}" for s in skipped))
    return plan, skipped


SAMPLE_SALT = 104729  # the sample's own random stream, apart from the option shuffle and exemplars of the same seed


def sample_items(items, n: int, seed: int) -> list:
    """n of the items (all where there are fewer) drawn without replacement by `seed`, in the task's order: the
    same seed draws the same items, whatever else the run does. Stratified by subject where the items have
    several (all of MMLU, say): each subject gets its share of n in proportion to its size (largest remainders
    first, ties to the earlier subject), so the sample's mean estimates the task's mean with every subject
    represented as in the task, and no subject is left to the luck of one draw."""
    if n >= len(items):
        return list(items)
    strata: dict = {}
    for k, item in enumerate(items):
        strata.setdefault(item.source.get("subject"), []).append(k)
    groups = list(strata.values())
    quotas = [n * len(g) / len(items) for g in groups]
    sizes = [int(q) for q in quotas]
    for j in sorted(range(len(groups)), key=lambda j: (sizes[j] - quotas[j], j))[: n - sum(sizes)]:
        sizes[j] += 1
    rng = np.random.default_rng([seed, SAMPLE_SALT])  # one subject alone draws as an unstratified sample would
    picks = [g[int(i)] for g, size in zip(groups, sizes) for i in rng.choice(len(g), size, replace=False)]
    return [items[k] for k in sorted(picks)]


def _load_items(config: EvalConfig, card) -> dict:
    """A task's items, those the run scores (--limit, statements) and every load error, before any model."""
    from dcsjax.data.jsonl import read_statements
    from dcsjax.data.tasks import fewshot_items, load_task

    all_items, load_errors = load_task(card)
    items = all_items[:config.limit] if config.limit is not None else all_items
    rows = read_statements(config.statements) if config.statements is not None else None  # read once
    if config.sample is not None and rows is not None:
        # a sample of the items the statements file holds (a quarter of MMLU's, say, by the stem rule): the ones
        # it lacks were filtered at generation, and its rejected file counts them (002 Fig. 3)
        held = {row["id"] for row in rows}
        items = sample_items([i for i in all_items if i.id in held], config.sample, config.seed)
    elif config.sample is not None:
        items = sample_items(all_items, config.sample, config.seed)
    if rows is not None:
        items, load_errors = _with_statements(items, load_errors, config.statements, rows)
    # exemplars: the card's few-shot split (its rows' errors are reported with the task's), else the task's items
    shots = fewshot_items(card) if config.num_fewshot else None
    if shots is not None:
        load_errors = [*load_errors, *shots[1]]
    return {"all": all_items, "items": items, "errors": load_errors,
            "pool": shots[0] if shots is not None else all_items, "pool_split": card.fewshot_split if shots else None,
            "identity": task_identity(card, all_items, config.statements)}


def _score_task(config: EvalConfig, card, loaded: dict, runnable, scorer, writer, lead: bool) -> list[dict]:
    """One task's load errors written and every runnable protocol scored -> its summary rows."""
    items, load_errors, task = loaded["items"], loaded["errors"], loaded["identity"]
    folder = results.task_folder(config.output, scorer.name, card.slug)
    errors = [e.as_record() for e in load_errors]
    if lead:
        writer.write_errors(folder, errors)
    ctx = _context(config, card, scorer, loaded["pool"], loaded["pool_split"])  # exemplars: never the item itself
    rows = []
    for protocol in runnable:
        row = _score_protocol(config, card, protocol, ctx, task, items, errors, writer, lead)
        if row is not None:
            rows.append(row)
    return rows


def _score_protocol(config: EvalConfig, card, protocol: str, ctx, task: dict, items, load_errors: list[dict],
                    writer, lead: bool) -> dict | None:
    """Resume (the records of this fingerprint only), score the rest in growing writes, and summarise: the
    protocol's summary row (None on a process that does not write)."""
    from dcsjax.engine import distributed

    scorer = ctx.scorer
    settings = {"model": scorer.model_fingerprint or {"name": scorer.name}, "task": task, "protocol": protocol,
                "settings": protocol_settings(protocol, ctx, config.option_order, config.seed),
                "code": results.code_version()}
    fingerprint = results.digest(settings)
    path = results.records_path(config.output, scorer.name, card.slug, protocol)
    state = {"done": [], "error": None}
    if lead:
        try:
            state["done"] = sorted(r["id"] for r in writer.resume(path, fingerprint, settings))
        except results.ResultsError as err:
            state["error"] = str(err)
    state = distributed.from_rank0(state)  # every process resumes from the same records, or stops
    if state["error"]:
        raise results.ResultsError(state["error"])
    done = set(state["done"])
    errors_path = results.protocol_errors_path(config.output, scorer.name, card.slug, protocol)
    if lead:
        writer.forget(errors_path)  # its items are not among the records: they are tried again below
    todo = sorted((i for i in items if i.id not in done), key=length_hint)
    start = time.perf_counter()
    bar = _bar(config.progress and lead, len(items), len(items) - len(todo), f"{scorer.name} {card.name} {protocol}")
    scoring_errors = []
    for s, e in write_spans(len(todo), config.chunk, config.max_chunk):
        stop_point()
        part = todo[s:e]
        mine = score_items(protocol, ctx, distributed.my_share(part), config.option_order, config.seed)
        gathered = distributed.gather_in_order(mine, len(part))
        failed = [{"where": r["id"], "error": r["error"]} for r in gathered if "error" in r]
        scoring_errors += failed
        if lead:
            writer.append(path, [{**r, "fingerprint": fingerprint} for r in gathered if "error" not in r])
            writer.append(errors_path, failed)
        bar.update(len(part))
    bar.close()
    if not lead:
        return None
    by_id = {r["id"]: r for r in results.read_records(path)}
    records = [by_id[i.id] for i in items if i.id in by_id]
    lc, lw = config.loadings
    row = summary_row(scorer.name, card.name, protocol, records, len(load_errors) + len(scoring_errors), lc, lw,
                      fingerprint, settings["settings"], time.perf_counter() - start)
    # which records the row was made from: `report` reads these and no others (a later run with another
    # --limit adds records to the file, not to this row); the first errors, for the table to show
    examples = [f"{e['where']}: {e['error']}" for e in [*load_errors, *scoring_errors][:ERROR_EXAMPLES]]
    return {**row, "folder": card.slug, "ids": [r["id"] for r in records], "error_examples": examples}


ERROR_EXAMPLES = 3  # errors a summary row quotes (every one is in the task's errors files)


def length_hint(item) -> int:
    """Characters of everything a protocol may score of the item: the order in which `run_eval` takes
    items, so that one write's prompts fill the same few buckets (a proxy for tokens; ties keep the
    task's order)."""
    return len(item.question) + sum(map(len, item.choices)) + sum(map(len, item.statements or ()))


def write_spans(n: int, first: int = CHUNK, largest: int = MAX_CHUNK) -> list[tuple[int, int]]:
    """[start, end) of each write over n items: first, then doubling up to largest."""
    spans, start, size = [], 0, max(1, first)
    while start < n:
        spans.append((start, min(n, start + size)))
        start, size = start + size, min(max(largest, first), size * 2)
    return spans


def summary_row(model: str, task: str, protocol: str, records: list[dict], errors: int, lc: float, lw: float,
                fingerprint: str, settings: dict, seconds: float) -> dict:
    """One (model, task, protocol) row of summary.json: the headline with its interval, the companions,
    where gold options and answers sat (and the best constant answer), and warnings."""
    from dcsjax.eval.protocols.options import position_report
    from dcsjax.metrics.dcs import loadings_note

    metrics = summarise(protocol, records)
    values = headline_values(protocol, records)
    low, high = mean_ci(values)[1:] if len(values) else (None, None)  # the headline's 95% interval over items
    # the sample standard error of the per-item headline values, as lm-eval reports it (its export reads it here)
    stderr = float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None
    uniform = chance_uniform(protocol, records)
    note = loadings_note(lc, lw) if protocol in registry.named("dcs_loadings") else None
    value, warnings = next(iter(metrics.values())), idk_warnings(metrics, low, high)
    if metrics.get("withheld"):  # the protocol's own reason not to publish its number (APS: unvalidated statements)
        value, low, high, stderr, warnings = None, None, None, None, [*warnings, f"no number: {metrics['withheld']}"]
    return {"model": model, "task": task, "protocol": protocol, "n": len(records), "errors": errors,
            "metric": next(iter(metrics)), "value": value, "ci95": [low, high], "stderr": stderr,
            "chance": {"uniform": uniform},
            "metrics": metrics, "positions": position_report(records), "warnings": warnings,
            "lc": lc, "lw": lw, "loadings_note": note, "fingerprint": fingerprint, "settings": settings, "seconds": round(seconds, 2)}


def chance_uniform(protocol: str, records: list[dict]) -> float | None:
    """The headline a uniform answerer scores on the same presentations: the protocol's own reference where it
    has one (the DCS protocols: DCS of the uniform distribution), else the share of an item's presented options
    that are correct. None without records."""
    if not records:
        return None
    own = registry.get(protocol).chance
    if own is not None:
        return own(records)
    shown = [p for r in records for p in r.get("order", {}).get("presentations", [])]
    return float(np.mean([len(p["gold"]) / p["size"] for p in shown])) if shown else None


def _with_statements(items, errors, path: Path, rows: list[dict]):
    """Items that have statements in the file (its `rows`, as `read_statements` reads them), carrying them; the
    rest become error records. A row is an item's only where its question and options are the item's (a file
    made for another task, or from an edited data file, names the line and what differs)."""
    from dcsjax.data.items import ItemError

    by_id = {row["id"]: row for row in rows}
    kept, missing = [], []
    for item in items:
        row = by_id.get(item.id)
        if row is None:
            missing.append(ItemError(item.id, f"no statements for it in {path} (filtered at generation?)"))
            continue
        differs = [f"{field} {row[field]!r} is not the item's {want!r}" for field, want in
                   (("question", item.question), ("choices", list(item.choices))) if row[field] != want]
        if differs:
            missing.append(ItemError(item.id, f"{path}:{row['line']}: statements of another item: " + "; ".join(differs)))
        else:
            kept.append(replace(item, statements=tuple(row["statements"])))
    return kept, [*errors, *missing]


def _bar(progress: bool, total: int, initial: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="item", disable=not progress)


def format_table(summary: dict, fmt: str = "text") -> str:
    """The results table (fmt "text" or "markdown"); the chance references beside each value: `uniform`, the
    headline of a uniform answerer on the same presentations (`chance_uniform`), and `const`, the accuracy of
    always giving the best single letter on them (a letter preference alone reaches it); `IDK spread` the
    range of sequence DCS over the IDK phrasings."""
    from dcsjax.eval.tables import render

    def number(x):
        return "-" if x is None else f"{x:.3f}"

    header = ["model", "task", "protocol", "n", "err", "metric", "value", "95% CI", "uniform", "const", "IDK spread"]
    rows = []
    for r in summary["rows"]:
        positions = r.get("positions") or {}
        const = ("-" if positions.get("best_constant") is None
                 else f"{positions['best_constant_letter']} {positions['best_constant']:.2f}")
        spread = r["metrics"].get("idk_spread")
        rows.append([r["model"], r["task"], r["protocol"], str(r["n"]), str(r["errors"]), r["metric"],
                     number(r["value"]) + (" †" if r.get("loadings_note") else ""), "-" if r["ci95"][0] is None else f"[{number(r['ci95'][0])}, {number(r['ci95'][1])}]",
                     number((r.get("chance") or {}).get("uniform")), const, "-" if spread is None else f"{spread:.3f}" + (" !" if r.get("warnings") else "")])
    lines = [render(header, rows, fmt, numeric=(3, 4, 6, 8))]
    for name in dict.fromkeys(r["protocol"] for r in summary["rows"]):  # a protocol's own table, where it has one
        details = registry.get(name).details if name in registry.PROTOCOLS else None
        text = details([r for r in summary["rows"] if r["protocol"] == name], fmt) if details else ""
        lines += ["", text] if text else []
    notes = [f"! {r['model']} {r['task']} {r['protocol']}: {w}" for r in summary["rows"] for w in r.get("warnings", [])]
    notes += [f"† {note}" for note in dict.fromkeys(r["loadings_note"] for r in summary["rows"] if r.get("loadings_note"))]
    quoted = set()  # a task's load errors are every protocol's: quoted once
    for r in summary["rows"]:
        for line in r.get("error_examples") or []:
            if (r["model"], r["task"], line) not in quoted:
                quoted.add((r["model"], r["task"], line))
                notes.append(f"err {r['model']} {r['task']} {r['protocol']}: {line}")
        if r["errors"] > len(r.get("error_examples") or []):
            notes.append(f"err {r['model']} {r['task']} {r['protocol']}: {r['errors']} in all, every one in the "
                         f"task folder's errors.jsonl and {r['protocol']}.errors.jsonl")
    reasons: dict = {}  # one line per protocol and reason, naming its tasks
    for s in summary.get("skipped", []):
        reasons.setdefault((s["protocol"], s["reason"]), []).append(s["task"])
    notes += [f"skipped {protocol} on {', '.join(tasks)}: {reason}" for (protocol, reason), tasks in reasons.items()]
    return "\n".join(lines + ([""] + notes if notes else []))
