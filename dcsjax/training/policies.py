"""From a model's option+IDK distributions to answer-or-abstain decisions, and what they score at a target
threshold t (lc = 1, lw = t / (1 - t)), with intervals over items.

Two ways to decide:
- the model's own choice: the most probable of options and IDK (choosing IDK is abstaining): how a model
  trained to abstain is used;
- post-hoc thresholding: answer the most probable *option* when its probability (IDK mass included in the
  distribution, so IDK lowers it) reaches tau, else abstain; tau tuned on the dev split to maximise the score
  at t. This is the baseline a trained abstainer must beat: any model, thresholded afterwards.

A decision is scored as DCS of the committed distribution (all mass on the answer, or on IDK): +1 right,
-lw wrong, 0 abstained. By Proposition 1 of paper 000 a model that answers exactly when its chance of being
right is at least t maximises this, and then its accuracy on the items it answers is at least t.

All metrics are ratios of per-item sums, pooled over seeds (the same test items for every seed), so an
interval resamples items once for every seed together (numpy, vectorised over resamples).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from dcsjax.metrics.dcs import dcs, option_masses
from dcsjax.metrics.bootstrap import percentile_interval
from dcsjax.metrics.calibration import Distributions, forced_pick, own_pick

ABSTAIN = -1


def own_choice(d: Distributions) -> np.ndarray:
    """[N] the option answered, or ABSTAIN where IDK is the most probable entry (`metrics.own_pick`)."""
    pick, abstain = own_pick(d)
    return np.where(np.asarray(abstain), ABSTAIN, np.asarray(pick))


def forced(d: Distributions) -> tuple[np.ndarray, np.ndarray]:
    """[N] the forced answer and its probability (`metrics.forced_pick`), as numpy arrays."""
    pick, confidence = forced_pick(d)
    return np.asarray(pick), np.asarray(confidence)


def gains(d: Distributions, answer: np.ndarray, lw: float) -> np.ndarray:
    """[N] the decision's score: +1 right, -lw wrong, 0 abstained (lc = 1)."""
    answered = answer != ABSTAIN
    right = answered & np.asarray(d.correct)[np.arange(len(answer)), np.where(answered, answer, 0)]
    return np.where(answered, np.where(right, 1.0, -lw), 0.0)


def tune_threshold(dev: Distributions, lw: float) -> float:
    """The tau maximising the dev score of "answer the forced option when its probability >= tau": over the
    cut points between distinct confidences (np.inf: abstain everywhere). Ties go to the larger tau."""
    pick, confidence = forced(dev)
    order = np.argsort(-confidence, kind="stable")
    conf = confidence[order]
    total = np.concatenate([[0.0], np.cumsum(gains(dev, pick, lw)[order])])  # answer the k most confident
    k = np.arange(len(conf) + 1)
    cut = (k == 0) | (k == len(conf)) | np.concatenate([[True], conf[:-1] > conf[1:], [True]])[k]
    best = int(np.argmax(np.where(cut, total, -np.inf)))
    return float(np.inf if best == 0 else conf[best - 1])


def refusal_targets(start: Distributions) -> np.ndarray:
    """R-Tuning's labels (Zhang et al., NAACL 2024) on this read-out, from the starting model's own answers: [N, K]
    bool, the gold option(s) where its forced answer (`forced`: the most probable option, IDK left out) is right,
    the IDK option where it is wrong (so on every unanswerable version, whose only correct entry is IDK). A model
    trained by cross-entropy on them learns to refuse what it got wrong: the refusal baseline's targets."""
    pick, _ = forced(start)
    correct, idk = np.asarray(start.correct), np.asarray(start.idk)
    right = (correct & ~idk)[np.arange(len(pick)), pick]
    return np.where(right[:, None], correct & ~idk, idk)


def thresholded(d: Distributions, tau: float) -> np.ndarray:
    pick, confidence = forced(d)
    return np.where(confidence >= tau, pick, ABSTAIN)


class Outcomes(NamedTuple):
    """One policy on the test items, per seed: [S, N] arrays."""
    gain: np.ndarray  # decision score at t
    answered: np.ndarray  # bool
    right: np.ndarray  # bool
    dcs: np.ndarray  # DCS of the model's whole distribution at t (NaN for a thresholded policy)


def outcomes(dists: list[Distributions], answers: list[np.ndarray], lw: float, soft: bool) -> Outcomes:
    rows = []
    for d, answer in zip(dists, answers):
        gain = gains(d, answer, lw)
        answered = answer != ABSTAIN
        dist = np.asarray(dcs(*option_masses(*d), 1.0, lw)) if soft else np.full(len(answer), np.nan)
        rows.append((gain, answered, answered & (gain > 0), dist))
    return Outcomes(*(np.stack(parts).astype(np.float64) for parts in zip(*rows)))


def uniform_answerer(d: Distributions, lw: float) -> Outcomes:
    """The chance reference, one seed: each item's answer drawn uniformly from its presented entries (options
    and IDK; IDK = abstain), kept as its exact expectation per item (fractional `answered` and `right`, so every
    metric is the expected one, with no sampling), and the uniform distribution over the same entries, whose DCS
    is what the distributional column reads against."""
    valid, correct, idk = (np.asarray(x) for x in (d.valid, d.correct, d.idk))
    n = valid.sum(-1)  # [N] presented entries, IDK included
    right = (valid & correct & ~idk).sum(-1)
    wrong = (valid & ~correct & ~idk).sum(-1)
    uniform = np.where(valid, 1.0 / n[:, None], 0.0)
    dist = np.asarray(dcs(*option_masses(uniform, correct, idk, valid), 1.0, lw))
    return Outcomes(*(np.asarray(x, np.float64)[None] for x in ((right - lw * wrong) / n, (right + wrong) / n, right / n, dist)))


def metrics_of(o: Outcomes, kind: np.ndarray, idx: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every metric over the items `idx` ([B, N] resamples, or None: all items once) -> [B] (or scalar)
    arrays. kind [N]: each item's construction ("answerable", "option removed", "wording")."""
    idx = np.arange(o.gain.shape[1])[None] if idx is None else idx
    take = lambda x: x[:, idx]  # noqa: E731  [S, B, N]
    answered, right = take(o.answered), take(o.right)
    ratio = lambda num, den: num.sum((0, 2)) / np.maximum(den.sum((0, 2)), 1e-12)  # noqa: E731
    # T (TruthRL): the share answered right minus the share answered wrong, the decision score at lc = lw = 1
    out = {"score": take(o.gain).mean((0, 2)), "dcs": take(o.dcs).mean((0, 2)),
           "truthfulness": (2 * right - answered).mean((0, 2)), "coverage": answered.mean((0, 2)),
           "selective_accuracy": np.where(answered.sum((0, 2)) > 0, ratio(right, answered), np.nan)}  # none answered: none
    for name, construction in (("abstain_removed", "option removed"), ("abstain_wording", "wording"),
                               ("over_abstention", "answerable")):
        mask = np.broadcast_to((kind == construction)[idx][None], answered.shape)
        out[name] = np.where(mask.sum((0, 2)) > 0, ratio((1 - answered) * mask, mask), np.nan)
    return out


METRIC_LABELS = {"score": "DCS at t (decisions)", "dcs": "DCS at t (distribution)",
                 "truthfulness": "T = accuracy - hallucination", "coverage": "coverage",
                 "selective_accuracy": "accuracy when answering", "abstain_removed": "abstains: option removed",
                 "abstain_wording": "abstains: wording", "over_abstention": "abstains: answerable"}
# Of a model's own distribution, whatever t (the forced answer's confidence against its correctness): R-Tuning's
# average precision, calibration and selective prediction (`metrics.calibration`)
DISTRIBUTION_LABELS = {"ap": "AP (confidence vs correct)", "ece": "ECE", "brier": "Brier", "aurc": "AURC"}


def summarise(o: Outcomes, kind: np.ndarray, indices: np.ndarray) -> dict[str, list[float]]:
    """metric -> [estimate, low, high] (95% percentile interval over the item resamples `indices`)."""
    point, boot = metrics_of(o, kind), metrics_of(o, kind, indices)
    out = {}
    for name, value in point.items():
        # NaN: no such items, or a policy without a distribution; a resample without such items has no value
        if np.isfinite(value[0]) and np.isfinite(boot[name]).any():
            out[name] = [float(value[0]), *percentile_interval(boot[name])]
        else:
            out[name] = [None, None, None]
    return out


def paired(a: Outcomes, b: Outcomes, indices: np.ndarray) -> list[float]:
    """Mean decision score of a minus b on the same items (each averaged over its seeds): [difference,
    low, high] over the item resamples, and the share of resamples at or below 0."""
    diff = a.gain.mean(0) - b.gain.mean(0)  # [N]
    boot = diff[indices].mean(-1)
    return [float(diff.mean()), *percentile_interval(boot), float(np.mean(boot <= 0))]


def distribution_metrics(dists: list[Distributions], indices: np.ndarray) -> dict[str, list[float]]:
    """`DISTRIBUTION_LABELS`' metrics of one model's distributions on the test items, one per seed (the same
    items): metric -> [mean over seeds, 95% interval over the item resamples `indices`, seeds pooled]."""
    from dcsjax.metrics.bootstrap import value_and_resamples
    from dcsjax.metrics.calibration import ABSTENTION_METRICS

    out = {}
    for name in DISTRIBUTION_LABELS:  # each metric's one home: the abstention metrics' table
        points, boots = zip(*(value_and_resamples(ABSTENTION_METRICS[name], d, indices) for d in dists))
        out[name] = [float(np.mean(points)), *percentile_interval(np.mean(boots, axis=0))]
    return out
