"""`dcsjax train-abstain`: the abstention fine-tuning experiment, end to end and resumable.

1. Answerable and unanswerable versions of real BIG-bench items, split by question (`data.py`); the
   splits are written as `jsonl:` benchmark files, so `dcsjax eval` can score any of them.
2. The frozen lower layers run once per split (`features.py`), cached in the output folder.
3. Every arm x seed trains from the same starting model (`train.py`), each in its own resumable run folder;
   the starting model itself is the "start" arm.
4. The held-out test split is scored once per finished run with its best (by dev DCS) parameters:
   metrics pooled over seeds with 95% bootstrap intervals over test items, a table, a plot of dev DCS and
   coverage against steps, and `results.json`.
5. The chosen arm's seed-0 model is written as an HF directory that `dcsjax.load` reads back.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dcsjax.metrics.bootstrap import bootstrap_ci
from dcsjax.metrics.calibration import ABSTENTION_METRICS, Distributions
from dcsjax.training.data import DEFAULT_TASKS, SPLITS, abstention_splits, write_jsonl
from dcsjax.training.features import letter_features, load_features, save_features
from dcsjax.training.train import ARMS, TrainConfig, distributions, merge_top, predict_logits, top_params, train

ARM_LABELS = {"start": "starting model", "ce": "cross-entropy", "dcs": "DCS only", "dcs+ce": "DCS + CE"}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cached_features(scorer, items, split: str, out: Path, top_layers: int, lc: float, lw: float, progress: bool):
    """A split's frozen-layer features, computed once and kept under `out/features/` (keyed by what they
    depend on, so changing the model, the layers or the items recomputes them)."""
    key = {"model": scorer.name, "top_layers": top_layers, "lc": lc, "lw": lw, "items": [i.id for i in items]}
    path, meta = out / "features" / f"{split}.npz", out / "features" / f"{split}.json"
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
        return load_features(path)
    from tqdm.auto import tqdm

    path.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(items), desc=f"frozen layers: {split}", disable=not progress, file=sys.stderr) as bar:
        features = letter_features(scorer, items, top_layers, lc=lc, lw=lw, progress=bar.update)
    save_features(features, path)
    meta.write_text(json.dumps(key))
    return features


def pooled_interval(metric, dists: list[Distributions], n_boot: int) -> tuple[float, float, float]:
    """The metric averaged over seeds, with a 95% interval from resampling test items (the same items for
    every seed): item-level uncertainty, with the seeds' spread folded into the point estimate."""
    stacked = Distributions(*(jnp.stack(parts, axis=1) for parts in zip(*dists)))  # [N, S, K]
    statistic = lambda d: jnp.mean(jax.vmap(metric, in_axes=1)(d))  # noqa: E731
    return tuple(bootstrap_ci(statistic, stacked, n_boot=n_boot))


def run_experiment(model: str = "smollm2-135m-instruct", out: str | Path = "runs/abstain", *,
                   tasks: Sequence[str] = DEFAULT_TASKS, per_task: int | None = None,
                   arms: Sequence[str] = ("start", *ARMS), seeds: Sequence[int] = (0, 1, 2), top_layers: int = 2,
                   base: TrainConfig = TrainConfig(), export_arm: str | None = "dcs+ce", n_boot: int = 1000,
                   progress: bool = True) -> dict:
    import dcsjax

    started = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for arm in arms:
        if arm not in ("start", *ARMS):
            raise ValueError(f"unknown arm {arm!r}: one of start, {', '.join(ARMS)}")
    scorer = dcsjax.load(model, progress=progress)
    c = scorer.config
    splits = abstention_splits(tasks, per_task=per_task)
    for split in SPLITS:
        write_jsonl(splits[split], out / "data" / f"{split}.jsonl")
    counts = {s: {"items": len(v), "unanswerable": sum(not i.answerable for i in v)} for s, v in splits.items()}
    _log(f"items: {counts}")
    features = {s: cached_features(scorer, splits[s], s, out, top_layers, base.lc, base.lw, progress) for s in SPLITS}
    embedding = scorer.model.output_embedding
    start = top_params(scorer.model, top_layers)

    test_dists: dict[str, list[Distributions]] = {}
    histories: dict[str, list[list[dict]]] = {}
    per_seed: dict[str, list[dict]] = {}
    best_params = {}
    for arm in arms:
        if arm == "start":
            test_dists[arm] = [distributions(predict_logits(c, start, embedding, features["test"]), features["test"])]
            per_seed[arm] = [{"seed": None, "best_step": 0}]
            continue
        for seed in seeds:
            cfg = replace(base, arm=arm, seed=seed)
            result = train(scorer.model, features["train"], features["dev"], cfg, out / "runs" / f"{arm}-seed{seed}",
                           top_layers, progress=progress, log=_log)
            logits = predict_logits(c, result["best"], embedding, features["test"])
            np.save(out / "runs" / f"{arm}-seed{seed}" / "test_logits.npy", logits)  # per item, for any later analysis
            test_dists.setdefault(arm, []).append(distributions(logits, features["test"]))
            histories.setdefault(arm, []).append(result["history"])
            per_seed.setdefault(arm, []).append({"seed": seed, "best_step": result["best_step"], "steps": result["steps"],
                                                 "best_dev_dcs": result["best_dcs"]})
            if arm == export_arm and seed == seeds[0]:
                best_params[arm] = result["best"]

    results = {"model": scorer.name, "tasks": list(tasks), "per_task": per_task, "top_layers": top_layers,
               "config": asdict(base), "seeds": list(seeds), "splits": counts, "arms": {}}
    for arm, dists in test_dists.items():
        results["arms"][arm] = {
            "metrics": {name: pooled_interval(metric, dists, n_boot) for name, metric in ABSTENTION_METRICS.items()},
            "per_seed": [dict(info, **{name: float(metric(d)) for name, metric in ABSTENTION_METRICS.items()})
                         for info, d in zip(per_seed[arm], dists)],
        }
    # per source task (seed-averaged): is abstention learned from what the question says, or everywhere?
    task_of = np.array([item.id.split("/")[0] for item in splits["test"]])
    for arm, dists in test_dists.items():
        results["arms"][arm]["by_task"] = {
            task: {name: float(np.mean([metric(d.take(jnp.asarray(np.flatnonzero(task_of == task)))) for d in dists]))
                   for name, metric in ABSTENTION_METRICS.items()} | {"items": int(np.sum(task_of == task))}
            for task in sorted(set(task_of))}
    results["histories"] = histories
    if export_arm in best_params:
        merge_top(scorer.model, best_params[export_arm])
        from dcsjax.checkpoints.export import save_hf_dir

        save_hf_dir(scorer.model, scorer.tokenizer, out / "model", card=scorer.card.name if scorer.card else None,
                    metadata={"trained": {"arm": export_arm, "seed": seeds[0], "top_layers": top_layers,
                                          "tasks": list(tasks), "config": asdict(base)}})
        results["exported"] = str(out / "model")
    results["seconds"] = round(time.time() - started, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "summary.md").write_text(summary_table(results))
    if histories:
        plot_training(histories, out / "training.png")
    return results


def summary_table(results: dict) -> str:
    names = list(ABSTENTION_METRICS)
    lines = [f"Held-out test split: {results['splits']['test']['items']} items "
             f"({results['splits']['test']['unanswerable']} unanswerable); {results['model']}, top "
             f"{results['top_layers']} layers trained; seeds {results['seeds']}; 95% bootstrap intervals over "
             "test items, metrics averaged over seeds.", "",
             "| arm | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for arm, entry in results["arms"].items():
        cells = [f"{v:+.3f} [{lo:+.3f}, {hi:+.3f}]" if name == "dcs" else f"{v:.3f} [{lo:.3f}, {hi:.3f}]"
                 for name, (v, lo, hi) in entry["metrics"].items()]
        lines.append(f"| {ARM_LABELS.get(arm, arm)} | " + " | ".join(cells) + " |")
    lines += ["", "By source task (seed-averaged; abstention and over-abstention on that task's items):", "",
              "| arm | task | items | dcs | accuracy | abstain_unanswerable | over_abstention |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for arm, entry in results["arms"].items():
        for task, m in entry.get("by_task", {}).items():
            lines.append(f"| {ARM_LABELS.get(arm, arm)} | {task} | {m['items']} | {m['dcs']:+.3f} | {m['accuracy']:.3f} "
                         f"| {m['abstain_unanswerable']:.3f} | {m['over_abstention']:.3f} |")
    return "\n".join(lines) + "\n"


def plot_training(histories: dict[str, list[list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("dev_dcs", "dev DCS"), ("dev_coverage", "dev coverage"),
              ("dev_abstain_unanswerable", "dev abstention on unanswerable")]
    for ax, (key, title) in zip(axes, panels):
        for (arm, runs), color in zip(histories.items(), ("C0", "C1", "C2", "C3")):
            for i, history in enumerate(runs):
                ax.plot([e["step"] for e in history], [e[key] for e in history], color=color, alpha=0.8,
                        lw=1.2, label=ARM_LABELS.get(arm, arm) if i == 0 else None)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
