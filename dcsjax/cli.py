"""The `dcsjax` command: `fetch`, `models`, `score`, `eval`, `demo` (the README's main job) and `report`."""

from __future__ import annotations

import argparse
import sys
import time

from dcsjax.errors import DcsjaxError

DEMO_MODEL = "smollm2-135m-instruct"
DEMO_TASKS = ("known_unknowns", "logical_deduction_three_objects", "misconceptions", "hindu_knowledge",
              "general_knowledge")
DEMO_PROTOCOLS = ("aps", "mcqa", "apx", "dcs", "dcs-letters")
DEMO_LIMIT = 60


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def cmd_fetch(args) -> int:
    from dcsjax.fetch import fetch_model

    for name in args.models:
        if name == "bigbench":
            from dcsjax.data.bigbench import fetch_bigbench

            print(fetch_bigbench())
        else:
            print(fetch_model(name))
    return 0


def cmd_models(args) -> int:
    from dcsjax.cards import model_card, model_card_names

    rows = [[c.name, c.display_name, c.architecture, c.variant, f"{c.parameters / 1e6:.0f}M"]
            for c in map(model_card, model_card_names())]
    print(_table(rows, ["name", "model", "architecture", "variant", "params"]))
    return 0


def cmd_score(args) -> int:
    import numpy as np

    import dcsjax

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    scorer = dcsjax.load(args.model, dtype=args.dtype, progress=True, batch_size=args.batch_size)
    start = time.perf_counter()
    lps = scorer.token_logprobs(texts)
    elapsed = time.perf_counter() - start
    rows = [[t if len(t) <= 60 else t[:57] + "...", len(lp), f"{lp.sum():.3f}", f"{lp.mean():.3f}",
             f"{float(np.exp(-lp.mean())):.2f}"] for t, lp in zip(texts, lps)]
    print(_table(rows, ["text", "tokens", "log p (sum)", "log p (mean)", "perplexity"]))
    print(f"\n{scorer.name}: {len(texts)} texts, {sum(map(len, lps))} tokens scored in {elapsed:.1f} s "
          f"(compiles included); conditioned on token {scorer.document_start_id} "
          f"({scorer.tokenizer.convert_ids_to_tokens(scorer.document_start_id)!r}) as the document start")
    return 0


def cmd_eval(args) -> int:
    from pathlib import Path

    from dcsjax.evaluate import format_table, run_eval

    if args.distributed or args.coordinator or args.num_processes:
        from dcsjax.distributed import initialize

        initialize(args.coordinator, args.num_processes, args.process_id)
    start = time.perf_counter()
    summary = run_eval(args.model, args.tasks.split(","), args.protocols.split(","), Path(args.output),
                       limit=args.limit, threshold=args.threshold, batch_size=args.batch_size, dtype=args.dtype,
                       mesh=args.mesh)
    import jax

    if jax.process_index() == 0:
        print(format_table(summary))
        print(f"\n{time.perf_counter() - start:.0f} s; per-item results and summary.json under {args.output}")
    return 0


def cmd_report(args) -> int:
    from pathlib import Path

    from dcsjax.analysis.report import write_report

    try:
        summary = write_report([Path(d) for d in args.results], Path(args.out), args.sizes, n_boot=args.n_boot)
    except FileNotFoundError as err:
        print(f"dcsjax: error: {err}", file=sys.stderr)
        return 2
    print(f"figures, metrics.json and {summary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dcsjax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fetch", help="download and verify models (or `bigbench`) into the cache")
    p.add_argument("models", nargs="+", metavar="MODEL")
    p.set_defaults(func=cmd_fetch)
    p = sub.add_parser("models", help="list the model cards")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("score", help="token log-probs and perplexity of texts (arguments or stdin lines)")
    p.add_argument("--model", default=DEMO_MODEL)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("texts", nargs="*")
    p.set_defaults(func=cmd_score)
    for name, help_text in [("eval", "score a model on benchmarks under every protocol"),
                            ("demo", f"the embedded default: {DEMO_MODEL} on five BIG-bench tasks, all protocols")]:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--model", default=DEMO_MODEL)
        p.add_argument("--tasks", default=",".join(DEMO_TASKS))
        p.add_argument("--protocols", default=",".join(DEMO_PROTOCOLS))
        p.add_argument("--limit", type=int, default=DEMO_LIMIT if name == "demo" else None,
                       help="the first N items of each task")
        p.add_argument("--threshold", type=float, default=None, help="DCS loadings lc = 1, lw = t / (1 - t)")
        p.add_argument("--output", default="results")
        p.add_argument("--batch-size", type=int, default=16)
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                       help="parameter dtype; log-probs are float32 either way")
        p.add_argument("--mesh", default=None, help="DATAxMODEL devices, e.g. 2x4 (default: one device)")
        p.add_argument("--coordinator", default=None, help="HOST:PORT of process 0, for a multi-process run")
        p.add_argument("--num-processes", type=int, default=None)
        p.add_argument("--process-id", type=int, default=None)
        p.add_argument("--distributed", action="store_true",
                       help="join a multi-process run whose coordinates JAX detects (TPU pod slices, SLURM)")
        p.set_defaults(func=cmd_eval)
    p = sub.add_parser("report", help="figures and a Markdown summary, with intervals, from eval results")
    p.add_argument("results", nargs="+", metavar="RESULTS_DIR")
    p.add_argument("--out", required=True, help="folder for the PNG figures, metrics.json and summary.md")
    p.add_argument("--sizes", default=None, help="TOML of [model] parameters, variant for models without a card")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples per interval")
    p.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DcsjaxError as err:
        print(f"dcsjax: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
