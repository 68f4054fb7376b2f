"""Calibration companions and bootstrap intervals against scikit-learn and hand-worked examples."""

import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import brier_score_loss
from test_dcs import numpy_dcs

from dcsjax.metrics import (
    DEFAULT_THRESHOLDS,
    Distributions,
    aurc,
    bootstrap_ci,
    brier_score,
    ece,
    loading_spectrum,
    mean_ci,
    paired_bootstrap,
    risk_coverage,
    selective_accuracy,
    ternary_score,
)


def batch(rows, correct, width=None):
    """Distributions from rows of probabilities whose last entry is IDK; correct: index per row."""
    width = width or max(map(len, rows))
    n = len(rows)
    probs = np.zeros((n, width), np.float32)
    corr, idk, valid = (np.zeros((n, width), bool) for _ in range(3))
    for i, (p, c) in enumerate(zip(rows, correct)):
        probs[i, :len(p)] = p
        valid[i, :len(p)] = True
        corr[i, c] = True
        idk[i, len(p) - 1] = True
    return Distributions(*map(jnp.asarray, (probs, corr, idk, valid)))


# Five items, two options and IDK. Forced answer (best option, IDK excluded) and its confidence:
# .92 right, .85 wrong, .62 right, .22 right, .35 wrong.
WORKED = batch([[0.92, 0.03, 0.05], [0.85, 0.10, 0.05], [0.28, 0.62, 0.10], [0.22, 0.08, 0.70], [0.25, 0.35, 0.40]],
               [0, 1, 1, 0, 0])


def test_brier_matches_scikit_learn_on_ragged_items():
    rng = np.random.default_rng(0)
    groups = []  # (rows, labels) of items with the same number of options, for scikit-learn
    for k in (3, 5):
        rows = rng.dirichlet(np.ones(k), size=40)
        labels = rng.integers(0, k, 40)  # label k-1 is IDK: an unanswerable item
        groups.append((rows, labels))
    ours = float(brier_score(batch([r for g in groups for r in g[0]], [c for g in groups for c in g[1]])))
    reference = sum(len(rows) * brier_score_loss(labels, rows, labels=list(range(rows.shape[1])))
                    for rows, labels in groups) / 80
    assert ours == pytest.approx(reference, abs=1e-6)


def test_brier_merges_several_correct_options_into_one_class():
    d = Distributions(*map(jnp.asarray, ([[0.4, 0.3, 0.2, 0.1]], [[True, True, False, False]],
                                         [[False, False, False, True]], [[True] * 4])))
    assert float(brier_score(d)) == pytest.approx((1 - 0.7) ** 2 + 0.2 ** 2 + 0.1 ** 2)


def test_ece_worked_examples():
    # 10 equal-width bins: every item alone in its bin; sum of |hit - confidence| / 5.
    assert float(ece(WORKED)) == pytest.approx((0.08 + 0.85 + 0.38 + 0.78 + 0.35) / 5, abs=1e-6)
    # 4 bins: {.92, .85} share [.75, 1]: |1 - 1.77| ; .62 -> .38 ; .35 -> .35 ; .22 -> .78.
    assert float(ece(WORKED, bins=4)) == pytest.approx((0.77 + 0.38 + 0.35 + 0.78) / 5, abs=1e-6)
    # 2 equal-mass bins by rank: {.22, .35, .62} (2 right) and {.85, .92} (1 right).
    assert float(ece(WORKED, bins=2, scheme="mass")) == pytest.approx((abs(2 - 1.19) + abs(1 - 1.77)) / 5, abs=1e-6)
    with pytest.raises(ValueError, match="binning"):
        ece(WORKED, scheme="quantile")


def test_risk_coverage_and_aurc_worked_example():
    coverage, risk = risk_coverage(WORKED)
    # by confidence: .92 right, .85 wrong, .62 right, .35 wrong, .22 right
    np.testing.assert_allclose(coverage, [0.2, 0.4, 0.6, 0.8, 1.0], atol=1e-7)
    np.testing.assert_allclose(risk, [0, 1 / 2, 1 / 3, 2 / 4, 2 / 5], atol=1e-7)
    assert float(aurc(WORKED)) == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4 + 2 / 5) / 5, abs=1e-6)
    assert float(selective_accuracy(WORKED, 0.4)) == pytest.approx(0.5)
    assert float(selective_accuracy(WORKED, 0.5)) == pytest.approx(2 / 3)  # ceil(2.5) = 3 items


def test_ternary_score_worked_example():
    # choices (options and IDK): right, wrong, right, IDK, IDK
    assert float(ternary_score(WORKED, 0.5)) == pytest.approx((1 - 1 + 1) / 5)
    assert float(ternary_score(WORKED, 0.75)) == pytest.approx((1 - 3 + 1) / 5)


def test_loading_spectrum_matches_numpy_dcs():
    rng = np.random.default_rng(1)
    rows = [rng.dirichlet(np.ones(k)) for k in rng.integers(3, 7, 30)]
    labels = [int(rng.integers(0, len(r))) for r in rows]
    spectrum = np.asarray(loading_spectrum(batch(rows, labels), DEFAULT_THRESHOLDS))
    for t, value in zip(DEFAULT_THRESHOLDS, spectrum):
        lw = t / (1 - t)
        reference = np.mean([numpy_dcs(r, [c], len(r) - 1, 1.0, lw) for r, c in zip(rows, labels)])
        assert value == pytest.approx(reference, abs=1e-5)
    assert np.all(np.diff(spectrum) <= 0)  # a dearer error never raises the score


def test_bootstrap_interval_of_a_mean_matches_normal_theory():
    x = np.random.default_rng(2).normal(size=2000)
    interval = mean_ci(x, n_boot=2000)
    half = 1.96 * x.std() / np.sqrt(len(x))
    assert interval.estimate == pytest.approx(x.mean(), abs=1e-6)
    assert interval.low == pytest.approx(x.mean() - half, abs=0.15 * half)
    assert interval.high == pytest.approx(x.mean() + half, abs=0.15 * half)
    assert mean_ci(x) == mean_ci(x) and mean_ci(x, seed=1) != mean_ci(x)


def test_bootstrap_of_a_non_mean_statistic_resamples_items():
    interval = bootstrap_ci(aurc, WORKED, n_boot=500)
    assert interval.low < interval.estimate < interval.high
    assert interval.estimate == pytest.approx(float(aurc(WORKED)))


def test_paired_bootstrap():
    rng = np.random.default_rng(3)
    shared = rng.normal(size=300)  # what the items share (their difficulty) cancels when paired
    a, b = shared + 0.1 + 0.05 * rng.normal(size=300), shared
    paired = paired_bootstrap(jnp.mean, a, b)
    assert paired.difference == pytest.approx(np.mean(a - b), abs=1e-6)
    assert paired.low < paired.difference < paired.high and paired.p_value < 0.01
    unpaired_half = 1.96 * np.hypot(a.std(), b.std()) / np.sqrt(300)
    assert paired.high - paired.low < 0.2 * (2 * unpaired_half)
    same = paired_bootstrap(jnp.mean, a, a)
    assert (same.difference, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap(jnp.mean, a, b[:10])


def test_abstention_metrics_worked_example():
    """Four items, options A, B and IDK (last). Chosen entries: item 0 answers right, item 1 answers wrong,
    item 2 abstains though answerable, item 3 (unanswerable) abstains."""
    from dcsjax.metrics.calibration import ABSTENTION_METRICS

    probs = jnp.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.3, 0.2, 0.5], [0.1, 0.2, 0.7]])
    correct = jnp.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], bool)
    idk = jnp.array([[0, 0, 1]] * 4, bool)
    d = Distributions(probs, correct, idk, jnp.ones((4, 3), bool))
    got = {name: float(f(d)) for name, f in ABSTENTION_METRICS.items()}
    dcs = [(0.7 - 0.2) * 0.9, (0.2 - 0.5) * 0.7, (0.2 - 0.3) * 0.5, (0.0 - 0.3) * 0.3]
    assert got["dcs"] == pytest.approx(np.mean(dcs), abs=1e-6)
    assert got["accuracy"] == pytest.approx(1 / 3)  # of the three answerable items, one answered right
    assert got["coverage"] == pytest.approx(2 / 4)
    assert got["abstain_unanswerable"] == pytest.approx(1.0)
    assert got["over_abstention"] == pytest.approx(1 / 3)
    assert got["accuracy_answered"] == pytest.approx(1 / 2)  # items 0 and 1 answered, one right
    assert got["truthfulness"] == pytest.approx((1 - 1 + 0 + 0) / 4)  # right, wrong, abstained, abstained
    # forced answers: A (0.7, right), B (0.5, wrong), A (0.3, wrong), B (0.2, wrong); AP = precision at the one hit
    assert got["ap"] == pytest.approx(1.0)


def test_average_precision_equals_scikit_learns_with_ties():
    """AP of the forced answer's confidence against its correctness, against scikit-learn on random distributions
    whose confidences repeat (rounded to tenths, so thresholds are shared)."""
    from sklearn.metrics import average_precision_score

    from dcsjax.metrics.calibration import average_precision, forced_answer

    rng = np.random.default_rng(3)
    for trial in range(21):
        n = (5, 17, 39)[trial % 3]  # three sizes: three compiles
        raw = np.round(rng.dirichlet(np.ones(4), n), 1) + 1e-3
        probs = jnp.asarray(raw / raw.sum(1, keepdims=True), jnp.float32)
        correct = np.zeros((n, 4), bool)
        correct[np.arange(n), rng.integers(0, 4, n)] = True
        d = Distributions(probs, jnp.asarray(correct), jnp.asarray(np.tile([0, 0, 0, 1], (n, 1)).astype(bool)),
                          jnp.ones((n, 4), bool))
        confidence, hit = (np.asarray(x) for x in forced_answer(d))
        if hit.any():
            assert float(average_precision(d)) == pytest.approx(average_precision_score(hit, confidence), abs=1e-6)
        else:
            assert float(average_precision(d)) == 0.0
