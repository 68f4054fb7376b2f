"""Fine-tuning a real model for abstention: one arm (loss), one adapter and one seed per run.

The adapted part is the top `k` blocks (and the final norm), taken out of the NNX model as a plain pytree:
the blocks are stacked along a leading `layers` axis, so "the top k layers" is a slice of every block
parameter, which no NNX variable filter can express. The lower layers are frozen and their output is
cached (`features.py`); the embedding (tied to the output head in SmolLM2) stays frozen. Two adapters
(`ADAPTERS`):
- "top": the top k blocks' weights and the final norm are trained outright;
- "lora": low-rank adapters on every attention and MLP projection (q, k, v, o, gate, up, down) of the top
  k blocks (k = all layers: the whole model), W + (alpha / r) A B with B = 0 at the start, the base weights
  frozen. This is `flax.nnx.LoRA`'s update, written over the stacked layer arrays (nnx.LoRA wraps one
  Linear; here a projection is one slice of a [layers, ...] array and the blocks run under `lax.scan`), and
  merged into the weights for scoring and export (`adapted`), so the exported model is a plain checkpoint.

A run is resumable: orbax checkpoints hold the parameters, the optimizer state, the best parameters so
far and the evaluation log, and the order of the data is a pure function of (seed, step), so a killed run
continues exactly as it would have.

Arms (`ARMS`): "ce" (cross-entropy of the right answer over options and IDK: plain fine-tuning on the same
data), "dcs" (-DCS alone), "dcs+ce" (-DCS + beta * CE within the answer options on answerable items, after
a cross-entropy warm-up that hands over from CE to DCS over `ce_warmup` steps). All may add gamma * KL to
the starting model's option+IDK distribution.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dcsjax.errors import ConfigError, stop_point
from dcsjax.metrics.dcs import dcs, option_masses
from dcsjax.metrics.calibration import ABSTENTION_METRICS, Distributions
from dcsjax.nn.decoder import (
    LowRank, attention_masks, layer_flags, layer_param_shapes, normalize, readout_block, rope_tables,
    run_blocks, unembed,
)
from dcsjax.nn.sharding import make_mesh
from dcsjax.training.config import ARMS, TrainConfig
from dcsjax.training.features import PACKED_ROW_MULTIPLE, LetterFeatures
from dcsjax.training.loss import dcs_loss, option_ce

# Blocks under `jax.checkpoint` in the training step: the backward pass recomputes each block's forward
# from its input instead of keeping every block's activations. A LoRA step over all 30 SmolLM2 blocks on
# 16 prompts of 192 tokens (XLA's memory analysis; 2 cores): 7.6 GB of temporaries and 18.1 s per update
# without, 0.9 GB and 18.4 s with: the backward's matmuls dominate, the recomputed forward adds little.
REMAT_BLOCKS = True

# LoRA's projections: name -> how many leading (after `layers`) axes are its input (o: heads x head_dim)
LORA_PROJECTIONS = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


# ------------------------------------------------------------------------------------------------ model
def top_params(model, top_layers: int) -> dict:
    """The trainable pytree: the top blocks' stacked parameters and the final norm (float32 copies)."""
    finals = [name for name in ("final_norm", "final_norm_bias") if hasattr(model, name)]
    return {"layers": {name: jnp.asarray(v[-top_layers:], jnp.float32) for name, v in model.layers.arrays().items()},
            **{name: jnp.asarray(getattr(model, name)[...], jnp.float32) for name in finals}}


def init_trainable(cfg: TrainConfig, base: dict) -> dict:
    """What the optimizer updates: the top parameters themselves ("top"), or per projection a LoRA pair
    a [k, in, r] (scaled normal, seeded by the run seed) and b [k, r, out] = 0 ("lora")."""
    if cfg.adapter == "top":
        return base
    layers = base["layers"]
    if "expert_up" in layers:
        raise ConfigError("LoRA covers dense MLPs only; a mixture-of-experts model trains with --adapter top")
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), len(LORA_PROJECTIONS))
    lora = {}
    for key, (name, n_in) in zip(keys, LORA_PROJECTIONS.items()):
        if name not in layers:
            continue
        shape = layers[name].shape
        k, d_in, d_out = shape[0], int(np.prod(shape[1:1 + n_in])), int(np.prod(shape[1 + n_in:]))
        lora[name] = {"a": jax.random.normal(key, (k, d_in, cfg.lora_rank), jnp.float32) / np.sqrt(d_in),
                      "b": jnp.zeros((k, cfg.lora_rank, d_out), jnp.float32)}
    return {"lora": lora}


def adapted(cfg: TrainConfig, trainable: dict, base: dict, factored: bool = False) -> dict:
    """The top parameters the model runs with: `trainable` itself, or the base with each LoRA product
    W + (alpha / r) a @ b added: merged (ordinary weights, for scoring and the export), or, with
    `factored`, kept apart as `LowRank` weights (the training step: no weight-sized gradients)."""
    if cfg.adapter == "top":
        return trainable
    scale = cfg.lora_alpha / cfg.lora_rank
    layers = dict(base["layers"])
    for name, pair in trainable["lora"].items():
        if factored:
            layers[name] = LowRank(layers[name], pair["a"], scale * pair["b"])
            continue
        delta = jnp.einsum("lir,lro->lio", pair["a"], pair["b"], precision="highest").reshape(layers[name].shape)
        layers[name] = layers[name] + scale * delta
    return {**base, "layers": layers}


def merge_top(model, params: dict) -> None:
    """Write trained top parameters back into the NNX model (in place)."""
    for name, value in params["layers"].items():
        param = getattr(model.layers, name)
        k = value.shape[0]
        param.set_value(param[...].at[-k:].set(value.astype(param.dtype)))
    for name in ("final_norm", "final_norm_bias"):
        if name in params:
            getattr(model, name).set_value(params[name].astype(getattr(model, name).dtype))


def letter_logits(c, params: dict, output_embedding: jax.Array, hidden: jax.Array, positions: jax.Array,
                  segments: jax.Array, row: jax.Array, last: jax.Array, letters: jax.Array) -> jax.Array:
    """hidden [R, T, D] (after the frozen layers), positions and segments [R, T] (the prompts' layout in the rows:
    `features.LetterBatch`), row and last [B]: where item b's prompt ends, letters [B, K] -> [B, K] float32 logits
    of each option letter as the next token after the prompt's last token."""
    top = jax.tree.leaves(params["layers"])[0].shape[0]
    below = jax.tree.map(lambda a: a[:-1], params["layers"])  # every trained block but the last runs whole
    x, _ = run_blocks(c, below, layer_flags(c, c.num_layers - top, -1), hidden, positions, segments,
                      remat=REMAT_BLOCKS)  # no effect without a gradient (scoring)
    # the last block is read at each prompt's last token only
    # dense masks: the readout block picks the last query's row of them (training prompts are short)
    masks, ropes = attention_masks(c, positions, segments, blockwise=False), rope_tables(c, positions)
    flags = jax.tree.map(lambda a: a[-1], layer_flags(c))
    out = readout_block(c, jax.tree.map(lambda a: a[-1], params["layers"]), x, ropes.pick(flags), masks.pick(flags),
                        last, rows=row)  # [B, D]
    h = normalize(c, out, params["final_norm"], params.get("final_norm_bias")).astype(jnp.float32)
    return unembed(h, output_embedding[letters], c.final_softcap)  # [B, K]: the letters' rows of the head


# ------------------------------------------------------------------------------------------------ loss
def arm_loss(cfg: TrainConfig, logits, correct, idk, valid, start_logits, step, arm=None, stated_lw=None
             ) -> tuple[jax.Array, dict]:
    """The arm's loss and the step's statistics. arm: the index of the arm in `ARMS`, a traced value in the
    compiled update (so that the CE and DCS arms of a grid share one program; the arms not chosen get a zero
    cotangent, which adds exactly nothing to the gradient); None: `cfg.arm`. stated_lw [N]: the cost of a wrong
    answer each item's prompt states, DCS's lw for that item where `cfg.stated` (the stated-risk arm: one model
    told its target per example), else cfg.lw for all."""
    lw = cfg.lw if stated_lw is None else jnp.where(cfg.stated > 0, stated_lw, cfg.lw)
    parts = dcs_loss(logits, correct, idk, valid, lc=cfg.lc, lw=lw, start_logits=start_logits)
    full_ce = option_ce(logits, correct, valid)
    ramp = jnp.minimum(1.0, step / cfg.ce_warmup) if cfg.ce_warmup > 0 else 1.0
    by_arm = jnp.stack([full_ce, -parts.dcs, -ramp * parts.dcs + (cfg.beta + 1.0 - ramp) * parts.ce])  # ARMS' order
    loss = by_arm[ARMS.index(cfg.arm) if arm is None else arm] + cfg.gamma * parts.kl
    return loss, {"loss": loss, "dcs": parts.dcs, "ce": full_ce}


def optimizer_for(cfg: TrainConfig) -> optax.GradientTransformation:
    """AdamW on a warm-up + cosine schedule; the same object for the same schedule, so that runs which share
    it share one compiled update (the optimizer is a static argument of `_train_step`, hashed by identity)."""
    return _optimizer(cfg.learning_rate, cfg.warmup_steps, cfg.steps, cfg.weight_decay)


@lru_cache(maxsize=None)
def _optimizer(learning_rate: float, warmup_steps: int, steps: int, weight_decay: float) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(warmup_steps, 1),
                                                  max(steps, warmup_steps + 1), learning_rate / 10)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=weight_decay))


LOSS_WEIGHTS = ("lc", "lw", "beta", "gamma", "stated")  # traced by the compiled update (the arm too): one compile
# serves every threshold and arm


def step_settings(cfg: TrainConfig) -> tuple[TrainConfig, dict]:
    """(what the compiled update is specialised on, the loss weights it takes as traced values). The settings
    read outside the update (seed, length, schedule, evaluation) are blanked, so runs of an experiment grid that
    differ only in them, or in the threshold's loadings, share one compiled program."""
    weights = {k: jnp.float32(getattr(cfg, k)) for k in LOSS_WEIGHTS} | {"arm": jnp.int32(ARMS.index(cfg.arm))}
    static = replace(cfg, arm=ARMS[-1], seed=0, steps=0, learning_rate=0.0, warmup_steps=0, weight_decay=0.0,
                     eval_every=0, patience=0, **{k: 0.0 for k in LOSS_WEIGHTS})
    return static, weights


def batch_indices(seed: int, step: int, accumulate: int, batch_size: int, n: int) -> np.ndarray:
    """[accumulate, batch_size] item indices of one update: a stream of per-epoch shuffles, a pure
    function of (seed, step) so a resumed run sees exactly the batches it would have."""
    first = step * accumulate * batch_size
    where = np.arange(first, first + accumulate * batch_size)
    epochs = where // n
    out = np.empty_like(where)
    for epoch in np.unique(epochs):
        perm = np.random.default_rng([seed, int(epoch)]).permutation(n)
        out[epochs == epoch] = perm[where[epochs == epoch] % n]
    return out.reshape(accumulate, batch_size)


@partial(jax.jit, static_argnums=(0, 1, 2))
def _train_step(c, cfg: TrainConfig, optimizer, weights, params, opt_state, base, embedding, batch, start_logits,
                stated_lw, step):
    """One update of the trainable `params` (the adapter's; `base` the frozen top parameters) from
    `accumulate` micro-batches (leading axis of every batch array, of `start_logits` and of `stated_lw`), grads
    summed. (cfg, weights) as `step_settings` splits a run's settings."""
    weights = dict(weights)
    arm = weights.pop("arm")
    cfg = replace(cfg, **weights)

    def micro(grads, mb):
        batch, start, stated_lw = mb  # a `features.LetterBatch` (packed), [B, K], [B]

        def loss_fn(p):
            logits = letter_logits(c, adapted(cfg, p, base, factored=True), embedding, *batch.inputs)
            return arm_loss(cfg, logits, *batch.targets, start, step, arm, stated_lw)

        (_, stats), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return jax.tree.map(jnp.add, grads, g), stats

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, stats = jax.lax.scan(micro, zeros, (batch, start_logits, stated_lw))
    grads = jax.tree.map(lambda g: g / cfg.accumulate, grads)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jax.tree.map(jnp.mean, stats)


@partial(jax.jit, static_argnums=(0,))
def _logits(c, params, embedding, inputs):
    return letter_logits(c, params, embedding, *inputs)


def predict_logits(c, params, embedding, features: LetterFeatures, batch_size: int = 32) -> np.ndarray:
    """[N, K] letter logits for every item (padded options: meaningless, masked by `valid`). Items run in
    order of length, each batch cut to its longest prompt."""
    n = len(features)
    out = np.zeros(features.letters.shape, np.float32)
    by_length = np.argsort(features.length, kind="stable")
    for start in range(0, n, batch_size):
        rows = by_length[start:start + batch_size]
        # a full last batch (repeats rows): one compile per length
        logits = _logits(c, params, embedding, features.batch(np.resize(rows, batch_size)).inputs)
        out[rows] = np.asarray(logits)[: len(rows)]
    return out


def distributions(logits: np.ndarray, features: LetterFeatures) -> Distributions:
    """The option+IDK distribution: the letters' next-token probabilities renormalised over the letters."""
    return _distributions(logits, features.correct, features.idk, features.valid)


@jax.jit
def _distributions(logits, correct, idk, valid) -> Distributions:
    return Distributions(jax.nn.softmax(jnp.where(valid, logits, -jnp.inf), axis=-1), correct, idk, valid)


def selection_score(cfg: TrainConfig, logits: np.ndarray, dev: LetterFeatures) -> float:
    """What picks a run's best step and stops it early, on the dev split: the arm's own objective. DCS at
    the run's loadings for the DCS arms; minus the cross-entropy for "ce" (plain fine-tuning selects by its
    own loss, not by the score it is compared on: thresholding it for that score comes afterwards)."""
    lw = dev.lw if cfg.stated else cfg.lw  # the stated-risk arm: each dev item at the loading its prompt states
    return float(_selection_score(cfg.arm == "ce", cfg.lc, lw, logits, dev.correct, dev.idk, dev.valid))


@partial(jax.jit, static_argnums=(0,))  # one program per arm kind and split shape (op by op: dozens)
def _selection_score(by_ce: bool, lc, lw, logits, correct, idk, valid) -> jax.Array:
    if by_ce:
        return -option_ce(logits, correct, valid)
    return jnp.mean(dcs(*option_masses(*_distributions(logits, correct, idk, valid)), lc, lw))


def abstention_metrics(d: Distributions) -> dict[str, float]:
    """Every abstention metric (`metrics.calibration.ABSTENTION_METRICS`) of the distributions, as floats."""
    return {name: float(value) for name, value in jax.device_get(_abstention_metrics(d)).items()}


@jax.jit  # all of them in one program
def _abstention_metrics(d: Distributions) -> dict[str, jax.Array]:
    return {name: metric(d) for name, metric in ABSTENTION_METRICS.items()}


# ------------------------------------------------------------------------------------------------ loop
ALARM_LEVEL = 0.01  # a rate at or below this has collapsed to 0 (one dev item in a hundred)


def collapse_alarm(metrics: dict[str, float]) -> str | None:
    """Why the run has degenerated, or None: abstaining on everything or on nothing."""
    if metrics["coverage"] <= ALARM_LEVEL:
        return f"coverage collapsed to {metrics['coverage']:.3f}: the model abstains on (almost) every dev item"
    if metrics["abstain_unanswerable"] <= ALARM_LEVEL:
        return (f"abstention collapsed to {metrics['abstain_unanswerable']:.3f}: the model answers (almost) every "
                "unanswerable dev item")
    return None


@dataclass
class TrainState:
    """Where a run stands: the trainable parameters, the optimizer's state and the best parameters so far (by the
    dev selection score), and the bookkeeping a resumed run continues from (`progress`: step, best score and
    step, evaluations without improvement, the evaluation history, whether it stopped early, training seconds)."""
    params: dict
    opt_state: object
    best: dict
    progress: dict

    @classmethod
    def start(cls, params: dict, opt_state) -> "TrainState":
        return cls(params, opt_state, params, {"step": 0, "best_score": -float("inf"), "best_step": 0, "stale": 0,
                                               "history": [], "stopped": False, "seconds": 0.0})

    @property
    def step(self) -> int:
        return self.progress["step"]


class Checkpointer:
    """The run's latest state on disk (orbax, one checkpoint kept), and the training time summed over every
    session of the run (a resumed run reports the whole run's seconds)."""

    def __init__(self, folder: Path):
        import orbax.checkpoint as ocp

        self.ocp = ocp
        self.manager = ocp.CheckpointManager(folder.resolve(), options=ocp.CheckpointManagerOptions(max_to_keep=1))
        self.start_clock()

    def start_clock(self) -> None:
        """Training time counts from here (set up, such as the starting model's logits, left out)."""
        self.since = time.time()

    def restore(self, like: TrainState) -> TrainState | None:
        step = self.manager.latest_step()
        if step is None:
            return None
        ocp = self.ocp
        arrays = {"params": like.params, "opt_state": like.opt_state, "best": like.best}
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(arrays),
                                                                      meta=ocp.args.JsonRestore()))
        progress = {"seconds": 0.0, **restored.meta}
        return TrainState(restored.state["params"], restored.state["opt_state"], restored.state["best"], progress)

    def save(self, state: TrainState) -> None:
        ocp, now = self.ocp, time.time()
        state.progress["seconds"] = state.progress.get("seconds", 0.0) + now - self.since
        self.since = now
        arrays = {"params": state.params, "opt_state": state.opt_state, "best": state.best}
        self.manager.save(state.step, args=ocp.args.Composite(state=ocp.args.StandardSave(arrays),
                                                              meta=ocp.args.JsonSave(state.progress)), force=True)
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def _check_run_folder(run_dir: Path, settings: dict) -> None:
    """A run folder holds one run: resuming one made with other settings would mix two runs."""
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / "config.json"
    if saved.is_file() and json.loads(saved.read_text()) != settings:
        raise ConfigError(f"{run_dir} holds a run with other settings ({saved}): resuming it would mix two "
                          "runs; choose another output folder or delete that one")
    saved.write_text(json.dumps(settings, indent=2))


def _dev_eval(c, cfg: TrainConfig, state: TrainState, base, embedding, dev_set: LetterFeatures, stats: dict,
              run_dir: Path, log) -> dict[str, float]:
    """Evaluate the current parameters on dev, record it in the history (and log.jsonl), keep them as the best
    if the selection score improved -> the dev metrics."""
    progress = state.progress
    logits = predict_logits(c, adapted(cfg, state.params, base), embedding, dev_set)
    metrics = abstention_metrics(distributions(logits, dev_set))
    score = selection_score(cfg, logits, dev_set)
    entry = {"step": progress["step"], **{f"dev_{k}": v for k, v in metrics.items()}, "dev_score": score, **stats}
    alarm = collapse_alarm(metrics)
    if alarm:
        entry["alarm"] = alarm
        log(f"ALARM {run_dir.name} step {progress['step']}: {alarm}")
    progress["history"].append(entry)
    if score > progress["best_score"] + 1e-6:
        progress.update(best_score=score, best_step=progress["step"], stale=0)
        state.best = state.params
    else:
        progress["stale"] += 1
    with (run_dir / "log.jsonl").open("w") as f:
        f.writelines(json.dumps(e) + "\n" for e in progress["history"])
    return metrics


def train(model, train_set: LetterFeatures, dev_set: LetterFeatures, cfg: TrainConfig, run_dir: Path,
          top_layers: int, *, progress: bool = True, log: Callable[[str], None] | None = None,
          until: int | None = None, mesh=None) -> dict:
    """Train one arm, adapter and seed, resuming from `run_dir` if it holds a checkpoint. -> the best top
    parameters (by `selection_score` on dev; LoRA merged in) and the evaluation history. until: return after that step
    (checkpointed), as a killed run would stop; calling again resumes. mesh: a `dcsjax.nn.sharding` mesh (or
    "2x4"): the same step with the batch split over `data` and the weights over `model` by the rules table."""
    from tqdm.auto import tqdm

    log = log or (lambda msg: print(msg, file=sys.stderr))
    c = model.config
    _check_run_folder(run_dir, asdict(cfg) | {"top_layers": top_layers, "train_items": len(train_set),
                                              "dev_items": len(dev_set)})
    embedding = model.output_embedding
    base = top_params(model, top_layers)
    params = init_trainable(cfg, base)
    mesh = make_mesh(mesh)
    row_multiple = PACKED_ROW_MULTIPLE  # a packed batch's rows: split over the mesh's data devices too
    if mesh is not None:
        base, params, embedding = on_mesh(mesh, c, base, params, embedding)
        row_multiple = math.lcm(row_multiple, mesh.shape["data"])
    optimizer = optimizer_for(cfg)
    static, weights = step_settings(cfg)
    state = TrainState.start(*as_returned(mesh, (params, optimizer.init(params))))
    checkpoints = Checkpointer(run_dir / "checkpoints")
    resumed = checkpoints.restore(state)
    if resumed is not None:
        state = resumed
        log(f"{run_dir.name}: resumed at step {state.step}")

    last_step = min(cfg.steps, until or cfg.steps)
    # the starting model's logits on every training item, for the KL term: a forward pass over the whole
    # training split (through every block with LoRA), so only when there are steps left to take
    to_train = state.step < last_step and not state.progress["stopped"]
    start_logits = (predict_logits(c, base, embedding, train_set) if cfg.gamma and to_train else
                    np.zeros(train_set.letters.shape, np.float32))
    checkpoints.start_clock()
    bar = tqdm(total=cfg.steps, initial=state.step, desc=run_dir.name, disable=not progress, file=sys.stderr)
    stats: dict = {}
    if not state.progress["history"]:
        _dev_eval(c, cfg, state, base, embedding, dev_set, stats, run_dir, log)  # the starting point
        checkpoints.save(state)
    while state.step < last_step and not state.progress["stopped"]:
        stop_point()
        idx = batch_indices(cfg.seed, state.step, cfg.accumulate, cfg.batch_size, len(train_set))
        batch, start, stated_lw = train_set.packed(idx, row_multiple), start_logits[idx], train_set.lw[idx]
        if mesh is not None:
            batch, start, stated_lw = jax.device_put((batch, start, stated_lw), batch_on_mesh(mesh, cfg.batch_size))
        state.params, state.opt_state, step_stats = _train_step(
            c, static, optimizer, weights, state.params, state.opt_state, base, embedding, batch, start, stated_lw,
            jnp.asarray(state.step, jnp.float32))
        state.progress["step"] += 1
        stats = {f"train_{k}": float(v) for k, v in step_stats.items()}
        bar.update(1)
        if state.step % cfg.eval_every == 0 or state.step == cfg.steps:
            metrics = _dev_eval(c, cfg, state, base, embedding, dev_set, stats, run_dir, log)
            bar.set_postfix(loss=f"{stats['train_loss']:.3f}", dev_dcs=f"{metrics['dcs']:+.3f}",
                            cov=f"{metrics['coverage']:.2f}", abst=f"{metrics['abstain_unanswerable']:.2f}")
            if state.progress["stale"] >= cfg.patience:
                state.progress["stopped"] = True
                log(f"{run_dir.name}: early stop at step {state.step} (best dev score "
                    f"{state.progress['best_score']:+.3f} at step {state.progress['best_step']})")
            checkpoints.save(state)
        elif state.step == until:
            checkpoints.save(state)
    bar.close()
    checkpoints.close()
    p = state.progress
    return {"best": adapted(cfg, state.best, base), "last": adapted(cfg, state.params, base),
            "history": p["history"], "best_step": p["best_step"], "best_score": p["best_score"],
            "steps": p["step"], "seconds": p.get("seconds")}


def on_mesh(mesh, c, base: dict, trainable: dict, embedding: jax.Array):
    """The frozen top parameters and the embedding split by the rules table (heads, MLP width and
    vocabulary over `model`), the trainable ones likewise: the top blocks as the frozen ones, a LoRA pair by the
    side it shares with its projection where that side is one axis (the MLP width of gate's and up's `b` and of
    down's `a`, as XLA's partitioner would place them), else replicated. XLA then runs the same jitted step as
    on one device."""
    from dcsjax.nn.sharding import place

    axes = {name: ("layers", *spec[1]) for name, spec in layer_param_shapes(c).items()}
    layer_axes = lambda tree: {"layers": {k: axes[k] for k in tree["layers"]},  # noqa: E731
                               **{k: ("embed",) for k in tree if k != "layers"}}
    put = lambda tree, spec: jax.tree.map(lambda x, a: place(np.asarray(x), a, mesh, x.dtype), tree, spec,  # noqa: E731
                                          is_leaf=lambda a: isinstance(a, tuple))

    def lora_axes(name: str) -> dict:
        n_in = LORA_PROJECTIONS[name]
        side_in, side_out = axes[name][1:1 + n_in], axes[name][1 + n_in:]
        one = lambda side: side[0] if len(side) == 1 else None  # noqa: E731  (a flattened side: no rule)
        return {"a": ("layers", one(side_in), None), "b": ("layers", None, one(side_out))}

    base = put(base, layer_axes(base))
    spec = layer_axes(trainable) if "layers" in trainable else {"lora": {k: lora_axes(k) for k in trainable["lora"]}}
    trainable = as_returned(mesh, put(trainable, spec))
    return base, trainable, place(np.asarray(embedding), ("vocab", "embed"), mesh, embedding.dtype)


def as_returned(mesh, tree):
    """The arrays placed as the jitted update returns them and as a restored checkpoint holds them, so that
    neither the second update nor a resumed run's first compiles again. Without a mesh: committed to the
    device (orbax restores committed arrays, and jit keys its cache on that). On a mesh: specs without trailing
    `None`s (P(None, 'model') for P(None, 'model', None): the same layout, but another key in jit's cache) and
    what sits on one device (optax's step count) replicated over the mesh."""
    if mesh is None:
        return jax.device_put(tree, jax.devices()[0])

    def settle(x):
        if isinstance(x.sharding, NamedSharding):
            spec = list(x.sharding.spec)
            while spec and spec[-1] is None:
                spec.pop()
            return jax.device_put(x, NamedSharding(mesh, P(*spec)))
        return jax.device_put(x, NamedSharding(mesh, P()))

    return jax.tree.map(settle, tree)


def batch_on_mesh(mesh, batch_size: int) -> NamedSharding:
    """Micro-batch arrays [accumulate, batch, ...]: rows over `data` where it divides them."""
    data = mesh.shape["data"]
    return NamedSharding(mesh, P(None, "data") if batch_size % data == 0 else P())
