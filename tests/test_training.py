"""Fine-tuning for abstention on the real SmolLM2 weights: the data versions and splits, the cached
frozen layers against the scorer's own letters elicitation, an HF export that transformers reads back,
resume, and a short run of the whole experiment (the loss falls; the checkpoint round-trips through
`dcsjax.load` and `dcsjax eval`)."""

import dataclasses
import json

import jax
import numpy as np
import pytest

import dcsjax
from conftest import F32_NATS, scorer_for
from dcsjax.data.items import Item
from dcsjax.eval.protocols.dcs import run_dcs_letters
from dcsjax.training.data import SPLITS, abstention_splits, abstention_versions, question_key, split_of, unseen_subjects
from dcsjax.training.features import letter_features
from dcsjax.training.train import (
    TrainConfig, arm_loss, batch_indices, distributions, letter_logits, predict_logits, top_params, train,
)

SMOL = "smollm2-135m-instruct"


# ------------------------------------------------------------------------------------------------ data
def test_versions_keep_the_option_count_and_move_the_answer_to_idk():
    import random

    item = Item("t/0", "Which is a fruit?", ("car", "apple", "stone", "cloud"), (1,))
    answerable, unanswerable = abstention_versions(item, "t", random.Random(0))
    for version in (answerable, unanswerable):
        assert len(version.choices) == 4 and version.choices[-1] == "I don't know." and version.idk == 3
    assert answerable.choices[answerable.correct[0]] == "apple" and answerable.answerable
    assert "apple" not in unanswerable.choices and unanswerable.correct == (3,) and not unanswerable.answerable
    assert answerable.source["group"] == unanswerable.source["group"]
    assert abstention_versions(Item("t/1", "Yes?", ("yes", "no"), (0,)), "t", random.Random(0)) == []
    native = Item("k/0", "Who will win?", ("Unknown", "Bob"), (0,), idk=0)
    (kept,) = abstention_versions(native, "k", random.Random(0))
    assert kept.choices == native.choices and not kept.answerable


def test_mmlu_splits_hold_unseen_subjects_out_whole_and_are_fixed():
    """The default data, split as R-Tuning splits MMLU: 29 subjects never trained on (the `unseen` split, whole),
    the other 28 subjects' questions in train, dev and the in-domain test; no unseen subject's item in
    training or dev, an item's two versions always in one split, the same split on every run; its two header
    rows reported, never dropped unsaid."""
    errors = []
    splits = abstention_splits(("mmlu",), per_task=3, errors=errors)
    subjects = {name: {i.source["subject"] for i in items} for name, items in splits.items()}
    everyone = set().union(*subjects.values())
    assert len(everyone) == 57 and len(subjects["unseen"]) == 29 and subjects["unseen"] == unseen_subjects(everyone)
    seen = everyone - subjects["unseen"]
    assert subjects["train"] | subjects["dev"] | subjects["test"] == seen  # disjoint from the unseen ones
    where = {}
    for name, items in splits.items():
        for item in items:
            question = item.id.rsplit("/", 1)[0]  # both versions: <question id>/answerable, /unanswerable
            assert where.setdefault(question, name) == name, item.id
    assert len(where) == 57 * 3
    assert [e.where.rsplit("/", 1)[-1] for e in errors] == ["mmlu.jsonl:11777", "mmlu.jsonl:12794"]
    assert sum(len(v) for v in splits.values()) == 57 * 3 * 2  # three questions a subject, two versions each
    again = abstention_splits(("mmlu",), per_task=3, errors=[])
    assert all([i.id for i in again[s]] == [i.id for i in splits[s]] for s in SPLITS)
    assert {i.source["version"] for i in splits["train"]} == {"answerable", "unanswerable"}
    assert all(i.choices[i.idk] == "I don't know." and len(i.choices) == 4 for v in splits.values() for i in v)
    with pytest.raises(Exception, match="mmlu.jsonl:11777: correct_answer 'answer'"):
        abstention_splits(("mmlu:elementary_mathematics",), per_task=3)  # no list to take them: it stops
    # no subject held out: every subject's questions in train, dev and test
    whole = abstention_splits(("mmlu",), per_task=3, unseen_share=0.0, errors=[])
    assert not whole["unseen"] and {i.source["subject"] for s in ("train", "dev", "test") for i in whole[s]} == everyone
    assert unseen_subjects(["anatomy"]) == set() and len(unseen_subjects(["a", "b", "c", "d"])) == 2  # never all
    # a task without subjects splits by question, the same question written two ways in one split
    assert split_of(question_key("t", " Q  one"), (0.6, 0.2, 0.2)) == split_of(question_key("t", "q one"), (0.6, 0.2, 0.2))


def test_training_data_options_are_shuffled_so_no_letter_gives_the_answer():
    """In source order every version's IDK option is last (D) and MMLU's answers lean to D; in the training data
    the answers and the IDK option sit at every letter about equally (so a trained model cannot score by a
    letter preference)."""
    items = [i for split in abstention_splits(("mmlu",), per_task=4, errors=[]).values() for i in split]
    n, k = len(items), len(items[0].choices)  # 4 options: one removed, IDK added
    gold = np.bincount([i.correct[0] for i in items], minlength=k) / n
    idk = np.bincount([i.idk for i in items], minlength=k) / n
    assert n == 57 * 8 and k == 4 and gold.max() < 0.33 and idk.max() < 0.33, (gold, idk)
    source = [i for split in abstention_splits(("mmlu",), per_task=4, option_order="source", errors=[]).values()
              for i in split]
    assert all(i.idk == 3 for i in source)  # the order a model could exploit


def test_both_unanswerable_constructions_are_labelled_and_bbq_templates_stay_in_one_split(bigbench_copy):
    """Removing the correct option ("option removed", MMLU) and a question unanswerable by its wording (BBQ's
    ambiguous contexts, known_unknowns; from a BIG-bench copy, here the tests' own) are told apart on every
    version; BBQ's items, generated from templates with names swapped and a disambiguating sentence added, go
    to one split per template."""
    from dcsjax.training.data import CONSTRUCTIONS

    splits = abstention_splits(("mmlu:abstract_algebra", "known_unknowns", "bbq_religion_ambig", "bbq_religion_disambig"),
                               per_task=8, errors=[])
    items = [i for v in splits.values() for i in v]
    assert {i.source["construction"] for i in items} == set(CONSTRUCTIONS)
    for item in items:
        task = item.source.get("benchmark", "mmlu")
        want = ("answerable" if item.answerable else
                "wording" if "bbq" in task or "known_unknowns" in task else "option removed")
        assert item.source["construction"] == want, item.id
        if "bbq" in task:
            assert item.idk is not None and (item.choices[item.idk] in item.choices)  # its own "unknown" option
            assert item.answerable == task.endswith("disambig")
    template_split = {}
    for name, split in splits.items():
        for item in split:
            if "template" in item.source:
                assert template_split.setdefault(item.source["template"], name) == name, item.source["template"]
    assert len(template_split) == 4
    assert {i.source["subject"] for i in splits["test"] if "subject" in i.source} == {"abstract_algebra"}


def test_batches_are_a_pure_function_of_seed_and_step():
    n = 10
    stream = np.concatenate([batch_indices(3, s, 2, 3, n).ravel() for s in range(5)])  # 30 draws: 3 epochs
    for epoch in range(3):
        assert sorted(stream[epoch * n:(epoch + 1) * n]) == list(range(n))
    np.testing.assert_array_equal(batch_indices(3, 4, 2, 3, n), batch_indices(3, 4, 2, 3, n))
    assert not np.array_equal(batch_indices(3, 0, 1, 10, n), batch_indices(4, 0, 1, 10, n))


def test_collapse_alarm_names_what_collapsed():
    from dcsjax.training.train import collapse_alarm

    healthy = {"coverage": 0.6, "abstain_unanswerable": 0.5}
    assert collapse_alarm(healthy) is None
    assert "coverage collapsed" in collapse_alarm(healthy | {"coverage": 0.0})
    assert "abstention collapsed" in collapse_alarm(healthy | {"abstain_unanswerable": 0.004})


# ------------------------------------------------------------------------------------------------ model
# Eight questions of each of four MMLU subjects with short questions, two versions each: two subjects held out
# whole (`unseen_subjects`: high-school geography, miscellaneous), the other two's questions in train, dev and the
# in-domain test (`split_of` on each question: the same on every run)
SMALL_TASKS = ("mmlu:miscellaneous", "mmlu:high_school_geography", "mmlu:world_religions", "mmlu:management")
SMALL_PER_TASK = 8


@pytest.fixture(scope="module")
def small_splits():
    splits = abstention_splits(SMALL_TASKS, per_task=SMALL_PER_TASK)
    assert [len(splits[s]) for s in SPLITS] == [14, 4, 14, 32]
    return splits


@pytest.fixture(scope="module")
def small_features(small_splits):
    scorer = scorer_for(SMOL)
    return {name: letter_features(scorer, small_splits[name], 2) for name in ("train", "dev")}


@pytest.mark.slow
@pytest.mark.parametrize("model_name,top", [(SMOL, 3), ("gemma3-270m", 1)])
def test_cached_layers_give_the_letters_elicitation_of_eval(model_name, top, small_splits):
    """Frozen layers cached + top layers on top (the last read at one token) == the scorer's full forward
    pass over the vocabulary, for both models (Gemma: sliding-window layers, base-model prompt), with one
    top layer and with several (each model at one depth: the depth is a number the same code reads)."""
    scorer = scorer_for(model_name)
    items = small_splits["test"][:6]
    features = letter_features(scorer, items, top)
    params = top_params(scorer.model, top)
    probs = np.asarray(distributions(predict_logits(scorer.config, params, scorer.model.output_embedding, features),
                                     features).probs)
    for row, record in zip(probs, run_dcs_letters(scorer, items)):
        np.testing.assert_allclose(row[:len(record["probs"])], record["probs"], atol=2e-5)
    # the training step's layout: the prompts packed several to a row, each item's logits those of its own row
    everyone = np.arange(len(features))
    packed = features.packed(everyone, row_multiple=1, row_length=2 * features.batch(everyone).hidden.shape[1])
    assert packed.hidden.shape[0] < len(features) and packed.segments.max() > 1  # rows shared
    logits = jax.jit(letter_logits, static_argnums=0)(scorer.config, params, scorer.model.output_embedding,
                                                      *packed.inputs)
    alone = predict_logits(scorer.config, params, scorer.model.output_embedding, features)
    np.testing.assert_allclose(np.asarray(logits), alone, atol=2e-6 * np.abs(alone).max())  # rounding: 1e-6 seen


def test_packed_rows_hold_each_prompt_whole_in_a_segment_of_its_own():
    """`LetterFeatures.packed`: every item's prompt lies whole in one row, in order, its positions from 0 and a
    segment no other prompt of the row has; rows a multiple of the row multiple, the same for every micro-batch;
    first-fit decreasing fills the rows (here 7 prompts into 4 rows of 64 where one a row would take 7)."""
    from dcsjax.training.features import LetterFeatures, first_fit

    length = np.array([40, 30, 25, 20, 33, 10, 50], np.int32)  # 50 + 10 | 40 + 20 | 33 + 30 | 25
    offset = np.concatenate([[0], np.cumsum(length[:-1])])
    hidden = np.arange(length.sum() * 2, dtype=np.float32).reshape(-1, 2) + 1  # no zero rows
    k = 3
    f = LetterFeatures(hidden, offset, length, np.ones((7, k), np.int32), np.eye(7, k, dtype=bool),
                       np.zeros((7, k), bool), np.ones((7, k), bool), np.ones(7, np.float32))
    index = np.array([[0, 1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1, 0]])
    b = f.packed(index, row_multiple=3)
    assert b.hidden.shape == (2, 6, 64, 2) and b.row.shape == (2, 7)  # 4 rows rounded up to 6, of t = 64
    for m in range(2):
        for j, i in enumerate(index[m]):
            r, end = b.row[m, j], b.last[m, j]
            cols = np.arange(end - length[i] + 1, end + 1)
            np.testing.assert_array_equal(b.hidden[m, r, cols], hidden[offset[i]:offset[i] + length[i]])
            np.testing.assert_array_equal(b.positions[m, r, cols], np.arange(length[i]))
            assert len(set(b.segments[m, r, cols])) == 1 and b.segments[m, r, cols[0]] > 0
            assert (b.segments[m, r] == b.segments[m, r, cols[0]]).sum() == length[i]  # its segment alone
        assert (b.hidden[m][b.segments[m] == 0] == 0).all()  # padding is zero
    np.testing.assert_array_equal(b.letters, f.letters[index])
    rows, _ = first_fit(np.array([60, 40, 30, 20, 10]), 64)
    assert rows.max() + 1 == 3  # 60 | 40 + 20 | 30 + 10


@pytest.mark.slow
def test_refusal_targets_follow_the_starting_models_own_answers(small_splits):
    """R-Tuning's labels: the gold option where the starting model's answer (read by eval's own letters
    elicitation, its most probable option with IDK left out) is right, IDK where it is wrong; unanswerable
    versions always IDK."""
    from dcsjax.training.policies import refusal_targets

    scorer = scorer_for(SMOL)
    items = small_splits["train"] + small_splits["test"]  # 28 versions, 14 answerable: some answered right
    features = letter_features(scorer, items, 2)
    start = distributions(predict_logits(scorer.config, top_params(scorer.model, 2), scorer.model.output_embedding,
                                         features), features)
    targets = refusal_targets(start)
    rights = 0
    for item, record, row in zip(items, run_dcs_letters(scorer, items), targets):
        probs = np.asarray(record["probs"])
        answer = max((j for j in range(len(probs)) if j != item.idk), key=lambda j: probs[j])
        right = answer in item.correct
        rights += right
        want = [j in item.correct and j != item.idk if right else j == item.idk for j in range(len(row))]
        assert list(row) == want, item.id
    assert 0 < rights < len(items)  # both kinds of label occur


@pytest.mark.slow
@pytest.mark.parametrize("name", [SMOL, "gemma3-270m"])
def test_export_reads_back_in_dcsjax_and_transformers(name, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from dcsjax.checkpoints.export import save_hf_dir

    scorer = scorer_for(name)
    directory = save_hf_dir(scorer.model, scorer.tokenizer, tmp_path / "m", card=name)
    texts = ["The capital of France is Paris.", "Water boils at one hundred degrees."]
    loaded = dcsjax.load(directory)
    assert loaded.card.name == name and loaded.config == scorer.config
    np.testing.assert_array_equal(loaded.score(texts), scorer.score(texts))
    theirs = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = [scorer.document_start_id] + scorer.encode(texts[:1])[0]
    with torch.no_grad():
        logits = theirs(torch.tensor([ids])).logits[0]
        want = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()
    # transformers on the exported folder against dcsjax on the GGUF (itself within F32_NATS of transformers on
    # the GGUF: test_parity.py): 9e-6 (SmolLM2) and 5e-5 (Gemma) nats here
    np.testing.assert_allclose(scorer.token_logprobs(texts[:1])[0], want, atol=F32_NATS)


@pytest.mark.slow
def test_a_killed_run_resumes_where_it_stopped(small_features, tmp_path):
    from dcsjax.training.train import _logits, _train_step

    scorer = scorer_for(SMOL)
    cfg = TrainConfig(arm="dcs+ce", steps=6, batch_size=4, eval_every=3, ce_warmup=2, learning_rate=1e-4)
    train_set, dev_set = small_features["train"], small_features["dev"]
    straight = train(scorer.model, train_set, dev_set, cfg, tmp_path / "straight", 2, progress=False)
    first = train(scorer.model, train_set, dev_set, cfg, tmp_path / "killed", 2, progress=False, until=4)
    assert first["steps"] == 4
    compiled = _train_step._cache_size(), _logits._cache_size()
    resumed = train(scorer.model, train_set, dev_set, cfg, tmp_path / "killed", 2, progress=False)
    assert resumed["steps"] == 6
    # the restored state is placed as a fresh one: the resumed run compiles neither its update nor its dev
    # logits again (orbax restores committed arrays; left uncommitted, a fresh run's were another cache key)
    assert (_train_step._cache_size(), _logits._cache_size()) == compiled
    for a, b in zip(jax.tree.leaves(straight["best"]), jax.tree.leaves(resumed["best"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [e["step"] for e in resumed["history"]] == [0, 3, 6]


@pytest.mark.slow
def test_short_experiment_lowers_the_loss_and_its_model_scores_in_eval(tmp_path, monkeypatch):
    """CI's short version of `dcsjax train-abstain`: a few steps on a tiny split, both adapters (LoRA on the
    top 2 blocks here, the experiment's default is every block; with fewer updates and at one threshold, as the
    experiment's `lora_steps` and `lora_thresholds` allow), two thresholds, the post-hoc baselines."""
    from dcsjax.eval.run import run_eval
    from dcsjax.training.experiment import run_experiment
    from dcsjax.training.features import load_features

    from dcsjax.training.train import _train_step

    out = tmp_path / "abstain"
    cfg = TrainConfig(steps=12, batch_size=8, eval_every=6, ce_warmup=4, learning_rate=3e-4, patience=10)
    compiled_before = _train_step._cache_size()
    grid = dict(tasks=SMALL_TASKS, per_task=SMALL_PER_TASK, thresholds=(0.5, 0.75), seeds=(0,),
                adapters=("top", "lora"), lora_layers=2, lora_steps=8, lora_thresholds=(0.5,), base=cfg, n_boot=50,
                progress=False)
    import dcsjax.training.experiment as experiment

    # the stages apart (`--stage`): the data, then the frozen layers and the starting model's logits, nothing
    # trained; the whole experiment below goes on from what they kept and computes no feature again
    kept = run_experiment(SMOL, out, export_adapter="lora", until="data", **grid)
    assert kept["stage"] == "data" and kept["splits"]["train"]["items"] == 14
    assert (out / "data" / "unseen.jsonl").is_file() and not (out / "features").exists()
    kept = run_experiment(SMOL, out, export_adapter="lora", until="features", **grid)
    assert kept["stage"] == "features" and not (out / "runs").exists()
    assert (out / "features" / "top2" / "start_unseen_logits.npy").is_file()
    labels = {}  # (adapter, run) -> the training labels the run was given
    real_train = experiment.train

    def recording(model, train_set, dev_set, cfg, folder, *args, **kwargs):
        labels[folder.parent.name, folder.name] = train_set.correct
        return real_train(model, train_set, dev_set, cfg, folder, *args, **kwargs)

    monkeypatch.setattr(experiment, "train", recording)
    monkeypatch.setattr(experiment, "letter_features", lambda *a, **k: pytest.fail("features computed again"))
    results = run_experiment(SMOL, out, export_adapter="lora", **grid)
    monkeypatch.undo()
    # the refusal baseline trained on R-Tuning's labels from the starting model's own answers (its logits on the
    # training split, kept by the experiment), every other arm on the items' own labels; both adapters alike
    from dcsjax.training.policies import refusal_targets
    from dcsjax.training.train import distributions

    top_train = load_features(out / "features" / "top2" / "train.npz")
    start_train = distributions(np.load(out / "features" / "top2" / "start_train_logits.npy"), top_train)
    for adapter in ("top", "lora"):
        assert np.array_equal(labels[adapter, "refusal-seed0"], refusal_targets(start_train))
        assert np.array_equal(labels[adapter, "ce-seed0"], top_train.correct)
    assert not np.array_equal(refusal_targets(start_train), top_train.correct)  # it got some wrong
    for t in ("0.5", "0.75"):
        entry = results["by_split"]["unseen"][t]
        lora = {"dcs+ce (lora)", "dcs+ce+tau (lora)"} if t == "0.5" else set()
        assert set(entry["policies"]) == {"uniform", "start", "start+tau", "ce+tau", "refusal", "dcs+ce", "dcs+ce+tau",
                                          "ce+tau (lora)", "refusal (lora)", *lora}
        assert {"dcs+ce - start+tau", "dcs+ce+tau - start+tau", "dcs+ce - refusal"} <= set(entry["paired"])
        if lora:
            assert {"dcs+ce (lora) - ce+tau (lora)", "dcs+ce+tau (lora) - ce+tau (lora)"} <= set(entry["paired"])
        # a thresholded policy's distributional DCS is that of the model it thresholds
        assert entry["policies"]["start+tau"]["metrics"]["dcs"] == entry["policies"]["start"]["metrics"]["dcs"]
        assert entry["policies"]["dcs+ce+tau"]["metrics"]["dcs"] == entry["policies"]["dcs+ce"]["metrics"]["dcs"]
    assert results["tests"] == ["unseen", "test"] and set(results["by_split"]["test"]) == {"0.5", "0.75"}
    # T (TruthRL: accuracy - hallucination rate) is the decision score at lc = lw = 1, t = 0.5's
    for policy in results["by_split"]["unseen"]["0.5"]["policies"].values():
        assert policy["metrics"]["truthfulness"][0] == pytest.approx(policy["metrics"]["score"][0])
    # each model's own distribution: R-Tuning's AP of the starting model against scikit-learn's on its forced answers
    from sklearn.metrics import average_precision_score

    models = results["distributions"]["unseen"]
    assert {"starting model", "cross-entropy", "refusal targets (R-Tuning)", "DCS + CE at t = 0.5",
            "DCS + CE at t = 0.75", "DCS + CE at t = 0.5 (lora)"} <= set(models)
    unseen = load_features(out / "features" / "top2" / "unseen.npz")
    d = distributions(np.load(out / "features" / "top2" / "start_unseen_logits.npy"), unseen)
    rows, probs = np.arange(len(unseen)), np.asarray(d.probs)
    pick = np.where(np.asarray(d.idk) | ~np.asarray(d.valid), -1.0, probs).argmax(-1)  # the best option, IDK left out
    hit = np.asarray(d.correct)[rows, pick]
    assert models["starting model"]["ap"][0] == pytest.approx(average_precision_score(hit, probs[rows, pick]), abs=1e-6)
    assert all(lo <= v <= hi for m in models.values() for v, lo, hi in m.values())
    for name in ("summary.md", "thresholds-unseen.png", "thresholds-test.png", "risk_coverage.png", "training.png"):
        assert (out / name).stat().st_size > 0
    # five runs, one compiled update per adapter and packed shape (each batch packed into rows of its longest
    # prompt, rounded up, the rows a multiple of 4: MMLU's prompts here take one or two shapes): arms,
    # thresholds and seeds are traced or read outside it
    train_set = load_features(out / "features" / "top2" / "train.npz")
    shapes = {train_set.packed(idx).hidden.shape
              for idx in (batch_indices(0, step, 1, 8, len(train_set)) for step in range(12))}
    assert _train_step._cache_size() - compiled_before <= 2 * len(shapes)
    assert results["exported"]["adapter"] == "lora" and results["exported"]["threshold"] == 0.5

    # a rerun resumes every finished run and scores nothing again: the starting model's and each run's dev
    # and test logits are read back, and no run computes its starting logits for the KL term
    import dcsjax.training.experiment as experiment
    import dcsjax.training.train as training

    scored = []
    monkeypatch.setattr(experiment, "predict_logits", lambda *a, **k: scored.append(1) or predict_logits(*a, **k))
    monkeypatch.setattr(training, "predict_logits", lambda *a, **k: pytest.fail("a finished run computed logits"))
    again = run_experiment(SMOL, out, export_threshold=None, **grid)  # the model is exported already
    assert not scored and again["by_split"] == results["by_split"]
    monkeypatch.undo()

    # the loss on the training items falls from the starting model to the trained one: the exported run's last
    # parameters (LoRA merged), read back from its run folder; the exported model itself is the dev-picked
    # checkpoint, which on these unseen dev subjects may be the start
    scorer = scorer_for(SMOL)  # the session's copy: the experiment merged its training into a model of its own
    start = top_params(scorer.model, 2)
    trained = dcsjax.load(out / "model")
    train_set = load_features(out / "features" / "top2" / "train.npz")
    dcs_cfg = TrainConfig(arm="dcs+ce", lw=1.0, ce_warmup=4)
    everything = train_set.batch(np.arange(len(train_set)))

    @jax.jit  # one program for both parameter sets (op by op, each of its ops would compile on its own)
    def loss(model_params):
        logits = letter_logits(scorer.config, model_params, scorer.model.output_embedding, *everything.inputs)
        return arm_loss(dcs_cfg, logits, *everything.targets, None, cfg.steps)[0]

    folder = out / "runs" / "lora" / "t0.5" / "dcs+ce-seed0"
    saved = json.loads((folder / "config.json").read_text())
    run_cfg = TrainConfig(**{f.name: saved[f.name] for f in dataclasses.fields(TrainConfig)})
    dev_set = load_features(out / "features" / "top2" / "dev.npz")
    finished = train(scorer.model, train_set, dev_set, run_cfg, folder, 2, progress=False)  # resumes at its end
    assert finished["steps"] == run_cfg.steps
    assert float(loss(finished["last"])) < float(loss(start)) - 1e-3
    best = finished["best"]  # the exported model is that run's dev-picked checkpoint
    np.testing.assert_allclose(float(loss(top_params(trained.model, 2))), float(loss(best)), rtol=1e-5)
    # LoRA changes only the adapted blocks' projections: the rest of the exported model is the start's
    for name, value in scorer.model.layers.arrays().items():
        if name not in ("q", "k", "v", "o", "gate", "up", "down"):
            np.testing.assert_array_equal(np.asarray(trained.model.layers.arrays()[name]), np.asarray(value))
    np.testing.assert_array_equal(np.asarray(trained.model.layers.arrays()["q"][:-2]),
                                  np.asarray(scorer.model.layers.arrays()["q"][:-2]))

    # the exported model, loaded by name of its folder, scores the test split in eval as in training
    run_eval(str(out / "model"), [f"jsonl:{out / 'data' / 'test.jsonl'}"], ["dcs-letters"], out / "eval",
             progress=False, option_order="source")  # the data file's options are shuffled already
    records = [json.loads(line) for line in next((out / "eval").rglob("dcs-letters.jsonl")).read_text().splitlines()]
    by_id = {r["id"]: r for r in records}  # eval writes shortest item first; the features follow the file
    ids = [json.loads(line)["id"] for line in (out / "data" / "test.jsonl").read_text().splitlines()]
    logits = np.load(out / "runs" / "lora" / "t0.5" / "dcs+ce-seed0" / "test_logits.npy")
    test_set = load_features(out / "features" / "top2" / "test.npz")
    probs = np.asarray(distributions(logits, test_set).probs)
    assert len(ids) == len(probs) == len(records)
    for row, item_id in zip(probs, ids):
        np.testing.assert_allclose(row[:len(by_id[item_id]["probs"])], by_id[item_id]["probs"], atol=2e-5)
    want = results["by_split"]["test"]["0.5"]["policies"]["dcs+ce (lora)"]["metrics"]["dcs"][0]
    assert want == pytest.approx(np.mean([r["dcs"] for r in records]), abs=1e-4)


def test_lora_starts_at_the_base_model_and_trains_only_its_factors():
    """B = 0 at the start: the adapted weights are the base weights exactly; a nonzero pair adds
    (alpha / r) a @ b to each projection, reshaped to its [in..., out...] layout."""
    from dcsjax.training.train import adapted, init_trainable

    scorer = scorer_for(SMOL)
    base = top_params(scorer.model, 2)
    cfg = TrainConfig(adapter="lora", lora_rank=4, lora_alpha=8.0)
    lora = init_trainable(cfg, base)
    assert set(lora["lora"]) == {"q", "k", "v", "o", "gate", "up", "down"}
    for name, value in adapted(cfg, lora, base)["layers"].items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(base["layers"][name]))
    o = base["layers"]["o"]  # [2, heads, head_dim, embed]: its input is heads x head_dim
    assert lora["lora"]["o"]["a"].shape == (2, o.shape[1] * o.shape[2], 4) and lora["lora"]["o"]["b"].shape == (2, 4, o.shape[3])
    pair = {"a": lora["lora"]["o"]["a"], "b": jax.numpy.ones_like(lora["lora"]["o"]["b"])}
    moved = adapted(cfg, {"lora": {"o": pair}}, base)["layers"]["o"]
    want = np.asarray(o) + 2.0 * np.einsum("lir,lro->lio", np.asarray(pair["a"]), np.ones((2, 4, o.shape[3]))).reshape(o.shape)
    np.testing.assert_allclose(np.asarray(moved), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_factored_lora_step_equals_the_merged_weights(small_features):
    """The training step keeps each LoRA update apart from its weight (`LowRank`: x W + x a b, no
    weight-sized gradient); its loss and its gradients for a and b equal those through the merged weights
    W + a b, on two real blocks with a nonzero update."""
    from dcsjax.training.train import adapted, arm_loss, init_trainable, letter_logits

    scorer = scorer_for(SMOL)
    base, data = top_params(scorer.model, 2), small_features["train"]
    cfg = TrainConfig(arm="dcs+ce", adapter="lora", lora_rank=4, lora_alpha=8.0)
    lora = init_trainable(cfg, base)
    key = jax.random.PRNGKey(1)
    lora = {"lora": {name: {"a": pair["a"], "b": 0.02 * jax.random.normal(jax.random.fold_in(key, i), pair["b"].shape)}
                     for i, (name, pair) in enumerate(sorted(lora["lora"].items()))}}
    rows = np.arange(8)
    arrays = data.batch(rows)

    def loss(params, factored):
        logits = letter_logits(scorer.config, adapted(cfg, params, base, factored), scorer.model.output_embedding,
                               *arrays.inputs)
        return arm_loss(cfg, logits, *arrays.targets, np.zeros(arrays.letters.shape, np.float32), 10.0)[0]

    (merged, g_merged), (factored, g_factored) = (jax.jit(jax.value_and_grad(loss), static_argnums=1)(lora, f)
                                                  for f in (False, True))
    assert float(factored) == pytest.approx(float(merged), abs=1e-5)
    for a, b in zip(jax.tree.leaves(g_factored), jax.tree.leaves(g_merged)):
        scale = float(np.abs(np.asarray(b)).max())
        assert scale > 0 and np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-3 * scale


@pytest.mark.slow
def test_blocks_under_checkpoint_keep_the_gradients_and_shrink_the_step_memory(small_splits, monkeypatch):
    """`REMAT_BLOCKS`: the backward pass recomputes each block instead of keeping its activations. Same loss
    and gradients (LoRA on 6 real blocks), and XLA's memory analysis of the compiled gradient shows the
    temporaries shrink (the reason: a LoRA step over all 30 SmolLM2 blocks held 7.6 GB without it)."""
    import dcsjax.training.train as training
    from dcsjax.training.train import adapted, arm_loss, init_trainable, letter_logits

    scorer = scorer_for(SMOL)
    data = letter_features(scorer, small_splits["train"][:8], 6)
    base = top_params(scorer.model, 6)
    cfg = TrainConfig(arm="dcs+ce", adapter="lora", lora_rank=4, lora_alpha=8.0)
    key = jax.random.PRNGKey(2)
    lora = {"lora": {name: {"a": pair["a"], "b": 0.02 * jax.random.normal(jax.random.fold_in(key, i), pair["b"].shape)}
                     for i, (name, pair) in enumerate(sorted(init_trainable(cfg, base)["lora"].items()))}}
    arrays = data.batch(np.arange(len(data)))

    def loss(params):
        logits = letter_logits(scorer.config, adapted(cfg, params, base, True), scorer.model.output_embedding,
                               *arrays.inputs)
        return arm_loss(cfg, logits, *arrays.targets, np.zeros(arrays.letters.shape, np.float32), 10.0)[0]

    out, memory = {}, {}
    for remat in (False, True):
        monkeypatch.setattr(training, "REMAT_BLOCKS", remat)
        step = jax.jit(jax.value_and_grad(loss))
        memory[remat] = step.lower(lora).compile().memory_analysis().temp_size_in_bytes
        out[remat] = step(lora)
    assert float(out[True][0]) == pytest.approx(float(out[False][0]), abs=1e-5)  # float32 rounding: XLA fuses the recomputed forward differently
    for a, b in zip(jax.tree.leaves(out[True][1]), jax.tree.leaves(out[False][1])):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-4 * float(np.abs(np.asarray(b)).max())
    assert memory[True] < 0.5 * memory[False], memory


def test_low_rank_update_gradients_equal_autodiff_of_the_plain_product():
    """`decoder.low_rank_update` writes its gradients out (so XLA transposes only the small factors); they
    equal autodiff's through (x a) b for x, a and b."""
    from dcsjax.nn.decoder import low_rank_update

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    x, a, b = (jax.random.normal(k, s) for k, s in zip(keys, [(48, 20), (20, 4), (4, 12)]))
    g = jax.random.normal(keys[3], (48, 12))
    value = lambda f: lambda x, a, b: (f(x, a, b) * g).sum()  # noqa: E731
    ours = jax.grad(value(low_rank_update), argnums=(0, 1, 2))(x, a, b)
    plain = jax.grad(value(lambda x, a, b: (x @ a) @ b), argnums=(0, 1, 2))(x, a, b)
    np.testing.assert_allclose(np.asarray(low_rank_update(x, a, b)), np.asarray((x @ a) @ b), rtol=1e-5, atol=1e-5)
    for mine, want in zip(ours, plain):
        assert mine.shape == want.shape
        np.testing.assert_allclose(np.asarray(mine), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_accumulated_micro_batches_make_the_same_update_as_one_batch(small_features):
    """The jitted step with two micro-batches of 4 == one batch of the same 8 items (per-item mean loss),
    read through plain SGD with rate 1, whose update is the gradient itself."""
    import optax

    from dcsjax.training.train import _train_step, step_settings

    scorer = scorer_for(SMOL)
    data = small_features["train"]
    params = top_params(scorer.model, 2)
    sgd = optax.sgd(1.0)
    updated = {}
    for accumulate, batch, layout in ((2, 4, "packed"), (1, 8, "packed"), (1, 8, "batch")):
        cfg = TrainConfig(arm="dcs", batch_size=batch, accumulate=accumulate)
        idx = np.arange(8).reshape(accumulate, batch)
        arrays = getattr(data, layout)(idx)  # prompts packed several to a row (training's), or one a row
        static, weights = step_settings(cfg)
        updated[accumulate, layout], _, _ = _train_step(
            scorer.config, static, sgd, weights, params, sgd.init(params), params, scorer.model.output_embedding,
            arrays, np.zeros((accumulate, batch, data.letters.shape[1]), np.float32), data.lw[idx], 0.0)
    moved = 0.0
    for before, a, b, c in zip(*(jax.tree.leaves(p) for p in (params, updated[2, "packed"], updated[1, "packed"],
                                                                updated[1, "batch"]))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)  # summation order
        np.testing.assert_allclose(np.asarray(c), np.asarray(b), rtol=1e-5, atol=1e-5)
        moved = max(moved, float(np.abs(np.asarray(a) - np.asarray(before)).max()))
    assert moved > 1e-4  # the step did move the parameters


@pytest.mark.slow
def test_the_training_step_on_a_mesh_equals_one_device():
    """The same `train` on meshes of 8 simulated CPU devices (batch over `data`, heads, MLP width and
    vocabulary over `model`) as on one device, 4 updates that move the weights: the top adapter and LoRA on
    2x4 (mesh_training_check.py says why); parameters, training losses and dev scores within
    1e-5 (a process of its own: the device count is fixed when jax starts)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("mesh_training_check.py"))], env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(result))
    assert result["devices"] == 8
    for adapter, meshes in (("top", ("2x4",)), ("lora", ("2x4",))):
        r = result[adapter]
        assert r["moved"] > 1e-3  # the updates did move the weights, far beyond the tolerance
        for mesh in meshes:
            assert r[mesh]["param_diff"] < 1e-5 and r[mesh]["dev_score_diff"] < 1e-5 and r[mesh]["loss_diff"] < 1e-5, r
        assert r["2x4"]["up_sharding"] == "P(None, None, 'model')"  # the MLP width split four ways
        # one compiled update a run: the state starts placed as the update returns it (no recompile at step 2)
        assert r["compiles"] == {"one": 1, "2x4": 1}, r["compiles"]


def test_the_experiment_grid_names_every_run_once():
    """`run_grid`: CE once per seed (it has no threshold), each DCS arm at each threshold and seed, LoRA with its
    own seeds, updates and thresholds; every run its own folder; the export candidate is each adapter's first seed."""
    from pathlib import Path

    from dcsjax.training.experiment import run_grid

    grid = run_grid(TrainConfig(), ["top", "lora"], ["ce", "dcs+ce"], [0.25, 0.5], [0, 1], lora_seeds=[3],
                    lora_steps=7, lora_thresholds=[0.5])
    top = [(s.arm, s.t, s.seed) for s in grid if s.adapter == "top"]
    assert top == [("ce", None, 0), ("ce", None, 1), ("dcs+ce", 0.25, 0), ("dcs+ce", 0.25, 1), ("dcs+ce", 0.5, 0),
                   ("dcs+ce", 0.5, 1)]
    lora = [s for s in grid if s.adapter == "lora"]
    assert [(s.arm, s.t, s.seed, s.cfg.steps) for s in lora] == [("ce", None, 3, 7), ("dcs+ce", 0.5, 3, 7)]
    assert [s.cfg.lw for s in grid if s.arm == "dcs+ce"] == pytest.approx([1 / 3, 1 / 3, 1.0, 1.0, 1.0])
    assert len({s.folder(Path("out")) for s in grid}) == len(grid)
    assert [(s.arm, s.seed) for s in grid if s.first_seed] == [("ce", 0), ("dcs+ce", 0), ("dcs+ce", 0), ("ce", 3), ("dcs+ce", 3)]


@pytest.mark.slow
def test_a_prompt_past_the_blockwise_threshold_gives_the_letters_elicitation_of_eval():
    """MMLU's longest questions give training prompts of more than 1,024 tokens, which attend through the
    blockwise path in whole tiles: cached frozen layers + the top layer equal eval's letter distribution there
    too (the tiny random-weight decoder: the path, not the weights, is what is checked)."""
    from conftest import tiny_scorer

    scorer = tiny_scorer()
    long = Item("long/0", "Read the passage. " + "The river rose and the town moved uphill. " * 120 + "Why?",
                ("Floods", "Drought", "War", "Trade"), (0,))
    short = Item("short/0", "Which is a fruit?", ("car", "apple", "stone"), (1,))
    items = [long, short]
    features = letter_features(scorer, items, 1)
    assert features.batch([0])[0].shape[1] % 512 == 0 and int(np.max(features.length)) > 1024
    params = top_params(scorer.model, 1)
    probs = np.asarray(distributions(predict_logits(scorer.config, params, scorer.model.output_embedding, features),
                                     features).probs)
    for row, record in zip(probs, run_dcs_letters(scorer, items)):
        np.testing.assert_allclose(row[:len(record["probs"])], record["probs"], atol=2e-5)

