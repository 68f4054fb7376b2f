"""Scoring throughput of dcsjax against the peer (transformers + torch on the same GGUF weights) and
against the machine's measured float32 matmul rate, in one run, on the same texts.

    python bench/throughput.py                      # both models, full grid (about 15 minutes on 2 cores)
    python bench/throughput.py --models smollm2-135m-instruct --quick

Prints tables and writes bench/results/throughput-<time>.json. Needs the test extra (torch).

Workloads (real text, MMLU's test split from the package index):
- statements: 512 texts of 8 to 40 tokens, question + option as qa-ppl ranks them, over the demo's subjects;
- long: 128 questions with their answers, of 100 to 250 tokens (the 256-token bucket; passages of 1,000+ tokens:
  bench/passages.py);
- options: professional law, long questions with four options each, scored with the shared question (one row:
  question, then every option) and without (each question-option pair alone).
Tokens per second count real tokens only (each scored token once; no padding, no document-start token).
Model FLOPs per token = 2 x (matmul parameters, output head included) + 4 x layers x heads x head_dim x
(mean attended context); MFU = FLOPs per token x tokens/s / the measured float32 matmul rate.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from common import ROOT, Peer, cpu_name, matmul_rate, timed, torch_matmul_rate, write_record  # bench/common.py

MODELS = ("smollm2-135m-instruct", "gemma3-270m")


# ------------------------------------------------------------------------------------------ workloads
def statements(tokenizer, n: int, lo: int, hi: int) -> list[str]:
    from dcsjax.cli import DEMO_TASKS
    from dcsjax.data.tasks import declarative_statements, load_task, qa_texts, resolve_task

    out = []
    for task in DEMO_TASKS:
        card = resolve_task(task)
        for item in load_task(card)[0]:
            out += (declarative_statements(card) or qa_texts(card))(item)
    lengths = [len(x) for x in tokenizer(out, add_special_tokens=False)["input_ids"]]
    picked = [t for t, n_tok in zip(out, lengths) if lo <= n_tok <= hi]
    if len(picked) < n:
        raise SystemExit(f"only {len(picked)} texts of {lo}-{hi} tokens in the demo tasks")
    return picked[:n]


def long_texts(tokenizer, n: int) -> list[str]:
    from dcsjax.data.tasks import load_task, resolve_task

    texts = []
    texts += [f"{i.question} The answer is {i.choices[i.correct[0]]}" for i in load_task(resolve_task("mmlu"))[0]]
    lengths = [len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return [t for t, k in zip(texts, lengths) if 100 <= k <= 250][:n]


def option_items(n: int):
    from dcsjax.data.tasks import load_task, resolve_task
    from dcsjax.eval.protocols.mcqa import mcqa_context

    items = load_task(resolve_task("mmlu:professional_law"))[0][:n]
    return [mcqa_context(i) for i in items], [[" " + c for c in i.choices] for i in items]


# ------------------------------------------------------------------------------------------ the limit
def slot_use(scorer, id_lists) -> float:
    """Real tokens / token slots computed (rows x bucket length over every batch, padding rows included)."""
    slots = sum(bucket * height for bucket, _, height in scorer.plan([len(x) for x in id_lists]))
    return round(sum(len(x) - 1 for x in id_lists) / slots, 3)


# ------------------------------------------------------------------------------------------ runners
def dcsjax_statements(scorer, texts, batch_size: int, pack: bool, repeats: int):
    from dcsjax.engine.scorer import Scorer

    scorer = scorer.replace(batch_size=batch_size, pack=pack)
    before = Scorer.compile_count()
    scorer.token_logprobs(texts)  # warm-up: compiles each bucket once
    compiles = Scorer.compile_count() - before
    seconds, lps = timed(lambda: scorer.token_logprobs(texts), repeats)
    return seconds, lps, compiles


# ------------------------------------------------------------------------------------------ the run
def bench_model(name: str, quick: bool, peak: dict, workloads=("statements", "long", "options"),
                dtypes=("float32", "bfloat16")) -> list[dict]:
    import dcsjax

    rows = []
    scorer = dcsjax.load(name)
    config = scorer.config
    n_statements, n_long, n_items = (16, 16, 2) if quick else (512, 128, 48)
    repeats = 1
    texts = statements(scorer.tokenizer, n_statements, 8, 40)
    long = long_texts(scorer.tokenizer, n_long)
    ids = [[scorer.document_start_id, *x] for x in scorer.encode(texts)]
    long_ids = [[scorer.document_start_id, *x] for x in scorer.encode(long)]

    def row(workload, engine, dtype, tokens, seconds, mean_context, **extra):
        rate = tokens / seconds
        flops = config.flops_per_token(mean_context)
        rows.append({"model": name, "workload": workload, "engine": engine, "dtype": dtype, "tokens": tokens,
                     "seconds": round(seconds, 3), "tokens_per_s": round(rate, 1),
                     "mfu": round(flops * rate / (peak[dtype] * 1e9), 4), **extra})
        print(f"  {workload:10s} {engine:8s} {dtype:8s} {extra}  {rate:8.0f} tok/s", flush=True)

    def context_of(id_lists):
        return float(np.mean([np.mean(np.arange(1, len(x))) for x in id_lists]))

    peer_best = {}
    scorers = {"float32": scorer}  # each engine loaded once per dtype, reused across workloads
    peers: dict[str, Peer] = {}
    for workload, data, data_ids in (("statements", texts, ids), ("long", long, long_ids)):
        if workload not in workloads:
            continue
        tokens = sum(len(x) - 1 for x in data_ids)
        ctx = context_of(data_ids)
        f32 = None
        for dtype in dtypes:
            if dtype not in scorers:
                scorers[dtype] = dcsjax.load(name, dtype=dtype)
            s = scorers[dtype]
            for batch_size in ((16,) if quick or workload == "long" else (8, 16, 32)):
                for pack in ((True,) if quick or workload == "long" else (True, False)):
                    if dtype == "bfloat16" and not pack:
                        continue  # bf16: packed only
                    seconds, lps, compiles = dcsjax_statements(s, data, batch_size, pack, repeats)
                    extra = {"batch_size": batch_size, "pack": pack, "compiles": compiles,
                             "slot_use": slot_use(s, data_ids)}
                    if dtype == "float32" and f32 is None:
                        f32 = lps
                    if dtype == "bfloat16":
                        extra["mean_abs_diff_from_f32"] = float(np.mean(np.abs(np.concatenate(lps) - np.concatenate(f32))))
                        # the same texts alone, as for the peer below
                        ones = s.replace(batch_size=1, pack=False).token_logprobs(data[:16])
                        extra["batch_size_shift"] = float(max(np.abs(a - b).max() for a, b in zip(lps[:16], ones)))
                    row(workload, "dcsjax", dtype, tokens, seconds, ctx, **extra)
            if dtype not in peers:
                peers[dtype] = Peer(name, dtype)
            peer = peers[dtype]
            best = None
            for batch_size in ((16,) if quick else (8, 16, 32, 64)):
                for sort in ((True,) if quick or batch_size != 16 else (True, False)):
                    seconds, lps = timed(lambda: peer.token_logprobs(data_ids, batch_size, sort), repeats)
                    extra = {"batch_size": batch_size, "sorted": sort}
                    if dtype == "bfloat16" and batch_size == 16 and sort:
                        ones = peer.token_logprobs(data_ids[:16], 1)  # the same texts alone
                        extra["batch_size_shift"] = float(max(np.abs(a - b).max() for a, b in zip(lps[:16], ones)))
                    row(workload, "peer", dtype, tokens, seconds, ctx, **extra)
                    best = max(best or 0.0, tokens / seconds)
            peer_best[(workload, dtype)] = best

    if "options" not in workloads:
        return finish(rows, peer_best)
    contexts, options = option_items(n_items)
    flat_ctx = [c for c, opts in zip(contexts, options) for _ in opts]
    flat_opt = [o for opts in options for o in opts]
    scored = sum(len(scorer.split_encode(c, o)[1]) for c, o in zip(flat_ctx, flat_opt))
    scorer = scorer.replace(batch_size=16, pack=True)
    shared, _ = timed(lambda: scorer.option_logprobs(contexts, options), repeats)
    alone, _ = timed(lambda: scorer.score_continuations(flat_ctx, flat_opt), repeats)
    # option tokens only: the question is context, computed but not scored
    row("options", "dcsjax", "float32", scored, shared, 0.0, shared_question=True, options=len(options[0]))
    row("options", "dcsjax", "float32", scored, alone, 0.0, shared_question=False, options=len(options[0]),
        speedup_from_sharing=round(alone / shared, 2))
    return finish(rows, peer_best)


def finish(rows: list[dict], peer_best: dict) -> list[dict]:
    for r in rows:
        if r["engine"] == "dcsjax" and (r["workload"], r["dtype"]) in peer_best:
            r["ratio_to_peer_best"] = round(r["tokens_per_s"] / peer_best[r["workload"], r["dtype"]], 2)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--quick", action="store_true", help="a small grid, to check the script runs")
    parser.add_argument("--workloads", default="statements,long,options", help="which of statements, long, options")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="float32 (the reference) and/or bfloat16")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)
    if args.dtypes.split(",")[0] != "float32" or not set(args.dtypes.split(",")) <= {"float32", "bfloat16"}:
        parser.error("--dtypes: float32 first (the bfloat16 rows are compared with it), then optionally bfloat16")
    work = 2e9 if args.quick else 2e10  # FLOPs per timed try of the matmul rate
    # the rates of the dtypes benchmarked only: torch's bfloat16 matmul on a CPU without AVX-512 BF16 runs at
    # a few GFLOP/s, and measuring it took over ten minutes on an AVX2-only host (2026-12-02)
    dtypes = args.dtypes.split(",")
    peak = {dtype: matmul_rate(dtype=dtype, work=work) / 1e9 for dtype in dtypes}  # GFLOP/s
    torch_peak = {dtype: torch_matmul_rate(dtype=dtype, work=work) / 1e9 for dtype in dtypes}
    rates = "; ".join(f"{d} XLA {peak[d]:.0f}, torch {torch_peak[d]:.0f}" for d in dtypes)
    print(f"{cpu_name()}, {os.cpu_count()} cores, matmul GFLOP/s: {rates}", flush=True)
    rows = []
    for name in args.models.split(","):
        print(name, flush=True)
        rows += bench_model(name, args.quick, peak, args.workloads.split(","), dtypes)
    path = write_record(args.out, "throughput", {"matmul_gflops": peak, "torch_matmul_gflops": torch_peak,
                                                 "rows": rows}, args)
    print(f"\n{path}")


if __name__ == "__main__":
    main()
