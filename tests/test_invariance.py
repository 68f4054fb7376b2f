"""A sequence's score does not change with batch size, packing, padding or length bucket.

The reference is brute force and shares no batching code: each text alone in its own [1, 128] row,
one text at a time, straight through the model and the log-prob kernel (the kernel itself is checked
against a float64 log-softmax in test_kernels.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import PASSAGE, scorer_for
from dcsjax.engine.logprobs import token_logprobs
from dcsjax.engine.scorer import Scorer

pytestmark = pytest.mark.slow

ROW = 128


def mixed_texts(n: int = 100) -> list[str]:
    """n real snippets of 1 to ~110 tokens, cut from the passage at varying offsets and lengths."""
    words = PASSAGE.split()
    rng = np.random.default_rng(0)
    texts = []
    for _ in range(n):
        length = int(rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 55, 70]))
        start = int(rng.integers(0, len(words) - length))
        texts.append(" ".join(words[start:start + length]))
    return texts


# The first 20 texts of the draw hold every length (1 to 70 words); 40 (SmolLM2) and 24 (Gemma 3, whose
# 262k-row head makes each of its brute-force rows the costlier) fill several packed rows and batches at each
# setting below, and each brute-force row costs a forward pass of its own.
TEXTS_CHECKED = {"smollm2-135m-instruct": 40, "gemma3-270m": 24}


@functools.lru_cache(maxsize=None)
def brute_force(name: str) -> list[float]:
    return brute_force_scores(scorer_for(name), TEXTS_CHECKED[name])


def brute_force_scores(scorer, n: int = 100) -> list[float]:
    """Every text of `mixed_texts(n)` alone in a [1, ROW] row, one at a time: summed float32 log-probs."""
    graphdef, state = nnx.split(scorer.model)

    @jax.jit
    def one_row(state, tokens, targets):  # [1, ROW] each
        model = nnx.merge(graphdef, state)
        hidden = model(tokens, jnp.arange(ROW)[None], jnp.ones_like(tokens))
        return token_logprobs(hidden, model.output_embedding, targets, cap=model.config.final_softcap)

    sums = []
    for ids in scorer.encode(mixed_texts(n)):
        seq = [scorer.document_start_id, *ids]
        assert len(seq) <= ROW
        tokens, targets = np.zeros((1, ROW), np.int32), np.zeros((1, ROW), np.int32)
        tokens[0, :len(seq)], targets[0, :len(seq) - 1] = seq, seq[1:]
        sums.append(float(np.asarray(one_row(state, tokens, targets))[0, :len(seq) - 1].astype(np.float64).sum()))
    return sums


CONFIGS = [  # (batch size, packing, buckets): each changes what shares a text's row, batch or bucket
    (7, True, (64, 128)),  # packed rows, a short last batch
    (32, False, (64, 128)),  # one text a row, a large batch
    (7, True, (128,)),  # one bucket: short texts in long rows
    (32, True, (64, 128, 256)),  # a large packed batch over three buckets
]


@pytest.mark.parametrize("batch_size,pack,buckets", CONFIGS)
def test_scores_equal_brute_force_smollm2(batch_size, pack, buckets):
    check("smollm2-135m-instruct", batch_size, pack, buckets)


@pytest.mark.parametrize("batch_size,pack,buckets", [(7, True, (64, 128))])
def test_scores_equal_brute_force_gemma3(batch_size, pack, buckets):
    check("gemma3-270m", batch_size, pack, buckets)


def check(name, batch_size, pack, buckets, base=None, reference=None):
    base = base or scorer_for(name)
    scorer = Scorer(base.model, base.tokenizer, base.document_start_id, batch_size=batch_size, pack=pack,
                    buckets=buckets)
    ref = np.array(reference if reference is not None else brute_force(name))
    texts = mixed_texts(len(ref))
    ours = scorer.score(texts)
    gap = np.abs(ours - ref).max()
    print(f"{name} batch={batch_size} pack={pack} buckets={buckets}: max |score - brute force| = {gap:.2e}")
    assert gap == 0  # bit for bit: same float32 log-probs, summed in the same order (float64)
    # and the per-token arrays line up with the tokenizer: one entry per token of each text
    assert [len(lp) for lp in scorer.token_logprobs(texts[:5])] == [len(i) for i in scorer.encode(texts[:5])]
