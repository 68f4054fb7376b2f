"""`dcsjax eval` computes every number it prints: a resume reuses only records made with the same settings,
one writer per folder, a summary that merges without losing or doubling rows, bad input reported by item,
file and line while the rest is scored, readers that never write.

This is bookkeeping, not what the weights say: the runs score with the tiny random-weight decoder (SmolLM2's
tokenizer and card; `conftest.tiny_scorer`), whose compiles and forward passes cost a fraction of the real
model's."""

import errno
import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import UNKNOWNS, UNKNOWNS_CARD, scorer_for, tiny_scorer
from dcsjax.analysis.report import write_report
from dcsjax.cli import main
from dcsjax.errors import ConfigError, DcsjaxError, DiskError, InputError
from dcsjax.eval.run import run_eval
from dcsjax.eval.results import ResultsError, read_errors, read_records

MODEL = "smollm2-135m-instruct"


def evaluate(output, tasks=(UNKNOWNS_CARD,), protocols=("dcs",), limit=6, scorer=None, **kwargs):
    return run_eval(MODEL, list(tasks), list(protocols), output, limit=limit, scorer=scorer or tiny_scorer(),
                    progress=False, **kwargs)


def values(summary):
    return {(r["task"], r["protocol"]): r["value"] for r in summary["rows"]}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"jsonl:{path}"


ITEMS = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "choices": [str(2 * i), str(2 * i + 1)], "answer": 0}
         for i in range(1, 4)]


@pytest.mark.slow
def test_a_resume_with_another_threshold_is_refused_then_scored_anew(tmp_path):
    # DCS from letters: one token an option, so even a random model spreads its mass (sequence DCS of a random
    # model puts it all on the shortest option, "Unknown", where every threshold scores 0)
    out, letters = tmp_path / "out", ("dcs-letters",)
    default = values(evaluate(out, protocols=letters))
    with pytest.raises(ResultsError, match=r"made with other settings \(settings\.lw: 1\.0 -> 9\.0"):
        evaluate(out, protocols=letters, threshold=0.9)
    assert values(evaluate(out, protocols=letters)) == default  # the same settings resume from every record
    with pytest.warns(UserWarning, match="moved to dcs-letters.jsonl.stale"):
        replaced = values(evaluate(out, protocols=letters, threshold=0.9, replace_stale=True))
    fresh = values(evaluate(tmp_path / "fresh", protocols=letters, threshold=0.9))
    assert replaced == fresh and replaced != default
    records = read_records(out / MODEL / UNKNOWNS / "dcs-letters.jsonl")
    assert len(records) == 6 and all(r["lw"] == pytest.approx(9.0) for r in records)


def test_a_resume_in_another_dtype_is_refused(tmp_path):
    evaluate(tmp_path)
    tiny = tiny_scorer()
    bf16 = tiny_scorer(model_fingerprint={**tiny.model_fingerprint, "dtype": "bfloat16"})  # as `load` says it
    with pytest.raises(ResultsError, match=r"model\.dtype: 'float32' -> 'bfloat16'"):
        evaluate(tmp_path, scorer=bf16)


def test_two_files_of_the_same_name_do_not_share_records(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_jsonl(tmp_path / "a" / "items.jsonl", ITEMS)
    second = write_jsonl(tmp_path / "b" / "items.jsonl", [{**r, "answer": 1} for r in ITEMS])
    out = tmp_path / "out"
    assert values(evaluate(out, [first], ["mcqa"], limit=None))
    with pytest.raises(ResultsError, match=r"task\.items: "):
        evaluate(out, [second], ["mcqa"], limit=None)


def test_over_long_and_non_utf8_items_are_error_records_while_the_rest_is_scored(tmp_path):
    path = tmp_path / "bad.jsonl"
    long_item = {"id": "long", "question": "word " * 9000, "choices": ["yes", "no"], "answer": 0}
    path.write_bytes((json.dumps(ITEMS[0]) + "\n" + json.dumps(long_item) + "\n").encode()
                     + b'{"id": "latin1", "question": "caf\xe9?", "choices": ["a", "b"], "answer": 0}\n'
                     + (json.dumps(ITEMS[1]) + "\n").encode())
    summary = evaluate(tmp_path / "out", [f"jsonl:{path}"], ["dcs", "qa-ppl"], limit=None)
    for r in summary["rows"]:
        assert r["n"] == 2 and r["errors"] == 2 and r["value"] is not None
    # the table shows each error, not only its count: the bad line once for the task, the long item per protocol
    from dcsjax.eval.run import format_table

    notes = [line for line in format_table(summary).splitlines() if line.startswith("err ")]
    assert sum(f"{path}:3: not UTF-8" in line for line in notes) == 1
    assert sum(line.startswith(f"err {MODEL} bad dcs: long: dcs:") for line in notes) == 1
    assert sum(line.startswith(f"err {MODEL} bad qa-ppl: long: qa-ppl:") for line in notes) == 1
    errors = read_errors(tmp_path / "out" / MODEL / "bad")
    assert {"where": f"{path}:3", "error": "not UTF-8 (byte 0xe9 at column 34)"} in errors
    long_errors = [e for e in errors if e["where"] == "long"]
    assert [e["error"].split(":")[0] for e in long_errors] == ["dcs", "qa-ppl"]
    assert all(re.search(r"has 9\d\d\d tokens; .* exceeds the 8192-token limit", e["error"]) for e in long_errors)
    # another protocol's run, and a rerun of one of them, keep every protocol's error records
    evaluate(tmp_path / "out", [f"jsonl:{path}"], ["mcqa"], limit=None)
    evaluate(tmp_path / "out", [f"jsonl:{path}"], ["dcs"], limit=None)
    again = read_errors(tmp_path / "out" / MODEL / "bad")
    assert sorted(map(str, again)) == sorted(map(str, errors + [e for e in again if e["error"].startswith("mcqa")]))
    assert len([e for e in again if e["where"] == "long"]) == 3


def test_an_empty_file_is_named_and_the_other_tasks_are_scored(tmp_path, capsys):
    """A task with no item (an empty file, blank lines only) stops with one line naming it, before the model
    loads; beside other tasks, they are scored and the exit is still non-zero. A file of error rows only keeps
    its row, n 0 and null (not NaN)."""
    import dcsjax

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n   \n")
    with pytest.raises(InputError, match=f"task empty: jsonl:{empty} holds no item to score"):
        evaluate(tmp_path / "out", [f"jsonl:{empty}"], ["dcs"], limit=None)
    summary = evaluate(tmp_path / "out", [str(empty), UNKNOWNS_CARD], ["dcs"], limit=2)  # the bare path too
    assert [r["task"] for r in summary["rows"]] == [UNKNOWNS] and [e["task"] for e in summary["empty"]] == ["empty"]
    original = dcsjax.load
    try:
        dcsjax.load = lambda *a, **k: pytest.fail("the model loaded for nothing to score")
        assert main(["eval", "--model", MODEL, "--tasks", str(empty), "--output", str(tmp_path / "cli")]) == 2
    finally:
        dcsjax.load = original
    err = capsys.readouterr().err.strip()
    assert err == f"dcsjax: error: task empty: jsonl:{empty} holds no item to score (an empty file, or blank lines only)"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no options"}\n')
    summary = evaluate(tmp_path / "out2", [f"jsonl:{bad}"], ["dcs", "apx"], limit=None)
    assert [(r["n"], r["value"], r["ci95"]) for r in summary["rows"]] == [(0, None, [None, None])] * 2
    text = (tmp_path / "out2" / "summary.json").read_text()
    assert "NaN" not in text and json.loads(text)["rows"][0]["value"] is None


def test_data_files_by_their_bare_paths_and_a_missing_one_named(tmp_path):
    """`--tasks mine.csv` as lm-eval and Inspect take a data file: its extension says its kind; the prefixes
    still work; a path that does not exist is an error naming it."""
    from dcsjax.data.tasks import resolve_task

    rows = [{"question": "2 + 2 =", "choices": ["3", "4"], "answer": 1}]
    (tmp_path / "mine.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "mine.json").write_text(json.dumps(rows))
    (tmp_path / "mine.csv").write_text("question,A,B,answer\n2 + 2 =,3,4,B\n")
    for kind in ("jsonl", "json", "csv"):
        path = str(tmp_path / f"mine.{kind}")
        assert resolve_task(path).source == resolve_task(f"{kind}:{path}").source == f"{kind}:{path}"
    summary = evaluate(tmp_path / "out", [str(tmp_path / "mine.csv")], ["mcqa"], limit=None)
    assert summary["rows"][0]["task"] == "mine" and summary["rows"][0]["n"] == 1
    for missing in (tmp_path / "absent.csv", f"jsonl:{tmp_path / 'absent.jsonl'}"):
        with pytest.raises(DcsjaxError, match=f"task file {tmp_path}/absent.(csv|jsonl): no such file"):
            resolve_task(str(missing))


def test_summary_rows_merge_by_task_name_and_keep_other_protocols(tmp_path):
    evaluate(tmp_path, protocols=("qa-ppl", "dcs"))
    # the card named by its name, found on an include path, is the same task
    evaluate(tmp_path, tasks=(UNKNOWNS,), protocols=("dcs",), include_path=(str(Path(UNKNOWNS_CARD).parent),))
    evaluate(tmp_path, protocols=("dcs",))  # a second run into the same folder adds no record twice
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert sorted((r["task"], r["protocol"]) for r in rows) == [(UNKNOWNS, "dcs"), (UNKNOWNS, "qa-ppl")]
    lines = (tmp_path / MODEL / UNKNOWNS / "dcs.jsonl").read_text().splitlines()
    assert len(lines) == 6 == len({json.loads(line)["id"] for line in lines})


@pytest.mark.slow
def test_loadings_outside_definition_1_are_flagged_in_the_summary_table_and_report(tmp_path):
    """t > 0.5 gives lw = t/(1-t) > lc = 1 (Proposition 1's rule), outside Definition 1 (lc >= lw), where
    Theorem 1's [-1, 1] bound does not hold: the summary row says so, the table marks the value, the report
    lists it; at t = 0.5 (lw = lc) and for accuracy protocols nothing is flagged."""
    from dcsjax.eval.run import format_table

    summary = evaluate(tmp_path / "out", protocols=("dcs-letters", "mcqa"), threshold=0.75, limit=3)
    rows = {r["protocol"]: r for r in summary["rows"]}
    assert "lw = 3 > lc = 1: outside Definition 1" in rows["dcs-letters"]["loadings_note"]
    assert rows["mcqa"]["loadings_note"] is None
    table = format_table(summary)
    assert " †" in next(line for line in table.splitlines() if "dcs-letters" in line)
    assert " †" not in next(line for line in table.splitlines() if "mcqa" in line)
    assert "† lw = 3 > lc = 1: outside Definition 1 (lc >= lw); DCS lies in [-3, 1]" in table
    report = write_report([tmp_path / "out"], tmp_path / "report", n_boot=20).read_text()
    assert f"{MODEL}/{UNKNOWNS}/dcs-letters: lw = 3 > lc = 1" in report
    at_half = evaluate(tmp_path / "half", protocols=("dcs-letters",), threshold=0.5, limit=3)
    assert at_half["rows"][0]["loadings_note"] is None and "†" not in format_table(at_half)


@pytest.mark.slow
def test_report_skips_a_corrupt_line_and_leaves_the_file_unchanged(tmp_path):
    out = tmp_path / "out"
    evaluate(out, protocols=("dcs", "mcqa"), limit=8)  # no APS records: the report works on any protocols
    path = out / MODEL / UNKNOWNS / "dcs.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:20] + b"\n"
    path.write_bytes(b"".join(lines))
    before = path.read_bytes()
    with pytest.warns(UserWarning, match=r"dcs.jsonl:4: skipped"):
        summary = write_report([out], tmp_path / "report", n_boot=50)
    assert path.read_bytes() == before
    text = summary.read_text()
    assert "1 broken line(s)" in text and f"{path}:4" in text
    metrics = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert {r["n"] for r in metrics if r["protocol"] == "dcs"} == {7}
    assert not (tmp_path / "report" / "ppl.png").exists()


def cli_error(capsys, *args) -> str:
    """What `dcsjax ARGS` prints to stderr; it must exit with 2 (argparse's errors exit, ours return)."""
    try:
        code = main(list(args))
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    return capsys.readouterr().err


def test_cli_errors_are_one_line(tmp_path, capsys):
    model = ["--model", MODEL, "--output", str(tmp_path / "out")]
    out = [*model, "--tasks", UNKNOWNS_CARD]
    assert "--limit: must be a whole number of items, at least 1, not '0'" in cli_error(capsys, "eval", "--limit", "0", *out)
    assert "not '-3'" in cli_error(capsys, "eval", "--limit", "-3", *out)
    assert "--seed: must be a whole number of seed values (numpy's generators take no negative seed), at least 0, " \
        "not '-1'" in cli_error(capsys, "eval", "--seed", "-1", *out)
    for rows in ("0", "-4", "two"):
        assert f"--batch-size/--batch_size: must be a whole number of rows, at least 1, not '{rows}'" in \
            cli_error(capsys, "eval", "--batch-size", rows, *out)  # the flag and its lm-eval spelling
    assert "dcsjax: error: no task given: name one or more, comma-separated (--tasks)" in \
        cli_error(capsys, "eval", "--tasks", ",", *model)
    assert "strictly between 0 and 1, not '1.5'" in cli_error(capsys, "eval", "--threshold", "1.5", *out)
    assert "dcsjax: error: unknown protocol 'nope'; known: aps, qa-ppl, mcqa" in \
        cli_error(capsys, "eval", "--protocols", "dcs,nope", *out)
    assert "a mesh is data x model devices, two whole numbers such as '2x4', not 'banana'" in \
        cli_error(capsys, "eval", "--mesh", "banana", "--limit", "1", *out)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert f"dcsjax: error: cannot write to {blocker}/out" in cli_error(capsys, "eval", "--model", MODEL, "--tasks",
                                                                        UNKNOWNS_CARD, "--output", str(blocker / "out"))
    rows = tmp_path / "stmts.jsonl"
    rows.write_text(json.dumps({"id": "x", "choices": ["a", "b"], "statements": ["A.", "B."]}) + "\n")
    assert f"dcsjax: error: {rows}:1: not a statements row: missing field question" in \
        cli_error(capsys, "statements", "validate", str(rows))
    rows.write_bytes(b'{"id": "x", "question": "\xff"}\n')
    assert f"{rows}:1: not a statements row: not UTF-8" in cli_error(capsys, "statements", "validate", str(rows))


def test_api_argument_checks():
    for kwargs, message in [({"limit": 0}, "limit must be"), ({"limit": -3}, "limit must be"),
                            ({"threshold": 1.5}, "threshold must lie in"), ({"protocols": ["x"]}, "unknown protocol")]:
        with pytest.raises(ConfigError, match=message):
            run_eval(MODEL, ["known_unknowns"], kwargs.pop("protocols", ["dcs"]), "unused", **kwargs)


@pytest.mark.slow
def test_a_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    """The first load keeps the file's conversion and tokenizer in the cache; a kept copy damaged on disk is
    converted again with a warning, giving what a fresh conversion gives, and the next load is quiet."""
    import dcsjax
    from dcsjax.checkpoints.fetch import fetch_model

    path, reference = fetch_model(MODEL), scorer_for(MODEL)  # from the project's cache
    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path))  # an empty cache; the model loads by path
    texts = ["Question: Is it?\nAnswer: Yes", "The capital of France is Paris."]
    first = dcsjax.load(path, document_start="<|endoftext|>")
    (tokenizer,) = (tmp_path / "gguf-tokenizers").iterdir()
    (tokenizer / "init.json").write_text('{"bos_token": "<|endoft')
    (converted,) = (tmp_path / "converted").iterdir()
    params = converted / "params.safetensors"
    params.write_bytes(params.read_bytes()[: params.stat().st_size // 2])
    with pytest.warns(UserWarning) as caught:
        second = dcsjax.load(path, document_start="<|endoftext|>")
    said = " ".join(str(w.message) for w in caught)
    assert "cached tokenizer of SmolLM2-135M-Instruct.Q4_1.gguf is unusable" in said
    assert "converted copy of SmolLM2-135M-Instruct.Q4_1.gguf is unusable" in said
    assert second.encode(texts) == first.encode(texts) == reference.encode(texts)
    assert second.tokenizer.chat_template == reference.tokenizer.chat_template
    assert np.array_equal(second.score(texts), first.score(texts))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # repaired: the next load reads it quietly
        third = dcsjax.load(path, document_start="<|endoftext|>")
    assert np.array_equal(third.score(texts), first.score(texts))


@pytest.mark.slow
def test_a_conversion_that_cannot_be_kept_is_named_and_the_load_goes_on(tmp_path, monkeypatch):
    """A full disk while the first load keeps its conversion: one warning that says so, the conversion used
    from memory, nothing half-written left in the cache."""
    import errno

    import safetensors.numpy

    from dcsjax.checkpoints.cards import model_card
    from dcsjax.checkpoints.converted import convert_gguf, converted_gguf
    from dcsjax.checkpoints.fetch import fetch_model

    path = fetch_model(MODEL)
    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    with pytest.warns(UserWarning, match="the converted copy could not be kept .*No space left on device"):
        config, params, vocab_size = converted_gguf(path, model_card(MODEL).sha256)
    assert list((tmp_path / "converted").iterdir()) == []
    _, fresh, _ = convert_gguf(path)
    assert params.keys() == fresh.keys() and all(np.array_equal(params[k], fresh[k]) for k in fresh)


def test_an_instruct_model_without_a_chat_template_is_refused_naming_how_to_give_one(tmp_path):
    """Its letter and APX prompts would silently change (and with them every DCS and answer): it is refused
    instead; loaded as a base model it runs, asked without a template."""
    import copy

    tokenizer = copy.copy(tiny_scorer().tokenizer)
    tokenizer.chat_template = None
    assert tiny_scorer().tokenizer.chat_template  # the copy's change leaves the scorer's own tokenizer alone
    bare = tiny_scorer(tokenizer=tokenizer)
    for protocol, purpose in (("dcs-letters", "DCS from letters"), ("apx", "APX")):
        with pytest.raises(ConfigError, match=f"{MODEL} is an instruct model without a chat template, which "
                                              f"{purpose} asks it through: give its tokenizer one"):
            evaluate(tmp_path / protocol, protocols=(protocol,), scorer=bare)
    as_base = tiny_scorer(tokenizer=tokenizer, variant="base")
    assert values(evaluate(tmp_path / "base", protocols=("dcs-letters",), scorer=as_base))


@pytest.mark.parametrize("broken", ["summary.json", "fingerprints.json"])
def test_a_broken_summary_or_fingerprints_file_is_named_before_any_scoring(tmp_path, broken):
    task = write_jsonl(tmp_path / "items.jsonl", ITEMS)
    out = tmp_path / "out"
    evaluate(out, [task], ["mcqa"], limit=None)
    target = out / "summary.json" if broken == "summary.json" else out / MODEL / "items" / "fingerprints.json"
    target.write_text('{"rows": [')  # cut short
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}

    class NoScoring:  # a scorer that fails if the run gets as far as scoring
        def __getattr__(self, name):
            raise AssertionError(f"scored ({name}) despite a broken {broken}")

    with pytest.raises(ResultsError, match=re.escape(str(target)) + ": not a"):
        evaluate(out, [task], ["mcqa", "dcs"], limit=None, scorer=NoScoring())
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_temporary_files_a_killed_run_left_are_removed_by_the_next(tmp_path):
    task = write_jsonl(tmp_path / "items.jsonl", ITEMS)
    out = tmp_path / "out"
    first = values(evaluate(out, [task], ["mcqa"], limit=None))
    folder = out / MODEL / "items"
    # what a kill between a write and its rename leaves (write_text_atomic's names)
    left = [out / ".summary.json.k1ll3d", folder / ".fingerprints.json.a8c2x1", folder / ".errors.jsonl.q0z9w2"]
    for path in left:
        path.write_text("{half a file")
    with pytest.warns(UserWarning, match="a temporary file a stopped run left"):
        assert values(evaluate(out, [task], ["mcqa"], limit=None)) == first
    assert not any(path.exists() for path in left)
    assert sorted(p.name for p in folder.iterdir()) == ["errors.jsonl", "fingerprints.json", "mcqa.jsonl"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS])
def test_a_refused_write_is_one_line_naming_the_file_and_keeps_what_was_written(tmp_path, monkeypatch, code):
    """The file system refusing a records write mid-run (full disk, quota, a file too large, read-only):
    one line naming the file and the reason, the records written before kept, and the same command resumes."""
    from dcsjax.eval import results

    task = write_jsonl(tmp_path / "items.jsonl", ITEMS)
    out = tmp_path / "out"
    whole = values(evaluate(tmp_path / "whole", [task], ["mcqa"], limit=None))
    real, writes = results.os.fsync, []

    def refuses_the_second_write(fd):  # of the records file
        if os.readlink(f"/proc/self/fd/{fd}").endswith("mcqa.jsonl"):
            writes.append(fd)
            if len(writes) == 2:
                raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(results.os, "fsync", refuses_the_second_write)
    with pytest.raises(DiskError) as err:
        evaluate(out, [task], ["mcqa"], limit=None, chunk=2, max_chunk=2)
    message = str(err.value)
    records = out / MODEL / "items" / "mcqa.jsonl"
    assert message.startswith(f"{records}: ") and errno.errorcode[code] in message and "\n" not in message
    assert len(read_records(records)) >= 2  # the first write's records stay (the refused one may have reached the file)
    monkeypatch.undo()
    assert values(evaluate(out, [task], ["mcqa"], limit=None)) == whole


def test_a_read_only_cache_is_one_line_saying_where_to_cache(tmp_path, monkeypatch):
    from dcsjax import cache as paths

    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path / "cache"))

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(paths.Path, "mkdir", read_only)
    with pytest.raises(DiskError, match=rf"^{tmp_path}/cache: a read-only file system \(EROFS\); .*set DCSJAX_CACHE"):
        paths.cache_dir()


def test_odd_file_names_get_a_folder_of_their_own(tmp_path):
    """`...jsonl` (stem `..`) and `.hidden.jsonl` would name the model's folder's parent and a hidden folder:
    their results go to `__` and `_hidden`."""
    out = tmp_path / "out"
    tasks = [write_jsonl(tmp_path / "...jsonl", ITEMS), write_jsonl(tmp_path / ".hidden.jsonl", ITEMS),
             write_jsonl(tmp_path / "a b&c.jsonl", ITEMS)]
    summary = evaluate(out, tasks, ["mcqa"], limit=None)
    assert [r["n"] for r in summary["rows"]] == [len(ITEMS)] * 3
    assert sorted(p.name for p in (out / MODEL).iterdir()) == ["__", "_hidden", "a-b-c"]
    assert sorted(p.name for p in out.iterdir()) == [".lock", MODEL, "summary.json"]


def test_two_files_of_one_name_in_one_run_are_refused_before_the_model_loads(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_jsonl(tmp_path / "a" / "items.jsonl", ITEMS)
    second = write_jsonl(tmp_path / "b" / "items.jsonl", ITEMS)
    with pytest.raises(ConfigError, match=r"tasks .*a/items.jsonl, .*b/items.jsonl would share the results folder 'items'"):
        run_eval("no-such-model", [first, second], ["mcqa"], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_lm_eval_export_of_several_models_and_a_limit_rerun_reads_what_each_summary_row_read(tmp_path):
    """Two models in one results folder export one lm-eval file each; after runs with --limit 3, 6, then 3
    again, the standard error is that of the 3 items the summary row holds, not of the 6 in the file, and
    `report` reads those 3."""
    import numpy as np

    task = write_jsonl(tmp_path / "items.jsonl", ITEMS + [{**r, "id": f"r{i}"} for i, r in enumerate(ITEMS)])
    out = tmp_path / "out"
    for name in ("tiny-a", "tiny-b"):
        scorer = tiny_scorer(name=name)
        for limit in (3, 6, 3):
            evaluate(out, [task], ["mcqa"], limit=limit, scorer=scorer)
    assert main(["export-lm-eval", str(out), "--out", str(tmp_path / "lm")]) == 0
    for name in ("tiny-a", "tiny-b"):
        (path,) = (tmp_path / "lm" / name).glob("results_*.json")
        exported = json.loads(path.read_text())
        assert exported["model_name_sanitized"] == name and exported["results"]["items_mcqa"]["sample_len"] == 3
        records = read_records(out / name / "items" / "mcqa.jsonl")
        assert len(records) == 6
        first = [float(r["correct"]["sum"]) for r in records if r["id"] in ("q1", "q2", "q3")]
        assert exported["results"]["items_mcqa"]["acc_stderr,none"] == pytest.approx(
            np.std(first, ddof=1) / np.sqrt(3))
    # the report reads the same 3 records of each, not the 6 in the files
    from dcsjax.analysis.report import load_results

    loaded = load_results([out])
    assert {name: [r["id"] for r in m.records["items"]["mcqa"]] for name, m in loaded.items()} == \
        {"tiny-a": ["q1", "q2", "q3"], "tiny-b": ["q1", "q2", "q3"]}


def test_a_run_whose_every_item_failed_exits_non_zero(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "?", "choices": "not a list", "answer": 0}\n')
    import dcsjax

    monkeypatch.setattr(dcsjax, "load", lambda *a, **k: tiny_scorer())  # the run's `dcsjax.load`
    code = main(["eval", "--model", MODEL, "--tasks", f"jsonl:{bad}", "--protocols", "mcqa",
                 "--output", str(tmp_path / "out")])
    assert code == 1 and "every item failed" in capsys.readouterr().err


def test_a_uniform_answerers_dcs_is_the_chance_reference_printed():
    """Records of a uniform distribution over each item's options and IDK (as `dcs_records` makes them from
    any distribution) average to the `uniform` reference the summary row carries, at default and
    thresholded loadings; for an accuracy protocol it is the share of presented options that are correct."""
    import numpy as np

    from dcsjax.data.items import Item
    from dcsjax.eval.protocols.dcs import dcs_records
    from dcsjax.eval.run import chance_uniform, summary_row

    items = [Item("a", "?", ("x", "y", "z", "IDK"), (1,), idk=3), Item("b", "?", ("x", "y", "IDK"), (0, 1), idk=2),
             Item("c", "?", ("x", "y", "z", "w", "IDK"), (4,), idk=4)]  # c: unanswerable, IDK the correct one
    for lc, lw in ((1.0, 1.0), (1.0, 3.0)):
        probs = [np.full(len(i.choices), 1 / len(i.choices)) for i in items]
        records = dcs_records(items, probs, [i.idk for i in items], lc, lw, [{} for _ in items])
        row = summary_row("m", "t", "dcs-letters", records, 0, lc, lw, "f", {}, 0.0)
        assert row["chance"]["uniform"] == pytest.approx(np.mean([r["dcs"] for r in records]), abs=1e-6)
    presented = [{"order": {"presentations": [{"gold": ["B"], "size": 4, "answer": "A"}]}, "correct": False},
                 {"order": {"presentations": [{"gold": ["A", "B"], "size": 2, "answer": "A"}]}, "correct": True}]
    assert chance_uniform("apx", presented) == pytest.approx((1 / 4 + 2 / 2) / 2)


def test_statements_rows_are_checked_against_their_items(tmp_path):
    """APS takes a statements row for an item only where its question and options are the item's: a row of
    another item (an edited data file, another task's file) is an error record naming the line."""
    task = write_jsonl(tmp_path / "items.jsonl", ITEMS)
    rows = [{"id": i["id"], "question": i["question"], "choices": i["choices"],
             "statements": [f"It is {c}." for c in i["choices"]]} for i in ITEMS]
    rows[1] = {**rows[1], "question": "What is something else?"}
    rows[2] = {**rows[2], "choices": ["7", "8"]}
    stmts = tmp_path / "stmts.jsonl"
    stmts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = evaluate(tmp_path / "out", [task], ["aps"], limit=None, statements=stmts)
    assert [(r["n"], r["errors"]) for r in summary["rows"]] == [(1, 2)]
    errors = {e["where"]: e["error"] for e in read_errors(tmp_path / "out" / MODEL / "items")}
    assert errors["q2"].startswith(f"{stmts}:2: statements of another item: question 'What is something else?'")
    assert errors["q3"].startswith(f"{stmts}:3: statements of another item: choices ['7', '8']")


def test_aps_carries_its_statements_validation_and_publishes_nothing_from_straying_ones(tmp_path):
    """Every APS record carries its statements' BLEU and length gap against the question-answer pairs (002 A.2),
    the row their medians; statements far from their pairs leave the row without a number, the reason in its
    warnings and tables, and the report without their records. `--sample` draws from the items a file holds."""
    from dcsjax.eval.run import format_table
    from dcsjax.metrics.statements import bleu

    task = write_jsonl(tmp_path / "items.jsonl", ITEMS)
    close = [{"id": i["id"], "question": i["question"], "choices": i["choices"],
              "statements": [f"{i['question']} {c}" for c in i["choices"]]} for i in ITEMS]
    far = [{**r, "statements": [f"Entirely unrelated words that wander far from any pair, number {k} of them"
                                for k, _ in enumerate(r["choices"])]} for r in close]
    for name, rows in (("close", close), ("far", far)):
        stmts = tmp_path / f"{name}.jsonl"
        stmts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = evaluate(tmp_path / name, [task], ["aps", "qa-ppl"], limit=None, statements=stmts)
        row = summary["rows"][0]
        records = read_records(tmp_path / name / MODEL / "items" / "aps.jsonl")
        by_id = {r["id"]: r for r in rows}
        for record in records:  # in the presented order: each statement against its own option's pair
            item = next(i for i in ITEMS if i["id"] == record["id"])
            want = [bleu(s, f"{item['question']} {item['choices'][by_id[record['id']]['statements'].index(s)]}")
                    for s in record["statements"]]
            assert record["bleu"] == pytest.approx(want, abs=1e-4)
        if name == "close":
            assert row["metrics"]["statements_bleu_median"] == 1.0 and row["metrics"]["statements_gap_median"] == 0
            assert row["value"] == np.mean([r["correct"] for r in records]) and not row["warnings"]
        else:
            assert row["value"] is None and row["ci95"] == [None, None] and row["metrics"]["accuracy"] is None
            assert "fail validation (002 A.2): BLEU median" in row["warnings"][-1]
            table = format_table(summary)
            assert "withheld" in table and "no number: the statements fail validation" in table
            write_report([tmp_path / name], tmp_path / "report", n_boot=20)
            report = (tmp_path / "report" / "summary.md").read_text()
            assert f"APS withheld, its statements failing validation: {MODEL}/items:" in report
            cells = next(line for line in report.splitlines() if line.startswith("| items (n=3)")).split("|")
            assert cells[3].strip() == "-" and cells[4].strip().startswith("0.")  # APS's cell empty, qa-ppl's there
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(close[1]) + "\n")
    summary = evaluate(tmp_path / "sampled", [task], ["aps"], limit=None, sample=2, statements=one)
    assert [(r["n"], r["errors"]) for r in summary["rows"]] == [(1, 0)]


def test_data_errors_stop_the_run_before_the_model_loads(tmp_path):
    """Tasks are read before the model: a broken statements file is named at once (here the model name does
    not even exist, and it is not what the run stops on)."""
    from dcsjax.errors import InputError

    task = write_jsonl(tmp_path / "items.jsonl", ITEMS)
    stmts = tmp_path / "stmts.jsonl"
    stmts.write_text('{"id": "q1", "choices": ["2", "3"]}\n')
    with pytest.raises(InputError, match=f"{stmts}:1: not a statements row: missing field question"):
        run_eval("no-such-model", [task], ["aps"], tmp_path / "out", statements=stmts, progress=False)


def test_task_cards_outside_the_package(tmp_path, capsys):
    """`--include-path DIR` (lm-eval's convention): a folder's cards become task names, a card's relative
    `jsonl:` source is read from the card's folder, its templates and IDK option apply; a card file can be
    named as a task; a name defined twice, or a folder that is not there, is an error naming them."""
    from dcsjax.cli import main

    folder = tmp_path / "my_tasks"
    folder.mkdir()
    write_jsonl(folder / "sums.jsonl", [{**row, "choices": [*row["choices"], "No idea"]} for row in ITEMS])
    (folder / "sums.toml").write_text('name = "sums"\nsource = "jsonl:sums.jsonl"\nidk_choice = "No idea"\n'
                                      'qa_template = "Sum: {question} = {choice}"\n')
    summary = evaluate(tmp_path / "out", tasks=("sums",), protocols=("qa-ppl", "dcs-letters"), include_path=[folder])
    assert {(r["task"], r["protocol"], r["n"], r["errors"]) for r in summary["rows"]} == {
        ("sums", "qa-ppl", 3, 0), ("sums", "dcs-letters", 3, 0)}
    records = read_records(tmp_path / "out" / MODEL / "sums" / "dcs-letters.jsonl")
    assert all(r["probs"] and r["idk_index"] is not None for r in records)  # the card's IDK option found
    by_file = evaluate(tmp_path / "by_file", tasks=(str(folder / "sums.toml"),), protocols=("qa-ppl",))
    assert values(by_file) == {("sums", "qa-ppl"): values(summary)[("sums", "qa-ppl")]}

    assert main(["tasks", "--include-path", str(folder)]) == 0
    assert "jsonl:" + str(folder / "sums.jsonl") in capsys.readouterr().out
    (folder / "again.toml").write_text('name = "sums"\nsource = "jsonl:sums.jsonl"\n')
    assert "dcsjax: error: benchmark card 'sums' is defined twice" in cli_error(
        capsys, "eval", "--model", MODEL, "--tasks", "sums", "--include-path", str(folder))
    assert "not a folder of benchmark cards" in cli_error(
        capsys, "eval", "--model", MODEL, "--tasks", "sums", "--include-path", str(tmp_path / "nowhere"))
