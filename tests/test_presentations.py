"""MMLU's presentations: the ones published numbers use (lm-eval's letters, lighteval's cloze with and without the
chat template), each prompt written out here by hand from the item; the normalisation each headline reports,
recomputed from the recorded log-likelihoods; the DCS protocols' appended abstention option (the default "I don't
know." and the DCS paper's " ?" with its instruction), present in every DCS presentation and in no other."""

import json
import re

import numpy as np
import pytest

from conftest import scorer_for, tiny_scorer
from dcsjax.data.tasks import load_task, resolve_task
from dcsjax.eval.run import read_records, run_eval

pytestmark = pytest.mark.slow
SMOL = "smollm2-135m-instruct"
PAPER_LINE = ("Answer only if you are confident, since mistakes may be penalised, while correct answers receive points. "
              "It is acceptable to answer with '?' if you are unsure, and you will receive 0 points.")


def records_of(out, task, protocol):
    return read_records(out / SMOL / resolve_task(task).slug / f"{protocol}.jsonl")


def test_published_presentations_are_scored_as_written(tmp_path):
    tasks = ["mmlu_lm_eval:anatomy", "mmlu_cloze:anatomy", "mmlu_cloze_chat:anatomy"]
    summary = run_eval(SMOL, tasks, ["mcqa"], tmp_path, limit=3, option_order="source", log_samples=True,
                       scorer=scorer_for(SMOL), progress=False)
    scorer = scorer_for(SMOL)
    items = {i.id: i for i in load_task(resolve_task("mmlu:anatomy"))[0]}
    for task in tasks:
        for r in records_of(tmp_path, task, "mcqa"):
            item = items[r["id"]]
            if task.startswith("mmlu_lm_eval"):
                want = ("The following are multiple choice questions (with answers) about anatomy.\n\n"
                        f"{item.question}\nA. {item.choices[0]}\nB. {item.choices[1]}\nC. {item.choices[2]}\n"
                        f"D. {item.choices[3]}\nAnswer:")
                continuations = [" A", " B", " C", " D"]
            else:
                want = f"The following are questions about anatomy.\nQuestion: {item.question}\nAnswer:"
                continuations = [" " + c for c in item.choices]
                if "chat" in task:  # the user's turn, the option starting the assistant's
                    want = scorer.tokenizer.apply_chat_template([{"role": "user", "content": want}],
                                                                add_generation_prompt=True, tokenize=False)
                    continuations = list(item.choices)
            assert r["prompt"] == {"context": want, "continuations": continuations}, task
            loglik = scorer.score_continuations([want] * 4, continuations)
            np.testing.assert_allclose(r["loglik"], loglik, atol=1e-4)
            if task.startswith("mmlu_cloze"):  # lighteval's acc_norm_nospace: characters without the space
                nospace = int(np.argmax(np.asarray(r["loglik"]) / [len(c) for c in item.choices]))
                assert r["choice"]["char_nospace"] == nospace and r["headline"] == "char_nospace"
    rows = {row["task"]: row for row in summary["rows"]}
    assert rows["mmlu_lm_eval:anatomy"]["metric"] == "accuracy_sum"
    assert rows["mmlu_lm_eval:anatomy"]["settings"]["presentation"] == "lm-eval (letters)"
    assert rows["mmlu_cloze:anatomy"]["metric"] == rows["mmlu_cloze_chat:anatomy"]["metric"] == "accuracy_char_nospace"
    assert rows["mmlu_cloze_chat:anatomy"]["settings"]["chat_template"] is True


def test_the_appended_option_is_in_every_dcs_presentation_and_in_no_other(tmp_path):
    """MMLU has no IDK option: every DCS protocol (stated-risk too) appends one, worded as the card says; MCQA-LL,
    qa-ppl, APX and APS score MMLU's own four options (APS from a statements file written here)."""
    items = load_task(resolve_task("mmlu:anatomy"))[0][:3]
    statements = tmp_path / "statements.jsonl"
    statements.write_text("".join(json.dumps({"id": i.id, "question": i.question, "choices": list(i.choices),
                                              "statements": [f"It is {c}." for c in i.choices]}) + "\n" for i in items))
    out = tmp_path / "out"
    run_eval(SMOL, ["mmlu:anatomy"], ["aps", "qa-ppl", "mcqa", "apx", "dcs", "dcs-letters", "stated-risk",
                                      "stated-risk-sequences"], out,
             limit=3, statements=statements, log_samples=True, scorer=tiny_scorer(), progress=False)
    run_eval(SMOL, ["mmlu_dcs_paper:anatomy"], ["dcs", "dcs-letters"], out, limit=3, log_samples=True,
             scorer=tiny_scorer(), progress=False)

    def texts(record) -> str:
        return json.dumps(record["prompt"])

    for idk, task in (("I don't know.", "mmlu:anatomy"), ("?", "mmlu_dcs_paper:anatomy")):
        for r in records_of(out, task, "dcs"):
            assert r["prompt"]["continuations"][4] == " " + idk and len(r["probs"]) == 5  # four options, then IDK
        for r in records_of(out, task, "dcs-letters"):
            listed = re.findall(r"^([A-E])\. (.*)$", r["prompt"]["context"], flags=re.M)
            assert len(listed) == 5 and [text for _, text in listed].count(idk) == 1
            assert (PAPER_LINE in r["prompt"]["context"]) == (task != "mmlu:anatomy")
    for r in records_of(out, "mmlu:anatomy", "stated-risk"):  # each stated target's prompt, and the unstated one
        for context in [*r["prompt"]["contexts"], r["prompt"]["unstated"]]:
            listed = re.findall(r"^([A-E])\. (.*)$", context, flags=re.M)
            assert len(listed) == 5 and [text for _, text in listed].count("I don't know.") == 1
    for r in records_of(out, "mmlu:anatomy", "stated-risk-sequences"):  # the option as one more continuation
        assert r["prompt"]["continuations"].count(" I don't know.") == 1 and len(r["unstated"]["probs"]) == 5
    for protocol in ("aps", "qa-ppl", "mcqa", "apx"):
        for r in records_of(out, "mmlu:anatomy", protocol):
            assert "know" not in texts(r) and not re.search(r"[A-E]\. \?", texts(r)), protocol
            assert len(r["order"]["presentations"][0]["perm"]) == 4
