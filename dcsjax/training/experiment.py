"""`dcsjax train-abstain`: the abstention fine-tuning experiment, end to end and resumable.

The question: does training with DCS at a target threshold t beat thresholding a model afterwards?
1. Answerable and unanswerable versions of real benchmark items (MMLU subjects by default; the correct option
   removed, or unanswerable by wording), options shuffled, split (`data.py`: 29 of MMLU's 57 subjects never
   trained on, the others' questions into train, dev and in-domain test); the splits are written as `jsonl:`
   benchmark files, so `dcsjax eval` can score any of them.
2. The frozen lower layers run once per split (`features.py`), cached in the output folder. Every arm
   reads the same prompt (dcs-letters at lc = lw = 1), so the only thing that changes with t is the
   training objective (DCS arms) or the tuned threshold (baselines), never the input.
3. Arms, each from the same starting model, each seed and adapter in its own resumable run folder: "ce"
   (plain fine-tuning, once: it does not depend on t), "refusal" (R-Tuning's baseline: CE on the starting
   model's answers relabelled, IDK where it was wrong; once too) and, at every t, "dcs+ce" (and "dcs") with
   lw = t / (1 - t).
4. Policies on each test split (unseen subjects, in-domain) at every t (`policies.py`): the starting model and
   the CE model thresholded post hoc (tau tuned on dev for the score at t), the starting model as it is, the refusal
   model's own choice, and each DCS arm's own choice. Metrics pooled over seeds with 95% bootstrap
   intervals over test items, and paired intervals of each DCS arm minus each baseline on the same items.
5. A table per test split and a figure over t (`summary.md`, `thresholds-<split>.png`), risk against coverage
   (`risk_coverage.png`), training curves (`training.png`), `results.json`; one DCS model (seed 0,
   `export_threshold`) written as an HF directory `dcsjax.load` reads.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from dcsjax.errors import ConfigError
from dcsjax.metrics.dcs import loadings_from_threshold as loadings, loadings_note
from dcsjax.metrics.bootstrap import resample_indices
from dcsjax.training.data import (
    CONSTRUCTIONS, DEFAULT_PER_TASK, DEFAULT_TASKS, SPLITS, TEST_SPLITS, UNSEEN_SHARE, abstention_splits, stated_targets,
    write_jsonl,
)
from dcsjax.training.features import letter_features, load_features, save_features
from dcsjax.training.policies import (
    ABSTAIN, DISTRIBUTION_LABELS, METRIC_LABELS, distribution_metrics, outcomes, own_choice, paired, refusal_targets,
    summarise, thresholded, tune_threshold, uniform_answerer,
)
from dcsjax.eval.tables import render
from dcsjax.training.config import ARMS, STAGES
from dcsjax.training.train import TrainConfig, distributions, merge_top, predict_logits, top_params, train


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cached_features(scorer, items, split: str, folder: Path, top_layers: int, lc: float, lw: float, progress: bool,
                    stated: Sequence[float] | None = None):
    """A split's frozen-layer features, computed once and kept in `folder` (keyed by what they depend on,
    so changing the weights, the layers, the items, the targets stated or the code recomputes them).
    stated: per item, the target its stated-risk prompt states (`features.letter_features`)."""
    from dcsjax.eval.results import code_version

    model = scorer.model_fingerprint or {"name": scorer.name}  # the weights' digest, not only their name
    key = {"code": code_version(), "model": model, "top_layers": top_layers, "lc": lc, "lw": lw,
           "items": [i.id for i in items], **({} if stated is None else {"stated": [float(t) for t in stated]})}
    path, meta = folder / f"{split}.npz", folder / f"{split}.json"
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
        return load_features(path)
    from tqdm.auto import tqdm

    path.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=len(items), desc=f"frozen layers: {split}", disable=not progress, file=sys.stderr) as bar:
        features = letter_features(scorer, items, top_layers, lc=lc, lw=lw, stated=stated, progress=bar.update)
    save_features(features, path)
    meta.write_text(json.dumps(key))
    return features


THRESHOLDS = (0.25, 0.5, 0.75)
STATED_ONLY = (0.6, 0.9)  # targets the stated-risk arm is told at test and never trained on
POLICY_LABELS = {"uniform": "uniform answerer (chance)", "start": "starting model, own choice", "start+tau": "starting model + threshold",
                 "ce+tau": "cross-entropy + threshold", "dcs": "DCS at t", "dcs+ce": "DCS + CE at t",
                 "dcs+tau": "DCS at t + threshold", "dcs+ce+tau": "DCS + CE at t + threshold",
                 "refusal": "refusal targets (R-Tuning), own choice",
                 "start-stated": "starting model told t, own choice",
                 "stated": "stated-risk DCS + CE, told t, own choice"}
BASELINES = ("start+tau", "ce+tau", "refusal")
# The arms an experiment trains: the losses of `config.ARMS`, and R-Tuning's refusal baseline (Zhang et al.,
# NAACL 2024): cross-entropy on the starting model's own answers relabelled (`policies.refusal_targets`: the
# gold option where its answer was right, IDK where it was wrong), with the same adapters, steps and dev
# selection (on the true labels) as every arm. Neither CE arm has a threshold of its own. And the stated-risk
# arm (Kalai et al. 2025's stated confidence targets): one DCS + CE model for every t, each training prompt
# stating a target drawn from the thresholds (`data.stated_targets`, the stated-risk protocol's letters prompt)
# and its DCS at that target's loadings; at test it is told each t, the trained ones and `STATED_ONLY`.
EXPERIMENT_ARMS = (*ARMS, "refusal", "stated")
UNTHRESHOLDED = ("ce", "refusal", "stated")  # trained once, for every t
DCS_POLICIES = ("dcs", "dcs+ce", "dcs+tau", "dcs+ce+tau", "stated")  # paired against each baseline
# ... and the stated-risk model against one DCS + CE model per t, where there is one at that t
PAIRED_WITH = {"stated": ("dcs+ce",)}


def run_dir(out: Path, adapter: str, arm: str, seed: int, t: float | None) -> Path:
    where = out / "runs" / adapter
    return (where if t is None else where / f"t{t:g}") / f"{arm}-seed{seed}"


@dataclass(frozen=True)
class RunSpec:
    """One training run of the experiment's grid: an adapter, an arm at a threshold (None for CE), a seed,
    and the configuration it trains with."""
    adapter: str
    arm: str
    t: float | None
    seed: int
    cfg: TrainConfig
    first_seed: bool  # the adapter's first seed: the one whose model may be exported

    def folder(self, out: Path) -> Path:
        return run_dir(out, self.adapter, self.arm, self.seed, self.t)


def run_grid(base: TrainConfig, adapters: Sequence[str], arms: Sequence[str], thresholds: Sequence[float],
             seeds: Sequence[int], lora_seeds: Sequence[int] | None = None, lora_steps: int | None = None,
             lora_thresholds: Sequence[float] | None = None) -> list[RunSpec]:
    """Every run, in the order they train: per adapter, each arm at each threshold (CE once: it has none),
    each seed; LoRA with its own (usually fewer) seeds, updates and thresholds."""
    specs = []
    for adapter in adapters:
        adapter_seeds = list(lora_seeds if adapter == "lora" and lora_seeds is not None else seeds)
        ts = [float(t) for t in lora_thresholds] if adapter == "lora" and lora_thresholds else list(thresholds)
        for arm, t in [(arm, t) for arm in arms for t in ([None] if arm in UNTHRESHOLDED else ts)]:
            lc, lw = (base.lc, base.lw) if t is None else loadings(t)
            for seed in adapter_seeds:
                loss = {"refusal": "ce", "stated": "dcs+ce"}.get(arm, arm)
                cfg = replace(base, arm=loss, seed=seed, lc=lc, lw=lw, adapter=adapter, stated=arm == "stated")
                if adapter == "lora" and lora_steps:
                    cfg = replace(cfg, steps=lora_steps, eval_every=min(cfg.eval_every, lora_steps))
                specs.append(RunSpec(adapter, arm, t, seed, cfg, seed == adapter_seeds[0]))
    return specs


def cached_logits(path: Path, key: dict, compute) -> np.ndarray:
    """Logits [N, K] kept at `path` (.npy, per item, for any later analysis) with what made them (.json):
    read back instead of recomputed (a forward pass over a split, through every block with LoRA: minutes
    per model when a rerun resumes finished runs) only when the key, the code version included, is the same."""
    from dcsjax.eval.results import code_version

    data, meta = (path.parent / (path.name + suffix) for suffix in (".npy", ".json"))  # names may hold "t0.6"
    key = {"code": code_version(), **key}
    if data.is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
        return np.load(data)
    logits = compute()
    np.save(data, logits)
    meta.write_text(json.dumps(key))
    return logits


def run_experiment(model: str = "smollm2-135m-instruct", out: str | Path = "runs/abstain", *,
                   tasks: Sequence[str] = DEFAULT_TASKS, per_task: int | None = DEFAULT_PER_TASK,
                   arms: Sequence[str] = ("ce", "dcs+ce", "refusal"), thresholds: Sequence[float] = THRESHOLDS,
                   seeds: Sequence[int] = (0, 1, 2), adapters: Sequence[str] = ("top",), top_layers: int = 2,
                   lora_layers: int | None = None, lora_seeds: Sequence[int] | None = None,
                   lora_steps: int | None = None, lora_thresholds: Sequence[float] | None = None,
                   stated_thresholds: Sequence[float] = STATED_ONLY,
                   fractions: tuple[float, float, float] = (0.6, 0.2, 0.2), unseen_share: float = UNSEEN_SHARE,
                   base: TrainConfig = TrainConfig(), export_threshold: float | None = 0.5,
                   export_adapter: str | None = None, n_boot: int = 1000, mesh=None, progress: bool = True,
                   until: str = "report") -> dict:
    """lora_layers: the blocks LoRA adapts (default all); lora_seeds, lora_steps and lora_thresholds:
    fewer seeds, updates and thresholds for the LoRA arms (a LoRA step over every block costs what the
    whole model's forward and backward do).
    The first DCS arm's seed-0 model at `export_threshold` (with `export_adapter`, default the first one)
    is saved to OUT/model, merged. unseen_share, fractions: the split (`data.abstention_splits`): the share of
    subjects held out whole, and how the others' questions divide among train, dev and in-domain test.
    stated_thresholds: with the "stated" arm, the targets it is told at test besides `thresholds` (those it
    trains on); the starting model is told each of them too.
    until: the last stage to run (`STAGES`); each one before it is read back where it is kept (a stage run
    again with the same settings recomputes nothing), so the stages run apart, in turn, from one folder. -> the
    results (until "evaluate" or later), or {"stage", "splits", "runs"} after an earlier stage."""
    import dcsjax

    if until not in STAGES:
        raise ConfigError(f"unknown stage {until!r}: one of {', '.join(STAGES)}")
    started = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for arm in arms:
        if arm not in EXPERIMENT_ARMS:
            raise ValueError(f"unknown arm {arm!r}: one of {', '.join(EXPERIMENT_ARMS)} (the starting model is always "
                             "scored)")
    thresholds = [float(t) for t in thresholds]
    told = sorted(set(thresholds) | {float(t) for t in stated_thresholds}) if "stated" in arms else []
    for t in [*thresholds, *told]:
        loadings(t)  # refuses t outside (0, 1)
    scorer = dcsjax.load(model, progress=progress)
    c = scorer.config
    depth = {"top": top_layers, "lora": lora_layers or c.num_layers}  # adapted blocks, per adapter
    unread = []
    splits = abstention_splits(tasks, per_task=per_task, fractions=fractions, unseen_share=unseen_share, errors=unread)
    tests = [s for s in TEST_SPLITS if splits[s]]  # scored at the end: unseen subjects, in-domain (where there are)
    empty = [s for s in ("train", "dev") if not splits[s]]
    if empty or not tests:
        raise ConfigError(f"the split of {', '.join(tasks)} (per task {per_task}) leaves "
                          f"{' and '.join(empty) or 'both test splits'} empty: "
                          + ", ".join(f"{k} {len(v)}" for k, v in splits.items()) + "; take more questions or subjects")
    for split in SPLITS:
        write_jsonl(splits[split], out / "data" / f"{split}.jsonl")
    (out / "data" / "errors.jsonl").write_text("".join(json.dumps(e.as_record()) + "\n" for e in unread))
    if unread:
        _log(f"{len(unread)} source rows are not questions (each in {out / 'data' / 'errors.jsonl'}), first: "
             f"{unread[0].where}: {unread[0].reason}")
    kinds = {s: np.array([i.source["construction"] for i in v]) for s, v in splits.items()}
    counts = {s: {"items": len(v), **{k: int(np.sum(kinds[s] == k)) for k in CONSTRUCTIONS}} for s, v in splits.items()}
    _log(f"items: {counts}")
    if until == "data":
        return _stage_done("data", out, counts, [])
    embedding = scorer.model.output_embedding
    timings: dict[str, float] = {}

    def features_at(k: int, which=SPLITS) -> dict:
        tic = time.time()
        f = {s: cached_features(scorer, splits[s], s, out / "features" / f"top{k}", k, 1.0, 1.0, progress)
             for s in which}
        timings[f"features_top{k}"] = timings.get(f"features_top{k}", 0.0) + round(time.time() - tic, 1)
        return f

    # what each adapter trains on and is scored on, and the starting model's readout (dev and the test splits,
    # and the training split where the refusal baseline relabels it: with LoRA alone and no refusal arm, the
    # top-layer features of the training split are never read)
    trained = set(depth[a] for a in adapters)
    used = ("train", "dev", *tests)
    start_splits = used if "refusal" in arms else ("dev", *tests)
    features = {k: features_at(k, used if k in trained else start_splits) for k in sorted(trained | {top_layers})}
    start = top_params(scorer.model, top_layers)
    start_folder = out / "features" / f"top{top_layers}"
    start_dists = {s: distributions(cached_logits(start_folder / f"start_{s}_logits",
                                                  {"features": json.loads((start_folder / f"{s}.json").read_text())},
                                                  lambda: predict_logits(c, start, embedding, features[top_layers][s])),
                                    features[top_layers][s]) for s in start_splits}
    # the refusal baseline's labels: the same items in every adapter's features, so one set of targets
    refusal = refusal_targets(start_dists["train"]) if "refusal" in arms else None
    # the stated-risk arm's prompts: training and dev items each told a target drawn from the thresholds, the
    # test splits told each target in turn ("unseen@0.6"); the starting model read on the test prompts too
    stated_features: dict[int, dict] = {}
    if told:
        targets = {s: stated_targets(splits[s], thresholds) for s in ("train", "dev")}
        for k in sorted(trained | {top_layers}):
            tic, folder = time.time(), out / "features" / f"top{k}"
            f = {s: cached_features(scorer, splits[s], f"stated-{s}", folder, k, 1.0, 1.0, progress, targets[s])
                 for s in ("train", "dev") if k in trained}
            for s in tests:
                for t in told:
                    f[f"{s}@{t:g}"] = cached_features(scorer, splits[s], f"stated-{s}-t{t:g}", folder, k, 1.0, 1.0,
                                                      progress, [t] * len(splits[s]))
            stated_features[k] = f
            timings[f"features_stated_top{k}"] = round(time.time() - tic, 1)
        for key, feats in stated_features[top_layers].items():
            if "@" in key:
                name = key.replace("@", "-t")  # "unseen@0.6" -> features stated-unseen-t0.6.npz
                start_dists[key] = distributions(cached_logits(
                    start_folder / f"start_stated_{name}_logits",
                    {"features": json.loads((start_folder / f"stated-{name}.json").read_text())},
                    lambda: predict_logits(c, start, embedding, feats)), feats)
    if until == "features":
        return _stage_done("features", out, counts, [])

    # every trained model: (adapter, arm, t or None) -> per seed {"dev", *tests} distributions (the stated-risk
    # model: {"dev", "<test split>@<t>" for every t it is told})
    models: dict[tuple, list[dict]] = {}
    histories: dict[str, list[list[dict]]] = {}
    per_run: list[dict] = []
    exported = None
    for spec in run_grid(base, adapters, arms, thresholds, seeds, lora_seeds, lora_steps, lora_thresholds):
        adapter, arm, t, seed, k = spec.adapter, spec.arm, spec.t, spec.seed, depth[spec.adapter]
        f, folder = (stated_features if arm == "stated" else features)[k], spec.folder(out)
        read = [key for key in f if "@" in key] if arm == "stated" else tests  # what it is scored on
        # (a LetterFeatures' len is its item count, which NamedTuple's _replace would take for its field count)
        train_set = type(f["train"])(**{**f["train"]._asdict(), "correct": refusal}) if arm == "refusal" else f["train"]
        result = train(scorer.model, train_set, f["dev"], spec.cfg, folder, k, progress=progress, log=_log, mesh=mesh)
        # a run folder's settings are fixed (its config.json): the same best step is the same model
        run_key = {"steps": result["steps"], "best_step": result["best_step"], "best_score": result["best_score"]}
        dists = {split: distributions(cached_logits(folder / f"{split.replace('@', '-t')}_logits",
                                                    run_key | {"items": len(f[split])},
                                                    lambda: predict_logits(c, result["best"], embedding, f[split])),
                                      f[split]) for split in ("dev", *read)}
        models.setdefault((adapter, arm, t), []).append(dists)
        histories.setdefault(f"{adapter} {arm}" + ("" if t is None else f" t={t:g}"), []).append(result["history"])
        per_run.append({"adapter": adapter, "arm": arm, "t": t, "seed": seed, "best_step": result["best_step"],
                        "steps": result["steps"], "best_dev_score": result["best_score"],
                        # training time over all resumptions (None: a run finished before times were kept)
                        "seconds": None if result["seconds"] is None else round(result["seconds"], 1)})
        if (exported is None and arm not in UNTHRESHOLDED and t == export_threshold and spec.first_seed
                and adapter == (export_adapter or adapters[0])):
            exported = (adapter, arm, t, seed, result["best"], k)
    if until == "train":
        return _stage_done("train", out, counts, per_run)

    results = {"model": scorer.name, "tasks": list(tasks), "per_task": per_task, "top_layers": top_layers,
               "lora_layers": depth["lora"] if "lora" in adapters else None, "adapters": list(adapters),
               "config": asdict(base), "seeds": list(seeds), "lora_seeds": list(lora_seeds or seeds), "lora_steps": lora_steps,
               "lora_thresholds": [float(t) for t in lora_thresholds] if lora_thresholds else None,
               "thresholds": thresholds, "stated_thresholds": told, "splits": counts, "runs": per_run,
               "n_boot": n_boot}
    results["tests"] = tests
    scored = sorted(set(thresholds) | set(told))  # the stated-risk model is scored at every t it is told
    results["by_split"] = {split: {f"{t:g}": threshold_results(t, start_dists, models, split, kinds[split], n_boot)
                                   for t in scored} for split in tests}
    results["distributions"] = {split: model_metrics(start_dists, models, split, n_boot, told) for split in tests}
    if told:
        results["abstention_slopes"] = {split: abstention_slopes(start_dists, models, split, told, n_boot)
                                        for split in tests}
    results["histories"] = histories
    results["seconds"] = round(time.time() - started, 1)
    results["timings"] = timings | {
        f"{a} {arm}": round(sum(r["seconds"] or 0.0 for r in per_run if r["adapter"] == a and r["arm"] == arm), 1)
        for a in adapters for arm in arms}
    _write_results(results, out)
    if until == "evaluate":
        return results
    if exported is not None:
        adapter, arm, t, seed, params, k = exported
        merge_top(scorer.model, params)
        from dcsjax.checkpoints.export import save_hf_dir

        save_hf_dir(scorer.model, scorer.tokenizer, out / "model", card=scorer.card.name if scorer.card else None,
                    metadata={"trained": {"arm": arm, "adapter": adapter, "threshold": t, "seed": seed,
                                          "layers": k, "tasks": list(tasks), "config": asdict(base)}})
        results["exported"] = {"path": str(out / "model"), "adapter": adapter, "arm": arm, "threshold": t}
        results["seconds"] = round(time.time() - started, 1)
        _write_results(results, out)
    if until == "export":
        return results
    (out / "summary.md").write_text(summary_table(results))
    for split in tests:
        plot_thresholds(results, split, out / f"thresholds-{split}.png")
    plot_risk_coverage(start_dists, models, tests, results, out / "risk_coverage.png")
    if histories:
        plot_training(histories, out / "training.png")
    return results


def _write_results(results: dict, out: Path) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2))
    tmp.replace(out / "results.json")  # a kill mid-write leaves the previous file whole


def _stage_done(stage: str, out: Path, counts: dict, runs: list[dict]) -> dict:
    nxt = STAGES[STAGES.index(stage) + 1]
    _log(f"{out}: stage {stage} done; the same command with --stage {nxt} (or none) goes on from here")
    return {"stage": stage, "splits": counts, "runs": runs}


def threshold_results(t: float, start: dict, models: dict, split: str, kind: np.ndarray, n_boot: int) -> dict:
    """Every policy at t on a test split (`unseen` or `test`): metrics with intervals, thresholds (tuned on dev),
    and the paired differences of each DCS-trained policy against each post-hoc baseline."""
    _, lw = loadings(t)
    indices = resample_indices(len(kind), n_boot, seed=0)  # the same resamples for every policy: pairs
    policies: dict[str, tuple] = {}  # name -> (Outcomes, extra info)
    tau = tune_threshold(start["dev"], lw)
    # the chance reference every row is read against (beside abstaining everywhere, which scores exactly 0)
    policies["uniform"] = (uniform_answerer(start[split], lw), {})
    policies["start"] = (outcomes([start[split]], [own_choice(start[split])], lw, soft=True), {})
    policies["start+tau"] = (outcomes([start[split]], [thresholded(start[split], tau)], lw, soft=True),
                             {"tau": [tau]})
    told = f"{split}@{t:g}"  # the stated-risk prompts at t, where the experiment has them
    if told in start:
        policies["start-stated"] = (outcomes([start[told]], [own_choice(start[told])], lw, soft=True), {})

    def with_threshold(runs: list[dict]) -> tuple:
        """Each run thresholded post hoc, its tau tuned on its own dev split: the baselines' rule exactly.
        Its distributional DCS is that of the distribution it thresholds (the model's own)."""
        taus = [tune_threshold(r["dev"], lw) for r in runs]
        return (outcomes([r[split] for r in runs], [thresholded(r[split], x) for r, x in zip(runs, taus)], lw,
                         soft=True), {"tau": taus})

    for (adapter, arm, at), runs in models.items():
        suffix = "" if adapter == "top" else f" ({adapter})"
        if arm == "ce":
            policies["ce+tau" + suffix] = with_threshold(runs)
        elif arm == "refusal":  # as R-Tuning uses it: the trained model's own choice, IDK its refusal
            policies["refusal" + suffix] = (outcomes([r[split] for r in runs], [own_choice(r[split]) for r in runs],
                                                     lw, soft=True), {})
        elif arm == "stated":  # one model for every t, told this one: its own choice
            if told in runs[0]:
                policies["stated" + suffix] = (outcomes([r[told] for r in runs], [own_choice(r[told]) for r in runs],
                                                        lw, soft=True), {})
        elif at == t:
            policies[arm + suffix] = (outcomes([r[split] for r in runs], [own_choice(r[split]) for r in runs], lw,
                                               soft=True), {})
            # the fair comparison with the baselines: the DCS-trained model under the same post-hoc threshold
            policies[arm + "+tau" + suffix] = with_threshold(runs)
    entry = {"lw": lw, "policies": {}, "paired": {}}
    for name, (o, info) in policies.items():
        entry["policies"][name] = {"metrics": summarise(o, kind, indices), "seeds": int(o.gain.shape[0]), **info}
    for name, (o, _) in policies.items():
        head = name.split(" ")[0]
        if head in DCS_POLICIES:
            suffix = name[len(head):]
            for baseline in (*BASELINES, *PAIRED_WITH.get(head, ())):
                for other in (baseline + suffix, baseline):
                    if other in policies and f"{name} - {other}" not in entry["paired"]:
                        entry["paired"][f"{name} - {other}"] = paired(o, policies[other][0], indices)
    return entry


MODEL_LABELS = {"start": "starting model", "ce": "cross-entropy", "refusal": "refusal targets (R-Tuning)",
                "dcs": "DCS", "dcs+ce": "DCS + CE", "stated": "stated-risk DCS + CE"}


def model_label(adapter: str, arm: str, t: float | None) -> str:
    return MODEL_LABELS[arm] + ("" if t is None else f" at t = {t:g}") + ("" if adapter == "top" else f" ({adapter})")


def told_label(label: str, t: float) -> str:
    return f"{label}, told t = {t:g}"


def model_metrics(start: dict, models: dict, split: str, n_boot: int, told: Sequence[float] = ()) -> dict:
    """Each model's own distribution on a test split, whatever t (`policies.DISTRIBUTION_LABELS`): the starting
    model and every trained one (seeds pooled), on the same item resamples; the starting model and the
    stated-risk model once per target they are told (`told`)."""
    indices = resample_indices(len(start[split].probs), n_boot, seed=0)
    rows = {"starting model": distribution_metrics([start[split]], indices)}
    for t in told:
        rows[told_label("starting model", t)] = distribution_metrics([start[f"{split}@{t:g}"]], indices)
    for key, runs in models.items():
        if key[1] == "stated":
            for t in told:
                rows[told_label(model_label(*key), t)] = distribution_metrics([r[f"{split}@{t:g}"] for r in runs],
                                                                              indices)
        else:
            rows[model_label(*key)] = distribution_metrics([r[split] for r in runs], indices)
    return rows


def abstention_slopes(start: dict, models: dict, split: str, told: Sequence[float], n_boot: int) -> dict:
    """Does abstention follow the stated target? Per model told every t (the starting model, the stated-risk
    one): the per-item least-squares slope of its abstention (own choice IDK; a share over seeds) on t
    (`protocols.stated.slopes_on`), its mean over items -> [slope, 95% interval over item resamples]."""
    from dcsjax.eval.protocols.stated import slopes_on
    from dcsjax.metrics.bootstrap import percentile_interval

    indices = resample_indices(len(start[split].probs), n_boot, seed=0)

    def slope(per_seed: list[list]) -> list[float]:  # [seeds][targets] distributions
        abstained = np.mean([[own_choice(d) == ABSTAIN for d in by_t] for by_t in per_seed], axis=0)  # [T, N]
        per_item = slopes_on(told, abstained.T)
        return [float(per_item.mean()), *percentile_interval(per_item[indices].mean(-1))]

    rows = {"starting model": slope([[start[f"{split}@{t:g}"] for t in told]])}
    for key, runs in models.items():
        if key[1] == "stated":
            rows[model_label(*key)] = slope([[r[f"{split}@{t:g}"] for t in told] for r in runs])
    return rows


def _label(name: str) -> str:
    head, _, rest = name.partition(" ")
    return POLICY_LABELS.get(head, head) + (f" {rest}" if rest else "")


SPLIT_TITLES = {"unseen": "Unseen subjects (never trained on)",
                "test": "In-domain test (held-out questions of the training subjects)"}


def summary_table(results: dict) -> str:
    lines = [f"{results['model']}; adapters {', '.join(results['adapters'])} (top: {results['top_layers']} blocks"
             + (f"; LoRA: {results['lora_layers']} blocks, seeds {results['lora_seeds']}" if results["lora_layers"] else "")
             + f"); seeds {results['seeds']}; metrics pooled over seeds, 95% bootstrap intervals over test items. "
             "A decision scores +1 right, -t/(1-t) wrong, 0 abstained; 'distribution' is DCS of the model's "
             "whole option+IDK distribution (for a thresholded policy, the distribution it thresholds). Chance "
             "references: abstaining everywhere scores exactly 0; the uniform answerer picks uniformly among an "
             "item's options and IDK (its expected metrics) and its distribution is uniform over them.", ""]
    for split in results["tests"]:
        counts = results["splits"][split]
        lines += [f"## {SPLIT_TITLES[split]}: {counts['items']} items ({counts['option removed']} with the correct "
                  f"option removed, {counts['wording']} unanswerable by wording, {counts['answerable']} answerable)", ""]
        body = [[name, *(f"{v:.3f} [{lo:.3f}, {hi:.3f}]" for v, lo, hi in (m[k] for k in DISTRIBUTION_LABELS))]
                for name, m in results["distributions"][split].items()]
        lines += ["Each model's own distribution, whatever t: its forced answer's confidence against its correctness "
                  "(AP higher is better; ECE, Brier and AURC lower).", "",
                  render(["model", *DISTRIBUTION_LABELS.values()], body, "markdown", numeric=range(1, 5)), ""]
        if results.get("abstention_slopes"):
            told = ", ".join(f"{t:g}" for t in results["stated_thresholds"])
            lines += [f"Does abstention follow the target stated in the prompt (told t = {told}; trained on "
                      f"{', '.join(f'{t:g}' for t in results['thresholds'])})? The per-item least-squares slope of "
                      "abstention on t, mean over items (0: the stated target is ignored):", ""]
            lines += [f"- {name}: {v:+.3f} [{lo:+.3f}, {hi:+.3f}] per unit of t"
                      for name, (v, lo, hi) in results["abstention_slopes"][split].items()] + [""]
        lines += _threshold_tables(results["by_split"][split])
    return "\n".join(lines)


def _threshold_tables(by_threshold: dict) -> list[str]:
    names = list(METRIC_LABELS)
    lines = []
    for t, entry in by_threshold.items():
        body = []
        for name, p in entry["policies"].items():
            cells = []
            for n in names:
                v, lo, hi = p["metrics"][n]
                cells.append("-" if v is None else f"{v:+.3f} [{lo:+.3f}, {hi:+.3f}]"
                             if n in ("score", "dcs", "truthfulness")
                             else f"{v:.3f}")
            tau = f" (tau {np.mean(p['tau']):.2f})" if "tau" in p else ""
            body.append([f"{_label(name)}{tau}", *cells])
        note = loadings_note(1.0, entry["lw"])  # t > 0.5: outside Definition 1, said under the heading
        lines += [f"### t = {t} (lw = {entry['lw']:.3g})", "", *([f"† {note}.", ""] if note else []),
                  render(["policy", *(METRIC_LABELS[n] for n in names)], body, "markdown",
                         numeric=range(1, len(names) + 1))]
        if entry["paired"]:
            pairs = []
            for pair, (d, lo, hi, p0) in entry["paired"].items():
                a, b = pair.split(" - ")
                pairs.append([f"{_label(a)} - {_label(b)}", f"{d:+.3f}", f"[{lo:+.3f}, {hi:+.3f}]", f"{p0:.3f}"])
            lines += ["", render(["DCS-trained minus baseline, same items", "difference in decision score",
                                  "95% interval", "share of resamples <= 0"], pairs, "markdown", numeric=(1, 2, 3))]
        lines.append("")
    return lines


def plot_thresholds(results: dict, split: str, path: Path) -> None:
    """Each metric against t, one line per policy (intervals as bars); accuracy when answering against
    the line y = t that Proposition 1 sets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_threshold = results["by_split"][split]
    ts = [float(t) for t in by_threshold]
    names = list(dict.fromkeys(n for e in by_threshold.values() for n in e["policies"]))
    panels = ["score", "selective_accuracy", "coverage", "abstain_removed", "abstain_wording", "over_abstention"]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, metric in zip(axes.flat, panels):
        for i, name in enumerate(names):
            pts = [(t, e["policies"][name]["metrics"][metric]) for t, e in zip(ts, by_threshold.values())
                   if name in e["policies"] and e["policies"][name]["metrics"][metric][0] is not None]
            if not pts:
                continue
            x = np.array([p[0] for p in pts]) + (i - len(names) / 2) * 0.008  # side by side
            v, lo, hi = (np.array([p[1][j] for p in pts]) for j in range(3))
            ax.errorbar(x, v, yerr=[v - lo, hi - v], marker="o", ms=4, capsize=2, lw=1.2, label=_label(name))
        if metric == "selective_accuracy":
            ax.plot(ts, ts, "k--", lw=0.8, label="t (Proposition 1)")
        ax.set_title(METRIC_LABELS[metric])
        ax.set_xlabel("target threshold t")
        ax.set_xticks(ts)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{results['model']}: {SPLIT_TITLES[split].lower()}, {results['splits'][split]['items']} items")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_risk_coverage(start: dict, models: dict, tests: list[str], results: dict, path: Path) -> None:
    """Selective prediction, one panel per test split: the risk (error rate) of answering only the most
    confident share of items (the forced answer's confidence), for the starting model and every trained one
    (seed 0; its AURC, seeds pooled, in the legend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dcsjax.metrics.calibration import risk_coverage

    fig, axes = plt.subplots(1, len(tests), figsize=(6.5 * len(tests), 4.6), squeeze=False)
    for ax, split in zip(axes[0], tests):
        curves = {"starting model": start[split]}
        for key, runs in models.items():
            if key[1] == "stated":  # told the middle target
                t = results["stated_thresholds"][len(results["stated_thresholds"]) // 2]
                curves[told_label(model_label(*key), t)] = runs[0][f"{split}@{t:g}"]
            else:
                curves[model_label(*key)] = runs[0][split]
        for name, d in curves.items():
            coverage, risk = risk_coverage(d)
            aurc = results["distributions"][split][name]["aurc"][0]
            ax.plot(np.asarray(coverage), np.asarray(risk), lw=1.2, label=f"{name} (AURC {aurc:.2f})")
        ax.set_title(f"{SPLIT_TITLES[split]}, {results['splits'][split]['items']} items", fontsize=10)
        ax.set_xlabel("coverage (share answered, most confident first)")
        ax.set_ylabel("risk (error rate among those answered)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(results["model"])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_training(histories: dict[str, list[list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("dev_score", "dev score that selects (DCS at t; -CE for ce)"), ("dev_coverage", "dev coverage"),
              ("dev_abstain_unanswerable", "dev abstention on unanswerable")]
    for ax, (key, title) in zip(axes, panels):
        for j, (run, runs) in enumerate(histories.items()):
            for i, history in enumerate(runs):
                ax.plot([e["step"] for e in history], [e[key] for e in history], color=f"C{j % 10}", alpha=0.8,
                        lw=1.2, label=run if i == 0 else None)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
