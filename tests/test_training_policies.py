"""Answer-or-abstain policies and their scores at a target threshold t, against brute force and hand-worked
cases: the post-hoc threshold tuned on dev, the model's own choice, the metrics by construction, the paired
interval. Pure numpy on made-up distributions (no model): what is checked is the arithmetic."""

import numpy as np
import pytest

from dcsjax.metrics.dcs import dcs, loadings_from_threshold, option_masses
from dcsjax.metrics.calibration import Distributions
from dcsjax.training.policies import (
    ABSTAIN, forced, gains, metrics_of, outcomes, own_choice, paired, summarise, thresholded, tune_threshold,
)


def dists(probs, correct, idk_index):
    """Rows of [options..., IDK] (IDK at idk_index), padded to the widest row, through the records reader."""
    return Distributions.from_records([{"probs": list(map(float, p)), "correct_options": list(np.atleast_1d(c)),
                                        "idk_index": k} for p, c, k in zip(probs, correct, idk_index)])


def random_dists(n, seed):
    rng = np.random.default_rng(seed)
    probs, correct, idk = [], [], []
    for _ in range(n):
        k = int(rng.integers(3, 6))
        p = rng.dirichlet(np.full(k, 0.5))
        probs.append(np.round(p, 2) / np.round(p, 2).sum())  # rounding makes ties
        idk.append(k - 1)
        correct.append(int(rng.integers(0, k)))  # IDK correct: an unanswerable item
    return dists(probs, correct, idk)


def test_own_choice_abstains_where_idk_is_most_probable_and_forced_skips_idk():
    d = dists([[0.2, 0.1, 0.7], [0.5, 0.2, 0.3], [0.3, 0.3, 0.1, 0.3]], [[0], [0], [3]], [2, 2, 3])
    np.testing.assert_array_equal(own_choice(d), [ABSTAIN, 0, 0])  # a tie goes to the first entry
    pick, confidence = forced(d)
    np.testing.assert_array_equal(pick, [0, 0, 0])
    np.testing.assert_allclose(confidence, [0.2, 0.5, 0.3], atol=1e-6)  # IDK's mass stays in the distribution


@pytest.mark.parametrize("t", [0.25, 0.5, 0.75])
def test_tuned_threshold_is_the_best_of_every_threshold_on_dev(t):
    """Brute force over every candidate (each dev confidence, and abstaining everywhere): none beats the
    tuned one, and it is a cut a threshold can make (ties in confidence are answered together)."""
    _, lw = loadings_from_threshold(t)
    for seed in range(5):
        d = random_dists(60, seed)
        tau = tune_threshold(d, lw)
        best = gains(d, thresholded(d, tau), lw).sum()
        _, confidence = forced(d)
        for candidate in [np.inf, *np.unique(confidence)]:
            assert gains(d, thresholded(d, candidate), lw).sum() <= best + 1e-9
        assert tau == np.inf or tau in confidence


def test_gains_and_metrics_by_hand():
    """Four items at t = 0.75 (lw = 3): answered right, answered wrong, abstained on an item whose right
    option was removed, answered an item unanswerable by its wording."""
    d = dists([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.7, 0.2, 0.1]],
              [[0], [1], [2], [2]], [2, 2, 2, 2])
    _, lw = loadings_from_threshold(0.75)
    answers = own_choice(d)
    np.testing.assert_array_equal(answers, [0, 0, ABSTAIN, 0])
    np.testing.assert_allclose(gains(d, answers, lw), [1.0, -3.0, 0.0, -3.0])
    kind = np.array(["answerable", "answerable", "option removed", "wording"])
    o = outcomes([d], [answers], lw, soft=True)
    m = {k: float(v[0]) for k, v in metrics_of(o, kind).items()}
    assert m["score"] == pytest.approx(-5.0 / 4)
    assert m["coverage"] == pytest.approx(3 / 4) and m["selective_accuracy"] == pytest.approx(1 / 3)
    assert m["abstain_removed"] == 1.0 and m["abstain_wording"] == 0.0 and m["over_abstention"] == 0.0
    want = np.mean(np.asarray(dcs(*option_masses(*d), 1.0, lw)))
    assert m["dcs"] == pytest.approx(float(want), abs=1e-6)
    # a thresholded policy has no distribution of its own: its DCS column is empty, not made up
    o_tau = outcomes([d], [thresholded(d, 0.95)], lw, soft=False)
    assert np.isnan(metrics_of(o_tau, kind)["dcs"][0])
    # abstaining everywhere scores 0 and has no accuracy when answering (not an accuracy of 0)
    o_none = outcomes([d], [thresholded(d, np.inf)], lw, soft=False)
    assert metrics_of(o_none, kind)["score"][0] == 0.0 and np.isnan(metrics_of(o_none, kind)["selective_accuracy"][0])
    assert summarise(o_tau, kind, np.zeros((10, 4), int))["dcs"] == [None, None, None]


def test_seeds_pool_and_the_paired_interval_resamples_the_same_items():
    d = random_dists(200, 0)
    _, lw = loadings_from_threshold(0.5)
    a = outcomes([d, d], [own_choice(d), thresholded(d, 0.4)], lw, soft=False)
    b = outcomes([d], [thresholded(d, np.inf)], lw, soft=False)  # abstains everywhere: scores 0
    kind = np.array(["answerable"] * 200)
    pooled = metrics_of(a, kind)["score"][0]
    assert pooled == pytest.approx((gains(d, own_choice(d), lw).mean() + gains(d, thresholded(d, 0.4), lw).mean()) / 2)
    idx = np.random.default_rng(1).integers(0, 200, (500, 200))
    diff, low, high, below = paired(a, b, idx)
    assert diff == pytest.approx(pooled) and low < diff < high
    same = paired(a, a, idx)
    assert same[:3] == [0.0, 0.0, 0.0] and same[3] == 1.0


def test_the_dcs_trained_arm_gets_the_baselines_threshold_tuned_on_its_own_dev():
    """`threshold_results`: the DCS-trained + threshold arm's tau is, for each seed's run, the best of every
    threshold on that run's dev split by brute force (the baselines' rule), its decisions those of that tau;
    every arm, thresholded or not, has the distributional DCS of its model."""
    from dcsjax.training.experiment import threshold_results

    t = 0.75
    _, lw = loadings_from_threshold(t)
    start = {"dev": random_dists(40, 0), "test": random_dists(30, 1)}
    runs = [{"dev": random_dists(40, 10 + s), "test": random_dists(30, 20 + s)} for s in range(2)]
    ce = [{"dev": random_dists(40, 30), "test": random_dists(30, 31)}]
    kind = np.array(["answerable"] * 30)
    models = {("top", "dcs+ce", t): runs, ("top", "ce", None): ce}
    entry = threshold_results(t, start, models, "test", kind, n_boot=20)
    for run, tau in zip(runs, entry["policies"]["dcs+ce+tau"]["tau"]):
        _, confidence = forced(run["dev"])
        best = max(gains(run["dev"], thresholded(run["dev"], c), lw).sum() for c in [np.inf, *np.unique(confidence)])
        assert gains(run["dev"], thresholded(run["dev"], tau), lw).sum() == pytest.approx(best)
    taus = entry["policies"]["dcs+ce+tau"]["tau"]
    score = np.mean([gains(r["test"], thresholded(r["test"], x), lw) for r, x in zip(runs, taus)])
    assert entry["policies"]["dcs+ce+tau"]["metrics"]["score"][0] == pytest.approx(score)
    assert entry["policies"]["dcs+ce+tau"]["metrics"]["dcs"] == entry["policies"]["dcs+ce"]["metrics"]["dcs"]
    assert entry["policies"]["ce+tau"]["metrics"]["dcs"][0] is not None
    assert {"dcs+ce+tau - start+tau", "dcs+ce+tau - ce+tau", "dcs+ce - ce+tau"} <= set(entry["paired"])


@pytest.mark.parametrize("t", [0.25, 0.75])
def test_the_uniform_answerer_is_every_choice_averaged_and_its_dcs_evals_chance_reference(t):
    """The training tables' chance row: its metrics are the average over every entry an item presents (each
    option answered, IDK abstaining), worked out by enumeration; its distributional DCS per item is the closed
    form `dcsjax eval` prints as the uniform reference (`eval.run.chance_uniform`)."""
    from dcsjax.eval.run import chance_uniform
    from dcsjax.training.policies import uniform_answerer

    d = random_dists(40, seed=3)
    _, lw = loadings_from_threshold(t)
    valid, idk = np.asarray(d.valid), np.asarray(d.idk)
    gain, answered, right = [], [], []
    for i in range(len(valid)):
        entries = [ABSTAIN if idk[i, j] else j for j in np.flatnonzero(valid[i])]
        g = [float(gains(Distributions(*(x[i:i + 1] for x in d)), np.array([a]), lw)[0]) for a in entries]
        gain.append(np.mean(g))
        answered.append(np.mean([a != ABSTAIN for a in entries]))
        right.append(np.mean([x > 0 for x in g]))
    kind = np.array(["answerable"] * 40)
    m = {k: float(v[0]) for k, v in metrics_of(uniform_answerer(d, lw), kind).items()}
    assert m["score"] == pytest.approx(np.mean(gain)) and m["coverage"] == pytest.approx(np.mean(answered))
    assert m["selective_accuracy"] == pytest.approx(np.sum(right) / np.sum(answered))
    records = [{"probs": [0.0] * int(valid[i].sum()), "correct_options": list(np.flatnonzero(np.asarray(d.correct)[i])),
                "idk_index": int(np.flatnonzero(idk[i])[0]), "lc": 1.0, "lw": lw} for i in range(len(valid))]
    assert m["dcs"] == pytest.approx(chance_uniform("dcs", records), abs=1e-6)
