"""Calibration companions of DCS over each item's option+IDK distribution, batched over items.

Items are ragged (different numbers of options), so every function takes `Distributions`: arrays padded to a
common width K with a `valid` mask, the same layout `dcs_parts` uses. All are pure jax.numpy and jit-able,
so a bootstrap can vmap them over thousands of resamples of the items.

Two readings of a distribution are used:
- the *forced answer*: the most probable answer option, IDK excluded, with its probability as the
  confidence. IDK mass lowers the confidence, so the risk-coverage curve and ECE ask "is the confidence of
  what the model would answer meaningful?";
- the *choice*: the most probable of options and IDK; choosing IDK is abstaining (ternary score).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dcsjax.metrics.dcs import dcs, option_masses


def option_masks(widths: Sequence[int], correct: Sequence[Sequence[int]], idk: Sequence[int | None],
                 width: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ragged items (item i: widths[i] entries, the correct ones and the IDK one by index; None: no IDK entry)
    as padded [N, K] bool masks (correct, idk, valid), K = width or the widest item."""
    n, k = len(widths), width if width is not None else max(widths, default=0)
    correct_mask, idk_mask, valid = (np.zeros((n, k), bool) for _ in range(3))
    for i, (w, right, abstain) in enumerate(zip(widths, correct, idk)):
        valid[i, :w] = True
        correct_mask[i, list(right)] = True
        if abstain is not None:
            idk_mask[i, abstain] = True
    return correct_mask, idk_mask, valid


class Distributions(NamedTuple):
    """probs [N, K] (each row sums to 1 over its valid entries), correct/idk/valid [N, K] bool.
    On an unanswerable item the only correct entry is the IDK option."""
    probs: jax.Array
    correct: jax.Array
    idk: jax.Array
    valid: jax.Array

    @classmethod
    def from_records(cls, records: Sequence[dict]) -> "Distributions":
        """From `dcs` / `dcs-letters` records (probs, correct_options, idk_index)."""
        correct, idk, valid = option_masks([len(r["probs"]) for r in records], [r["correct_options"] for r in records],
                                           [r["idk_index"] for r in records])
        probs = np.zeros(valid.shape, np.float32)
        for i, r in enumerate(records):
            probs[i, :len(r["probs"])] = r["probs"]
        return cls(jnp.asarray(probs), jnp.asarray(correct), jnp.asarray(idk), jnp.asarray(valid))

    def take(self, index: jax.Array) -> "Distributions":
        """The items at `index` (a bootstrap resample)."""
        return Distributions(*(x[index] for x in self))


def brier_score(d: Distributions) -> jax.Array:
    """Mean over items of sum_k (p_k - y_k)^2 over options and IDK, y one-hot on the right answer (IDK on an
    unanswerable item). Several correct options count as one class holding their summed mass; with one
    correct option this is the usual multi-class Brier score, in [0, 2]."""
    p = jnp.where(d.valid, d.probs, 0.0)
    target = d.correct & d.valid
    p_target = jnp.sum(jnp.where(target, p, 0.0), axis=-1)
    rest = jnp.sum(jnp.where(target, 0.0, p * p), axis=-1)
    return jnp.mean((1.0 - p_target) ** 2 + rest)


def _at(x: jax.Array, pick: jax.Array) -> jax.Array:
    """x [N, K] at each item's entry pick [N] -> [N]."""
    return jnp.take_along_axis(x, pick[:, None], axis=-1)[:, 0]


def forced_pick(d: Distributions) -> tuple[jax.Array, jax.Array]:
    """The forced answer: [N] the most probable answer option (IDK excluded; the first of ties) and [N] its
    probability in the whole distribution (IDK's mass included, so IDK lowers it). Thresholding it is the
    post-hoc abstention policy (`dcsjax.training.policies`)."""
    p = jnp.where(d.valid & ~d.idk, d.probs, -1.0)
    pick = jnp.argmax(p, axis=-1)
    return pick, _at(p, pick)


def own_pick(d: Distributions) -> tuple[jax.Array, jax.Array]:
    """The model's own choice: [N] the most probable entry of options and IDK, and [N] whether that is IDK
    (abstaining)."""
    pick = jnp.argmax(jnp.where(d.valid, d.probs, -1.0), axis=-1)
    return pick, _at(d.idk, pick)


def forced_answer(d: Distributions) -> tuple[jax.Array, jax.Array]:
    """[N] confidence and [N] correctness of the forced answer (`forced_pick`)."""
    pick, confidence = forced_pick(d)
    return confidence, _at(d.correct & d.valid & ~d.idk, pick)


def _ece(confidence: jax.Array, hit: jax.Array, bin_of: jax.Array, bins: int) -> jax.Array:
    n = confidence.shape[0]
    conf_sum = jax.ops.segment_sum(confidence, bin_of, bins)
    hit_sum = jax.ops.segment_sum(hit.astype(confidence.dtype), bin_of, bins)
    return jnp.sum(jnp.abs(hit_sum - conf_sum)) / n  # sum_b n_b/N |acc_b - conf_b|


def ece(d: Distributions, bins: int = 10, scheme: str = "width") -> jax.Array:
    """Expected calibration error of the forced answer's confidence.

    scheme "width": bins [0, 1/M), ..., [(M-1)/M, 1]; "mass": M bins of (nearly) equal item counts, by rank
    of confidence (ties broken by item order)."""
    confidence, hit = forced_answer(d)
    if scheme == "width":
        bin_of = jnp.minimum(jnp.floor(confidence * bins), bins - 1).astype(jnp.int32)
    elif scheme == "mass":
        rank = jnp.argsort(jnp.argsort(confidence, stable=True), stable=True)
        bin_of = (rank * bins) // confidence.shape[0]
    else:
        raise ValueError(f"unknown binning scheme {scheme!r}: 'width' or 'mass'")
    return _ece(confidence, hit, bin_of, bins)


def risk_coverage(d: Distributions) -> tuple[jax.Array, jax.Array]:
    """[N] coverage and [N] risk: answering only the k most confident items (forced answer), k = 1..N,
    the risk is the error rate among them. Ties in confidence keep item order."""
    confidence, hit = forced_answer(d)
    order = jnp.argsort(-confidence, stable=True)
    errors = jnp.cumsum(1.0 - hit[order].astype(jnp.float32))
    k = jnp.arange(1, confidence.shape[0] + 1, dtype=jnp.float32)
    return k / confidence.shape[0], errors / k


def aurc(d: Distributions) -> jax.Array:
    """Area under the risk-coverage curve: the mean of the risks at coverages 1/N, ..., N/N (lower is better)."""
    return jnp.mean(risk_coverage(d)[1])


def average_precision(d: Distributions) -> jax.Array:
    """Average precision of the forced answer's confidence as a detector of its correctness (R-Tuning's AP):
    sum over the distinct confidences, most confident first, of (recall gained there) x (precision there); tied
    confidences are one threshold, as scikit-learn's `average_precision_score` takes them. 0 with no correct
    answer."""
    confidence, hit = forced_answer(d)
    order = jnp.argsort(-confidence, stable=True)
    c, h = confidence[order], hit[order].astype(jnp.float32)
    true_pos = jnp.cumsum(h)
    precision = true_pos / jnp.arange(1, c.shape[0] + 1, dtype=jnp.float32)
    recall = true_pos / jnp.maximum(true_pos[-1], 1.0)
    group_end = jnp.append(c[1:] != c[:-1], True)  # the last item of each run of one confidence
    at_ends = jnp.where(group_end, recall, 0.0)
    before = jnp.concatenate([jnp.zeros(1), jax.lax.cummax(at_ends)[:-1]])  # the recall of the previous threshold
    return jnp.sum(jnp.where(group_end, (recall - before) * precision, 0.0))


def selective_accuracy(d: Distributions, coverage: float) -> jax.Array:
    """Accuracy on the ceil(coverage * N) most confident items."""
    cov, risk = risk_coverage(d)
    k = max(1, int(np.ceil(coverage * cov.shape[0])))
    return 1.0 - risk[k - 1]


def choice(d: Distributions) -> tuple[jax.Array, jax.Array]:
    """[N] abstained (IDK is the most probable entry) and [N] right (a correct answer option is)."""
    pick, abstain = own_pick(d)
    return abstain, _at(d.correct, pick) & ~abstain


def ternary_score(d: Distributions, threshold: float = 0.5) -> jax.Array:
    """Mean of +1 (choice correct), -t/(1-t) (choice wrong), 0 (IDK chosen): the score under which answering
    pays exactly when one's confidence exceeds t."""
    abstain, right = choice(d)
    penalty = threshold / (1.0 - threshold)
    return jnp.mean(jnp.where(abstain, 0.0, jnp.where(right, 1.0, -penalty)))


def loading_spectrum(d: Distributions, thresholds: jax.Array) -> jax.Array:
    """[T] mean DCS at each target threshold t (lc = 1, lw = t/(1-t)): paper 000's risk profile."""
    pc, pw, pidk = option_masses(*d)
    return jax.vmap(lambda t: jnp.mean(dcs(pc, pw, pidk, 1.0, t / (1.0 - t))))(jnp.asarray(thresholds))


DEFAULT_THRESHOLDS = np.round(np.arange(0.5, 0.951, 0.05), 2)


# ---------------------------------------------------------------------------------------------- abstention
def _answerable(d: Distributions) -> jax.Array:
    return jnp.any(d.correct & ~d.idk & d.valid, axis=-1)


def _mean_over(values: jax.Array, where: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(where, values, 0.0)) / jnp.maximum(jnp.sum(where), 1)


def mean_dcs(d: Distributions) -> jax.Array:
    return jnp.mean(dcs(*option_masses(*d)))


def answer_accuracy(d: Distributions) -> jax.Array:
    """Answerable items whose most probable entry is a correct option (abstaining counts as not right)."""
    return _mean_over(choice(d)[1].astype(jnp.float32), _answerable(d))


def coverage(d: Distributions) -> jax.Array:
    """Items answered (an option, not IDK, is the most probable entry)."""
    return jnp.mean(1.0 - choice(d)[0].astype(jnp.float32))


def abstention_unanswerable(d: Distributions) -> jax.Array:
    """Unanswerable items on which IDK is the most probable entry: abstention where it is right."""
    return _mean_over(choice(d)[0].astype(jnp.float32), ~_answerable(d))


def over_abstention(d: Distributions) -> jax.Array:
    """Answerable items on which IDK is the most probable entry: abstention where an answer was possible."""
    return _mean_over(choice(d)[0].astype(jnp.float32), _answerable(d))


def accuracy_answered(d: Distributions) -> jax.Array:
    """Right answers among the items answered (the model's own choice is an option, not IDK)."""
    abstain, right = choice(d)
    return _mean_over(right.astype(jnp.float32), ~abstain)


def truthfulness(d: Distributions) -> jax.Array:
    """T = accuracy - hallucination rate over all items, of the model's own choices (TruthRL's +1 right, 0
    abstain, -1 wrong): the ternary score at t = 0.5, DCS's decisions at lc = lw = 1."""
    return ternary_score(d, 0.5)


# What fine-tuning for abstention is judged by, each a jit-able statistic of a batch of items: the literature's
# (R-Tuning's AP and accuracy on answered items, TruthRL's T, calibration's ECE and Brier, selective
# prediction's AURC) beside DCS's own.
ABSTENTION_METRICS = {
    "dcs": mean_dcs, "accuracy": answer_accuracy, "coverage": coverage,
    "abstain_unanswerable": abstention_unanswerable, "over_abstention": over_abstention, "ece": ece,
    "accuracy_answered": accuracy_answered, "truthfulness": truthfulness, "ap": average_precision,
    "brier": brier_score, "aurc": aurc,
}
