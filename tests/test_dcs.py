"""DCS against an independent numpy reference, with IDK located by index (also when its text has
leading whitespace, where a lookup by string would silently score pIDK = 0)."""

import numpy as np
import pytest

from dcsjax.data.bigbench import _find_choice
from dcsjax.metrics.dcs import dcs, dcs_parts, loadings_from_threshold


def numpy_dcs(probs, correct, idk, lc, lw):
    probs = np.asarray(probs, np.float64)
    p_idk = probs[idk] if idk is not None else 0.0
    p_c = sum(probs[k] for k in correct if k != idk)
    p_w = sum(p for k, p in enumerate(probs) if k not in correct and k != idk)
    return (lc * p_c - lw * p_w) * (1 - p_idk)


def test_batched_dcs_matches_numpy_on_ragged_items():
    rng = np.random.default_rng(0)
    choices = [(" Paris", " London", " Unknown"), ("yes", "no"), ("a", "b", "c", "d", " I don't know")]
    correct = [(0,), (1,), (2,)]
    idk = [_find_choice(choices[0], "Unknown"), None, _find_choice(choices[2], "I don't know")]
    assert idk == [2, None, 4]  # found despite the leading space
    width = 5
    probs = np.zeros((3, width), np.float32)
    valid = np.zeros((3, width), bool)
    for r, c in enumerate(choices):
        p = rng.dirichlet(np.ones(len(c)))
        probs[r, :len(c)] = p
        valid[r, :len(c)] = True
    corr = np.zeros_like(valid)
    idk_mask = np.zeros_like(valid)
    for r in range(3):
        corr[r, list(correct[r])] = True
        if idk[r] is not None:
            idk_mask[r, idk[r]] = True
    for lc, lw in [(1.0, 1.0), loadings_from_threshold(0.75)]:
        parts = dcs_parts(probs, corr, idk_mask, valid, lc, lw)
        for r in range(3):
            ref = numpy_dcs(probs[r, :len(choices[r])], correct[r], idk[r], lc, lw)
            assert abs(float(parts["dcs"][r]) - ref) < 1e-6
        assert float(parts["p_idk"][0]) == pytest.approx(probs[0, 2])


def test_elementwise_dcs_and_loadings():
    assert dcs(1.0, 0.0, 0.0) == 1.0 and dcs(0.0, 1.0, 0.0) == -1.0 and dcs(0.0, 0.0, 1.0) == 0.0
    assert loadings_from_threshold(0.75) == (1.0, 3.0)
    np.testing.assert_allclose(dcs(np.array([0.5, 0.2]), np.array([0.3, 0.2]), np.array([0.2, 0.6]), 1.0, 3.0),
                               [(0.5 - 0.9) * 0.8, (0.2 - 0.6) * 0.4])
    with pytest.raises(ValueError):
        loadings_from_threshold(1.0)


@pytest.mark.slow
def test_letters_prompt_uses_the_chat_template_of_instruct_models():
    from conftest import scorer_for
    from dcsjax.data.items import Item
    from dcsjax.eval.protocols.dcs import letters_context

    item = Item(id="x", question="When was Abraham Lincoln born?", choices=("February 12, 1809", "Unknown"),
                correct=(0,), idk=1)
    smol = scorer_for("smollm2-135m-instruct")
    context, letters, idk = letters_context(smol, item, 1.0, 3.0)
    assert context.endswith("<|im_start|>assistant\n") and letters == ["A", "B"] and idk == 1
    assert "a wrong answer costs 3 points" in context and "B. Unknown" in context
    for letter in letters:  # each letter is one token after the prompt, so these are next-token probabilities
        assert len(smol.split_encode(context, letter)[1]) == 1
    gemma = scorer_for("gemma3-270m")  # a base model: completes "Answer:"
    context, letters, _ = letters_context(gemma, item, 1.0, 1.0)
    assert context.endswith("Answer:") and letters == [" A", " B"] and "C. I don't know." not in context
