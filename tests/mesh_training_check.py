"""Run by tests/test_training.py in a process of its own with 8 simulated CPU devices (JAX_NUM_CPU_DEVICES=8):
the abstention training step against one device, on SmolLM2's real weights: the top adapter and LoRA on a 2x4
mesh (the batch split over `data`, so gradients are summed across devices, and heads, MLP width and vocabulary
over `model`; an 8x1 mesh would only repeat the batch split with the weights copied); prints one JSON line: the
largest parameter and dev-score differences per adapter, and how often each run compiled its update."""

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

import dcsjax
from dcsjax.training.data import abstention_splits
from dcsjax.training.features import letter_features
from dcsjax.training.train import TrainConfig, _train_step, top_params, train


def biggest(a, b) -> float:
    """The largest elementwise difference between two parameter trees."""
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main() -> None:
    scorer = dcsjax.load("smollm2-135m-instruct", progress=False)
    # three MMLU subjects whose prompts all fit one length (at most 126 tokens: one compiled update per run), all
    # taken as one pool (no subject held out, fractions 1, 0, 0) and cut into training and dev items
    items = abstention_splits(("mmlu:world_religions", "mmlu:management", "mmlu:conceptual_physics"), per_task=5,
                              fractions=(1.0, 0.0, 0.0), unseen_share=0.0)["train"]
    features = {"train": letter_features(scorer, [i for k, i in enumerate(items) if k % 3], 2),
                "dev": letter_features(scorer, items[::3], 2)}
    result = {"devices": jax.device_count()}
    base = TrainConfig(arm="dcs+ce", steps=4, batch_size=8, eval_every=2, ce_warmup=1, warmup_steps=1,
                       learning_rate=1e-3, lw=3.0)
    with tempfile.TemporaryDirectory() as tmp:
        for adapter, meshes in (("top", ("2x4",)), ("lora", ("2x4",))):
            cfg = replace(base, adapter=adapter)
            runs, compiles = {}, {}
            for mesh in ("one", *meshes):
                before = _train_step._cache_size()
                runs[mesh] = train(scorer.model, features["train"], features["dev"], cfg, Path(tmp) / f"{adapter}-{mesh}",
                                   2, progress=False, mesh=None if mesh == "one" else mesh, log=lambda _: None)
                compiles[mesh] = _train_step._cache_size() - before
            one = runs["one"]
            result[adapter] = {"moved": biggest(one["last"], top_params(scorer.model, 2)), "compiles": compiles}
            for mesh in meshes:
                other = runs[mesh]
                diff = biggest(one["last"], other["last"])
                score = max(abs(a["dev_score"] - b["dev_score"]) for a, b in zip(one["history"], other["history"]))
                loss = max(abs(a.get("train_loss", 0.0) - b.get("train_loss", 0.0))
                           for a, b in zip(one["history"], other["history"]))
                result[adapter][mesh] = {"param_diff": diff, "dev_score_diff": score, "loss_diff": loss,
                                         "up_sharding": str(other["last"]["layers"]["up"].sharding.spec)}
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
