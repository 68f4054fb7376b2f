"""`dcsjax eval`: per-item JSONL, summary and table; a run killed by SIGKILL resumes to identical files."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import UNKNOWNS, UNKNOWNS_CARD, scorer_for
from dcsjax.data.tasks import load_task, resolve_task
from dcsjax.eval.run import format_table, length_hint, read_records, run_eval

pytestmark = pytest.mark.slow

TASK, PROTOCOLS, LIMIT = UNKNOWNS_CARD, ["dcs", "qa-ppl"], 24


def files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.jsonl"))}


def test_eval_writes_records_summary_and_table(tmp_path):
    summary = run_eval("smollm2-135m-instruct", [TASK], PROTOCOLS + ["mcqa", "dcs-letters"], tmp_path, limit=LIMIT,
                       scorer=scorer_for("smollm2-135m-instruct"), progress=False)
    rows = {r["protocol"]: r for r in summary["rows"]}
    assert set(rows) == {"dcs", "qa-ppl", "mcqa", "dcs-letters"} and all(r["n"] == LIMIT for r in rows.values())
    low, high = rows["dcs"]["ci95"]
    assert -1 <= low <= rows["dcs"]["value"] <= high <= 1
    records = read_records(tmp_path / "smollm2-135m-instruct" / UNKNOWNS / "dcs.jsonl")
    assert len(records) == LIMIT and len({r["id"] for r in records}) == LIMIT
    # written shortest item first (so each write fills few buckets), not in the task's order
    items = load_task(resolve_task(TASK))[0][:LIMIT]
    shortest_first = [i.id for i in sorted(items, key=length_hint)]
    assert [r["id"] for r in records] == shortest_first != [i.id for i in items]
    idk = {i.id: i.idk for i in items}
    for r in records:  # a distribution over the options, IDK included
        perm = r["order"]["presentations"][0]["perm"]  # shuffled: "Unknown" anywhere
        assert abs(sum(r["probs"]) - 1) < 1e-5 and perm[r["idk_index"]] == idk[r["id"]]
        assert abs(r["p_correct"] + r["p_wrong"] + r["p_idk"] - 1) < 1e-5
    letters = read_records(tmp_path / "smollm2-135m-instruct" / UNKNOWNS / "dcs-letters.jsonl")
    assert all(0 < r["letter_mass"] <= 1 for r in letters)
    assert UNKNOWNS in format_table(summary)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["rows"] == summary["rows"]
    # the run that made the rows: its configuration and versions, named by every row
    run = written["runs"][summary["rows"][0]["run"]]
    assert {r["run"] for r in written["rows"]} == set(written["runs"])
    assert run["model"] == "smollm2-135m-instruct" and run["model_identity"]["sha256"]
    assert run["model_identity"]["chat_template"]  # the template decides the letter prompts: it names the model
    assert (run["protocols"], run["limit"], run["option_order"], run["seed"], run["dtype"], run["lc"]) == (
        PROTOCOLS + ["mcqa", "dcs-letters"], LIMIT, "shuffle", 0, "float32", 1.0)
    versions = run["versions"]
    assert all(versions[k] for k in ("dcsjax", "sources", "python", "jax", "jaxlib", "flax", "transformers", "numpy"))
    assert versions["devices"]["platform"] == "cpu" and versions["devices"]["count"] >= 1


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    whole = tmp_path_factory.mktemp("whole")
    run_eval("smollm2-135m-instruct", [TASK], PROTOCOLS, whole, limit=LIMIT,
             scorer=scorer_for("smollm2-135m-instruct"), progress=False, chunk=4, max_chunk=4)
    return whole


@pytest.mark.parametrize("protocol, at_least", [("dcs", 8), ("qa-ppl", 4)])  # in the first protocol, in the second
def test_resume_after_sigkill_gives_identical_files(tmp_path, whole_run, protocol, at_least):
    """A multi-chunk run of two protocols (24 items in chunks of 4) killed with SIGKILL, in either protocol,
    and started again writes byte-identical records, fingerprints included."""
    broken = tmp_path / "broken"
    code = (f"from dcsjax.eval.run import run_eval; run_eval('smollm2-135m-instruct', [{TASK!r}], {PROTOCOLS!r}, "
            f"{str(broken)!r}, limit={LIMIT}, progress=False, chunk=4, max_chunk=4)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())
    target = broken / "smollm2-135m-instruct" / UNKNOWNS / f"{protocol}.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and (not target.exists() or len(target.read_bytes().splitlines()) < at_least):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = len(target.read_bytes().splitlines())
    assert at_least <= written < LIMIT, "the kill came before the run had written a part of its items"
    with target.open("ab") as f:  # as if the kill had cut a line in half
        f.write(b'{"id": "unknown/9')
    with pytest.warns(UserWarning, match="cut short"):
        run_eval("smollm2-135m-instruct", [TASK], PROTOCOLS, broken, limit=LIMIT,
                 scorer=scorer_for("smollm2-135m-instruct"), progress=False, chunk=4, max_chunk=4)
    assert files(broken) == files(whole_run)
    assert all(len(read_records(broken / "smollm2-135m-instruct" / UNKNOWNS / f"{p}.jsonl")) == LIMIT for p in PROTOCOLS)


def test_sigterm_stops_with_one_line_and_exit_143_then_resumes_to_identical_files(tmp_path, whole_run):
    """`dcsjax eval` sent SIGTERM (as a scheduler stops a job) says how to resume in one line, exits 143, and
    the same command picks up where it stopped: the records equal an unbroken run's."""
    broken = tmp_path / "broken"
    cli = [sys.executable, "-m", "dcsjax", "eval", "--model", "smollm2-135m-instruct", "--tasks", TASK, "--protocols",
           ",".join(PROTOCOLS), "--limit", str(LIMIT), "--output", str(broken)]
    proc = subprocess.Popen(cli, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the writer keeps fingerprints.json as it starts the first protocol: the run has seconds of scoring left
    # (waiting for records instead could find it finished on a fast host)
    started = broken / "smollm2-135m-instruct" / UNKNOWNS / "fingerprints.json"
    deadline = time.time() + 600
    while time.time() < deadline and not started.exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-2000:]
    # one line (a progress bar may share the terminal line it starts on)
    assert "dcsjax: stopped by SIGTERM; what was written is kept: run the same command again to resume\n" in err
    assert "Traceback" not in err
    run_eval("smollm2-135m-instruct", [TASK], PROTOCOLS, broken, limit=LIMIT,
             scorer=scorer_for("smollm2-135m-instruct"), progress=False)
    assert files(broken) == files(whole_run)
