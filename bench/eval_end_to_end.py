"""`dcsjax eval` on a whole benchmark against the same items in one engine call, same run: what the
resumable writer (records written in growing chunks, `evaluate.write_spans`) costs over the engine alone.

    python bench/eval_end_to_end.py                       # MCQA-LL on 320 MMLU miscellaneous items, SmolLM2
    python bench/eval_end_to_end.py --task mmlu:marketing --protocol apx --items 200
    python bench/eval_end_to_end.py --task mmlu:world_religions --protocol all --items 60   # shared forward passes

With `--protocol all`: `dcsjax eval` of every protocol on the task without and with the run's shared
continuations (MCQA-LL and sequence DCS score the same options after the same question), after an untimed
run that compiles every shape: forward-pass sequences (option continuations and texts scored), seconds, and
whether every record is the same (bit-identical scores).

Both sides score the same items with the same protocol, option order and scorer (compiles done first, on
the same shapes, by an untimed pass of the engine); `eval` includes reading the task, fingerprints,
writing the records and the summary. Writes bench/results/eval-end-to-end-<time>.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import ROOT, write_record  # bench/common.py


def main() -> None:
    import dcsjax
    from dcsjax.eval import protocols
    from dcsjax.data.tasks import load_task, resolve_task
    from dcsjax.eval.run import CHUNK, MAX_CHUNK, read_records, run_eval, write_spans

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="mmlu:miscellaneous")
    parser.add_argument("--protocol", default="mcqa", help="one protocol, or all (the shared forward passes)")
    parser.add_argument("--items", type=int, default=320)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    if args.protocol == "all":
        return sharing(args)
    scorer = dcsjax.load(args.model)
    card = resolve_task(args.task)
    items = load_task(card)[0][:args.items]
    ctx = protocols.Context(scorer, card)
    protocol = protocols.get(args.protocol)
    protocols.score(protocol, ctx, items, "shuffle", 0)  # compiles every shape the engine call needs
    start = time.perf_counter()
    engine = protocols.score(protocol, ctx, items, "shuffle", 0)
    engine_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_eval(args.model, [args.task], [args.protocol], Path(out), limit=args.items, scorer=scorer,
                 progress=False)
        eval_s = time.perf_counter() - start
        written = read_records(Path(out) / scorer.name / card.slug / f"{args.protocol}.jsonl")
    by_id = {w["id"]: w["choice"] for w in written}  # written shortest first (`evaluate.length_hint`)
    same = len(written) == len(engine) and all(by_id.get(e["id"]) == e["choice"] for e in engine)
    record = {"model": args.model, "task": args.task, "protocol": args.protocol, "items": len(items),
              "engine_s": round(engine_s, 2), "eval_s": round(eval_s, 2), "eval_over_engine": round(eval_s / engine_s, 3),
              "writes": [e - s for s, e in write_spans(len(items), CHUNK, MAX_CHUNK)], "same_answers": same}
    print(record)
    path = write_record(args.out, "eval-end-to-end", record, args)
    print(f"dcsjax eval / one engine call: {record['eval_over_engine']}x ({eval_s:.1f} s against {engine_s:.1f} s, "
          f"{len(items)} items, writes of {record['writes']}); wrote {path}")


def sharing(args) -> None:
    """Every protocol on one task, without and with the run's continuation cache, same process and scorer."""
    import dcsjax
    from dcsjax.data.tasks import resolve_task
    from dcsjax.engine.scorer import Scorer
    from dcsjax.eval.run import read_records, run_eval

    scorer = dcsjax.load(args.model)
    card = resolve_task(args.task)
    counted = {"sequences": 0}
    run_groups = Scorer._run_groups

    def counting(self, groups, greedy=False):  # each group: a prefix and its suffixes, one forward-pass slot each
        counted["sequences"] += sum(max(1, len(g.suffixes)) for g in groups)
        return run_groups(self, groups, greedy)

    Scorer._run_groups = counting
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, share in (("warm-up", True), ("separate", False), ("shared", True)):
            counted["sequences"] = 0
            start = time.perf_counter()
            summary = run_eval(args.model, [args.task], ["aps", "qa-ppl", "mcqa", "apx", "dcs", "dcs-letters"],
                               Path(tmp) / name, limit=args.items, scorer=scorer, progress=False,
                               skip_unavailable=True, share_continuations=share)
            seconds = time.perf_counter() - start
            folder = Path(tmp) / name / scorer.name / card.slug
            records = {r["protocol"]: read_records(folder / f"{r['protocol']}.jsonl") for r in summary["rows"]}
            runs[name] = {"seconds": round(seconds, 2), "sequences": counted["sequences"], "records": records}
    Scorer._run_groups = run_groups
    same = runs["separate"]["records"] == runs["shared"]["records"]
    record = {"model": args.model, "task": args.task, "items": args.items,
              "protocols": sorted(runs["shared"]["records"]),
              **{name: {k: v for k, v in run.items() if k != "records"} for name, run in runs.items()},
              "sequences_saved": runs["separate"]["sequences"] - runs["shared"]["sequences"],
              "speedup": round(runs["separate"]["seconds"] / runs["shared"]["seconds"], 3),
              "same_records": same}
    path = write_record(args.out, "eval-sharing", record, args)
    print(f"{args.task}, {args.items} items, every protocol: {runs['separate']['sequences']} sequences and "
          f"{runs['separate']['seconds']:.1f} s without sharing, {runs['shared']['sequences']} and "
          f"{runs['shared']['seconds']:.1f} s with it; records {'identical' if same else 'DIFFER'}; wrote {path}")


if __name__ == "__main__":
    main()
