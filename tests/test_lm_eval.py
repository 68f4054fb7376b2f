"""dcsjax as an lm-evaluation-harness backend, against lm-eval's own hf backend (HFLM on transformers +
torch's float32 model of the same GGUF file), through lm-eval's own evaluator.

Three task configs kept in tests/lm_eval_tasks/ (multiple_choice, loglikelihood_rolling, generate_until, each
over a local data file). One of lm-eval's packaged configs (arc_easy, its own YAML included unchanged but for
where the data lies, pointed at BIG-bench items written in ARC's schema) runs through both backends in
bench/lm_eval_backends.py, whose smoke test (tests/test_bench.py) compares them request by request.

Tolerances: a request's log-likelihood within F32_NATS (5e-4). Rolling documents (300-1,500 tokens,
log-likelihoods near -1,000, where one float32 step is 6e-5) are compared relatively, 2e-5 of their value.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest

from conftest import F32_NATS, ROOT, SMOL

lm_eval = pytest.importorskip("lm_eval")  # part of the test extra; a core install has no lm-eval

TASKS_DIR = ROOT / "tests" / "lm_eval_tasks"
OWN_TASKS = ["dcsjax_mc", "dcsjax_rolling", "dcsjax_gen"]
MAX_LENGTH = 128  # short windows, so every rolling document spans several of them

_runs: dict = {}


def _evaluate(backend: str, model_name: str, tasks: list[str], include: Path = TASKS_DIR) -> dict:
    """lm-eval's simple_evaluate with per-sample logs; one run per backend, model and task set."""
    from lm_eval.tasks import TaskManager

    from conftest import reference_for, reference_tokenizer, scorer_for
    from dcsjax.lmeval.backend import DcsjaxLM

    key = (backend, model_name, tuple(tasks), str(include))
    if key not in _runs:
        if backend == "dcsjax":
            model = DcsjaxLM(pretrained=scorer_for(model_name), max_length=MAX_LENGTH)
        else:
            # lm-eval's HFLM given transformers' float32 model of the GGUF file and transformers' tokenizer of
            # that file (conftest.reference_for and reference_tokenizer, read from their cached copies)
            from lm_eval.models.huggingface import HFLM

            model = HFLM(pretrained=reference_for(model_name), tokenizer=reference_tokenizer(model_name), max_length=MAX_LENGTH,
                         batch_size=8, device="cpu")
        # only the kept configs are indexed: lm-eval's own 10,000-odd YAML files take it about 20 s on 2 cores
        with contextlib.chdir(ROOT):  # the kept task configs name their data files from the repository root
            _runs[key] = lm_eval.simple_evaluate(model=model, tasks=tasks, batch_size=8,
                                                 device="cpu",
                                                 task_manager=TaskManager(include_path=str(include), include_defaults=False),
                                                 log_samples=True)
    return _runs[key]


def _metrics(result: dict, task: str) -> dict:
    return {k: v for k, v in result["results"][task].items() if "," in k}


def _compare(ours: dict, theirs: dict, task: str, model_name: str) -> None:
    """Same documents, per-sample log-likelihoods within the bound, same greedy flags and generations."""
    a, b = ours["samples"][task], theirs["samples"][task]
    assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] and a
    worst = 0.0
    for x, y in zip(a, b):
        assert x["arguments"] == y["arguments"]
        for (got,), (want,), request in zip(x["resps"], y["resps"], x["arguments"]):
            if task.endswith("gen"):
                assert got == want, f"doc {x['doc_id']}: {got!r} != {want!r}"
            elif task.endswith("rolling"):
                gap = abs(got - want) / abs(want)
                assert gap < 2e-5, f"doc {x['doc_id']}: {got} vs {want}"
                worst = max(worst, gap)
            else:
                (lp, greedy), (ref_lp, ref_greedy) = got, want
                assert abs(lp - ref_lp) < F32_NATS, f"doc {x['doc_id']} {request[1]!r}: {lp} vs {ref_lp}"
                assert greedy == ref_greedy, f"doc {x['doc_id']} {request[1]!r}: is_greedy differs"
                worst = max(worst, abs(lp - ref_lp))
        if not task.endswith("gen") and not task.endswith("rolling"):
            choice = lambda s: max(range(len(s["resps"])), key=lambda j: s["resps"][j][0][0])  # noqa: E731
            assert choice(x) == choice(y), f"doc {x['doc_id']}: the argmax choice differs"
    print(f"{model_name} {task}: largest gap {worst:.2e} over {len(a)} documents")


# SmolLM2 through the three configs. The backend is the same code for every model given the model's document
# start (Gemma 3's, its BOS, is test_parity.py's test_gemma_conditions_on_its_bos, as lm-eval's hf backend
# prepends it), and Gemma 3's log-probs against transformers are test_parity.py's, its greedy decoding
# test_apx.py's; so Gemma 3 does not run lm-eval here (its multiple-choice comparison took about 45 s of the
# suite on 2 cores).
CASES = {SMOL: OWN_TASKS}


@pytest.mark.slow
@pytest.mark.parametrize("model_name,task", [(m, t) for m, tasks in CASES.items() for t in tasks])
def test_lm_eval_with_dcsjax_equals_the_hf_backend(model_name, task):
    ours = _evaluate("dcsjax", model_name, CASES[model_name])
    theirs = _evaluate("hf", model_name, CASES[model_name])
    _compare(ours, theirs, task, model_name)
    mine, ref = _metrics(ours, task), _metrics(theirs, task)
    assert mine.keys() == ref.keys() and mine
    assert ours["config"]["model_backend"] == "dcsjax" and ours["config"]["model_fingerprint"]["sha256"]
    for key, value in mine.items():
        if isinstance(value, str):  # "N/A" standard errors
            assert value == ref[key]
        elif "perplexity" in key or "bits_per_byte" in key:
            assert math.isclose(value, ref[key], rel_tol=1e-4), key
        else:
            assert value == pytest.approx(ref[key], abs=1e-12), key


@pytest.mark.slow
def test_lm_eval_command_line_runs_the_dcsjax_backend(tmp_path, monkeypatch):
    """`dcsjax lm-eval --model dcsjax ...`: lm-eval's own command line finds the backend, writes its results and
    samples files, and its chat-template flag goes through the tokenizer's template (the same backend's
    requests against HFLM are the tests above)."""
    from dcsjax.cli import main

    monkeypatch.chdir(ROOT)  # the task configs name their data files from the repository root
    chat = tmp_path / "chat"
    assert main(["lm-eval", "--model", "dcsjax", "--model_args", f"pretrained=smollm2-135m-instruct,max_length={MAX_LENGTH}",
                 "--tasks", "dcsjax_gen", "--include_path", str(TASKS_DIR), "--limit", "2", "--apply_chat_template",
                 "--output_path", str(chat), "--log_samples"]) == 0
    (results,) = chat.rglob("results_*.json")
    written = json.loads(results.read_text())
    assert written["config"]["model"] == "dcsjax" and "exact_match,none" in written["results"]["dcsjax_gen"]
    (samples,) = chat.rglob("samples_dcsjax_gen_*.jsonl")
    lines = samples.read_text().splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 2 and first["arguments"]["gen_args_0"]["arg_0"].startswith("<|im_start|>")


def test_unknown_model_args_are_named():
    from dcsjax.errors import ConfigError
    from dcsjax.lmeval.backend import DcsjaxLM

    with pytest.raises(ConfigError, match="no model_args \\['temprature'\\]"):
        DcsjaxLM(pretrained="smollm2-135m-instruct", temprature=0.5)


@pytest.mark.slow
def test_lm_eval_command_line_names_a_bad_model_arg_in_one_line(capsys, monkeypatch):
    from dcsjax.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["lm-eval", "--model", "dcsjax", "--model_args", "pretrained=smollm2-135m-instruct,temprature=0.5",
                 "--tasks", "dcsjax_mc", "--include_path", str(TASKS_DIR)]) == 2
    err = capsys.readouterr().err
    assert "dcsjax: error: " in err and "temprature" in err and "Traceback" not in err
