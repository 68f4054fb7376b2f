"""Scaling fits on synthetic models drawn from known curves: AIC must find the curve, and the break-even
interval must hold the true crossing."""

import numpy as np
import pytest

from dcsjax.analysis.scaling import FAMILIES, bootstrap_band, break_even, fit_curves

# Distinct shapes over log10 sizes 7.5 to 11 (centred): steady, saturating, rational, a sharp rise.
TRUTHS = {"log-linear": (0.5, 0.12), "power": (0.8, 0.3, 1.2), "rational": (0.5, -0.2, 0.5),
          "logistic": (0.8, 4.0, 0.3)}


def models(family, params, seed, n=30, noise=0.01):
    rng = np.random.default_rng(seed)
    x = rng.uniform(7.5, 11, n)
    return x, FAMILIES[family][0](x - x.mean(), *params) + rng.normal(0, noise, n)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(TRUTHS))
def test_aic_recovers_the_generating_function(family):
    """Ten draws of 30 models each. A nested family (rational contains log-linear) sometimes fits noise
    well enough to pay its extra parameter: AIC's known false-positive rate (P(chi2_1 > 2) = 16% per
    nested rival), so a majority is asked for, not every draw."""
    picks = [fit_curves(*models(family, TRUTHS[family], seed))[0].family for seed in range(10)]
    assert picks.count(family) >= 7, picks


def test_fits_are_ordered_by_aic_and_evaluate_at_log_sizes():
    x, y = models("logistic", TRUTHS["logistic"], 0)
    fits = fit_curves(x, y)
    assert [f.aic for f in fits] == sorted(f.aic for f in fits) and len(fits) == len(FAMILIES)
    best = fits[0]
    assert np.sqrt(best.rss / len(x)) < 0.015  # the noise is 0.01
    assert best.aic == pytest.approx(len(x) * np.log(best.rss / len(x)) + 2 * len(best.params))
    assert fit_curves(x[:2], y[:2]) == []  # two models: no family has fewer parameters than points


def test_break_even_interval_holds_the_true_crossing():
    """APS rises slowly (rational, as the paper found), APX steeply (log-linear); the true break-even is
    where the generating curves meet, found on a fine grid."""
    rng = np.random.default_rng(0)
    x = rng.uniform(7.5, 11, 30)
    centre = x.mean()
    aps_curve = lambda s: FAMILIES["rational"][0](s - centre, 0.55, 0.08, 0.3)  # noqa: E731
    apx_curve = lambda s: FAMILIES["log-linear"][0](s - centre, 0.5, 0.15)  # noqa: E731
    grid = np.linspace(7.5, 11, 100001)
    truth = grid[np.argmax(apx_curve(grid) - aps_curve(grid) >= 0)]
    aps = aps_curve(x) + rng.normal(0, 0.01, 30)
    apx = apx_curve(x) + rng.normal(0, 0.01, 30)
    result = break_even(x, aps, apx, n_boot=300)
    assert (result.aps.family, result.apx.family) == ("rational", "log-linear")
    assert result.low <= truth <= result.high and result.crossed > 0.95
    assert abs(result.log10_size - truth) < 0.1
    low, high, fitted = bootstrap_band(x, apx, "log-linear", grid[::10000], n_boot=200)
    assert fitted == 200 and np.all(low <= apx_curve(grid[::10000]) + 0.02) and np.all(low < high)


def test_no_crossing_is_reported_as_none():
    x, aps = models("log-linear", (0.7, 0.01), 1)
    apx = aps - 0.3  # APX never catches up
    result = break_even(x, aps, apx, n_boot=50)
    assert result.log10_size is None and result.low == result.high == np.inf and result.crossed == 0.0
    assert "no crossing within the sizes" in result.describe() and "0% of 50 resamples" in result.describe()


@pytest.mark.slow
def test_break_even_near_the_edge_is_open_ended_and_says_how_many_resamples_cross():
    """APX meets APS at the largest sizes, in noise: some resamples cross inside the sizes, the rest beyond
    them. The interval counts those as beyond (open-ended), not leaves them out, and says the share."""
    rng = np.random.default_rng(1)
    x = np.sort(rng.uniform(8, 10, 12))
    aps = 0.6 + rng.normal(0, 0.02, 12)
    apx = 0.6 + 0.1 * (x - 10) + rng.normal(0, 0.02, 12)
    result = break_even(x, aps, apx, n_boot=100)
    assert 0.05 < result.crossed < 0.95 and result.high == np.inf and np.isfinite(result.low)
    inside = [c for c in [result.low] if np.isfinite(c)]
    assert inside and 8 <= inside[0] <= 10
    text = result.describe()
    assert f"{result.crossed:.0%} of 100 resamples cross" in text and "beyond the largest model" in text
    assert "open-ended" in text
