"""What packing a training batch saves: `train._train_step` (`dcsjax train-abstain`'s update of the top blocks) on
the same random batches of MMLU training prompts, laid out one prompt a row (`LetterFeatures.batch`: padded to
the batch's longest) and packed several to a row (`LetterFeatures.packed`: what training runs).

    python bench/train_step_layouts.py          # about 6 minutes on 2 cores (the frozen-layer pass included)

Each batch is run in both layouts in turn (one warm call per shape first), so both see the same load on the
host. Prints the table and writes bench/results/train-step-layouts-<time>.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from common import ROOT, write_record  # bench/common.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--items", type=int, default=512,
                        help="training prompts (a fixed sample of the split) whose frozen layers are computed")
    parser.add_argument("--batch", type=int, default=16, help="prompts per update (train-abstain's default)")
    parser.add_argument("--batches", type=int, default=24, help="random batches timed, each in both layouts")
    parser.add_argument("--top-layers", type=int, default=2, help="blocks trained (train-abstain's default)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    import dcsjax
    from dcsjax.training.data import abstention_splits
    from dcsjax.training.features import letter_features
    from dcsjax.training.train import (TrainConfig, _train_step, batch_indices, init_trainable, optimizer_for,
                                       step_settings, top_params)

    scorer = dcsjax.load(args.model)
    train = abstention_splits(errors=[])["train"]  # MMLU, the default data's training split, ordered by subject:
    pick = np.random.default_rng(0).permutation(len(train))[:args.items]  # a fixed sample across its subjects
    items = [train[i] for i in sorted(pick)]
    features = letter_features(scorer, items, args.top_layers)
    cfg = TrainConfig(arm="dcs+ce", batch_size=args.batch)
    base = top_params(scorer.model, args.top_layers)
    params = init_trainable(cfg, base)
    optimizer = optimizer_for(cfg)
    opt_state = optimizer.init(params)
    static, weights = step_settings(cfg)
    start = np.zeros((1, args.batch, features.letters.shape[1]), np.float32)
    seconds = {"one prompt a row": [], "packed": []}
    tokens = {layout: [] for layout in seconds}
    prompt_tokens = []
    for step in range(args.batches):
        idx = batch_indices(0, step, 1, args.batch, len(features))
        prompt_tokens.append(int(features.length[idx].sum()))
        for layout, batch in (("one prompt a row", features.batch(idx)), ("packed", features.packed(idx))):
            call = (scorer.config, static, optimizer, weights, params, opt_state, base, scorer.model.output_embedding,
                    batch, start, features.lw[idx], jnp.float32(step))
            jax.block_until_ready(_train_step(*call))  # compiles a new shape, or warms
            tic = time.perf_counter()
            jax.block_until_ready(_train_step(*call))
            seconds[layout].append(time.perf_counter() - tic)
            tokens[layout].append(int(np.prod(batch.hidden.shape[-3:-1])))
    rows = [{"layout": layout, "median_s": float(np.median(s)), "tokens_per_batch": float(np.mean(tokens[layout])),
             "prompt_tokens_per_batch": float(np.mean(prompt_tokens))} for layout, s in seconds.items()]
    print(f"{scorer.name}: top-{args.top_layers} update, {args.batches} random batches of {args.batch} MMLU training "
          "prompts, each in both layouts")
    print(f"{'layout':18} {'median s':>9} {'tokens a batch':>15} {'of them prompt':>15}")
    for r in rows:
        print(f"{r['layout']:18} {r['median_s']:9.3f} {r['tokens_per_batch']:15.0f} {r['prompt_tokens_per_batch']:15.0f}")
    ratio = rows[0]["median_s"] / rows[1]["median_s"]
    print(f"packed is {ratio:.2f}x as fast")
    out = write_record(args.out, "train-step-layouts", {"model": scorer.name, "rows": rows, "speedup": ratio}, args)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
