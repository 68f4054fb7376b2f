"""Throughput on an accelerator: a 1B-class Llama-architecture decoder (Llama 3.2 1B's shapes) with bfloat16
weights, scored through the engine's own packed, bucketed pipeline, against the card's bfloat16 matmul
rate measured in the same run. Random weights: a throughput figure only (speed does not depend on the
values). Finishes in well under 5 minutes on an H200-class GPU.

    python bench/gpu_llama1b.py            # on the accelerator
    python bench/gpu_llama1b.py --small    # a tiny config, to check the script on a CPU

Prints a table and writes bench/results/gpu-llama1b-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dcsjax.nn.config import DecoderConfig
from dcsjax.nn.decoder import Decoder
from dcsjax.scorer import Scorer
from peak import matmul_rate  # bench/peak.py, beside this script

LLAMA_1B = DecoderConfig(architecture="llama", vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
                         num_kv_heads=8, head_dim=64, mlp_size=8192, rms_eps=1e-5, rope_base=500000.0,
                         max_context=8192, tie_embeddings=True)
SMALL = DecoderConfig(architecture="llama", vocab_size=4096, hidden_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=32, mlp_size=256, rms_eps=1e-5, rope_base=10000.0, max_context=1024)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    config = SMALL if args.small else LLAMA_1B
    device = jax.devices()[0]
    peak = (matmul_rate((512,), jnp.bfloat16, 2e9) if args.small else matmul_rate((8192,), jnp.bfloat16, 2e13)) / 1e12
    print(f"{device.device_kind}: bf16 matmul {peak:.1f} TFLOP/s measured", flush=True)

    model = Decoder(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    rows = []
    rng = np.random.default_rng(0)
    workloads = [("statements 8-40", 8, 40, 4096, 64), ("passages 100-250", 100, 250, 2048, 64),
                 ("long 700-1000", 700, 1000, 512, 16)]
    if args.small:
        workloads = [(name, min(lo, 150), min(hi, 200), 64, 8) for name, lo, hi, _, _ in workloads]
    for name, lo, hi, n_texts, batch_size in workloads:
        ids = [list(rng.integers(1, config.vocab_size, rng.integers(lo, hi + 1))) for _ in range(n_texts)]
        scorer = Scorer(model, tokenizer=None, document_start_id=0, name="llama-1b-random", batch_size=batch_size,
                        max_batch_tokens=None if not args.small else 16384)
        before = Scorer.compile_count()
        scorer.logprobs_of_ids(ids)  # compiles
        compiles = Scorer.compile_count() - before
        start = time.perf_counter()
        lps = scorer.logprobs_of_ids(ids)
        seconds = time.perf_counter() - start
        tokens = sum(len(x) for x in lps)
        context = float(np.mean([(len(x) + 2) / 2 for x in ids]))
        rate = tokens / seconds
        mfu = config.flops_per_token(context) * rate / (peak * 1e12)
        rows.append({"workload": name, "texts": n_texts, "batch_size": batch_size, "tokens": tokens,
                     "seconds": round(seconds, 3), "tokens_per_s": round(rate), "mfu": round(mfu, 3),
                     "compiles": compiles})
        print(f"  {name:18s} {n_texts:5d} texts  batch {batch_size:3d}  {rate:10.0f} tok/s  MFU {mfu:.1%}  "
              f"({compiles} compiles)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-llama1b-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"device": device.device_kind, "bf16_matmul_tflops": peak,
                                "config": "small" if args.small else "llama-3.2-1b shapes", "rows": rows}, indent=1))
    print(path)


if __name__ == "__main__":
    main()
