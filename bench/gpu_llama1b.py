"""Throughput on an accelerator: 1B-class decoders (Llama 3.2 1B's and Gemma 3 1B's shapes) with bfloat16
weights (float32 log-probs), scored through the engine's own packed, bucketed pipeline, against the card's
bfloat16 matmul rate measured in the same run; long rows (the blockwise attention path; each row names the
path it took) and greedy generation tokens/s. Random weights: a throughput figure only (speed does not
depend on the values). Meant to finish in under 5 minutes on an H200-class GPU.

    python bench/gpu_llama1b.py            # on the accelerator
    python bench/gpu_llama1b.py --small    # tiny configs, to check the script on a CPU

Beside what it measures, the record holds XLA's own estimate for this device of a packed scoring step
(`dcsjax.engine.plan.plan_scoring`, the cost model `dcsjax plan` reads for TPU): 16 fully packed rows of
1,024 tokens, the shape of the "long 700-1000" workload's batches, so that the first run on a device
measures the estimate's error.

Before the speeds, two checks of what the engine computes on this device: float32 log-probs of a
float32 decoder against the same weights scored on the host's CPU, and the Pallas kernel compiled for this device
against the dense path on packed rows with a shared question (float32).

Prints a table and writes bench/results/gpu-llama1b-<time>.json.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dcsjax.engine.generate import generate
from dcsjax.nn.attention import takes_blockwise
from dcsjax.nn.config import GEMMA_TRAITS, DecoderConfig
from dcsjax.nn.decoder import Decoder
from dcsjax.engine.scorer import Scorer
from common import matmul_rate, write_record  # bench/common.py, beside this script

LLAMA_1B = DecoderConfig(architecture="llama", vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
                         num_kv_heads=8, head_dim=64, mlp_size=8192, rms_eps=1e-5, rope_base=500000.0,
                         max_context=8192, tie_embeddings=True)
GEMMA3_1B = DecoderConfig(architecture="gemma3", vocab_size=262144, hidden_size=1152, num_layers=26, num_heads=4,
                          num_kv_heads=1, head_dim=256, mlp_size=6912, rms_eps=1e-6, rope_base=1_000_000.0,
                          max_context=32768, sliding_window=512, local_rope_base=10_000.0,
                          layer_is_local=tuple((i + 1) % 6 != 0 for i in range(26)), query_pre_attn_scalar=256.0,
                          embed_scale=1152 ** 0.5, qk_norm="head", norms="pre+post", **GEMMA_TRAITS)
# float32 accuracy check: big enough that its matmuls take the GPU's tensor-core paths
MEDIUM = DecoderConfig(architecture="llama", vocab_size=32768, hidden_size=1024, num_layers=4, num_heads=16,
                       num_kv_heads=4, head_dim=64, mlp_size=4096, rms_eps=1e-5, rope_base=10000.0, max_context=2048)
SMALL = DecoderConfig(architecture="llama", vocab_size=4096, hidden_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=32, mlp_size=256, rms_eps=1e-5, rope_base=10000.0, max_context=2048)
SMALL_GEMMA = DecoderConfig(architecture="gemma3", vocab_size=4096, hidden_size=128, num_layers=2, num_heads=2,
                            num_kv_heads=1, head_dim=64, mlp_size=256, rms_eps=1e-6, rope_base=10000.0,
                            max_context=2048, sliding_window=128, local_rope_base=10000.0,
                            layer_is_local=(True, False), qk_norm="head", norms="pre+post", **GEMMA_TRAITS)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    peak = (matmul_rate((512,), jnp.bfloat16, 2e9) if args.small else matmul_rate((8192,), jnp.bfloat16, 2e13)) / 1e12
    print(f"{device.device_kind}: bf16 matmul {peak:.1f} TFLOP/s measured", flush=True)

    checks = {"float32_logprobs": float32_check(SMALL, 16) if args.small else float32_check(MEDIUM)}
    if jax.default_backend() == "gpu":
        checks["pallas_compiled"] = pallas_check()

    models = {"llama-3.2-1b shapes": SMALL if args.small else LLAMA_1B,
              "gemma-3-1b shapes": SMALL_GEMMA if args.small else GEMMA3_1B}
    rows = []
    rng = np.random.default_rng(0)
    # (name, shortest, longest, texts, rows per batch)
    workloads = [("statements 8-40", 8, 40, 4096, 64), ("passages 100-250", 100, 250, 2048, 64),
                 ("long 700-1000", 700, 1000, 512, 16), ("long 3000-4000", 3000, 4000, 64, 4)]
    if args.small:  # the shortest and the longest, capped: one through the dense path, one through the blockwise
        workloads = [(name, min(lo, 1100), min(hi, 1200), 8, 4) for name, lo, hi, _, _ in workloads[::3]]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a run cut short still writes what it measured
    finished = False
    try:
        for model_name, config in models.items():
            rows.append(xla_estimate(model_name, config, device, peak, small=args.small))
            model = Decoder(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
            for name, lo, hi, n_texts, batch_size in workloads:
                ids = [list(rng.integers(1, config.vocab_size, rng.integers(lo, hi + 1))) for _ in range(n_texts)]
                scorer = Scorer(model, tokenizer=None, document_start_id=0, name=model_name, batch_size=batch_size,
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
                paths = sorted({"blockwise" if takes_blockwise(b) else "dense" for b, _, _ in scorer.plan([len(x) + 1 for x in ids])})
                rows.append({"model": model_name, "workload": name, "texts": n_texts, "batch_size": batch_size,
                             "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(rate),
                             "mfu": round(mfu, 3), "compiles": compiles, "attention": "+".join(paths)})
                print(f"  {model_name:20s} {name:18s} {n_texts:5d} texts  batch {batch_size:3d}  {rate:10.0f} tok/s  "
                      f"MFU {mfu:.1%}  {'+'.join(paths):9s} ({compiles} compiles)", flush=True)
                if "blockwise" in paths and jax.default_backend() == "gpu":  # the same rows through the Pallas kernel
                    os.environ["DCSJAX_LONG_ROWS"] = "pallas"
                    jax.clear_caches()
                    try:
                        scorer.logprobs_of_ids(ids)
                        start = time.perf_counter()
                        pallas_lps = scorer.logprobs_of_ids(ids)
                        seconds = time.perf_counter() - start
                        gap = float(max(np.abs(a - b).max() for a, b in zip(lps, pallas_lps)))
                        rows[-1]["pallas"] = {"tokens_per_s": round(tokens / seconds), "max_gap_to_blockwise": gap}
                        print(f"  {'':20s} {'  the same, Pallas':18s} {tokens / seconds:38.0f} tok/s  gap {gap:.1e}",
                              flush=True)
                    except Exception as error:  # never run on a GPU before: report, keep the rest of the run
                        rows[-1]["pallas"] = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
                        print(f"  Pallas kernel failed: {rows[-1]['pallas']['error']}", flush=True)
                    finally:
                        os.environ.pop("DCSJAX_LONG_ROWS")
                        jax.clear_caches()
            # greedy decoding, fixed budget: prompts of 100-200 tokens, 64 new tokens each (no early stop)
            scorer = Scorer(model, tokenizer=None, document_start_id=0, name=model_name)
            n_prompts, batch, new = (8, 8, 8) if args.small else (256, 64, 64)
            prompts = [list(rng.integers(1, config.vocab_size, rng.integers(100, 201))) for _ in range(n_prompts)]
            generate(scorer, prompts[:batch], new, batch_size=batch, stop_ids=())  # compiles
            start = time.perf_counter()
            out = generate(scorer, prompts, new, batch_size=batch, stop_ids=())
            seconds = time.perf_counter() - start
            rate = sum(len(x) for x in out) / seconds
            rows.append({"model": model_name, "workload": f"generation: {n_prompts} prompts, {new} new tokens",
                         "batch_size": batch, "seconds": round(seconds, 3), "generated_tokens_per_s": round(rate)})
            print(f"  {model_name:20s} generation {n_prompts} prompts x {new} new tokens, batch {batch}: "
                  f"{rate:8.0f} generated tok/s", flush=True)
        finished = True
    finally:
        path = write_record(args.out, "gpu-llama1b", {"bf16_matmul_tflops": peak, "checks": checks,
                                                      "config": "small" if args.small else "1B shapes",
                                                      "finished": finished, "rows": rows}, args)
        print(path)


def float32_check(config: DecoderConfig, n_texts: int = 64) -> dict:
    """The largest gap (nats a token) between float32 log-probs scored here and the same weights' on the host's
    CPU. The engine promises float32 log-probs; a GPU running float32 matmuls in TensorFloat-32 (a 10-bit
    mantissa, JAX's default there) would break it (`nn.decoder.float32_matmuls` says how it is kept)."""
    rng = np.random.default_rng(1)
    ids = [list(rng.integers(1, config.vocab_size, rng.integers(20, 200))) for _ in range(n_texts)]
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        model = Decoder(config, dtype=jnp.float32, rngs=nnx.Rngs(0))
        reference = Scorer(model, tokenizer=None, document_start_id=0, name="cpu").logprobs_of_ids(ids)
    graphdef, state = nnx.split(model)
    here = nnx.merge(graphdef, jax.device_put(state, jax.devices()[0]))
    result = {"config": f"{config.num_layers} layers, width {config.hidden_size}, vocabulary {config.vocab_size}",
              "texts": n_texts}
    scored = Scorer(here, tokenizer=None, document_start_id=0, name="here").logprobs_of_ids(ids)
    result["max_gap_nats"] = gap = float(max(np.abs(a - b).max() for a, b in zip(scored, reference)))
    print(f"  float32 log-probs here against the same weights' on the CPU: max gap {gap:.2e} nats", flush=True)
    return result


def pallas_check() -> dict:
    """The Pallas kernel compiled for this GPU against the dense path, float32, on rows packed as the scorer packs
    them (a shared question and three continuations, plain sequences, one long sequence, a padding-only row),
    with and without a sliding window and a soft cap. tests/test_attention.py runs the same in interpret mode."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_attention import ROWS, packed_rows

    from dcsjax.nn.attention import NO_WINDOW, dense_attention, pallas_attention

    rng = np.random.default_rng(0)
    b, t, n, g, k = len(ROWS), 1024, 2, 3, 64
    q = jnp.asarray(rng.normal(size=(b, t, n, g, k)), jnp.float32)
    keys, values = (jnp.asarray(rng.normal(size=(b, t, n, k)), jnp.float32) for _ in range(2))
    gaps = {}
    for window in (NO_WINDOW, 128):
        for cap in (None, 50.0):
            parts = packed_rows(t, ROWS)._replace(window=window)
            real = np.asarray(parts.q_segment) > 0
            with jax.default_matmul_precision("highest"):  # the reference: float32 products in full
                dense = dense_attention(q, keys, values, parts.dense(), 0.125, cap)
            try:
                kernel = pallas_attention(q, keys, values, parts, 0.125, cap)
                finite = bool(jnp.isfinite(kernel).all())
                gaps[f"window {window}, cap {cap}"] = {"max_gap": float(jnp.abs(kernel - dense)[real].max()),
                                                      "finite": finite}
            except Exception as error:  # report, keep the rest of the run
                gaps[f"window {window}, cap {cap}"] = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
            print(f"  Pallas kernel compiled here against the dense path, window {window}, cap {cap}: "
                  f"{gaps[f'window {window}, cap {cap}']}", flush=True)
    return gaps


def xla_estimate(model_name: str, config: DecoderConfig, device, peak_tflops: float, small: bool) -> dict:
    """XLA's cost model for this device on a packed scoring step (its estimate, never a measurement)."""
    from dcsjax.engine.plan import Chip, plan_scoring
    from dcsjax.nn.sharding import MESH_AXES

    mesh = jax.make_mesh((1, 1), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=[device])
    limit = (device.memory_stats() or {}).get("bytes_limit", 0) if hasattr(device, "memory_stats") else 0
    chip = Chip(device.device_kind, int(limit), peak_tflops * 1e12)  # the peak measured in this run
    rows, length = (4, 256) if small else (16, 1024)
    r = plan_scoring(config, mesh, chip, rows=rows, length=length, dtype=jnp.bfloat16)
    est = r["estimated_tokens_per_s"]
    print(f"  {model_name:20s} XLA's estimate, {rows} x {length} packed: "
          f"{f'{est:10.0f} tok/s' if est else 'no seconds from this backend'}; compiled/model FLOPs "
          f"{r['compiled_over_model']:.2f}", flush=True)
    return {"model": model_name, "workload": f"XLA's estimate: {rows} x {length} packed rows",
            **{k: r[k] for k in ("compiled_flops", "model_flops", "compiled_over_model", "estimated_seconds",
                                 "estimated_tokens_per_s", "estimated_mfu", "estimate")}}


if __name__ == "__main__":
    main()
