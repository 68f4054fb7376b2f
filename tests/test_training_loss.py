"""The differentiable DCS loss: value against the DCS kernel and a hand-worked CE/KL, gradients against
finite differences, and its optimum on toy populations (Proposition 1, learned)."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

from dcsjax.metrics.dcs import dcs_parts
from dcsjax.training.loss import dcs_loss

# Two items, options A, B, C and IDK (last); the second has only two options (C padded) and is unanswerable.
VALID = jnp.array([[1, 1, 1, 1], [1, 1, 0, 1]], bool)
IDK = jnp.array([[0, 0, 0, 1], [0, 0, 0, 1]], bool)
CORRECT = jnp.array([[0, 1, 0, 0], [0, 0, 0, 1]], bool)
LOGITS = jnp.array([[0.3, 1.2, -0.5, 0.1], [0.7, -0.2, 9.0, 0.4]], jnp.float32)  # 9.0 is padding: ignored


def test_loss_value_against_the_dcs_kernel_and_hand_worked_ce_kl():
    start = LOGITS + jnp.array([[0.5, 0, 0, 0], [0, 0.5, 0, 0]])
    parts = dcs_loss(LOGITS, CORRECT, IDK, VALID, lc=1.0, lw=3.0, beta=0.5, gamma=0.25, start_logits=start)
    probs = jax.nn.softmax(jnp.where(VALID, LOGITS, -jnp.inf), -1)
    reference = dcs_parts(probs, CORRECT, IDK, VALID, 1.0, 3.0)["dcs"].mean()
    assert float(parts.dcs) == pytest.approx(float(reference), abs=1e-6)
    p = np.exp(LOGITS[0, :3]) / np.exp(LOGITS[0, :3]).sum()  # CE: item 0 only, renormalised over A-C
    assert float(parts.ce) == pytest.approx(-np.log(p[1]), abs=1e-6)
    q = [jax.nn.softmax(jnp.where(VALID[i], start[i], -jnp.inf)) for i in range(2)]
    kl = np.mean([np.sum(np.where(VALID[i], probs[i] * (np.log(probs[i] + 1e-30) - np.log(q[i] + 1e-30)), 0))
                  for i in range(2)])
    assert float(parts.kl) == pytest.approx(kl, abs=1e-6)
    assert float(parts.loss) == pytest.approx(-float(reference) + 0.5 * float(parts.ce) + 0.25 * kl, abs=1e-5)


def test_gradients_match_finite_differences():
    start = LOGITS * 0.5
    f = lambda x: dcs_loss(x, CORRECT, IDK, VALID, lc=1.0, lw=3.0, beta=0.5, gamma=0.25,  # noqa: E731
                           start_logits=start).loss
    check_grads(f, (LOGITS,), order=1, modes=["rev"], atol=2e-2, rtol=2e-2, eps=1e-2)
    grad = jax.grad(f)(LOGITS)
    assert float(jnp.abs(grad[1, 2])) == 0.0  # no gradient flows into a padded option


def test_dcs_alone_cannot_leave_always_idk_but_ce_can():
    """An answerable item with pIDK ~ 1: the DCS gradient (1 - pIDK) vanishes; the CE term does not."""
    logits = jnp.array([[0.0, 0.0, 0.0, 12.0]])
    correct, idk, valid = CORRECT[:1], IDK[:1], VALID[:1]
    dcs_only = jax.grad(lambda x: dcs_loss(x, correct, idk, valid).loss)(logits)
    with_ce = jax.grad(lambda x: dcs_loss(x, correct, idk, valid, beta=1.0).loss)(logits)
    assert float(jnp.abs(dcs_only).max()) < 1e-4 < float(jnp.abs(with_ce[0, :3]).max())


def train(logits, correct, idk, valid, steps=400, **options):
    opt = optax.adam(0.1)
    state = opt.init(logits)
    step = jax.jit(lambda x, s: _step(x, s, opt, correct, idk, valid, options))
    for _ in range(steps):
        logits, state = step(logits, state)
    return logits


def _step(x, s, opt, correct, idk, valid, options):
    grad = jax.grad(lambda y: dcs_loss(y, correct, idk, valid, **options).loss)(x)
    updates, s = opt.update(grad, s)
    return optax.apply_updates(x, updates), s


@pytest.mark.slow
@pytest.mark.parametrize("answerable_share,expect", [(0.7, "answer"), (0.3, "abstain")])
def test_learned_optimum_follows_the_guessing_threshold(answerable_share, expect):
    """One distribution shared by 10 items (a model that cannot tell them apart): a share q of them have
    option A right, the rest are unanswerable (IDK right). Minimising -DCS commits to A when q > 1/2 and
    abstains when q < 1/2 (Proposition 1 at lc = lw = 1), whatever the start."""
    n = 10
    answerable = np.arange(n) < int(answerable_share * n)
    correct = np.zeros((n, 3), bool)
    correct[answerable, 0] = True
    correct[~answerable, 2] = True
    idk = np.zeros((n, 3), bool)
    idk[:, 2] = True
    valid = np.ones((n, 3), bool)
    shared = jnp.zeros((1, 3))

    def loss(x):
        return dcs_loss(jnp.broadcast_to(x, (n, 3)), correct, idk, valid).loss

    opt, x = optax.adam(0.1), shared
    state = opt.init(x)
    for _ in range(300):
        updates, state = opt.update(jax.grad(loss)(x), state)
        x = optax.apply_updates(x, updates)
    p = jax.nn.softmax(x[0])
    if expect == "answer":
        assert float(p[0]) > 0.95
    else:
        assert float(p[2]) > 0.95


def test_free_logits_reach_the_right_answer_or_idk():
    """With logits free per item, DCS + CE drives each answerable item to its answer and each
    unanswerable item to IDK."""
    learned = train(jnp.zeros((2, 4)), CORRECT, IDK, VALID, steps=300, beta=0.3)
    p = jax.nn.softmax(jnp.where(VALID, learned, -jnp.inf), -1)
    assert float(p[0, 1]) > 0.95 and float(p[1, 3]) > 0.95


def test_option_ce_is_plain_cross_entropy_over_options_and_idk():
    """Item 0: the right answer B among A, B, C, IDK; item 1 (unanswerable): IDK among A, B, IDK."""
    from dcsjax.training.loss import option_ce

    def ce(row, valid, target):
        z = np.asarray(row, np.float64)[np.asarray(valid)]
        return -(z[target] - np.log(np.exp(z).sum()))

    want = (ce(LOGITS[0], VALID[0], 1) + ce(LOGITS[1], VALID[1], 2)) / 2  # item 1: IDK is the third valid entry
    assert float(option_ce(LOGITS, CORRECT, VALID)) == pytest.approx(want, abs=1e-6)


def test_the_arm_chosen_by_a_traced_index_has_the_gradient_of_its_own_loss():
    """The compiled update takes the arm as a traced index (one program for a grid's CE and DCS arms): each arm's
    gradient equals that of its loss written out alone (CE: `option_ce`; DCS: -dcs; DCS+CE past its warm-up:
    -dcs + beta ce), bit for bit: the arms not chosen add exact zeros."""
    from dcsjax.training.config import ARMS, TrainConfig
    from dcsjax.training.loss import option_ce
    from dcsjax.training.train import arm_loss

    start = LOGITS * 0.5
    alone = {
        "ce": lambda x: option_ce(x, CORRECT, VALID),
        "dcs": lambda x: -dcs_loss(x, CORRECT, IDK, VALID, lc=1.0, lw=3.0, start_logits=start).dcs,
        "dcs+ce": lambda x: (lambda p: -p.dcs + 0.5 * p.ce)(dcs_loss(x, CORRECT, IDK, VALID, lc=1.0, lw=3.0,
                                                                   start_logits=start)),
    }
    cfg = TrainConfig(lc=1.0, lw=3.0, beta=0.5, gamma=0.0, ce_warmup=4)
    traced = jax.jit(jax.grad(lambda x, arm: arm_loss(cfg, x, CORRECT, IDK, VALID, start, 8.0, arm)[0]))
    for i, arm in enumerate(ARMS):
        want = jax.jit(jax.grad(alone[arm]))(LOGITS)
        np.testing.assert_array_equal(np.asarray(traced(LOGITS, jnp.int32(i))), np.asarray(want), err_msg=arm)
    assert traced._cache_size() == 1


def test_the_stated_risk_arm_scores_each_item_at_the_loading_its_prompt_states():
    """cfg.stated: DCS at each item's own lw (Definition 1 per item, by hand from the softmax); without it the
    run's lw for every item, whatever the items' stated loadings; the traced flag (the compiled update's) gives
    the same as the Python one."""
    from dcsjax.training.config import TrainConfig
    from dcsjax.training.train import arm_loss, step_settings

    stated_lw = jnp.array([3.0, 1.0 / 3.0], jnp.float32)  # told t = 0.75 and t = 0.25
    probs = np.asarray(jax.nn.softmax(jnp.where(VALID, LOGITS, -jnp.inf), -1), np.float64)
    correct, idk, valid = (np.asarray(x) for x in (CORRECT, IDK, VALID))

    def by_hand(lw):  # -mean over items of (p_correct - lw p_wrong)(1 - p_idk), lc = 1
        pc = (probs * (correct & ~idk)).sum(-1)
        pw = (probs * (valid & ~correct & ~idk)).sum(-1)
        return -np.mean((pc - np.asarray(lw) * pw) * (1 - (probs * idk).sum(-1)))

    stated = TrainConfig(arm="dcs", stated=True, lw=1.0)
    assert float(arm_loss(stated, LOGITS, CORRECT, IDK, VALID, None, 8.0, stated_lw=stated_lw)[0]) == pytest.approx(
        by_hand([3.0, 1.0 / 3.0]), abs=1e-6)
    plain = TrainConfig(arm="dcs", lw=2.0)
    assert float(arm_loss(plain, LOGITS, CORRECT, IDK, VALID, None, 8.0, stated_lw=stated_lw)[0]) == pytest.approx(
        by_hand([2.0, 2.0]), abs=1e-6)
    static, weights = step_settings(stated)
    traced = jax.jit(lambda w, x: arm_loss(replace(static, **{k: v for k, v in w.items() if k != "arm"}), x, CORRECT,
                                           IDK, VALID, None, 8.0, w["arm"], stated_lw)[0])
    assert float(traced(weights, LOGITS)) == pytest.approx(by_hand([3.0, 1.0 / 3.0]), abs=1e-6)
