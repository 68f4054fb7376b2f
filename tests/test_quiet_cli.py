"""A quiet, clear command line: no libtpu start-up lines on a host without a TPU (the test environment has libtpu,
for `dcsjax plan`), `JAX_PLATFORMS` kept where a user set it, a hub dataset out of reach failing in one line
within seconds, and a subject selection that matches nothing named."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOISE = ("Failed to find host bounds", "E0000", "Source Location Trace", "Traceback", "InitGoogle")


def dcsjax(*args, env=None, timeout=600):
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "dcsjax", *args], capture_output=True, text=True, timeout=timeout,
                         env=env or {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}, cwd=ROOT)
    return out, time.perf_counter() - started


@pytest.mark.slow
def test_no_command_prints_libtpus_start_up_lines_where_there_is_no_tpu(tmp_path):
    pytest.importorskip("libtpu")  # the test extra brings it: the case the lines came from
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"question": "2 + 2 =", "choices": ["3", "4"], "answer": 1}) + "\n")
    config = json.loads((ROOT / "models" / "configs" / "llama-3.1-8b.json").read_text())
    config.update(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64, vocab_size=512)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(config))
    runs = {"tasks": dcsjax("tasks")[0],
            "eval": dcsjax("eval", "--model", "smollm2-135m-instruct", "--tasks", str(data), "--protocols", "mcqa",
                           "--output", str(tmp_path / "out"))[0],
            "plan": dcsjax("plan", "--model", str(tmp_path / "tiny"), "--topology", "v5e:2x2", "--programs", "score",
                           "--rows", "2", "--length", "128")[0]}
    for name, out in runs.items():
        assert out.returncode == 0, (name, out.stderr[-2000:])
        said = out.stdout + out.stderr
        assert not [n for n in NOISE if n in said], (name, said[-3000:])
    assert re.search(r"mine +mcqa", runs["eval"].stdout) and "v5e:2x2" in runs["plan"].stdout  # each did its work


def test_jax_platforms_are_chosen_only_where_the_user_set_none():
    """On a host with no TPU and no GPU device JAX starts its CPU backend alone; an accelerator host keeps JAX's own
    search; a user's JAX_PLATFORMS is kept."""
    from dcsjax.host import GPU_DEVICES, TPU_DEVICES, has_any

    code = "import os, dcsjax; print(os.environ.get('JAX_PLATFORMS'))"
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    want = "None" if has_any(TPU_DEVICES) or has_any(GPU_DEVICES) else "cpu"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == want
    env["JAX_PLATFORMS"] = "cpu,tpu"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "cpu,tpu"


@pytest.mark.parametrize("how", ["a loopback address that refuses", "HF_HUB_OFFLINE"])
def test_a_hub_dataset_out_of_reach_fails_in_one_line_within_seconds(tmp_path, how):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty datasets cache
    if how == "HF_HUB_OFFLINE":
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
    out, seconds = dcsjax("eval", "--model", "smollm2-135m-instruct", "--tasks", "arc_easy", "--limit", "2",
                          "--output", str(tmp_path / "out"), env=env, timeout=120)
    err = out.stderr.strip()
    assert out.returncode == 2 and seconds < 10, (seconds, err[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith(
        "dcsjax: error: task arc_easy: the hub dataset allenai/ai2_arc (ARC-Easy, test) could not be loaded")
    assert "Retrying" not in out.stdout + out.stderr


def test_a_subject_selection_that_matches_nothing_is_named(capsys):
    from dcsjax.cli import main

    assert main(["eval", "--model", "smollm2-135m-instruct", "--tasks", "mmlu:astrology", "--limit", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dcsjax: error: MMLU has no subject 'astrology'") and len(err.splitlines()) == 1
