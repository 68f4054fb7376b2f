"""Few-shot MCQA-LL and APX, and --log-samples: which exemplars each item gets, the text the model is
given (written out here by hand from the exemplar items, not by the code under test), and that the
recorded log-likelihoods are those of that text."""

import json

import numpy as np
import pytest

from conftest import scorer_for
from dcsjax.data.tasks import load_task, resolve_task
from dcsjax.errors import ConfigError
from dcsjax.eval.run import read_records, run_eval
from dcsjax.eval.protocols.apx import SYSTEM_PROMPT

TASK, K, LIMIT = "mmlu:world_religions", 2, 8  # exemplars: other questions of the same subject


@pytest.fixture(scope="module")
def fewshot_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fewshot")
    run_eval("smollm2-135m-instruct", [TASK], ["mcqa", "apx"], out, limit=LIMIT, num_fewshot=K, log_samples=True,
             scorer=scorer_for("smollm2-135m-instruct"), progress=False, option_order="source")
    folder = out / "smollm2-135m-instruct" / resolve_task(TASK).slug
    return out, read_records(folder / "mcqa.jsonl"), read_records(folder / "apx.jsonl")


def _items():
    items, _ = load_task(resolve_task(TASK))
    return {i.id: i for i in items}


@pytest.mark.slow
def test_exemplars_are_other_items_seeded_per_item_and_recorded(fewshot_run):
    _, mcqa, apx = fewshot_run
    for r in mcqa:
        assert len(r["fewshot"]) == K == len(set(r["fewshot"])) and r["id"] not in r["fewshot"]
    assert [r["fewshot"] for r in mcqa] == [r["fewshot"] for r in apx]  # the same exemplars for both protocols
    assert len({tuple(r["fewshot"]) for r in mcqa}) > 1  # drawn per item, not one fixed set
    # an item's exemplars do not depend on which other items run with it: the last item scored alone
    from dcsjax.eval import protocols
    from dcsjax.eval.run import score_items
    from dcsjax.eval.protocols.fewshot import Exemplars

    all_items = list(_items().values())
    ctx = protocols.Context(scorer_for("smollm2-135m-instruct"), resolve_task(TASK),
                            exemplars=Exemplars(tuple(all_items), K, 0, "source"))
    (record,) = score_items("mcqa", ctx, [all_items[LIMIT - 1]], "source", 0)
    in_run = next(r for r in mcqa if r["id"] == record["id"])  # records are written shortest item first
    assert record["fewshot"] == in_run["fewshot"]
    assert record["loglik"] == pytest.approx(in_run["loglik"], abs=1e-5)


@pytest.mark.slow
def test_fewshot_prompts_are_the_solved_exemplars_then_the_question(fewshot_run):
    _, mcqa, apx = fewshot_run
    items = _items()
    scorer = scorer_for("smollm2-135m-instruct")
    for r in mcqa:
        shots = [items[i] for i in r["fewshot"]]
        want = "".join(f"Question: {ex.question}\nAnswer: {ex.choices[ex.correct[0]]}\n\n" for ex in shots)
        want += f"Question: {items[r['id']].question}\nAnswer:"
        assert r["prompt"]["context"] == want
        assert r["prompt"]["continuations"] == [" " + c for c in items[r["id"]].choices]
        # the recorded log-likelihoods are those of this text
        again = scorer.score_continuations([want] * len(r["prompt"]["continuations"]), r["prompt"]["continuations"])
        np.testing.assert_allclose(r["loglik"], again, atol=1e-4)
    for r in apx:  # SmolLM2-Instruct: exemplars as earlier user / assistant turns of the chat
        shots = [items[i] for i in r["fewshot"]]
        assert r["prompt"].startswith("<|im_start|>system\n" + SYSTEM_PROMPT)
        for ex in shots:
            letter = "ABCDEFGHIJ"[ex.correct[0]]
            assert f"Question: {ex.question}\n" in r["prompt"] and f"<|im_start|>assistant\n{letter}<|im_end|>" in r["prompt"]
        last_user = r["prompt"].rsplit("<|im_start|>user\n", 1)[1]
        assert last_user.startswith(f"Question: {items[r['id']].question}\n")
        assert r["prompt"].rstrip().endswith("<|im_start|>assistant") and isinstance(r["generation"], str)


@pytest.mark.slow
def test_summary_records_fewshot_and_log_samples(fewshot_run):
    out, _, _ = fewshot_run
    summary = json.loads((out / "summary.json").read_text())
    (run,) = summary["runs"].values()
    assert (run["num_fewshot"], run["log_samples"]) == (K, True)
    for row in summary["rows"]:
        assert row["settings"]["num_fewshot"] == K and row["settings"]["log_samples"] is True


def test_fewshot_is_refused_for_protocols_that_do_not_take_it(tmp_path):
    with pytest.raises(ConfigError, match="few-shot applies to mcqa and apx"):
        run_eval("smollm2-135m-instruct", [TASK], ["mcqa", "dcs"], tmp_path, num_fewshot=1,
                 scorer=scorer_for("smollm2-135m-instruct"), progress=False)


@pytest.mark.slow
def test_a_run_exported_to_lm_eval_passes_its_schema_and_table(fewshot_run, tmp_path):
    """`dcsjax export-lm-eval`: lm-eval's own schema (`EvalResults`, checked by pydantic) and its own table
    writer read the file; accuracies under lm-eval's names, the headline's standard error as lm-eval's."""
    pytest.importorskip("lm_eval")
    from pydantic import TypeAdapter
    from lm_eval.result_schema import EvalResults
    from lm_eval.utils import make_table

    from dcsjax.cli import main

    out, mcqa, _ = fewshot_run
    assert main(["export-lm-eval", str(out), "--out", str(tmp_path)]) == 0
    (target,) = (tmp_path / "smollm2-135m-instruct").glob("results_*.json")  # lm-eval's layout: a folder per model
    exported = json.loads(target.read_text())
    TypeAdapter(EvalResults).validate_python(exported)
    table = make_table(exported)
    assert f"{TASK}_mcqa" in table and "acc_norm" in table
    task = exported["results"][f"{TASK}_mcqa"]
    correct = [r["correct"]["sum"] for r in mcqa]
    assert task["acc,none"] == pytest.approx(np.mean(correct))
    assert task["acc_stderr,none"] == pytest.approx(np.std(correct, ddof=1) / np.sqrt(len(correct)))
    assert task["acc_norm,none"] == pytest.approx(np.mean([r["correct"]["char"] for r in mcqa]))
    assert exported["n-shot"][f"{TASK}_mcqa"] == K and task["sample_len"] == LIMIT
    assert exported["config"]["model_sha"] and exported["higher_is_better"][f"{TASK}_apx"]["parse_failures"] is False


def test_exemplars_come_from_the_cards_fewshot_split(tmp_path, monkeypatch):
    """A hub card with `fewshot_split`: every exemplar is an item of that split (ids `<task>:<split>/...`), none
    of the scored split; the prompt shows them solved; the settings say where they came from. The hub is
    stood in for by rows of ARC's schema, per split, through the same `datasets.load_dataset` call."""
    import datasets

    from conftest import tiny_scorer
    from dcsjax.data.tasks import read_card

    def rows(split, n):
        return [{"question": f"{split} question {i}?", "choices": {"text": ["w", "x", "y", "z"], "label": list("ABCD")},
                 "answerKey": "ABCD"[i % 4]} for i in range(n)]

    splits = {"test": rows("test", 4), "train": rows("train", 5)}
    monkeypatch.setattr(datasets, "load_dataset", lambda dataset, config, split: splits[split])
    card = tmp_path / "toy_mmlu.toml"
    card.write_text('name = "toy_mmlu"\nsource = "hub:toy/arc"\nschema = "arc"\nsplit = "test"\nfewshot_split = "train"\n')
    out = tmp_path / "out"
    run_eval("smollm2-135m-instruct", [str(card)], ["mcqa"], out, num_fewshot=2, log_samples=True, scorer=tiny_scorer(),
             progress=False, option_order="source")
    records = read_records(next(out.rglob("mcqa.jsonl")))
    assert len(records) == 4
    for r in records:
        assert len(r["fewshot"]) == 2 and all(i.startswith("toy_mmlu:train/") for i in r["fewshot"])
        shots = [splits["train"][int(i.rsplit("/", 1)[1])] for i in r["fewshot"]]
        want = "".join(f"Question: {s['question']}\nAnswer: {'wxyz'['ABCD'.index(s['answerKey'])]}\n\n" for s in shots)
        assert r["prompt"]["context"].startswith(want) and "test question" in r["prompt"]["context"].split(want)[1]
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["settings"]["fewshot_from"] == "the train split"

    # exemplars never come from the split the run scores
    card.write_text(card.read_text().replace('fewshot_split = "train"', 'fewshot_split = "test"'))
    with pytest.raises(Exception, match="another split than the scored one"):
        read_card(card)
