"""Generation throughput of dcsjax against the peer (transformers' `generate`, same GGUF weights, float32),
same prompts, same settings (greedy, or sampled as statement generation is), same run; and whether the two
emit the same greedy tokens.

    python bench/generation.py                     # SmolLM2: APX, 15 new tokens; long, 128; statements, 256
    python bench/generation.py --workloads statements --prompts 32
    python bench/generation.py --prompts 16 --quick

Workloads (real prompts): `apx` is APX's own prompt (002 D.1, the chat template) over MMLU items of
the demo's subjects, 15 new tokens, as `dcsjax eval` runs it (SmolLM2: prompts of 111-183 tokens, mostly prefill); `long` is the same prompts with 128 new tokens
and no early stop (every row decodes its whole budget: the decode loop's own rate). `statements` is
statement generation as `dcsjax statements generate` runs it (002 A.1's prompt over the same items, sampled
at temperature 0.7, top-p 0.95, 256 new tokens), with no early stop: a sampled row ends at a different
token in each engine, so both decode the whole budget, which is the same work. Both engines batch the
prompts (dcsjax: its bucketed batches; the peer: left-padded batches of the same size, sorted by length).
Tokens per second count generated tokens; dcsjax's are from a second pass over the same prompts (the
first pass compiles one decode program per prompt bucket, reported apart), the peer's after one warm-up batch.
Greedy workloads also count the prompts on which both engines emit the same tokens. Writes
bench/results/generation-<time>.json.
"""

from __future__ import annotations

import argparse
import time

from common import ROOT, reference_dir, write_record  # bench/common.py

WORKLOADS = ("apx", "long", "statements")


def prompts_of(scorer, workload: str, n: int) -> list[list[int]]:
    """The first n items of the demo's MMLU subjects as the workload's prompts: APX's (apx, long) or statement
    generation's."""
    from dcsjax.cli import DEMO_TASKS as TASKS
    from dcsjax.data.tasks import load_task, resolve_task
    from dcsjax.eval.protocols import apx
    from dcsjax.statements import generate as statements

    prompt_ids = statements.prompt_ids if workload == "statements" else apx.prompt_ids
    items = [i for task in TASKS for i in load_task(resolve_task(task))[0]]
    return [prompt_ids(scorer, item) for item in items[:n]]


def settings_of(workload: str) -> dict:
    """new tokens, whether a stop token ends a row, and the sampling (temperature 0: greedy)."""
    from dcsjax.statements.generate import MAX_NEW_TOKENS, TEMPERATURE, TOP_P

    return {"apx": {"new": 15, "stop": True, "temperature": 0.0, "top_p": 1.0},
            "long": {"new": 128, "stop": False, "temperature": 0.0, "top_p": 1.0},
            "statements": {"new": MAX_NEW_TOKENS, "stop": False, "temperature": TEMPERATURE, "top_p": TOP_P}}[workload]


def peer_generate(model, prompts: list[list[int]], new: int, batch: int, pad_id: int, stop: bool,
                  temperature: float = 0.0, top_p: float = 1.0) -> list[list[int]]:
    import torch

    out: list = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.tensor([[pad_id] * (width - len(prompts[i])) + prompts[i] for i in idx])
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in idx])
        kwargs = {} if stop else {"eos_token_id": None, "min_new_tokens": new}
        if temperature > 0:  # top_k=0: only top-p cuts the distribution, as in dcsjax (transformers' default is 50)
            kwargs |= {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        else:
            kwargs |= {"do_sample": False}
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=new, pad_token_id=pad_id, **kwargs)
        for r, i in enumerate(idx):
            out[i] = gen[r, width:].tolist()
    return out


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import dcsjax
    from dcsjax.engine.generate import _extra_stops, generate

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--quick", action="store_true", help="the apx workload only")
    parser.add_argument("--max-new", type=int, help="cap every workload's new tokens (a quick check)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    workloads = ["apx"] if args.quick else args.workloads.split(",")
    if unknown := set(workloads) - set(WORKLOADS):
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    scorer = dcsjax.load(args.model)
    peer = AutoModelForCausalLM.from_pretrained(reference_dir(args.model), dtype=torch.float32).eval()
    stops = {scorer.tokenizer.eos_token_id, *_extra_stops(scorer.tokenizer)}
    pad = scorer.tokenizer.pad_token_id if scorer.tokenizer.pad_token_id is not None else 0
    rows = []
    for workload in workloads:
        prompts = prompts_of(scorer, workload, args.prompts)
        setting = settings_of(workload)
        new, stop, sampling = setting["new"], setting["stop"], {k: setting[k] for k in ("temperature", "top_p")}
        new = min(new, args.max_new or new)
        stop_ids = None if stop else ()  # (): no token ends a row, every row decodes `new` tokens
        start = time.perf_counter()  # the first pass compiles one decode program per prompt bucket
        generate(scorer, prompts, new, batch_size=args.batch, stop_ids=stop_ids, **sampling)
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        ours = generate(scorer, prompts, new, batch_size=args.batch, stop_ids=stop_ids, **sampling)
        ours_s = time.perf_counter() - start
        peer_generate(peer, prompts[:args.batch], new, args.batch, pad, stop, **sampling)  # warm-up, not timed
        start = time.perf_counter()
        theirs = peer_generate(peer, prompts, new, args.batch, pad, stop, **sampling)
        peer_s = time.perf_counter() - start
        cut = [t[:next((k for k, x in enumerate(t) if x in stops), len(t))] for t in theirs] if stop else theirs
        # sampled rows come from different random streams: only greedy ones can be compared token for token
        same = f"{sum(a == b for a, b in zip(ours, cut))}/{len(prompts)}" if not sampling["temperature"] else "sampled"
        # tokens each engine had to produce: up to its first stop token (the peer pads finished rows, which
        # are not generated tokens); the ratio is the wall-time ratio on the same prompts
        n_ours, n_peer = sum(map(len, ours)), sum(map(len, cut))
        rows.append({"workload": workload, "new_tokens": new, "prompts": len(prompts), "batch": args.batch, **sampling,
                     "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))],
                     "dcsjax_tokens": n_ours, "peer_tokens": n_peer,
                     "dcsjax_tokens_per_s": round(n_ours / ours_s, 1), "peer_tokens_per_s": round(n_peer / peer_s, 1),
                     "dcsjax_s": round(ours_s, 2), "dcsjax_first_pass_s": round(first_s, 2), "peer_s": round(peer_s, 2),
                     "dcsjax_first_pass_tokens_per_s": round(n_ours / first_s, 1),
                     "ratio_to_peer": round(peer_s / ours_s, 2),
                     "same_tokens": same})
        print(rows[-1], flush=True)
    out = write_record(args.out, "generation", {"model": args.model, "rows": rows,
                                                "torch_threads": torch.get_num_threads()}, args)
    from dcsjax.eval.tables import render

    print(render(["workload", "new tokens", "dcsjax tokens/s", "first pass (compiles)", "peer tokens/s", "x peer",
                  "same tokens"],
                 [[r["workload"], r["new_tokens"], r["dcsjax_tokens_per_s"], r["dcsjax_first_pass_tokens_per_s"],
                   r["peer_tokens_per_s"], r["ratio_to_peer"], r["same_tokens"]] for r in rows], "markdown",
                 numeric=(1, 2, 3, 4, 5)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
