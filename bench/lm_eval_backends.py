"""The wall time of one whole lm-evaluation-harness run with the dcsjax backend against lm-eval's hf backend
(transformers + torch reading the same GGUF file, float32), same machine, same process, same tasks.

    python bench/lm_eval_backends.py                         # SmolLM2, 300 items (about 10 minutes on 2 cores)
    python bench/lm_eval_backends.py --model gemma3-270m --items 100

The run: lm-eval's own arc_easy.yaml (multiple_choice, acc and acc_norm) over ITEMS MMLU items written
in ARC's schema, plus the kept loglikelihood_rolling and generate_until configs of tests/lm_eval_tasks/.
Each backend is timed from construction (model load, and for dcsjax its compiles) to lm-eval's results,
and then again on a second evaluation with the model already loaded (what a sweep over many tasks pays
per task). Both runs' metrics are printed side by side, and their per-request log-likelihoods compared
(the largest gap, and the documents whose argmax option differs): equal results are part of the result.
Writes bench/results/lm-eval-<time>.json. Needs the test extra (torch, lm-eval).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

from common import ROOT, write_record  # bench/common.py

SOURCE_TASKS = ("mmlu:world_religions", "mmlu:conceptual_physics", "mmlu:high_school_geography")  # MMLU subjects
KEPT_TASKS = ("dcsjax_rolling", "dcsjax_gen")


def arc_task(folder: Path, n_items: int) -> str:
    """lm-eval's arc_easy.yaml, unchanged but for its data: MMLU items in ARC's schema."""
    import lm_eval

    from dcsjax.data.tasks import load_task, resolve_task

    rows = []
    for task in SOURCE_TASKS:
        items, _ = load_task(resolve_task(task))
        rows += [{"id": i.id, "question": i.question, "choices": {"text": list(i.choices),
                                                                  "label": [chr(65 + j) for j in range(len(i.choices))]},
                  "answerKey": chr(65 + i.correct[0])} for i in items]
    rows = rows[:n_items]
    data = folder / "arc_bench.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    packaged = Path(lm_eval.__file__).parent / "tasks" / "arc" / "arc_easy.yaml"
    (folder / "arc_bench.yaml").write_text(
        f"include: {packaged}\ntask: arc_bench\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    train: {data}\n    validation: {data}\n    test: {data}\n")
    return "arc_bench"


def evaluate(model, tasks: list[str], manager, log_samples: bool = False) -> tuple[dict, float]:
    import lm_eval

    start = time.perf_counter()
    with contextlib.chdir(ROOT):  # the kept configs name their data from the repository root
        result = lm_eval.simple_evaluate(model=model, tasks=tasks, task_manager=manager, batch_size=8, device="cpu",
                                         log_samples=log_samples)
    return result, time.perf_counter() - start


def agreement(ours: dict, theirs: dict, task: str) -> dict:
    """Per request of a multiple-choice task: the largest log-likelihood gap between the backends, how many
    is_greedy flags and argmax choices differ, over how many documents and requests."""
    a, b = ours["samples"][task], theirs["samples"][task]
    assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b]
    gaps, greedy, choices = [], 0, 0
    for x, y in zip(a, b):
        mine, ref = [r[0] for r in x["resps"]], [r[0] for r in y["resps"]]
        gaps += [abs(m[0] - r[0]) for m, r in zip(mine, ref)]
        greedy += sum(m[1] != r[1] for m, r in zip(mine, ref))
        argmax = lambda lls: max(range(len(lls)), key=lambda j: lls[j][0])  # noqa: E731
        choices += argmax(mine) != argmax(ref)
    return {"documents": len(a), "requests": len(gaps), "largest_gap": max(gaps), "greedy_differs": greedy,
            "choice_differs": choices, "doc_to_text": ours["configs"][task]["doc_to_text"]}


def main() -> None:
    import tempfile

    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from dcsjax.checkpoints.fetch import fetch_model
    from dcsjax.lmeval.backend import DcsjaxLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--arc-only", action="store_true", help="only the arc_easy config (a quick check)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    tasks = [arc_task(folder, args.items), *(() if args.arc_only else KEPT_TASKS)]
    # the configs this run names, not lm-eval's 10,000-odd packaged ones (arc_bench includes its YAML by path)
    manager = TaskManager(include_path=[str(folder), str(ROOT / 'tests' / 'lm_eval_tasks')], include_defaults=False)
    path = fetch_model(args.model)
    rows, metrics, results = [], {}, {}
    builders = {"dcsjax": lambda: DcsjaxLM(pretrained=args.model),
                "hf": lambda: HFLM(pretrained=str(path.parent), gguf_file=path.name, dtype="float32", batch_size=8,
                                   device="cpu")}
    for backend, build in builders.items():
        start = time.perf_counter()
        model = build()
        loaded = time.perf_counter() - start
        result, first = evaluate(model, tasks, manager, log_samples=True)
        results[backend] = result
        _, second = evaluate(model, tasks, manager)
        metrics[backend] = {t: {k: v for k, v in r.items() if "," in k and "stderr" not in k}
                            for t, r in result["results"].items()}
        rows.append({"backend": backend, "load_s": round(loaded, 2), "first_run_s": round(loaded + first, 2),
                     "loaded_run_s": round(second, 2)})
        print(rows[-1], flush=True)
    ours, peer = rows
    ratio = {"first_run": round(peer["first_run_s"] / ours["first_run_s"], 2),
             "loaded_run": round(peer["loaded_run_s"] / ours["loaded_run_s"], 2)}
    import torch

    record = {"model": args.model, "items": args.items, "tasks": tasks, "rows": rows, "hf_over_dcsjax": ratio,
              "metrics": metrics, "agreement": agreement(results["dcsjax"], results["hf"], tasks[0]),
              "model_backend": results["dcsjax"]["config"]["model_backend"], "torch_threads": torch.get_num_threads()}
    out = write_record(args.out, "lm-eval", record, args)
    from dcsjax.eval.tables import render

    print(render(["backend", "load s", "whole run s (load included)", "second run s (model loaded)"],
                 [[r["backend"], r["load_s"], r["first_run_s"], r["loaded_run_s"]] for r in rows], "markdown",
                 numeric=(1, 2, 3)))
    print(f"\nhf / dcsjax wall time: {ratio['first_run']}x whole run, {ratio['loaded_run']}x with the model loaded")
    for task in tasks:
        print(task, "dcsjax", metrics["dcsjax"][task], "| hf", metrics["hf"][task])
    print(f"{tasks[0]} per request: {record['agreement']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
