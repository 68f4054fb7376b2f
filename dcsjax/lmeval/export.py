"""A dcsjax run in lm-evaluation-harness's results schema (`lm_eval.result_schema.EvalResults`), so dashboards
and scripts that read lm-eval's results files read dcsjax runs too.

Each (task, protocol) row of summary.json becomes one lm-eval "task" named `<task>_<protocol>`, its metrics
under lm-eval's `"metric,filter"` keys (filter `none`). The accuracies lm-eval users know keep lm-eval's
names: the headline accuracy is `acc` (MCQA-LL's summed log-likelihood), MCQA-LL's length-normalised
accuracy (by characters, as lm-eval's) is `acc_norm`; the others keep dcsjax's names (`dcs`, `coverage`...).
The headline's standard error is the sample standard error of the per-item values, as lm-eval computes
it, over exactly the records the summary row was made from (the row keeps it: a later run with another
`--limit` adds records to the file, never to the row); other metrics carry none (lm-eval's schema types a
metric as a number, so no "N/A" is written). lm-eval writes one results file per model: a folder of several
models exports one per model (`models`, `to_lm_eval(output, model)`).
"""

from __future__ import annotations

import time
from pathlib import Path


from dcsjax.eval.results import read_summary

# lm-eval's names; accuracy_char_nospace under lighteval's, which lm-eval has none for
RENAMED = {"accuracy": "acc", "accuracy_sum": "acc", "accuracy_char": "acc_norm",
           "accuracy_char_nospace": "acc_norm_nospace"}
# lm-eval's higher_is_better per metric: True unless named here (None: neither direction is better)
HIGHER_IS_BETTER = {"parse_failures": False, "idk_spread": False, "ppl_delta": None, "abstention": None, "p_idk": None}


def models(output: Path) -> list[str]:
    """The models a results folder's summary holds rows of, in their first row's order."""
    return list(dict.fromkeys(row["model"] for row in read_summary(Path(output)).get("rows", [])))


def to_lm_eval(output: Path, model: str | None = None) -> dict:
    """The results dict lm-eval's `simple_evaluate` would return for one model's rows of a dcsjax output
    folder (`model` may be left out where the folder holds one)."""
    summary = read_summary(Path(output))
    if not summary.get("rows"):
        raise ValueError(f"{output}: summary.json holds no results")
    held = models(output)
    if model is None and len(held) > 1:
        raise ValueError(f"{output}: results of {len(held)} models ({', '.join(held)}); name one")
    model = model or held[0]
    if model not in held:
        raise ValueError(f"{output}: no results of {model!r} ({', '.join(held)})")
    summary = {**summary, "rows": [row for row in summary["rows"] if row["model"] == model]}
    runs = summary.get("runs", {})
    out: dict = {"results": {}, "group_subtasks": {}, "configs": {}, "versions": {}, "n-shot": {},
                 "higher_is_better": {}, "n-samples": {}}
    seconds = 0.0
    for row in summary["rows"]:
        name = f"{row['task']}_{row['protocol']}".replace("-", "_")
        run = runs.get(row.get("run"), {})
        metrics: dict = {"name": name, "alias": name, "sample_len": int(row["n"])}
        better: dict = {}
        for key, value in row["metrics"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value is None:
                continue  # nested breakdowns (by IDK phrasing) stay in dcsjax's summary.json
            metric = RENAMED.get(key, key)
            metrics[f"{metric},none"] = float(value)
            better[metric] = HIGHER_IS_BETTER.get(key, True)
        headline = RENAMED.get(row["metric"], row["metric"])
        if row.get("stderr") is not None:
            metrics[f"{headline}_stderr,none"] = float(row["stderr"])
        out["results"][name] = metrics
        out["higher_is_better"][name] = better
        out["versions"][name] = row["fingerprint"]  # what made the records: model, task, settings, code
        shots = run.get("num_fewshot", 0) if row["protocol"] in ("mcqa", "apx") else 0
        out["n-shot"][name] = int(shots or 0)
        out["n-samples"][name] = {"original": int(row["n"]) + int(row["errors"]), "effective": int(row["n"])}
        out["configs"][name] = {"task": name, "dcsjax_task": row["task"], "protocol": row["protocol"],
                                "output_type": row["protocol"], "headline_metric": headline,
                                "settings": repr(row.get("settings")), "lc": str(row["lc"]), "lw": str(row["lw"])}
        seconds += float(row.get("seconds") or 0.0)
    last = runs.get(summary["rows"][-1].get("run"), {})
    identity = last.get("model_identity") or {}
    versions = last.get("versions") or {}
    out["config"] = {"model": "dcsjax", "model_args": f"pretrained={last.get('model', model)}",
                     "model_dtype": str(last.get("dtype", "float32")), "model_sha": str(identity.get("sha256", "")),
                     "batch_size": str(last.get("batch_size")), "limit": last.get("limit"),
                     "random_seed": int(last.get("seed", 0)), "fewshot_seed": int(last.get("seed", 0))}
    if "parameters" in identity:
        out["config"]["model_num_parameters"] = int(identity["parameters"])
    out["git_hash"] = str(versions.get("git_commit") or "")[:7]
    out["date"] = time.time()
    out["transformers_version"] = str(versions.get("transformers") or "")
    out["model_source"] = "dcsjax"
    out["model_name"] = str(last.get("model", model))
    out["model_name_sanitized"] = model.replace("/", "__")
    out["total_evaluation_time_seconds"] = f"{seconds:.2f}"
    out["dcsjax"] = {"versions": versions, "model_identity": identity}  # lm-eval's readers ignore unknown keys
    return out
