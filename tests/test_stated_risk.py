"""The stated-risk protocol: the prompt at each target t states the penalty the score uses (lw = t/(1-t)); its
DCS per t against a numpy computation from the same probabilities; the abstention slope and the implied policy
on a hand-made model whose answers are known; the registry carries the protocol's chance reference and table,
so the orchestrator names no protocol for them."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from dcsjax.data.items import Item
from dcsjax.data.tasks import resolve_task
from dcsjax.eval import protocols
from dcsjax.eval.protocols import stated
from dcsjax.eval.run import format_table, summary_row

ITEMS = [Item("q/0", "Which planet is the largest?", ("Mars", "Jupiter", "Venus", "Mercury"), (1,)),
         Item("q/1", "Which gas do plants take in?", ("Oxygen", "Helium", "Carbon dioxide", "Neon"), (2,))]


class RuleFollower:
    """A model that reads the stated target from the prompt and follows it: over the options it puts its
    confidence `confidence` on one option (the right one where `knows`, else the first wrong one) and the rest
    evenly; it answers when its confidence exceeds the stated t and abstains otherwise (the abstention letter
    then takes most of the mass). With no target stated it answers."""
    is_instruct = False
    document_start_id = 0

    def __init__(self, confidence: float = 0.7, knows: bool = True, reply: str | None = None):
        self.confidence, self.knows, self.fixed_reply = confidence, knows, reply
        # the generation read-out: a "token" is a whole text, so a prompt is [document start, text] and a reply
        # decodes to itself
        self.tokenizer = SimpleNamespace(chat_template=None, decode=lambda tokens, skip_special_tokens=False:
                                         tokens if isinstance(tokens, str) else tokens[-1])

    def encode(self, texts):
        return [[text] for text in texts]

    def reply(self, prompt: str) -> str:
        """Its greedy answer to APX's prompt: the letter of its most probable option (or `reply`, whatever)."""
        if self.fixed_reply is not None:
            return self.fixed_reply
        texts = re.findall(r"^([A-Z])\. (.*)$", prompt, flags=re.M)
        return texts[int(np.argmax(self.probs(prompt, [text for _, text in texts])))][0]

    def probs(self, prompt: str, shown: list[str]) -> np.ndarray:
        """Its distribution over the options as shown (texts), the abstention option among them."""
        idk = shown.index("I don't know.")
        item = next(i for i in ITEMS if i.question in prompt)
        right = item.choices[item.correct[0]]
        pick = right if self.knows else next(c for c in item.choices if c != right)
        target = re.search(r"> ([0-9.]+) confident", prompt)
        t = float(target.group(1)) if target else 0.0
        answers = [j for j in range(len(shown)) if j != idk]
        p = np.zeros(len(shown))
        for j in answers:
            p[j] = self.confidence if shown[j] == pick else (1 - self.confidence) / (len(answers) - 1)
        if self.confidence > t:  # answer: a little mass on abstaining
            p = 0.9 * p
            p[idk] = 0.1
        else:  # abstain
            p = 0.1 * p
            p[idk] = 0.9
        return p

    def score_options(self, prompts, letter_lists):  # the letters read-out
        out = []
        for prompt, letters in zip(prompts, letter_lists):
            texts = dict(re.findall(r"^([A-Z])\. (.*)$", prompt, flags=re.M))
            out.append(np.log(self.probs(prompt, [texts[x.strip()] for x in letters])))
        return out

    def option_logprobs(self, contexts, continuations):  # the sequences read-out: one token an option
        return [[np.array([np.log(p)]) for p in self.probs(c, [x.strip() for x in conts])]
                for c, conts in zip(contexts, continuations)]


@pytest.fixture
def replies(monkeypatch):
    """greedy_generate on the fake model: its reply to each prompt's text."""
    import dcsjax.engine.generate as generate

    monkeypatch.setattr(generate, "greedy_generate",
                        lambda scorer, prompts, max_new_tokens: [scorer.reply(p[-1]) for p in prompts])


def context(model):
    return protocols.Context(model, resolve_task("mmlu"))


def records_of(model, thresholds=stated.THRESHOLDS, protocol="stated-risk"):
    ctx = protocols.Context(model, resolve_task("mmlu"))
    if thresholds != stated.THRESHOLDS:
        from dataclasses import replace

        ctx = replace(ctx, card=replace(ctx.card, stated_thresholds=list(thresholds)))
    return protocols.score(protocols.get(protocol), ctx, ITEMS, "source", 0), ctx


def numpy_dcs(probs, correct, idk, lw):
    probs = np.asarray(probs, np.float64)
    wrong = [j for j in range(len(probs)) if j not in correct and j != idk]
    return (probs[list(correct)].sum() - lw * probs[wrong].sum()) * (1 - probs[idk])


@pytest.mark.parametrize("t, said", [(0.0, "0"), (0.5, "1"), (0.6, "1.5"), (0.75, "3"), (0.9, "9")])
def test_the_prompt_states_the_penalty_that_the_score_uses(t, said):
    records, ctx = records_of(RuleFollower(), (t,))
    shown = protocols.options.with_idk(ITEMS[0], "I don't know.")
    (prompt,) = protocols.get("stated-risk").prompt(ctx, shown)["contexts"]
    assert f"> {stated.number(t)} confident" in prompt and f"penalised {said} points" in prompt
    assert prompt.count("I don't know.") == 1  # the appended option, lettered among the others
    assert records[0]["stated"][0]["lw"] == pytest.approx(t / (1 - t)) == pytest.approx(float(said))


@pytest.mark.parametrize("t, said", [(0.5, "1"), (0.9, "9")])
def test_the_sequences_read_out_states_the_rule_before_the_question_and_no_letters(t, said):
    """The sequences read-out: the rule (without the letters' "Answer with the letter only.") on the line before
    the card's question; each option's text, the appended abstention option's among them, continues it; with no
    rule stated, the question alone."""
    records, ctx = records_of(RuleFollower(), (t,), "stated-risk-sequences")
    shown = protocols.options.with_idk(ITEMS[0], "I don't know.")
    prompt = protocols.get("stated-risk-sequences").prompt(ctx, shown)
    (context,) = prompt["contexts"]
    assert context == (f"Answer only if you are > {stated.number(t)} confident, since mistakes are penalised {said} "
                       "points, while correct answers receive 1 point, and an answer of \"I don't know\" receives 0 "
                       "points.\nQuestion: Which planet is the largest?\nAnswer:")
    assert prompt["unstated"] == "Question: Which planet is the largest?\nAnswer:"
    assert prompt["continuations"] == [" Mars", " Jupiter", " Venus", " Mercury", " I don't know."]
    assert records[0]["stated"][0]["lw"] == pytest.approx(float(said))
    assert not protocols.get("stated-risk-sequences").letters  # no rotations: the order cannot matter


@pytest.mark.usefixtures("replies")
@pytest.mark.parametrize("protocol", ["stated-risk", "stated-risk-sequences", "stated-risk-generate"])
def test_dcs_per_target_equals_numpy_on_the_same_probabilities(protocol):
    for model in (RuleFollower(0.7, knows=True), RuleFollower(0.8, knows=False)):
        records, _ = records_of(model, protocol=protocol)
        for r in records:
            for k, t in enumerate(r["thresholds"]):
                s = r["stated"][k]
                assert s["dcs"] == pytest.approx(numpy_dcs(s["probs"], r["correct_options"], r["idk_index"],
                                                           t / (1 - t)), abs=1e-5)
                assert r["unstated_dcs"][k] == pytest.approx(numpy_dcs(r["unstated"]["probs"], r["correct_options"],
                                                                       r["idk_index"], t / (1 - t)), abs=1e-5)
            assert r["dcs"] == pytest.approx(np.mean([s["dcs"] for s in r["stated"]]))


@pytest.mark.usefixtures("replies")
@pytest.mark.parametrize("protocol", ["stated-risk", "stated-risk-sequences", "stated-risk-generate"])
def test_a_model_that_follows_the_stated_target_has_the_known_slope_and_agrees_with_its_implied_policy(protocol):
    """Confidence 0.7: it answers at t = 0 and 0.5 and abstains at 0.75 and 0.9. Its per-item slope is the
    least-squares slope of (0, 0, 1, 1) on t; its unstated confidence (0.7 among the options) implies the same
    decisions, so it agrees with them at every t; answering right, its accuracy on answered items is 1. The same
    by either read-out."""
    records, _ = records_of(RuleFollower(0.7), protocol=protocol)
    assert [[s["abstained"] for s in r["stated"]] for r in records] == [[False, False, True, True]] * 2
    want = np.polyfit(stated.THRESHOLDS, [0, 0, 1, 1], 1)[0]
    np.testing.assert_allclose(stated.abstention_slope(records), [want, want])
    summary = stated.summarise(records)
    assert summary["abstention_slope"]["value"] == pytest.approx(want)
    assert summary["abstention_slope"]["ci95"] == pytest.approx([want, want])  # every item the same
    for t, m in summary["by_t"].items():
        # a generated reply has no confidence, so implies no policy
        assert m["agrees_with_implied"] == (None if protocol == "stated-risk-generate" else 1.0)
        assert m["answer_rate"] == (1.0 if float(t) < 0.7 else 0.0)
        assert m["accuracy_answered"] == (1.0 if float(t) < 0.7 else None)
        assert m["truthfulness"] == (1.0 if float(t) < 0.7 else 0.0)  # answered right, or abstained
    # a model that ignores the target (answers throughout, confidently wrong): slope 0, and its mistakes cost lw
    ignores = stated.summarise(records_of(RuleFollower(0.95, knows=False), protocol=protocol)[0])
    assert ignores["abstention_slope"]["value"] == 0.0
    assert ignores["by_t"]["0.75"]["truthfulness"] == pytest.approx(-3.0)
    assert ignores["by_t"]["0.75"]["hallucination_rate"] == 1.0


@pytest.mark.usefixtures("replies")
@pytest.mark.parametrize("t, said", [(0.5, "1"), (0.9, "9")])
def test_the_generation_read_out_asks_as_apx_with_the_rule_before_the_closing_question(t, said):
    """APX's prompt (its system prompt, the lettered options with the abstention option among them) with the rule
    on the line before "The correct answer is:"; the reply's letter is the decision, all its mass on that option;
    a reply naming no option is a wrong answer (DCS -lw), never an abstention, with its reason kept."""
    from dcsjax.eval.protocols import apx

    records, ctx = records_of(RuleFollower(), (t,), "stated-risk-generate")
    shown = protocols.options.with_idk(ITEMS[0], "I don't know.")
    prompt = protocols.get("stated-risk-generate").prompt(ctx, shown)
    (context,) = prompt["contexts"]
    rule = (f"Answer only if you are > {stated.number(t)} confident, since mistakes are penalised {said} points, "
            "while correct answers receive 1 point, and an answer of \"I don't know\" receives 0 points.")
    options = "A. Mars\nB. Jupiter\nC. Venus\nD. Mercury\nE. I don't know."
    assert context == (f"{apx.SYSTEM_PROMPT}\n\nQuestion: Which planet is the largest?\nOptions:\n{options}\n{rule}\n"
                       "The correct answer is:")
    assert prompt["unstated"] == apx.SYSTEM_PROMPT + "\n\n" + apx.question_prompt(shown, False)
    decision = records[0]["stated"][0]  # confidence 0.7, knowing the answer: B below t, the abstention above
    assert decision["generation"] == ("B" if t < 0.7 else "E") and decision["probs"] == (
        [0, 1, 0, 0, 0] if t < 0.7 else [0, 0, 0, 0, 1])
    assert decision["dcs"] == (1.0 if t < 0.7 else 0.0)
    mute, _ = records_of(RuleFollower(reply="I would rather not say"), (t,), "stated-risk-generate")
    decision = mute[0]["stated"][0]
    assert decision["choice"] is None and not decision["abstained"] and not decision["correct"]
    assert decision["dcs"] == pytest.approx(-float(said)) and decision["parse_error"]
    summary = stated.summarise(mute)["by_t"][stated.number(t)]
    assert summary["unparsed"] == 1.0 and summary["hallucination_rate"] == 1.0 and summary["answer_rate"] == 1.0


def test_the_chance_reference_is_the_uniform_distributions_dcs_at_each_target():
    records, _ = records_of(RuleFollower())
    n = len(records[0]["unstated"]["probs"])  # four options and the abstention option
    uniform = np.full(n, 1 / n)
    want = np.mean([numpy_dcs(uniform, [1], n - 1, t / (1 - t)) for t in stated.THRESHOLDS])
    assert stated.chance(records) == pytest.approx(want)
    for t, m in stated.summarise(records)["by_t"].items():
        assert m["uniform_dcs"] == pytest.approx(numpy_dcs(uniform, [1], n - 1, stated.penalty(float(t))))


def test_the_orchestrator_takes_a_protocols_chance_and_table_from_the_registry(monkeypatch):
    """A protocol registered under a new name: the summary row's chance reference and the table under the
    results table are its own, with no line of the orchestrator naming it."""
    fake = protocols.Protocol("made-up", "a protocol the orchestrator has never heard of",
                              run=lambda ctx, items: [], summarise=lambda records: {"score": 0.25},
                              headline=lambda r: r["score"], answer=lambda r: None,
                              chance=lambda records: 0.125, details=lambda rows, fmt: "made-up's own table")
    monkeypatch.setattr(protocols, "PROTOCOLS", (*protocols.PROTOCOLS, "made-up"))
    monkeypatch.setitem(protocols.registry(), "made-up", fake)
    row = summary_row("m", "t", "made-up", [{"id": "a", "score": 0.25}], 0, 1.0, 1.0, "fp", {}, 0.0)
    assert row["chance"]["uniform"] == 0.125 and row["value"] == 0.25
    assert "made-up's own table" in format_table({"rows": [row]})


def test_the_report_pools_a_models_tasks_item_by_item():
    from dcsjax.analysis.report import ModelResults, stated_rows

    m = ModelResults("follows", None, None)
    m.records["a"]["stated-risk"] = records_of(RuleFollower(0.7))[0]
    m.records["b"]["stated-risk"] = records_of(RuleFollower(0.95, knows=False))[0]
    m.records["a"]["stated-risk-sequences"] = records_of(RuleFollower(0.7), protocol="stated-risk-sequences")[0]
    rows = {r["task"]: r["metrics"] for r in stated_rows({"follows": m})}
    assert list(rows) == ["a", "b", "all 2 tasks", "a (stated-risk-sequences)"]  # each read-out its own rows
    pooled = rows["all 2 tasks"]["by_t"]["0.75"]  # two items answered wrongly, two abstaining
    assert pooled["answer_rate"] == 0.5 and pooled["hallucination_rate"] == 0.5
    assert rows["all 2 tasks"]["abstention_slope"]["value"] == pytest.approx(
        np.polyfit(stated.THRESHOLDS, [0, 0, 1, 1], 1)[0] / 2)


def test_the_report_draws_abstention_and_accuracy_on_answered_against_t(tmp_path):
    from dcsjax.analysis.report import stated_risk_figure, stated_table

    rows = [{"model": name, "task": "q", "metrics": stated.summarise(records_of(model)[0])}
            for name, model in (("follows", RuleFollower(0.7)), ("ignores", RuleFollower(0.95, knows=False)))]
    stated_risk_figure(rows, tmp_path / "stated_risk.png")
    assert (tmp_path / "stated_risk.png").stat().st_size > 0
    table = stated_table(rows)
    lines = [line for line in table.splitlines() if line.startswith("| follows") or line.startswith("| ignores")]
    assert [line.split("|")[3].strip() for line in lines] == ["0", "0.5", "0.75", "0.9"] * 2
    assert "- follows q: abstention rises by 1.232 [1.232, 1.232]" in table  # (0, 0, 1, 1) on t: least squares


def test_a_protocol_added_to_the_registry_runs_through_eval_which_names_none(tmp_path, monkeypatch):
    """One home per protocol: a protocol defined here and added to the registry only (its run, summary, chance
    reference and flags beside it) is planned, scored, resumed, summarised and tabled by `dcsjax eval`'s
    orchestrator, which knows no protocol by name; flagged `dcs_loadings`, its row names the run's loadings."""
    import dataclasses
    import json

    from dcsjax.eval.run import run_eval

    class Scorer:  # what the orchestrator reads of a model: its name, identity and a copy with a fresh cache
        name, model_fingerprint = "fake", {"name": "fake"}

        def replace(self, **_):
            return self

    def answer_first(ctx, items):
        return [{"id": i.id, "choice": 0, "correct": float(0 in i.correct)} for i in items]

    mine = protocols.Protocol("first-option", "answers the first option it is shown", run=answer_first,
                              summarise=lambda rs: {"accuracy": float(np.mean([r["correct"] for r in rs]))},
                              headline=lambda r: r["correct"], answer=lambda r: r["choice"])
    monkeypatch.setattr(protocols, "PROTOCOLS", (*protocols.PROTOCOLS, "first-option"))
    monkeypatch.setattr(protocols, "_REGISTRY", {**protocols.registry(), "first-option": mine})
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{k}", "question": f"Question {k}?", "choices": ["a", "b", "c", "d"],
                                        "answer": k % 4}) + "\n" for k in range(8)))
    out = run_eval("fake", [f"jsonl:{data}"], ["first-option"], tmp_path / "out", scorer=Scorer(), progress=False,
                   option_order="source")
    (row,) = out["rows"]
    assert row["protocol"] == "first-option" and row["n"] == 8 and row["value"] == 0.25
    assert row["chance"]["uniform"] == 0.25 and row["loadings_note"] is None
    assert "first-option" in format_table(out)
    again = run_eval("fake", [f"jsonl:{data}"], ["first-option"], tmp_path / "out", scorer=Scorer(), progress=False,
                     option_order="source")  # resumed: nothing scored again, the same row
    assert again["rows"][0]["value"] == 0.25 and again["rows"][0]["ids"] == row["ids"]
    monkeypatch.setattr(protocols, "_REGISTRY", {**protocols.registry(),
                                                 "first-option": dataclasses.replace(mine, dcs_loadings=True)})
    assert protocols.named("dcs_loadings")[-1] == "first-option"
    flagged = run_eval("fake", [f"jsonl:{data}"], ["first-option"], tmp_path / "out2", scorer=Scorer(),
                       progress=False, option_order="source", threshold=0.75)
    assert flagged["rows"][0]["lw"] == 3.0 and flagged["rows"][0]["loadings_note"] is not None


@pytest.mark.slow
def test_the_unstated_generation_read_out_is_apxs_reply_on_real_weights():
    """With no rule stated, the generation read-out asks exactly as APX does (the abstention option shown as one
    more lettered option): the same greedy replies and parsed answers as `apx.run_apx` on SmolLM2."""
    from conftest import scorer_for
    from dcsjax.eval.protocols import apx

    scorer = scorer_for("smollm2-135m-instruct")
    items = [protocols.options.with_idk(item, "I don't know.") for item in ITEMS]
    want = apx.run_apx(scorer, items)
    got = stated.run_generation(scorer, items, 1.0, None)
    assert [g["generation"] for g in got] == [w["generation"] for w in want]
    assert [g["choice"] for g in got] == [w["choice"] for w in want]
    assert all(w["choice"] is not None for w in want)  # it names an option: the comparison reads a decision
