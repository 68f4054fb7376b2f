"""`dcsjax report RESULTS_DIR... --out DIR`: figures (PNG) and a Markdown summary from `dcsjax eval` results.

Reads DIR/<model>/<task>/<protocol>.jsonl. Model sizes and base/instruct come from the model cards, or for
models without one from `--sizes FILE` (TOML: `[model-name] parameters = 135e6, variant = "instruct"`).
Every number in the summary carries a 95% percentile bootstrap interval over items (or over models, for
the scaling curves); APX against APS is also compared item by item with a paired bootstrap.
"""

from __future__ import annotations

import json
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from dcsjax.analysis.scaling import bootstrap_band, break_even, fit_curves
from dcsjax.eval.run import headline_values
from dcsjax.metrics import (
    DEFAULT_THRESHOLDS,
    Distributions,
    aurc,
    bootstrap_ci,
    brier_score,
    ece,
    loading_spectrum,
    mean_ci,
    paired_bootstrap,
    risk_coverage,
    ternary_score,
)
from dcsjax.metrics.dcs import loadings_note
from dcsjax.eval.protocols import named
from dcsjax.eval.results import ReadReport, model_facts, read_records, result_files
from dcsjax.eval.tables import render

TERNARY_T = 0.75


# statistics as named functions: the bootstrap compiles a statistic once per data shape, keyed on the function
def ece_by_mass(d):
    return ece(d, scheme="mass")


def ternary_at_t(d):
    return ternary_score(d, TERNARY_T)


@dataclass
class ModelResults:
    name: str
    parameters: float | None
    variant: str | None
    records: dict[str, dict[str, list[dict]]] = field(default_factory=lambda: defaultdict(dict))  # task -> protocol
    withheld: dict[str, str] = field(default_factory=dict)  # task -> why its APS records publish nothing


def _model_info(name: str, sizes: dict, root: Path) -> tuple[float | None, str | None]:
    """Size and base/instruct: from --sizes, else the model card, else what the records' fingerprints say
    (dcsjax counts the parameters when it loads a model, so hub models need no hand-written sizes)."""
    if name in sizes:
        return float(sizes[name]["parameters"]), sizes[name].get("variant")
    from dcsjax.checkpoints.cards import model_card, model_card_names

    if name in model_card_names():
        card = model_card(name)
        return float(card.parameters), card.variant
    facts = model_facts(root, name)
    return (float(facts["parameters"]) if facts.get("parameters") else None), facts.get("variant")


def load_results(dirs: list[Path], sizes: dict | None = None,
                 skipped: ReadReport | None = None) -> dict[str, ModelResults]:
    """Every model's per-item records under the results folders; a later folder's task replaces an earlier's.
    Exactly the records its summary.json row was made from, where the row names them (a later run with
    another --limit adds records to the file, not to the row). Broken lines and second records of an item
    are skipped (never repaired: a reader does not write) and listed in `skipped`."""
    from dcsjax.eval.protocols.aps import summarise_aps
    from dcsjax.eval.results import read_summary

    models: dict[str, ModelResults] = {}
    for root in map(Path, dirs):
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: not a results folder")
        made_from = {(r["model"], r["folder"], r["protocol"]): r["ids"] for r in read_summary(root)["rows"]
                     if "ids" in r and "folder" in r}
        for model, task, protocol, path in result_files(root):
            if model not in models:
                models[model] = ModelResults(model, *_model_info(model, sizes or {}, root))
            records = read_records(path, skipped)
            ids = made_from.get((model, task, protocol))
            if ids is not None:
                by_id = {r["id"]: r for r in records}
                records = [by_id[i] for i in ids if i in by_id]
            if protocol == "aps" and (why := summarise_aps(records).get("withheld")):
                models[model].withheld[task] = why  # statements that fail 002 A.2's checks: no APS number from them
                continue
            models[model].records[task][protocol] = records
    if not models:
        raise FileNotFoundError(f"no <model>/<task>/<protocol>.jsonl results under {', '.join(map(str, dirs))}")
    return models


# ------------------------------------------------------------------------------------------- metrics table
def _accuracy(protocol: str, records: list[dict]) -> np.ndarray:
    """Per-item correctness of APS, APX or MCQA-LL (sum): their headline values."""
    return np.asarray(headline_values(protocol, records), np.float64)


# Protocols compared item by item on the same items (a paired bootstrap): paper 002's APX against APS, and APS
# against plain option likelihood (does the declarative statement add anything to ranking the options?)
PAIRED = (("apx", "aps"), ("aps", "mcqa"))


def metric_rows(models: dict[str, ModelResults], n_boot: int = 1000) -> list[dict]:
    """One row per model x task x protocol x metric: value and 95% interval."""
    rows = []
    for m in models.values():
        for task, by_protocol in sorted(m.records.items()):
            for protocol, records in sorted(by_protocol.items()):
                if not records:
                    continue
                add = lambda metric, iv: rows.append({  # noqa: E731
                    "model": m.name, "task": task, "protocol": protocol, "metric": metric, "n": len(records),
                    "value": iv.estimate, "low": iv.low, "high": iv.high})
                if protocol in ("aps", "qa-ppl", "apx", "mcqa"):
                    add("accuracy", mean_ci(_accuracy(protocol, records), n_boot))
                if protocol in ("aps", "qa-ppl"):
                    add("ppl_delta", mean_ci([r["ppl_delta"] for r in records], n_boot))
                    add("ppl_correct", mean_ci([r["ppl_correct"] for r in records], n_boot))
                if protocol == "apx":
                    add("parse_failures", mean_ci([r["parse_error"] is not None for r in records], n_boot))
                if protocol in named("dcs_loadings") and "correct_options" in records[0]:
                    d = Distributions.from_records(records)
                    add("dcs", mean_ci([r["dcs"] for r in records], n_boot))
                    add("accuracy", mean_ci([r["correct"] for r in records], n_boot))
                    add("abstention", mean_ci([r["abstained"] for r in records], n_boot))
                    add("brier", bootstrap_ci(brier_score, d, n_boot))
                    add("ece", bootstrap_ci(ece, d, n_boot))
                    add("ece_mass", bootstrap_ci(ece_by_mass, d, n_boot))
                    add("aurc", bootstrap_ci(aurc, d, n_boot))
                    add(f"ternary_t{TERNARY_T}", bootstrap_ci(ternary_at_t, d, n_boot))
            for first, second in PAIRED:
                if first not in by_protocol or second not in by_protocol:
                    continue
                other = dict(zip((r["id"] for r in by_protocol[second]), _accuracy(second, by_protocol[second])))
                pairs = [(v, other[r["id"]]) for r, v in zip(by_protocol[first], _accuracy(first, by_protocol[first]))
                         if r["id"] in other]
                if pairs:
                    a, b = np.array(pairs).T
                    p = paired_bootstrap(jnp.mean, a, b, n_boot)
                    rows.append({"model": m.name, "task": task, "protocol": f"{first}-{second}",
                                 "metric": "accuracy_diff", "n": len(pairs), "value": p.difference, "low": p.low,
                                 "high": p.high, "p_value": p.p_value})
    rows += model_differences(models, n_boot)
    return rows


def model_differences(models: dict[str, ModelResults], n_boot: int = 1000) -> list[dict]:
    """Each later model against the first, per task and protocol, on the items both scored: the headline
    metric's difference with a paired bootstrap interval."""
    rows = []
    names = list(models)
    for other in names[1:]:
        base, m = models[names[0]], models[other]
        for task in sorted(set(base.records) & set(m.records)):
            for protocol in sorted(set(base.records[task]) & set(m.records[task])):
                a = {r["id"]: v for r, v in zip(m.records[task][protocol],
                                                headline_values(protocol, m.records[task][protocol]))}
                b = {r["id"]: v for r, v in zip(base.records[task][protocol],
                                                headline_values(protocol, base.records[task][protocol]))}
                ids = [i for i in a if i in b]
                if not ids:
                    continue
                p = paired_bootstrap(jnp.mean, np.array([a[i] for i in ids]), np.array([b[i] for i in ids]), n_boot)
                rows.append({"model": f"{other} - {names[0]}", "task": task, "protocol": protocol,
                             "metric": "dcs_diff" if protocol in named("dcs_loadings") else "accuracy_diff", "n": len(ids),
                             "value": p.difference, "low": p.low, "high": p.high, "p_value": p.p_value})
    return rows


def position_rows(models: dict[str, ModelResults]) -> list[dict]:
    """Per model x task x protocol: where gold options and answers sat (002 A.3), and the best constant
    answer's accuracy on the same presentations (records without presentation data are left out)."""
    from dcsjax.eval.protocols.options import position_report

    rows = []
    for m in models.values():
        for task, by_protocol in sorted(m.records.items()):
            for protocol, records in sorted(by_protocol.items()):
                report = position_report(records)
                if report["presentations"]:
                    orders = sorted({r["order"]["name"] for r in records if "order" in r})
                    rows.append({"model": m.name, "task": task, "protocol": protocol, "order": ",".join(orders),
                                 "accuracy": float(_accuracy(protocol, records).mean()) if protocol != "dcs"
                                 and protocol != "dcs-letters" else float(np.mean([r["correct"] for r in records])),
                                 **report})
    return rows


def positions_table(rows: list[dict]) -> str:
    def shares(counts: dict, total: int) -> str:
        return " ".join(f"{k}:{v / total:.2f}" for k, v in counts.items() if v)

    header = ["model", "task", "protocol", "order", "presentations", "gold at", "answered at", "best constant",
              "accuracy"]
    return render(header, [[r["model"], r["task"], r["protocol"], r["order"], r["presentations"],
                            shares(r["gold"], r["presentations"]), shares(r["answer"], r["presentations"]),
                            f"{r['best_constant_letter']} {r['best_constant']:.2f}", f"{r['accuracy']:.2f}"]
                           for r in rows], "markdown", numeric=(4, 8))


def idk_rows(models: dict[str, ModelResults]) -> list[dict]:
    """Sequence DCS per task under each IDK phrasing and normalisation (the records carry them)."""
    from dcsjax.eval.protocols.dcs import summarise

    rows = []
    for m in models.values():
        for task, by_protocol in sorted(m.records.items()):
            records = by_protocol.get("dcs") or []
            if records and all("idk_sensitivity" in r for r in records):
                s = summarise(records)
                rows.append({"model": m.name, "task": task, "n": len(records), "by_idk": s["dcs_by_idk"],
                             "p_idk": s["p_idk_by_idk"], "by_normalisation": s["dcs_by_normalisation"],
                             "spread": s["idk_spread"]})
    return rows


def idk_table(rows: list[dict]) -> str:
    if not rows:
        return "no sequence DCS records with IDK phrasings"
    names = list(dict.fromkeys(n for r in rows for n in r["by_idk"]))  # records of older code lack the control
    norms = list(rows[0]["by_normalisation"])
    header = ["model", "task", "n", *(f"DCS (pIDK) IDK = {n!r}" for n in names), *(f"DCS per {n}" for n in norms),
              "spread over phrasings"]
    cell = lambda r, n: f"{r['by_idk'][n]:.3f} ({r['p_idk'][n]:.2f})" if n in r["by_idk"] else "-"  # noqa: E731
    body = [[r["model"], r["task"], r["n"], *(cell(r, n) for n in names),
             *(f"{r['by_normalisation'][n]:.3f}" for n in norms), f"{r['spread']:.3f}"] for r in rows]
    return render(header, body, "markdown", numeric=range(2, len(header)))


def results_table(models: dict[str, ModelResults], n_boot: int = 1000) -> str:
    """One line per task x model: each protocol's headline with its 95% interval and, in braces, its chance
    references on that protocol's own presentations (u: a uniform answerer; c: the best constant letter, for
    protocols that show letters), APX's parse failures, and the spread of sequence DCS over IDK phrasings."""
    from dcsjax.eval.protocols import get
    from dcsjax.eval.protocols.options import position_report
    from dcsjax.eval.run import chance_uniform

    from dcsjax.eval.protocols.aps import summarise_aps

    columns = [("aps", "APS acc (statement validation)"), ("qa-ppl", "QA-PPL acc"), ("mcqa", "MCQA-LL acc (sum)"),
               ("apx", "APX acc (parse failures)"), ("dcs", "DCS seq (IDK spread)"), ("dcs-letters", "DCS letters")]
    header = ["task", "model", *(c for _, c in columns)]
    lines = []
    tasks = sorted({t for m in models.values() for t in m.records})
    for task in tasks:
        for m in models.values():
            by = m.records.get(task)
            if not by:
                continue
            n = max(len(r) for r in by.values())
            cells = [f"{task} (n={n})", m.name]
            for protocol, _ in columns:
                records = by.get(protocol)
                if not records:
                    cells.append("-")
                    continue
                iv = mean_ci(headline_values(protocol, records), n_boot)
                chance = [f"u {u:.2f}"] if (u := chance_uniform(protocol, records)) is not None else []
                constant = position_report(records)
                if get(protocol).letters and constant["best_constant"] is not None and protocol not in named("dcs_loadings"):
                    chance.append(f"c {constant['best_constant_letter']} {constant['best_constant']:.2f}")
                cell = f"{iv.estimate:.2f} [{iv.low:.2f}, {iv.high:.2f}]" + (" {" + ", ".join(chance) + "}" if chance else "")
                if protocol == "apx":
                    cell += f" ({np.mean([r['parse_error'] is not None for r in records]):.0%})"
                if protocol == "dcs" and all("idk_sensitivity" in r for r in records):
                    from dcsjax.eval.protocols.dcs import summarise

                    cell += f" ({summarise(records)['idk_spread']:.2f})"
                if protocol == "aps" and "statements_bleu_median" in (checked := summarise_aps(records)):
                    cell += (f" (statements: BLEU {checked['statements_bleu_median']:.2f}, "
                             f"gap {checked['statements_gap_median']:+.0f} words)")
                cells.append(cell)
            lines.append(cells)
    return render(header, lines, "markdown")


def markdown_table(rows: list[dict]) -> str:
    body = [[r["model"], r["task"], r["protocol"], r["metric"], r["n"], f"{r['value']:.3f}",
             f"[{r['low']:.3f}, {r['high']:.3f}]" + (f" (p = {r['p_value']:.3f})" if "p_value" in r else "")]
            for r in rows]
    return render(["model", "task", "protocol", "metric", "n", "value", "95% CI"], body, "markdown", numeric=(4, 5))


# ------------------------------------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend(ax, **kwargs) -> None:
    if ax.get_legend_handles_labels()[1]:
        ax.legend(**kwargs)


def _size_axis(ax, sizes) -> None:
    """Log-scaled parameter counts labelled 135M, 1B, ...; with few models, ticks at their sizes."""
    from matplotlib.ticker import EngFormatter, NullFormatter

    ax.set_xscale("log")
    sizes = sorted(set(sizes))
    if 0 < len(sizes) <= 6:
        ax.set_xticks(sizes)
        ax.set_xlim(sizes[0] / 1.3, sizes[-1] * 1.3)
    ax.xaxis.set_major_formatter(EngFormatter(places=0, sep=""))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("parameters")


def _task_grid(plt, tasks: list[str], width: float = 4.2, height: float = 3.2):
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _task_accuracy(m: ModelResults, protocol: str, tasks: list[str]) -> float | None:
    values = [_accuracy(protocol, m.records[t][protocol]).mean() for t in tasks if m.records[t].get(protocol)]
    return float(np.mean(values)) if len(values) == len(tasks) else None


def scaling_figure(models: dict[str, ModelResults], tasks: list[str], path: Path, title: str) -> list[str]:
    """APS and APX accuracy against size, per model type, with the AIC-best curve and its bootstrap band
    where there are enough models. Returns notes on what could and could not be fitted."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    notes = []
    sized = [m for m in models.values() if m.parameters]
    colours = {"aps": "tab:blue", "apx": "tab:orange", "mcqa": "tab:green"}
    markers = {"base": "o", "instruct": "s", None: "^"}
    for variant in sorted({m.variant for m in sized}, key=str):
        group = [m for m in sized if m.variant == variant]
        series = {}
        for protocol in ("aps", "apx", "mcqa"):
            pts = [(np.log10(m.parameters), acc) for m in group
                   if (acc := _task_accuracy(m, protocol, tasks)) is not None]
            if not pts:
                continue
            x, y = np.array(pts).T
            series[protocol] = (x, y)
            ax.scatter(10 ** x, y, color=colours[protocol], marker=markers.get(variant, "^"), zorder=3,
                       label=f"{protocol.upper()} ({variant})")
            fits = fit_curves(x, y)
            if not fits or len(x) < 4:
                notes.append(f"{protocol.upper()} {variant}: {len(x)} model(s), too few for a fitted curve")
                continue
            grid = np.linspace(x.min(), x.max(), 200)
            low, high, _ = bootstrap_band(x, y, fits[0].family, grid, n_boot=500)
            ax.plot(10 ** grid, fits[0](grid), color=colours[protocol], linestyle="-" if variant == "base" else "--")
            ax.fill_between(10 ** grid, low, high, color=colours[protocol], alpha=0.15)
            notes.append(f"{protocol.upper()} {variant}: {fits[0].family} (AIC {fits[0].aic:.1f})")
        if "aps" in series and "apx" in series and len(series["aps"][0]) >= 4:
            be = break_even(series["aps"][0], series["aps"][1], series["apx"][1], n_boot=500)
            notes.append(f"{variant}: APX overtakes APS {be.describe()}")
            if be.log10_size is not None:
                ax.axvline(10 ** be.log10_size, color="grey", linestyle=":")
    _size_axis(ax, [m.parameters for m in sized])
    ax.set_ylabel("accuracy (mean over tasks)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    _legend(ax, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return notes


def scaling_by_task_figure(models: dict[str, ModelResults], tasks: list[str], path: Path) -> None:
    plt = _plt()
    fig, axes = _task_grid(plt, tasks)
    sized = sorted((m for m in models.values() if m.parameters), key=lambda m: m.parameters)
    markers = {"base": "o", "instruct": "s"}
    for ax, task in zip(axes, tasks):
        for protocol, colour in (("aps", "tab:blue"), ("apx", "tab:orange"), ("mcqa", "tab:green")):
            for variant in sorted({m.variant for m in sized}, key=str):  # lines join one model type only
                pts = [(m.parameters, _accuracy(protocol, m.records[task][protocol]).mean()) for m in sized
                       if m.variant == variant and m.records[task].get(protocol)]
                if pts:
                    ax.plot(*np.array(pts).T, marker=markers.get(variant, "^"), color=colour,
                            linestyle="-" if variant == "base" else "--", label=f"{protocol.upper()} ({variant})")
        _size_axis(ax, [m.parameters for m in sized])
        ax.set_ylim(0, 1)
        ax.set_title(task, fontsize=9)
        ax.set_ylabel("accuracy")
    _legend(axes[0], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _distributions(m: ModelResults, task: str, protocol: str) -> Distributions | None:
    records = m.records[task].get(protocol)
    return Distributions.from_records(records) if records and "correct_options" in records[0] else None


def _each_distribution(models: dict[str, ModelResults], task: str):
    """(colour, line style, label, Distributions) for every model and DCS elicitation that scored `task`."""
    for i, m in enumerate(models.values()):
        for protocol, style in zip(named("dcs_loadings"), ("-", "--")):
            if (d := _distributions(m, task, protocol)) is not None:
                yield f"C{i}", style, f"{m.name} {protocol}", d


def dcs_spectrum_figure(models: dict[str, ModelResults], tasks: list[str], path: Path) -> None:
    """Mean DCS against the target threshold t (lc = 1, lw = t/(1-t)) per model and elicitation."""
    plt = _plt()
    fig, axes = _task_grid(plt, tasks)
    for ax, task in zip(axes, tasks):
        for colour, style, label, d in _each_distribution(models, task):
            ax.plot(DEFAULT_THRESHOLDS, np.asarray(loading_spectrum(d, DEFAULT_THRESHOLDS)), style, color=colour,
                    marker=".", label=label)
        ax.axhline(0, color="grey", linewidth=0.8)
        # t > 0.5 means lw > lc: outside Definition 1, where Theorem 1's [-1, 1] bound does not hold
        ax.axvspan(0.5, DEFAULT_THRESHOLDS[-1], color="grey", alpha=0.08, linewidth=0)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("target threshold t (shaded: lw > lc)")
        ax.set_ylabel("mean DCS")
    _legend(axes[0], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def positions_figure(rows: list[dict], path: Path) -> None:
    """Per task: the share of presentations with the gold option at each letter (bars) and the share of
    answers at each letter (markers, per model and protocol), as 002 Figure 6."""
    plt = _plt()
    tasks = sorted({r["task"] for r in rows})
    fig, axes = _task_grid(plt, tasks)
    for ax, task in zip(axes, tasks):
        mine = [r for r in rows if r["task"] == task]
        letters = list(mine[0]["gold"])
        x = np.arange(len(letters))
        first = mine[0]
        ax.bar(x, [first["gold"][k] / first["presentations"] for k in letters], color="lightgrey",
               label=f"gold ({first['order']})")
        for i, r in enumerate(r for r in mine if r["protocol"] in ("apx", "dcs-letters")):
            ax.plot(x, [r["answer"].get(k, 0) / r["presentations"] for k in letters], "o-", color=f"C{i}",
                    markersize=3, label=f"{r['model']} {r['protocol']}")
        ax.set_xticks(x, letters)
        ax.set_ylim(0, 1)
        ax.set_title(task, fontsize=9)
        ax.set_ylabel("share of presentations")
        _legend(ax, fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _unit_panel(ax, task: str, xlabel: str, ylabel: str) -> None:
    """A task's panel of shares on both axes, [0, 1] x [0, 1]."""
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(task, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _legend(ax, fontsize=6)


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def risk_coverage_figure(models: dict[str, ModelResults], tasks: list[str], path: Path) -> None:
    plt = _plt()
    fig, axes = _task_grid(plt, tasks)
    for ax, task in zip(axes, tasks):
        for colour, style, label, d in _each_distribution(models, task):
            coverage, risk = risk_coverage(d)
            ax.plot(coverage, risk, style, color=colour, label=f"{label} (AURC {float(aurc(d)):.2f})")
        _unit_panel(ax, task, "coverage (share answered, most confident first)", "risk (error rate)")
    _save(plt, fig, path)


def stated_table(rows: list[dict]) -> str:
    from dcsjax.eval.protocols import stated

    return stated.table(rows, "markdown")


def stated_rows(models: dict[str, ModelResults]) -> list[dict]:
    """The stated-risk protocols' summaries (`stated.summarise`: each protocol whose summary it is, so both
    read-outs) per model x task, as `stated.table` reads them, and per model over all its tasks pooled (item by
    item) where they share their targets. A read-out other than the first is named beside the task."""
    from dcsjax.eval.protocols import registry, stated

    readouts = [name for name, p in registry().items() if p.summarise is stated.summarise]
    rows = []
    for m in models.values():
        for protocol in readouts:
            label = "" if protocol == readouts[0] else f" ({protocol})"
            tasks = {task: by[protocol] for task, by in sorted(m.records.items()) if by.get(protocol)}
            rows += [{"model": m.name, "task": task + label, "metrics": stated.summarise(records)}
                     for task, records in tasks.items()]
            if len(tasks) > 1 and len({tuple(r[0]["thresholds"]) for r in tasks.values()}) == 1:
                pooled = [r for records in tasks.values() for r in records]
                rows.append({"model": m.name, "task": f"all {len(tasks)} tasks{label}",
                             "metrics": stated.summarise(pooled)})
    return rows


def stated_risk_figure(rows: list[dict], path: Path) -> None:
    """Per task: each model's abstention rate (solid) and accuracy on answered items (dashed) against the stated
    target t, and the diagonal: a behaviourally calibrated model answers only above confidence t, so its
    accuracy on answered items stays on or above it, and its abstention rises with t."""
    plt = _plt()
    tasks = sorted({r["task"] for r in rows})
    fig, axes = _task_grid(plt, tasks)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    models = sorted({r["model"] for r in rows})
    for ax, task in zip(axes, tasks):
        ax.plot([0, 1], [0, 1], ":", color="grey", label="accuracy = t")
        for r in (r for r in rows if r["task"] == task):
            colour = colours[models.index(r["model"]) % len(colours)]
            ts = [float(t) for t in r["metrics"]["by_t"]]
            by = list(r["metrics"]["by_t"].values())
            ax.plot(ts, [1 - m["answer_rate"] for m in by], "o-", color=colour, label=f"{r['model']}: abstention")
            acc = [(t, m["accuracy_answered"]) for t, m in zip(ts, by) if m["accuracy_answered"] is not None]
            if acc:
                ax.plot(*zip(*acc), "s--", color=colour, label=f"{r['model']}: accuracy answered")
        _unit_panel(ax, task, "stated target t (penalty t/(1-t))", "share")
    _save(plt, fig, path)


def ppl_figure(models: dict[str, ModelResults], tasks: list[str], path: Path) -> None:
    """APS: the PPL gap between the first and second choice (002 E.3) and the PPL of the correct statement
    (E.2), per task and model."""
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    names = list(models)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        m = models[name]
        deltas = [[r["ppl_delta"] for r in m.records[t].get("aps", [])] for t in tasks]
        positions = np.arange(len(tasks)) + (i - (len(names) - 1) / 2) * width
        present = [k for k, d in enumerate(deltas) if d]
        if present:
            box = left.boxplot([deltas[k] for k in present], positions=positions[present], widths=width * 0.9,
                               patch_artist=True, showfliers=False)
            for patch in box["boxes"]:
                patch.set_facecolor(f"C{i}")
            left.plot([], [], color=f"C{i}", linewidth=6, label=name)
        correct = [np.mean([r["ppl_correct"] for r in m.records[t]["aps"]]) if m.records[t].get("aps") else np.nan
                   for t in tasks]
        right.bar(positions, correct, width=width, color=f"C{i}", label=name)
    for ax, label in ((left, "PPL(second choice) - PPL(first choice)"), (right, "mean PPL of the correct statement")):
        ax.set_xticks(np.arange(len(tasks)), tasks, rotation=25, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.set_yscale("log")
        _legend(ax, fontsize=8)
    left.set_title("APS: how decisive the ranking is (outliers hidden)")
    right.set_title("APS: perplexity of the correct statement")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------- the command
def write_report(dirs: list[Path], out: Path, sizes_file: Path | None = None, n_boot: int = 1000) -> Path:
    sizes = tomllib.loads(Path(sizes_file).read_text()) if sizes_file else {}
    skipped = ReadReport()
    models = load_results(dirs, sizes, skipped)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = sorted({t for m in models.values() for t in m.records if any(m.records[t].values())})
    if not tasks:
        from dcsjax.errors import DcsjaxError

        raise DcsjaxError(f"nothing to report under {', '.join(map(str, dirs))}: " + "; ".join(
            f"APS of {m.name}/{t} withheld, {why}" for m in models.values() for t, why in m.withheld.items()))
    common = [t for t in tasks if all(t in m.records for m in models.values())]
    rows = metric_rows(models, n_boot)
    (out / "metrics.json").write_text(json.dumps(rows, indent=1))
    notes = scaling_figure(models, common, out / "scaling.png", f"APS and APX against size ({len(common)} tasks)")
    scaling_by_task_figure(models, tasks, out / "scaling_by_task.png")
    dcs_spectrum_figure(models, tasks, out / "dcs_spectrum.png")
    risk_coverage_figure(models, tasks, out / "risk_coverage.png")
    positions = position_rows(models)
    if positions:
        positions_figure(positions, out / "positions.png")
    idk = idk_rows(models)
    stated_risk = stated_rows(models)
    if stated_risk:
        stated_risk_figure(stated_risk, out / "stated_risk.png")
    has_aps = any(m.records[t].get("aps") for m in models.values() for t in m.records)
    if has_aps:
        ppl_figure(models, tasks, out / "ppl.png")
    unsized = [m.name for m in models.values() if not m.parameters]
    outside = sorted({f"{m.name}/{t}/{p}: {note}" for m in models.values() for t, by in m.records.items()
                      for p, recs in by.items() if p in named("dcs_loadings") and recs
                      and (note := loadings_note(recs[0].get("lc", 1.0), recs[0].get("lw", 1.0)))})
    stale = sorted({f"{m.name}/{t}/{p}" for m in models.values() for t, by in m.records.items()
                    for p, recs in by.items() if p in named("dcs_loadings") and recs and "correct_options" not in recs[0]})
    lines = [
        "# dcsjax report", "",
        f"Results: {', '.join(map(str, dirs))}. Models: "
        + ", ".join(f"{m.name} ({m.parameters / 1e6:.0f}M, {m.variant})" if m.parameters else m.name
                    for m in models.values()) + f". Tasks: {', '.join(tasks)}.", "",
        f"Intervals: 95% percentile bootstrap over items ({n_boot} resamples, seed 0); `apx-aps` and `aps-mcqa` "
        "rows are paired (the same items resampled for both protocols). DCS metrics read each item's option+IDK distribution; "
        "ECE and risk-coverage use the most probable answer option (IDK excluded) and its probability; "
        f"the ternary score counts +1 / -t/(1-t) / 0 at t = {TERNARY_T}.", "",
        "## Figures", "",
        "- ![APS and APX against model size](scaling.png)",
        "- ![Per task](scaling_by_task.png)",
        "- ![DCS against the target threshold](dcs_spectrum.png) (lc = 1, lw = t/(1-t), Proposition 1; above t = 0.5 "
        "lw > lc, outside Definition 1, so mean DCS can fall below -1)",
        "- ![Risk-coverage curves](risk_coverage.png)",
        *(["- ![APS perplexities](ppl.png)"] if has_aps else []),
        *(["- ![Where gold options and answers sit](positions.png)"] if positions else []),
        *(["- ![Abstention and accuracy on answered items against the stated target](stated_risk.png)"]
          if stated_risk else []), "",
        *([f"APS withheld, its statements failing validation: {line}" for line in sorted(
            f"{m.name}/{t}: {why}" for m in models.values() for t, why in m.withheld.items())] + [""]
          if any(m.withheld for m in models.values()) else []),
        "## Scaling fits", "",
        *(f"- {n}" for n in notes or ["no model sizes known: pass --sizes"]),
        *([f"- no size known for {', '.join(unsized)} (add it with --sizes)"] if unsized else []), "",
        *(["DCS results outside Definition 1 (their DCS is not bounded by [-1, 1]):", "",
           *(f"- {line}" for line in outside), ""] if outside else []),
        *([f"DCS records written before they carried `correct_options` (rerun `dcsjax eval` on them for "
           f"calibration metrics): {', '.join(stale)}", ""] if stale else []),
        *([f"Skipped while reading ({len(skipped.broken)} broken line(s), {len(skipped.duplicates)} second "
           "record(s) of an item; the files were left as they are):", "",
           *(f"- {where}" for where in skipped.broken + skipped.duplicates), ""]
          if skipped.broken or skipped.duplicates else []),
        "## Results", "",
        "Each protocol's headline (accuracy; DCS for the DCS protocols) with its 95% interval and, in braces, its "
        "chance references on the protocol's own presentations: u, a uniform answerer (DCS: the uniform "
        "distribution over the options and IDK); c, always answering the best single letter (protocols that show "
        "letters). Read a value against them: a DCS near u is what a model that knows nothing scores. APX's parse "
        "failures and the spread of sequence DCS over IDK phrasings in parentheses.", "", results_table(models, n_boot), "",
        "## Option positions (002 A.3)", "",
        "Per presentation (a rotated item counts once per rotation): the share of gold options and of answers at "
        "each letter, and the best constant answer (always that letter) on the same presentations: a score "
        "near it is what a letter preference alone gives.", "", positions_table(positions), "",
        "## Sequence DCS under each IDK phrasing", "",
        "Mean DCS (mean pIDK) with IDK worded each way (summed log-likelihoods; the headline takes the item's own "
        "IDK option, else the first phrasing, as paper 000's one abstention response; 'any' = the sum of the "
        "phrasings' probabilities, a companion that always sits nearest 0; 'paraphrased' = its control, each "
        "answer option said as many ways as IDK, bare, 'The answer is ...' and 'The answer to this question is "
        "...', summed as the phrasings are), and with IDK = 'any' under each normalisation.", "", idk_table(idk), "",
        *(["## Stated risk", "",
           "The stated-risk protocol (docs/protocols.md): the scoring rule and its target t told to the model. Each "
           "DCS with its 95% interval beside the uniform answerer's at the same t; accuracy on answered items "
           "against t (a behaviourally calibrated model keeps it at least t); T = accuracy - lw x hallucinations; "
           "DCS with t not stated at the same loadings, and the paired difference.", "",
           stated_table(stated_risk), ""] if stated_risk else []),
        "## Every metric", "", markdown_table(rows), "",
    ]
    summary = out / "summary.md"
    summary.write_text("\n".join(lines))
    return summary
