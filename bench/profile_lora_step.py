"""Where one LoRA training update's time goes: `train._train_step` (the factored LoRA step of `dcsjax
train-abstain --adapters lora`) on the first training prompts of the abstention data, traced with
`jax.profiler`, its XLA operations summed by what they do (forward or backward weight matmuls, LoRA factor
matmuls, attention, the layer scan's saved activations, zero-filled buffers, the rest).

    python bench/profile_lora_step.py          # about 3 minutes on 2 cores

Prints the table and writes bench/results/profile-lora-step-<time>.json.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from dataclasses import replace

import numpy as np

from common import ROOT, write_record  # bench/common.py
from xla_ops import WEIGHT_MATMULS



def category(name: str, op_name: str) -> str:
    """What an XLA operation of the step does, from its name and the JAX operation it came from."""
    if "broadcast" in name:
        return "zero-filled buffers"
    side = "backward" if "transpose(jvp" in op_name else "forward"
    if "dynamic-update-slice" in name or "dynamic_update_slice" in op_name or "dynamic-slice" in name:
        return f"{side}: the layer scan's saved activations"
    if any(spec in op_name for spec in WEIGHT_MATMULS):
        return f"{side}: weight matmuls"
    if any(key in op_name for key in ("bngts", "btngk", "reduce_max", "select_n", "/exp")):
        return f"{side}: attention"
    if "dot_general" in op_name:
        return f"{side}: LoRA factor matmuls"
    return f"{side}: elementwise and copies"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=16, help="prompts per update (train-abstain's default)")
    parser.add_argument("--lora-layers", type=int, default=None, help="blocks adapted (default all)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    import dcsjax
    from dcsjax.training.data import abstention_splits
    from dcsjax.training.features import letter_features
    from dcsjax.training.train import TrainConfig, _train_step, init_trainable, optimizer_for, step_settings, top_params
    from xla_ops import origins, traced_seconds

    scorer = dcsjax.load(args.model)
    c = scorer.config
    k = args.lora_layers or c.num_layers
    items = abstention_splits(errors=[])["train"][:args.batch]  # MMLU, every subject's questions
    f = letter_features(scorer, items, k)
    batch = f.packed(np.arange(len(f))[None])  # one micro-batch of every item, packed as training packs it
    packed_rows, t = batch.hidden.shape[1:3]
    cfg = replace(TrainConfig(), arm="dcs+ce", adapter="lora", batch_size=args.batch)
    base = top_params(scorer.model, k)
    params = init_trainable(cfg, base)
    optimizer = optimizer_for(cfg)
    opt_state = optimizer.init(params)
    start = np.zeros((1, *f.letters.shape), np.float32)
    static, weights = step_settings(cfg)
    step_args = (c, static, optimizer, weights, params, opt_state, base, scorer.model.output_embedding, batch, start,
                 f.lw[None], jnp.asarray(30.0))

    # one compiled program, both timed and read for its operation names (a jitted call beside
    # lower().compile() would compile the step twice, and the trace's names would be another program's)
    compiled = _train_step.lower(*step_args).compile()
    meta = origins(compiled)

    def update():
        return compiled(*step_args[3:])  # the static arguments (config, settings, optimizer) are compiled in

    jax.block_until_ready(update())  # warm
    walls = []
    for _ in range(2):
        tic = time.perf_counter()
        jax.block_until_ready(update())
        walls.append(time.perf_counter() - tic)
    # zero-filled buffers have no op_name: XLA made them, not a JAX operation
    per_op = traced_seconds(update, lambda name: name in meta or "broadcast" in name)
    seconds = collections.Counter()
    for name, s in per_op.items():
        seconds[category(name, meta.get(name, ""))] += s
    rows = [{"what": what, "seconds": s} for what, s in seconds.most_common()]  # unrounded: they sum to the total
    total = sum(seconds.values())
    print(f"{scorer.name}: one LoRA update of {args.batch} prompts packed into {packed_rows} rows of {t} tokens, "
          f"{k} blocks adapted; "
          f"{min(walls):.2f} s per update (best of {len(walls)}); operation times summed over both threads: {total:.2f} s")
    for r in rows:
        print(f"  {r['seconds']:7.2f} s  {100 * r['seconds'] / total:5.1f}%  {r['what']}")
    top = [{"operation": name, "seconds": round(s, 3), "what": category(name, meta.get(name, "")),
            "from": meta.get(name, "")[-90:]} for name, s in per_op.most_common(12)]
    print("  the slowest operations:")
    for r in top:
        print(f"  {r['seconds']:7.2f} s  {r['operation'][:32]:32} {r['what']:40} {r['from']}")
    out = write_record(args.out, "profile-lora-step", {"model": scorer.name, "batch": [args.batch, t], "lora_layers": k,
                                                       "packed_rows": int(packed_rows),
                                                       "update_s": min(walls), "operations_s": total, "rows": rows,
                                                       "slowest": top}, args)
    print(out)


if __name__ == "__main__":
    sys.exit(main())
