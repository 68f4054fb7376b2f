"""The benchmark scripts run end to end and write their tables (their speeds are reported, never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import F32_NATS

pytestmark = [pytest.mark.slow, pytest.mark.bench]

ROOT = Path(__file__).resolve().parent.parent


def run(args, tmp_path):
    """`python <script> <args> --out <tmp_path>` in a process of its own: a bench script sets process-wide
    state (torch's threads, XLA flags, jax's caches), which must not reach the tests that share a worker."""
    out = subprocess.run([sys.executable, *args, "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    (path,) = tmp_path.glob("*.json")
    return json.loads(path.read_text())


def names_its_code(record):
    """A bench record says what made it (`bench/common.write_record`): the host, the code (source digest),
    the libraries, the command and its arguments."""
    env = record["environment"]
    assert env["sources"] and env["jax"] and env["transformers"] and record["arguments"] and record["command"]
    assert record["cpu"] and record["cores"] and record["device"] and record["time"]
    return True


def test_throughput_script_quick(tmp_path):
    # not the long workload: it runs through the statements' loop, only on 256-token rows (minutes more here);
    # float32 only: bfloat16 takes the same loop with another dtype and a second pair of models (about a
    # minute more here). bfloat16 scoring is checked in test_hf_dir.py and the GPU script's small run; this
    # script's bfloat16-only lines (the gap to float32, the batch-size shift) run only in real bench runs.
    result = run(["bench/throughput.py", "--models", "smollm2-135m-instruct", "--quick", "--workloads",
                  "statements,options", "--dtypes", "float32"], tmp_path)
    assert result["matmul_gflops"]["float32"] > 0 and names_its_code(result) and result["torch"]
    engines = {(r["workload"], r["engine"], r["dtype"]) for r in result["rows"]}
    assert ("statements", "dcsjax", "float32") in engines and ("statements", "peer", "float32") in engines
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in result["rows"])
    shared = [r for r in result["rows"] if r["workload"] == "options"]
    assert {r["shared_question"] for r in shared} == {True, False}


def test_gpu_script_small_config_on_cpu(tmp_path):
    result = run(["bench/gpu_llama1b.py", "--small"], tmp_path)
    scoring = [r for r in result["rows"] if "tokens_per_s" in r]
    assert len(scoring) == 4 and all(r["tokens_per_s"] > 0 for r in scoring)  # two workloads a model
    # XLA's estimate beside each model's measurements: its FLOPs are the model's (the seconds may be absent
    # on a backend whose cost model gives none)
    estimates = [r for r in result["rows"] if r["workload"].startswith("XLA's estimate")]
    assert len(estimates) == 2 and all(0.9 < r["compiled_over_model"] < 1.5 for r in estimates)
    assert {r["attention"] for r in scoring} == {"dense", "blockwise"}  # long rows take the blockwise path
    assert [r["generated_tokens_per_s"] > 0 for r in result["rows"] if "generation" in r["workload"]] == [True] * 2
    # its float32 check: here the device is the CPU itself, so the same program on the same weights (on a GPU,
    # where it found TensorFloat-32 at 4.8e-4 nats, it measures the precision the decoder asks for)
    assert result["checks"]["float32_logprobs"]["max_gap_nats"] == 0.0 and result["finished"]


def test_lm_eval_backends_script_quick(tmp_path):
    """Also lm-eval's packaged arc_easy.yaml, unchanged but for its data (MMLU items in ARC's schema), through
    both backends: every request's log-likelihood within F32_NATS, the same is_greedy flags and argmax choices,
    the same metrics (the kept task configs' comparisons are test_lm_eval.py's)."""
    result = run(["bench/lm_eval_backends.py", "--items", "6", "--arc-only"], tmp_path)
    assert [r["backend"] for r in result["rows"]] == ["dcsjax", "hf"]
    assert all(r["first_run_s"] > 0 and r["loaded_run_s"] > 0 for r in result["rows"])
    assert result["metrics"]["dcsjax"] == result["metrics"]["hf"]  # the same accuracies from both backends
    agree = result["agreement"]
    assert agree["documents"] == 6 and agree["requests"] == 24 and agree["largest_gap"] < F32_NATS, agree
    assert agree["greedy_differs"] == agree["choice_differs"] == 0, agree
    assert agree["doc_to_text"] == "Question: {{question}}\nAnswer:"  # lm-eval's own arc prompt
    assert result["model_backend"] == "dcsjax" and names_its_code(result)


def test_generation_script_quick(tmp_path):
    # the statements workload only: the apx workload's greedy tokens against transformers' generate are what
    # test_apx.py (Gemma 3) and test_lm_eval.py's generate_until comparison (SmolLM2) check, and both workloads
    # run the same decoding loop in both engines
    result = run(["bench/generation.py", "--prompts", "4", "--batch", "4", "--workloads", "statements",
                  "--max-new", "8"], tmp_path)
    (statements,) = result["rows"]
    # statement generation: A.1's sampling in both engines, every row decoding its whole (capped) budget
    assert (statements["workload"], statements["temperature"], statements["top_p"]) == ("statements", 0.7, 0.95)
    assert statements["same_tokens"] == "sampled" and statements["new_tokens"] == 8
    assert statements["dcsjax_tokens"] == statements["peer_tokens"] == 4 * 8
    assert statements["dcsjax_tokens_per_s"] > 0 and statements["peer_tokens_per_s"] > 0
    assert names_its_code(result) and result["torch"]


def test_eval_end_to_end_script_quick(tmp_path):
    result = run(["bench/eval_end_to_end.py", "--task", "mmlu:world_religions", "--items", "12"], tmp_path)
    assert result["same_answers"] and result["engine_s"] > 0 and result["eval_s"] > 0
    assert sum(result["writes"]) == 12 and names_its_code(result)


def test_decode_profile_script_quick(tmp_path):
    result = run(["bench/profile_decode.py", "--prompts", "4", "--new", "16"], tmp_path)  # 15 steps: more than the timing noise
    assert result["decode_step_s"] > 0 and result["rows"] and names_its_code(result)
    kinds = {r["what"] for r in result["rows"]}
    assert {"weight matmuls", "attention over the cache"} <= kinds


def test_passages_script_quick(tmp_path):
    result = run(["bench/passages.py", "--quick"], tmp_path)
    (row,) = result["rows"]
    assert row["blockwise"]["tokens_per_s"] > 0 and row["dense"]["tokens_per_s"] > 0
    assert row["max_gap_blockwise_dense"] < 1e-4 and row["max_gap_blockwise_peer"] < F32_NATS
    assert names_its_code(result) and result["torch"]


def test_profile_script_quick(tmp_path):
    # through --xla-flags (each setting in a process of its own), with XLA's default setting only: a second
    # setting costs a whole second profile, and what another flag does to the kernels is a bench finding
    result = run(["bench/profile_statements.py", "--dtypes", "float32", "--statements", "64", "--repeats", "1",
                  "--xla-flags", ""], tmp_path)
    (row,) = result["rows"]
    assert row["batch"][1] % 64 == 0 and 0 < row["scored_tokens"] <= row["batch"][0] * row["batch"][1]
    assert all(row[k] > 0 for k in ("whole_s", "decoder_s", "head_and_logsoftmax_s", "block_matmuls_xla_s",
                                     "block_matmuls_torch_s", "head_matmul_xla_s", "head_matmul_torch_s"))
    assert row["head_gflop"] == pytest.approx(2 * 64 * row["batch"][0] * 576 * 49152 / 1e9)  # SmolLM2: D 576, V 49152
    assert row["xla_flags"] == "" and row["bit_identical_to_first"] and names_its_code(result)


def test_lora_step_profile_script_small(tmp_path):
    result = run(["bench/profile_lora_step.py", "--lora-layers", "2", "--batch", "4"], tmp_path)
    what = {r["what"] for r in result["rows"]}
    assert {"forward: weight matmuls", "backward: weight matmuls"} <= what
    assert result["update_s"] > 0 and sum(r["seconds"] for r in result["rows"]) == pytest.approx(result["operations_s"], rel=1e-2)


def test_attention_profile_script_small(tmp_path):
    result = run(["bench/profile_attention.py", "--rows", "1024", "--repeats", "1"], tmp_path)
    (row,) = result["rows"]
    assert row["max_gap_blockwise_sdpa"] < 1e-5  # the peer's kernel computes the same attention
    assert row["live_tiles_per_layer"] == 3 and all(v > 0 for v in row["tile"].values())
    assert 0 < row["attention_blockwise_s"] and 0 < row["attention_share_of_forward"] < 1


def test_suite_times_sums_each_file_from_a_durations_log(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    from suite_times import main

    log = tmp_path / "ci.log"
    log.write_text("== slowest durations ==\n12.50s call     tests/test_a.py::test_x[1]\n2.50s setup    tests/test_a.py::test_x[1]\n"
                   "3.00s call     tests/test_b.py::test_y\n1.00s teardown tests/test_a.py::test_z\n"
                   "==== 3 passed in 9.10s ====\n")
    main(str(log))
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines() if line.startswith("| tests")}
    assert (rows["tests/test_a.py"], rows["tests/test_b.py"], rows["tests/test_a.py::test_x[1]"]) == ("16.0", "3.0", "15.0")
    assert "sum of the tests' times: 19 s" in out and out.strip().endswith("3 passed in 9.10s")


def test_tpu_copies_names_each_copied_slice_by_its_array(tmp_path):
    """bench/tpu_copies.py on Llama-3.1-8B's published config (2 layers, no weights) compiled for v5e:2x4: the
    bytes a layer must read counted from the config by hand, and every copy it lists (into HBM or prefetched into
    VMEM) the size of a layer's shard of the array it names (in a process of this worker's: libtpu compiles,
    nothing runs)."""
    import json as json_

    sys.path.insert(0, str(ROOT / "bench"))
    from tpu_copies import main

    main(["--model", "llama-3.1-8b", "--topology", "v5e:2x4", "--layers", "2", "--programs", "decode",
          "--decode-rows", "8", "--cached", "128", "--out", str(tmp_path)])
    (path,) = tmp_path.glob("tpu-copies-*.json")
    record = json_.loads(path.read_text())
    (decode,) = record["rows"]
    # Llama-3.1-8B: width 4096, 32 query and 8 KV heads of 128, MLP 14336; heads and MLP split 4 ways (the
    # model axis), the two norms replicated; the cache's rows split 2 ways (data), its KV heads 4 ways
    d, k, mlp = 4096, 128, 14336
    shards = {"q": d * 8 * k, "k or v": d * 2 * k, "o": 8 * k * d, "gate or up": d * mlp // 4, "down": mlp // 4 * d,
              "KV cache": 4 * 129 * 2 * k}
    layer = (shards["q"] + 2 * shards["k or v"] + shards["o"] + 3 * shards["gate or up"] + 2 * d) * 2
    assert decode["layer_must_read_MiB"] == round((layer + 2 * shards["KV cache"] * 2) / 2**20, 1)
    assert decode["scan"]["while_loops"] >= 1 and decode["unrolled"]["while_loops"] == 0  # the layer loop, then none
    # the finding docs/sharding.md reports (with this libtpu): the scan's body prefetches the q, k and v slices (and
    # at 64 rows the cache's, under 1 MiB here) into VMEM, and copies nothing into HBM
    assert {"q", "k or v"} <= {c["of"] for c in decode["scan"]["copies"] if c["memory"] == "VMEM"}, decode["scan"]
    assert decode["scan"]["hbm_copied_MiB_per_layer"] == 0 and decode["scan"]["vmem_MiB_per_layer"] > 0
    for variant in ("scan", "unrolled"):
        for copy in decode[variant]["copies"]:
            assert copy["MiB"] == round(shards[copy["of"]] * 2 / 2**20, 2), copy
    assert names_its_code(record) and record["measured"] == "compiled only, not run"


def test_train_step_layouts_script_small(tmp_path):
    result = run(["bench/train_step_layouts.py", "--items", "16", "--batch", "8", "--batches", "2"], tmp_path)
    rows = {r["layout"]: r for r in result["rows"]}
    assert set(rows) == {"one prompt a row", "packed"} and all(r["median_s"] > 0 for r in rows.values())
    # the same prompts, in fewer padded tokens
    assert rows["packed"]["tokens_per_batch"] <= rows["one prompt a row"]["tokens_per_batch"]
    assert rows["packed"]["prompt_tokens_per_batch"] <= rows["packed"]["tokens_per_batch"]
    assert names_its_code(result)
