"""Long passages: dcsjax's attention paths (blockwise, the default for rows of 1024 tokens and more, and the
dense one) against the peer (transformers + torch, same GGUF, float32), same texts, same run.

    python bench/passages.py                                # SmolLM2: passages of 1,100-2,000 and 2,100-4,000 tokens
    python bench/passages.py --models gemma3-270m           # Gemma 3: sliding-window layers skip most tiles
    python bench/passages.py --quick                        # one passage in a 1,024-token row, to check the script runs

Passages are real text: consecutive MMLU questions with their answers (professional law, then the rest of
MMLU's test split in its order), joined until a passage reaches its length. Every token is scored (log p given the document
start and what precedes it). dcsjax: a first pass (compiles included) and a second, timed one, per path;
the dense path is taken by raising `attention.BLOCKWISE_FROM` past the rows (jax's caches cleared, so the
same shapes compile again). The peer: right-padded batches sorted by length, full logits, log-softmax,
gather (lm-eval's HF backend, in effect), at batch sizes 1 and 4; its best counts. Also reported: the
largest per-token gap between the two dcsjax paths and to the peer. Writes bench/results/passages-<time>.json.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from common import ROOT, Peer, cpu_name, matmul_rate, torch_matmul_rate, write_record  # bench/common.py

TASKS = ("mmlu:professional_law", "mmlu")


def passages(scorer, lengths: list[tuple[int, int, int]]) -> list[list[int]]:
    """Token ids (document start first) of passages: for each (count, lo, hi), `count` passages of lengths
    spread evenly over lo..hi tokens, each from the next consecutive questions."""
    from dcsjax.data.tasks import load_task, resolve_task

    texts = [f"{i.question} The answer is {i.choices[i.correct[0]]}." for t in TASKS
             for i in load_task(resolve_task(t))[0]]
    pieces = scorer.encode(texts)
    out, at = [], 0
    for count, lo, hi in lengths:
        for target in np.linspace(lo, hi, count).astype(int):
            ids = [scorer.document_start_id]
            while len(ids) < target:
                ids += pieces[at % len(pieces)]
                at += 1
            out.append(ids[:target])
    return out


def main() -> None:
    import jax

    import dcsjax
    from dcsjax.nn import attention

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m-instruct")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    lengths = [(1, 1000, 1020)] if args.quick else [(8, 1100, 2000), (4, 2100, 4000)]
    peak = {"xla": matmul_rate(work=2e9 if args.quick else 2e10) / 1e9,
            "torch": torch_matmul_rate(work=2e9 if args.quick else 2e10) / 1e9}  # float32 GFLOP/s
    print(f"{cpu_name()}, {os.cpu_count()} cores: float32 matmul XLA {peak['xla']:.0f} GFLOP/s, "
          f"torch {peak['torch']:.0f}", flush=True)
    rows = []
    for name in args.models.split(","):
        scorer = dcsjax.load(name)
        ids = passages(scorer, lengths)
        tokens = sum(len(x) - 1 for x in ids)
        print(f"{name}: {len(ids)} passages, {tokens} scored tokens "
              f"({min(len(x) for x in ids)}-{max(len(x) for x in ids)} each)", flush=True)
        scores, row = {}, {"model": name, "passages": len(ids), "tokens": tokens,
                           "lengths": [len(x) for x in ids], "blockwise_from": attention.BLOCKWISE_FROM}
        for path, threshold in (("blockwise", attention.BLOCKWISE_FROM), ("dense", 1 << 30)):
            attention.BLOCKWISE_FROM = threshold
            jax.clear_caches()
            start = time.perf_counter()
            scorer.logprobs_of_ids([x[1:] for x in ids])  # the scorer puts the document start back
            first = time.perf_counter() - start
            start = time.perf_counter()
            scores[path] = scorer.logprobs_of_ids([x[1:] for x in ids])
            seconds = time.perf_counter() - start
            row[path] = {"seconds": round(seconds, 2), "first_pass_s": round(first, 2),
                         "tokens_per_s": round(tokens / seconds, 1)}
            print(f"  dcsjax {path:9s} {tokens / seconds:7.1f} tokens/s (first pass {first:.1f} s)", flush=True)
        attention.BLOCKWISE_FROM = row["blockwise_from"]
        peer = Peer(name, "float32")
        peer.token_logprobs(ids[:1], 1)  # warm-up
        row["peer"] = {}
        for batch in ((1,) if args.quick else (1, 4)):
            start = time.perf_counter()
            scores["peer"] = peer.token_logprobs(ids, batch)
            seconds = time.perf_counter() - start
            row["peer"][f"batch {batch}"] = {"seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1)}
            print(f"  peer batch {batch}       {tokens / seconds:7.1f} tokens/s", flush=True)
        best_peer = max(r["tokens_per_s"] for r in row["peer"].values())
        for path in ("blockwise", "dense"):
            row[path]["x_peer_best"] = round(row[path]["tokens_per_s"] / best_peer, 2)
        gap = lambda a, b: float(max(np.abs(x - y).max() for x, y in zip(scores[a], scores[b])))  # noqa: E731
        row["max_gap_blockwise_dense"] = gap("blockwise", "dense")
        row["max_gap_blockwise_peer"] = gap("blockwise", "peer")
        row["blockwise_over_dense"] = round(row["dense"]["seconds"] / row["blockwise"]["seconds"], 2)
        print(f"  blockwise: {row['blockwise']['x_peer_best']}x the peer's best, {row['blockwise_over_dense']}x the "
              f"dense path; largest gaps per token: {row['max_gap_blockwise_dense']:.1e} to dense, "
              f"{row['max_gap_blockwise_peer']:.1e} to the peer", flush=True)
        rows.append(row)
    path = write_record(args.out, "passages", {"matmul_gflops_float32": peak, "rows": rows}, args)
    print(f"\n{path}")


if __name__ == "__main__":
    main()
