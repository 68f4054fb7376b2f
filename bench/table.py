"""A Markdown table of a throughput JSON (bench/throughput.py), as pasted into the README.

    python bench/table.py bench/results/throughput-*.json
"""

import json
import sys

from dcsjax.eval.tables import render


def config(r: dict) -> str:
    keys = ("batch_size", "pack", "sorted", "shared_question")
    return ", ".join(f"{k.replace('_', ' ')} {r[k]}" for k in keys if k in r)


def main(paths) -> None:
    for path in paths:
        d = json.load(open(path))
        rates = ", ".join(f"{rate:.0f} GFLOP/s {dtype}" for dtype, rate in d["matmul_gflops"].items())
        print(f"{d['device']}, {d['cores']} cores; measured matmul rate: {rates}\n")
        body = []
        for r in d["rows"]:
            notes = []
            if "compiles" in r:
                notes.append(f"{r['compiles']} compile(s)")
            if "mean_abs_diff_from_f32" in r:
                notes.append(f"mean abs diff from f32 {r['mean_abs_diff_from_f32']:.3f} nats/token")
            if "batch_size_shift" in r:
                notes.append(f"batch 16 vs 1: max shift {r['batch_size_shift']:.3g} nats")
            if "speedup_from_sharing" in r:
                notes.append(f"shared question {r['speedup_from_sharing']}x faster")
            body.append([r["model"], r["workload"], r["engine"], r["dtype"], config(r), f"{r['tokens_per_s']:.0f}",
                         r.get("ratio_to_peer_best", ""), f"{r['mfu']:.0%}", r.get("slot_use", ""), "; ".join(notes)])
        print(render(["model", "workload", "engine", "dtype", "configuration", "tokens/s", "x peer best", "MFU",
                      "slots used", "notes"], body, "markdown", numeric=(5, 6, 7, 8)))
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
