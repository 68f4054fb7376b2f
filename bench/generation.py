"""Greedy generation throughput of dcsjax against the peer (transformers' `generate`, same GGUF weights,
float32), same prompts, same run; and whether the two emit the same tokens.

    python bench/generation.py                     # SmolLM2: APX prompts, 15 new tokens; long answers, 128
    python bench/generation.py --prompts 16 --quick

Workloads (real prompts): `apx` is APX's own prompt (002 D.1, the chat template) over BIG-bench items of
the demo tasks, 15 new tokens, as `dcsjax eval` runs it (prompts of 200-400 tokens: mostly prefill); `long` is the same prompts with 128 new tokens
and no early stop (every row decodes its whole budget: the decode loop's own rate). Both engines batch the
prompts (dcsjax: its bucketed batches; the peer: left-padded batches of the same size, sorted by length).
Tokens per second count generated tokens; dcsjax's are from a second pass over the same prompts (the
first pass compiles one decode program per prompt bucket, reported apart), the peer's after one warm-up batch. Writes bench/results/generation-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("DCSJAX_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

TASKS = ("general_knowledge", "misconceptions", "hindu_knowledge", "known_unknowns")


def apx_prompts(scorer, n: int) -> list[list[int]]:
    from dcsjax.data.tasks import load_task, resolve_task
    from dcsjax.protocols.apx import prompt_ids

    items = [i for task in TASKS for i in load_task(resolve_task(task))[0]]
    return [prompt_ids(scorer, item) for item in items[:n]]


def peer_generate(model, prompts: list[list[int]], new: int, batch: int, pad_id: int, stop: bool) -> list[list[int]]:
    import torch

    out: list = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.tensor([[pad_id] * (width - len(prompts[i])) + prompts[i] for i in idx])
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in idx])
        kwargs = {} if stop else {"eos_token_id": None, "min_new_tokens": new}
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=pad_id,
                                 **kwargs)
        for r, i in enumerate(idx):
            out[i] = gen[r, width:].tolist()
    return out


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import dcsjax
    from dcsjax.fetch import fetch_model
    from dcsjax.generate import _extra_stops, generate

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="the apx workload only")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    scorer = dcsjax.load(args.model)
    path = fetch_model(args.model)
    peer = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    prompts = apx_prompts(scorer, args.prompts)
    stops = {scorer.tokenizer.eos_token_id, *_extra_stops(scorer.tokenizer)}
    rows = []
    for workload, new, stop in [("apx", 15, True), *(() if args.quick else [("long", 128, False)])]:
        stop_ids = None if stop else ()  # (): no token ends a row, every row decodes `new` tokens
        start = time.perf_counter()  # the first pass compiles one decode program per prompt bucket
        generate(scorer, prompts, new, batch_size=args.batch, stop_ids=stop_ids)
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        ours = generate(scorer, prompts, new, batch_size=args.batch, stop_ids=stop_ids)
        ours_s = time.perf_counter() - start
        pad = scorer.tokenizer.pad_token_id if scorer.tokenizer.pad_token_id is not None else 0
        peer_generate(peer, prompts[:args.batch], new, args.batch, pad, stop)  # warm-up, not timed
        start = time.perf_counter()
        theirs = peer_generate(peer, prompts, new, args.batch, pad, stop)
        peer_s = time.perf_counter() - start
        cut = [t[:next((k for k, x in enumerate(t) if x in stops), len(t))] for t in theirs] if stop else theirs
        same = sum(a == b for a, b in zip(ours, cut))
        # tokens each engine had to produce: up to its first stop token (the peer pads finished rows, which
        # are not generated tokens); the ratio is the wall-time ratio on the same prompts
        n_ours, n_peer = sum(map(len, ours)), sum(map(len, cut))
        rows.append({"workload": workload, "new_tokens": new, "prompts": len(prompts), "batch": args.batch,
                     "dcsjax_tokens_per_s": round(n_ours / ours_s, 1), "peer_tokens_per_s": round(n_peer / peer_s, 1),
                     "dcsjax_s": round(ours_s, 2), "dcsjax_first_pass_s": round(first_s, 2), "peer_s": round(peer_s, 2),
                     "dcsjax_first_pass_tokens_per_s": round(n_ours / first_s, 1),
                     "ratio_to_peer": round(peer_s / ours_s, 2),
                     "same_tokens": f"{same}/{len(prompts)}"})
        print(rows[-1], flush=True)
    from dcsjax.results import environment

    record = {"model": args.model, "rows": rows, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "arguments": vars(args),
              "environment": environment(), "torch": torch.__version__}
    out = Path(args.out) / f"generation-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    from dcsjax.tables import render

    print(render(["workload", "new tokens", "dcsjax tokens/s", "first pass (compiles)", "peer tokens/s", "x peer",
                  "same tokens"],
                 [[r["workload"], r["new_tokens"], r["dcsjax_tokens_per_s"], r["dcsjax_first_pass_tokens_per_s"],
                   r["peer_tokens_per_s"], r["ratio_to_peer"], r["same_tokens"]] for r in rows], "markdown",
                 numeric=(1, 2, 3, 4, 5)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
