"""The stated-risk training arm of `dcsjax train-abstain` on the real SmolLM2 weights (issue: stated risk,
training for it): each training prompt states a target drawn from the thresholds and the loss reads its loading;
at test the model is told every trained target and one it never saw; and a killed experiment, resumed, gives
the same results as one run straight through."""

import numpy as np
import pytest

from conftest import scorer_for
from dcsjax.data.items import Item
from dcsjax.training.data import abstention_splits
from dcsjax.training.train import TrainConfig, distributions

SMOL = "smollm2-135m-instruct"
TASKS = ("mmlu:miscellaneous", "mmlu:high_school_geography", "mmlu:world_religions", "mmlu:management")
PER_TASK = 5  # train 10, dev 2, in-domain test 8, unseen 20 versions: the smallest split with every part


def test_stated_targets_draw_each_training_target_fixed_by_the_item():
    """The stated-risk arm's targets: each item's drawn from the thresholds by its id (not its place in the list,
    nor the run), every target about equally often."""
    from dcsjax.training.data import stated_targets

    items = [Item(f"q/{i}", "?", ("a", "b", "c"), (0,)) for i in range(900)]
    targets = stated_targets(items, (0.25, 0.5, 0.75))
    assert targets == stated_targets(items, [0.25, 0.5, 0.75])
    assert stated_targets(items[::-1], (0.25, 0.5, 0.75)) == targets[::-1]
    counts = {t: targets.count(t) for t in (0.25, 0.5, 0.75)}
    assert sum(counts.values()) == 900 and all(250 < n < 350 for n in counts.values()), counts
    assert stated_targets(items, (0.25, 0.5, 0.75), seed=1) != targets


@pytest.mark.slow
def test_the_stated_risk_arm_is_told_each_target_and_a_killed_experiment_resumes_to_the_same_table(
        tmp_path, monkeypatch):
    """The stated-risk arm (one DCS + CE model, each training prompt stating a target drawn from the thresholds and
    its DCS at that target's loadings), told at test every trained target and one it never saw (0.6); the
    starting model told t reads as the stated-risk protocol's letters read-out in eval; its abstention slope
    against np.polyfit over those records. And the experiment killed inside a run, then resumed, gives the same
    results as one run straight through."""
    import shutil

    import dcsjax.training.experiment as experiment
    from dcsjax.errors import Terminated
    from dcsjax.eval.protocols.stated import penalty, run_stated_risk
    from dcsjax.training.data import stated_targets
    from dcsjax.training.experiment import run_experiment
    from dcsjax.training.features import load_features

    splits = abstention_splits(TASKS, per_task=PER_TASK, errors=[])
    assert [len(splits[s]) for s in ("train", "dev", "test", "unseen")] == [10, 2, 8, 20]
    cfg = TrainConfig(steps=6, batch_size=8, eval_every=3, ce_warmup=2, learning_rate=3e-4, patience=10)
    grid = dict(tasks=TASKS, per_task=PER_TASK, arms=("dcs+ce", "stated"), thresholds=(0.25, 0.5),
                stated_thresholds=(0.6,), seeds=(0,), base=cfg, n_boot=50, export_threshold=None, progress=False)
    straight = run_experiment(SMOL, tmp_path / "straight", **grid)

    # the training prompts state each item's drawn target, and the loss reads its loading from there
    features = tmp_path / "straight" / "features" / "top2"
    train_set = load_features(features / "stated-train.npz")
    targets = stated_targets(splits["train"], (0.25, 0.5))
    assert set(targets) == {0.25, 0.5}
    np.testing.assert_allclose(train_set.lw, [penalty(t) for t in targets], rtol=1e-6)
    # the starting model told t = 0.6 (never trained on) reads as eval's stated-risk letters read-out
    scorer = scorer_for(SMOL)
    unseen = splits["unseen"]
    records = run_stated_risk(scorer, unseen, thresholds=(0.25, 0.5, 0.6), readout="letters")
    told = load_features(features / "stated-unseen-t0.6.npz")
    probs = np.asarray(distributions(np.load(features / "start_stated_unseen-t0.6_logits.npy"), told).probs)
    for row, record in zip(probs, records):
        np.testing.assert_allclose(row[:len(record["stated"][2]["probs"])], record["stated"][2]["probs"], atol=2e-5)
    # the slope of its abstention on t, item by item, against numpy's least squares over eval's records
    abstained = np.array([[s["abstained"] for s in r["stated"]] for r in records], float)
    want = np.mean([np.polyfit([0.25, 0.5, 0.6], row, 1)[0] for row in abstained])
    assert straight["abstention_slopes"]["unseen"]["starting model"][0] == pytest.approx(want, abs=1e-6)
    assert set(straight["abstention_slopes"]["unseen"]) == {"starting model", "stated-risk DCS + CE"}
    # scored at every target it is told; paired against the one DCS + CE model per t where there is one
    for split in ("unseen", "test"):
        assert set(straight["by_split"][split]) == {"0.25", "0.5", "0.6"}
        at = {t: straight["by_split"][split][t] for t in ("0.5", "0.6")}
        assert {"stated", "start-stated", "dcs+ce"} <= set(at["0.5"]["policies"])
        assert {"stated", "start-stated"} <= set(at["0.6"]["policies"]) and "dcs+ce" not in at["0.6"]["policies"]
        assert {"stated - dcs+ce", "stated - start+tau"} <= set(at["0.5"]["paired"])
        assert "stated - dcs+ce" not in at["0.6"]["paired"]
    assert "stated-risk DCS + CE, told t = 0.6" in straight["distributions"]["unseen"]

    # killed in the middle of its last run, the stated-risk one (its checkpoint at step 3), then resumed: the
    # features and the finished runs are the straight experiment's, read back
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "straight", killed, ignore=lambda folder, names: [
        n for n in names if n.startswith("stated-seed") or n in ("results.json", "summary.md")])
    real_train = experiment.train

    def dying(model, train_set, dev_set, cfg, folder, *args, **kwargs):
        if folder.name.startswith("stated"):
            real_train(model, train_set, dev_set, cfg, folder, *args, **{**kwargs, "until": 3})
            raise Terminated()
        return real_train(model, train_set, dev_set, cfg, folder, *args, **kwargs)

    monkeypatch.setattr(experiment, "train", dying)
    with pytest.raises(Terminated):
        run_experiment(SMOL, killed, **grid)
    monkeypatch.undo()
    assert not (killed / "results.json").exists()
    resumed = run_experiment(SMOL, killed, **grid)
    for key in ("by_split", "distributions", "abstention_slopes"):
        assert resumed[key] == straight[key], key
    assert (killed / "summary.md").read_text() == (tmp_path / "straight" / "summary.md").read_text()
