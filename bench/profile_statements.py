"""Where one scoring batch of the statements workload spends its time, float32 and bfloat16: the whole
kernel (decoder, vocabulary head and log-softmax), the decoder alone, and the model's weight matmuls alone
at the same shapes, through XLA (as `decoder.dense` calls it) and through torch (the peer's library), on
the same host and threads. It says how much of a batch is matmul time, and whether the other library
multiplies the same shapes faster: the profile behind a throughput target that is missed.

    python bench/profile_statements.py        # about 3 minutes on 2 cores
    python bench/profile_statements.py --xla-flags ";--xla_cpu_experimental_onednn_fusion_type=dot"

`--xla-flags` runs the XLA side once per setting (';'-separated XLA_FLAGS values, '' for XLA's default),
each in its own process (XLA reads its flags once), and says whether each setting's log-probs equal the
first setting's bit for bit: the way to try XLA's CPU library paths (oneDNN, XNNPACK, YNNPACK) on a host.

Prints a table and writes bench/results/profile-statements-<time>.json. Needs the test extra (torch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, cpu_name, median_seconds, write_record  # noqa: E402  (bench/common.py: the cache variables first)
from throughput import statements  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

MATMULS = ("q", "k", "v", "o", "gate", "up", "down")


def weight_shapes(c) -> list[tuple[int, int]]:
    """(in, out) of every weight matmul of one block (MATMULS' order), flattened as `decoder.dense`
    contracts them: the decoder's own parameter shapes, split where `train.LORA_PROJECTIONS` splits them."""
    from dcsjax.nn.decoder import layer_param_shapes
    from dcsjax.training.train import LORA_PROJECTIONS

    shapes = layer_param_shapes(c)
    return [(int(np.prod(shapes[name][0][:LORA_PROJECTIONS[name]])), int(np.prod(shapes[name][0][LORA_PROJECTIONS[name]:])))
            for name in MATMULS]


def xla_matmuls(model, shape: tuple[int, int], repeats: int, chunk: int) -> tuple[float, float]:
    """Seconds for (every block's weight matmuls, the output head) on a [B, T] batch: the model's own
    weights through `decoder.dense` with the decoder's einsums, the layers under `lax.scan` as the decoder
    runs them (attention, norms and activations left out), and the output matrix over vocabulary chunks
    as the log-prob kernel takes it."""
    from dcsjax.nn.decoder import dense

    c = model.config
    weights = {name: model.layers.arrays()[name] for name in MATMULS}
    out = model.output_embedding  # [V, D]
    n_chunks = -(-c.vocab_size // chunk)
    head = jnp.pad(out, ((0, n_chunks * chunk - c.vocab_size), (0, 0))).reshape(n_chunks, chunk, c.hidden_size)
    x0 = jax.random.normal(jax.random.key(0), (*shape, c.hidden_size), out.dtype)

    @jax.jit
    def blocks(x, weights):
        def block(x, p):
            q = dense("btd,dhk->bthk", x, p["q"])
            kv = dense("bsd,dnk->bsnk", x, p["k"]).sum() + dense("bsd,dnk->bsnk", x, p["v"]).sum()  # cost only
            h = dense("btd,df->btf", x, p["gate"]) * dense("btd,df->btf", x, p["up"])
            return x + dense("bthk,hkd->btd", q, p["o"]) + dense("btf,fd->btd", h, p["down"]) + kv.astype(x.dtype), None

        return jax.lax.scan(block, x, weights)[0]

    @jax.jit
    def output_head(x, head):
        return jax.lax.map(lambda w: jnp.einsum("btd,vd->btv", x, w, preferred_element_type=jnp.float32).max(), head)

    return median_seconds(lambda: blocks(x0, weights), repeats), median_seconds(lambda: output_head(x0, head), repeats)


def torch_matmuls(c, m: int, dtype: str, repeats: int, chunk: int) -> tuple[float, float]:
    """The same matmuls through torch (its Linear layers' kernel), the peer's threads."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    dt = getattr(torch, dtype)
    ws = [[torch.randn(a, b).to(dt) / a ** 0.5 for a, b in weight_shapes(c)] for _ in range(c.num_layers)]
    head = [(torch.randn(c.hidden_size, chunk) / c.hidden_size ** 0.5).to(dt) for _ in range(-(-c.vocab_size // chunk))]
    x0 = torch.randn(m, c.hidden_size).to(dt)

    def blocks():
        x = x0
        with torch.inference_mode():
            for q, k, v, o_w, gate, up, down in ws:
                kv = (x @ k).sum() + (x @ v).sum()
                x = x + (x @ q) @ o_w + ((x @ gate) * (x @ up)) @ down + kv
        return x

    def output_head():
        with torch.inference_mode():
            return [float((x0 @ w).float().max()) for w in head]

    return (median_seconds(blocks, repeats, wait=lambda x: x),
            median_seconds(output_head, repeats, wait=lambda x: x))


def profile(model: str, dtype: str, n: int, batch_size: int, repeats: int, with_torch: bool = True,
            logprobs_to: Path | None = None) -> dict:
    import dcsjax
    from dcsjax.engine.logprobs import token_logprobs_and_greedy
    from dcsjax.engine.packing import Group, make_batch
    from dcsjax.engine.batches import _batch_logprobs

    scorer = dcsjax.load(model, dtype=dtype)
    scorer = scorer.replace(batch_size=batch_size)
    c = scorer.config
    ids = scorer.encode(statements(scorer.tokenizer, n, 8, 40))
    groups = [Group((scorer.document_start_id, *x)) for x in ids]
    plan = scorer.plan([g.room for g in groups])
    (bucket, height), _ = Counter((b, h) for b, _, h in plan).most_common(1)[0]  # the usual batch shape
    rows = next(r for b, r, h in plan if (b, h) == (bucket, height))
    batch = make_batch(groups, bucket, rows, height)
    arrays = jax.device_put((batch.tokens, batch.positions, batch.segment_ids, batch.attend_to, batch.targets))
    graphdef, state = scorer.graphdef, scorer.state
    model_ = scorer.model

    whole = median_seconds(lambda: _batch_logprobs(graphdef, scorer.vocab_chunk, None, state, *arrays), repeats)
    if logprobs_to is not None:  # the scores this setting computes, for the comparison across XLA flags
        np.save(logprobs_to / f"{dtype}.npy", np.asarray(_batch_logprobs(graphdef, scorer.vocab_chunk, None, state, *arrays)))
    decoder = jax.jit(lambda t, p, s, a: model_(t, p, s, a))
    hidden = decoder(*arrays[:4])
    decoder_s = median_seconds(lambda: decoder(*arrays[:4]), repeats)
    head = jax.jit(lambda h, t: token_logprobs_and_greedy(h, model_.output_embedding, t, scorer.vocab_chunk,
                                                          c.final_softcap)[0])
    head_s = median_seconds(lambda: head(hidden, arrays[4]), repeats)
    m = bucket * height
    xla_blocks, xla_head = xla_matmuls(model_, (height, bucket), repeats, scorer.vocab_chunk)
    torch_blocks, torch_head = torch_matmuls(c, m, dtype, repeats, scorer.vocab_chunk) if with_torch else (None, None)
    block_flops = 2.0 * m * c.num_layers * sum(a * b for a, b in weight_shapes(c))
    head_flops = 2.0 * m * c.hidden_size * c.vocab_size
    scored = int(sum(s.length - 1 for s in batch.spans))
    return {"model": scorer.name, "dtype": dtype, "batch": [height, bucket], "scored_tokens": scored,
            "whole_s": whole, "decoder_s": decoder_s, "head_and_logsoftmax_s": head_s,
            "block_matmuls_xla_s": xla_blocks, "block_matmuls_torch_s": torch_blocks,
            "head_matmul_xla_s": xla_head, "head_matmul_torch_s": torch_head,
            "block_gflop": block_flops / 1e9, "head_gflop": head_flops / 1e9,
            "whole_tokens_per_s": scored / whole,
            "xla_block_gflops": block_flops / xla_blocks / 1e9, "xla_head_gflops": head_flops / xla_head / 1e9,
            "torch_block_gflops": block_flops / torch_blocks / 1e9 if with_torch else None,
            "torch_head_gflops": head_flops / torch_head / 1e9 if with_torch else None,
            "matmul_share_of_whole": (xla_blocks + xla_head) / whole}


def under_flags(args, settings: list[str]) -> list[dict]:
    """`profile` for every dtype under each XLA_FLAGS setting, one child process per setting (torch only in
    the first), each row marked with its flags and how far its log-probs are from the first setting's."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, flags in enumerate(settings):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            command = [sys.executable, __file__, "--model", args.model, "--dtypes", args.dtypes,
                       "--statements", str(args.statements), "--batch-size", str(args.batch_size),
                       "--repeats", str(args.repeats), "--child-folder", str(folder)] + (["--no-torch"] if i or args.no_torch else [])
            print(f"XLA_FLAGS={flags!r}", flush=True)
            subprocess.run(command, env={**os.environ, "XLA_FLAGS": flags}, check=True)
            for r in json.loads((folder / "rows.json").read_text()):
                first = np.load(Path(tmp) / "0" / f"{r['dtype']}.npy")
                mine = np.load(folder / f"{r['dtype']}.npy")
                rows.append(dict(r, xla_flags=flags, max_abs_diff_vs_first=float(np.abs(mine - first).max()),
                                 bit_identical_to_first=bool(np.array_equal(mine, first))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--statements", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--xla-flags", default=None,
                        help="';'-separated XLA_FLAGS settings to compare, one process each ('' = XLA's default)")
    parser.add_argument("--no-torch", action="store_true", help="leave out torch's matmuls")
    parser.add_argument("--child-folder", help=argparse.SUPPRESS)  # set by --xla-flags for its children
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON")
    args = parser.parse_args()

    if args.child_folder:
        folder = Path(args.child_folder)
        rows = [profile(args.model, d, args.statements, args.batch_size, args.repeats, not args.no_torch, folder)
                for d in args.dtypes.split(",")]
        (folder / "rows.json").write_text(json.dumps(rows))
        return
    if args.xla_flags is not None:
        rows = under_flags(args, args.xla_flags.split(";"))
    else:
        rows = [profile(args.model, d, args.statements, args.batch_size, args.repeats, not args.no_torch)
                for d in args.dtypes.split(",")]
    print(f"{rows[0]['model']}, one [{rows[0]['batch'][0]}, {rows[0]['batch'][1]}] batch of statements, "
          f"{cpu_name()}, {os.cpu_count()} cores; medians of {args.repeats}")
    print(f"{'dtype':9} {'whole':>7} {'decoder':>8} {'head+lsm':>9} | {'blocks XLA':>10} {'torch':>6} | "
          f"{'head XLA':>8} {'torch':>6} | {'GFLOP/s blocks XLA':>18} {'torch':>6} | {'head XLA':>8} {'torch':>6} | "
          f"{'XLA matmuls / whole':>19}")

    def number(value, width: int, scale: float = 1.0) -> str:
        return f"{'-':>{width}}" if value is None else f"{scale * value:{width}.0f}"

    for r in rows:
        if "xla_flags" in r:
            print(f"XLA_FLAGS={r['xla_flags']!r}: log-probs {'bit-identical to' if r['bit_identical_to_first'] else 'differ from'}"
                  f" the first setting's (max |diff| {r['max_abs_diff_vs_first']:.2g})")
        print(f"{r['dtype']:9} {number(r['whole_s'], 7, 1e3)} {number(r['decoder_s'], 8, 1e3)} "
              f"{number(r['head_and_logsoftmax_s'], 9, 1e3)} | {number(r['block_matmuls_xla_s'], 10, 1e3)} "
              f"{number(r['block_matmuls_torch_s'], 6, 1e3)} | {number(r['head_matmul_xla_s'], 8, 1e3)} "
              f"{number(r['head_matmul_torch_s'], 6, 1e3)} | {number(r['xla_block_gflops'], 18)} "
              f"{number(r['torch_block_gflops'], 6)} | {number(r['xla_head_gflops'], 8)} {number(r['torch_head_gflops'], 6)} | "
              f"{r['matmul_share_of_whole']:19.2f}")
    print("(milliseconds per batch; blocks: every block's weight matmuls; head: the output matrix over vocabulary chunks)")
    out = write_record(args.out, "profile-statements", {"repeats": args.repeats, "rows": rows}, args)
    print(out)


if __name__ == "__main__":
    main()
