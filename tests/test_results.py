"""The results layout (`dcsjax.eval.results`) on its own, no model: readers that never write, the lock, the
atomic merged summary, valid JSON always, fingerprints that name what differs."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dcsjax.eval import results
from dcsjax.eval.results import ReadReport, ResultsError, ResultsWriter


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as every JSON reader but Python's does."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a JSON file"))


def test_reader_skips_broken_and_duplicate_lines_and_leaves_the_file_alone(tmp_path):
    path = tmp_path / "dcs.jsonl"
    lines = [json.dumps({"id": f"q{i}", "dcs": 0.1 * i}) for i in range(8)]
    lines[2] = '{"id": "q2", "dcs": 0.'  # corrupted in the middle
    lines.append(json.dumps({"id": "q5", "dcs": 9.9}))  # a second record of q5
    data = ("\n".join(lines) + "\n").encode() + b'{"id": "q9"'  # and a last line cut short
    path.write_bytes(data)
    report = ReadReport()
    with pytest.warns(UserWarning, match=r"dcs.jsonl:3: skipped"):
        records = results.read_records(path, report)
    assert [r["id"] for r in records] == ["q0", "q1", "q3", "q4", "q5", "q6", "q7"]
    assert next(r for r in records if r["id"] == "q5")["dcs"] == 0.5  # the first record of an item counts
    assert [b.split(": ")[0] for b in report.broken] == [f"{path}:3", f"{path}:10"]
    assert report.duplicates == [f"{path}:9: q5"]
    assert path.read_bytes() == data  # a reader never writes


def test_only_the_writer_repairs_a_cut_last_line(tmp_path):
    path = tmp_path / "aps.jsonl"
    path.write_bytes(b'{"id": "a", "fingerprint": "f"}\n{"id": "b", "fin')
    with ResultsWriter(tmp_path) as writer, pytest.warns(UserWarning, match="cut short"):
        done = writer.resume(path, "f", {"x": 1})
    assert [r["id"] for r in done] == ["a"]
    assert path.read_bytes() == b'{"id": "a", "fingerprint": "f"}\n'


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from dcsjax.eval.results import ResultsWriter
        with ResultsWriter({str(tmp_path)!r}):
            print("locked", flush=True)
            sys.stdin.readline()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ResultsError, match=rf"results folder {tmp_path} is being written by process {holder.pid}"):
            with ResultsWriter(tmp_path):
                pass
    finally:
        holder.communicate("\n", timeout=60)
    with ResultsWriter(tmp_path):  # released when the holder is done (or killed: the OS drops the lock)
        pass


def test_unwritable_output_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ResultsError, match=f"cannot write to {blocker}/out"):
        with ResultsWriter(blocker / "out"):
            pass


def row(task, protocol, value, model="m"):
    return {"model": model, "task": task, "protocol": protocol, "n": 3, "value": value, "ci95": [value, value]}


def test_summary_merges_by_key_without_losing_or_duplicating_rows(tmp_path):
    with ResultsWriter(tmp_path) as writer:
        writer.update_summary([row("t1", "aps", 0.5), row("t1", "dcs", 0.1), row("t2", "aps", 0.7)])
        summary = writer.update_summary([row("t1", "dcs", 0.2)])  # only one protocol rerun
    rows = {(r["task"], r["protocol"]): r["value"] for r in summary["rows"]}
    assert rows == {("t1", "aps"): 0.5, ("t1", "dcs"): 0.2, ("t2", "aps"): 0.7}
    assert strict_json((tmp_path / "summary.json").read_text()) == summary


def test_summary_is_valid_json_with_null_for_nan(tmp_path):
    with ResultsWriter(tmp_path) as writer:
        writer.update_summary([row("empty", "dcs", float("nan")) | {"ci95": [float("nan"), float("inf")]}])
    summary = strict_json((tmp_path / "summary.json").read_text())
    assert summary["rows"][0]["value"] is None and summary["rows"][0]["ci95"] == [None, None]


def test_summary_write_is_atomic(tmp_path, monkeypatch):
    with ResultsWriter(tmp_path) as writer:
        writer.update_summary([row("t1", "aps", 0.5)])
        before = (tmp_path / "summary.json").read_bytes()

        def dies_before_the_rename(fd):
            raise KeyboardInterrupt  # as a kill would, the new text written but not yet in place

        monkeypatch.setattr(results.os, "fsync", dies_before_the_rename)
        with pytest.raises(KeyboardInterrupt):
            writer.update_summary([row("t1", "aps", 0.9)])
    assert (tmp_path / "summary.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "summary.json"]  # no temporary file left


def test_a_summary_that_is_not_ours_is_named(tmp_path):
    (tmp_path / "summary.json").write_text('{"rows": [')
    with pytest.raises(ResultsError, match=f"{tmp_path}/summary.json: not a dcsjax summary"):
        with ResultsWriter(tmp_path) as writer:
            writer.update_summary([row("t", "aps", 0.1)])


def test_stale_records_stop_the_run_naming_the_difference_or_move_aside(tmp_path):
    path = tmp_path / "m" / "t" / "dcs.jsonl"
    old = {"model": {"dtype": "float32"}, "settings": {"lc": 1.0, "lw": 1.0}}
    new = {"model": {"dtype": "float32"}, "settings": {"lc": 1.0, "lw": 9.0}}
    with ResultsWriter(tmp_path) as writer:
        writer.resume(path, results.digest(old), old)
        writer.append(path, [{"id": "q1", "dcs": 0.3, "fingerprint": results.digest(old)}])
        with pytest.raises(ResultsError, match=r"1 record\(s\) made with other settings \(settings.lw: 1.0 -> 9.0\)"):
            writer.resume(path, results.digest(new), new)
        assert len(results.read_records(path)) == 1  # nothing lost
    with ResultsWriter(tmp_path, replace_stale=True) as writer, pytest.warns(UserWarning, match="moved to dcs.jsonl.stale"):
        assert writer.resume(path, results.digest(new), new) == []
    assert not path.exists() and len(results.read_records(path.with_name("dcs.jsonl.stale"))) == 1


def test_differences_name_nested_keys():
    assert results.differences({"model": {"dtype": "float32", "sha256": "a"}, "lw": 1.0},
                               {"model": {"dtype": "bfloat16", "sha256": "a"}, "lw": 1.0}) == \
        ["model.dtype: 'float32' -> 'bfloat16'"]
    assert results.digest({"a": 1, "b": 2}) == results.digest({"b": 2, "a": 1})


def test_analysis_and_results_do_not_import_the_model_stack():
    code = ("import sys, dcsjax.analysis.report, dcsjax.analysis.scaling, dcsjax.eval.results; "
            "print(sorted(m for m in ('flax', 'transformers', 'torch', 'dcsjax.engine.load') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
    assert out.strip() == "[]"


def test_set_aside_files_are_never_overwritten_and_results_follow_the_umask(tmp_path):
    import os

    from dcsjax.eval.results import stale_path, write_json_atomic

    path = tmp_path / "dcs.jsonl"
    for n, name in enumerate(["dcs.jsonl.stale", "dcs.jsonl.stale.2", "dcs.jsonl.stale.3"]):
        path.write_text(f"run {n}\n")
        aside = stale_path(path)
        assert aside.name == name
        os.replace(path, aside)
    assert [(tmp_path / n).read_text() for n in ("dcs.jsonl.stale", "dcs.jsonl.stale.2")] == ["run 0\n", "run 1\n"]
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "summary.json", {"rows": []})
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644


def test_result_files_are_the_layout_only_and_strays_are_named(tmp_path):
    """A copy put aside (backup/old/dcs.jsonl) is no model called "backup", and notes.jsonl beside real records
    no protocol called "notes": both are skipped with a warning naming them."""
    import json
    import warnings

    from dcsjax.eval.results import result_files

    task = tmp_path / "model" / "task"
    task.mkdir(parents=True)
    (task / "fingerprints.json").write_text(json.dumps({"abc": {"protocol": "dcs"}}))
    (task / "dcs.jsonl").write_text(json.dumps({"id": "1", "fingerprint": "abc"}) + "\n")
    (task / "notes.jsonl").write_text(json.dumps({"note": "look at item 3"}) + "\n")
    (task / "errors.jsonl").write_text(json.dumps({"where": "x", "error": "y"}) + "\n")
    stray = tmp_path / "backup" / "old"
    stray.mkdir(parents=True)
    (stray / "dcs.jsonl").write_text(json.dumps({"id": "1", "fingerprint": "abc"}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = list(result_files(tmp_path))
    assert found == [("model", "task", "dcs", task / "dcs.jsonl")]
    said = sorted(str(w.message) for w in caught)
    assert said[0].startswith(f"{stray / 'dcs.jsonl'}: skipped, not in the results layout")
    assert said[1].startswith(f"{task / 'notes.jsonl'}: skipped, its records carry no fingerprint")
