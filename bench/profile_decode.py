"""Where a greedy decode's time goes: `dcsjax.engine.generate._decode` (one prefill, then the decoding loop) on
APX's prompts with a fixed budget of new tokens (no early stop), traced with `jax.profiler`, its XLA
operations summed by what they do (weight matmuls, the output head, attention over the KV cache, writing
the cache, copies, the rest), per decode step: a run of N new tokens less a run of one, over N - 1.

    python bench/profile_decode.py             # SmolLM2, 16 prompts, 64 new tokens: about 2 minutes on 2 cores

Prints the table and writes bench/results/profile-decode-<time>.json. The same script run from an older
checkout (a git worktree, PYTHONPATH pointing at it) profiles that code's decoding on the same workload.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import numpy as np

from common import ROOT, write_record  # bench/common.py
from xla_ops import WEIGHT_MATMULS



def category(name: str, op_name: str) -> str:
    """What an XLA operation of the decode does, from its name and the JAX operation it came from."""
    if "bd,vd->bv" in op_name:
        return "output head (logits over the vocabulary)"
    if any(spec in op_name for spec in WEIGHT_MATMULS):
        return "weight matmuls"
    if any(key in op_name for key in ("bngts", "btngk", "bngt", "reduce_max", "/exp")):
        return "attention over the cache"
    if "scatter" in name or "scatter" in op_name or "dynamic-update-slice" in name:
        return "cache writes"
    if "dynamic-slice" in name:  # XLA's CPU backend copies a scan's slice of the stacked arrays before a dot
        return "copies: the layer scan's slices of the weights and the cache"
    if "transpose" in name:
        return "copies: transposed (the cache slice laid out for the attention's dots)"
    if name.startswith("copy") or "concatenate" in name or "select" in name:
        return "copies and selects (a cache rebuilt)"
    if "argmax" in op_name or "reduce" in name:
        return "sampling and reductions"
    return "elementwise and the rest"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16, help="APX prompts, one batch")
    parser.add_argument("--new", type=int, default=64, help="new tokens per prompt (no early stop)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp

    import dcsjax
    from dcsjax.engine.generate import _decode
    from dcsjax.engine.packing import bucket_for
    from generation import prompts_of
    from xla_ops import origins, traced_seconds

    scorer = dcsjax.load(args.model)
    prompts = prompts_of(scorer, "apx", args.prompts)
    bucket = bucket_for(max(map(len, prompts)), scorer.buckets)
    tokens = np.zeros((len(prompts), bucket), np.int32)
    for r, p in enumerate(prompts):
        tokens[r, :len(p)] = p
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(len(prompts)))

    # one compiled program per budget, both timed and read for its operation names (a jitted call and a
    # separate lower().compile() would compile each twice)
    args_in = (scorer.graphdef, scorer.state, jnp.asarray(tokens), lengths, keys)
    programs = {new: _decode.lower(*args_in, new, 0.0, 1.0, ()).compile() for new in (1, args.new)}

    def decode(new: int):
        return programs[new](*args_in[1:])  # the static arguments (graphdef, budget, settings) are compiled in

    walls = {}
    for new in (1, args.new):  # one new token is the prefill alone: the difference is the decoding loop
        jax.block_until_ready(decode(new))  # warm
        runs = []
        for _ in range(2):
            tic = time.perf_counter()
            jax.block_until_ready(decode(new))
            runs.append(time.perf_counter() - tic)
        walls[new] = min(runs)
    step_s = (walls[args.new] - walls[1]) / (args.new - 1)

    def traced(new: int) -> tuple[collections.Counter, collections.Counter]:
        meta = origins(programs[new])
        # a loop's or call's event spans its body's operations, which are counted themselves
        by_op = traced_seconds(lambda: decode(new),
                               lambda name: name in meta and not name.startswith(("while", "call", "conditional")))
        by_kind = collections.Counter()
        for name, s in by_op.items():
            by_kind[category(name, meta[name])] += s
        return by_kind, collections.Counter({(name, meta[name]): s for name, s in by_op.items()})

    # per decode step: a run of `new` tokens less a run of one (the prefill and its first token), over new - 1
    (kind_n, op_n), (kind_1, _) = traced(args.new), traced(1)
    seconds = collections.Counter({k: (kind_n[k] - kind_1[k]) / (args.new - 1) for k in kind_n})
    total = sum(seconds.values())
    rows = [{"what": what, "ms": 1000 * s} for what, s in seconds.most_common()]  # unrounded: they sum to the total
    c = scorer.config
    cache_mb = 2 * c.num_layers * len(prompts) * (bucket + args.new) * c.num_kv_heads * c.head_dim * 4 / 1e6
    print(f"{scorer.name}: {len(prompts)} prompts in a {bucket}-token bucket, {args.new} new tokens each; "
          f"prefill and first token {walls[1]:.2f} s, then {1000 * step_s:.1f} ms per decode step "
          f"({len(prompts) / step_s:.1f} tokens/s; KV cache {cache_mb:.0f} MB). Per decode step, operation "
          f"times summed over both threads: {1000 * total:.1f} ms")
    for r in rows:
        print(f"  {r['ms']:7.1f} ms  {100 * r['ms'] / (1000 * total):5.1f}%  {r['what']}")
    top = [{"operation": name, "s": round(s, 3), "what": category(name, origin), "from": origin[-90:]}
           for (name, origin), s in op_n.most_common(12)]
    print(f"  the slowest operations of the traced run of {args.new} tokens (its prefill included):")
    for r in top:
        print(f"  {r['s']:7.2f} s  {r['operation'][:24]:24} {r['what']:40} {r['from']}")
    out = write_record(args.out, "profile-decode", {
        "model": scorer.name, "prompts": len(prompts), "bucket": bucket, "new_tokens": args.new, "prefill_s": walls[1],
        "decode_step_s": step_s, "tokens_per_s": len(prompts) / step_s, "kv_cache_mb": cache_mb,
        "step_operations_s": total, "rows": rows, "slowest": top}, args)
    print(out)


if __name__ == "__main__":
    sys.exit(main())
