"""Paper 000's results about DCS, as property tests of the engine's DCS kernel (hypothesis draws the
distributions and loadings), and a worked example of DCS not being a proper scoring rule."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dcsjax.metrics.dcs import dcs, dcs_parts, loadings_from_threshold

probability = st.floats(0.0, 1.0, allow_nan=False)
loading = st.floats(0.05, 20.0, allow_nan=False)


@st.composite
def distributions(draw, max_options=8):
    """An item: K answer options (one correct) plus an IDK option, and a distribution over all K + 1."""
    k = draw(st.integers(2, max_options))
    weights = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=k + 1, max_size=k + 1)), np.float64)
    if weights.sum() == 0:
        weights[0] = 1.0
    probs = weights / weights.sum()
    correct = draw(st.integers(0, k - 1))
    return probs, correct


def engine_dcs(probs, correct, lc=1.0, lw=1.0):
    """DCS of one item through the batched kernel: the IDK option is the last entry."""
    k = len(probs)
    correct_mask = np.zeros((1, k), bool)
    correct_mask[0, correct] = True
    idk = np.zeros((1, k), bool)
    idk[0, -1] = True
    parts = dcs_parts(np.asarray(probs, np.float32)[None], correct_mask, idk, np.ones((1, k), bool), lc, lw)
    return float(parts["dcs"][0])


@settings(max_examples=300, deadline=None)
@given(distributions())
def test_theorem1_bounded_at_default_loadings(item):
    probs, correct = item
    assert -1.0 - 1e-6 <= engine_dcs(probs, correct) <= 1.0 + 1e-6


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), loading, loading)
def test_theorem1_ordering_of_epistemic_states(k, lc, lw):
    """confident-incorrect < honest abstention < confident-correct, at any positive loadings."""
    def one_hot(i):
        p = np.zeros(k + 1)
        p[i] = 1.0
        return p
    incorrect, abstain, correct = engine_dcs(one_hot(1), 0, lc, lw), engine_dcs(one_hot(k), 0, lc, lw), \
        engine_dcs(one_hot(0), 0, lc, lw)
    assert incorrect < abstain < correct
    assert abstain == 0.0 and np.isclose(incorrect, -lw, rtol=1e-6) and np.isclose(correct, lc, rtol=1e-6)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.001, 0.999), st.floats(0.5, 0.95))
def test_corollary1_hedging_toward_idk_beats_hedging_toward_errors(pc, t):
    """At equal pc in (0, 1), the rest of the mass on IDK scores strictly above the rest on wrong options,
    at default loadings and at every threshold loading t >= 0.5 (lw >= lc)."""
    for lc, lw in [(1.0, 1.0), loadings_from_threshold(t)]:
        error_hedging = np.array([pc, 1 - pc, 0.0])
        abstention_hedging = np.array([pc, 0.0, 1 - pc])
        assert engine_dcs(abstention_hedging, 0, lc, lw) > engine_dcs(error_hedging, 0, lc, lw)


def test_corollary1_needs_lw_at_least_lc_times_pc():
    """Found while testing: with lc > lw (which the paper's definition allows) the ordering reverses once
    pc > lw/lc. lc = 1, lw = 0.5, pc = 0.8: error-hedging 0.8 - 0.5*0.2 = 0.70, abstention-hedging 0.8*0.8 = 0.64.
    In general abstention-hedging wins exactly when lw > lc * pc."""
    assert np.isclose(engine_dcs([0.8, 0.2, 0.0], 0, 1.0, 0.5), 0.70, atol=1e-6)
    assert np.isclose(engine_dcs([0.8, 0.0, 0.2], 0, 1.0, 0.5), 0.64, atol=1e-6)


@settings(max_examples=300, deadline=None)
@given(probability, loading, loading)
def test_proposition1_optimal_guessing_threshold(p, lc, lw):
    """An agent whose belief that its best option is right is p gains, in expectation, by answering (all
    mass on that option) rather than abstaining (all mass on IDK) exactly when p > lw / (lc + lw)."""
    answer = p * engine_dcs([1.0, 0.0, 0.0], 0, lc, lw) + (1 - p) * engine_dcs([1.0, 0.0, 0.0], 1, lc, lw)
    abstain = engine_dcs([0.0, 0.0, 1.0], 0, lc, lw)
    threshold = lw / (lc + lw)
    if abs(p - threshold) > 1e-5:
        assert (answer > abstain) == (p > threshold)


@given(st.floats(0.01, 0.99))
def test_threshold_loadings_put_the_guessing_threshold_at_t(t):
    lc, lw = loadings_from_threshold(t)
    assert np.isclose(lw / (lc + lw), t)


def test_dcs_is_not_a_proper_scoring_rule():
    """Belief q = (.6, .3, .1) over three options, nothing on IDK. Reporting q truthfully earns, in
    expectation, sum_i q_i (q_i - (1 - q_i)) = 2 * 0.46 - 1 = -0.08; putting all mass on the first option earns
    0.6 - 0.4 = +0.20. Over a grid of every report on the simplex (options + IDK) the best expected score sits
    at that vertex: DCS rewards committing (or abstaining), not reporting one's belief."""
    q = np.array([0.6, 0.3, 0.1])

    def expected(report):
        return sum(q[i] * float(dcs(report[i], 1 - report[i] - report[3], report[3])) for i in range(3))

    truthful = expected(np.array([*q, 0.0]))
    assert np.isclose(truthful, -0.08, atol=1e-9)
    grid = np.linspace(0, 1, 21)
    reports = [np.array([a, b, c, 1 - a - b - c]) for a in grid for b in grid for c in grid if a + b + c <= 1 + 1e-9]
    best = max(reports, key=expected)
    assert np.allclose(best, [1, 0, 0, 0]) and np.isclose(expected(best), 0.20)
    assert truthful < expected(best) and truthful < expected(np.array([0, 0, 0, 1.0]))  # even below abstaining
