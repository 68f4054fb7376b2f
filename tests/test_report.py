"""`dcsjax report`: figures and summary from real `dcsjax eval` records, numbers checked against the
records themselves; the scaling path on a folder of many (synthetic) models with known sizes."""

import json
import re

import numpy as np
import pytest

from conftest import scorer_for, write_bigbench_checkout
from dcsjax.analysis.report import write_report
from dcsjax.cli import main
from dcsjax.eval.run import read_records, run_eval

PNG = b"\x89PNG\r\n\x1a\n"
FIGURES = ("scaling.png", "scaling_by_task.png", "dcs_spectrum.png", "risk_coverage.png", "ppl.png", "positions.png")


@pytest.fixture(scope="module")
def real_results(tmp_path_factory):
    """Every protocol, APS included, on a task with declarative statements: logical_deduction's card, read from the
    tests' own BIG-bench copy (MMLU has no statements)."""
    from dcsjax.data import bigbench

    folder = tmp_path_factory.mktemp("results")
    root = write_bigbench_checkout(tmp_path_factory.mktemp("bigbench-copy")) / "benchmark_tasks"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bigbench, "fetch_bigbench", lambda quiet=False, source=None: root)
        run_eval("smollm2-135m-instruct", ["logical_deduction_three_objects"], ["aps", "mcqa", "apx", "dcs", "dcs-letters"],
                 folder, limit=8, scorer=scorer_for("smollm2-135m-instruct"), progress=False)
    return folder


@pytest.mark.slow
def test_report_on_real_results(real_results, tmp_path):
    summary = write_report([real_results], tmp_path, n_boot=200)
    for name in FIGURES:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
    rows = {(r["protocol"], r["metric"]): r for r in json.loads((tmp_path / "metrics.json").read_text())}
    folder = real_results / "smollm2-135m-instruct" / "logical_deduction_three_objects"
    dcs = read_records(folder / "dcs.jsonl")
    assert rows["dcs", "dcs"]["value"] == pytest.approx(np.mean([r["dcs"] for r in dcs]), abs=1e-6)
    assert rows["dcs", "dcs"]["low"] <= rows["dcs", "dcs"]["value"] <= rows["dcs", "dcs"]["high"]
    apx, aps = read_records(folder / "apx.jsonl"), read_records(folder / "aps.jsonl")
    diff = np.mean([r["correct"] for r in apx]) - np.mean([r["correct"] for r in aps])
    assert rows["apx-aps", "accuracy_diff"]["value"] == pytest.approx(diff, abs=1e-6)
    mcqa = {r["id"]: r["correct"]["sum"] for r in read_records(folder / "mcqa.jsonl")}  # APS against option likelihood
    diff = np.mean([r["correct"] for r in aps]) - np.mean([mcqa[r["id"]] for r in aps])
    assert rows["aps-mcqa", "accuracy_diff"]["value"] == pytest.approx(diff, abs=1e-6)
    for metric in ("brier", "ece", "ece_mass", "aurc", "ternary_t0.75"):
        assert ("dcs-letters", metric) in rows and np.isfinite(rows["dcs-letters", metric]["value"])
    text = re.sub(" +", " ", summary.read_text())  # the tables' cells are padded to their columns' width
    assert "| smollm2-135m-instruct | logical_deduction_three_objects | dcs | brier |" in text and "too few" in text
    # where gold options sat, from the records' own permutations (three options shuffled)
    apx_row = next(line for line in text.splitlines() if line.startswith("| smollm2-135m-instruct | logical_deduction_three_objects | apx | shuffle |"))
    gold_a = np.mean([r["order"]["presentations"][0]["gold"] == ["A"] for r in apx])
    assert f"A:{gold_a:.2f}" in apx_row and "| 8 |" in apx_row
    assert "| smollm2-135m-instruct | logical_deduction_three_objects | 8 |" in text.split("## Sequence DCS under each IDK phrasing")[1]  # the IDK table
    results_row = next(line for line in text.split("## Results")[1].splitlines() if line.startswith("| logical_deduction_three_objects (n=8)"))
    aps_accuracy = np.mean([r["correct"] for r in read_records(folder / "aps.jsonl")])
    assert results_row.split(" | ")[2].startswith(f"{aps_accuracy:.2f} [")  # task, model, then APS
    # beside it, its chance reference on APS's own presentations: three statements, one true
    assert "{u 0.33" in results_row.split(" | ")[2]


@pytest.mark.slow
def test_report_fits_scaling_curves_across_many_models(tmp_path):
    """Eight models of known sizes: APS flat, APX rising steeply; the summary names the fitted families and
    a break-even inside the sizes."""
    sizes, results = tmp_path / "sizes.toml", tmp_path / "results"
    lines = []
    rng = np.random.default_rng(0)
    for i, log_size in enumerate(np.linspace(8, 11, 8)):
        name = f"model-{i}"
        lines.append(f'[{name}]\nparameters = {10 ** log_size:.0f}\nvariant = "base"\n')
        for protocol, accuracy in (("aps", 0.55 + 0.03 * (log_size - 9.5)), ("apx", 0.5 + 0.2 * (log_size - 9.5))):
            folder = results / name / "task"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "fingerprints.json").write_text(json.dumps({"synthetic": {"protocol": protocol}}))  # as the writer keeps
            hits = rng.random(400) < accuracy
            (folder / f"{protocol}.jsonl").write_text("".join(
                json.dumps({"id": str(k), "correct": bool(h), "ppl_delta": 1.0, "ppl_correct": 10.0,
                            "parse_error": None, "fingerprint": "synthetic"}) + "\n" for k, h in enumerate(hits)))
    sizes.write_text("\n".join(lines))
    text = write_report([results], tmp_path / "out", sizes, n_boot=100).read_text()
    assert "APS base:" in text and "APX base:" in text and "APX overtakes APS at" in text


def test_report_command_errors_name_the_folder(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    assert "missing: not a results folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no <model>/<task>/<protocol>.jsonl results" in capsys.readouterr().err
